"""Which parameter goes to which optimizer, with which learning rate.

Each parameter has a role (embedding, value_embedding, lm_head, matrix, scalar; decided by the
model) and an origin tag (embedding, old, new): growth's, handed to the optimizer build (a grown
run's from model/grow.py, a resumed run's from its checkpoint, which takes them from the groups:
`origin_tags`); a run that was never grown has the default tags. A group is one (role, origin)
pair. Its base lr is the role's lr from the optimizer config times
`lr_multipliers[origin]`; the schedule multiplies every base lr by the same factor each step,
and in a grown run `grow.lr_multipliers` (optim/schedule.py) by its origin's factor at that step.

The `optimizer:` section's choices (`OptimizerChoice`, on its `name`), each built by
`build_optimizer` (`cfg.build(model, ...)`) from its traits (`traits()`: which kind of group,
a `GroupRule`, takes the hidden matrices and which the rest; optim/base.py):
- `muon`: Muon for the 2-D hidden matrices, AdamW for everything else (the modern recipe;
  their rules: optim/optimizer.py);
- `adamw`: AdamW for everything, still with a learning rate per role.
A new optimizer is its config (an AdamWConfig subclass takes the per-role lrs) with its
`traits()` and its rule, in one file, and one more member of `OptimizerChoice`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from littlelm.config import RESUMABLE, named
from littlelm.errors import ConfigError
from littlelm.optim.base import OptimizerConfig, OptimizerTraits
from littlelm.optim.optimizer import AdamWRule, MuonAdamW, MuonRule
from littlelm.optim.schedule import momentum_warmup


class AdamWConfig(OptimizerConfig):
    """AdamW for every parameter, with a learning rate per role."""

    # another optimizer has another state layout: a resumed run keeps its optimizer
    name: Literal["adamw"] = named("adamw", resumable=False)
    lr: float = Field(3e-4, description="Learning rate of the hidden matrices.", gt=0)
    embedding_lr: float | None = Field(
        None, description="lr of the token embedding; null = lr.", gt=0
    )
    value_embedding_lr: float | None = Field(
        None, description="lr of value embeddings; null = embedding_lr.", gt=0
    )
    lm_head_lr: float | None = Field(None, description="lr of the output layer; null = lr.", gt=0)
    scalar_lr: float | None = Field(
        None, description="lr of norms and residual scalars; null = lr.", gt=0
    )
    betas: tuple[float, float] = Field((0.9, 0.95), description="Adam (beta1, beta2).")
    eps: float = Field(1e-8, description="Adam epsilon.", gt=0)
    weight_decay: float = Field(
        0.0, description="Decoupled weight decay of the hidden matrices.", ge=0
    )
    scale_lr_by_width: bool = Field(
        False, description="Multiply every AdamW lr by sqrt(768 / d_model)."
    )
    lr_multipliers: dict[str, float] = Field(
        default_factory=dict,
        description="lr multiplier per origin tag (embedding, old, new), e.g. {old: 0.033}.",
    )
    adamw_8bit: bool = Field(
        False,
        description="Keep AdamW's two moments in 8 bits (bitsandbytes AdamW8bit; CUDA only): "
        "2 bytes of state per AdamW parameter instead of 8.",
    )

    @model_validator(mode="after")
    def _check_tags(self):
        unknown = set(self.lr_multipliers) - set(ORIGINS)
        if unknown:
            raise ValueError(
                f"lr_multipliers: unknown tag(s) {sorted(unknown)}; tags are {ORIGINS}"
            )
        return self

    def adamw_rule(self) -> AdamWRule:
        """The rule of this config's AdamW groups."""
        return AdamWRule(betas=self.betas, eps=self.eps, eight_bit=self.adamw_8bit)

    def traits(self) -> OptimizerTraits:
        # what the trace runs (`traceable`): torch's AdamW
        plain = self.model_copy(update={"adamw_8bit": False})
        stand_in = plain.own_traits() if self.adamw_8bit else None
        return replace(self.own_traits(), stand_in=stand_in, lighter=tuple(self.lighter()))

    def lighter(self) -> list[tuple[str, str, OptimizerTraits]]:
        """The changes of this config that keep less state, mildest first (the plan's
        remedies): 8-bit AdamW, then Muon, which keeps one buffer per matrix, not AdamW's two."""
        muon = MuonConfig(adamw_8bit=self.adamw_8bit, ns_dtype="bf16").own_traits()
        return [
            *self._eight_bit(),
            ("optimizer.name=muon", "one buffer per matrix, not AdamW's two", muon),
        ]

    def _eight_bit(self) -> list[tuple[str, str, OptimizerTraits]]:
        if self.adamw_8bit:
            return []
        why = "AdamW's two moments in 1 byte each, not 4 (CUDA, bitsandbytes)"
        eight = self.model_copy(update={"adamw_8bit": True})
        return [("optimizer.adamw_8bit=true", why, eight.own_traits())]

    def own_traits(self) -> OptimizerTraits:
        """Its traits without the alternatives the planner offers (`traits`)."""
        return OptimizerTraits("adamw", (self.adamw_rule(),), "adamw", "adamw", **self._8bit())

    def _8bit(self) -> dict[str, Any]:
        """What 8-bit AdamW says of itself, in an optimizer with AdamW groups."""
        if not self.adamw_8bit:
            return {}
        return {
            "stochastic_rounding": False,
            "settings": ("8-bit AdamW",),
            "notes": (
                "optimizer.adamw_8bit: bitsandbytes runs on CUDA only, so its optimizer state is "
                "analytic (2 bytes per parameter of tensors of 4096+ elements); the trace runs "
                "fp32 AdamW",
            ),
        }

    def build(
        self,
        model: Any,
        stochastic_rounding: bool = False,
        origin: dict[str, str] | None = None,
    ) -> MuonAdamW:
        """The optimizer over `model`'s parameters (build_optimizer, below)."""
        return build_optimizer(model, self, stochastic_rounding, origin)

    def origin_multipliers(self) -> dict[str, float]:
        return self.lr_multipliers

    def traceable(self) -> OptimizerConfig:
        # bitsandbytes is CUDA-only: the trace runs torch's AdamW (the same parameters and
        # gradients, more state)
        return self.model_copy(update={"adamw_8bit": False})

    def check_world(self, world_size: int) -> list[str]:
        if world_size > 1 and self.adamw_8bit:
            return [
                "optimizer.adamw_8bit is not supported with several processes yet (its state is "
                "not sharded or gathered by littlelm's ddp/fsdp optimizers); set "
                "optimizer.adamw_8bit=false"
            ]
        return []


class MuonConfig(AdamWConfig):
    """Muon for the hidden matrices, AdamW (per-role lrs) for embeddings, lm_head and scalars."""

    # Muon takes AdamW's options (for the parameters it leaves to AdamW) and adds its own
    name: Literal["muon"] = named("muon", resumable=False)  # type: ignore[assignment]  # a subclass narrows the discriminator
    lr: float = Field(0.02, description="Muon learning rate of the hidden matrices.", gt=0)
    embedding_lr: float | None = Field(0.2, description="AdamW lr of the token embedding.", gt=0)
    value_embedding_lr: float | None = Field(
        None, description="AdamW lr of value embeddings; null = embedding_lr.", gt=0
    )
    lm_head_lr: float | None = Field(0.004, description="AdamW lr of the output layer.", gt=0)
    # 0.5 before 2026-12-05 (1.22 at width 128): the residual scalars jumped and the loss
    # spiked (grad norm 0.3 -> 1.5-3.6) wherever rows held long stretches of text (RESULTS.md)
    scalar_lr: float | None = Field(
        0.002,
        description="AdamW lr of norms and residual scalars (the residual stream's scale: "
        "small, as nanochat's 0.005 for its λ_resid).",
        gt=0,
    )
    betas: tuple[float, float] = Field((0.8, 0.95), description="AdamW (beta1, beta2).")
    eps: float = Field(1e-10, description="AdamW epsilon.", gt=0)
    weight_decay: float = Field(0.0, description="Decoupled weight decay of Muon's matrices.", ge=0)
    scale_lr_by_width: bool = Field(
        True, description="Multiply every AdamW lr by sqrt(768 / d_model)."
    )
    momentum: float = Field(0.95, description="Muon momentum after its warmup.", ge=0, lt=1)
    momentum_start: float = Field(0.85, description="Muon momentum at step 0.", ge=0, lt=1)
    momentum_warmup_steps: int = Field(300, description="Steps over which momentum rises.", ge=0)
    nesterov: bool = Field(True, description="Nesterov momentum in Muon.")
    ns_steps: int = Field(5, description="Newton–Schulz iterations per update.", ge=1)
    ns_dtype: Literal["auto", "bf16", "fp32"] = Field(
        "auto",
        description="dtype of the Newton–Schulz iteration; auto: bf16 where the device "
        "multiplies bf16 in hardware, fp32 elsewhere (littlelm/hardware.py).",
        json_schema_extra=RESUMABLE,  # numerics of the update only, like the lrs
    )

    def lighter(self) -> list[tuple[str, str, OptimizerTraits]]:
        return self._eight_bit()

    def own_traits(self) -> OptimizerTraits:
        muon = MuonRule(self.momentum, self.nesterov, self.ns_steps, self.ns_dtype)
        return OptimizerTraits("muon", (self.adamw_rule(), muon), "muon", "adamw", **self._8bit())

    def with_native_bf16(self, native: bool) -> MuonConfig:
        if self.ns_dtype != "auto":
            return self
        return self.model_copy(update={"ns_dtype": "bf16" if native else "fp32"})

    def momentum_schedule(self) -> Callable[[int], float]:
        return functools.partial(
            momentum_warmup,
            start=self.momentum_start,
            end=self.momentum,
            steps=self.momentum_warmup_steps,
        )


OptimizerChoice = Annotated[AdamWConfig | MuonConfig, Field(discriminator="name")]

ORIGINS = ("embedding", "old", "new")


def role_lr(cfg: AdamWConfig, role: str) -> float:
    return {
        "matrix": cfg.lr,
        "embedding": cfg.embedding_lr or cfg.lr,
        "value_embedding": cfg.value_embedding_lr or cfg.embedding_lr or cfg.lr,
        "lm_head": cfg.lm_head_lr or cfg.lr,
        "scalar": cfg.scalar_lr or cfg.lr,
    }[role]


def default_origin(role: str) -> str:
    """The origin tag of a parameter no growth has tagged."""
    return "embedding" if role in ("embedding", "value_embedding", "lm_head") else "new"


def origin_tags(model: nn.Module, optimizer: MuonAdamW) -> dict[str, str]:
    """Parameter name -> origin tag, as `optimizer`'s groups hold them (for the checkpoint)."""
    tag = {id(p): g["origin"] for g in optimizer.param_groups for p in g["params"]}
    return {name: tag[id(p)] for name, p in model.named_parameters() if id(p) in tag}


def plan_groups(model: Any, cfg: AdamWConfig, origin: dict[str, str] | None = None) -> list[dict]:
    """The parameter groups for `model` under `cfg` (MuonAdamW's, see optim/optimizer.py), with
    `origin`'s tags (a parameter it lacks: `default_origin`), in a stable order: by the kinds'
    step order (`cfg.traits().rules`: for Muon the AdamW groups, then the Muon groups), each by
    role and origin. `model`: an nn.Module with `cfg` and `role` (model/protocol.py's
    LanguageModel, a type optim/ may not import)."""
    traits = cfg.traits()
    kinds = [r.kind for r in traits.rules]
    width_scale = math.sqrt(768 / model.cfg.d_model) if cfg.scale_lr_by_width else 1.0
    fused = next(model.parameters()).device.type in ("cpu", "cuda")  # else foreach
    buckets: dict[tuple[str, str], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            role = model.role(name)
            tag = (origin or {}).get(name) or default_origin(role)
            buckets.setdefault((role, tag), []).append(p)
    groups = []
    for role, tag in sorted(buckets, key=lambda key: _order(key, kinds.index(traits.kind(key[0])))):
        rule = traits.rule(role)
        if role == "adapter":  # LoRA's A and B: at lora.lr, set on the model (model/lora.py)
            lr = model.adapter_lr * cfg.lr_multipliers.get(tag, 1.0)
        else:
            lr = role_lr(cfg, role) * cfg.lr_multipliers.get(tag, 1.0)
        if rule.scales_lr_by_width and role != "adapter":  # lora.lr is the adapters' as given
            lr *= width_scale
        groups.append(
            {
                "params": buckets[role, tag],
                "kind": rule.kind,
                "role": role,
                "origin": tag,  # grow.lr_multipliers move each origin's lr (GroupSchedule, optim/schedule.py)
                "name": f"{role}/{tag}",
                "lr": lr,
                "base_lr": lr,
                "weight_decay": cfg.weight_decay if role == "matrix" else 0.0,
                **rule.group_options(fused),
            }
        )
    return groups


def _order(key: tuple[str, str], kind: int) -> tuple[int, int, int]:
    roles = ("embedding", "value_embedding", "matrix", "scalar", "lm_head", "adapter")
    return kind, roles.index(key[0]), ORIGINS.index(key[1])


def build_optimizer(
    model: nn.Module,
    cfg: AdamWConfig,
    stochastic_rounding: bool = False,
    origin: dict[str, str] | None = None,
) -> MuonAdamW:
    """The optimizer for `model` with `origin`'s tags (see plan_groups); `stochastic_rounding`
    (from train.stochastic_rounding) makes every parameter update round stochastically into
    bf16 parameters."""
    device = next(model.parameters()).device
    if cfg.adamw_8bit:
        _check_8bit(device, stochastic_rounding)
    traits = cfg.traits()
    if stochastic_rounding and not traits.stochastic_rounding:
        raise ConfigError(
            [
                f"optimizer.name={traits.name} cannot round its updates stochastically; "
                "set train.stochastic_rounding=false"
            ]
        )
    return MuonAdamW(
        plan_groups(model, cfg, origin),
        stochastic_rounding=stochastic_rounding,
        rules=[r.on(device.type) for r in traits.rules],
    )


def _check_8bit(device: torch.device, stochastic_rounding: bool) -> None:
    if stochastic_rounding:
        raise ConfigError(
            [
                "optimizer.adamw_8bit and train.stochastic_rounding cannot be combined "
                "(bitsandbytes writes the parameters itself); turn one of them off"
            ]
        )
    if device.type != "cuda":
        raise ConfigError(
            [
                f"optimizer.adamw_8bit needs a CUDA device (bitsandbytes); this run is on "
                f"{device.type}: set optimizer.adamw_8bit=false"
            ]
        )
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ConfigError(
            [
                "optimizer.adamw_8bit needs bitsandbytes: pip install -e '.[gpu]' in a clone of "
                "littlelm, or pip install bitsandbytes (or set optimizer.adamw_8bit=false)"
            ]
        ) from None


def group_table(groups: list[dict]) -> list[tuple[str, int, int, str, float]]:
    """Rows (group, tensors, parameters, optimizer, lr) for the start-up table."""
    return [
        (g["name"], len(g["params"]), sum(p.numel() for p in g["params"]), g["kind"], g["base_lr"])
        for g in groups
    ]

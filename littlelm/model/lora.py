"""LoRA: train a low-rank update of a frozen model instead of the model (docs/post-training.md).

Each targeted linear y = W x (+ b) becomes y = W x (+ b) + (alpha / rank) · B A dropout(x),
with W (and b) frozen, A (rank × in) and B (out × rank) trained. B starts at zero, so a model
with fresh adapters computes exactly what its base computes; `merge_lora` folds B A back into W,
giving the plain model (what sample, chat, eval, serve and export read).

    add_lora(model, cfg)        # in place: targeted linears wrapped, everything else frozen
    trainable_count(model)      # parameters the optimizer updates
    trained_tensors(model)      # what a LoRA checkpoint keeps: adapters + fully trained tensors
    load_trained(model, tensors, source)   # ... and puts back into a wrapped model
    merge_lora(model)           # in place: back to plain linears, W + (alpha/rank)·B A

`trainable_tokens` trains a few rows of the token embedding and lm_head besides the adapters
(model/token_rows.py): by default the chat control tokens, which a base pretrained on plain text
never saw.

Which linears (`targets`): attention = each block's c_q, c_k, c_v and c_proj; mlp = the MLP's
input linears and its c_proj; all_linear = both. lm_head is never a target (as in PEFT's
`all-linear`): `train_embeddings` trains it in full instead, with the token embedding. The
value-embedding gates and tables, residual scalars and (unless `train_norms`) the norms stay
frozen.

The frozen base linear is made by one function, `frozen_base`: `quantize: nf4` (QLoRA) makes
it a 4-bit one there (model/nf4.py: bitsandbytes on CUDA, refused elsewhere with the fix).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator
from torch import nn

from littlelm.config import Cfg
from littlelm.errors import CheckpointError
from littlelm.model.blocks import Norm
from littlelm.model.nf4 import dequantized, is_nf4, nf4_base
from littlelm.model.token_rows import add_token_rows, merge_token_rows, set_token_rows

ATTENTION = ("c_q", "c_k", "c_v", "c_proj")
# A block's linears by the names its exports give them (what peft's target_modules say):
# transformers' Llama/Qwen names, and littlelm's own (the littlelm-architecture export's,
# qualified: c_proj is in both the attention and the MLP)
TRANSFORMERS_NAMES = {
    "q_proj": "attn.c_q",
    "k_proj": "attn.c_k",
    "v_proj": "attn.c_v",
    "o_proj": "attn.c_proj",
    "gate_proj": "mlp.c_gate",
    "up_proj": "mlp.c_fc",
    "down_proj": "mlp.c_proj",
}
OWN_NAMES = (*(f"attn.{n}" for n in ATTENTION), "mlp.c_fc", "mlp.c_gate", "mlp.c_proj")
GROUPS = ("attention", "mlp")


class LoRAConfig(Cfg):
    """Train low-rank adapters on a frozen base model instead of every weight (LoRA)."""

    # rank 32 (scale 2): 98% / 127% of full SFT on two unshipped tasks where 16 gave 93% / 120%
    # (docs/post-training.md's measurement)
    rank: int = Field(32, description="Rank r of each adapter (A is r × in, B is out × r).", ge=1)
    alpha: float = Field(
        64.0, description="Scale of the adapters' output: alpha / rank times B A x.", gt=0
    )
    dropout: float = Field(
        0.0, description="Dropout on the adapters' input (training only).", ge=0, lt=1
    )
    targets: Literal["attention", "mlp", "all_linear"] | list[str] = Field(
        "all_linear",
        description="Linears that get adapters in every block: attention (c_q, c_k, c_v, "
        "c_proj), mlp (the MLP's linears), all_linear (both; lm_head is not a target, as in "
        "PEFT's all-linear), or a list of groups and module names as the exports name them "
        "(peft's target_modules): q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
        "down_proj, or littlelm's attn.c_q ... mlp.c_proj.",
    )
    use_rslora: bool = Field(
        False,
        description="Rank-stabilised LoRA (peft's use_rslora): scale the adapters by alpha / "
        "sqrt(rank) instead of alpha / rank. At rank 32 that is 5.7x the update: lower lora.lr "
        "or alpha with it.",
    )
    base_precision: Literal["auto", "fp32"] = Field(
        "auto",
        description="Storage of the frozen base linears: auto = the training precision "
        "(train.precision as resolved: bf16 holds them in bf16, the copy bf16 autocast would "
        "make of them anyway, so training computes the same), fp32 = train.master_weights' "
        "dtype.",
    )
    train_embeddings: bool = Field(
        False,
        description="Also train the token embedding in full (and lm_head when untied).",
    )
    trainable_tokens: Literal["chat", "none"] | list[int] = Field(
        "chat",
        description="Token rows of the embedding (and lm_head) trained besides the adapters "
        "(peft's trainable_token_indices): chat = the tokenizer's chat control tokens, which a "
        "base pretrained on plain text never saw (without them LoRA learns a chat task far "
        "less than full SFT), none, or a list of token ids. Ignored with train_embeddings.",
    )
    init_from: str | None = Field(
        None,
        description="A PEFT adapter directory (adapter_config.json, adapter_model.safetensors, "
        "as peft's save_pretrained or `littlelm export` writes them, on an export of this run's "
        "base) whose adapters and trainable token rows this run starts from instead of fresh "
        "ones (peft's PeftModel.from_pretrained(..., is_trainable=True)); its r, lora_alpha, "
        "use_rslora and adapted linears must be this section's.",
    )
    train_norms: bool = Field(
        False,
        description="Also train the norms' gains in full (needs model.norm_affine or "
        "model.qk_norm_affine).",
    )
    quantize: Literal["none", "nf4"] = Field(
        "none",
        description="Storage of the frozen base linears: none (the training dtype) or nf4 "
        "(QLoRA: 4-bit NormalFloat).",
    )
    lr: float = Field(
        3e-3,  # 1e-3 left held-out tasks undertrained, 1e-2 diverged (docs/post-training.md)
        description="AdamW learning rate of the adapters, in either optimizer (the "
        "optimizer section's betas and eps; no width scaling, no weight decay); the schedule "
        "moves it like every lr.",
        gt=0,
    )

    @field_validator("targets")
    @classmethod
    def _targets(cls, targets):
        if isinstance(targets, list):
            if not targets:
                raise ValueError("lists no linears: give attention, mlp or module names")
            if len(set(targets)) != len(targets):
                raise ValueError(f"{targets} lists a target twice")
            known = (*GROUPS, *TRANSFORMERS_NAMES, *OWN_NAMES)
            unknown = [t for t in targets if t not in known]
            if unknown:
                raise ValueError(
                    f"{unknown} is not a group or a block linear's name; choose from "
                    f"{', '.join(known)}"
                )
        return targets

    @field_validator("quantize")
    @classmethod
    def _quantize(cls, quantize: str) -> str:
        return quantize  # nf4 is checked where it is built (model/nf4.py: CUDA, bitsandbytes)

    def modules(self, mlp_inputs: tuple[str, ...]) -> tuple[str, ...]:
        """The targeted linears of a block ("attn.c_q", ..., "mlp.c_proj"), in the block's
        order whatever the list's (the order adapters are made and their A drawn in), for an
        MLP whose input linears are `mlp_inputs` (model/blocks.py MLPSpec.inputs). A named
        linear the MLP does not have is left out: `check_lora` refuses it."""
        if self.targets == "all_linear":
            wanted = set(GROUPS)
        else:
            wanted = {self.targets} if isinstance(self.targets, str) else set(self.targets)
        named = {TRANSFORMERS_NAMES.get(t, t) for t in wanted}
        block = (*(f"attn.{n}" for n in ATTENTION), *(f"mlp.{n}" for n in mlp_inputs), "mlp.c_proj")
        return tuple(m for m in block if m in named or m.split(".")[0] in _group_of(wanted))

    def describe(self) -> str:
        """The targets in words, for the start-up line."""
        if isinstance(self.targets, str):
            return " and ".join(GROUPS) if self.targets == "all_linear" else self.targets
        return ", ".join(self.targets)

    def rows_trained(self, chat_tokens: int) -> int:
        """How many token rows `trainable_tokens` trains, with a tokenizer that has
        `chat_tokens` of the chat control tokens."""
        if self.train_embeddings or self.trainable_tokens == "none":
            return 0
        if self.trainable_tokens == "chat":
            return chat_tokens
        return len(set(self.trainable_tokens))

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


def _group_of(wanted: set[str]) -> set[str]:
    """The block modules ("attn", "mlp") whose every linear `wanted` targets by group."""
    return {"attn" for g in wanted if g == "attention"} | {"mlp" for g in wanted if g == "mlp"}


def frozen_base(
    linear: nn.Linear, quantize: str = "none", dtype: torch.dtype | None = None
) -> nn.Linear:
    """The frozen base of an adapted linear: `linear` itself, its weight (and bias) no longer
    trained, held in `dtype` (None: as it is). The seam of quantized bases (QLoRA's nf4 makes a
    4-bit one here)."""
    if quantize == "nf4":  # QLoRA: bitsandbytes' 4-bit linear (its stand-in when traced)
        return nf4_base(linear)
    for p in linear.parameters():
        p.requires_grad_(False)
        if dtype is not None:
            # in place of the fp32 weight: bf16 autocast rounds it to this same copy at every
            # matmul (round to nearest), so the run computes bitwise what it did in fp32
            p.data = p.data.to(dtype)
    return linear


class LoRALinear(nn.Module):
    """A frozen linear plus a trained low-rank update: base(x) + scale · B A dropout(x)."""

    def __init__(
        self,
        base: nn.Linear,
        rank: int,
        scale: float,
        dropout: float,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        w = base.weight
        # a 4-bit base: its weights' old dtype; a bf16-held base: the master weights' dtype
        dtype = getattr(base, "adapter_dtype", dtype or w.dtype)
        self.lora_A = nn.Parameter(
            torch.empty(rank, self.in_features, dtype=dtype, device=w.device)
        )
        self.lora_B = nn.Parameter(
            torch.zeros(self.out_features, rank, dtype=dtype, device=w.device)
        )
        # A ~ U(±1/sqrt(in)): A x has about the scale of x / sqrt(3) per rank channel; B = 0
        # makes the update zero at the start, so the wrapped model is its base exactly
        bound = 1 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.lora_A.uniform_(-bound, bound)
        self.scale = scale
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.enabled = True  # off: the base alone (adapters_off: the frozen reference)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return self._base(x)
        update = F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B)
        return self._base(x) + update * self.scale

    def _base(self, x: torch.Tensor) -> torch.Tensor:
        w = self.base.weight
        autocast = torch.is_autocast_enabled(x.device.type)
        if x.dtype != w.dtype and w.is_floating_point() and not autocast:
            # a bf16-held base called outside the run's autocast (a user's own forward): the
            # matmul in the base's dtype, as the run computes it, the output in the caller's
            return self.base(x.to(w.dtype)).to(x.dtype)
        return self.base(x)

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """The base linear with the update folded into its weight (computed in fp32); a 4-bit
        base becomes a plain linear of its dequantized weight, in the adapters' dtype."""
        if is_nf4(self.base):
            plain = nn.Linear(self.in_features, self.out_features, bias=self.base.bias is not None)
            weight = dequantized(self.base).to(self.lora_A.dtype)
            plain = plain.to(device=weight.device, dtype=weight.dtype)
            plain.weight.copy_(weight)
            if self.base.bias is not None and plain.bias is not None:
                plain.bias.copy_(self.base.bias)
            plain.requires_grad_(False)
            self.base = plain
        w = self.base.weight
        delta = (self.lora_B.float() @ self.lora_A.float()) * self.scale
        w.copy_((w.float() + delta).to(w.dtype))
        return self.base


def _targets(model: nn.Module, cfg: LoRAConfig) -> list[tuple[nn.Module, str]]:
    """(parent module, attribute) of every linear `cfg` targets, block by block."""
    out: list[tuple[nn.Module, str]] = []
    for block in getattr(model, "blocks", []):
        for module in cfg.modules(block.mlp.spec.inputs):
            parent, name = module.split(".")
            out.append((getattr(block, parent), name))
    return out


def _missing(model: nn.Module, cfg: LoRAConfig) -> list[str]:
    """Named targets `model`'s blocks do not have (gate_proj on an MLP without a gate)."""
    blocks = getattr(model, "blocks", [])
    if isinstance(cfg.targets, str) or not blocks:
        return []
    have = cfg.modules(blocks[0].mlp.spec.inputs)
    return [t for t in cfg.targets if t not in GROUPS and TRANSFORMERS_NAMES.get(t, t) not in have]


def base_dtype(cfg: LoRAConfig, precision: str) -> torch.dtype | None:
    """The dtype the frozen base linears are held in for a run computing in `precision` (as
    resolved: bf16 or fp32); None: as built (train.master_weights')."""
    return torch.bfloat16 if cfg.base_precision == "auto" and precision == "bf16" else None


def add_lora(
    model: nn.Module,
    cfg: LoRAConfig,
    base: torch.dtype | None = None,
    token_ids: list[int] | tuple[int, ...] = (),
) -> nn.Module:
    """Wrap `model`'s targeted linears (in place; returns it) and freeze everything but the
    adapters, the rows of `token_ids` (lora.trainable_tokens, resolved by the caller: the ids
    depend on the tokenizer) and what cfg trains in full (train_embeddings, train_norms).
    Adapters take the linear's dtype and device (the frozen linears are then held in `base`,
    None: as they are), and A is drawn from the current RNG state."""
    for p in model.parameters():
        p.requires_grad_(False)
    for parent, name in _targets(model, cfg):
        linear = getattr(parent, name)
        if isinstance(linear, LoRALinear):
            raise ValueError("add_lora: this model has adapters already")
        own = linear.weight.dtype
        frozen = frozen_base(linear, cfg.quantize, base)
        setattr(parent, name, LoRALinear(frozen, cfg.rank, cfg.scale, cfg.dropout, own))
    for name, p in model.named_parameters():
        if cfg.train_embeddings and name.split(".")[0] in ("wte", "lm_head"):
            p.requires_grad_(True)  # lm_head is wte itself when tied: trained once
    for gain in _norm_gains(model) if cfg.train_norms else []:
        gain.requires_grad_(True)
    if token_ids and not cfg.train_embeddings:  # the whole matrices are trained then
        add_token_rows(model, token_ids)
    model.adapter_lr = cfg.lr  # type: ignore[assignment]  # optim/groups.py reads it (optim/ may not import model/)
    return model


def _norm_gains(model: nn.Module) -> list[nn.Parameter]:
    """The gains of the model's norms (model/blocks.py's Norm with affine: norm1, norm2, norm_f,
    q_norm, k_norm)."""
    return [m.weight for m in model.modules() if isinstance(m, Norm) and m.weight is not None]


def check_lora(model: nn.Module, cfg: LoRAConfig) -> list[str]:
    """Problems of LoRA on `model`'s config: a requested full-trained tensor it does not have."""
    problems = target_problems(model, cfg)
    if cfg.train_norms and not _norm_gains(model):
        problems.append(
            "lora.train_norms: this model's norms have no gains to train (model.norm_affine "
            "and model.qk_norm_affine are false); turn train_norms off"
        )
    return problems


def target_problems(model: nn.Module, cfg: LoRAConfig) -> list[str]:
    """Named targets `model`'s blocks do not have (gate_proj on an MLP without a gate); `model`
    may be on the meta device."""
    missing = _missing(model, cfg)
    if not missing:
        return []
    mlp = model.blocks[0].mlp  # type: ignore[index,union-attr]
    have = ", ".join(f"mlp.{n}" for n in (*mlp.spec.inputs, "c_proj"))
    return [
        f"lora.targets: {missing}: this model's MLP has no such linear (its linears: {have}; "
        "gate_proj is a gated MLP's, e.g. model.mlp: swiglu); remove it from the list"
    ]


def rank_problems(model: nn.Module, cfg: LoRAConfig) -> list[str]:
    """lora.rank above what a targeted linear can hold: B A of an out × in linear has rank at
    most min(in, out), so a larger rank only adds parameters (`model` may be on the meta
    device: only shapes are read)."""
    limits = {
        min(linear.in_features, linear.out_features): name
        for parent, name in _targets(model, cfg)
        for linear in [getattr(parent, name)]
    }
    if not limits or cfg.rank <= min(limits):
        return []
    limit = min(limits)
    return [
        f"lora.rank: {cfg.rank} is above {limit}, the smallest side of a targeted linear "
        f"({limits[limit]}: an update B A of it has rank at most {limit}); set lora.rank to "
        f"{limit} or less"
    ]


@contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """`model` computes its frozen base alone inside (PEFT's disable_adapter): every adapter's
    update is skipped, not multiplied by zero, so the output is the base's bitwise."""
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for m in layers:
        m.enabled = False
    set_token_rows(model, False)  # the trained token rows too: the base's matrices
    try:
        yield
    finally:
        for m in layers:
            m.enabled = True
        set_token_rows(model, True)


def has_lora(model: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


def trainable_count(model: nn.Module) -> int:
    """Parameters the optimizer updates (requires_grad; a tied tensor counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def trained_names(model: nn.Module) -> list[str]:
    """Names of the trained parameters (adapters and full-trained tensors), a tied one once."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def trained_tensors(state: Mapping[str, torch.Tensor], model: nn.Module) -> dict:
    """Of `state` (the model's state dict, or its gathered copy), what a LoRA checkpoint keeps:
    the trained parameters; the frozen base stays where it is (its checkpoint)."""
    keep = set(trained_names(model))
    return {k: v for k, v in state.items() if k in keep}


@torch.no_grad()
def load_trained(model: nn.Module, tensors: Mapping, source: Path) -> None:
    """Put a LoRA checkpoint's tensors (trained_tensors) into a wrapped model whose base is in."""
    own = dict(model.named_parameters())
    names = set(trained_names(model))
    missing = sorted(names - set(tensors))
    unexpected = sorted(set(tensors) - names)
    if missing or unexpected:
        raise CheckpointError(
            f"{source}: its LoRA tensors do not fit this run's adapters (missing {missing[:4]}, "
            f"unexpected {unexpected[:4]}); the lora and model sections must be the checkpoint's"
        )
    for name in names:
        t = tensors[name]
        if tuple(t.shape) != tuple(own[name].shape):
            raise CheckpointError(
                f"{source}: {name} is {tuple(t.shape)} in the checkpoint, "
                f"{tuple(own[name].shape)} here; the lora.rank must be the checkpoint's"
            )
        own[name].copy_(t)


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base linear (in place; returns `model`): the plain model,
    computing what the wrapped one computes (up to rounding in the weights' dtype)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                setattr(module, name, child.merged())
    merge_token_rows(model)
    if hasattr(model, "adapter_lr"):
        del model.adapter_lr
    return model

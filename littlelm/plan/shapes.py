"""The dimensions the memory and speed formulas read, from a resolved run config.

`Dims.of(cfg)` gathers the batch, the precision, the optimizer and the distributed layout, and
takes the parameter list from the model itself: the registered model, built on the meta device
(no memory; 0.05 s for 3B parameters), so a parameter the model gains is planned the day it
exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from littlelm.errors import ConfigError
from littlelm.registry import MODELS

if TYPE_CHECKING:
    from littlelm.model.gpt import GPTConfig


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]
    role: str  # the model's role for it (model/protocol.py ROLES)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


_TENSORS: dict[str, tuple[tuple[Param, ...], tuple[int, ...]]] = {}


def model_tensors(m) -> tuple[tuple[Param, ...], tuple[int, ...]]:
    """The trainable parameters of the model config `m` builds (tied ones once) and the sizes of
    its floating buffers (the RoPE tables), from the model built on the meta device; cached per
    config, since a plan reads the same model many times."""
    key = m.model_dump_json()
    if key not in _TENSORS:
        with torch.device("meta"):
            model = MODELS.get(m.name)(m)
        params = tuple(Param(n, tuple(p.shape), model.role(n)) for n, p in model.named_parameters())
        buffers = tuple(b.numel() for b in model.buffers() if b.is_floating_point())
        _TENSORS[key] = (params, buffers)
    return _TENSORS[key]


@dataclass(frozen=True)
class Dims:
    """What the memory formulas read. `tokens` is one micro-batch (micro_batch × seq_len)."""

    model: GPTConfig
    micro_batch: int
    seq_len: int
    grad_accum: int
    bf16: bool
    optimizer: str  # "adamw" or "muon"
    nesterov: bool
    params: tuple[Param, ...]
    buffers: tuple[int, ...] = ()  # elements of each floating buffer (stored in the param dtype)
    master_bf16: bool = False  # train.master_weights: bf16 (parameters, grads, state in bf16)
    ns_bf16: bool = True  # Muon's Newton–Schulz in bf16 (optimizer.ns_dtype), else fp32
    adamw_8bit: bool = False  # optimizer.adamw_8bit (bitsandbytes, CUDA only)
    checkpointing: bool = False  # train.activation_checkpointing
    fp8: bool = False  # model.fp8
    stochastic_rounding: bool = False  # train.stochastic_rounding
    world: int = 1  # processes (distributed.world_size)
    strategy: str = "ddp"  # distributed.strategy: "ddp" or "fsdp"
    shard_muon: bool = True  # distributed.shard_muon (ddp): Muon momentum of owned matrices only
    shard_adamw: bool = False  # distributed.shard_adamw (ddp): ZeRO-1, AdamW moments split
    # the trace's peak over the analytic model's at the configured micro-batch: a plan scales
    # every analytic figure by it (plan/planner.py), so the trace stays the one reference
    trace_scale: float = 1.0

    @classmethod
    def of(cls, cfg, micro_batch: int | None = None) -> Dims:
        """From a resolved RunConfig; `micro_batch` replaces train.micro_batch_size and keeps
        the tokens per optimizer step (grad_accum follows)."""
        if not cfg.model.analytic_plan:
            raise ConfigError(
                [f"model.name: the planner knows the gpt model only, not {cfg.model.name!r}"]
            )
        t, oc, dc = cfg.train, cfg.optimizer, cfg.distributed
        mb = micro_batch or t.micro_batch_size
        seqs = (t.grad_accum or 1) * t.micro_batch_size  # sequences per device per step
        accum = max(1, seqs // mb)
        traits = oc.traits()
        params, buffers = model_tensors(cfg.model)
        return cls(
            model=cfg.model,
            micro_batch=mb,
            seq_len=t.seq_len,
            grad_accum=accum,
            bf16=t.precision in ("bf16", "auto"),  # auto: the plan's GPUs all compute bf16
            ns_bf16=traits.ns_dtype in ("bf16", "auto"),
            optimizer=traits.kind,
            nesterov=traits.nesterov,
            params=params,
            buffers=buffers,
            master_bf16=t.master_weights == "bf16",
            adamw_8bit=traits.adamw_8bit,
            checkpointing=t.activation_checkpointing,
            fp8=cfg.model.fp8,
            stochastic_rounding=t.stochastic_rounding,
            world=dc.world_size or 1,
            strategy=dc.strategy,
            shard_muon=dc.shard_muon,
            shard_adamw=dc.shard_adamw,
        )

    def with_micro_batch(self, mb: int) -> Dims:
        steps = self.micro_batch * self.grad_accum
        return replace(self, micro_batch=mb, grad_accum=max(1, steps // mb))

    @property
    def param_bytes(self) -> int:
        """Bytes per element of parameters, gradients and optimizer state."""
        return 2 if self.master_bf16 else 4

    @property
    def ns_bytes(self) -> int:
        """Bytes per element of Muon's Newton–Schulz iterate."""
        return 2 if self.ns_bf16 else 4

    @property
    def loss(self) -> str:
        """model.loss; `auto` is chunked or liger (model/kernels.py), modelled alike."""
        return self.model.loss

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def n_params(self) -> int:
        return sum(p.numel for p in self.params)

    def numel(self, role: str) -> int:
        return sum(p.numel for p in self.params if p.role == role)

    def groups(self) -> dict[str, list[Param]]:
        """Optimizer groups of a fresh run: one per role (growth's origins split them further,
        but a planned run starts fresh)."""
        out: dict[str, list[Param]] = {}
        for p in self.params:
            out.setdefault(p.role, []).append(p)
        return out

    def muon_param(self, p: Param) -> bool:
        return self.optimizer == "muon" and p.role == "matrix"

    @property
    def ddp_ranks(self) -> int:
        """Ranks of a ddp run (1 for one process or fsdp, whose sharding memory.fsdp_peak models)."""
        return self.world if self.strategy == "ddp" else 1

    def muon_owned(self, count: int) -> int:
        """Matrices of a Muon bucket of `count` that rank 0 (which owns the most) steps."""
        if self.ddp_ranks > 1 and self.shard_muon:
            return -(-count // self.ddp_ranks)
        return count

    def muon_buckets(self) -> list[tuple[tuple[int, ...], int]]:
        """(shape, count) of each Muon bucket: same-shaped matrices of one optimizer group."""
        out = []
        for params in self.groups().values():
            shapes: dict[tuple[int, ...], int] = {}
            for p in params:
                if self.muon_param(p):
                    shapes[p.shape] = shapes.get(p.shape, 0) + 1
            out += list(shapes.items())
        return out

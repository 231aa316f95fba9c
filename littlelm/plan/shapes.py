"""The dimensions the memory formulas need, read from a resolved run config (pure functions).

`Dims.of(cfg)` gathers the model's shape, the batch, the precision and the optimizer; the
parameter list (`param_shapes`) mirrors littlelm.model.gpt exactly: the trace, which builds the
real model, checks it (tests/test_plan_memory.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from littlelm.errors import ConfigError
from littlelm.model.gpt import GPT, GPTConfig, default_origin


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def role(self) -> str:
        return GPT.role(self.name)


def param_shapes(m: GPTConfig) -> list[Param]:
    """Every trainable tensor of GPT(m), with its name and shape (tied weights once)."""
    C, V, kv = m.d_model, m.padded_vocab, m.kv_heads * m.head_dim
    q = m.n_head * m.head_dim
    out = [Param("wte.weight", (V, C))]
    out += [
        Param(f"value_embeds.{i}.weight", (V, kv)) for i in range(m.n_layer) if m.has_value_embed(i)
    ]
    for i in range(m.n_layer):
        b = f"blocks.{i}"
        if m.norm_affine:
            out += [Param(f"{b}.norm1.weight", (C,)), Param(f"{b}.norm2.weight", (C,))]
        out += [
            Param(f"{b}.attn.c_q.weight", (q, C)),
            Param(f"{b}.attn.c_k.weight", (kv, C)),
            Param(f"{b}.attn.c_v.weight", (kv, C)),
            Param(f"{b}.attn.c_proj.weight", (C, q)),
        ]
        if m.qkv_bias:  # Qwen2's q/k/v biases
            out += [Param(f"{b}.attn.c_{n}.bias", (n_out,)) for n, n_out in zip("qkv", (q, kv, kv))]
        if m.qk_norm and m.qk_norm_affine:
            out += [Param(f"{b}.attn.{n}.weight", (m.head_dim,)) for n in ("q_norm", "k_norm")]
        if m.has_value_embed(i):
            out.append(Param(f"{b}.attn.ve_gate.weight", (m.kv_heads, m.ve_gate_channels)))
        out.append(Param(f"{b}.mlp.c_fc.weight", (m.hidden, C)))
        if m.mlp == "swiglu":
            out.append(Param(f"{b}.mlp.c_gate.weight", (m.hidden, C)))
        out.append(Param(f"{b}.mlp.c_proj.weight", (C, m.hidden)))
    if m.norm_affine:
        out.append(Param("norm_f.weight", (C,)))
    if not m.tie_embeddings:
        out.append(Param("lm_head.weight", (V, C)))
    if m.residual_scalars:
        out += [Param("resid_lambdas", (m.n_layer,)), Param("x0_lambdas", (m.n_layer,))]
    return out


def buffer_shapes(m: GPTConfig) -> list[tuple[int, ...]]:
    """RoPE cos and sin tables ([cos, cos] and [-sin, sin], in the parameters' dtype)."""
    return [(1, m.max_seq_len, 1, m.head_dim)] * 2


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
        return cls(
            model=cfg.model,
            micro_batch=mb,
            seq_len=t.seq_len,
            grad_accum=accum,
            bf16=t.precision in ("bf16", "auto"),  # auto: the plan's GPUs all compute bf16
            ns_bf16=traits.ns_dtype in ("bf16", "auto"),
            optimizer=traits.kind,
            nesterov=traits.nesterov,
            params=tuple(param_shapes(cfg.model)),
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
        """model.loss; `auto` is chunked or liger (model/backend.py), modelled alike."""
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
        """Optimizer groups as optim.groups builds them: one per (role, origin)."""
        out: dict[str, list[Param]] = {}
        for p in self.params:
            out.setdefault(f"{p.role}/{default_origin(p.role)}", []).append(p)
        return out

    def muon_param(self, p: Param) -> bool:
        return self.optimizer == "muon" and p.role == "matrix"

    @property
    def ddp_ranks(self) -> int:
        """Ranks of a ddp run (1 for one process or fsdp, whose sharding plan/parallel.py models)."""
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

    @property
    def ve_layers(self) -> int:
        return sum(self.model.has_value_embed(i) for i in range(self.model.n_layer))

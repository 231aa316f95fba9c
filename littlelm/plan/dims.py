"""What the memory and speed formulas read of a run (`Dims`): batch, precision, optimizer,
layout, the model's own parameter list (`Param`), LoRA's adapters (`Adapters`) and an RL run's
groups (`Groups`), made from a resolved RunConfig by `Dims.of`. The formulas themselves are in
plan/memory.py and plan/speed.py.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from littlelm.errors import ConfigError
from littlelm.model.blocks import MLPS
from littlelm.model.lora import base_dtype
from littlelm.optim.base import MATRICES, GroupRule, OptimizerTraits
from littlelm.plan.trace import block_bytes, rl_rows
from littlelm.train.build import planned_chat_tokens

if TYPE_CHECKING:
    from littlelm.model.gpt import GPTConfig


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]
    role: str  # the model's role for it (model/protocol.py ROLES), "adapter" for LoRA's A and B
    trainable: bool = True  # False: a LoRA run's frozen base (no gradient, no optimizer state)
    nf4: bool = False  # stored in 4-bit NF4 with its quantization constants (QLoRA's base)
    bf16: bool = False  # a frozen base weight held in bf16 (lora.base_precision: auto, bf16 run)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def module(self) -> str:
        """The module's name within its block ("attn.c_q", "mlp.c_proj"), else ""."""
        parts = self.name.split(".")
        return ".".join(parts[2:-1]) if parts[0] == "blocks" and len(parts) > 3 else ""


@dataclass(frozen=True)
class Adapters:
    """What a run's `lora:` section (model/lora.py) makes of the model, as the formulas read
    it: each target linear's weight frozen with two trainable factors beside it, A (rank, in)
    and B (out, rank); everything else frozen but the embeddings and norms it names."""

    rank: int
    targets: tuple[str, ...]  # modules within a block: "attn.c_q", ..., "mlp.c_proj"
    dropout: bool = False  # lora.dropout > 0: each adapter keeps its dropped input and mask
    nf4: bool = False  # lora.quantize: nf4 (QLoRA): the target weights in 4-bit NF4
    # the target weights held in bf16 (lora.base_precision: auto in a bf16 run; model/lora.py's
    # base_dtype): no fp32 copy, and no autocast copy either (they are bf16 already)
    bf16_base: bool = False
    train_embeddings: bool = False
    train_norms: bool = False
    # rows of the token embedding (and of an untied lm_head) trained (lora.trainable_tokens;
    # model/token_rows.py): lm_head's weight is then a copy with their change added, per step
    token_rows: int = 0

    @classmethod
    def of(
        cls, lora, model: GPTConfig, bf16: bool = False, chat_tokens: int = 0
    ) -> Adapters | None:
        """From a LoRAConfig (None: a full run), in a run computing in bf16 or not, whose
        tokenizer has `chat_tokens` of the chat control tokens (the rows LoRA trains)."""
        if lora is None:
            return None
        return cls(
            rank=lora.rank,
            targets=lora.modules(MLPS[model.mlp].inputs),
            dropout=lora.dropout > 0,
            nf4=lora.quantize == "nf4",
            bf16_base=base_dtype(lora, "bf16" if bf16 else "fp32") == torch.bfloat16,
            train_embeddings=lora.train_embeddings,
            train_norms=lora.train_norms,
            token_rows=lora.rows_trained(chat_tokens),
        )

    @property
    def attention(self) -> bool:
        """Do the attention's linears have adapters (then each is its own matmul: LoRALinear
        is not the plain nn.Linear whose weights the attention stacks)?"""
        return any(t.startswith("attn.") for t in self.targets)

    @property
    def mlp(self) -> bool:
        return any(t.startswith("mlp.") for t in self.targets)

    def targeted(self, p: Param) -> bool:
        return p.role == "matrix" and p.name.endswith(".weight") and p.module in self.targets

    def trains(self, p: Param) -> bool:
        """Is a parameter that is not a target trained in full?"""
        if p.role in ("embedding", "lm_head"):  # wte, and lm_head when untied
            return self.train_embeddings
        module = p.name.split(".")[-2] if "." in p.name else ""  # norm1, norm_f, q_norm, ...
        norm = module.startswith("norm") or module.endswith("_norm")
        return self.train_norms and norm and p.name.endswith(".weight")

    def apply(self, params: tuple[Param, ...]) -> tuple[Param, ...]:
        """The model's parameters with each target's weight frozen (NF4 under QLoRA) and its
        two factors after it; the rest trainable as `trains` says."""
        out: list[Param] = []
        for p in params:
            if p.role in ("embedding", "lm_head") and self.token_rows and not self.trains(p):
                out.append(replace(p, trainable=False))  # its trained rows beside it
                out.append(
                    Param(
                        p.name.replace(".weight", ".delta"), (self.token_rows, p.shape[1]), p.role
                    )
                )
                continue
            if not self.targeted(p):
                out.append(replace(p, trainable=self.trains(p)))
                continue
            rows, cols = p.shape
            module = p.name.removesuffix(".weight")
            out.append(
                replace(p, trainable=False, nf4=self.nf4, bf16=self.bf16_base and not self.nf4)
            )
            out.append(Param(f"{module}.lora_A", (self.rank, cols), "adapter"))
            out.append(Param(f"{module}.lora_B", (rows, self.rank), "adapter"))
        return tuple(out)


_TENSORS: dict[str, tuple[tuple[Param, ...], tuple[int, ...]]] = {}


def model_tensors(m) -> tuple[tuple[Param, ...], tuple[int, ...]]:
    """The trainable parameters of the model config `m` builds (tied ones once) and the sizes of
    its floating buffers (the RoPE tables), from the model built on the meta device; cached per
    config, since a plan reads the same model many times."""
    key = m.model_dump_json()
    if key not in _TENSORS:
        with torch.device("meta"):
            model = m.build()
        params = tuple(Param(n, tuple(p.shape), model.role(n)) for n, p in model.named_parameters())
        buffers = tuple(b.numel() for b in model.buffers() if b.is_floating_point())
        _TENSORS[key] = (params, buffers)
    return _TENSORS[key]


def copies_reference(lora: Adapters | None) -> bool:
    """Is an objective's frozen reference a copy of the base (train/transform.py)? Under LoRA it
    is the model with its adapters off, unless LoRA trains whole tensors (the base changed)."""
    return lora is None or lora.train_embeddings or lora.train_norms


@dataclass(frozen=True)
class Groups:
    """An RL run's step (train/rl.py): `count` groups (rl.prompts_per_step), one forward and
    backward each, of `size` rows (rl.group_size), each a prompt of `prompt` tokens and its
    reply, `width` tokens in all (plan/trace.py's rl_rows); first sampled through a KV cache of
    `width` positions, and with rl.iterations > 1 (`keeps_old`) the log-probs of the replies
    as sampled taken too."""

    size: int
    prompt: int
    width: int
    count: int
    keeps_old: bool
    measured: bool = False  # `prompt` read from rl.prompts (else the model's bound)

    @classmethod
    def of(cls, cfg) -> Groups | None:
        r = getattr(cfg, "rl", None)
        if r is None:
            return None
        prompt, width, measured = rl_rows(cfg)
        return cls(r.group_size, prompt, width, r.prompts_per_step, r.iterations > 1, measured)


@dataclass(frozen=True)
class Dims:
    """What the memory and speed formulas read of a run: batch, precision, optimizer, layout, and
    the model's own parameter list. `tokens` is one micro-batch (micro_batch × seq_len)."""

    model: GPTConfig
    micro_batch: int
    seq_len: int
    grad_accum: int
    bf16: bool
    optimizer: OptimizerTraits  # its group kinds, each a rule with its state and its sharding
    params: tuple[Param, ...]
    buffers: tuple[int, ...] = ()  # elements of each floating buffer (stored in the param dtype)
    master_bf16: bool = False  # train.master_weights: bf16 (parameters, grads, state in bf16)
    checkpointing: bool = False  # train.activation_checkpointing
    fp8: bool = False  # model.fp8
    compile: bool = False  # train.compile on CUDA: calibrated by the compiled published runs
    stochastic_rounding: bool = False  # train.stochastic_rounding
    world: int = 1  # processes (distributed.world_size)
    strategy: str = "ddp"  # distributed.strategy: "ddp" or "fsdp"
    shard_muon: bool = True  # distributed.shard_muon (ddp): Muon momentum of owned matrices only
    shard_adamw: bool = False  # distributed.shard_adamw (ddp): ZeRO-1, AdamW moments split
    lora: Adapters | None = None  # the run's `lora:` section (None: every parameter trains)
    fine_tunes: bool = False  # starts from trained weights (sft: or lora:): LoRA applies
    chat_tokens: int = 0  # chat control tokens of the run's tokenizer (LoRA trains their rows)
    # a DPO run: each micro-batch item a pair, two rows (chosen, rejected), and the frozen
    # reference resident beside the model: its own copy, or under LoRA the model with its
    # adapters off (no weights of its own)
    rows_per_item: int = 1
    reference_copy: bool = False
    reference: bool = False  # the objective holds a frozen reference (a copy or adapters off)
    # an RL run: one group a micro-batch (rows_per_item its replies, seq_len its rows' inputs),
    # its groups accumulating gradients, its sampling before them; and its own loss path
    groups: Groups | None = None
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
        bf16 = t.precision in ("bf16", "auto")  # auto: the plan's GPUs all compute bf16
        chat = planned_chat_tokens(cfg.data.tokenizer)
        dpo = getattr(cfg, "dpo", None)
        lora = Adapters.of(getattr(cfg, "lora", None), cfg.model, bf16, chat)
        groups = Groups.of(cfg)
        rows, seq = (2 if dpo is not None else 1), t.seq_len
        if groups is not None:  # RL: a group's rows a micro-batch, every group its own
            mb, accum, rows, seq = 1, 1, groups.size, groups.width - 1
        refers = dpo is not None or groups is not None
        return cls(
            model=cfg.model,
            micro_batch=mb,
            seq_len=seq,
            grad_accum=accum,
            bf16=bf16,
            optimizer=traits,
            params=lora.apply(params) if lora else params,
            buffers=buffers,
            lora=lora,
            fine_tunes=cfg.sft is not None or lora is not None,
            chat_tokens=chat,
            rows_per_item=rows,
            # the transform's reference: LoRA's adapters off, unless LoRA trains tensors in full
            reference_copy=refers and copies_reference(lora),
            reference=refers,
            groups=groups,
            master_bf16=t.master_weights == "bf16",
            checkpointing=t.activation_checkpointing,
            fp8=cfg.model.fp8,
            compile=t.compiles("cuda"),
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
    def act_bytes(self) -> int:
        """Bytes per element the matmuls compute in: bf16 under autocast, else fp32."""
        return 2 if self.bf16 else 4

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.rows_per_item * self.seq_len

    @property
    def n_params(self) -> int:
        return sum(p.numel for p in self.params)

    @property
    def trainable(self) -> tuple[Param, ...]:
        """The parameters that get gradients and optimizer state (all but a LoRA run's base)."""
        return tuple(p for p in self.params if p.trainable)

    @property
    def n_trainable(self) -> int:
        return sum(p.numel for p in self.trainable)

    def without_lora(self) -> Dims:
        """The same run trained in full (every parameter, as the model builds them)."""
        full = model_tensors(self.model)[0]
        return replace(self, params=full, lora=None, reference_copy=self.reference)

    def with_lora(self, lora: Adapters) -> Dims:
        """The same run under `lora` (the plan's LoRA and QLoRA columns): its reference too."""
        copies = self.reference and copies_reference(lora)
        return replace(
            self, params=lora.apply(model_tensors(self.model)[0]), lora=lora, reference_copy=copies
        )

    def numel(self, role: str) -> int:
        return sum(p.numel for p in self.params if p.role == role)

    def rule(self, p: Param) -> GroupRule:
        """The rule that steps `p` (a trained parameter)."""
        return self.optimizer.rule(p.role)

    def matrix_param(self, p: Param) -> bool:
        """Is `p` stepped by a rule that shards whole matrices (Muon)?"""
        return p.trainable and self.rule(p).sharding == MATRICES

    @property
    def ddp_ranks(self) -> int:
        """Ranks of a ddp run (1 for one process or fsdp, whose sharding fsdp_per_gpu models)."""
        return self.world if self.strategy == "ddp" else 1

    @property
    def frozen_input(self) -> bool:
        """Does the first block's input carry no gradient (a LoRA run whose embedding and first
        norm's gain are frozen, no token rows trained)? Then that block's ops before its first
        adapter record nothing for the backward: autograd keeps what a gradient needs, and none
        flows there."""
        lo = self.lora
        return (
            lo is not None
            and not lo.train_embeddings
            and not lo.token_rows
            and not (lo.train_norms and self.model.norm_affine)
        )

    @property
    def head_trains(self) -> bool:
        """Does lm_head get a gradient (always, but in a LoRA run without train_embeddings)?
        Under LoRA's trained token rows its weight is a copy with the rows written in, whose
        gradient is made whole (the loss's product) before the rows' is taken from it."""
        head = "embedding" if self.model.tie_embeddings else "lm_head"
        return any(p.trainable for p in self.params if p.role == head)

    @property
    def head_grad_kept(self) -> bool:
        """Is lm_head's own weight trained (its whole gradient kept until the step), not only
        rows of it (whose whole gradient is freed once the rows' is taken)?"""
        head = "embedding" if self.model.tie_embeddings else "lm_head"
        return any(
            p.trainable and p.name.endswith(".weight") for p in self.params if p.role == head
        )

    @property
    def head_copy(self) -> int:
        """Bytes of lm_head's weight copy under LoRA's trained token rows (0 without): made at
        the loss's start, kept by its product for the backward (model/token_rows.py)."""
        if self.lora is None or not self.lora.token_rows or self.lora.train_embeddings:
            return 0
        m = self.model
        # its bf16 cast for the loss's matmul, made from it (so in the loss, not a weight copy)
        cast = block_bytes(2 * m.vocab * m.d_model) if self.bf16 and not self.master_bf16 else 0
        return block_bytes(self.param_bytes * m.padded_vocab * m.d_model) + cast

    @property
    def plain_loss(self) -> bool:
        """Does the step's loss make every logit at once (model.loss: plain, or DPO's per-token
        log-probs with gradients: model/kernels.py's linear_cross_entropy)?"""
        return self.model.loss == "plain" or self.rows_per_item == 2 or self.groups is not None

    @property
    def casts_head(self) -> bool:
        """Does the chunked loss read lm_head through a bf16 copy of its rows (bf16 autocast,
        fp32 master weights)?"""
        return not self.plain_loss and self.bf16 and not self.master_bf16

    def matrix_owned(self, count: int) -> int:
        """Matrices of a bucket of `count` (a MATRICES rule's: Muon's) that rank 0 (which owns
        the most) steps."""
        if self.ddp_ranks > 1 and self.shard_muon:
            return -(-count // self.ddp_ranks)
        return count

    def matrix_buckets(self) -> list[tuple[Any, tuple[int, ...], int]]:
        """(rule, shape, count) of each bucket of a MATRICES rule (Muon's): same-shaped matrices
        of one optimizer group (a fresh run has one per role, and Muon steps the matrices';
        growth's origins split groups further, but a planned run starts fresh)."""
        counts = Counter((self.rule(p), p.shape) for p in self.trainable if self.matrix_param(p))
        return [(rule, shape, n) for (rule, shape), n in counts.items()]

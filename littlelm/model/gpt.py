"""The GPT: a decoder-only transformer with the features of modern small-model recipes.

Read top-down: GPTConfig, then the pieces (rope, Attention, Block), then GPT.forward; the MLP
variants are described once in model/blocks.py, which the planner and export read too.
Every feature is a config switch so the planner and the ablations see the same code.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn
from torch.utils.checkpoint import checkpoint

from littlelm.config import RESUMABLE, named
from littlelm.model.blocks import MLP, MLPS, MLPName, Norm, hidden_width
from littlelm.model.fp8 import check_fp8_device, linear
from littlelm.model.kernels import (
    Backend,
    BackendName,
    check_loss_impl,
    compute_dtype,
    linear_cross_entropy,
    loss_impl,
    rope_tables,
    select_backend,
    softcap,
)
from littlelm.model.kv_cache import KVCache
from littlelm.model.protocol import ROLES, ModelConfig


class GPTConfig(ModelConfig):
    """Shape and features of the GPT. Derived values (vocab size, MLP width) are filled in by
    `resolve()` and shown in the resolved config."""

    name: Literal["gpt"] = named("gpt")
    vocab_size: int | None = Field(
        None, description="Real vocabulary size; null = take it from the tokenizer.", ge=2
    )
    vocab_pad_multiple: int = Field(
        64, description="Pad the embedding and lm_head rows to a multiple of this (1 = none).", ge=1
    )
    n_layer: int = Field(12, description="Number of transformer blocks.", ge=1)
    d_model: int = Field(768, description="Width of the residual stream.", ge=8)
    n_head: int = Field(6, description="Query heads.", ge=1)
    n_kv_head: int | None = Field(
        None, description="Key/value heads (grouped-query attention); null = n_head.", ge=1
    )
    head_size: int | None = Field(
        None, description="Width of each attention head; null = d_model / n_head.", ge=2
    )
    max_seq_len: int = Field(1024, description="Longest context in tokens (RoPE table size).", ge=2)
    rope_base: float = Field(10000.0, description="RoPE base frequency.", gt=0)
    mlp: MLPName = Field(
        "relu2",
        description=f"MLP type: {' or '.join(s.title for s in MLPS.values())}.",
    )
    mlp_ratio: float = Field(
        4.0, description="MLP hidden width / d_model (SwiGLU uses 2/3 of it).", gt=0
    )
    mlp_hidden: int | None = Field(
        None, description="MLP hidden width; null = derived from mlp_ratio (multiple of 64).", ge=1
    )
    qk_norm: bool = Field(True, description="RMS-normalise queries and keys per head.")
    softcap: float | None = Field(
        15.0, description="Logit soft cap c in c*tanh(x/c); null = off.", gt=0
    )
    residual_scalars: bool = Field(
        True, description="Learnable per-layer x = λ_resid·x + λ_x0·x0 before each block."
    )
    value_embeds: bool = Field(
        True, description="ResFormer value embeddings mixed into V on alternating layers."
    )
    value_embed_layers: list[int] | None = Field(
        None,
        description="Layers with a value embedding; null = alternating, ending at the last "
        "(grown models list theirs: docs/growth.md).",
    )
    ve_gate_channels: int = Field(
        32, description="Residual channels that feed each value-embedding gate.", ge=1
    )
    backend: BackendName = Field(
        "auto",
        description="Kernel set (model/kernels.py): cpu = littlelm's CPU-tuned kernels (blocked "
        "attention, hand-written backward ops, chunked loss); cuda = PyTorch's (SDPA, F.rms_norm, "
        "autograd, Liger loss if installed); auto = cuda's on CUDA, else cpu's. (torch.compile is "
        "train.compile's choice.)",
        json_schema_extra=RESUMABLE,
    )
    loss: Literal["auto", "chunked", "plain", "liger"] = Field(
        "auto",
        description="Cross-entropy implementation: chunked (never makes the full logits), "
        "plain, liger (CUDA, liger-kernel), or auto (the backend's: chunked on the CPU, liger "
        "on CUDA when installed, else chunked).",
        json_schema_extra=RESUMABLE,
    )
    loss_chunk: int = Field(
        256,
        description="Rows (tokens) per chunk of the chunked loss.",
        ge=1,
        json_schema_extra=RESUMABLE,
    )
    fp8: bool = Field(
        False,
        description="FP8 matmuls (torch._scaled_mm, e4m3 activations/weights, dynamic "
        "power-of-two tensorwise scales) in the blocks' linears; CUDA capability 8.9+ or CPU.",
        json_schema_extra=RESUMABLE,
    )
    fp8_grad_dtype: Literal["e4m3", "e5m2"] = Field(
        "e4m3",
        description="FP8 format of the output gradient in the two backward GEMMs under fp8 "
        "(e5m2: more range, one mantissa bit less).",
        json_schema_extra=RESUMABLE,
    )
    fp8_min_dim: int = Field(
        256,
        description="Linears whose smaller dimension is below this stay in bf16 under fp8.",
        ge=16,
        json_schema_extra=RESUMABLE,
    )
    tie_embeddings: bool = Field(False, description="Share the token embedding with lm_head.")
    norm_affine: bool = Field(False, description="Give RMSNorms a learnable gain.")
    embed_norm: bool = Field(
        True,
        description="RMS-normalise the token embedding right after the lookup (false: "
        "Llama-style, the raw embedding enters the stream; imported models use it).",
    )
    norm_eps: float | None = Field(
        None,
        description="Epsilon of every RMSNorm; null = the machine epsilon of the input's dtype "
        "(imported models keep their rms_norm_eps).",
        gt=0,
    )
    qk_norm_affine: bool = Field(
        False,
        description="Learnable per-channel gains on the QK-norm, one vector for queries and "
        "one for keys (Qwen3's q_norm / k_norm).",
    )
    qkv_bias: bool = Field(
        False,
        description="Biases on the query, key and value projections (Qwen2 / Qwen2.5's "
        "layout; `littlelm import` sets it for them). Not with fp8.",
    )

    @model_validator(mode="after")
    def _check_shapes(self) -> GPTConfig:
        if self.qkv_bias and self.fp8:
            raise ValueError("qkv_bias with fp8: FP8 linears have no bias; turn one of them off")
        if self.head_size is None and self.d_model % self.n_head:
            raise ValueError(
                f"d_model {self.d_model} is not divisible by n_head {self.n_head}; "
                "change one or set head_size"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")
        kv = self.n_kv_head or self.n_head
        if self.n_head % kv:
            raise ValueError(f"n_head {self.n_head} is not divisible by n_kv_head {kv}")
        layers = self.value_embed_layers
        if layers is not None and (
            sorted(set(layers)) != layers or any(not 0 <= i < self.n_layer for i in layers)
        ):
            raise ValueError(
                f"value_embed_layers {layers} must be increasing layer indices in [0, {self.n_layer})"
            )
        return self

    growable: ClassVar[bool] = True  # model/grow.py
    analytic_plan: ClassVar[bool] = True  # plan/memory.py's formulas describe GPT's step

    def check_device(self, device: torch.device) -> None:
        """Fail early, with the fix, when a configured feature cannot run on `device`."""
        check_loss_impl(loss_impl(self.loss, select_backend(self.backend, device)), device)
        if self.fp8:
            check_fp8_device(device)

    def loss_rows_per_pass(self) -> int | None:
        return None if self.loss == "plain" else self.loss_chunk

    def speed_settings(self, device: torch.device | str = "cpu") -> list[str]:
        loss = loss_impl(self.loss, select_backend(self.backend, device))
        parts = [f"{loss} loss" + (f" ({self.loss_chunk} rows/chunk)" if loss == "chunked" else "")]
        if self.fp8:
            parts.append(
                f"fp8 (layers >= {self.fp8_min_dim} wide, {self.fp8_grad_dtype} gradients)"
            )
        return parts

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def vocab(self) -> int:
        """vocab_size, which the schema resolves from the tokenizer before a model is built."""
        assert self.vocab_size is not None, "vocab_size is resolved from the tokenizer first"
        return self.vocab_size

    @property
    def padded_vocab(self) -> int:
        m = self.vocab_pad_multiple
        return (self.vocab + m - 1) // m * m

    @property
    def hidden(self) -> int:
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        return hidden_width(self.mlp, self.d_model, self.mlp_ratio)

    def has_value_embed(self, layer: int) -> bool:
        """The listed layers, or alternating layers always including the last one."""
        if not self.value_embeds:
            return False
        if self.value_embed_layers is not None:
            return layer in self.value_embed_layers
        return layer % 2 == (self.n_layer - 1) % 2

    def build(self) -> GPT:
        """The model, freshly initialised (from the current RNG state)."""
        return GPT(self)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig, layer: int):
        super().__init__()
        self.n_head, self.n_kv, self.hd = cfg.n_head, cfg.kv_heads, cfg.head_dim
        self.qk_norm, self.eps = cfg.qk_norm, cfg.norm_eps
        if cfg.qk_norm and cfg.qk_norm_affine:  # separate gains for q and k (Qwen3)
            self.q_norm = Norm(self.hd, True)
            self.k_norm = Norm(self.hd, True)
        C, q_dim, kv_dim = cfg.d_model, self.n_head * self.hd, self.n_kv * self.hd
        self.c_q = block_linear(cfg, C, q_dim)
        self.c_k = block_linear(cfg, C, kv_dim)
        self.c_v = block_linear(cfg, C, kv_dim)
        if cfg.qkv_bias:  # Qwen2's q/k/v biases (nn.Linear's own `bias`, so names match HF's)
            for m in (self.c_q, self.c_k, self.c_v):
                m.bias = nn.Parameter(torch.zeros(m.out_features))
        self.c_proj = block_linear(cfg, q_dim, C)
        self.ve_channels = cfg.ve_gate_channels
        self.ve_gate = (
            nn.Linear(cfg.ve_gate_channels, self.n_kv, bias=False)
            if cfg.has_value_embed(layer)
            else None
        )

    def qk_v(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Projections of x (B, T, C): q and k side by side (B, T, H + Hkv, D), so that qk-norm
        and RoPE treat them in one pass each, and v (B, T, Hkv, D). Plain linears run as one
        matmul against the three weights stacked (one pass over x, one larger GEMM each way);
        FP8 ones separately."""
        B, T, _ = x.shape
        layers = (self.c_q, self.c_k, self.c_v)
        if any(type(m) is not nn.Linear for m in layers):
            qk, v = torch.cat([self.c_q(x), self.c_k(x)], dim=-1), self.c_v(x)
        else:
            w = torch.cat([m.weight for m in layers])  # (q_dim + 2·kv_dim, C)
            b = torch.cat([m.bias for m in layers]) if self.c_q.bias is not None else None
            qk_dim = self.c_q.out_features + self.c_k.out_features
            qk, v = F.linear(x, w, b).split([qk_dim, self.c_v.out_features], dim=-1)
        return qk.view(B, T, self.n_head + self.n_kv, self.hd), v.view(B, T, self.n_kv, self.hd)

    def forward(self, x, cos, sin, be: Backend, ve=None, cache=None, mask=None):
        """x (B, T, C) already normalised and in the matmul dtype; `be` the model's kernels.
        mask: optional (B, 1, T, T) bool, True = may attend (replaces the causal mask)."""
        B, T, _ = x.shape
        qk, v = self.qk_v(x)  # (B, T, H + Hkv, D), (B, T, Hkv, D)
        if ve is not None:
            assert self.ve_gate is not None, "GPT.layer passes value embeddings to gated layers"
            # gate in (0, 2), exactly 1 at init: 2·sigmoid(0)
            gate = 2 * torch.sigmoid(self.ve_gate(x[..., : self.ve_channels]))  # (B, T, Hkv)
            ve = ve.to(v.dtype).view(B, T, self.n_kv, self.hd)
            v = be.gated_add(v, gate, ve)
        if self.qk_norm:
            qk = be.rms_norm(qk, eps=self.eps)  # per head: the same for q and k
            if hasattr(self, "q_norm"):  # (H + Hkv, D) gains: q's for query heads, k's for kv
                q_gain, k_gain = self.q_norm.weight, self.k_norm.weight
                assert q_gain is not None and k_gain is not None, "built affine (qk_norm_affine)"
                gains = [q_gain.expand(self.n_head, -1), k_gain.expand(self.n_kv, -1)]
                qk = qk * torch.cat(gains).to(qk.dtype)
        qk = be.apply_rope(qk, cos, sin)
        q, k = qk.split([self.n_head, self.n_kv], dim=2)  # (B, T, H|Hkv, D)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        gqa = self.n_kv != self.n_head
        if mask is not None:
            assert cache is None, "an explicit mask and a KV cache do not mix"
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        elif cache is None:
            y = be.attention(q, k, v)  # cpu backend: a faster blocked kernel
        else:
            k, v, mask = cache.update(k, v)  # all cached positions; mask is None or (T, T_all)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.hd)  # (B, T, C)
        return self.c_proj(y)


def block_linear(cfg: GPTConfig, in_features: int, out_features: int) -> nn.Linear:
    """The blocks' matmul layers: FP8 when model.fp8 is on and the shape passes the filter."""
    return linear(in_features, out_features, cfg.fp8, cfg.fp8_min_dim, cfg.fp8_grad_dtype)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, layer: int):
        super().__init__()
        self.norm1 = Norm(cfg.d_model, cfg.norm_affine, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.norm2 = Norm(cfg.d_model, cfg.norm_affine, cfg.norm_eps)
        self.mlp = MLP(cfg.mlp, cfg.d_model, cfg.hidden, lambda i, o: block_linear(cfg, i, o))

    def forward(self, x, cos, sin, kernels: Backend, ve=None, cache=None, mask=None):
        dt = compute_dtype(x)  # normalise straight into the matmul dtype: one cast, not three
        x = x + self.attn(self.norm1(x, kernels, dt), cos, sin, kernels, ve, cache, mask)
        return x + self.mlp(self.norm2(x, kernels, dt), kernels)


class GPT(nn.Module):
    """Decoder-only transformer.

    Initialisation, and why:
    - token and value embeddings ~ N(0, 1): the stream is RMS-normalised right after the lookup,
      so only directions matter and unit scale keeps Adam's relative updates meaningful;
    - input projections (q, k, v, MLP in, gates' none) ~ U(±sqrt(3/d_in)), i.e. std 1/sqrt(d_in),
      which preserves the variance of a normalised input;
    - output projections (attention c_proj, MLP c_proj) and value-embedding gates = 0: every block
      starts as the identity (and every gate at exactly 1), which is also what lets `grow` insert
      new blocks without changing the function;
    - lm_head ~ N(0, 0.001): near-uniform first predictions, loss ≈ ln(vocab) at step 0;
    - residual scalars λ_resid = 1, λ_x0 = 0: the plain residual stream at init.
    """

    rope_cos: torch.Tensor  # (1, max_seq_len, 1, head_dim) buffers: rope_tables
    rope_sin: torch.Tensor

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.vocab_size is not None, "resolve the config (vocab_size) before building"
        self.cfg = cfg
        V, C = cfg.padded_vocab, cfg.d_model
        self.wte = nn.Embedding(V, C)
        kv_dim = cfg.kv_heads * cfg.head_dim
        self.value_embeds = nn.ModuleDict(
            {str(i): nn.Embedding(V, kv_dim) for i in range(cfg.n_layer) if cfg.has_value_embed(i)}
        )
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.norm_f = Norm(C, cfg.norm_affine, cfg.norm_eps)
        self.lm_head = nn.Linear(C, V, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        if cfg.residual_scalars:
            self.resid_lambdas = nn.Parameter(torch.ones(cfg.n_layer))
            self.x0_lambdas = nn.Parameter(torch.zeros(cfg.n_layer))
        cos, sin = rope_tables(cfg.max_seq_len, cfg.head_dim, cfg.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()
        self.use_kernels()  # for the device it was built on; again whenever it moves (_apply)
        # train.activation_checkpointing: recompute each layer in the backward pass
        self.activation_checkpointing = False

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            self.init_param(name, p)

    @torch.no_grad()
    def init_param(self, name: str, p: torch.Tensor) -> None:
        role = self.role(name)
        if role in ("embedding", "value_embedding"):
            nn.init.normal_(p, std=1.0)
        elif role == "lm_head":
            nn.init.normal_(p, std=0.001 if not self.cfg.tie_embeddings else 1.0)
        elif name.endswith("c_proj.weight") or name.endswith("ve_gate.weight"):
            nn.init.zeros_(p)
        elif (
            name.endswith("resid_lambdas")
            or name.endswith("norm1.weight")
            or name.endswith("norm2.weight")
            or name.endswith("norm_f.weight")
            or name.endswith("_norm.weight")  # q_norm, k_norm
        ):
            nn.init.ones_(p)
        elif name.endswith("x0_lambdas") or name.endswith(".bias"):
            nn.init.zeros_(p)
        else:
            bound = math.sqrt(3.0 / p.size(1))
            nn.init.uniform_(p, -bound, bound)

    @staticmethod
    def role(name: str) -> str:
        """Which optimizer role a parameter plays (see optim.groups)."""
        if name.startswith("wte."):
            return "embedding"
        if name.startswith("value_embeds."):
            return "value_embedding"
        if name.startswith("lm_head."):
            return "lm_head"
        if ".lora_" in name:  # model/lora.py's A and B
            return "adapter"
        if name.startswith("blocks.") and name.endswith(".weight") and "norm" not in name:
            return "matrix"
        return "scalar"

    def use_kernels(self) -> None:
        """Pick the kernels (model/kernels.py: model.backend, `auto` by device) and the loss
        (model.loss, `auto`: the kernels') for the device the parameters are on: once, when
        the model is placed, not at every forward."""
        self.kernels = select_backend(self.cfg.backend, self.table().device)
        self.loss_impl = loss_impl(self.cfg.loss, self.kernels)

    def _apply(self, fn, recurse=True):
        # every move of the parameters (.to, .cuda, to_empty) goes through here
        super()._apply(fn, recurse)
        self.use_kernels()
        return self

    def shard_units(self) -> list[nn.Module]:
        """Modules sharded as their own FSDP unit (gathered just before they run, freed after):
        every block, every value-embedding table and the token embedding. The root unit keeps
        the rest: lm_head (read as a weight by the loss, not called as a module), the final norm
        and the residual scalars; a tied token embedding stays there with lm_head."""
        units: list[nn.Module] = [*self.blocks, *self.value_embeds.values()]
        if not self.tied():
            units.append(self.wte)
        return units

    def tied(self) -> bool:
        """Do lm_head and the token embedding share one matrix (one module under LoRA's trained
        token rows, model/token_rows.py, whose `weight` is a new copy at every read)?"""
        if self.lm_head is self.wte:
            return True
        return self.table() is getattr(self.lm_head, "frozen", self.lm_head.weight)

    def table(self) -> torch.Tensor:
        """The token embedding's stored matrix: under LoRA's trained token rows the frozen one
        (its `weight` is a copy with the rows added, made for the loss, not to be read for a
        dtype or a device)."""
        table = getattr(self.wte, "frozen", None)
        return table if isinstance(table, torch.Tensor) else self.wte.weight

    def param_counts(self) -> dict[str, int]:
        """total, embedding (token + value tables) and non-embedding parameter counts."""
        counts = {r: 0 for r in ROLES}
        for name, p in self.named_parameters():
            counts[self.role(name)] += p.numel()
        total = sum(counts.values())
        emb = counts["embedding"] + counts["value_embedding"]
        return {"total": total, "embedding": emb, "non_embedding": total - emb}

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token: 6 per matmul weight, plus attention's 12·L·H·D·T."""
        return flops_per_token(self.cfg, seq_len or self.cfg.max_seq_len)

    def forward(self, idx, targets=None, reduction: str = "mean", caches=None):
        """idx (B, T) token ids. With targets: the loss (mean, or per token with
        reduction='none'); without: logits (B, T, vocab_size) in fp32."""
        x = self.hidden(idx, caches)
        if targets is not None:
            c = self.cfg
            return linear_cross_entropy(
                x,
                self.lm_head.weight,
                targets,
                c.vocab,
                c.softcap,
                reduction,
                self.loss_impl,
                c.loss_chunk,
            )
        return self.head(x)

    def hidden(self, idx, caches=None, positions=None, attn_mask=None) -> torch.Tensor:
        """Final normalised hidden states (B, T, C) of idx (B, T).

        Packed or tree-shaped inputs (several sequences sharing a prefix in one row, see
        eval.core) pass `positions` (B, T) for RoPE and `attn_mask` (B, 1, T, T) bool instead
        of the causal default; neither mixes with `caches`.
        """
        T = idx.size(1)
        pos = 0 if caches is None else caches[0].length
        dt = compute_dtype(self.table())
        if positions is None:
            if pos + T > self.cfg.max_seq_len:
                raise ValueError(
                    f"sequence of {pos + T} tokens exceeds max_seq_len {self.cfg.max_seq_len}"
                )
            cos = self.rope_cos[:, pos : pos + T].to(dt)  # (1, T, 1, D)
            sin = self.rope_sin[:, pos : pos + T].to(dt)
        else:
            assert caches is None, "explicit positions and a KV cache do not mix"
            if int(positions.max()) >= self.cfg.max_seq_len:
                raise ValueError(
                    f"position {int(positions.max())} exceeds max_seq_len {self.cfg.max_seq_len}"
                )
            cos = self.rope_cos[0, positions].to(dt)  # (B, T, 1, D)
            sin = self.rope_sin[0, positions].to(dt)
        x = self.wte(idx)  # (B, T, C)
        if self.cfg.embed_norm:
            x = self.kernels.rms_norm(x, eps=self.cfg.norm_eps)
        x0 = x
        recompute = self.activation_checkpointing and torch.is_grad_enabled() and caches is None
        for i in range(self.cfg.n_layer):
            cache = None if caches is None else caches[i]
            if recompute:  # keep only x; redo the layer in the backward pass
                x = checkpoint(
                    self.layer, i, x, x0, idx, cos, sin, None, attn_mask, use_reentrant=False
                )
            else:
                x = self.layer(i, x, x0, idx, cos, sin, cache, attn_mask)
        return self.norm_f(x, self.kernels, compute_dtype(x))  # (B, T, C) in the matmul dtype

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (..., vocab_size) in fp32 from hidden states (..., C); padding rows cut."""
        logits = F.linear(x, self.lm_head.weight)[..., : self.cfg.vocab_size].float()
        return softcap(logits, self.cfg.softcap)

    def layer(self, i: int, x, x0, idx, cos, sin, cache=None, mask=None) -> torch.Tensor:
        """Layer i: residual scalars, value-embedding lookup, block (one checkpointing unit)."""
        if self.cfg.residual_scalars:
            x = self.kernels.residual_mix(x, x0, self.resid_lambdas[i], self.x0_lambdas[i])
        ve = self.value_embeds[str(i)](idx) if str(i) in self.value_embeds else None
        return self.blocks[i](x, cos, sin, self.kernels, ve, cache, mask)

    def new_caches(self, batch: int, max_len: int | None = None) -> list[KVCache]:
        """Empty per-layer KV caches for incremental decoding (see model.generate)."""
        w = self.table()
        dt = compute_dtype(w)
        n = max_len or self.cfg.max_seq_len
        c = self.cfg
        return [KVCache(batch, c.kv_heads, n, c.head_dim, dt, w.device) for _ in range(c.n_layer)]


def flops_per_token(cfg: GPTConfig, seq_len: int) -> int:
    """6·(matmul weights) + 12·L·H·D·T, the usual convention (causal masking not discounted)."""
    C, q, kv = cfg.d_model, cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    hid, V = cfg.hidden, cfg.padded_vocab
    attn = 2 * C * q + 2 * C * kv  # q, proj; k, v
    mlp = MLPS[cfg.mlp].matmul_weights(C, hid)
    gates = (
        cfg.ve_gate_channels
        * cfg.kv_heads
        * sum(cfg.has_value_embed(i) for i in range(cfg.n_layer))
    )
    matmul = cfg.n_layer * (attn + mlp) + gates + C * V
    return 6 * matmul + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len

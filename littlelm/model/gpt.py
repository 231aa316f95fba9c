"""The GPT: a decoder-only transformer with the features of modern small-model recipes.

Read top-down: GPTConfig, then the pieces (rope, Attention, MLPs, Block), then GPT.forward.
Every feature is a config switch so the planner and the ablations see the same code.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from littlelm.config import ComponentConfig
from littlelm.model.kv_cache import KVCache
from littlelm.model.loss import linear_cross_entropy, softcap
from littlelm.registry import MODELS

ROLES = ("embedding", "value_embedding", "lm_head", "matrix", "scalar")


class GPTConfig(ComponentConfig):
    """Shape and features of the GPT. Derived values (vocab size, MLP width) are filled in by
    `resolve()` and shown in the resolved config."""

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
    mlp: Literal["relu2", "swiglu"] = Field("relu2", description="MLP type: relu² or SwiGLU.")
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
    tie_embeddings: bool = Field(False, description="Share the token embedding with lm_head.")
    norm_affine: bool = Field(False, description="Give RMSNorms a learnable gain.")

    @model_validator(mode="after")
    def _check_shapes(self) -> GPTConfig:
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

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def padded_vocab(self) -> int:
        assert self.vocab_size is not None, "vocab_size is resolved from the tokenizer first"
        m = self.vocab_pad_multiple
        return (self.vocab_size + m - 1) // m * m

    @property
    def hidden(self) -> int:
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        width = self.mlp_ratio * self.d_model * (2 / 3 if self.mlp == "swiglu" else 1)
        return max(64, round(width / 64) * 64)

    def has_value_embed(self, layer: int) -> bool:
        """The listed layers, or alternating layers always including the last one."""
        if not self.value_embeds:
            return False
        if self.value_embed_layers is not None:
            return layer in self.value_embed_layers
        return layer % 2 == (self.n_layer - 1) % 2


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),), weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, affine: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight)


def rope_tables(seq_len: int, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)  # (T, D/2)
    return angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]  # (1, T, 1, D/2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x1[i], x2[i]) of the two halves of each head by position-dependent angles."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, T, H, D/2) each
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig, layer: int):
        super().__init__()
        self.n_head, self.n_kv, self.hd = cfg.n_head, cfg.kv_heads, cfg.head_dim
        self.qk_norm = cfg.qk_norm
        self.c_q = nn.Linear(cfg.d_model, self.n_head * self.hd, bias=False)
        self.c_k = nn.Linear(cfg.d_model, self.n_kv * self.hd, bias=False)
        self.c_v = nn.Linear(cfg.d_model, self.n_kv * self.hd, bias=False)
        self.c_proj = nn.Linear(self.n_head * self.hd, cfg.d_model, bias=False)
        self.ve_channels = cfg.ve_gate_channels
        self.ve_gate = (
            nn.Linear(cfg.ve_gate_channels, self.n_kv, bias=False)
            if cfg.has_value_embed(layer)
            else None
        )

    def forward(self, x, cos, sin, ve=None, cache=None, mask=None):
        """mask: optional (B, 1, T, T) bool, True = may attend (replaces the causal mask)."""
        B, T, _ = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.hd)  # (B, T, H, D)
        k = self.c_k(x).view(B, T, self.n_kv, self.hd)  # (B, T, Hkv, D)
        v = self.c_v(x).view(B, T, self.n_kv, self.hd)  # (B, T, Hkv, D)
        if ve is not None:
            # gate in (0, 2), exactly 1 at init: 2·sigmoid(0)
            gate = 2 * torch.sigmoid(self.ve_gate(x[..., : self.ve_channels]))  # (B, T, Hkv)
            v = v + gate.unsqueeze(-1) * ve.view(B, T, self.n_kv, self.hd)
        if self.qk_norm:
            q, k = rms_norm(q), rms_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        gqa = self.n_kv != self.n_head
        if mask is not None:
            assert cache is None, "an explicit mask and a KV cache do not mix"
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        elif cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            k, v, mask = cache.update(k, v)  # all cached positions; mask is None or (T, T_all)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.hd)  # (B, T, C)
        return self.c_proj(y)


class ReLU2MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.hidden, bias=False)
        self.c_proj = nn.Linear(cfg.hidden, cfg.d_model, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class SwiGLUMLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.hidden, bias=False)
        self.c_gate = nn.Linear(cfg.d_model, cfg.hidden, bias=False)
        self.c_proj = nn.Linear(cfg.hidden, cfg.d_model, bias=False)

    def forward(self, x):
        return self.c_proj(F.silu(self.c_gate(x)) * self.c_fc(x))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, layer: int):
        super().__init__()
        self.norm1 = RMSNorm(cfg.d_model, cfg.norm_affine)
        self.attn = Attention(cfg, layer)
        self.norm2 = RMSNorm(cfg.d_model, cfg.norm_affine)
        self.mlp = SwiGLUMLP(cfg) if cfg.mlp == "swiglu" else ReLU2MLP(cfg)

    def forward(self, x, cos, sin, ve=None, cache=None, mask=None):
        x = x + self.attn(self.norm1(x), cos, sin, ve, cache, mask)
        return x + self.mlp(self.norm2(x))


@MODELS.register("gpt", config=GPTConfig)
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
        self.norm_f = RMSNorm(C, cfg.norm_affine)
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
        # origin tag per parameter, for lr multipliers; `grow` marks copied weights "old"
        self.origin = {n: default_origin(self.role(n)) for n, _ in self.named_parameters()}

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
        ):
            nn.init.ones_(p)
        elif name.endswith("x0_lambdas"):
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
        if name.startswith("blocks.") and name.endswith(".weight") and "norm" not in name:
            return "matrix"
        return "scalar"

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
            return linear_cross_entropy(
                x, self.lm_head.weight, targets, self.cfg.vocab_size, self.cfg.softcap, reduction
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
        on_autocast = torch.is_autocast_enabled(idx.device.type)
        dt = torch.get_autocast_dtype(idx.device.type) if on_autocast else self.wte.weight.dtype
        if positions is None:
            if pos + T > self.cfg.max_seq_len:
                raise ValueError(
                    f"sequence of {pos + T} tokens exceeds max_seq_len {self.cfg.max_seq_len}"
                )
            cos = self.rope_cos[:, pos : pos + T].to(dt)  # (1, T, 1, D/2)
            sin = self.rope_sin[:, pos : pos + T].to(dt)
        else:
            assert caches is None, "explicit positions and a KV cache do not mix"
            if int(positions.max()) >= self.cfg.max_seq_len:
                raise ValueError(
                    f"position {int(positions.max())} exceeds max_seq_len {self.cfg.max_seq_len}"
                )
            cos = self.rope_cos[0, positions].to(dt)  # (B, T, 1, D/2)
            sin = self.rope_sin[0, positions].to(dt)
        x = rms_norm(self.wte(idx))  # (B, T, C)
        x0 = x
        for i, block in enumerate(self.blocks):
            if self.cfg.residual_scalars:
                x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            ve = self.value_embeds[str(i)](idx) if str(i) in self.value_embeds else None
            x = block(x, cos, sin, ve, None if caches is None else caches[i], attn_mask)
        return self.norm_f(x)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (..., vocab_size) in fp32 from hidden states (..., C); padding rows cut."""
        logits = F.linear(x, self.lm_head.weight)[..., : self.cfg.vocab_size].float()
        return softcap(logits, self.cfg.softcap)

    def new_caches(self, batch: int, max_len: int | None = None) -> list[KVCache]:
        """Empty per-layer KV caches for incremental decoding (see eval.generate)."""
        w = self.wte.weight
        on_autocast = torch.is_autocast_enabled(w.device.type)
        dt = torch.get_autocast_dtype(w.device.type) if on_autocast else w.dtype
        n = max_len or self.cfg.max_seq_len
        c = self.cfg
        return [KVCache(batch, c.kv_heads, n, c.head_dim, dt, w.device) for _ in range(c.n_layer)]


def default_origin(role: str) -> str:
    return "embedding" if role in ("embedding", "value_embedding", "lm_head") else "new"


def flops_per_token(cfg: GPTConfig, seq_len: int) -> int:
    """6·(matmul weights) + 12·L·H·D·T, the usual convention (causal masking not discounted)."""
    C, q, kv = cfg.d_model, cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    hid, V = cfg.hidden, cfg.padded_vocab
    attn = 2 * C * q + 2 * C * kv  # q, proj; k, v
    mlp = (3 if cfg.mlp == "swiglu" else 2) * C * hid
    gates = (
        cfg.ve_gate_channels
        * cfg.kv_heads
        * sum(cfg.has_value_embed(i) for i in range(cfg.n_layer))
    )
    matmul = cfg.n_layer * (attn + mlp) + gates + C * V
    return 6 * matmul + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len

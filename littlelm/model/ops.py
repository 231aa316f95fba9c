"""The model's elementwise pieces, each with a hand-written backward.

Autograd's generic backward of these small compositions makes several extra passes over the
activations (and allocates a temporary for each); on a CPU, where these passes are memory-bound,
that costs 10-20% of a training step at small widths. Each function below does the minimum number
of passes, saves only what its backward needs, and is checked against the composite it replaces
(tests/test_ops.py). torch.compile traces them like any other op.
"""

from __future__ import annotations

import torch


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype matmuls run in: the autocast dtype when autocast is on, else x's own."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


def _row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum(a·b) over the last dim, accumulated in fp32, keepdim."""
    if a.dtype == b.dtype == torch.float32:
        return torch.linalg.vecdot(a, b, dim=-1).unsqueeze(-1)
    return torch.mul(a, b).sum(-1, keepdim=True, dtype=torch.float32)


class _RMSNorm(torch.autograd.Function):
    """The forward computes in fp32 from one fp32 copy of x (a bf16 x, the attention's q and
    k, is cast up once, not by each mixed-dtype op). The backward makes one tensor of x's
    dtype and no fp32 copies: dx = r·(g + k·x) with k = -r²·mean(g·x) per row, where
    g + k·x is formed in fp32 inside one op (g is nearly parallel to x, so the two terms must
    not be rounded before they are added) and then scaled by r in place."""

    @staticmethod
    def forward(ctx, x, eps, out_dtype):
        xf = x.float()  # x itself when x is fp32
        norm = torch.linalg.vector_norm(xf, dim=-1, keepdim=True)  # (..., 1) fp32
        r = norm.square_().div_(x.size(-1)).add_(eps).rsqrt_()
        ctx.save_for_backward(x, r)
        return torch.mul(xf, r, out=torch.empty_like(x, dtype=out_dtype))

    @staticmethod
    def backward(ctx, g):
        x, r = ctx.saved_tensors
        k = _row_dot(g, x).mul_(r.square()).div_(-x.size(-1))  # (..., 1) fp32
        gx = torch.addcmul(g, x, k, out=torch.empty_like(x))
        return gx.mul_(r), None, None


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps) over the last dim (times `weight`), written in `out_dtype`
    (default x's dtype) so that a following matmul needs no separate cast. eps defaults to
    the machine epsilon of x's dtype, as in F.rms_norm (model/grow.py relies on it being tiny)."""
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    y = _RMSNorm.apply(x, eps, out_dtype or x.dtype)
    return y if weight is None else y * weight.to(y.dtype)


class _ReLUSquared(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h):
        r = torch.relu(h)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    def backward(ctx, g):
        (r,) = ctx.saved_tensors
        return torch.mul(g, r).mul_(2.0)


def relu_squared(h: torch.Tensor) -> torch.Tensor:
    """relu(h)², the MLP activation."""
    return _ReLUSquared.apply(h)


class _ResidualMix(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, x0, a, b):
        ctx.save_for_backward(x, x0, a, b)
        return torch.addcmul(x * a, x0, b)

    @staticmethod
    def backward(ctx, g):
        x, x0, a, b = ctx.saved_tensors
        ga = _row_dot(g.reshape(1, -1), x.reshape(1, -1)).reshape(a.shape).to(a.dtype)
        gb = _row_dot(g.reshape(1, -1), x0.reshape(1, -1)).reshape(b.shape).to(b.dtype)
        return g * a, g * b, ga, gb


def residual_mix(
    x: torch.Tensor, x0: torch.Tensor, a: torch.Tensor, b: torch.Tensor
) -> torch.Tensor:
    """a·x + b·x0 for 0-d tensors a, b (the per-layer residual scalars)."""
    return _ResidualMix.apply(x, x0, a, b)


class _GatedAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v, gate, ve):
        ctx.save_for_backward(gate, ve)
        return torch.addcmul(v, gate.unsqueeze(-1), ve)

    @staticmethod
    def backward(ctx, g):
        gate, ve = ctx.saved_tensors
        g_gate = _row_dot(g, ve).squeeze(-1).to(gate.dtype)
        return g, g_gate, g * gate.unsqueeze(-1)


def gated_add(v: torch.Tensor, gate: torch.Tensor, ve: torch.Tensor) -> torch.Tensor:
    """v + gate[..., None]·ve for v, ve (B, T, H, D) and gate (B, T, H): value embeddings."""
    return _GatedAdd.apply(v, gate, ve)


def rope_tables(seq_len: int, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin tables (1, T, 1, D) for `apply_rope`: [cos, cos] and [-sin, sin]."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)  # (T, D/2)
    cos, sin = angles.cos(), angles.sin()
    return (
        torch.cat((cos, cos), -1)[None, :, None, :],
        torch.cat((-sin, sin), -1)[None, :, None, :],
    )


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x·[cos, cos] + [x2, x1]·[-sin, sin]: the product is made first and the swapped halves
    added into it in place (one temporary, not two; writing each half into one output with
    `out=` slices would save that one, but breaks torch.compile's aliasing replay)."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, T, H, D/2) each
    return torch.mul(x, cos).addcmul_(torch.cat((x2, x1), dim=-1), sin)


class _RoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin)

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        return _rotate(g, cos, -sin), None, None  # the inverse rotation


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x[i], x[i + D/2]) of each head (B, T, H, D) by position-dependent
    angles: x·[cos, cos] + [x2, x1]·[-sin, sin]."""
    return _RoPE.apply(x, cos, sin)

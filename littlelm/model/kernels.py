"""Which kernels the model runs, and littlelm's own CPU ones.

The model asks its kernel set (`Backend`, picked once for the device the model is placed on:
`select_backend`) for attention, RMSNorm, elementwise and loss kernels. `model.backend` names one
(`auto` picks by that device):

- `cpu`: littlelm's kernels tuned on a 2-core CPU (benchmarks/RESULTS.md): blocked causal
  attention, elementwise ops with hand-written backward passes, the chunked loss with
  forward-time gradients (sections 1-3 below); eager.
- `cuda`: PyTorch's own kernels: F.scaled_dot_product_attention (FlashAttention on a GPU),
  F.rms_norm, the same elementwise arithmetic with autograd's backward, the Liger fused loss
  when liger-kernel is installed (else the chunked loss, whose logits stay small: a plain loss
  would make the full logits). (Whether the model is torch.compiled is the train section's
  choice, `train.compile`: on CUDA by default.) No GPU has measured these against the CPU
  kernels yet: they are PyTorch's defaults until one does.

Both compute the same function: on the same device they agree to rounding (tests/test_backend.py).
On a device other than the CPU `auto` means `cuda`'s kernels only on CUDA; elsewhere (MPS) it
keeps `cpu`'s, whose attention already uses SDPA off the CPU.

Sections: 1. elementwise ops with a hand-written backward; 2. causal attention (the blocked CPU
kernel); 3. the loss (chunked, plain, liger); 4. the kernel sets and their choice.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from littlelm.errors import ConfigError

# ----------------------------------------------------------------------------------------------
# 1. Elementwise ops
#
# The model's elementwise pieces, each with a hand-written backward.
#
# Autograd's generic backward of these small compositions makes several extra passes over the
# activations (and allocates a temporary for each); on a CPU, where these passes are memory-bound,
# that costs 10-20% of a training step at small widths. Each function below does the minimum number
# of passes, saves only what its backward needs, and is checked against the composite it replaces
# (tests/test_ops.py). torch.compile traces them like any other op.


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


# ----------------------------------------------------------------------------------------------
# 2. Causal attention
#
# Causal self-attention: PyTorch's SDPA, or on the CPU a blocked kernel written here.
#
# On a CPU the fused SDPA kernel runs causal bf16 attention at about a fifth of the machine's
# matmul peak: at 8 × 512 tokens and 8 heads of 64 it took 36 ms forward and 76 ms backward per
# layer on the 2-core machine of benchmarks/RESULTS.md, a quarter of the whole training step.
# `blocked_causal_attention` does the same arithmetic as large matmuls instead: the queries are
# split into blocks of `BLOCK` rows; block i attends to keys 0..end of block i (the keys after it
# are masked for every row, so they are skipped, not computed), with the causal mask applied only
# on the diagonal square. Per block: scores = q·kᵀ, softmax, p·v, each one batched matmul or one
# fused kernel. The backward recomputes the scores and probabilities block by block (as
# FlashAttention does) instead of keeping them, so the forward keeps q, k, v and the output
# only (SDPA also keeps a log-sum-exp). Same forward and backward as SDPA up to bf16 rounding
# (tests/test_attention.py); 1.6x faster forward + backward at the shape above
# (benchmarks/attention.py).
#
# `causal_attention` picks it for causal attention without a mask or KV cache on the CPU; CUDA
# (FlashAttention), explicit masks and cached decoding use SDPA.


BLOCK = 128  # query rows per block: T/BLOCK blocks, the masked half of the scores mostly skipped


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of q (B, H, T, D) over k, v (B, Hkv, T, D), H a multiple of Hkv (grouped
    queries share a key/value head as in SDPA's enable_gqa). Returns (B, H, T, D)."""
    if q.device.type == "cpu" and q.size(-2) > 1:
        return blocked_causal_attention(q, k, v)
    return sdpa_causal(q, k, v)


def blocked_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int = BLOCK
) -> torch.Tensor:
    """The CPU kernel (module docstring); any device, for tests."""
    return _BlockedCausalAttention.apply(q, k, v, block)


def _grouped(t: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(B, H, T, D) as (B, Hkv, G, T, D): query heads grouped under their key/value head."""
    return t.unflatten(1, (kv_heads, t.size(1) // kv_heads))


def _blocks(T: int, block: int):
    return [(r0, min(r0 + block, T)) for r0 in range(0, T, block)]


def _scaled(q: torch.Tensor) -> torch.Tensor:
    """q / sqrt(D), written contiguous (B, H, T, D): the block matmuls then read each row of
    q, k and v contiguously, which made them 1.1-1.3x faster than on the strided views the
    model passes (whose (B, T, H, D) storage is what the q/k/v projections write); k and v
    are copied likewise, one pass each, and only for the duration of the call."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    return torch.mul(q, q.size(-1) ** -0.5, out=out)


def _rows(t: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    """Rows r0..r1 of every query head of a (B, Hkv, G, T, D) tensor as (B, Hkv, G·n, D): the
    G query heads sharing a key/value head are stacked as rows of one matmul against it (a
    small copy when G > 1), so k and v are never expanded to the query heads."""
    B, Hkv, G, _, D = t.shape
    return t[..., r0:r1, :].reshape(B, Hkv, G * (r1 - r0), D)


def _probs(qb: torch.Tensor, k: torch.Tensor, G: int, r0: int, r1: int) -> torch.Tensor:
    """Softmax probabilities (B, Hkv, G·n, r1) of the query rows qb (`_rows` of q/sqrt(D)) for
    positions r0..r1 over keys 0..r1 of k (B, Hkv, T, D), causal within the diagonal square;
    in q's dtype."""
    s = torch.matmul(qb, k[..., :r1, :].transpose(-1, -2))  # (B, Hkv, G·n, r1)
    n = r1 - r0
    above = torch.ones(n, n, dtype=torch.bool, device=s.device).triu_(1)
    s.unflatten(2, (G, n))[..., r0:].masked_fill_(above, float("-inf"))
    return torch.softmax(s, dim=-1)


class _BlockedCausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block):
        B, H, T, D = q.shape
        Hkv = k.size(1)
        G = H // Hkv
        qs = _grouped(_scaled(q), Hkv)  # (B, Hkv, G, T, D), a temporary: q itself is kept
        kc, vc = k.contiguous(), v.contiguous()  # (B, Hkv, T, D)
        # the output in (B, T, H, D) storage, like SDPA's: the caller's transpose + reshape to
        # (B, T, H·D) is then free
        out = q.new_empty(B, T, H, D).transpose(1, 2)
        o5 = _grouped(out, Hkv)
        for r0, r1 in _blocks(T, block):
            p = _probs(_rows(qs, r0, r1), kc, G, r0, r1)
            o5[..., r0:r1, :] = torch.matmul(p, vc[..., :r1, :]).unflatten(2, (G, r1 - r0))
        ctx.save_for_backward(q, k, v, out)
        ctx.block = block
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, out = ctx.saved_tensors
        Hkv, block = k.size(1), ctx.block
        B, H, T, D = q.shape
        G = H // Hkv
        qs = _grouped(_scaled(q), Hkv)  # made again rather than kept: one pass over q
        g5, o5 = _grouped(g.contiguous(), Hkv), _grouped(out, Hkv)
        # delta = rowsum(dO·O) = Σ_j p_j·dp_j, the softmax backward's per-row term, summed in
        # fp32 and then rounded like dP, from which it is subtracted
        delta = torch.mul(g5, o5).sum(-1, keepdim=True, dtype=torch.float32).to(q.dtype)
        kc, vc = k.contiguous(), v.contiguous()
        dq = torch.empty_like(qs)  # (B, Hkv, G, T, D)
        dk = torch.zeros(B, Hkv, T, D, dtype=torch.float32, device=k.device)
        dv = torch.zeros_like(dk)
        for r0, r1 in _blocks(T, block):
            qb, gb = _rows(qs, r0, r1), _rows(g5, r0, r1)  # (B, Hkv, G·n, D)
            p = _probs(qb, kc, G, r0, r1)  # (B, Hkv, G·n, r1), recomputed
            # contracting over the G·n rows sums dV and dK over the G query heads
            dv[..., :r1, :] += torch.matmul(p.transpose(-1, -2), gb)
            dp = torch.matmul(gb, vc[..., :r1, :].transpose(-1, -2))  # (B, Hkv, G·n, r1)
            # dS = P·(dP - delta), in place of dP: an fp32 dS would cost a slow cast back to
            # bf16 for the matmuls, and dP is already rounded to q's dtype
            ds = dp.sub_(_rows(delta, r0, r1)).mul_(p)
            del p, dp
            dq[..., r0:r1, :] = torch.matmul(ds, kc[..., :r1, :]).unflatten(2, (G, r1 - r0))
            dk[..., :r1, :] += torch.matmul(ds.transpose(-1, -2), qb)
            del ds, qb, gb  # before the next block's scores: two (rows, keys) tensors at a time
        dq = dq.mul_(D**-0.5).flatten(1, 2)  # d(q·scale)/dq
        return dq, dk.to(k.dtype), dv.to(v.dtype), None


# ----------------------------------------------------------------------------------------------
# 3. The loss
#
# Cross-entropy from the final hidden states, with the logit soft cap inside.
#
# Three implementations of the same loss (`model.loss`):
#
# - `chunked` (default): rows are processed `model.loss_chunk` at a time; each chunk's logits
#   are made, soft-capped, turned into the loss AND its gradient with respect to the logits, and
#   dropped before the next chunk. The gradients of x and of the lm_head weight are accumulated
#   during the forward pass (the loss is the last node of the graph, so its backward only scales
#   them by the incoming gradient). The (B*T, vocab) logits never exist; at small vocabularies
#   the chunks also stay in cache, which makes this the fastest path on a CPU.
# - `plain`: one lm_head matmul over all rows, then F.cross_entropy (the textbook path).
# - `liger`: Liger-Kernel's fused Triton kernel (CUDA only; `pip install liger-kernel`).
#
# The soft cap c·tanh(l/c) is computed as 2c·sigmoid(2l/c) - c (the same function; sigmoid is
# faster than tanh on CPUs) and the constant -c cancels inside the softmax. The lm_head weight
# is used up to the real vocabulary, so padding rows are never predicted and get zero gradient.
# `ignore_index=-1` targets count neither in the loss nor in its mean.


IGNORE = -1
LossImpl = Literal["chunked", "plain", "liger"]
# the chunked loss keeps up to this many bytes of logit gradients for one lm_head-gradient matmul
GROUP_BYTES = 32 * 2**20


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    return cap * torch.tanh(logits / cap) if cap else logits


def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    vocab_size: int,
    cap: float | None,
    reduction: str = "mean",
    impl: LossImpl = "chunked",
    chunk: int = 256,
) -> torch.Tensor:
    """Cross-entropy of softcap(x @ weight[:vocab_size].T) against targets, in fp32.

    x (B, T, C), weight (V_padded, C), targets (B, T). reduction "mean" (over non-ignored
    targets) or "none" (per token, shape (B, T); ignored targets give 0).
    """
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    if impl == "liger":
        return liger_cross_entropy(x, weight, targets, vocab_size, cap, reduction)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if impl == "plain" or (reduction == "none" and needs_grad):
        return plain_cross_entropy(x, weight, targets, vocab_size, cap, reduction)
    C = x.size(-1)
    x2, t2 = x.reshape(-1, C), targets.reshape(-1)  # (N, C), (N,)
    if reduction == "none" or not needs_grad:  # evaluation: no gradients to make per chunk
        with torch.no_grad():
            losses = chunked_token_losses(x2, weight, t2, vocab_size, cap, chunk)
        if reduction == "none":
            return losses.view(targets.shape)
        return losses.sum() / (t2 != IGNORE).sum().clamp(min=1)
    return _ChunkedCrossEntropy.apply(x2, weight, t2, vocab_size, cap, chunk, compute_dtype(x))


def plain_cross_entropy(x, weight, targets, vocab_size, cap, reduction="mean") -> torch.Tensor:
    """The textbook path: all logits at once, soft cap, F.cross_entropy in fp32."""
    logits = F.linear(x, weight[:vocab_size]).float()  # (B, T, V)
    logits = softcap(logits, cap)
    loss = F.cross_entropy(
        logits.reshape(-1, vocab_size),
        targets.reshape(-1),
        ignore_index=IGNORE,
        reduction=reduction,
    )
    return loss.view(targets.shape) if reduction == "none" else loss


# 3a. Chunked


def _capped_logits(
    logits: torch.Tensor, cap: float | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 logits z (shifted by +cap, which the softmax ignores) and s = sigmoid(2l/cap).
    `logits` is a fresh matmul output and may be overwritten."""
    z = logits.float()
    if not cap:
        return z, None
    s = z.mul_(2.0 / cap).sigmoid_()  # (n, V), in (0, 1)
    return s * (2.0 * cap), s  # z + cap = 2c·s


def _exp_sum(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e = exp(z - max), written over z; its row sums S; lse = log S + max), per row (n, 1)."""
    m = z.amax(1, keepdim=True)  # (n, 1)
    e = z.sub_(m).exp_()
    total = e.sum(1, keepdim=True)
    return e, total, total.log().add_(m)


def chunked_token_losses(x, weight, targets, vocab_size, cap, chunk) -> torch.Tensor:
    """Per-row losses (N,) in fp32, chunk by chunk, without gradients (evaluation)."""
    dt = compute_dtype(x)
    w = weight[:vocab_size].to(dt)  # (V, C)
    out = torch.empty(x.size(0), dtype=torch.float32, device=x.device)
    for s in range(0, x.size(0), chunk):
        t = targets[s : s + chunk]
        z, _ = _capped_logits(x[s : s + chunk].to(dt) @ w.T, cap)  # (n, V)
        zt = z.gather(1, t.clamp(min=0)[:, None]).squeeze(1)
        _, _, lse = _exp_sum(z)
        out[s : s + chunk] = (lse.squeeze(1) - zt) * (t != IGNORE)
    return out


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy whose gradients are computed chunk by chunk in the forward pass."""

    @staticmethod
    def forward(ctx, x, weight, targets, vocab_size, cap, chunk, dt):
        # x (N, C), weight (V_padded, C), targets (N,)
        with torch.autocast(x.device.type, enabled=False):
            valid = targets != IGNORE
            # d(mean loss)/d(row loss): 1/count for counted rows, 0 for ignored ones
            row_scale = valid.float() / valid.sum().clamp(min=1)  # (N,)
            w = weight[:vocab_size].to(dt)  # (V, C)
            xc = x.to(dt)
            dx = torch.empty_like(xc)  # (N, C)
            dw = None  # (V, C) fp32, the sum of the groups' products
            total = torch.zeros((), dtype=torch.float32, device=x.device)
            group = group_rows(x.size(0), chunk, vocab_size, xc.element_size())
            buf = torch.empty(min(group, x.size(0)), vocab_size, dtype=dt, device=x.device)
            for g in range(0, x.size(0), group):
                n = min(group, x.size(0) - g)
                for s in range(0, n, chunk):
                    rows, m = slice(g + s, g + s + chunk), min(chunk, n - s)
                    total += _chunk_forward_backward(
                        xc[rows], w, targets[rows], row_scale[rows], cap, buf[s : s + m]
                    )
                dl, xg = buf[:n], xc[g : g + n]  # (n, V), (n, C)
                torch.mm(dl, w, out=dx[g : g + n])
                part = dl.T @ xg  # (V, C) in dt
                dw = part.float() if dw is None else dw.add_(part)
        ctx.save_for_backward(dx, dw)
        ctx.shapes = (x.dtype, weight.shape, weight.dtype, vocab_size)
        return total

    @staticmethod
    def backward(ctx, grad):
        dx, dw = ctx.saved_tensors
        x_dtype, w_shape, w_dtype, vocab = ctx.shapes
        gx = (dx * grad).to(x_dtype) if ctx.needs_input_grad[0] else None
        gw = None
        if ctx.needs_input_grad[1]:
            if w_shape[0] == vocab and w_dtype == dw.dtype:  # no padding rows to zero
                gw = dw * grad
            else:
                gw = torch.zeros(w_shape, dtype=w_dtype, device=dw.device)
                gw[:vocab] = dw * grad
        return gx, gw, None, None, None, None, None


def group_rows(n: int, chunk: int, vocab: int, itemsize: int) -> int:
    """Rows whose logits' gradients are kept together for one lm_head-gradient matmul: whole
    chunks filling at most GROUP_BYTES. One larger product instead of one per chunk saves a
    (V, C) fp32 accumulation per chunk (a cast and an add, which cost as much as the product)."""
    fit = max(1, GROUP_BYTES // (vocab * itemsize * chunk)) * chunk
    return min(fit, -(-n // chunk) * chunk)


def _chunk_forward_backward(xc, w, t, row_scale, cap, dl_out) -> torch.Tensor:
    """Loss sum of one chunk; writes d(loss)/d(logits) (n, V) into dl_out.

    With p = softmax(z) = e/S and d = dz/dlogits (1, or 4·s·(1-s) under the cap), the logits'
    gradient is row_scale·(p - onehot)·d = (row_scale/S)·(e·d - S·d[target]·onehot).
    """
    z, s = _capped_logits(xc @ w.T, cap)  # (n, V) fp32
    tc = t.clamp(min=0)[:, None]  # (n, 1)
    zt = z.gather(1, tc)
    e, total, lse = _exp_sum(z)
    loss = ((lse - zt).squeeze(1) * row_scale).sum()
    if s is None:
        d_t = torch.ones_like(total)
    else:
        d = s.addcmul_(s, s, value=-1.0)  # s·(1-s), in place of s
        d_t = d.gather(1, tc)
        e.mul_(d)
    e.scatter_add_(1, tc, -total * d_t)
    scale = row_scale[:, None] * (4.0 if cap else 1.0) / total  # (n, 1)
    torch.mul(e, scale, out=dl_out)  # (n, V)
    return loss


# 3b. Liger (CUDA)


def check_loss_impl(impl: LossImpl, device: torch.device) -> None:
    """Raise a ConfigError when `impl` cannot run on `device` (only liger has requirements)."""
    if impl != "liger":
        return
    if device.type != "cuda":
        raise ConfigError(
            [
                f"model.loss=liger runs on CUDA only, this run is on {device.type}; use model.loss=chunked"
            ]
        )
    try:
        import liger_kernel.transformers.functional  # noqa: F401
    except ImportError:
        raise ConfigError(
            [
                "model.loss=liger needs liger-kernel: pip install -e '.[gpu]' in a clone of "
                "littlelm, or pip install liger-kernel (or use model.loss=chunked)"
            ]
        ) from None


def liger_cross_entropy(x, weight, targets, vocab_size, cap, reduction="mean") -> torch.Tensor:
    check_loss_impl("liger", x.device)
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    C, dt = x.size(-1), compute_dtype(x)
    loss = liger_fused_linear_cross_entropy(
        x.reshape(-1, C).to(dt),
        weight[:vocab_size].to(dt),
        targets.reshape(-1),
        ignore_index=IGNORE,
        reduction=reduction,
        softcap=cap,
    )
    loss = loss[0] if isinstance(loss, tuple) else loss
    return loss.float().view(targets.shape) if reduction == "none" else loss.float()


# ----------------------------------------------------------------------------------------------
# 4. The kernel sets

BackendName = Literal["auto", "cpu", "cuda"]


@dataclass(frozen=True)
class Backend:
    """One device's kernel set. `loss` is what `model.loss: auto` runs."""

    name: str
    attention: Callable  # causal (q, k, v) (B, H|Hkv, T, D) -> (B, H, T, D)
    rms_norm: Callable  # (x, weight=None, eps=None, out_dtype=None)
    relu_squared: Callable
    residual_mix: Callable  # (x, x0, a, b) -> a·x + b·x0
    gated_add: Callable  # (v, gate, ve) -> v + gate[..., None]·ve
    apply_rope: Callable  # (x, cos, sin)
    loss: LossImpl
    kernels: str  # one line for the start-up summary


def sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """PyTorch's fused causal attention (FlashAttention or memory-efficient on a GPU)."""
    gqa = k.size(1) != q.size(1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


def torch_rms_norm(x, weight=None, eps=None, out_dtype=None) -> torch.Tensor:
    """F.rms_norm in x's own dtype (autocast off, so a bf16 q/k is not saved as an fp32 copy),
    then cast to `out_dtype`; eps as in rms_norm."""
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    with torch.autocast(x.device.type, enabled=False):
        y = F.rms_norm(x, (x.size(-1),), eps=eps)
    y = y.to(out_dtype or x.dtype)
    return y if weight is None else y * weight.to(y.dtype)


def autograd_relu_squared(h: torch.Tensor) -> torch.Tensor:
    return torch.relu(h).square()


def autograd_residual_mix(x, x0, a, b) -> torch.Tensor:
    return torch.addcmul(x * a, x0, b)


def autograd_gated_add(v, gate, ve) -> torch.Tensor:
    return torch.addcmul(v, gate.unsqueeze(-1), ve)


def autograd_rope(x, cos, sin) -> torch.Tensor:
    return _rotate(x, cos, sin)


def has_liger() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


CPU = Backend(
    name="cpu",
    attention=causal_attention,
    rms_norm=rms_norm,
    relu_squared=relu_squared,
    residual_mix=residual_mix,
    gated_add=gated_add,
    apply_rope=apply_rope,
    loss="chunked",
    kernels="blocked attention, hand-written backward ops",
)


def cuda_backend() -> Backend:
    """The CUDA kernel set; its loss depends on whether liger-kernel is installed."""
    return Backend(
        name="cuda",
        attention=sdpa_causal,
        rms_norm=torch_rms_norm,
        relu_squared=autograd_relu_squared,
        residual_mix=autograd_residual_mix,
        gated_add=autograd_gated_add,
        apply_rope=autograd_rope,
        loss="liger" if has_liger() else "chunked",
        kernels="SDPA attention, F.rms_norm, autograd backward ops",
    )


CUDA = cuda_backend()
BACKENDS = {"cpu": CPU, "cuda": CUDA}


def select_backend(configured: str, device: torch.device | str) -> Backend:
    """The kernel set `configured` (auto|cpu|cuda) means on `device`."""
    if configured == "auto":
        configured = "cuda" if torch.device(device).type == "cuda" else "cpu"
    return BACKENDS[configured]


def run_backend(model_cfg, device: torch.device | str) -> Backend:
    """The backend a run's model uses on `device` (models without a `backend` field: auto)."""
    return select_backend(getattr(model_cfg, "backend", "auto"), device)


def loss_impl(configured: LossImpl | Literal["auto"], backend: Backend) -> LossImpl:
    """`model.loss`, with `auto` replaced by the backend's loss."""
    return backend.loss if configured == "auto" else configured

"""Causal self-attention: PyTorch's SDPA, or on the CPU a blocked kernel written here.

On a CPU the fused SDPA kernel runs causal bf16 attention at about a fifth of the machine's
matmul peak: at 8 × 512 tokens and 8 heads of 64 it took 36 ms forward and 76 ms backward per
layer on the 2-core machine of benchmarks/RESULTS.md, a quarter of the whole training step.
`blocked_causal_attention` does the same arithmetic as large matmuls instead: the queries are
split into blocks of `BLOCK` rows; block i attends to keys 0..end of block i (the keys after it
are masked for every row, so they are skipped, not computed), with the causal mask applied only
on the diagonal square. Per block: scores = q·kᵀ, softmax, p·v, each one batched matmul or one
fused kernel. The backward recomputes the scores and probabilities block by block (as
FlashAttention does) instead of keeping them, so the forward keeps q, k, v and the output
only (SDPA also keeps a log-sum-exp). Same forward and backward as SDPA up to bf16 rounding
(tests/test_attention.py); 1.6x faster forward + backward at the shape above
(benchmarks/attention.py).

`causal_attention` picks it for causal attention without a mask or KV cache on the CPU; CUDA
(FlashAttention), explicit masks and cached decoding use SDPA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 128  # query rows per block: T/BLOCK blocks, the masked half of the scores mostly skipped


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of q (B, H, T, D) over k, v (B, Hkv, T, D), H a multiple of Hkv (grouped
    queries share a key/value head as in SDPA's enable_gqa). Returns (B, H, T, D)."""
    if q.device.type == "cpu" and q.size(-2) > 1:
        return blocked_causal_attention(q, k, v)
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=k.size(1) != q.size(1)
    )


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

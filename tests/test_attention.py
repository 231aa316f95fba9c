"""The CPU's blocked causal attention against SDPA: outputs, gradients, what it keeps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from littlelm.model import kernels
from littlelm.model.kernels import blocked_causal_attention, causal_attention


def qkv(B, T, H, Hkv, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    # (B, T, H, D) storage seen as (B, H, T, D), as the model passes them
    q, k, v = (
        torch.randn(B, T, h, D, generator=g).to(dtype).requires_grad_() for h in (H, Hkv, Hkv)
    )
    return q, k, v


def run(fn, q, k, v, grad):
    out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    out.backward(grad)
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    return out.detach(), grads


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=q.size(1) != k.size(1)
    )


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# (T, block): several blocks, a last block shorter than the others, one block, T < block
SHAPES = [(96, 32), (100, 32), (64, 64), (20, 128)]


@pytest.mark.parametrize("T,block", SHAPES)
@pytest.mark.parametrize("H,Hkv", [(4, 4), (4, 2), (6, 1)])
def test_blocked_matches_sdpa_in_fp32(T, block, H, Hkv):
    q, k, v = qkv(2, T, H, Hkv, 16, torch.float32)
    grad = torch.randn(2, H, T, 16, generator=torch.Generator().manual_seed(1))
    ref, ref_grads = run(sdpa, q, k, v, grad)
    out, grads = run(lambda *a: blocked_causal_attention(*a, block=block), q, k, v, grad)
    assert rel(out, ref) < 1e-5
    for name, a, b in zip("qkv", grads, ref_grads):
        assert rel(a, b) < 1e-5, name


@pytest.mark.parametrize("H,Hkv", [(8, 8), (8, 2)])
def test_blocked_bf16_error_is_bf16_rounding(H, Hkv):
    """In bf16 the scores are rounded to bf16 before the softmax (SDPA keeps them in fp32),
    so both are compared against float64: the blocked kernel's error stays below 1%, about
    twice SDPA's (measured 0.34% vs 0.20% on the output, 0.50% vs 0.25% on dq)."""
    B, T, D = 2, 256, 64
    q, k, v = qkv(B, T, H, Hkv, D, torch.bfloat16)
    grad = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(1)).bfloat16()
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref, ref_grads = run(sdpa, *exact, grad.double())
    out, grads = run(lambda *a: blocked_causal_attention(*a, block=64), q, k, v, grad)
    sdpa_out, _ = run(sdpa, q, k, v, grad)
    assert out.dtype == torch.bfloat16 and rel(out, ref) < 0.01
    assert rel(out, ref) < 3 * rel(sdpa_out, ref)
    for name, a, b in zip("qkv", grads, ref_grads):
        assert a.dtype == torch.bfloat16 and rel(a, b) < 0.01, name


def test_output_is_laid_out_like_sdpa():
    """(B, T, H, D) storage, so the model's transpose + reshape to (B, T, H·D) is a view."""
    q, k, v = qkv(2, 40, 4, 4, 8, torch.float32)
    out = blocked_causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 16)
    flat = out.transpose(1, 2).reshape(2, 40, 32)
    assert flat.data_ptr() == out.data_ptr() and out.transpose(1, 2).is_contiguous()


def test_keeps_only_its_inputs_and_output():
    """The forward saves q, k, v and the output for backward and nothing per score: the
    scores and probabilities are made again block by block in the backward."""
    B, T, H, D = 2, 256, 4, 16
    q, k, v = (t.transpose(1, 2) for t in qkv(B, T, H, H, D, torch.float32))
    saved: dict[int, int] = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        blocked_causal_attention(q, k, v, block=64)
    assert sum(saved.values()) == 4 * (B * T * H * D * 4)  # q, k, v, out in fp32


def test_causal_attention_takes_the_blocked_kernel_on_the_cpu(monkeypatch):
    calls = []
    real = kernels.blocked_causal_attention

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(kernels, "blocked_causal_attention", spy)
    q, k, v = (t.transpose(1, 2) for t in qkv(1, 12, 2, 2, 8, torch.float32))
    causal_attention(q, k, v)
    assert calls == [q.shape]
    causal_attention(q[:, :, :1], k[:, :, :1], v[:, :, :1])  # one row: SDPA
    assert len(calls) == 1

"""The hand-written elementwise ops (model/kernels.py) against the autograd composites they replace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from littlelm.model import kernels as ops


def check(fn, ref, inputs, rtol=1e-5, atol=1e-6):
    """Same output and same gradients (for a random incoming gradient) as `ref`."""
    a = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    b = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    ya, yb = fn(*a), ref(*b)
    torch.testing.assert_close(ya, yb, rtol=rtol, atol=atol)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    for x, y in zip(a, b):
        if x.requires_grad:
            assert x.grad.dtype == y.grad.dtype
            torch.testing.assert_close(x.grad, y.grad, rtol=rtol, atol=atol)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=torch.float64).to(dtype).requires_grad_()


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def test_rms_norm_matches_f_rms_norm():
    w = randn(16)
    check(ops.rms_norm, lambda x: F.rms_norm(x, (16,)), [randn(3, 5, 16)])
    check(ops.rms_norm, lambda x, w: F.rms_norm(x, (16,), w), [randn(3, 5, 16), w])


def test_rms_norm_writes_the_requested_dtype_and_stays_accurate_in_bf16():
    x = randn(4, 64, dtype=torch.bfloat16)
    y = ops.rms_norm(x, out_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16
    y32 = ops.rms_norm(randn(2, 8), out_dtype=torch.bfloat16)
    assert y32.dtype == torch.bfloat16
    # backward in fp32 internally: close to the float64 gradient even for bf16 inputs
    g = torch.randn(4, 64).to(torch.bfloat16)
    y.backward(g)
    x64 = x.detach().double().requires_grad_()
    F.rms_norm(x64, (64,), eps=torch.finfo(torch.bfloat16).eps).backward(g.double())
    assert ((x.grad.double() - x64.grad).norm() / x64.grad.norm()) < 0.01


def test_relu_squared():
    check(ops.relu_squared, lambda h: F.relu(h).square(), [randn(4, 32)])


def test_residual_mix():
    a, b = randn(()), randn(())
    check(
        ops.residual_mix, lambda x, x0, a, b: a * x + b * x0, [randn(2, 3, 8), randn(2, 3, 8), a, b]
    )


def test_gated_add():
    def ref(v, gate, ve):
        return v + gate.unsqueeze(-1) * ve

    check(ops.gated_add, ref, [randn(2, 5, 3, 8), randn(2, 5, 3), randn(2, 5, 3, 8)])


def test_rope_is_the_pairwise_rotation():
    T, D = 7, 8
    cos, sin = ops.rope_tables(T, D, 10000.0)  # (1, T, 1, D)
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2).double() / D)
    ang = torch.outer(torch.arange(T).double(), inv)[None, :, None, :]  # (1, T, 1, D/2)

    def ref(x):
        x1, x2 = x.chunk(2, dim=-1)
        c, s = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    check(lambda x: ops.apply_rope(x, cos, sin), ref, [randn(2, T, 3, D)], rtol=1e-5, atol=1e-5)


def test_compute_dtype_follows_autocast():
    x = torch.zeros(2)
    assert ops.compute_dtype(x) == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ops.compute_dtype(x) == torch.bfloat16

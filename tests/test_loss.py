from __future__ import annotations

import pytest
import torch

from littlelm.errors import ConfigError
from littlelm.model.kernels import linear_cross_entropy


def inputs(n=37, c=24, vocab=70, padded=128, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(1, n, c, generator=g) * 2).to(dtype).requires_grad_()
    w = (torch.randn(padded, c, generator=g) * 0.5).requires_grad_()
    t = torch.randint(0, vocab, (1, n), generator=g)
    t[0, ::5] = -1  # ignored targets
    return x, w, t


def loss_and_grads(impl, x, w, t, vocab, cap, chunk=8, autocast=False):
    x.grad = w.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = linear_cross_entropy(x, w, t, vocab, cap, "mean", impl, chunk)
    (loss * 3.0).backward()  # a non-unit incoming gradient
    return loss.detach(), x.grad.clone(), w.grad.clone()


@pytest.mark.parametrize("cap", [None, 15.0, 2.0, 60.0])
@pytest.mark.parametrize("chunk", [1, 8, 37, 1000])
def test_chunked_equals_plain_fp32(cap, chunk):
    x, w, t = inputs()
    plain = loss_and_grads("plain", x, w, t, 70, cap)
    chunked = loss_and_grads("chunked", x, w, t, 70, cap, chunk)
    for a, b, name in zip(chunked, plain, ("loss", "dx", "dw")):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert chunked[2][70:].abs().max() == 0  # padding rows: no gradient


def test_chunked_close_to_plain_under_bf16_autocast():
    x, w, t = inputs(n=256, c=64, vocab=500, padded=512)
    plain = loss_and_grads("plain", x, w, t, 500, 15.0, autocast=True)
    chunked = loss_and_grads("chunked", x, w, t, 500, 15.0, 64, autocast=True)
    assert chunked[1].dtype == x.dtype and chunked[2].dtype == w.dtype
    torch.testing.assert_close(chunked[0], plain[0], rtol=1e-3, atol=1e-3)
    for a, b in zip(chunked[1:], plain[1:]):  # both round the logits' gradient to bf16
        assert (a - b).norm() / b.norm() < 1e-2


def test_large_logits_without_cap_stay_finite():
    x, w, t = inputs()
    with torch.no_grad():
        w.mul_(1000)  # logits ~1e4: exp would overflow without the max shift
    loss, dx, dw = loss_and_grads("chunked", x, w, t, 70, None)
    ref = loss_and_grads("plain", x, w, t, 70, None)
    assert torch.isfinite(loss) and torch.isfinite(dx).all() and torch.isfinite(dw).all()
    torch.testing.assert_close(loss, ref[0], rtol=1e-5, atol=1e-3)


def test_per_token_losses_without_and_with_grad():
    x, w, t = inputs()
    ref = linear_cross_entropy(x, w, t, 70, 15.0, "none", "plain")
    with torch.no_grad():
        chunked = linear_cross_entropy(x, w, t, 70, 15.0, "none", "chunked", 8)
    assert chunked.shape == t.shape and (chunked[t == -1] == 0).all()
    torch.testing.assert_close(chunked, ref.detach(), rtol=1e-5, atol=1e-6)
    with_grad = linear_cross_entropy(x, w, t, 70, 15.0, "none", "chunked", 8)
    with_grad.sum().backward()  # falls back to the plain path, so gradients flow
    assert x.grad is not None


def test_all_targets_ignored_gives_zero_loss_and_gradient():
    x, w, t = inputs()
    t.fill_(-1)
    loss, dx, dw = loss_and_grads("chunked", x, w, t, 70, 15.0)
    assert loss == 0 and dx.abs().max() == 0 and dw.abs().max() == 0


def test_liger_needs_cuda():
    x, w, t = inputs()
    with pytest.raises(ConfigError, match="model.loss=liger runs on CUDA only"):
        linear_cross_entropy(x, w, t, 70, 15.0, "mean", "liger")


def test_unknown_reduction():
    x, w, t = inputs()
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(x, w, t, 70, 15.0, "sum")


def test_mean_without_grad_equals_mean_with_grad():
    x, w, t = inputs()
    with torch.no_grad():
        evaluated = linear_cross_entropy(x, w, t, 70, 15.0, "mean", "chunked", 8)
    trained = linear_cross_entropy(x, w, t, 70, 15.0, "mean", "chunked", 8)
    assert not evaluated.requires_grad and trained.requires_grad
    torch.testing.assert_close(evaluated, trained.detach(), rtol=1e-6, atol=1e-6)

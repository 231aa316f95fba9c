"""FP8 linears (model/fp8.py) on the CPU, where torch._scaled_mm also runs.

Error bound: e4m3 keeps 3 mantissa bits (round-to-nearest error at most 2^-4 relative, about
2.5% rms), e5m2 keeps 2 (at most 2^-3, about 5% rms). The relative Frobenius error of a product
of two independently rounded operands against the exact (float64) product is about the two rms
errors added in quadrature: 3.5-3.8% measured on random data when both operands are e4m3 (the
forward, and both backward GEMMs under the default e4m3 gradients), 5.7-5.9% when the gradient
is e5m2. The tests hold FP8 to 4.5% (all three GEMMs, e4m3 gradients), 7% for the backward GEMMs
with e5m2 gradients, and bf16 to 1%.
"""

from __future__ import annotations

import pytest
import torch

from littlelm.errors import ConfigError
from littlelm.model.fp8 import (
    E4M3,
    E5M2,
    FP8Linear,
    check_fp8_device,
    fp8_eligible,
    linear,
    quantize,
)
from littlelm.model.gpt import GPT, GPTConfig

BOUND = 0.045  # every GEMM, e4m3 gradients (the default)
E5M2_GRAD_BOUND = 0.07  # the backward GEMMs with e5m2 gradients


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b).norm() / b.norm()).item()


def errors(layer: torch.nn.Linear, x: torch.Tensor, g: torch.Tensor) -> tuple[float, ...]:
    """Relative errors of y, dx, dw under bf16 autocast against float64."""
    x = x.clone().requires_grad_()
    layer.weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    y.backward(g.to(y.dtype))
    x64 = x.detach().double().requires_grad_()
    w64 = layer.weight.detach().double().requires_grad_()
    y64 = x64 @ w64.T
    y64.backward(g.double())
    return rel(y, y64), rel(x.grad, x64.grad), rel(layer.weight.grad, w64.grad)


@pytest.mark.parametrize("rows", [64, 37])  # 37: dw's reduction dim is not a multiple of 16
@pytest.mark.parametrize("scale", [1.0, 1e3, 1e-3])  # dynamic scaling: any magnitude
def test_fp8_linear_within_bound_of_exact_and_bf16_within_1pct(rows, scale):
    torch.manual_seed(0)
    x, g = torch.randn(rows, 256) * scale, torch.randn(rows, 512)
    fp8 = FP8Linear(256, 512)
    bf16 = torch.nn.Linear(256, 512, bias=False)
    bf16.weight.data.copy_(fp8.weight.data)
    y_err, dx_err, dw_err = errors(fp8, x, g)
    assert max(y_err, dx_err, dw_err) < BOUND
    assert min(y_err, dx_err) > 0.01  # really quantised: not silently running in bf16
    assert max(errors(bf16, x, g)) < 0.01


@pytest.mark.parametrize("rows", [64, 37])
def test_e5m2_gradients_within_their_looser_bound(rows):
    torch.manual_seed(0)
    x, g = torch.randn(rows, 256), torch.randn(rows, 512)
    e4 = FP8Linear(256, 512)
    e5 = FP8Linear(256, 512, grad_dtype=E5M2)
    e5.weight.data.copy_(e4.weight.data)
    y5, dx5, dw5 = errors(e5, x, g)
    y4, dx4, _ = errors(e4, x, g)
    assert y5 == y4 < BOUND  # the forward does not depend on the gradient format
    assert max(dx5, dw5) < E5M2_GRAD_BOUND
    assert dx5 > 1.3 * dx4  # one mantissa bit less: e5m2 is measurably coarser


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
@pytest.mark.parametrize("amax", [1.0, 3e-5, 7.7e4, 448.0, 449.0])
def test_scales_are_powers_of_two_that_fit_amax_into_range(dtype, amax):
    t = torch.tensor([amax, -amax / 3, amax / 1000, 0.0])
    q, inv = quantize(t, dtype)
    fmax = torch.finfo(dtype).max
    scale = 1 / inv.item()
    assert inv.dtype == torch.float32 and inv.dim() == 0
    assert scale == 2.0 ** round(torch.log2(torch.tensor(scale)).item())  # exact power of two
    assert fmax / 2 < amax * scale <= fmax  # the top binade, never saturated
    assert torch.equal(q.float() * inv, (t * scale).to(dtype).float() * inv)  # only the cast rounds


def test_zero_input_gives_zeros_and_nonfinite_stays_nonfinite():
    layer = FP8Linear(32, 32)
    x = torch.zeros(16, 32, requires_grad=True)
    y = layer(x)
    y.backward(torch.ones_like(y))
    assert torch.equal(y, torch.zeros_like(y)) and torch.isfinite(x.grad).all()
    assert torch.equal(layer.weight.grad, torch.zeros_like(layer.weight))  # dw = gᵀ·0, no NaN
    for bad in (float("inf"), float("nan")):
        x = torch.randn(16, 32)
        x[3, 5] = bad
        assert not torch.isfinite(layer(x)).all()  # the loss guard sees it


def test_fp8_output_and_grad_dtypes():
    layer = FP8Linear(64, 64)
    x = torch.randn(2, 16, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.shape == (2, 16, 64) and y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and layer.weight.grad.dtype == torch.float32


def test_filter_leaves_small_and_odd_layers_alone():
    assert fp8_eligible(256, 1024, 256)
    assert not fp8_eligible(128, 1024, 256)  # too small
    assert not fp8_eligible(260, 1024, 16)  # not a multiple of 16
    assert isinstance(linear(256, 256, True, 256), FP8Linear)
    assert linear(256, 256, True, 256).grad_dtype == E4M3
    assert linear(256, 256, True, 256, "e5m2").grad_dtype == E5M2
    assert type(linear(256, 256, False, 256)) is torch.nn.Linear
    assert type(linear(32, 256, True, 256)) is torch.nn.Linear


def test_model_fp8_uses_fp8_only_in_block_linears_and_trains():
    cfg = GPTConfig(
        vocab_size=100, n_layer=2, d_model=64, n_head=4, max_seq_len=32, fp8=True, fp8_min_dim=64
    )
    model = GPT(cfg)
    fp8 = [n for n, m in model.named_modules() if isinstance(m, FP8Linear)]
    assert len(fp8) == 2 * 6  # q, k, v, proj, fc, mlp proj per block
    assert (
        GPT(cfg.model_copy(update={"fp8_grad_dtype": "e5m2"})).blocks[0].mlp.c_fc.grad_dtype == E5M2
    )
    assert not any("ve_gate" in n or "lm_head" in n for n in fp8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    # small: torch's CPU _scaled_mm is a slow reference kernel (50 ms for a 128 x 64 x 64 matmul)
    x = torch.randint(0, 100, (2, 16))
    losses = []
    for _ in range(10):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5


def test_fp8_device_check():
    check_fp8_device(torch.device("cpu"))  # runs here
    with pytest.raises(ConfigError, match="model.fp8 is not supported on mps"):
        check_fp8_device(torch.device("mps"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp8_device_check_on_cuda():
    cap = torch.cuda.get_device_capability()
    if cap >= (8, 9):
        check_fp8_device(torch.device("cuda"))
    else:
        with pytest.raises(ConfigError, match="compute capability 8.9"):
            check_fp8_device(torch.device("cuda"))

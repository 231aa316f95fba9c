"""FP8 linear layers: all three GEMMs of a linear layer through torch._scaled_mm.

    forward      y  = x @ wᵀ       x, w in float8_e4m3fn
    backward     dx = dy @ w       dy in e4m3 (or e5m2: `model.fp8_grad_dtype`), w in e4m3
                 dw = dyᵀ @ x      dy as above, x in e4m3

Scaling is dynamic and tensorwise: just before the cast, each operand is multiplied by the
largest power of two that keeps its largest magnitude (amax) within the fp8 range, and
_scaled_mm multiplies the product back by the inverse scales. A power of two makes the scaling
exact (only the cast rounds) and costs nothing in precision: fp8 has the same relative step in
every binade. The weights stay in their own dtype (fp32 master weights by default); only the
GEMM inputs are fp8, and the quantised x and w are what is saved for the backward (1 byte per
element instead of 2). An all-zero operand gives zeros; an operand holding inf or NaN gives a
non-finite result, which the loss guard catches, never a silently finite wrong one.

Gradients are e4m3 by default, like torchao's rowwise recipe and DeepSeek-V3: with a fresh scale
per tensor per step the wide range of e5m2 is not needed, and e4m3's extra mantissa bit shrinks
the error of the two backward GEMMs by about a third (measured on the demo model's own gradients,
docs/speed.md). `model.fp8_grad_dtype: e5m2` restores the classic e4m3/e5m2 recipe (torchao's
tensorwise default, nanochat).

`model.fp8` turns it on for the transformer blocks' linears that pass the filter (both
dimensions multiples of 16, the smaller at least `model.fp8_min_dim`); embeddings, lm_head and
the tiny value-embedding gates stay in bf16. FP8 GEMMs need a CUDA device of compute
capability 8.9 or newer (Ada, Hopper, Blackwell); torch._scaled_mm also runs on CPUs, where it
is slower than bf16 and useful for testing the numerics.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from littlelm.errors import ConfigError
from littlelm.model.kernels import compute_dtype

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
GRAD_DTYPES = {"e4m3": E4M3, "e5m2": E5M2}  # model.fp8_grad_dtype


def fp8_eligible(in_features: int, out_features: int, min_dim: int) -> bool:
    """The filter: _scaled_mm needs dims that are multiples of 16; small layers gain nothing."""
    return (
        in_features % 16 == 0
        and out_features % 16 == 0
        and min(in_features, out_features) >= min_dim
    )


@functools.cache
def check_fp8_device(device: torch.device) -> None:
    """Raise a ConfigError unless FP8 GEMMs run on `device`."""
    if device.type == "cpu":
        return
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        if cap >= (8, 9):
            return
        name = torch.cuda.get_device_name(device)
        raise ConfigError(
            [
                f"model.fp8 needs a GPU of compute capability 8.9+ (Ada/Hopper); {name} is "
                f"{cap[0]}.{cap[1]}: set model.fp8=false"
            ]
        )
    raise ConfigError([f"model.fp8 is not supported on {device.type}: set model.fp8=false"])


def quantize(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(t times a power-of-two scale that brings its amax into dtype's range, cast to dtype;
    the inverse scale as an fp32 0-d tensor). amax 0 gives zeros (the clamp keeps the scale
    finite); amax inf gives scale 0 and amax NaN a NaN scale, so non-finite stays non-finite."""
    fmax = torch.finfo(dtype).max
    amax = t.abs().amax().float().clamp(min=1e-12)
    scale = torch.exp2(torch.floor(torch.log2(fmax / amax)))
    q = (t.float() * scale).clamp_(-fmax, fmax).to(dtype)
    return q, scale.reciprocal()


def _col_major(t: torch.Tensor) -> torch.Tensor:
    """The same matrix laid out column-major (what _scaled_mm wants for its second operand)."""
    return t.t().contiguous().t()


def _mm(a, sa, b, sb, out_dtype):
    """a (M, K) row-major @ b (K, N) column-major, with inverse scales sa and sb."""
    return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)


class _FP8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, out_dtype, grad_dtype):
        # x (M, K), w (N, K)
        xq, sx = quantize(x, E4M3)
        wq, sw = quantize(w, E4M3)
        ctx.save_for_backward(xq, sx, wq, sw)
        ctx.dtypes = (x.dtype, w.dtype, grad_dtype)
        return _mm(xq, sx, wq.t(), sw, out_dtype)  # (M, N)

    @staticmethod
    def backward(ctx, g):
        xq, sx, wq, sw = ctx.saved_tensors
        x_dtype, w_dtype, grad_dtype = ctx.dtypes
        gq, sg = quantize(g, grad_dtype)  # (M, N)
        gx = _mm(gq, sg, _col_major(wq), sw, g.dtype).to(x_dtype)  # (M, K)
        if g.size(0) % 16 == 0:
            gw = _mm(gq.t().contiguous(), sg, _col_major(xq), sx, torch.float32)  # (N, K)
        else:  # the reduction dim of dw is M = B·T; _scaled_mm needs a multiple of 16
            gw = g.t().float() @ (xq.float() * sx)
        return gx, gw.to(w_dtype), None, None


class FP8Linear(nn.Linear):
    """nn.Linear (no bias) whose three GEMMs run in FP8; same parameters, same checkpoints.
    `grad_dtype` is the fp8 format of the output gradient in the two backward GEMMs."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = False, grad_dtype=E4M3
    ) -> None:
        assert not bias, "FP8Linear has no bias"
        super().__init__(in_features, out_features, bias=False)
        self.grad_dtype = grad_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_fp8_device(x.device)
        shape, out_dtype = x.shape, compute_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            x2 = x.reshape(-1, shape[-1])  # (B·T, in)
            y = _FP8Matmul.apply(x2, self.weight, out_dtype, self.grad_dtype)
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, grad_dtype={self.grad_dtype}"


def linear(
    in_features: int, out_features: int, fp8: bool, min_dim: int, grad_dtype: str = "e4m3"
) -> nn.Linear:
    """A bias-free linear layer: FP8Linear when `fp8` and the shape passes the filter."""
    if fp8 and fp8_eligible(in_features, out_features, min_dim):
        return FP8Linear(in_features, out_features, grad_dtype=GRAD_DTYPES[grad_dtype])
    return nn.Linear(in_features, out_features, bias=False)

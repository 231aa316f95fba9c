"""QLoRA's frozen base: a linear whose weight is stored in 4-bit NormalFloat (NF4), through
bitsandbytes on CUDA (`lora.quantize: nf4`; model/lora.py's `frozen_base` calls this).

    base = nf4_linear(linear)         # bnb.nn.Linear4bit: NF4 codes + constants, bf16 compute
    w = dequantized(base)             # the weight it multiplies by (bf16), for merging
    check_nf4(device)                 # the refusal on a CPU or without bitsandbytes

The weight is quantized as QLoRA does it (bitsandbytes' defaults for it): blocks of 64 weights
share an absmax, the 4-bit codes index the 16 NF4 levels, and the absmaxes are quantized again
to 8 bits (double quantization, `compress_statistics`). It is quantized from its bf16 rounding,
the dtype it computes in, so that each forward and backward dequantizes straight to bf16 (from
fp32 it would dequantize to fp32 and cast: one more transient the size of the weight). The
memory model (plan/memory.py `nf4_bytes`) counts these tensors.

bitsandbytes' NF4 kernels need CUDA, so a run on the CPU is refused with the fix (check_nf4).
The planner's trace runs on fake CPU tensors: there `NF4Footprint` stands in, holding tensors
of the same sizes and dtypes and allocating in its forward and backward what bitsandbytes'
MatMul4Bit allocates (the dequantized weight, made and freed in each; nothing kept for the
backward but the codes), so the trace counts QLoRA's memory without the kernels.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from littlelm.errors import ConfigError
from littlelm.extras import require

BLOCK = 64  # weights per absmax (bitsandbytes' Linear4bit default, QLoRA's)
COMPUTE_DTYPE = torch.bfloat16  # what the dequantized weight and the matmul are in


def check_nf4(device: torch.device) -> None:
    """Refuse NF4 where bitsandbytes cannot run it: not CUDA, or bitsandbytes missing."""
    if device.type != "cuda":
        raise ConfigError(
            [
                f"lora.quantize: nf4 (QLoRA) needs a CUDA GPU (bitsandbytes' 4-bit kernels); "
                f"this run is on {device.type}: set lora.quantize=none (LoRA on the base in the "
                "training dtype), or run on a CUDA GPU"
            ]
        )
    require("bitsandbytes", "gpu", "lora.quantize: nf4 (QLoRA)")


def nf4_base(linear: nn.Linear) -> nn.Linear:
    """QLoRA's frozen base for `linear`: bitsandbytes' Linear4bit, or under the planner's
    FakeTensorMode (train/build.py's traced build) the stand-in with its footprint. Either
    carries `adapter_dtype`, the dtype `linear`'s weights were trained in, which the adapters
    beside it take."""
    dtype = linear.weight.dtype
    fake = isinstance(linear.weight, FakeTensor)
    base = NF4Footprint(linear) if fake else nf4_linear(linear)
    # a plain attribute (Module.__setattr__ is typed for tensors and modules only)
    object.__setattr__(base, "adapter_dtype", dtype)
    # Linear4bit is an nn.Linear; the stand-in has the attributes LoRALinear reads of one
    return cast(nn.Linear, base)


def nf4_linear(linear: nn.Linear) -> nn.Module:
    """A frozen bitsandbytes Linear4bit computing `linear` with its weight in NF4 (the bias, if
    any, kept as it is), on `linear`'s CUDA device; `linear`'s own weight is then freed."""
    w = linear.weight
    check_nf4(w.device)
    bnb = require("bitsandbytes", "gpu", "lora.quantize: nf4 (QLoRA)")
    base = bnb.nn.Linear4bit(
        linear.in_features,
        linear.out_features,
        bias=linear.bias is not None,
        compute_dtype=COMPUTE_DTYPE,
        compress_statistics=True,  # double quantization: the absmaxes in 8 bits
        quant_type="nf4",
        device="meta",  # the weight is set below, quantized; nothing to allocate first
    )
    # Params4bit quantizes (bnb.functional.quantize_4bit, nf4) when moved to a GPU, which it
    # is on already: `.to` quantizes all the same, and hands the state to `module` too
    weight = bnb.nn.Params4bit(
        w.detach().to(COMPUTE_DTYPE),
        requires_grad=False,
        blocksize=BLOCK,
        compress_statistics=True,
        quant_type="nf4",
        module=base,
    )
    base.weight = weight.to(w.device)
    if linear.bias is not None:
        base.bias = nn.Parameter(linear.bias.detach(), requires_grad=False)
    return base


def dequantized(base: nn.Module) -> torch.Tensor:
    """The weight a Linear4bit multiplies by: its NF4 codes dequantized (bf16, out × in)."""
    bnb = require("bitsandbytes", "gpu", "lora.quantize: nf4 (QLoRA)")
    weight: Any = base.weight  # bitsandbytes' Params4bit, which carries its quant_state
    return bnb.functional.dequantize_4bit(weight.data, weight.quant_state)


def is_nf4(module: nn.Module) -> bool:
    """A 4-bit base: bitsandbytes' Linear4bit, or the trace's stand-in for it."""
    return isinstance(module, NF4Footprint) or type(module).__name__ == "Linear4bit"


class _NF4MatMul(torch.autograd.Function):
    """bitsandbytes' MatMul4Bit as memory: the forward makes the bf16 weight, multiplies and
    frees it; the backward makes it again for the input's gradient (the weight is frozen)."""

    @staticmethod
    def forward(ctx, x, codes, out_features, in_features):
        w = x.new_empty(out_features, in_features, dtype=COMPUTE_DTYPE)  # dequantize_4bit
        ctx.shape = (out_features, in_features)
        ctx.x_dtype = x.dtype
        return (x.to(COMPUTE_DTYPE) @ w.t()).to(x.dtype)  # Linear4bit: in the input's dtype

    @staticmethod
    def backward(ctx, g):
        w = g.new_empty(*ctx.shape, dtype=COMPUTE_DTYPE)
        return (g.to(COMPUTE_DTYPE) @ w).to(ctx.x_dtype), None, None, None


class NF4Footprint(nn.Module):
    """The planner's stand-in for Linear4bit under FakeTensorMode (no kernels run): the packed
    codes (a frozen uint8 parameter, two weights a byte), the 8-bit absmaxes, their fp32
    absmaxes, the code book and offset (buffers), and `_NF4MatMul`'s transients."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        n, w = linear.weight.numel(), linear.weight
        blocks = -(-n // BLOCK)
        self.weight = nn.Parameter(
            torch.empty(-(-n // 2), 1, dtype=torch.uint8, device=w.device), requires_grad=False
        )
        self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=w.device))
        self.register_buffer("absmax2", torch.empty(-(-blocks // 256), device=w.device))
        self.register_buffer("code", torch.empty(256, device=w.device))
        self.register_buffer("offset", torch.empty((), device=w.device))
        self.bias = (
            nn.Parameter(linear.bias.detach(), requires_grad=False)
            if linear.bias is not None
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _NF4MatMul.apply(x, self.weight, self.out_features, self.in_features)
        return y if self.bias is None else y + self.bias.to(y.dtype)

"""The model's building blocks that vary, described once: the MLP variants and the norm, what
each computes and what every reader of the model counts of it.

Torch only, on purpose: `littlelm export` copies this file beside modeling_littlelm.py into a
remote-code export, where transformers imports it (`from .blocks import ...`) and littlelm is
not installed. So it imports nothing from littlelm.

Who reads an `MLPSpec` (MLPS[model.mlp]):
- model/gpt.py builds its blocks' MLP from it (`MLP`, with littlelm's kernels as `ops`), derives
  the default hidden width (`hidden_width`) and its FLOPs (`matmul_weights`);
- model/modeling_littlelm.py builds the same `MLP` for transformers (plain torch: `TorchOps`);
- plan/memory.py counts what it keeps for the backward (`saved`) and its backward temporaries
  (`backward`); plan/speed.py its GEMMs (`inputs`) and elementwise traffic (`passes`);
- model/grow.py grows each input linear (new hidden rows) and `c_proj` (new hidden columns);
- interop/arch.py maps it to a stock transformers MLP where one computes it (STOCK_MLP there:
  the weight mapping); without an entry there, export ships this file with the weights.

A new variant: its `act`, one MLPS entry and its name in `MLPName`, here; its weight mapping
in interop/arch.py if a stock class computes it; a test (tests/test_blocks.py shows one).

Who reads `Norm` (every norm of the model: norm1, norm2, norm_f, the embedding's and qk-norm):
- model/gpt.py and model/modeling_littlelm.py build their norms from it (the ops as above);
- plan/memory.py counts what it keeps (`NORM_KEEPS`), plan/speed.py its traffic
  (`NORM_PASSES`);
- interop/arch.py writes its epsilon for transformers (`fp32_eps`) and names the stock classes
  that compute it (`NORM_TITLE`); interop/gguf_export.py writes the same epsilon for llama.cpp.
A different norm is a change to `Norm` and `Ops.norm` here (and both kernel sets'
implementation, model/kernels.py), its costs beside it, and its name where arch.py picks a
stock class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn


class Ops(Protocol):
    """The kernels an MLP's activation may call beyond plain torch: littlelm's model passes its
    kernel set (model/kernels.py's Backend, with hand-written CPU backward ops), the
    transformers model `TorchOps`."""

    relu_squared: Callable[[torch.Tensor], torch.Tensor]
    # (x, weight=None, eps=None, out_dtype=None): `Norm` below, written in out_dtype
    rms_norm: Callable[..., torch.Tensor]


def _relu_squared(h: torch.Tensor) -> torch.Tensor:
    return torch.relu(h).square()


def _rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps), computed in fp32, times the gain when there is one; eps
    defaults to the machine epsilon of x's dtype (as F.rms_norm's)."""
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    xf = x.float()
    y = (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)).to(out_dtype or x.dtype)
    return y if weight is None else y * weight.to(y.dtype)


class TorchOps:
    """Plain-torch versions of `Ops`: what modeling_littlelm.py runs."""

    relu_squared = staticmethod(_relu_squared)
    rms_norm = staticmethod(_rms_norm)


# `act(ops, proj)`: the hidden activations, where proj(name) is the input linear `name` applied
# to the MLP's input (called in the order the variant reads them)
Activation = Callable[[Ops, Callable[[str], torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class MLPSpec:
    """One MLP variant: input linears (d_model -> hidden), an activation, c_proj (hidden ->
    d_model); and what its tensors cost, in hidden-wide vectors per token."""

    title: str  # in GPTConfig.mlp's description
    inputs: tuple[str, ...]  # the input linears' names, in parameter order (c_proj follows)
    act: Activation
    width: float = 1.0  # the default hidden width is mlp_ratio·d_model·width (multiple of 64)
    saved: int = 2  # hidden-wide tensors autograd keeps for the backward (plan/memory.py)
    backward: int = 2  # hidden-wide tensors alive at once in its backward (plan/memory.py)
    passes: int = 2  # hidden-wide elementwise reads + writes, forward (plan/speed.py)

    def matmul_weights(self, d_model: int, hidden: int) -> int:
        """Weights its matmuls multiply by, per token: the input linears and c_proj."""
        return (len(self.inputs) + 1) * d_model * hidden


MLPName = Literal["relu2", "swiglu"]  # GPTConfig.mlp's values: the keys of MLPS

MLPS: dict[str, MLPSpec] = {
    # relu(x W_fc)² W_proj; relu² is one op with a hand-written backward (the cpu kernels), which
    # keeps relu's output and its square
    "relu2": MLPSpec(
        title="relu²",
        inputs=("c_fc",),
        act=lambda ops, proj: ops.relu_squared(proj("c_fc")),
    ),
    # (silu(x W_gate) · x W_fc) W_proj: keeps both projections, SiLU's output and the product;
    # 2/3 of the width keeps the parameters of a relu² MLP of the same mlp_ratio
    "swiglu": MLPSpec(
        title="SwiGLU",
        inputs=("c_fc", "c_gate"),
        act=lambda ops, proj: F.silu(proj("c_gate")) * proj("c_fc"),
        width=2 / 3,
        saved=4,
        backward=3,
        passes=3,
    ),
}


def hidden_width(kind: str, d_model: int, mlp_ratio: float) -> int:
    """The default MLP hidden width of variant `kind`: a multiple of 64, at least 64."""
    width = mlp_ratio * d_model * MLPS[kind].width
    return max(64, round(width / 64) * 64)


def plain_linear(in_features: int, out_features: int) -> nn.Module:
    return nn.Linear(in_features, out_features, bias=False)


class MLP(nn.Module):
    """The MLP of variant `kind`; `linear(in, out)` makes its layers (littlelm's may be FP8)."""

    def __init__(
        self,
        kind: str,
        d_model: int,
        hidden: int,
        linear: Callable[[int, int], nn.Module] = plain_linear,
    ):
        super().__init__()
        self.spec = MLPS[kind]
        for name in self.spec.inputs:
            self.add_module(name, linear(d_model, hidden))
        self.c_proj = linear(hidden, d_model)

    def forward(self, x: torch.Tensor, ops: Ops) -> torch.Tensor:
        return self.c_proj(self.spec.act(ops, lambda name: getattr(self, name)(x)))


# The norm: RMSNorm, x / sqrt(mean(x²) + eps) · gain, over the last dimension. What it costs:
NORM_TITLE = "RMSNorm"  # what transformers' stock classes (Llama, Qwen2, Qwen3) also compute
NORM_KEEPS = 4  # bytes per normalised row it keeps for its backward beside its output (fp32 1/rms)
NORM_PASSES = 2  # row-wide reads + writes, forward (read x, write the output)


def fp32_eps(eps: float | None) -> float:
    """The epsilon a norm uses in fp32: the set one, or float32's machine epsilon (the default
    an fp32 model runs with; what an export writes for another tool)."""
    return eps if eps is not None else torch.finfo(torch.float32).eps


class Norm(nn.Module):
    """One norm of the model, with a learnable per-channel gain when `affine`; `eps` None is the
    input dtype's machine epsilon. `ops.rms_norm` computes it (littlelm's kernels or TorchOps)."""

    def __init__(self, dim: int, affine: bool, eps: float | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.eps = eps

    def forward(
        self, x: torch.Tensor, ops: Ops, out_dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps, out_dtype)

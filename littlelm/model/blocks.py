"""The model's MLP variants, described once: what each one computes and what every reader of
the model counts of it.

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


def _relu_squared(h: torch.Tensor) -> torch.Tensor:
    return torch.relu(h).square()


class TorchOps:
    """Plain-torch versions of `Ops`: what modeling_littlelm.py runs."""

    relu_squared = staticmethod(_relu_squared)


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

"""Muon: momentum SGD whose update for each 2-D matrix is replaced by its nearest orthogonal
matrix (computed with a Newton–Schulz iteration), so every direction of the update moves at the
same rate. Used for the hidden matrices of the transformer; embeddings, lm_head and scalars go
to AdamW (see optim.groups).
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from littlelm.optim.lowp import stochastic_round_

# Quintic Newton–Schulz coefficients chosen to push singular values towards 1 quickly from
# anywhere in (0, 1]; five iterations land them in roughly [0.7, 1.2], which is all an update
# direction needs. `ns_steps` trades accuracy for time.
NS_COEFFS = (3.4445, -4.7750, 2.0315)


def orthogonalize(
    g: torch.Tensor, steps: int = 5, eps: float = 1e-7, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Approximate U·Vᵀ of the SVD of g (..., m, n), computed in `dtype` (bf16: the iteration
    only needs singular values near 1, and bf16 runs at the hardware's fastest rate; fp32 where
    bf16 is emulated in software, see littlelm/hardware.py)."""
    a, b, c = NS_COEFFS
    x = g.to(dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:  # iterate on the smaller Gram matrix
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.mT
        poly = b * gram + c * (gram @ gram)
        x = a * x + poly @ x
    return x.mT if tall else x


def shape_scale(shape: torch.Size) -> float:
    """lr multiplier sqrt(max(1, rows/cols)): keeps the update's RMS size independent of aspect."""
    return math.sqrt(max(1.0, shape[-2] / shape[-1]))


class Muon(torch.optim.Optimizer):
    """Muon for 2-D parameters. Group options: lr, momentum, nesterov, weight_decay, ns_steps.

    Same-shaped matrices are orthogonalised together as one batch, in `ns_dtype`. With
    `stochastic_rounding` (bf16 parameters) each update is computed in fp32 and rounded
    stochastically into the parameter (see optim.lowp).
    """

    def __init__(
        self,
        params,
        lr=0.02,
        momentum=0.95,
        nesterov=True,
        weight_decay=0.0,
        ns_steps=5,
        stochastic_rounding=False,
        ns_dtype=torch.bfloat16,
    ):
        defaults = dict(
            lr=lr,
            momentum=momentum,
            nesterov=nesterov,
            weight_decay=weight_decay,
            ns_steps=ns_steps,
        )
        super().__init__(params, defaults)
        self.stochastic_rounding = stochastic_rounding
        self.ns_dtype = ns_dtype  # not a group option: derived from the config on every start
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon takes 2-D matrices only, got shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is None, "Muon does not take a closure"
        for group in self.param_groups:
            for params in same_shape_buckets(group["params"]):
                params = [p for p in params if p.grad is not None]
                if params:
                    self._step_same_shape(group, params)

    def _step_same_shape(self, group: dict, params: list[torch.Tensor]) -> None:
        directions = self._directions(group, params, [p.grad for p in params])
        updates = orthogonalize(torch.stack(directions), group["ns_steps"], dtype=self.ns_dtype)
        self._apply(group, params, list(updates.unbind(0)), params[0].shape)

    def _directions(
        self, group: dict, params: list[torch.Tensor], grads: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        """Update the momentum buffers (kept per parameter) and return the directions to
        orthogonalise: the Nesterov look-ahead g + mom·(buf - g), or the buffers themselves."""
        bufs = [self._buffer(p, g) for p, g in zip(params, grads)]
        mom = group["momentum"]
        torch._foreach_lerp_(bufs, grads, 1 - mom)  # buf = mom·buf + (1-mom)·g
        if group["nesterov"]:
            return torch._foreach_lerp(grads, bufs, mom)  # g + mom·(buf - g)
        return bufs

    def _apply(
        self,
        group: dict,
        params: list[torch.Tensor],
        updates: list[torch.Tensor],
        shape: torch.Size,
    ) -> None:
        """params ← params·(1 - lr·wd) - lr·scale(shape)·update, `shape` being the full matrix's
        (with stochastic rounding: computed in fp32, rounded stochastically into bf16)."""
        lr = group["lr"] * shape_scale(shape)
        decay = 1 - group["lr"] * group["weight_decay"]
        if self.stochastic_rounding:
            for p, u in zip(params, updates):
                stochastic_round_(p, p.float().mul_(decay).add_(u.float(), alpha=-lr))
            return
        if group["weight_decay"]:
            torch._foreach_mul_(params, decay)
        torch._foreach_add_(params, [u.to(params[0].dtype) for u in updates], alpha=-lr)

    def _buffer(self, p: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(like)
        return state["momentum_buffer"]


def same_shape_buckets(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Parameters grouped by shape, in first-seen order (the same on every rank)."""
    by_shape: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    for p in params:
        by_shape[tuple(p.shape)].append(p)
    return list(by_shape.values())

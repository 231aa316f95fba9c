"""Muon's group kind: momentum SGD whose update for each 2-D matrix is replaced by its nearest
orthogonal matrix (computed with a Newton–Schulz iteration), so every direction of the update
moves at the same rate. Used for the hidden matrices of the transformer; embeddings, lm_head
and scalars go to AdamW (optim/groups.py).

A Muon group updates its momentum, orthogonalises each update (`orthogonalize`: same-shaped
matrices in one batch) and scales it by sqrt(max(1, rows/cols)). Across processes (the
optimizer's `shard`) it shards whole matrices (`MATRICES`):
    ddp, shard_muon   within each group, the matrices of one shape (N of them) give
                      k = ceil(N / world) consecutive ones to each rank: rank r owns [r·k, r·k+k),
                      keeps their momentum, orthogonalises them, and one all-gather (in the
                      Newton–Schulz dtype) hands every rank every update
    fsdp              the parameters are DTensors holding rows [r·c, r·c+c) (c = ceil(rows /
                      world)); Muon updates the momentum of those rows, one all-to-all sends each
                      owner the rows of its matrices, the owner orthogonalises whole matrices and
                      a second all-to-all returns each rank its rows of the updates
Newton–Schulz starts by rounding to its dtype, so exchanging the directions in it changes nothing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, cast

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from littlelm.hardware import auto_precision
from littlelm.optim.base import MATRICES, GroupRule, all_gather, chunk_bounds
from littlelm.optim.lowp import stochastic_round_

NS_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class MuonRule(GroupRule):
    """Muon (module docstring). `momentum`, `nesterov`, `ns_steps`: a new group's options (the
    group's own are what a step reads); `ns_dtype`: the Newton–Schulz iterate's dtype (bf16,
    fp32, or auto: as the device, made concrete by `on`)."""

    kind: ClassVar[str] = "muon"
    sharding: ClassVar[str] = MATRICES
    state_keys: ClassVar[tuple[str, ...]] = ("momentum_buffer",)
    scales_lr_by_width: ClassVar[bool] = False  # its lr scales with the matrix's shape instead

    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_dtype: str = "bf16"

    @property
    def dtype(self) -> torch.dtype:
        # still `auto` (not built on a device: the planner's): bf16, as on the plan's GPUs
        return NS_DTYPES["fp32" if self.ns_dtype == "fp32" else "bf16"]

    def group_options(self, fused: bool) -> dict[str, Any]:
        return {"momentum": self.momentum, "nesterov": self.nesterov, "ns_steps": self.ns_steps}

    def on(self, device_type: str) -> MuonRule:
        return replace(self, ns_dtype=auto_precision(self.ns_dtype, device_type))

    def prepare(self, opt: Any, groups: list[dict]) -> None:
        for p in (p for g in groups for p in g["params"]):
            if p.ndim != 2:
                raise ValueError(f"Muon takes 2-D matrices only, got shape {tuple(p.shape)}")

    def step_groups(self, opt: Any, groups: list[dict]) -> None:
        for group in groups:
            for bucket in same_shape_buckets(group["params"]):
                live = [p for p in bucket if p.grad is not None]
                if not live:
                    continue
                if opt.shard_muon:  # fsdp too
                    opt.stepped.update(id(p) for p in live)
                if opt.fsdp:  # FSDP2's parameters are DTensors
                    self._fsdp(opt, group, cast(list[DTensor], live))
                elif opt.shard_muon:
                    self._owned(opt, group, live)
                else:
                    self._whole(opt, group, live)

    def _whole(self, opt: Any, group: dict, params: list[torch.Tensor]) -> None:
        """One process: orthogonalise every matrix of the bucket (a function of its own, so
        that its temporaries are freed before the next bucket's)."""
        directions = self._directions(opt, group, params, _grads(params))
        updates = orthogonalize(torch.stack(directions), group["ns_steps"], dtype=self.dtype)
        self._apply(opt, group, params, list(updates.unbind(0)), params[0].shape)

    def _directions(
        self, opt: Any, group: dict, params: Sequence[torch.Tensor], grads: list[torch.Tensor]
    ) -> list[torch.Tensor] | tuple[torch.Tensor, ...]:
        """Update the momentum buffers (kept per parameter) and return the directions to
        orthogonalise: the Nesterov look-ahead g + mom·(buf - g), or the buffers themselves."""
        bufs = []
        for p, g in zip(params, grads):
            state = opt.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(g)
            bufs.append(state["momentum_buffer"])
        mom = group["momentum"]
        torch._foreach_lerp_(bufs, grads, 1 - mom)  # buf = mom·buf + (1-mom)·g
        if group["nesterov"]:
            return torch._foreach_lerp(grads, bufs, mom)  # g + mom·(buf - g)
        return bufs

    def _apply(
        self, opt: Any, group: dict, params: list[torch.Tensor], updates: list[torch.Tensor], shape
    ) -> None:
        """params <- params·(1 - lr·wd) - lr·scale(shape)·update, `shape` being the whole
        matrix's (with stochastic rounding: computed in fp32, rounded stochastically)."""
        lr = group["lr"] * shape_scale(shape)
        decay = 1 - group["lr"] * group["weight_decay"]
        if opt.stochastic_rounding:
            for p, u in zip(params, updates):
                stochastic_round_(p, p.float().mul_(decay).add_(u.float(), alpha=-lr))
            return
        if group["weight_decay"]:
            torch._foreach_mul_(params, decay)
        torch._foreach_add_(params, [u.to(params[0].dtype) for u in updates], alpha=-lr)

    def _owned(self, opt: Any, group: dict, params: list[torch.Tensor]) -> None:
        """ddp: orthogonalise the matrices this rank owns, all-gather every update."""
        n, shape = len(params), params[0].shape
        k = -(-n // opt.world)
        lo, hi = chunk_bounds(n, opt.rank, opt.world)
        local = params[0].new_zeros((k, *shape), dtype=self.dtype)
        if hi > lo:
            mine = params[lo:hi]
            dirs = self._directions(opt, group, mine, _grads(mine))
            local[: hi - lo] = orthogonalize(torch.stack(dirs), group["ns_steps"], dtype=self.dtype)
        gathered = local.new_empty((opt.world * k, *shape))
        all_gather(gathered, local)
        self._apply(opt, group, params, list(gathered[:n].unbind(0)), shape)

    def _fsdp(self, opt: Any, group: dict, params: list[DTensor]) -> None:
        """fsdp: momentum on this rank's rows; whole matrices to their owners and back."""
        n, w = len(params), opt.world
        (m, cols), k = params[0].shape, -(-n // w)
        c = -(-m // w)  # rows per rank (FSDP2 pads the last ranks' slices)
        local = [p.to_local() for p in params]
        a, b = chunk_bounds(m, opt.rank, w)
        assert all(t.shape == (b - a, cols) for t in local), "FSDP2 split rows unexpectedly"
        dirs = self._directions(opt, group, params, [_local(g) for g in _grads(params)])
        send = local[0].new_zeros((w * k, c, cols), dtype=self.dtype)
        for i, d in enumerate(dirs):
            send[i, : d.size(0)] = d
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)  # recv[j]: rank j's rows of my k matrices
        whole = recv.view(w, k, c, cols).transpose(0, 1).reshape(k, w * c, cols)
        lo, hi = chunk_bounds(n, opt.rank, w)
        upd = torch.zeros_like(whole)
        if hi > lo:
            upd[: hi - lo, :m] = orthogonalize(
                whole[: hi - lo, :m], group["ns_steps"], dtype=self.dtype
            )
        back = upd.view(k, w, c, cols).transpose(0, 1).contiguous()  # (w, k, c, cols)
        mine = torch.empty_like(back)
        dist.all_to_all_single(mine, back)  # mine[j]: my rows of owner j's k matrices
        rows = mine.view(w * k, c, cols)
        updates = [rows[i, : t.size(0)] for i, t in enumerate(local)]
        self._apply(opt, group, local, updates, params[0].shape)

    # -- what the planner reads -----------------------------------------------------------------

    @property
    def ns_bytes(self) -> int:
        """Bytes per element of the Newton–Schulz iterate."""
        return self.dtype.itemsize

    def state_bytes(self, numel: int, param_bytes: int) -> tuple[int, ...]:
        return (param_bytes * numel,)  # the momentum buffer

    def traffic(self, param_bytes: int) -> float:
        # per parameter: the momentum update, the iterate in and out
        return param_bytes * 3 + self.ns_bytes * 6

    def bucket_scratch(
        self, shape: tuple[int, ...], owned: int, count: int, param_bytes: int, world: int
    ) -> int:
        """Temporaries of stepping one bucket of `count` matrices, `owned` of them here: the
        Nesterov direction and its stack (in the gradients' dtype), then Newton–Schulz: x, a·x,
        poly·x, their sum and two Grams; under sharded Muon the owned updates and their
        all-gather."""
        rows, cols = shape[-2:]
        k, s = owned * rows * cols, min(rows, cols)
        need = (2 if self.nesterov else 1) * param_bytes * k
        need += 4 * self.ns_bytes * k + 2 * self.ns_bytes * owned * s * s
        if owned < count:
            need += self.ns_bytes * (world + 1) * k
        return need

    def bucket_flops(self, shape: tuple[int, ...], owned: int) -> float:
        a, b = sorted(shape[-2:])
        # ns_steps Newton-Schulz iterations: X X^T (2a^2b), A A (2a^3), B X (2a^2b)
        return self.ns_steps * (4 * a * a * b + 2 * a**3) * owned

    def bucket_work(self, matrices: torch.Tensor) -> torch.Tensor:
        """The arithmetic bench times for a bucket (plan/speed.py): its orthogonalisation."""
        return orthogonalize(matrices, self.ns_steps, dtype=self.dtype)


def _grads(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The gradients of `params`, which the caller chose for having one."""
    return [g for p in params if (g := p.grad) is not None]


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of an FSDP2 gradient (a DTensor)."""
    assert isinstance(t, DTensor), "FSDP2's gradients are DTensors"
    return t.to_local()


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


def same_shape_buckets(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Parameters grouped by shape, in first-seen order (the same on every rank)."""
    by_shape: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    for p in params:
        by_shape[tuple(p.shape)].append(p)
    return list(by_shape.values())

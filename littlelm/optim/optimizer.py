"""The optimizer: one `torch.optim.Optimizer` whose parameter groups say how they are stepped.

Each group carries, besides its `params`:

    kind          which rule steps it (a `GroupRule`, optim/base.py): "adamw" or "muon" (the
                  2-D hidden matrices), both below, or another optimizer's from its own file
    role, origin  which parameters (optim/groups.py): the model's role (matrix, embedding, ...)
                  and growth's origin tag (embedding, old, new); `name` is "role/origin"
    lr, base_lr   this step's lr and the config's: the trainer sets lr = base_lr x schedule x
                  grow.lr_multipliers' factor for the origin
    weight_decay  decoupled, as in AdamW
    the rule's options (`GroupRule.group_options`): adamw: betas, eps, fused; muon: momentum,
                  nesterov, ns_steps

A step hands each rule its groups, the rules in the order the optimizer's traits list them (for
Muon: every AdamW group, then the Muon groups). The rules are given by the config that builds
the optimizer (`OptimizerTraits.rules`); without them, AdamW and Muon.

Several processes (`shard`, once, before the first step; one process is the plain path), by how
each rule shards (`GroupRule.sharding`):
    ELEMENTS, ddp, shard_adamw   ZeRO stage 1: each parameter seen flat and cut in `world`
                      chunks; a rank keeps the state of its chunk only (the rule is elementwise:
                      the same arithmetic), then one all-gather per dtype gives every rank every
                      parameter (`step_elementwise`)
    ELEMENTS, fsdp    the parameters are DTensors holding rows [r·c, r·c+c); the rule runs on
                      them as they are (its state is sharded like them)
    MATRICES          the rule's own exchange (Muon's owned matrices, below), under ddp
                      with shard_muon and always under fsdp
    WHOLE             every rank keeps and steps whole tensors (ddp; refused under fsdp)
Checkpoints hold whole tensors at any world size (optim/state.py, which this class inherits).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, cast

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.optim.adam import adam

from littlelm.errors import ConfigError
from littlelm.hardware import auto_precision
from littlelm.optim.base import (
    ELEMENTS,
    MATRICES,
    WHOLE,
    GroupRule,
    all_gather,
    chunk_bounds,
)
from littlelm.optim.lowp import stochastic_adamw_, stochastic_round_
from littlelm.optim.state import WholeTensorState

Update = Callable[..., None]  # GroupRule.update


class MuonAdamW(WholeTensorState):
    """The groups of each kind stepped by that kind's rule (module docstring): Muon and AdamW
    unless `rules` says otherwise.

    `stochastic_rounding` (bf16 parameters) computes every update in fp32 and rounds it
    stochastically into the parameter. It and the rules are not group options: they are derived
    from the config on every start.
    """

    def __init__(
        self,
        groups: list[dict],
        stochastic_rounding: bool = False,
        rules: Sequence[GroupRule] | None = None,
    ):
        super().__init__(groups, defaults={})
        self.stochastic_rounding = stochastic_rounding
        rules = (AdamWRule(), MuonRule()) if rules is None else rules
        self.rules = {r.kind: r for r in rules}  # in the order they step
        self.rank, self.world = 0, 1
        self.fsdp = self.shard_muon = self.shard_adamw = False
        self.stepped: set[int] = set()  # sharded MATRICES rules: ids of matrices with state
        self._bounds: dict[int, tuple[int, int]] = {}  # ZeRO: id -> this rank's flat [a, b)
        for group in self.param_groups:
            assert group["kind"] in self.rules, f"no rule steps groups of kind {group['kind']}"
        # what each rule made for its groups (bitsandbytes' AdamW8bit)
        self.helpers = {
            kind: rule.prepare(self, self._groups(kind))
            for kind, rule in self.rules.items()
            if self._groups(kind)
        }

    def shard(self, fsdp: bool, shard_muon: bool, shard_adamw: bool) -> MuonAdamW:
        """Step and checkpoint across the processes of torch.distributed (module docstring);
        before the first step. Under fsdp MATRICES rules always shard and ELEMENTS rules are
        never ZeRO-split; `shard_muon` shards the MATRICES rules, `shard_adamw` the ELEMENTS."""
        assert not self.state, "shard the optimizer before its first step"
        whole = [k for k, r in self.rules.items() if r.sharding == WHOLE and self._groups(k)]
        if fsdp and whole:
            raise ConfigError(
                [
                    f"the {', '.join(whole)} optimizer steps whole tensors, which FSDP2 splits "
                    "across the ranks; use distributed.strategy=ddp (or another optimizer)"
                ]
            )
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.fsdp, self.shard_muon = fsdp, fsdp or shard_muon
        self.shard_adamw = shard_adamw and not fsdp
        if self.shard_adamw:
            for p in self._params(ELEMENTS):
                self._bounds[id(p)] = chunk_bounds(p.numel(), self.rank, self.world)
        return self

    def _groups(self, kind: str) -> list[dict]:
        return [g for g in self.param_groups if g["kind"] == kind]

    def _params(self, sharding: str) -> list[torch.Tensor]:
        """The parameters of the groups whose rule shards as `sharding`."""
        return [
            p
            for g in self.param_groups
            if self.rules[g["kind"]].sharding == sharding
            for p in g["params"]
        ]

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is None, "MuonAdamW does not take a closure"
        for kind, rule in self.rules.items():
            groups = self._groups(kind)
            if groups:
                rule.step_groups(self, groups)

    # ------------------------------------------------------------------------------------------
    # Elementwise rules: each parameter whole, or ZeRO-1's slice of it

    def step_elementwise(self, groups: list[dict], update: Update) -> None:
        """`update` (GroupRule.update) on each group's parameters with a gradient; under
        ZeRO-1 on this rank's flat slices, then one all-gather per dtype makes them whole."""
        if not self.shard_adamw:
            for group in groups:
                live = [p for p in group["params"] if p.grad is not None]
                update(self, group, live, live, [p.grad for p in live])
            return
        params = [p for g in groups for p in g["params"]]
        slices = [self._slice(p) for p in params]
        for group in groups:
            live = [p for p in group["params"] if p.grad is not None]
            grads = [p.grad.reshape(-1)[slice(*self._bounds[id(p)])] for p in live]
            update(self, group, live, [self._slice(p) for p in live], grads)
        for p, whole in zip(params, self._gather_flat(params, slices)):
            p.view(-1).copy_(whole)

    def _slice(self, p: torch.Tensor) -> torch.Tensor:
        return p.detach().view(-1)[slice(*self._bounds[id(p)])]

    def _gather_flat(
        self, params: list[torch.Tensor], parts: Sequence[torch.Tensor | None]
    ) -> list[torch.Tensor | None]:
        """Every rank's flat slices -> whole flat tensors on every rank, one all-gather per
        dtype; parts[i] is this rank's slice of params[i]'s tensor, or None to skip it."""
        out: list[torch.Tensor | None] = [None] * len(parts)
        for dtype in dict.fromkeys(t.dtype for t in parts if t is not None):
            chosen = [(i, t) for i, t in enumerate(parts) if t is not None and t.dtype == dtype]
            idx = [i for i, _ in chosen]
            sizes = [-(-params[i].numel() // self.world) for i in idx]
            offsets = [sum(sizes[:j]) for j in range(len(idx))]
            flat = chosen[0][1].new_zeros(sum(sizes))
            for (_, part), off in zip(chosen, offsets):
                flat[off : off + part.numel()] = part
            every = flat.new_empty(self.world * flat.numel())
            all_gather(every, flat)
            every = every.view(self.world, -1)  # (world, sum(sizes))
            for i, off, size in zip(idx, offsets, sizes):
                out[i] = every[:, off : off + size].reshape(-1)[: params[i].numel()]
        return out

    # ------------------------------------------------------------------------------------------
    # Matrix rules' checkpoints: each matrix's state is on its owner (ddp) or in rows (fsdp)

    def _stepped_buckets(self) -> Iterator[tuple[GroupRule, list[torch.Tensor]]]:
        for group in self.param_groups:
            rule = self.rules[group["kind"]]
            if rule.sharding == MATRICES:
                for bucket in same_shape_buckets(group["params"]):
                    live = [p for p in bucket if id(p) in self.stepped]
                    if live:
                        yield rule, live


# ----------------------------------------------------------------------------------------------
# AdamW: torch's own AdamW arithmetic (`torch.optim.adam.adam`: the fused kernel on CPU and CUDA,
# foreach elsewhere), the stochastic-rounding AdamW of optim/lowp.py for bf16 parameters, or
# bitsandbytes' 8-bit AdamW. Elementwise: ZeRO-1 steps each rank's flat slice and FSDP2's
# DTensor shards step as they are (`MuonAdamW.step_elementwise`).

BNB_MIN_8BIT = 4096  # bitsandbytes keeps tensors smaller than this in 32-bit state
BNB_BLOCK = 256  # elements per quantization block (one fp32 absmax each)


@dataclass(frozen=True)
class AdamWRule(GroupRule):
    """AdamW; `betas`, `eps`: a new group's options; `eight_bit`: bitsandbytes' AdamW8bit
    (CUDA), its state kept in the optimizer's."""

    kind: ClassVar[str] = "adamw"
    scalar_state: ClassVar[tuple[str, ...]] = ("step",)

    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    eight_bit: bool = False

    def group_options(self, fused: bool) -> dict[str, Any]:
        return {"betas": self.betas, "eps": self.eps, "fused": fused}

    def prepare(self, opt: Any, groups: list[dict]) -> Any:
        if not self.eight_bit:
            return None
        import bitsandbytes as bnb  # optim/groups.py checked that it is installed

        # it steps these very group dicts (its own options added), its state kept in ours
        return bnb.optim.AdamW8bit(groups, betas=groups[0]["betas"], eps=groups[0]["eps"])

    def step_groups(self, opt: Any, groups: list[dict]) -> None:
        if self.eight_bit:  # load_state_dict replaces both, so hand them over on every step
            helper = opt.helpers[self.kind]
            helper.param_groups, helper.state = groups, opt.state
            helper.step()
        else:  # GroupRule's default, called here: one step crosses the files docs/architecture.md lists
            opt.step_elementwise(groups, self.update)

    def update(
        self,
        opt: Any,
        group: dict,
        keys: list[torch.Tensor],
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
    ) -> None:
        if not params:
            return
        states = [_state(opt, k, p, group) for k, p in zip(keys, params)]
        if opt.stochastic_rounding:
            for p, g, s in zip(params, grads, states):
                stochastic_adamw_(p, g, s, group)
            return
        beta1, beta2 = group["betas"]
        adam(
            params,
            grads,
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],
            foreach=not group["fused"],
            fused=group["fused"],
            decoupled_weight_decay=True,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )

    # -- what the planner reads -----------------------------------------------------------------

    def state_bytes(self, numel: int, param_bytes: int) -> tuple[int, ...]:
        """exp_avg + exp_avg_sq in the parameters' dtype and a step counter (torch's fused
        AdamW); 8-bit: one byte each plus an fp32 absmax per block of 256, or fp32 moments for
        a tensor too small to quantize."""
        if self.eight_bit and numel >= BNB_MIN_8BIT:
            absmax = 4 * -(-numel // BNB_BLOCK)
            return (numel, numel, absmax, absmax)
        if self.eight_bit:
            return (4 * numel, 4 * numel)
        return (param_bytes * numel, param_bytes * numel, 4)

    def scratch_bytes(
        self, numel: int, param_bytes: int, stochastic_rounding: bool
    ) -> tuple[int, ...]:
        # fused AdamW none; the stochastic-rounding AdamW three fp32 tensors (optim/lowp.py)
        return (4 * numel,) * 3 if stochastic_rounding else ()

    def traffic(self, param_bytes: int) -> float:
        # foreach AdamW: parameter, gradient and two moments read, three written, in about
        # three passes of torch's multi-tensor kernels
        moments = 2 * 2 if self.eight_bit else param_bytes * 3
        return 3 * (param_bytes * 4 + moments)


def _state(opt: Any, key: torch.Tensor, like: torch.Tensor, group: dict) -> dict:
    state = opt.state[key]
    if not state:  # as torch's AdamW: the fused kernel reads `step` on the device
        on_device = group["fused"] and not opt.stochastic_rounding
        state["step"] = torch.zeros((), device=like.device if on_device else "cpu")
        state["exp_avg"] = torch.zeros_like(like, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(like, memory_format=torch.preserve_format)
    return state


# ----------------------------------------------------------------------------------------------
# Muon: momentum SGD whose update for each 2-D matrix is replaced by its nearest orthogonal
# matrix (a Newton–Schulz iteration: `orthogonalize`, same-shaped matrices in one batch), scaled
# by sqrt(max(1, rows/cols)), so every direction of the update moves at the same rate. Used for
# the hidden matrices; embeddings, lm_head and scalars go to AdamW (optim/groups.py). It shards
# whole matrices (MATRICES, the module docstring): under ddp each owner orthogonalises its own
# and one all-gather (in the Newton–Schulz dtype) hands every rank every update; under fsdp two
# all-to-alls take each owner the rows of its matrices and return each rank its rows of the
# updates. Newton–Schulz starts by rounding to its dtype, so exchanging the directions in it
# changes nothing.

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

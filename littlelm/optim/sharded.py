"""Optimizers across data-parallel ranks, each equal to its single-process version.

    ShardedMuon    each rank orthogonalises only the matrices it owns; the updates are gathered
    ZeroAdamW      ddp: each rank keeps AdamW's moments for a 1/world slice of every parameter
    FullStates     fsdp: a torch optimizer over sharded (DTensor) parameters, checkpointed whole

Ownership. Within each parameter group, Muon's matrices are bucketed by shape (as Muon batches
them); a bucket of N matrices gives k = ceil(N / world) consecutive matrices to each rank, so
rank r owns matrices [r·k, (r+1)·k) of each bucket and does a 1/world share of the Newton–Schulz
work. Under ddp every rank already holds the all-reduced gradients: the owner keeps the momentum
buffer, orthogonalises, and one all-gather (bf16) hands every rank every update. Under fsdp each
rank holds rows [r·c, (r+1)·c) of every matrix (c = ceil(rows / world), FSDP2's split): the
momentum is updated on those rows, one all-to-all sends each owner the rows of its matrices, the
owner orthogonalises the whole matrices, and a second all-to-all returns each rank its rows of
the updates. Newton–Schulz starts by rounding to bf16, so the exchanged directions are bf16
without changing the result.

Checkpoints. `state_dict()` is a collective that returns the single-process format (whole
tensors, the same param indices) on every rank, and `load_state_dict` takes that format and keeps
this rank's part, so one checkpoint loads at any world size and with any of these optimizers.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from littlelm.optim.groups import HybridOptimizer
from littlelm.optim.muon import Muon, orthogonalize, same_shape_buckets

# torch 2.13 renamed all_gather_into_tensor; keep working with the older name on older torch
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def shard_hybrid(
    opt: HybridOptimizer, fsdp: bool, shard_muon: bool, shard_adamw: bool
) -> HybridOptimizer:
    """The same optimizer, its inner parts replaced by their distributed versions."""
    inner = []
    for o in opt.optimizers:
        if isinstance(o, Muon):
            inner.append(ShardedMuon.like(o, fsdp) if fsdp or shard_muon else o)
        elif fsdp:
            inner.append(FullStates(o))
        elif shard_adamw:
            inner.append(ZeroAdamW(o))
        else:
            inner.append(o)
    return HybridOptimizer(inner, opt.specs)


def chunk_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """[start, end) of rank's slice when n items are cut into chunks of ceil(n / world)."""
    c = -(-n // world)
    start = min(rank * c, n)
    return start, min(start + c, n)


def param_index(groups: list[dict]) -> Iterator[tuple[int, torch.Tensor]]:
    """(index, param) in torch's state_dict numbering: groups in order, params in order."""
    i = 0
    for g in groups:
        for p in g["params"]:
            yield i, p
            i += 1


def _to_local(full: torch.Tensor, p: DTensor) -> torch.Tensor:
    """This rank's part of `full` laid out like the DTensor parameter `p` (no communication)."""
    d = distribute_tensor(full.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
    return d.to_local().clone()


def _full(local: torch.Tensor, p: DTensor) -> torch.Tensor:
    """The whole tensor from every rank's part laid out like `p` (an all-gather)."""
    d = DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
    return d.full_tensor()


class ShardedMuon(Muon):
    """Muon whose Newton–Schulz work is split across ranks (see the module docstring)."""

    def __init__(self, params, fsdp: bool, **defaults):
        super().__init__(params, **defaults)
        self.fsdp = fsdp
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._stepped: set[int] = set()  # ids of params that have momentum (the same everywhere)

    @classmethod
    def like(cls, muon: Muon, fsdp: bool) -> ShardedMuon:
        groups = [dict(g) for g in muon.param_groups]
        sr, dtype = muon.stochastic_rounding, muon.ns_dtype
        return cls(groups, fsdp, stochastic_rounding=sr, ns_dtype=dtype, **muon.defaults)

    def _owned(self, n: int) -> tuple[int, int]:
        k = -(-n // self.world)
        return min(self.rank * k, n), min(self.rank * k + k, n)

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is None, "Muon does not take a closure"
        for group in self.param_groups:
            for bucket in same_shape_buckets(group["params"]):
                live = [p for p in bucket if p.grad is not None]
                if live:
                    self._stepped.update(id(p) for p in live)
                    (self._step_fsdp if self.fsdp else self._step_replicated)(group, live)

    def _step_replicated(self, group: dict, params: list[torch.Tensor]) -> None:
        n, shape = len(params), params[0].shape
        k = -(-n // self.world)
        lo, hi = self._owned(n)
        local = params[0].new_zeros((k, *shape), dtype=self.ns_dtype)
        if hi > lo:
            mine = params[lo:hi]
            dirs = self._directions(group, mine, [p.grad for p in mine])
            local[: hi - lo] = orthogonalize(
                torch.stack(dirs), group["ns_steps"], dtype=self.ns_dtype
            )
        gathered = local.new_empty((self.world * k, *shape))
        all_gather(gathered, local)
        self._apply(group, params, list(gathered[:n].unbind(0)), shape)

    def _step_fsdp(self, group: dict, params: list[DTensor]) -> None:
        n, w = len(params), self.world
        (m, cols), k = params[0].shape, -(-n // w)
        c = -(-m // w)  # rows per rank (FSDP2 pads the last ranks' slices)
        local = [p.to_local() for p in params]
        a, b = chunk_bounds(m, self.rank, w)
        assert all(t.shape == (b - a, cols) for t in local), "FSDP2 split rows unexpectedly"
        dirs = self._directions(group, params, [p.grad.to_local() for p in params])
        send = local[0].new_zeros((w * k, c, cols), dtype=self.ns_dtype)
        for i, d in enumerate(dirs):
            send[i, : d.size(0)] = d
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)  # recv[j]: rank j's rows of my k matrices
        whole = recv.view(w, k, c, cols).transpose(0, 1).reshape(k, w * c, cols)  # (k, w·c, cols)
        lo, hi = self._owned(n)
        upd = torch.zeros_like(whole)
        if hi > lo:
            upd[: hi - lo, :m] = orthogonalize(
                whole[: hi - lo, :m], group["ns_steps"], dtype=self.ns_dtype
            )
        back = upd.view(k, w, c, cols).transpose(0, 1).contiguous()  # (w, k, c, cols)
        mine = torch.empty_like(back)
        dist.all_to_all_single(mine, back)  # mine[j]: my rows of owner j's k matrices
        rows = mine.view(w * k, c, cols)
        self._apply(
            group, local, [rows[i, : t.size(0)] for i, t in enumerate(local)], params[0].shape
        )

    # ------------------------------------------------------------------------------------------
    # Checkpoints: the single-process format, whole tensors

    def _stepped_buckets(self) -> Iterator[list[torch.Tensor]]:
        for group in self.param_groups:
            for bucket in same_shape_buckets(group["params"]):
                live = [p for p in bucket if id(p) in self._stepped]
                if live:
                    yield live

    def state_dict(self) -> dict:
        sd = super().state_dict()
        index = {id(p): i for i, p in param_index(self.param_groups)}
        state = {}
        for bucket in self._stepped_buckets():
            for p, full in zip(bucket, self._gather_momentum(bucket)):
                state[index[id(p)]] = {"momentum_buffer": full.cpu()}
        sd["state"] = state
        return sd

    def _gather_momentum(self, bucket: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.fsdp:
            return [_full(self.state[p]["momentum_buffer"], p) for p in bucket]
        n, k = len(bucket), -(-len(bucket) // self.world)
        lo, hi = self._owned(n)
        local = bucket[0].new_zeros((k, *bucket[0].shape))
        for j, p in enumerate(bucket[lo:hi]):
            local[j] = self.state[p]["momentum_buffer"]
        out = local.new_empty((self.world * k, *bucket[0].shape))
        all_gather(out, local)
        return list(out[:n].unbind(0))

    def load_state_dict(self, state_dict: dict) -> None:
        params = dict(param_index(self.param_groups))
        index = {id(p): i for i, p in params.items()}
        saved = state_dict["state"]
        self._stepped = {id(params[i]) for i in saved}
        keep = {}
        for bucket in self._stepped_buckets():
            lo, hi = self._owned(len(bucket))
            for j, p in enumerate(bucket):
                i = index[id(p)]
                buf = saved[i]["momentum_buffer"]
                if self.fsdp:
                    keep[i] = {"momentum_buffer": _to_local(buf, p)}
                elif lo <= j < hi:
                    keep[i] = {"momentum_buffer": buf}
        super().load_state_dict({**state_dict, "state": keep})


class ZeroAdamW:
    """AdamW with its moments split across ddp ranks (ZeRO stage 1).

    Each parameter is seen flat and cut into `world` chunks; this rank's AdamW steps only its
    chunk (AdamW is elementwise, so this is the same arithmetic), then one all-gather per dtype
    gives every rank every updated parameter. Gradients are whole on every rank (DDP all-reduced
    them), so only the optimizer state shrinks, to 1/world.
    """

    def __init__(self, adamw: torch.optim.Optimizer):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.params = [p for _, p in param_index(adamw.param_groups)]
        self.bounds = [chunk_bounds(p.numel(), self.rank, self.world) for p in self.params]
        self.slices = [p.detach().view(-1)[a:b] for p, (a, b) in zip(self.params, self.bounds)]
        it = iter(self.slices)
        groups = [
            {
                **{k: v for k, v in g.items() if k != "params"},
                "params": [next(it) for _ in g["params"]],
            }
            for g in adamw.param_groups
        ]
        self.inner = type(adamw)(groups)

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups

    @torch.no_grad()
    def step(self) -> None:
        for p, s, (a, b) in zip(self.params, self.slices, self.bounds):
            s.grad = None if p.grad is None else p.grad.reshape(-1)[a:b]
        self.inner.step()
        for p, full in zip(self.params, self._gather(self.slices)):
            p.view(-1).copy_(full)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        for s in self.slices:
            s.grad = None

    def _gather(self, parts: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """Every rank's slices -> whole flat tensors on every rank, one all-gather per dtype.
        parts[i] is this rank's slice of parameter i's tensor, or None to skip it."""
        out: list[torch.Tensor | None] = [None] * len(parts)
        for dtype in dict.fromkeys(t.dtype for t in parts if t is not None):
            idx = [i for i, t in enumerate(parts) if t is not None and t.dtype == dtype]
            sizes = [-(-self.params[i].numel() // self.world) for i in idx]
            offsets = [sum(sizes[:j]) for j in range(len(idx))]
            flat = parts[idx[0]].new_zeros(sum(sizes))
            for i, off in zip(idx, offsets):
                flat[off : off + parts[i].numel()] = parts[i]
            every = flat.new_empty(self.world * flat.numel())
            all_gather(every, flat)
            every = every.view(self.world, -1)  # (world, sum(sizes))
            for i, off, size in zip(idx, offsets, sizes):
                out[i] = every[:, off : off + size].reshape(-1)[: self.params[i].numel()]
        return out

    def state_dict(self) -> dict:
        sd = self.inner.state_dict()
        state = {i: dict(s) for i, s in sd["state"].items()}
        for key in sorted({k for s in state.values() for k in s if k != "step"}):
            parts = [
                state[i][key] if key in state.get(i, {}) else None for i in range(len(self.params))
            ]
            for i, whole in enumerate(self._gather(parts)):
                if whole is not None:  # a compact copy: `whole` may be a strided view
                    state[i][key] = (
                        whole.reshape(self.params[i].shape)
                        .cpu()
                        .clone(memory_format=torch.contiguous_format)
                    )
        return {**sd, "state": state}

    def load_state_dict(self, state_dict: dict) -> None:
        state = {}
        for i, s in state_dict["state"].items():
            a, b = self.bounds[i]
            state[i] = {k: (v if k == "step" else v.reshape(-1)[a:b].clone()) for k, v in s.items()}
        self.inner.load_state_dict({**state_dict, "state": state})


class FullStates:
    """A torch optimizer over FSDP (DTensor) parameters, whose state is already sharded like
    them; only its checkpoints change: whole tensors out, this rank's part back in."""

    def __init__(self, opt: torch.optim.Optimizer):
        self.opt = opt

    @property
    def param_groups(self) -> list[dict]:
        return self.opt.param_groups

    def step(self) -> None:
        self.opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        sd = self.opt.state_dict()
        state = {
            i: {k: (v.full_tensor().cpu() if isinstance(v, DTensor) else v) for k, v in s.items()}
            for i, s in sd["state"].items()
        }
        return {**sd, "state": state}

    def load_state_dict(self, state_dict: dict) -> None:
        params = dict(param_index(self.opt.param_groups))
        state = {}
        for i, s in state_dict["state"].items():
            p = params[i]
            state[i] = {k: (v if k == "step" else _to_local_dtensor(v, p)) for k, v in s.items()}
        self.opt.load_state_dict({**state_dict, "state": state})


def _to_local_dtensor(full: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    if not isinstance(p, DTensor):
        return full
    return distribute_tensor(full.to(p.device), p.device_mesh, p.placements, src_data_rank=None)

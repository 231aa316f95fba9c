"""The optimizer: one `torch.optim.Optimizer` whose parameter groups say how they are stepped.

Each group carries, besides its `params`:

    kind          "muon" (the 2-D hidden matrices) or "adamw" (the rest; everything under
                  optimizer.name=adamw)
    role, origin  which parameters (optim/groups.py): the model's role (matrix, embedding, ...)
                  and growth's origin tag (embedding, old, new); `name` is "role/origin"
    lr, base_lr   this step's lr and the config's: the trainer sets lr = base_lr x schedule x
                  grow.lr_multipliers' factor for the origin
    weight_decay  decoupled, as in AdamW
    adamw: betas, eps, fused      muon: momentum, nesterov, ns_steps

An AdamW group steps with torch's own AdamW arithmetic (`torch.optim.adam.adam`: the fused kernel
on CPU and CUDA, foreach elsewhere), with the stochastic-rounding AdamW of optim/lowp.py for bf16
parameters, or with bitsandbytes' 8-bit AdamW. A Muon group updates its momentum, replaces each
update by its nearest orthogonal matrix (`orthogonalize`, at the end of this file: same-shaped
matrices in one batch) and scales it by sqrt(max(1, rows/cols)). All AdamW groups step before the Muon groups.

Several processes (`shard`, once, before the first step; one process is the plain path):
    ddp, shard_muon   within each Muon group, the matrices of one shape (N of them) give
                      k = ceil(N / world) consecutive ones to each rank: rank r owns [r·k, r·k+k),
                      keeps their momentum, orthogonalises them, and one all-gather (in the
                      Newton–Schulz dtype) hands every rank every update
    ddp, shard_adamw  ZeRO stage 1: each parameter seen flat and cut in `world` chunks; a rank
                      keeps AdamW's moments for its chunk only (AdamW is elementwise: the same
                      arithmetic), then one all-gather per dtype gives every rank every parameter
    fsdp              the parameters are DTensors holding rows [r·c, r·c+c) (c = ceil(rows /
                      world)); AdamW runs on them as they are (its state is sharded like them);
                      Muon updates the momentum of those rows, one all-to-all sends each owner
                      the rows of its matrices, the owner orthogonalises whole matrices and a
                      second all-to-all returns each rank its rows of the updates
Newton–Schulz starts by rounding to its dtype, so exchanging the directions in it changes nothing.

Checkpoints: `state_dict()` is torch's layout with whole tensors and one numbering at any world
size (a collective when sharded); `load_state_dict` keeps this rank's part, and migrates the
layout written before this class (`{"optimizers": [...]}`, optim/migrate.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import cast

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.optim.adam import adam

from littlelm.optim.lowp import stochastic_adamw_, stochastic_round_
from littlelm.optim.migrate import from_parts

# torch 2.13 renamed all_gather_into_tensor; keep working with the older name on older torch
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class MuonAdamW(torch.optim.Optimizer):
    """Muon for the groups of kind "muon", AdamW for those of kind "adamw" (module docstring).

    `stochastic_rounding` (bf16 parameters) computes every update in fp32 and rounds it
    stochastically into the parameter; `ns_dtype` is the Newton–Schulz iterate's dtype;
    `adamw_8bit` steps the AdamW groups with bitsandbytes' AdamW8bit (CUDA). These three are
    not group options: they are derived from the config on every start.
    """

    def __init__(
        self,
        groups: list[dict],
        stochastic_rounding: bool = False,
        ns_dtype: torch.dtype = torch.bfloat16,
        adamw_8bit: bool = False,
    ):
        super().__init__(groups, defaults={})
        self.stochastic_rounding, self.ns_dtype = stochastic_rounding, ns_dtype
        self.rank, self.world = 0, 1
        self.fsdp = self.shard_muon = self.shard_adamw = False
        self._stepped: set[int] = set()  # sharded Muon: ids of matrices with momentum
        self._bounds: dict[int, tuple[int, int]] = {}  # ZeRO: id -> this rank's flat [a, b)
        for group in self.param_groups:
            assert group["kind"] in ("muon", "adamw"), group["kind"]
            for p in group["params"] if group["kind"] == "muon" else ():
                if p.ndim != 2:
                    raise ValueError(f"Muon takes 2-D matrices only, got shape {tuple(p.shape)}")
        adamw = [g for g in self.param_groups if g["kind"] == "adamw"]
        # bitsandbytes' optimizer steps these very group dicts, its state kept in ours
        self._8bit = _adamw_8bit(adamw) if adamw_8bit and adamw else None

    def shard(self, fsdp: bool, shard_muon: bool, shard_adamw: bool) -> MuonAdamW:
        """Step and checkpoint across the processes of torch.distributed (module docstring);
        before the first step. Under fsdp Muon is always sharded and AdamW never ZeRO-split."""
        assert not self.state, "shard the optimizer before its first step"
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.fsdp, self.shard_muon = fsdp, fsdp or shard_muon
        self.shard_adamw = shard_adamw and not fsdp
        if self.shard_adamw:
            for p in self._params("adamw"):
                self._bounds[id(p)] = chunk_bounds(p.numel(), self.rank, self.world)
        return self

    @property
    def sharded(self) -> bool:
        """Whether any state is split across the ranks (`shard`), or held as DTensors."""
        return self.fsdp or self.shard_muon or self.shard_adamw

    def _params(self, kind: str) -> list[torch.Tensor]:
        return [p for g in self.param_groups if g["kind"] == kind for p in g["params"]]

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is None, "MuonAdamW does not take a closure"
        adamw = [g for g in self.param_groups if g["kind"] == "adamw"]
        if self._8bit is not None:  # see __init__; load_state_dict replaces both
            self._8bit.param_groups, self._8bit.state = adamw, self.state
            self._8bit.step()
        elif self.shard_adamw:
            self._step_zero(adamw)
        else:
            for group in adamw:
                live = [p for p in group["params"] if p.grad is not None]
                self._adamw(group, live, live, [p.grad for p in live])
        for group in self.param_groups:
            if group["kind"] == "muon":
                self._step_muon(group)

    # ------------------------------------------------------------------------------------------
    # AdamW

    def _adamw(
        self,
        group: dict,
        keys: list[torch.Tensor],
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
    ) -> None:
        """One AdamW step of `params` (a parameter, or this rank's slice of it) whose state is
        kept under `keys` (the parameters)."""
        if not params:
            return
        states = [self._adamw_state(k, p, group) for k, p in zip(keys, params)]
        if self.stochastic_rounding:
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

    def _adamw_state(self, key: torch.Tensor, like: torch.Tensor, group: dict) -> dict:
        state = self.state[key]
        if not state:  # as torch's AdamW: the fused kernel reads `step` on the device
            on_device = group["fused"] and not self.stochastic_rounding
            state["step"] = torch.zeros((), device=like.device if on_device else "cpu")
            state["exp_avg"] = torch.zeros_like(like, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(like, memory_format=torch.preserve_format)
        return state

    def _step_zero(self, groups: list[dict]) -> None:
        """ZeRO-1: step this rank's slice of every parameter, then all-gather them."""
        params = [p for g in groups for p in g["params"]]
        slices = [self._slice(p) for p in params]
        for group in groups:
            live = [p for p in group["params"] if p.grad is not None]
            grads = [p.grad.reshape(-1)[slice(*self._bounds[id(p)])] for p in live]
            self._adamw(group, live, [self._slice(p) for p in live], grads)
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
    # Muon

    def _step_muon(self, group: dict) -> None:
        for bucket in same_shape_buckets(group["params"]):
            live = [p for p in bucket if p.grad is not None]
            if not live:
                continue
            if self.shard_muon:  # fsdp too
                self._stepped.update(id(p) for p in live)
            if self.fsdp:  # FSDP2's parameters are DTensors
                self._muon_fsdp(group, cast(list[DTensor], live))
            elif self.shard_muon:
                self._muon_owned(group, live)
            else:
                self._muon(group, live)

    def _muon(self, group: dict, params: list[torch.Tensor]) -> None:
        """One process: orthogonalise every matrix of the bucket (a function of its own, so
        that its temporaries are freed before the next bucket's)."""
        directions = self._directions(group, params, _grads(params))
        updates = orthogonalize(torch.stack(directions), group["ns_steps"], dtype=self.ns_dtype)
        self._apply(group, params, list(updates.unbind(0)), params[0].shape)

    def _directions(
        self, group: dict, params: Sequence[torch.Tensor], grads: list[torch.Tensor]
    ) -> list[torch.Tensor] | tuple[torch.Tensor, ...]:
        """Update the momentum buffers (kept per parameter) and return the directions to
        orthogonalise: the Nesterov look-ahead g + mom·(buf - g), or the buffers themselves."""
        bufs = []
        for p, g in zip(params, grads):
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(g)
            bufs.append(state["momentum_buffer"])
        mom = group["momentum"]
        torch._foreach_lerp_(bufs, grads, 1 - mom)  # buf = mom·buf + (1-mom)·g
        if group["nesterov"]:
            return torch._foreach_lerp(grads, bufs, mom)  # g + mom·(buf - g)
        return bufs

    def _apply(
        self, group: dict, params: list[torch.Tensor], updates: list[torch.Tensor], shape
    ) -> None:
        """params <- params·(1 - lr·wd) - lr·scale(shape)·update, `shape` being the whole
        matrix's (with stochastic rounding: computed in fp32, rounded stochastically)."""
        lr = group["lr"] * shape_scale(shape)
        decay = 1 - group["lr"] * group["weight_decay"]
        if self.stochastic_rounding:
            for p, u in zip(params, updates):
                stochastic_round_(p, p.float().mul_(decay).add_(u.float(), alpha=-lr))
            return
        if group["weight_decay"]:
            torch._foreach_mul_(params, decay)
        torch._foreach_add_(params, [u.to(params[0].dtype) for u in updates], alpha=-lr)

    def _muon_owned(self, group: dict, params: list[torch.Tensor]) -> None:
        """ddp: orthogonalise the matrices this rank owns, all-gather every update."""
        n, shape = len(params), params[0].shape
        k = -(-n // self.world)
        lo, hi = chunk_bounds(n, self.rank, self.world)
        local = params[0].new_zeros((k, *shape), dtype=self.ns_dtype)
        if hi > lo:
            mine = params[lo:hi]
            dirs = self._directions(group, mine, _grads(mine))
            local[: hi - lo] = orthogonalize(
                torch.stack(dirs), group["ns_steps"], dtype=self.ns_dtype
            )
        gathered = local.new_empty((self.world * k, *shape))
        all_gather(gathered, local)
        self._apply(group, params, list(gathered[:n].unbind(0)), shape)

    def _muon_fsdp(self, group: dict, params: list[DTensor]) -> None:
        """fsdp: momentum on this rank's rows; whole matrices to their owners and back."""
        n, w = len(params), self.world
        (m, cols), k = params[0].shape, -(-n // w)
        c = -(-m // w)  # rows per rank (FSDP2 pads the last ranks' slices)
        local = [p.to_local() for p in params]
        a, b = chunk_bounds(m, self.rank, w)
        assert all(t.shape == (b - a, cols) for t in local), "FSDP2 split rows unexpectedly"
        dirs = self._directions(group, params, [_local(g) for g in _grads(params)])
        send = local[0].new_zeros((w * k, c, cols), dtype=self.ns_dtype)
        for i, d in enumerate(dirs):
            send[i, : d.size(0)] = d
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)  # recv[j]: rank j's rows of my k matrices
        whole = recv.view(w, k, c, cols).transpose(0, 1).reshape(k, w * c, cols)
        lo, hi = chunk_bounds(n, self.rank, self.world)
        upd = torch.zeros_like(whole)
        if hi > lo:
            upd[: hi - lo, :m] = orthogonalize(
                whole[: hi - lo, :m], group["ns_steps"], dtype=self.ns_dtype
            )
        back = upd.view(k, w, c, cols).transpose(0, 1).contiguous()  # (w, k, c, cols)
        mine = torch.empty_like(back)
        dist.all_to_all_single(mine, back)  # mine[j]: my rows of owner j's k matrices
        rows = mine.view(w * k, c, cols)
        updates = [rows[i, : t.size(0)] for i, t in enumerate(local)]
        self._apply(group, local, updates, params[0].shape)

    def _stepped_buckets(self) -> Iterator[list[torch.Tensor]]:
        for group in self.param_groups:
            if group["kind"] == "muon":
                for bucket in same_shape_buckets(group["params"]):
                    live = [p for p in bucket if id(p) in self._stepped]
                    if live:
                        yield live

    def _gather_momentum(self, bucket: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.fsdp:
            return [_full(self.state[p]["momentum_buffer"], p) for p in bucket]
        n, k = len(bucket), -(-len(bucket) // self.world)
        lo, hi = chunk_bounds(n, self.rank, self.world)
        local = bucket[0].new_zeros((k, *bucket[0].shape))
        for j, p in enumerate(bucket[lo:hi]):
            local[j] = self.state[p]["momentum_buffer"]
        out = local.new_empty((self.world * k, *bucket[0].shape))
        all_gather(out, local)
        return list(out[:n].unbind(0))

    # ------------------------------------------------------------------------------------------
    # Checkpoints: torch's layout, whole tensors

    def state_dict(self) -> dict:
        sd = super().state_dict()
        if not self.sharded:
            return sd
        index = {id(p): i for i, p in param_index(self.param_groups)}
        state = {index[id(p)]: sd["state"].get(index[id(p)], {}) for p in self._params("muon")}
        state = {i: s for i, s in state.items() if s}
        if self.shard_muon:  # every rank's momenta, whole
            state = {}
            for bucket in self._stepped_buckets():
                for p, whole in zip(bucket, self._gather_momentum(bucket)):
                    state[index[id(p)]] = {"momentum_buffer": whole.cpu()}
        adamw = self._params("adamw")
        saved = {index[id(p)]: sd["state"].get(index[id(p)], {}) for p in adamw}
        if self.shard_adamw:
            saved = {i: dict(s) for i, s in saved.items()}
            for key in sorted({k for s in saved.values() for k in s if k != "step"}):
                parts = [saved[index[id(p)]].get(key) for p in adamw]
                for p, flat in zip(adamw, self._gather_flat(adamw, parts)):
                    if flat is not None:  # a compact copy: `flat` may be a strided view
                        saved[index[id(p)]][key] = (
                            flat.reshape(p.shape).cpu().clone(memory_format=torch.contiguous_format)
                        )
        elif self.fsdp:
            saved = {i: {k: _whole(v) for k, v in s.items()} for i, s in saved.items()}
        state.update({i: s for i, s in saved.items() if s})
        return {**sd, "state": dict(sorted(state.items()))}

    def load_state_dict(self, state_dict: dict) -> None:
        if "optimizers" in state_dict:  # written before this class: one part per optimizer
            state_dict = from_parts(state_dict, self.param_groups)
        if self.sharded:
            state_dict = {**state_dict, "state": self._this_ranks(state_dict["state"])}
        super().load_state_dict(state_dict)

    def _this_ranks(self, saved: dict) -> dict:
        """This rank's part of whole-tensor state (see state_dict)."""
        params = dict(param_index(self.param_groups))
        index = {id(p): i for i, p in params.items()}
        keep = {}
        muon = {index[id(p)] for p in self._params("muon")}
        if self.shard_muon:
            self._stepped = {id(params[i]) for i in saved if i in muon}
            for bucket in self._stepped_buckets():
                lo, hi = chunk_bounds(len(bucket), self.rank, self.world)
                for j, p in enumerate(bucket):
                    i = index[id(p)]
                    buf = saved[i]["momentum_buffer"]
                    if self.fsdp:
                        keep[i] = {"momentum_buffer": _to_local(buf, p)}
                    elif lo <= j < hi:
                        keep[i] = {"momentum_buffer": buf}
        else:
            keep.update({i: s for i, s in saved.items() if i in muon})
        for i, s in saved.items():
            if i in muon:
                continue
            p = params[i]
            if self.shard_adamw:
                cut = slice(*self._bounds[id(p)])
                keep[i] = {
                    k: v if k == "step" else v.reshape(-1)[cut].clone() for k, v in s.items()
                }
            elif self.fsdp and isinstance(p, DTensor):
                keep[i] = {k: v if k == "step" else _to_dtensor(v, p) for k, v in s.items()}
            else:
                keep[i] = s
        return keep


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


def _grads(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The gradients of `params`, which the caller chose for having one."""
    return [g for p in params if (g := p.grad) is not None]


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of an FSDP2 gradient (a DTensor)."""
    assert isinstance(t, DTensor), "FSDP2's gradients are DTensors"
    return t.to_local()


def _whole(v):
    return v.full_tensor().cpu() if isinstance(v, DTensor) else v


def _to_dtensor(full: torch.Tensor, p: DTensor) -> DTensor:
    return distribute_tensor(full.to(p.device), p.device_mesh, p.placements, src_data_rank=None)


def _to_local(full: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """This rank's part of `full` laid out like the DTensor parameter `p` (no communication)."""
    assert isinstance(p, DTensor), "called under FSDP2, whose parameters are DTensors"
    return _to_dtensor(full, p).to_local().clone()


def _full(local: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The whole tensor from every rank's part laid out like `p` (an all-gather)."""
    assert isinstance(p, DTensor), "called under FSDP2, whose parameters are DTensors"
    d = DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
    return d.full_tensor()


def _adamw_8bit(groups: list[dict]) -> torch.optim.Optimizer:
    """bitsandbytes' AdamW8bit over `groups` (their betas and eps; it adds its own options)."""
    import bitsandbytes as bnb  # optim/groups.py checked that it is installed

    return bnb.optim.AdamW8bit(groups, betas=groups[0]["betas"], eps=groups[0]["eps"])


# ----------------------------------------------------------------------------------------------
# Muon's arithmetic: momentum SGD whose update for each 2-D matrix is replaced by its nearest
# orthogonal matrix (computed with a Newton–Schulz iteration), so every direction of the update
# moves at the same rate. Used for the hidden matrices of the transformer; embeddings, lm_head
# and scalars go to AdamW (optim/groups.py).

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

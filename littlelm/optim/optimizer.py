"""The optimizer: one `torch.optim.Optimizer` whose parameter groups say how they are stepped.

Each group carries, besides its `params`:

    kind          which rule steps it (a `GroupRule`, optim/base.py): "adamw" (optim/adamw.py),
                  "muon" (optim/muon.py: the 2-D hidden matrices), or another optimizer's
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
    MATRICES          the rule's own exchange (Muon: owned matrices, optim/muon.py), under ddp
                      with shard_muon and always under fsdp
    WHOLE             every rank keeps and steps whole tensors (ddp; refused under fsdp)

Checkpoints: `state_dict()` is torch's layout with whole tensors and one numbering at any world
size (a collective when sharded); `load_state_dict` keeps this rank's part, and migrates the
layout written before this class (`{"optimizers": [...]}`, optim/migrate.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from littlelm.errors import ConfigError
from littlelm.optim.adamw import AdamWRule
from littlelm.optim.base import ELEMENTS, MATRICES, WHOLE, GroupRule, all_gather, chunk_bounds
from littlelm.optim.migrate import from_parts
from littlelm.optim.muon import MuonRule, same_shape_buckets

Update = Callable[..., None]  # GroupRule.update


class MuonAdamW(torch.optim.Optimizer):
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
        rules: Sequence[GroupRule] = (AdamWRule(), MuonRule()),
    ):
        super().__init__(groups, defaults={})
        self.stochastic_rounding = stochastic_rounding
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

    @property
    def sharded(self) -> bool:
        """Whether any state is split across the ranks (`shard`), or held as DTensors."""
        return self.fsdp or self.shard_muon or self.shard_adamw

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

    def _gather_state(self, bucket: list[torch.Tensor], key: str) -> list[torch.Tensor]:
        if self.fsdp:
            return [_full(self.state[p][key], p) for p in bucket]
        n, k = len(bucket), -(-len(bucket) // self.world)
        lo, hi = chunk_bounds(n, self.rank, self.world)
        local = bucket[0].new_zeros((k, *bucket[0].shape))
        for j, p in enumerate(bucket[lo:hi]):
            local[j] = self.state[p][key]
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
        matrices = self._params(MATRICES)
        state = {index[id(p)]: sd["state"].get(index[id(p)], {}) for p in matrices}
        state = {i: s for i, s in state.items() if s}
        if self.shard_muon:  # every rank's matrices' state, whole
            state = {}
            for rule, bucket in self._stepped_buckets():
                for key in rule.state_keys:
                    for p, whole in zip(bucket, self._gather_state(bucket, key)):
                        state.setdefault(index[id(p)], {})[key] = whole.cpu()
        elements = self._params(ELEMENTS)
        saved = {
            index[id(p)]: sd["state"].get(index[id(p)], {})
            for p in [*elements, *self._params(WHOLE)]
        }
        if self.shard_adamw:
            saved = {i: dict(s) for i, s in saved.items()}
            scalars = self._scalar_state()
            for key in sorted({k for s in saved.values() for k in s if k not in scalars}):
                parts = [saved[index[id(p)]].get(key) for p in elements]
                for p, flat in zip(elements, self._gather_flat(elements, parts)):
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
        matrices = {index[id(p)] for p in self._params(MATRICES)}
        scalars = self._scalar_state()
        if self.shard_muon:
            self.stepped = {id(params[i]) for i in saved if i in matrices}
            for _, bucket in self._stepped_buckets():
                lo, hi = chunk_bounds(len(bucket), self.rank, self.world)
                for j, p in enumerate(bucket):
                    i = index[id(p)]
                    if self.fsdp:
                        keep[i] = {k: _to_local(v, p) for k, v in saved[i].items()}
                    elif lo <= j < hi:
                        keep[i] = saved[i]
        else:
            keep.update({i: s for i, s in saved.items() if i in matrices})
        for i, s in saved.items():
            if i in matrices:
                continue
            p = params[i]
            if self.shard_adamw and id(p) in self._bounds:
                cut = slice(*self._bounds[id(p)])
                keep[i] = {
                    k: v if k in scalars else v.reshape(-1)[cut].clone() for k, v in s.items()
                }
            elif self.fsdp and isinstance(p, DTensor):
                keep[i] = {k: v if k in scalars else _to_dtensor(v, p) for k, v in s.items()}
            else:
                keep[i] = s
        return keep

    def _scalar_state(self) -> set[str]:
        """State entries no rule keeps per element (never sliced or gathered)."""
        return {k for r in self.rules.values() for k in r.scalar_state}


def param_index(groups: list[dict]) -> Iterator[tuple[int, torch.Tensor]]:
    """(index, param) in torch's state_dict numbering: groups in order, params in order."""
    i = 0
    for g in groups:
        for p in g["params"]:
            yield i, p
            i += 1


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

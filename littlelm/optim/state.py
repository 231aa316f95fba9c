"""The optimizer's checkpoint layout (optim/optimizer.py's MuonAdamW inherits it): torch's
`state_dict()` layout with whole tensors and one numbering at any world size (a collective when
sharded); `load_state_dict` keeps this rank's part, and migrates the layout written before
MuonAdamW (`{"optimizers": [...]}`, optim/migrate.py). Apart from the step's file, which a
training step crosses and a checkpoint's code need not."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from littlelm.optim.base import ELEMENTS, MATRICES, WHOLE, GroupRule, all_gather, chunk_bounds
from littlelm.optim.migrate import from_parts


class WholeTensorState(torch.optim.Optimizer):
    """state_dict / load_state_dict in whole tensors, for an optimizer sharded as MuonAdamW is
    (its `shard`): what it reads of the optimizer is declared here."""

    rules: dict[str, GroupRule]
    rank: int
    world: int
    fsdp: bool
    shard_muon: bool
    shard_adamw: bool
    stepped: set[int]
    _bounds: dict[int, tuple[int, int]]

    @property
    def sharded(self) -> bool:
        """Whether any state is split across the ranks (`shard`), or held as DTensors."""
        return self.fsdp or self.shard_muon or self.shard_adamw

    def _params(self, sharding: str) -> list[torch.Tensor]:
        raise NotImplementedError

    def _gather_flat(self, params, parts) -> list[torch.Tensor | None]:
        raise NotImplementedError

    def _stepped_buckets(self) -> Iterator[tuple[GroupRule, list[torch.Tensor]]]:
        raise NotImplementedError

    def _gather_state(self, bucket: list[torch.Tensor], key: str) -> list[torch.Tensor]:
        """A bucket's `key` state, whole, on every rank: from each matrix's owner (ddp), or
        from every rank's rows (fsdp)."""
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

"""Live tensor memory by category, counted at the dispatcher.

`MemoryAccountant` is a TorchDispatchMode that sees every tensor an aten op returns. Each new
storage is counted (its bytes rounded up to the CUDA caching allocator's 512-byte blocks) under
the accountant's current category, and uncounted when the storage is freed (a weakref callback),
so the accountant knows the live bytes per category at every moment and the breakdown at the
peak. It works on real tensors (bench on a CPU) and on fake ones (the plan's trace), where no
memory is touched at all.

Categories are plain strings; the caller switches `region` as the step moves on (forward, loss,
backward, optimizer) and may re-label storages it learns more about (`relabel`: an optimizer's
state, a parameter's gradient).
"""

from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Memory categories, the one definition the analytic model (memory.py), the trace (trace.py),
# bench and the report share; CATEGORIES is their order in tables.
PARAMS, GRADS, STATE = "parameters", "gradients", "optimizer state"
COPIES, ACT, LOSS = "weight copies", "activations", "logits & loss"
BWD, SCRATCH = "backward temporaries", "optimizer scratch"
CATEGORIES = (PARAMS, GRADS, STATE, COPIES, ACT, LOSS, BWD, SCRATCH)
FB, OPT = "forward/backward", "optimizer step"  # the phases of a step
WEIGHT_OPS = (torch.ops.aten._to_copy.default, torch.ops.aten.cat.default)
BLOCK = 512  # the CUDA caching allocator rounds every allocation up to 512 bytes


def block_bytes(nbytes: int) -> int:
    return -(-nbytes // BLOCK) * BLOCK if nbytes else 0


@dataclass(frozen=True)
class Memory:
    """Tensor memory of one training step on one device, as the trace counts it or the analytic
    model computes it: bytes per category (each at its own largest) and, for each phase of the
    step, what is alive at that phase's peak, by category."""

    categories: dict[str, int]
    breakdowns: dict[str, dict[str, int]]  # phase -> category -> bytes at the phase's peak
    source: str  # where the figures come from, in words
    seconds: float = 0.0  # how long the trace took

    @property
    def phases(self) -> dict[str, int]:
        return {k: sum(v.values()) for k, v in self.breakdowns.items()}

    @property
    def peak_phase(self) -> str:
        phases = self.phases
        return max(phases, key=phases.get)

    @property
    def peak(self) -> int:
        return self.phases[self.peak_phase]

    def peak_breakdown(self) -> dict[str, int]:
        """What is alive at the peak, by category (sums to `peak`)."""
        return self.breakdowns[self.peak_phase]


@dataclass
class Snapshot:
    """Live bytes per category at one moment, and the total."""

    total: int = 0
    by_category: dict[str, int] = field(default_factory=dict)


class MemoryAccountant(TorchDispatchMode):
    """Counts live tensor storages by category. `peaks[phase]` keeps the breakdown at the peak
    of each phase (set `phase`); `marks` records named snapshots (`mark`)."""

    def __init__(self) -> None:
        super().__init__()
        self.region = "other"
        self.phase = "other"
        self.live: dict[int, tuple[int, str]] = {}  # id(storage) -> (bytes, category)
        self.total = 0
        self.peak = Snapshot()
        self.peaks: dict[str, Snapshot] = {}
        self.marks: dict[str, Snapshot] = {}
        self.maxima: Counter[str] = Counter()  # highest live bytes each category ever reached
        self.param_storages: set[int] = set()
        self._cat: Counter[str] = Counter()  # live bytes per category now
        self._refs: dict[int, weakref.ref] = {}

    # -- counting ------------------------------------------------------------------------------

    def track(self, t: torch.Tensor, category: str) -> None:
        """Count `t`'s storage under `category` (no-op when it is already counted)."""
        st = t.untyped_storage()
        key = id(st)
        if key in self.live:
            return
        nbytes = block_bytes(st.nbytes())
        self.live[key] = (nbytes, category)
        self._refs[key] = weakref.ref(st, lambda _, key=key: self._free(key))
        self._add(category, nbytes)

    def relabel(self, t: torch.Tensor, category: str) -> None:
        key = id(t.untyped_storage())
        if key not in self.live:
            self.track(t, category)
        else:
            self.relabel_key(key, category)

    def relabel_key(self, key: int, category: str) -> None:
        nbytes, old = self.live[key]
        if old != category:
            self.live[key] = (nbytes, category)
            self._cat[old] -= nbytes
            self._add(category, nbytes, count_total=False)

    def _add(self, category: str, nbytes: int, count_total: bool = True) -> None:
        self._cat[category] += nbytes
        self.maxima[category] = max(self.maxima[category], self._cat[category])
        if count_total:
            self.total += nbytes
        if self.total > self.peak.total:
            self.peak = self.snapshot()
        best = self.peaks.get(self.phase)
        if best is None or self.total > best.total:
            self.peaks[self.phase] = self.snapshot()

    def _free(self, key: int) -> None:
        entry = self.live.pop(key, None)
        self._refs.pop(key, None)
        if entry is not None:
            nbytes, category = entry
            self._cat[category] -= nbytes
            self.total -= nbytes

    def snapshot(self) -> Snapshot:
        return Snapshot(self.total, {k: v for k, v in self._cat.items() if v})

    def mark(self, name: str) -> Snapshot:
        self.marks[name] = self.snapshot()
        return self.marks[name]

    def live_bytes(self, category: str) -> int:
        return self._cat.get(category, 0)

    # -- the dispatcher hook -------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        category = self.region
        if func in WEIGHT_OPS and self._from_weights(args[0]):
            category = COPIES  # a weight cast (autocast) or stacked (q, k, v) for a matmul
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self.track(t, category)
        return out

    def _is_param(self, t) -> bool:
        return isinstance(t, torch.Tensor) and id(t.untyped_storage()) in self.param_storages

    def _from_weights(self, arg) -> bool:
        """Is `arg` (a tensor, or cat's list) made of parameters or copies of them only?"""
        tensors = arg if isinstance(arg, (list, tuple)) else [arg]
        return bool(tensors) and all(
            self._is_param(t) or self.live.get(id(t.untyped_storage()), (0, ""))[1] == COPIES
            for t in tensors
        )

    def track_params(self, params, buffers=(), category: str = PARAMS) -> None:
        """Count parameters and buffers; casts of parameters become "weight copies"."""
        for t in params:
            self.param_storages.add(id(t.untyped_storage()))
            self.track(t, category)
        for t in buffers:
            self.track(t, category)

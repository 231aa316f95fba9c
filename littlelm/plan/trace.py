"""Trace one whole training step under FakeTensorMode and count its memory by category.

The model and optimizer come from the very function training uses (`train.build.build`),
and the step is the trainer's own `micro_step` + `apply_update`, so a new model feature is
planned the day it exists. Everything runs on fake CPU tensors: shapes, dtypes and storages
are real, no memory is touched, and a 3B model traces in seconds. (The fake `cuda` device does
not survive backward on a CPU-only PyTorch, so the kernels traced are the CPU ones; see
`memory.Kernels` for where CUDA's differ.)

What is traced, in order:
1. build the model and optimizer; give every parameter a zero gradient and take one optimizer
   step, so the optimizer state exists as it does in every step after the first;
2. `min(grad_accum, 2)` micro-batches of forward + backward (the second one runs with the
   gradients of the first alive, as micro-batches 2..N of a real step do);
3. gradient clipping, the optimizer step and `zero_grad`.

The accountant labels each storage: parameters, optimizer state, weight copies (autocast's
bf16 copies of weights), activations (what the blocks keep for backward), logits & loss (the
loss's tensors, forward and backward), backward temporaries, gradients, optimizer scratch.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from littlelm.plan.accounting import (
    ACT,
    BWD,
    COPIES,
    FB,
    GRADS,
    LOSS,
    OPT,
    PARAMS,
    SCRATCH,
    STATE,
    MemoryAccountant,
    Snapshot,
)
from littlelm.plan.shapes import Dims
from littlelm.schema import RunConfig
from littlelm.train.build import build
from littlelm.train.device import autocast
from littlelm.train.step import apply_update, micro_step


@dataclass
class TraceResult:
    """Bytes per category (each at its own largest), the peak with its breakdown, the peak of
    each phase, and how long the trace took."""

    categories: dict[str, int]
    peak: Snapshot
    phases: dict[str, Snapshot]
    micro_batch: int
    seconds: float
    notes: list[str] = field(default_factory=list)


@contextlib.contextmanager
def fake_safe_optimizers() -> Iterator[None]:
    """torch's foreach Adam reads its step counters with `.item()` for the bias corrections,
    which a fake tensor cannot answer; hand it a number instead (the memory is the same)."""
    import torch.optim.adam as adam

    real = adam._get_value

    def value(x):
        return 1.0 if isinstance(x, FakeTensor) else real(x)

    adam._get_value = value
    try:
        yield
    finally:
        adam._get_value = real


def populate_state(model: torch.nn.Module, optimizer) -> None:
    """One optimizer step on zero gradients: every state tensor now exists."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    return [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def traced_dims(d: Dims) -> Dims:
    """The Dims of what `trace_step` actually runs (for comparing with the analytic model)."""
    rounding = d.stochastic_rounding and d.optimizer == "muon"  # as OptimizerConfig.traceable
    return replace(d, adamw_8bit=False, stochastic_rounding=rounding)


def trace_step(cfg: RunConfig, micro_batch: int | None = None) -> TraceResult:
    """Trace one optimizer step of `cfg` (at `micro_batch` sequences per micro-batch)."""
    t0 = time.perf_counter()
    cfg = cfg.with_precision(True)  # `auto` as on the GPU it stands in for (Dims.of does too)
    mb = micro_batch or cfg.train.micro_batch_size
    accum = cfg.train.grad_accum or 1
    with FakeTensorMode(), fake_safe_optimizers():
        model, optimizer = build(cfg, torch.device("cpu"), traced=True)
        populate_state(model, optimizer)
        acct = MemoryAccountant()
        handles = _install_hooks(model, acct)
        try:
            with acct:
                _run_step(cfg, model, optimizer, acct, mb, accum)
        finally:
            for h in handles:
                h.remove()
    return TraceResult(
        categories=_categories(acct),
        peak=acct.peak,
        phases={k: v for k, v in acct.peaks.items() if k in (FB, OPT)},
        micro_batch=mb,
        seconds=time.perf_counter() - t0,
        notes=_notes(cfg),
    )


def _run_step(cfg: RunConfig, model, optimizer, acct: MemoryAccountant, mb: int, accum: int):
    acct.track_params(model.parameters(), model.buffers())
    for t in optimizer_tensors(optimizer):
        acct.track(t, STATE)
    T = cfg.train.seq_len
    device = torch.device("cpu")
    for _ in range(min(accum, 2)):
        acct.phase, acct.region = FB, ACT
        x = torch.zeros(mb, T, dtype=torch.long)  # (B, T) token ids
        y = torch.zeros(mb, T, dtype=torch.long)
        micro_step(model, x, y, accum, autocast(device, cfg.train.precision))
        del x, y
    acct.phase, acct.region = OPT, SCRATCH
    apply_update(model, optimizer, cfg.train.grad_clip)
    acct.phase, acct.region = "after", "other"


def _install_hooks(model: torch.nn.Module, acct: MemoryAccountant) -> list:
    """Region switches at the model's seams, and gradients labelled as they land."""

    def to_region(name):
        return lambda *_: setattr(acct, "region", name)

    def end_of_forward(*_):
        acct.mark("end of forward")
        acct.region = LOSS  # the loss's backward comes first

    def grad_landed(p):
        acct.relabel(p.grad, GRADS)

    handles = [
        model.register_forward_hook(end_of_forward),
        model.norm_f.register_forward_hook(to_region(LOSS)),
    ]

    def blocks_backward(*_):
        # what the loss leaves alive now (the stream's gradient) is the blocks' to carry
        for key, (_, cat) in list(acct.live.items()):
            if cat == LOSS:
                acct.relabel_key(key, BWD)
        acct.region = BWD

    handles.append(model.blocks[-1].register_full_backward_pre_hook(blocks_backward))
    for p in model.parameters():
        handles.append(p.register_post_accumulate_grad_hook(grad_landed))
    return handles


def _categories(acct: MemoryAccountant) -> dict[str, int]:
    fwd = acct.marks.get("end of forward")
    at_fwd = fwd.by_category if fwd else {}
    return {
        PARAMS: acct.maxima[PARAMS],
        GRADS: acct.maxima[GRADS],
        STATE: acct.maxima[STATE],
        COPIES: at_fwd.get(COPIES, 0),
        ACT: at_fwd.get(ACT, 0),
        LOSS: acct.maxima[LOSS],
        BWD: acct.maxima[BWD],
        SCRATCH: acct.maxima[SCRATCH],
    }


def _notes(cfg: RunConfig) -> list[str]:
    notes = []
    if cfg.train.compile:
        notes.append("traced eagerly: torch.compile's fusions are not in the trace")
    return notes

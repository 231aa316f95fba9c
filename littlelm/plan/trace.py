"""Trace one whole training step under FakeTensorMode and count its memory by category.

The model and optimizer come from the very function training uses (`train.build.build`),
and the step is the trainer's own `micro_step` + `apply_update`, so a new model feature is
planned the day it exists. Everything runs on fake CPU tensors: shapes, dtypes and storages
are real, no memory is touched, and a 3B model traces in seconds. This is the plan's reference
for memory; the analytic model (plan/memory.py) is held to it.

The fake `cuda` device does not survive backward on a CPU-only PyTorch, so the step runs the
CPU backend's kernels. For a GPU's plan (`gpu=True`) attention is FlashAttention's footprint
instead of the CPU's blocked kernel: the tensors SDPA's flash kernel returns, keeps and makes
in its backward (`flash_footprint`), without its arithmetic. With `gpu=False` the trace is the
CPU step exactly (`littlelm bench` on a CPU measures it to 0.01%).

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
from dataclasses import replace

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from littlelm.model import kernels
from littlelm.plan import memory as mem
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
    Memory,
    MemoryAccountant,
)
from littlelm.plan.shapes import Dims
from littlelm.schema import RunConfig
from littlelm.train.build import build
from littlelm.train.device import autocast
from littlelm.train.step import apply_update, micro_step


class _FlashFootprint(torch.autograd.Function):
    """What FlashAttention-2, SDPA's kernel on a GPU, allocates (flash_api.cpp), on fake
    tensors: the forward returns the output in (B, T, H, D) storage and keeps q, k, v, the output
    and an fp32 log-sum-exp per head and row; the backward makes an fp32 dq accumulator, the
    fp32 row sums of dO·O, dq, and dk and dv (under GQA at the query heads' width first, then
    summed into the key/value heads'). The values are never read: only the memory is traced."""

    @staticmethod
    def forward(ctx, q, k, v):
        B, H, T, D = q.shape
        out = q.new_empty(B, T, H, D).transpose(1, 2)
        lse = q.new_empty(B, H, T, dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, g):
        q, k = ctx.saved_tensors[:2]
        B, H, T, D = q.shape
        Hkv = k.size(1)
        # alive until the gradients are made: the fp32 dq accumulator, the row sums of dO·O
        workspace = [q.new_empty(B, T, H, D, dtype=torch.float32)]
        workspace.append(q.new_empty(B, H, T, dtype=torch.float32))
        dq = q.new_empty(B, T, H, D).transpose(1, 2)
        if Hkv == H:
            dk, dv = (k.new_empty(B, T, Hkv, D).transpose(1, 2) for _ in range(2))
        else:  # GQA: per query head, then summed over the heads sharing a key/value head
            dk, dv = (
                q.new_empty(B, T, H, D).unflatten(2, (Hkv, H // Hkv)).sum(3).transpose(1, 2)
                for _ in range(2)
            )
        workspace.clear()
        return dq, dk, dv


def flash_footprint(q, k, v):
    return _FlashFootprint.apply(q, k, v)


@contextlib.contextmanager
def gpu_kernels(on: bool) -> Iterator[None]:
    """The CPU backend's kernels with FlashAttention's footprint in place of the blocked
    attention, for every backend name, while tracing a GPU's step (`on`)."""
    saved = dict(kernels.BACKENDS)
    if on:
        standin = replace(kernels.CPU, attention=flash_footprint)
        kernels.BACKENDS.update(cpu=standin, cuda=standin)
    try:
        yield
    finally:
        kernels.BACKENDS.update(saved)


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
    return replace(d, adamw_8bit=False, stochastic_rounding=rounding, world=1)  # one process


def trace_step(cfg: RunConfig, micro_batch: int | None = None, gpu: bool = True) -> Memory:
    """Trace one optimizer step of `cfg` (at `micro_batch` sequences per micro-batch), with a
    GPU's attention (`gpu`) or as it runs on this CPU."""
    t0 = time.perf_counter()
    cfg = cfg.with_precision(True)  # `auto` as on the GPU it stands in for (Dims.of does too)
    mb = micro_batch or cfg.train.micro_batch_size
    accum = cfg.train.grad_accum or 1
    with FakeTensorMode(), fake_safe_optimizers(), gpu_kernels(gpu):
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
    return Memory(
        categories=_categories(acct),
        breakdowns={k: acct.peaks[k].by_category for k in (FB, OPT)},
        source="trace" + (" (FlashAttention's footprint)" if gpu else " (this CPU's kernels)"),
        seconds=time.perf_counter() - t0,
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


def step_memory(cfg: RunConfig, trace: bool = True) -> tuple[Dims, Memory, Memory | None, Memory]:
    """What one GPU holds in a step of `cfg`: (its Dims, scaled so that the analytic model meets
    the trace at the configured micro-batch; the memory: the trace, or the scaled analytic model
    where the trace ran a stand-in (8-bit AdamW, one process of several) or did not run; the
    trace; the analytic model of what the trace ran, unscaled)."""
    d = Dims.of(cfg.with_precision(True))
    traced = trace_step(cfg) if trace else None
    analytic = mem.estimate(traced_dims(d))
    if traced is not None:
        d = replace(d, trace_scale=traced.peak / analytic.peak)
    memory = traced if traced is not None and traced_dims(d) == d else mem.estimate(d)
    return d, memory, traced, analytic

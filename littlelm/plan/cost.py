"""Does it fit, how fast, how much: one GPU of the catalog against one planned run.

Pure functions of a resolved config's `Dims`, a catalog entry and the catalog's defaults:

    needed   = tensor peak x (1 + allocator margin) + CUDA context and workspaces
    tokens/s = the step model (plan/speed.py) at the micro-batch that runs: the configured one
               if it fits, else the largest that fits with the same tokens per step; none if
               nothing fits
    cost     = hours x price x devices

The tensor peak is the analytic model's (plan/memory.py) scaled to the trace by `Dims.trace_scale`:
it is evaluated for every micro-batch and remedy, which the trace would take minutes for. A time
or money budget (train.budget hours or dollars) buys tok/s × seconds tokens on each GPU; a
dollars budget buys dollars / (the GPU's price × devices) hours there, so a cheaper GPU trains
longer (`apply_budget`; the trainer schedules the end from measured speed: train/budget.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from littlelm.model.gpt import flops_per_token
from littlelm.plan import memory as mem
from littlelm.plan import speed
from littlelm.plan.calibration import cuda_calibration
from littlelm.plan.catalog import GPU, Catalog
from littlelm.plan.shapes import Dims

GIB = 2**30
FSDP_SIZES = (2, 4, 8)


@dataclass
class Remedy:
    name: str  # what to change, in config terms where one exists
    needed_gib: float  # memory needed per GPU after the change
    saving_gib: float
    fits: bool
    note: str = ""


@dataclass
class GpuPlan:
    gpu: GPU
    devices: int
    micro_batch: int  # configured
    needed_gib: float  # at the configured micro-batch
    headroom_gib: float
    fits: bool
    lines: dict[str, float]  # GiB per line of the device budget
    best_micro_batch: int | None  # largest that fits and keeps the tokens per step
    best_grad_accum: int | None
    needed_at_best_gib: float | None  # at best_micro_batch
    tok_s: float | None  # all devices, at the micro-batch that runs; None: nothing fits
    mfu: float | None
    mfu_source: str  # where the speed comes from (step model + calibration, or catalog mfu)
    hours: float | None
    dollars: float | None
    dollars_per_btok: float | None
    remedies: list[Remedy] = field(default_factory=list)
    measured: dict | None = None  # bench's measurement of this run on this GPU, if any
    budget_tokens: int | None = None  # what a time or money budget buys here (apply_budget)
    budget_steps: int | None = None


def device_lines(d: Dims, gpu: GPU, catalog: Catalog, devices: int = 1) -> dict[str, float]:
    """The memory budget of one GPU in GiB: tensor peak, allocator margin, context."""
    e = mem.estimate(d)
    fsdp = d.strategy == "fsdp" and devices > 1
    step_peak = mem.fsdp_peak(d, devices) if fsdp else e.peak  # per rank
    resume = mem.resume_device_bytes(e) // (devices if fsdp else 1)
    tensor_peak = max(step_peak, resume)
    margin = tensor_peak * catalog.defaults.allocator_margin
    return {
        "tensor peak": tensor_peak / GIB,
        "resume spike": (tensor_peak - step_peak) / GIB,
        "allocator margin": margin / GIB,
        "CUDA context & workspaces": catalog.context_gib(gpu),
        "needed": (tensor_peak + margin) / GIB + catalog.context_gib(gpu),
    }


def needed_gib(d: Dims, gpu: GPU, catalog: Catalog, devices: int = 1) -> float:
    return device_lines(d, gpu, catalog, devices)["needed"]


def micro_batch_options(d: Dims, devices: int = 1) -> list[int]:
    """Micro-batch sizes that keep the tokens per optimizer step exactly: the divisors of the
    sequences per device per step, found up to its square root (a billion takes 32k steps)."""
    seqs = d.micro_batch * d.grad_accum
    small = [m for m in range(1, math.isqrt(seqs) + 1) if seqs % m == 0]
    return sorted({*small, *(seqs // m for m in small)})


def largest_fitting(d: Dims, gpu: GPU, catalog: Catalog, devices: int = 1) -> int | None:
    fitting = [
        m
        for m in micro_batch_options(d, devices)
        if needed_gib(d.with_micro_batch(m), gpu, catalog, devices) <= gpu.memory_gib
    ]
    return max(fitting) if fitting else None


def peak_tflops(gpu: GPU, d: Dims) -> float:
    return gpu.bf16_tflops if d.bf16 else gpu.fp32_tflops


def gpu_speed(
    d: Dims, gpu: GPU, catalog: Catalog, devices: int = 1, measured: dict | None = None
) -> tuple[float, str]:
    """Tokens/s over `devices` GPUs of this kind and where the figure comes from: the step
    model on the catalog's ceilings, calibrated by this GPU's own bench if there is one, else
    by the published points (calibration.yaml); or the catalog's fixed `mfu` where set."""
    if gpu.mfu is not None:
        fpt = flops_per_token(d.model, d.seq_len)
        return gpu.mfu * peak_tflops(gpu, d) * 1e12 / fpt * devices, "catalog mfu"
    rates = speed.catalog_rates(gpu, catalog, d)
    if measured and measured.get("speed_ratio"):
        ratio, source = measured["speed_ratio"], f"bench on this GPU {measured['time'][:10]}"
    else:
        cal = cuda_calibration(catalog)
        ratio, source = cal.ratio, cal.source
    rates = replace(rates, calibration=ratio, calibration_source=source)
    return speed.tokens_per_second(d, rates, devices), f"step model, {source}"


def plan_gpu(
    d: Dims,
    gpu: GPU,
    catalog: Catalog,
    tokens: int,
    devices: int = 1,
    measured: dict | None = None,
) -> GpuPlan:
    lines = device_lines(d, gpu, catalog, devices)
    need = lines["needed"]
    fits = need <= gpu.memory_gib
    best = largest_fitting(d, gpu, catalog, devices)
    runs = d if fits else (d.with_micro_batch(best) if best else None)
    tok_s, source = gpu_speed(runs, gpu, catalog, devices, measured) if runs else (None, "")
    price = gpu.price_per_hour * devices
    hours = tokens / tok_s / 3600 if tok_s else None
    fpt = flops_per_token(d.model, d.seq_len)
    return GpuPlan(
        gpu=gpu,
        devices=devices,
        micro_batch=d.micro_batch,
        needed_gib=need,
        headroom_gib=gpu.memory_gib - need,
        fits=fits,
        lines=lines,
        best_micro_batch=best,
        best_grad_accum=(d.micro_batch * d.grad_accum // best) if best else None,
        needed_at_best_gib=needed_gib(runs, gpu, catalog, devices) if runs else None,
        tok_s=tok_s,
        mfu=tok_s / devices * fpt / (peak_tflops(gpu, d) * 1e12) if tok_s else None,
        mfu_source=source,
        hours=hours,
        dollars=hours * price if hours is not None else None,
        dollars_per_btok=price / (tok_s * 3600) * 1e9 if tok_s else None,
        remedies=[] if fits else remedies(d, gpu, catalog, devices),
    )


def config_changes(d: Dims) -> list[tuple[str, str, Dims]]:
    """Config changes that lower memory without changing the tokens per step, mildest first:
    (override, why, the changed Dims)."""
    out = []
    if d.loss == "plain":
        out.append(
            ("model.loss=chunked", "the full logits never exist", replace_loss(d, "chunked"))
        )
    if not d.adamw_8bit and not d.stochastic_rounding:
        why = "AdamW's two moments in 1 byte each, not 4 (CUDA, bitsandbytes)"
        out.append(("optimizer.adamw_8bit=true", why, replace(d, adamw_8bit=True)))
    if d.optimizer == "adamw":
        muon = replace(d, optimizer="muon", nesterov=True)
        out.append(("optimizer.name=muon", "one buffer per matrix, not AdamW's two", muon))
    if d.bf16 and not d.master_bf16:
        why = (
            "parameters, gradients and state in bf16, no casts (add train.stochastic_rounding=true)"
        )
        out.append(("train.master_weights=bf16", why, replace(d, master_bf16=True)))
    if not d.checkpointing:
        why = "each layer recomputed in the backward pass: about 1/3 more compute"
        out.append(("train.activation_checkpointing=true", why, replace(d, checkpointing=True)))
    return out


def replace_loss(d: Dims, loss: str) -> Dims:
    return replace(d, model=d.model.model_copy(update={"loss": loss}))


def remedies(d: Dims, gpu: GPU, catalog: Catalog, devices: int = 1) -> list[Remedy]:
    """Each change that lowers memory with its predicted saving at the configured micro-batch;
    a change that is not enough alone also comes with the largest micro-batch that then fits."""
    base = needed_gib(d, gpu, catalog, devices)
    out: list[Remedy] = []

    def add(name: str, dm: Dims, note: str) -> None:
        need = needed_gib(dm, gpu, catalog, devices)
        out.append(Remedy(name, need, base - need, need <= gpu.memory_gib, note))

    best = largest_fitting(d, gpu, catalog, devices)
    if (best or 1) < d.micro_batch:
        dm = d.with_micro_batch(best or 1)
        add(f"train.micro_batch_size={best or 1}", dm, _accum_note(d, dm))
    for name, why, changed in config_changes(d):
        add(name, changed, why)
        if not out[-1].fits:
            m = largest_fitting(changed, gpu, catalog, devices)
            if m:
                dm = changed.with_micro_batch(m)
                add(f"{name} train.micro_batch_size={m}", dm, f"{why}; {_accum_note(d, dm)}")
    for n in FSDP_SIZES:
        per_gpu = mem.fsdp_peak(d, n) * (1 + catalog.defaults.allocator_margin) / GIB
        need = per_gpu + catalog.context_gib(gpu)
        if need <= gpu.memory_gib or n == FSDP_SIZES[-1]:
            note = "FSDP2: parameters, gradients and optimizer state split over the GPUs"
            name = f"distributed.strategy=fsdp on {n} GPUs (--nproc {n})"
            out.append(Remedy(name, need, base - need, need <= gpu.memory_gib, note))
            break
    # those that fit first, mildest change first (the order above); then the rest, closest first
    return sorted(out, key=lambda r: (not r.fits, 0.0 if r.fits else r.needed_gib))


def _accum_note(d: Dims, dm: Dims) -> str:
    return f"grad_accum {d.grad_accum} -> {dm.grad_accum} keeps the tokens per step"


def budget_seconds(budget, p: GpuPlan) -> float | None:
    """Seconds `budget` buys on `p`'s GPUs (None for a tokens budget or none)."""
    if budget is None or budget.kind not in ("hours", "dollars"):
        return None
    if budget.kind == "hours":
        return budget.hours * 3600
    return budget.dollars / (p.gpu.price_per_hour * p.devices) * 3600


def apply_budget(p: GpuPlan, budget, batch_tokens: int, cap: int | None = None) -> GpuPlan:
    """`p` with its time, cost, tokens and steps those of the budget (tokens at most `cap`,
    train.max_tokens, which ends the run first when it is reached first)."""
    seconds = budget_seconds(budget, p)
    if seconds is None or p.tok_s is None:  # no time budget, or nothing runs on this GPU
        return p
    tokens = int(p.tok_s * seconds)
    if cap is not None and tokens > cap:
        tokens, seconds = cap, cap / p.tok_s
    return replace(
        p,
        hours=seconds / 3600,
        dollars=seconds / 3600 * p.gpu.price_per_hour * p.devices,
        budget_tokens=tokens,
        budget_steps=tokens // batch_tokens,
    )

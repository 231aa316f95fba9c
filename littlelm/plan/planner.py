"""`littlelm plan`: put the memory model, the trace, the catalog and the costs together.

plan = make_plan(load_run("run.yaml"), load_catalog())
print_plan(plan)        # littlelm.plan.report
"""

from __future__ import annotations

import contextlib
import json
import statistics
from dataclasses import dataclass, field, replace

import torch

from littlelm.config import validate
from littlelm.errors import ConfigError
from littlelm.hardware import native_bf16
from littlelm.model.gpt import flops_per_token
from littlelm.plan import memory as mem
from littlelm.plan import speed
from littlelm.plan.accounting import CATEGORIES
from littlelm.plan.bench import current_rss
from littlelm.plan.budget import apply_budget
from littlelm.plan.catalog import Catalog
from littlelm.plan.cost import GIB, GpuPlan, plan_gpu
from littlelm.plan.measurements import (
    load_measurements,
    measured_memory,
    speed_calibration,
    speed_calibrations,
    workload_key,
)
from littlelm.plan.parallel import fsdp_categories, fsdp_peak
from littlelm.plan.probe import device_key, measure_rates_many
from littlelm.plan.shapes import Dims
from littlelm.plan.trace import TraceResult, trace_step, traced_dims
from littlelm.schema import RunConfig

# Where the prediction rests on something the CPU trace cannot check.
KERNEL_NOTES = {
    "backward": "FlashAttention's backward on CUDA adds an fp32 dq accumulator (a backward "
    "moment the CPU trace does not have); the model's own ops keep the same tensors on both",
    "fp8": "model.fp8: planned as bf16 linears (an upper bound); FP8 keeps 1-byte copies of "
    "each linear's input and weight instead, and its backward temporaries are not modelled",
    "adamw_8bit": "optimizer.adamw_8bit: bitsandbytes runs on CUDA only, so its optimizer state "
    "is analytic (2 bytes per parameter of tensors of 4096+ elements); the trace runs fp32 AdamW",
}


@dataclass
class Plan:
    cfg: object
    dims: Dims
    estimate: mem.Estimate  # CUDA kernels: the prediction for a GPU
    cpu_estimate: mem.Estimate  # CPU kernels, of what the trace runs: checked against it
    trace: TraceResult | None
    gpus: list[GpuPlan]
    tokens: int
    devices: int
    resume: dict[str, float]  # GiB: device during resume, host RAM during resume
    notes: list[str] = field(default_factory=list)
    local: LocalPlan | None = None  # `--device cpu`: the machine in hand

    @property
    def flops_per_token(self) -> int:
        return flops_per_token(self.dims.model, self.dims.seq_len)

    @property
    def fsdp(self) -> bool:
        return self.dims.strategy == "fsdp" and self.devices > 1

    def per_rank_categories(self) -> dict[str, int]:
        """Bytes per category on one GPU (FSDP splits the state; DDP's sharded optimizers are
        in the estimate already)."""
        if self.fsdp:
            return fsdp_categories(self.dims, self.devices)
        return dict(self.estimate.categories)

    def per_rank_peak(self) -> int:
        return fsdp_peak(self.dims, self.devices) if self.fsdp else self.estimate.peak

    def trace_check(self) -> dict[str, float | None]:
        """trace / analytic (CPU kernels) for every category both compute."""
        if self.trace is None:
            return {}
        out: dict[str, float | None] = {}
        for k in CATEGORIES:
            a, t = self.cpu_estimate.categories[k], self.trace.categories[k]
            out[k] = (t / a) if a else (None if t == 0 else float("inf"))
        return out


MAX_LAYERS = 1024  # far past littlelm's range (GPT-3 175B has 96); per-layer work grows with it
TRACE_MAX_LAYERS = 128  # the trace runs each layer on meta tensors: about 0.08 s a layer


def check_plannable(cfg, trace: bool) -> bool:
    """Refuse a model too deep to plan in seconds; returns whether to trace it."""
    n = cfg.model.n_layer
    if n > MAX_LAYERS:
        raise ConfigError(
            [
                f"model.n_layer {n:,} is beyond what littlelm plans (at most "
                f"{MAX_LAYERS:,} layers; models of 10M-4B parameters have 4-48); lower it"
            ]
        )
    if trace and n > TRACE_MAX_LAYERS:
        import warnings

        warnings.warn(
            f"model.n_layer {n} > {TRACE_MAX_LAYERS}: the trace would take minutes, so this plan "
            "uses the analytic estimate only (as with --no-trace)",
            stacklevel=2,
        )
        return False
    return trace


def make_plan(
    cfg,
    catalog: Catalog,
    gpu_names: list[str] | None = None,
    tokens: int | None = None,
    devices: int = 1,
    trace: bool = True,
    local: bool = False,
    price_per_hour: float = 0.0,
) -> Plan:
    trace = check_plannable(cfg, trace)  # plan answers or refuses any config in seconds
    here = Dims.of(cfg.with_precision(native_bf16("cpu")))  # `--device cpu`: this CPU's choice
    cfg = cfg.with_precision(True)  # every GPU in the catalog multiplies bf16 in hardware
    d = Dims.of(cfg)
    b = cfg.train.budget
    timed = tokens is None and b is not None and b.kind in ("hours", "dollars")
    tokens = tokens or cfg.train.max_tokens or 1
    records = load_measurements()
    key = workload_key(cfg)
    gpus = [
        plan_gpu(d, g, catalog, tokens, devices, speed_calibration(records, gpu=g.name))
        for g in catalog.select(gpu_names)
    ]
    if timed:  # what the budget buys on each GPU (plan/budget.py)
        cap = cfg.train.max_tokens  # train.max_steps, when also set, stays a cap
        gpus = [apply_budget(p, b, cfg.train.batch_tokens, cap) for p in gpus]
    for p in gpus:
        p.measured = measured_memory(records, p.gpu.name, key, d.micro_batch)
    # cheapest per token first among those that run at all; those that cannot run last
    gpus.sort(key=lambda p: (p.tok_s is None, p.dollars_per_btok or 0.0, not p.fits))
    estimate = mem.estimate(d, "cuda")
    return Plan(
        cfg=cfg,
        dims=d,
        estimate=estimate,
        cpu_estimate=mem.estimate(
            replace(traced_dims(d), world=1), "cpu"
        ),  # the trace is one process
        trace=trace_step(cfg) if trace else None,
        gpus=gpus,
        tokens=tokens,
        devices=devices,
        resume=resume_memory(estimate, d, devices),
        notes=notes_for(cfg),
        local=local_plan(here, tokens, records, price_per_hour) if local else None,
    )


@dataclass
class LocalPlan:
    """The run on the machine in hand (the CPU): rates probed here at the run's shapes."""

    device: str
    tok_s: float
    source: str
    parts: dict[str, float]  # seconds per step by kind of work
    tensor_peak: int  # bytes (CPU kernels)
    process_peak: int  # bytes: resident memory at start + the tensor peak x the heap margin
    hours: float
    dollars: float
    rates: speed.Rates  # as probed, with the bench calibration if one applied
    precision: str = "bf16"  # what `precision: auto` computes in on this machine
    heap_margin: float = 1.0  # RSS growth per byte of tensor peak (mem.CPU_HEAP_MARGIN or a bench)
    memory_source: str = ""


@dataclass
class LocalCalibration:
    """What the benches on this machine say about the step model and the heap, with the rates of
    the shapes planned, probed in the same rounds as the benches' shapes."""

    rates: speed.Rates
    speed: float = 1.0  # measured / modelled step time
    heap: float = mem.CPU_HEAP_MARGIN
    source: str = ""
    benches: int = 0  # how many calibrated it


# benches on this machine whose median calibrates it: one 4-step bench on a shared CPU reads up
# to 15% slow now and then, and the newest alone then moved every calibrated plan by as much
LOCAL_BENCHES = 3


def local_calibration(records: list[dict], key: str, d: Dims) -> LocalCalibration:
    """The median over the newest LOCAL_BENCHES benches on this machine of their step time
    against the step model at each bench's own shapes, with rates probed now, in the same
    rounds as the rates of `d` (the shapes planned): the probe's level on a shared machine
    drifts from minute to minute, so each ratio is taken between probes of one moment, not with
    the bench's own probe. The heap margin is their median too."""
    benches = speed_calibrations(records, device_key=key)[-LOCAL_BENCHES:]
    shapes: dict[str, Dims] = {}  # one probe per distinct shape a bench ran
    for bench in benches:
        if bench.get("config") and bench.get("step_s"):
            shape = json.dumps(bench["config"], sort_keys=True)
            with contextlib.suppress(ConfigError):  # another littlelm's config: its own ratio
                shapes.setdefault(shape, Dims.of(validate(RunConfig, bench["config"])))
    rates, *probed = measure_rates_many([d, *shapes.values()])
    modelled = {s: speed.step_time(bd, r).raw for (s, bd), r in zip(shapes.items(), probed)}
    if not benches:
        return LocalCalibration(rates)
    ratios, heaps, stale = [], [], 0
    for bench in benches:
        shape = json.dumps(bench.get("config"), sort_keys=True)
        if shape in modelled:
            ratios.append(bench["step_s"] / modelled[shape])
        else:  # older benches recorded no config; another littlelm's may not validate here
            ratios.append(bench["speed_ratio"])
            stale += 1
        grown = (bench.get("peak_rss") or 0) - (bench.get("rss_at_start") or 0)
        if grown > 0 and bench.get("peak_tensor") and bench.get("rss_peak_is_window"):
            heaps.append(grown / bench["peak_tensor"])
    heap = statistics.median(heaps) if heaps else mem.CPU_HEAP_MARGIN
    newest = benches[-1]
    when = str(newest.get("time", ""))[:10]
    if len(benches) == 1:
        source = f"calibrated by bench of {newest.get('run')} {when}"
    else:
        runs = ", ".join(sorted({str(b.get("run")) for b in benches}))
        source = f"calibrated by the median of {len(benches)} benches ({runs}; newest {when})"
    if stale:
        what = "its" if len(benches) == 1 else f"{stale} by their"
        source += f" ({what} own probe's ratio: no config this littlelm reads)"
    ratio = statistics.median(ratios)
    return LocalCalibration(replace(rates, calibration=ratio), ratio, heap, source, len(benches))


def local_plan(
    d: Dims, tokens: int, records: list[dict], price_per_hour: float, base_rss: int | None = None
) -> LocalPlan:
    """`base_rss`: the process's resident set before training (default: now, before the probes
    leave their garbage in the heap)."""
    base = base_rss if base_rss is not None else current_rss() or 0
    key = device_key(torch.device("cpu"))
    cal = local_calibration(records, key, d)
    rates = cal.rates
    if cal.source:
        source = f"{rates.source}, {cal.source}"
    else:
        source = f"{rates.source}; uncalibrated (run `littlelm bench` here to calibrate)"
    st = speed.step_time(d, rates)
    tok_s = d.tokens * d.grad_accum / st.seconds
    e = mem.estimate(d, "cpu")
    resume = e.categories[mem.PARAMS] + e.categories[mem.STATE]
    hours = tokens / tok_s / 3600
    return LocalPlan(
        device=key,
        tok_s=tok_s,
        source=source,
        parts={k: v * st.calibration for k, v in st.parts.items()},
        tensor_peak=e.peak,
        process_peak=base + round(max(e.peak * cal.heap, 2 * resume)),
        hours=hours,
        dollars=hours * price_per_hour,
        rates=rates,
        precision="bf16" if d.bf16 else "fp32",
        heap_margin=cal.heap,
        memory_source=(
            f"resident set at start + tensor peak x heap margin {cal.heap:.2f} "
            + (
                "(glibc's, measured on the demo)"
                if not cal.benches
                else "(measured by that bench)"
                if cal.benches == 1
                else "(the median those benches measured)"
            )
        ),
    )


def resume_memory(e: mem.Estimate, d: Dims, devices: int = 1) -> dict:
    """GiB on each GPU and in host RAM per node (up to 8 ranks) while a resume loads."""
    ranks = min(devices, 8)
    shards = devices if d.strategy == "fsdp" and devices > 1 else 1
    cache, private = mem.resume_host_bytes(e, d, ranks)
    return {
        "device_gib": mem.resume_device_bytes(e) / shards / GIB,
        "host_gib": (cache + private) / GIB,
        "host_page_cache_gib": cache / GIB,
        "host_private_gib": private / GIB,
        "ranks_per_node": ranks,
    }


def notes_for(cfg) -> list[str]:
    m, t = cfg.model, cfg.train
    notes = [KERNEL_NOTES["backward"]]
    if m.fp8:
        notes.append(KERNEL_NOTES["fp8"])
    if cfg.optimizer.traits().adamw_8bit:
        notes.append(KERNEL_NOTES["adamw_8bit"])
    dc = cfg.distributed
    if dc.strategy == "fsdp" and (dc.world_size or 1) > 1:
        notes.append(
            f"fsdp over {dc.world_size} GPUs: the categories above are one unsharded replica; "
            "each GPU holds 1/N of parameters, gradients and optimizer state plus two gathered "
            "units (the GPU table's `needed` is per GPU; docs/distributed.md)"
        )
    elif (dc.world_size or 1) > 1:
        notes.append(
            f"ddp over {dc.world_size} GPUs: optimizer state and scratch are rank 0's share "
            f"(shard_muon={dc.shard_muon}, shard_adamw={dc.shard_adamw}); gradients live in "
            "DDP's buckets (no extra copy)"
        )
    if t.compiles("cuda"):
        notes.append(
            "train.compile: planned as eager; torch.compile usually keeps less (bench measures it)"
        )
    return notes

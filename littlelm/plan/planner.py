"""`littlelm plan`: the trace, the memory model, the catalog and the costs put together.

    plan = make_plan(load_run("run.yaml"), load_catalog())
    print_plan(plan)        # littlelm.plan.report

Memory has one reference, the trace of the real step (plan/trace.py). The analytic model
(plan/memory.py) answers what the trace would take minutes for (every micro-batch and remedy on
every GPU, FSDP's shards) and what it cannot run (8-bit AdamW), scaled by the trace's peak over
its own at the configured micro-batch; with --no-trace, or where the trace would take minutes,
it stands alone.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from littlelm.config import validate
from littlelm.errors import ConfigError
from littlelm.hardware import native_bf16
from littlelm.model.gpt import flops_per_token
from littlelm.plan import memory as mem
from littlelm.plan import speed
from littlelm.plan.cost import GIB, Catalog, GpuPlan, apply_budget, plan_gpu
from littlelm.plan.dims import Dims
from littlelm.plan.saves import CheckpointCosts
from littlelm.plan.trace import CATEGORIES, Memory, trace_step
from littlelm.schema import RunConfig

MAX_LAYERS = 1024  # far past littlelm's range (GPT-3 175B has 96); per-layer work grows with it
TRACE_MAX_LAYERS = 128  # the trace runs each layer on fake tensors: about 0.1 s a layer
# the chunked loss is traced chunk by chunk, a few ms each: 1,024 per micro-batch is 256k tokens
# at the default loss_chunk (the 3B plan has 64)
TRACE_MAX_CHUNKS = 1024
# What glibc's heap adds to a CPU run's tensors: freed blocks are kept for reuse
# (train/device.tune_cpu_allocator) and the heap fragments, so the resident set grows past the
# live tensors. Measured by bench as (peak RSS - RSS at start) / peak tensor memory in a process
# that ran nothing big before (as a training run does): 1.40-1.51 over 26 benches of the demo and
# its d-512 and seq-1024 shapes on a 2-core EPYC, fp32 (benchmarks/plan_check.py, 2026-12-01).
CPU_HEAP_MARGIN = 1.42
# benches on this machine whose median calibrates it: one 4-step bench on a shared CPU reads up
# to 15% slow now and then, and the newest alone then moved every calibrated plan by as much
LOCAL_BENCHES = 3


@dataclass
class LocalPlan:
    """The run on the machine in hand (the CPU): rates probed here at the run's shapes,
    calibrated by the benches run here."""

    device: str
    tok_s: float
    source: str
    parts: dict[str, float]  # seconds per step by kind of work
    tensor_peak: int  # bytes: the trace of this CPU's step (or the analytic model)
    process_peak: int  # bytes: resident set at start + the tensor peak x the heap margin
    resume: int  # bytes of host RAM a resume maps (weights + optimizer state)
    hours: float
    dollars: float | None  # None without a price (--price-per-hour)
    rates: speed.Rates  # as probed, with the benches' calibration if any
    price_per_hour: float | None = None  # --price-per-hour, for this machine
    precision: str = "bf16"  # what `precision: auto` computes in on this machine
    heap_margin: float = CPU_HEAP_MARGIN  # RSS growth per byte of tensor peak
    memory_source: str = ""


@dataclass
class Plan:
    cfg: RunConfig
    dims: Dims  # the run on a GPU, with the trace's scale for the analytic model
    memory: Memory  # one GPU at the configured micro-batch: the trace, or the scaled model
    analytic: Memory  # the analytic model of what the trace ran, unscaled (the trace check)
    trace: Memory | None
    gpus: list[GpuPlan]
    tokens: int
    devices: int
    resume: dict[str, float]  # GiB: device during resume, host RAM during resume
    notes: list[str] = field(default_factory=list)
    local: LocalPlan | None = None  # `--device cpu`: the machine in hand
    price_per_hour: float | None = None  # --price-per-hour: what the user pays per device-hour
    priced: list[str] = field(default_factory=list)  # the GPUs (and "this machine") it prices
    price_scope: str = ""  # those in words: "H100-SXM", "every catalog GPU and this machine"
    checkpoints: CheckpointCosts | None = None  # plan/saves.py (plan's --write-gbs)

    @property
    def flops_per_token(self) -> int:
        return flops_per_token(self.dims.model, self.dims.seq_len)

    def per_rank(self) -> tuple[dict[str, int], int]:
        """Bytes per category and the peak on one GPU (FSDP splits the state; DDP's sharded
        optimizers are in the memory already)."""
        if self.dims.strategy == "fsdp" and self.devices > 1:
            return mem.fsdp_per_gpu(self.dims, self.devices)
        return self.memory.categories, self.memory.peak

    def trace_check(self) -> dict[str, float | None]:
        """trace / analytic for every category both compute."""
        if self.trace is None:
            return {}
        out: dict[str, float | None] = {}
        for k in CATEGORIES:
            a, t = self.analytic.categories[k], self.trace.categories[k]
            out[k] = (t / a) if a else (None if t == 0 else float("inf"))
        return out


def check_plannable(cfg, trace: bool) -> bool:
    """Refuse a model too deep to plan in seconds; returns whether to trace it (not a model too
    deep or a micro-batch too long to trace in seconds: the analytic model answers those)."""
    n = cfg.model.n_layer
    if n > MAX_LAYERS:
        raise ConfigError(
            [
                f"model.n_layer {n:,} is beyond what littlelm plans (at most "
                f"{MAX_LAYERS:,} layers; models of 10M-4B parameters have 4-48); lower it"
            ]
        )
    rows = cfg.train.micro_batch_size * cfg.train.seq_len
    chunks = rows / (cfg.model.loss_rows_per_pass() or rows)
    why = None
    if chunks > TRACE_MAX_CHUNKS:
        why = (
            f"train.micro_batch_size x train.seq_len = {rows:,} tokens per micro-batch, "
            f"{chunks:,.0f} loss chunks (more than {TRACE_MAX_CHUNKS:,})"
        )
    elif n > TRACE_MAX_LAYERS:
        why = f"model.n_layer {n} > {TRACE_MAX_LAYERS}"
    if trace and why:
        warnings.warn(
            f"{why}: the trace would take minutes, so this plan uses the analytic estimate only "
            "(as with --no-trace)",
            stacklevel=2,
        )
    return trace and not why


def step_memory(cfg: RunConfig, trace: bool = True) -> tuple[Dims, Memory, Memory | None, Memory]:
    """What one GPU holds in a step of `cfg`: (its Dims, scaled so that the analytic model meets
    the trace at the configured micro-batch; the memory: the trace, or the scaled analytic model
    where the trace ran a stand-in (8-bit AdamW, one process of several) or did not run; the
    trace; the analytic model of what the trace ran, unscaled)."""
    d = Dims.of(cfg.with_precision(True))
    traced = trace_step(cfg) if trace else None
    # what trace_step runs: one process, and the optimizer's stand-in where it has one (torch's
    # AdamW for 8-bit AdamW: OptimizerConfig.traceable)
    traced_optimizer = d.optimizer.stand_in or d.optimizer
    analytic = mem.estimate(replace(d, optimizer=traced_optimizer, world=1))
    if traced is not None:
        d = replace(d, trace_scale=traced.peak / analytic.peak)
    stand_in = d.optimizer.stand_in is not None or d.world > 1
    memory = traced if traced is not None and not stand_in else mem.estimate(d)
    return d, memory, traced, analytic


def make_plan(
    cfg,
    catalog: Catalog,
    gpu_names: list[str] | None = None,
    tokens: int | None = None,
    devices: int = 1,
    trace: bool = True,
    local: bool = False,
    price_per_hour: float | None = None,
) -> Plan:
    """`price_per_hour`, what the user pays per device-hour, prices the devices named: the GPUs
    of `gpu_names` and, with `local`, this machine; with neither, every GPU of the catalog.
    The others keep the catalog's price."""
    trace = check_plannable(cfg, trace)  # plan answers or refuses any config in seconds
    here = cfg.with_precision(native_bf16("cpu"))  # `--device cpu`: this CPU's choice
    cfg = cfg.with_precision(True)  # every GPU in the catalog multiplies bf16 in hardware
    d, memory, traced, analytic = step_memory(cfg, trace)
    b = cfg.train.budget
    timed = tokens is None and b is not None and b.kind in ("hours", "dollars")
    tokens = tokens or cfg.train.max_tokens or 1
    records = speed.load_measurements()
    key = speed.workload_key(cfg)
    gpus, priced = [], []
    for g in catalog.select(gpu_names):
        if price_per_hour is not None and (gpu_names or not local):
            g = g.model_copy(
                update={
                    "price_per_hour": price_per_hour,
                    "price_source": "--price-per-hour",
                    "price_date": "",
                }
            )
            priced.append(g.name)
        bench = speed.speed_calibrations(records, gpu=g.name)
        p = plan_gpu(d, g, catalog, tokens, devices, bench[-1] if bench else None)
        if timed:  # what the budget buys on this GPU (train.max_steps, when also set, caps it)
            p = apply_budget(p, b, cfg.train.batch_tokens, cfg.train.max_tokens)
        p.measured = speed.measured_memory(records, g.name, key, d.micro_batch)
        gpus.append(p)
    # cheapest per token first among those that run at all; those that cannot run last
    gpus.sort(key=lambda p: (p.tok_s is None, p.dollars_per_btok or 0.0, not p.fits))
    return Plan(
        cfg=cfg,
        dims=d,
        memory=memory,
        analytic=analytic,
        trace=traced,
        gpus=gpus,
        tokens=tokens,
        devices=devices,
        resume=resume_memory(memory, d, devices),
        notes=notes_for(cfg),
        local=local_plan(here, tokens, records, price_per_hour, trace=trace) if local else None,
        price_per_hour=price_per_hour,
        priced=[*priced, *(["this machine"] if local and price_per_hour is not None else [])],
        price_scope=" and ".join(
            [
                *([", ".join(priced) if gpu_names else "every catalog GPU"] if priced else []),
                *(["this machine"] if local and price_per_hour is not None else []),
            ]
        ),
    )


def local_calibration(records: list[dict], key: str, d: Dims) -> tuple[speed.Rates, list[dict]]:
    """This CPU's rates at the shapes of `d`, calibrated by the median over the newest
    LOCAL_BENCHES benches here (whose config this littlelm reads) of their step time over the
    step model at each bench's own shapes, with rates probed now in the same rounds as those of
    `d`: a shared machine's speed drifts from minute to minute, so each ratio is taken between
    probes of one moment, not with the bench's own probe. Returns the rates and the benches."""
    benches: list[dict] = []
    shapes: dict[str, Dims] = {}  # one probe per distinct shape a bench ran
    for bench in reversed(speed.speed_calibrations(records, device_key=key)):
        if len(benches) == LOCAL_BENCHES:
            break
        if not isinstance(bench.get("config"), dict) or not bench.get("step_s"):
            continue  # an older bench, which recorded no config
        shape = json.dumps(bench["config"], sort_keys=True)
        if shape not in shapes:
            try:
                shapes[shape] = Dims.of(validate(RunConfig, bench["config"]))
            except ConfigError:  # another littlelm's config
                continue
        benches.insert(0, {**bench, "shape": shape})
    rates, *probed = speed.measure_rates([d, *shapes.values()])
    if not benches:
        return rates, []
    modelled = {s: speed.step_time(bd, r).raw for (s, bd), r in zip(shapes.items(), probed)}
    ratio = statistics.median(b["step_s"] / modelled[b["shape"]] for b in benches)
    return replace(rates, calibration=ratio), benches


def heap_margin(benches: list[dict]) -> float:
    """The median RSS growth per byte of tensor peak the benches here measured (where they could
    reset the peak RSS at their start), else CPU_HEAP_MARGIN: it differs between machines and
    their state (1.40-1.51 on 2026-12-01, 1.62-1.69 on 2026-12-02 on a CPU of the same name)."""
    heaps = [
        (b["peak_rss"] - b["rss_at_start"]) / b["peak_tensor"]
        for b in benches
        if b.get("rss_peak_is_window")
        and b.get("peak_tensor")
        and (b.get("peak_rss") or 0) > (b.get("rss_at_start") or 0)
    ]
    return statistics.median(heaps) if heaps else CPU_HEAP_MARGIN


def local_plan(
    cfg: RunConfig,
    tokens: int,
    records: list[dict],
    price_per_hour: float | None,
    base_rss: int | None = None,
    trace: bool = True,
) -> LocalPlan:
    """`cfg` with the precision this CPU computes in. `base_rss`: the process's resident set
    before training (default: now, before the probes leave their garbage in the heap). With no
    `records` this is bench's own prediction (uncalibrated)."""
    base = base_rss if base_rss is not None else current_rss() or 0
    d = Dims.of(cfg)
    key = speed.device_key(torch.device("cpu"))
    rates, benches = local_calibration(records, key, d)
    if benches:
        runs = ", ".join(sorted({str(b.get("run")) for b in benches}))
        when = str(benches[-1].get("time", ""))[:10]
        what = "bench" if len(benches) == 1 else f"the median of {len(benches)} benches"
        source = f"{rates.source}, calibrated by {what} ({runs}; newest {when})"
    else:
        source = f"{rates.source}; uncalibrated (run `littlelm bench` here to calibrate)"
    st = speed.step_time(d, rates)
    tok_s = d.tokens * d.grad_accum / st.seconds
    tensors = trace_step(cfg, gpu=False) if trace else mem.estimate(d)
    resume = mem.checkpoint_bytes(tensors)
    heap = heap_margin(benches)
    hours = tokens / tok_s / 3600
    return LocalPlan(
        device=key,
        tok_s=tok_s,
        source=source,
        parts={k: v * st.calibration for k, v in st.parts.items()},
        tensor_peak=tensors.peak,
        # a resume reads the checkpoint, which may outgrow the step (the whole of it twice)
        process_peak=base + round(max(tensors.peak * heap, 2 * resume)),
        resume=resume,
        hours=hours,
        dollars=hours * price_per_hour if price_per_hour is not None else None,
        rates=rates,
        price_per_hour=price_per_hour,
        precision="bf16" if d.bf16 else "fp32",
        heap_margin=heap,
        memory_source=f"resident set at start + tensor peak x heap margin {heap:.2f} ("
        + ("the benches' median" if benches else "glibc's, measured on the demo")
        + f"); tensor peak: the {tensors.source}",
    )


def proc_status_bytes(name: str) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    return None


def current_rss() -> int | None:
    return proc_status_bytes("VmRSS")


def resume_memory(e: Memory, d: Dims, devices: int = 1) -> dict:
    """GiB on each GPU and in host RAM per node (up to 8 ranks) while a resume loads. The ranks
    of a node memory-map the same checkpoint, so the page cache holds it once (pages the kernel
    may drop under pressure), and each rank owns only the tensor it is copying to its GPU (the
    largest, in fp32). Measured on the CPU at 100M parameters: peak RSS per rank 0.49x at 2
    ranks (0.56x at 1) of reading the whole checkpoint (benchmarks/resume_memory.py)."""
    ranks = min(devices, 8)
    shards = devices if d.strategy == "fsdp" and devices > 1 else 1
    cache = mem.checkpoint_bytes(e)
    private = max((p.numel for p in d.params), default=0) * 4 * ranks
    return {
        "device_gib": cache / shards / GIB,
        "host_gib": (cache + private) / GIB,
        "host_page_cache_gib": cache / GIB,
        "host_private_gib": private / GIB,
        "ranks_per_node": ranks,
    }


def notes_for(cfg) -> list[str]:
    """Where the prediction rests on something the trace cannot check."""
    notes = [
        "attention is traced as FlashAttention's tensors (its output, log-sum-exp and backward "
        "buffers); workspaces inside a GPU's kernels are not seen"
    ]
    if cfg.model.fp8:
        notes.append(
            "model.fp8: planned as bf16 linears (an upper bound); FP8 keeps 1-byte copies of "
            "each linear's input and weight instead, and its backward temporaries are not modelled"
        )
    notes += cfg.optimizer.traits().notes
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
    if cfg.train.compiles("cuda"):
        notes.append(
            "train.compile: planned as eager; torch.compile usually keeps less (bench measures it)"
        )
    return notes

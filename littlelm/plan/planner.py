"""`littlelm plan`: put the memory model, the trace, the catalog and the costs together.

plan = make_plan(load_run("run.yaml"), load_catalog())
print_plan(plan)        # littlelm.plan.report
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from littlelm.errors import ConfigError
from littlelm.model.backend import compile_on, run_backend
from littlelm.model.gpt import flops_per_token
from littlelm.plan import memory as mem
from littlelm.plan.accounting import CATEGORIES
from littlelm.plan.budget import apply_budget
from littlelm.plan.catalog import Catalog
from littlelm.plan.cost import GIB, GpuPlan, plan_gpu
from littlelm.plan.measurements import (
    load_measurements,
    measured_memory,
    measured_mfu,
    workload_key,
)
from littlelm.plan.shapes import Dims
from littlelm.plan.trace import TraceResult, trace_step, traced_dims

SMALL_MODEL = 200_000_000  # parameters below which the MFU assumptions are optimistic

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

    @property
    def flops_per_token(self) -> int:
        return flops_per_token(self.dims.model, self.dims.seq_len)

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
) -> Plan:
    trace = check_plannable(cfg, trace)  # plan answers or refuses any config in seconds
    d = Dims.of(cfg)
    b = cfg.train.budget
    timed = tokens is None and b is not None and b.kind in ("hours", "dollars")
    tokens = tokens or cfg.train.max_tokens or 1
    records = load_measurements()
    key = workload_key(cfg)
    gpus = [
        plan_gpu(d, g, catalog, tokens, devices, measured_mfu(records, g.name, key))
        for g in catalog.select(gpu_names)
    ]
    if timed:  # what the budget buys on each GPU (plan/budget.py)
        cap = cfg.train.max_tokens  # train.max_steps, when also set, stays a cap
        gpus = [apply_budget(p, b, cfg.train.batch_tokens, cap) for p in gpus]
    for p in gpus:
        p.measured = measured_memory(records, p.gpu.name, key, d.micro_batch)
    gpus.sort(key=lambda p: (not p.fits and p.best_micro_batch is None, not p.fits, p.dollars))
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
        resume=resume_memory(estimate),
        notes=notes_for(cfg),
    )


def resume_memory(e: mem.Estimate) -> dict[str, float]:
    """GiB on the GPU and in host RAM while a resume loads the checkpoint."""
    return {
        "device_gib": mem.resume_device_bytes(e) / GIB,
        "host_gib": mem.resume_host_bytes(e) / GIB,
    }


def notes_for(cfg) -> list[str]:
    m, t = cfg.model, cfg.train
    notes = [KERNEL_NOTES["backward"]]
    if m.fp8:
        notes.append(KERNEL_NOTES["fp8"])
    if cfg.optimizer.traits().adamw_8bit:
        notes.append(KERNEL_NOTES["adamw_8bit"])
    if Dims.of(cfg).n_params < SMALL_MODEL:
        notes.append(
            "the catalog's MFU assumptions are for 1B+ models; a model this small runs far below "
            "them on a GPU (launch overheads): run `littlelm bench` there to measure it"
        )
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
    if compile_on(t.compile, run_backend(cfg.model, "cuda")):
        notes.append(
            "train.compile: planned as eager; torch.compile usually keeps less (bench measures it)"
        )
    return notes

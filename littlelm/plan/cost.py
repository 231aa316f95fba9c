"""Does it fit, how fast, how much: one GPU of the catalog against one planned run.

Pure functions of a resolved config's `Dims`, a catalog entry and the catalog's defaults:

    needed   = tensor peak x (1 + allocator margin) + CUDA context and workspaces
    tokens/s = MFU x peak FLOP/s / FLOPs per token   (per GPU; x devices for data parallel)
    cost     = hours x price x devices
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from littlelm.model.gpt import flops_per_token
from littlelm.plan import memory as mem
from littlelm.plan.catalog import GPU, Catalog
from littlelm.plan.parallel import ddp_bucket_bytes, fsdp_peak
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
    tok_s: float  # all devices, at the micro-batch that runs
    mfu: float
    mfu_source: str  # "assumed" or "measured <date>"
    hours: float
    dollars: float
    dollars_per_btok: float
    remedies: list[Remedy] = field(default_factory=list)


def device_lines(d: Dims, gpu: GPU, catalog: Catalog, devices: int = 1) -> dict[str, float]:
    """The memory budget of one GPU in GiB: tensor peak, allocator margin, context."""
    e = mem.estimate(d, "cuda")
    buckets = ddp_bucket_bytes(d, devices)
    step_peak = e.peak + buckets
    resume = mem.resume_device_bytes(e)
    tensor_peak = max(step_peak, resume)
    margin = tensor_peak * catalog.defaults.allocator_margin
    return {
        "tensor peak": tensor_peak / GIB,
        "DDP gradient buckets": buckets / GIB,
        "resume spike": (tensor_peak - step_peak) / GIB,
        "allocator margin": margin / GIB,
        "CUDA context & workspaces": catalog.context_gib(gpu),
        "needed": (tensor_peak + margin) / GIB + catalog.context_gib(gpu),
    }


def needed_gib(d: Dims, gpu: GPU, catalog: Catalog, devices: int = 1) -> float:
    return device_lines(d, gpu, catalog, devices)["needed"]


def micro_batch_options(d: Dims, devices: int = 1) -> list[int]:
    """Micro-batch sizes that keep the tokens per optimizer step exactly (divisors)."""
    seqs = d.micro_batch * d.grad_accum  # sequences per device per step
    return [m for m in range(1, seqs + 1) if seqs % m == 0]


def largest_fitting(d: Dims, gpu: GPU, catalog: Catalog, devices: int = 1) -> int | None:
    fitting = [
        m
        for m in micro_batch_options(d, devices)
        if needed_gib(d.with_micro_batch(m), gpu, catalog, devices) <= gpu.memory_gib
    ]
    return max(fitting) if fitting else None


def peak_tflops(gpu: GPU, d: Dims) -> float:
    return gpu.bf16_tflops if d.bf16 else gpu.fp32_tflops


def tokens_per_second(d: Dims, gpu: GPU, mfu: float) -> float:
    fpt = flops_per_token(d.model, d.seq_len)
    return mfu * peak_tflops(gpu, d) * 1e12 / fpt


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
    mfu = measured["mfu"] if measured else gpu.mfu
    source = f"measured {measured['time'][:10]}" if measured else "assumed"
    tok_s = tokens_per_second(d, gpu, mfu) * devices
    hours = tokens / tok_s / 3600
    price = gpu.price_per_hour * devices
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
        tok_s=tok_s,
        mfu=mfu,
        mfu_source=source,
        hours=hours,
        dollars=hours * price,
        dollars_per_btok=price / (tok_s * 3600) * 1e9,
        remedies=[] if fits else remedies(d, gpu, catalog, devices),
    )


def remedies(d: Dims, gpu: GPU, catalog: Catalog, devices: int = 1) -> list[Remedy]:
    """Each change that lowers memory, with its predicted saving at the configured batch."""
    base = needed_gib(d, gpu, catalog, devices)
    out: list[Remedy] = []

    def add(name: str, need: float, note: str = "") -> None:
        out.append(Remedy(name, need, base - need, need <= gpu.memory_gib, note))

    if d.optimizer == "adamw":
        muon = replace(d, optimizer="muon", nesterov=True)
        add(
            "optimizer.name=muon",
            needed_gib(muon, gpu, catalog, devices),
            "Muon keeps one fp32 buffer per matrix instead of AdamW's two",
        )
    best = largest_fitting(d, gpu, catalog, devices)
    small = best or 1
    if small < d.micro_batch:
        dm = d.with_micro_batch(small)
        add(
            f"train.micro_batch_size={small}",
            needed_gib(dm, gpu, catalog, devices),
            f"grad_accum {d.grad_accum} -> {dm.grad_accum} keeps the tokens per step",
        )
    for n in FSDP_SIZES:
        per_gpu = fsdp_peak(d, n) * (1 + catalog.defaults.allocator_margin) / GIB
        need = per_gpu + catalog.context_gib(gpu)
        if need <= gpu.memory_gib or n == FSDP_SIZES[-1]:
            add(f"FSDP over {n} GPUs", need, "analytic: littlelm's FSDP arrives later")
            break
    return sorted(out, key=lambda r: -r.saving_gib)

"""What checkpoints cost a run: the plan's line for them (`littlelm plan --write-gbs`).

A checkpoint holds the weights and the optimizer state (plan/memory.py's checkpoint_bytes). A
synchronous save holds training for size / write bandwidth; a background save
(checkpoint.async_save, train/checkpoint/writer.py) holds it only while the state is copied into
host memory, which it keeps for the run (one copy, on rank 0's node), and writes meanwhile: a
save takes longer than an interval of training only on a disk too slow for the interval, and the
saves due meanwhile are skipped. The share of the run's hours and dollars is the time training
waits at `checkpoint.every`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from littlelm.plan import memory as mem
from littlelm.plan.cost import GIB

# The write bandwidth when --write-gbs is not given: the 100-300 MB/s of the NAS and distributed
# filesystems runs checkpoint to (an assumption, not a measurement: local NVMe writes 1-3 GB/s)
DEFAULT_WRITE_GBS = 0.2
WRITE_SOURCE = "assumed: a network filesystem's 100-300 MB/s; --write-gbs sets yours"
# Staging copies the state from the GPU into pinned host memory over PCIe: an assumed 10 GB/s
# (a PCIe 4.0 x16 link moves about 25 GB/s one way; pageable buffers and contention halve it)
STAGE_GBS = 10.0
STAGE_SOURCE = "assumed 10 GB/s GPU-to-host over PCIe"


@dataclass
class CheckpointCosts:
    size_bytes: int  # one checkpoint: weights + optimizer state
    host_bytes: int  # the staged copy a background save keeps in host RAM (rank 0's node)
    every: int  # checkpoint.every (0: only at the end)
    saves: int  # in the whole run, the final one included
    write_gbs: float
    write_source: str
    write_s: float  # one save's write: size / bandwidth
    stage_s: float  # one background save's wait: the copy to host memory
    gpu: str | None = None  # the GPU the shares are of (the plan's cheapest that runs), else None
    run_hours: float | None = None  # that GPU's training hours, saves aside
    sync_hours: float | None = None  # hours training waits for synchronous saves
    async_hours: float | None = None  # ... for background saves
    sync_share: float | None = None  # of the run's hours (and dollars), saves included
    async_share: float | None = None
    sync_dollars: float | None = None  # what those hours cost on that GPU
    async_dollars: float | None = None
    step_s: float | None = None  # one training step on that GPU
    skipped: bool = False  # a write outlasts an interval: background saves meanwhile skip


def checkpoint_costs(plan, write_gbs: float | None = None) -> CheckpointCosts:
    """The checkpoint costs of `plan` (plan/planner.py's Plan) at `write_gbs` GB/s."""
    cfg = plan.cfg
    size = mem.checkpoint_bytes(plan.memory)
    gbs = write_gbs or DEFAULT_WRITE_GBS
    source = "--write-gbs" if write_gbs else WRITE_SOURCE
    batch = cfg.train.batch_tokens or 1
    steps = math.ceil(plan.tokens / batch)
    every = cfg.checkpoint.every
    periodic = (steps - 1) // every if every else 0  # none at the last step: the final save is it
    saves = periodic + (1 if cfg.checkpoint.at_end else 0)
    write_s, stage_s = size / (gbs * 1e9), size / (STAGE_GBS * 1e9)
    gpu = next((p for p in plan.gpus if p.fits and p.hours), None)
    costs = CheckpointCosts(size, size, every, saves, gbs, source, write_s, stage_s)
    if gpu is None:
        return costs
    hours, per_hour = gpu.hours, (gpu.dollars / gpu.hours if gpu.dollars else None)
    sync_h, async_h = saves * write_s / 3600, saves * stage_s / 3600
    step_s = batch / gpu.tok_s if gpu.tok_s else None
    costs.gpu, costs.run_hours, costs.step_s = gpu.gpu.name, hours, step_s
    costs.sync_hours, costs.async_hours = sync_h, async_h
    costs.sync_share, costs.async_share = sync_h / (hours + sync_h), async_h / (hours + async_h)
    if per_hour is not None:
        costs.sync_dollars, costs.async_dollars = sync_h * per_hour, async_h * per_hour
    costs.skipped = bool(every and step_s and write_s > every * step_s)
    return costs


def checkpoint_line(c: CheckpointCosts) -> str:
    """The plan's checkpoint line (rich markup); the bandwidths' sources are in --json and
    docs/planning.md, so the default output stays one screen."""
    when = f"every {c.every:,} steps" if c.every else "at the end only"
    head = (
        f"checkpoints: {c.size_bytes / 1e9:.1f} GB {when}, {_dur(c.write_s)} at "
        f"{c.write_gbs:g} GB/s"
    )
    if c.gpu is None:
        return head + ". No GPU of the plan runs it, so no share of the run is given."
    dollars = lambda d: "" if d is None else f" ${d:,.0f}" if d >= 100 else f" ${d:.2f}"  # noqa: E731
    assert c.sync_share is not None and c.async_share is not None
    text = (
        f"; {c.gpu}: blocking {c.sync_share:.1%}{dollars(c.sync_dollars)}, background "
        f"{c.async_share:.2%}{dollars(c.async_dollars)}, {c.host_bytes / GIB:.1f} GiB host RAM"
    )
    if c.skipped and c.step_s:
        text += (
            f". [yellow]A write outlasts an interval ({c.every:,} steps of {c.step_s:.2f} s): "
            "background saves due meanwhile are skipped; raise checkpoint.every[/yellow]"
        )
    return head + text


def checkpoint_json(c: CheckpointCosts) -> dict:
    return {**asdict(c), "stage_source": STAGE_SOURCE}


def _dur(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _hours(h: float | None) -> str:
    return "?" if h is None else (f"{h:.2f} h" if h >= 0.1 else f"{h * 60:.1f} min")

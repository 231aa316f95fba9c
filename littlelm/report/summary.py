"""The numbers a report's summary states about one run: progress, losses, time, speed, cost."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

from littlelm.report.runs import RunData, is_number


@dataclass
class Facts:
    status: str
    step: int | None = None
    max_steps: int | None = None
    tokens: int | None = None
    train_loss: float | None = None
    val_loss: float | None = None
    val_bpb: float | None = None
    best_val_bpb: tuple[float, int] | None = None  # (value, step)
    train_time: float | None = None
    eval_time: float = 0.0
    evals: int = 0
    wall_time: float | None = None
    wall_note: str = ""
    tok_per_s: float | None = None  # tokens / training time, over the whole run
    tok_per_s_median: float | None = None  # median of the logged windows
    mfu_median: float | None = None
    device: str | None = None
    peak_flops: float | None = None
    precision: str = "bf16"  # of the peak: runs before `precision: auto` logged a bf16 peak
    params: dict | None = None
    flops_per_token: float | None = None
    cost: float | None = None
    cost_per_btok: float | None = None


def finite(values) -> list[float]:
    return [float(v) for v in values if is_number(v) and math.isfinite(v)]


def last_value(run: RunData, kind: str, key: str):
    for rec in reversed(run.records.get(kind, [])):
        if is_number(rec.get(key)):
            return rec[key]
    return None


def facts(run: RunData, price_per_hour: float | None = None) -> Facts:
    """Everything the summary says about `run`, from its records and config."""
    max_steps = run.cfg("train.max_steps")
    step = max(
        (r["step"] for recs in run.records.values() for r in recs if is_number(r.get("step"))),
        default=None,
    )
    f = Facts(status=status(run, step, max_steps), step=step, max_steps=max_steps)
    f.tokens = max(
        finite(r.get("tokens") for recs in run.records.values() for r in recs), default=None
    )
    f.train_loss = last_value(run, "train", "loss")
    f.val_loss = last_value(run, "eval", "val_loss")
    f.val_bpb = last_value(run, "eval", "val_bpb")
    bpbs = [
        (r["val_bpb"], r.get("step"))
        for r in run.records.get("eval", [])
        if finite([r.get("val_bpb")])
    ]
    f.best_val_bpb = min(bpbs, key=lambda b: b[0]) if bpbs else None
    f.train_time = max(
        finite(r.get("train_time") for recs in run.records.values() for r in recs), default=None
    )
    eval_times = finite(r.get("eval_time") for r in run.records.get("eval", []))
    f.eval_time, f.evals = sum(eval_times), len(run.records.get("eval", []))
    f.wall_time, f.wall_note = wall_time(run, f)
    if f.tokens and f.train_time:
        f.tok_per_s = f.tokens / f.train_time
    speeds = finite(r.get("tok_per_s") for r in run.records.get("train", []))
    f.tok_per_s_median = statistics.median(speeds) if speeds else None
    mfus = finite(r.get("mfu") for r in run.records.get("train", []))
    f.mfu_median = statistics.median(mfus) if mfus else None
    start = run.last("start") or {}
    f.device, f.peak_flops, f.precision = (
        start.get("device_name") or start.get("device"),
        start.get("peak_flops"),
        start.get("precision", "bf16"),
    )
    f.params, f.flops_per_token = model_size(run, start)
    if price_per_hour is not None and f.wall_time is not None:
        f.cost = price_per_hour * f.wall_time / 3600
        f.cost_per_btok = f.cost / f.tokens * 1e9 if f.tokens else None
    return f


def status(run: RunData, step: int | None, max_steps: int | None) -> str:
    if run.records.get("end"):
        end = run.last("end")
        return "finished" if end.get("finished", True) else "ended early"
    if step is not None and max_steps and step >= max_steps:
        return "finished (no end record)"
    return f"stopped or still running at step {step} of {max_steps or '?'}"


def wall_time(run: RunData, f: Facts) -> tuple[float | None, str]:
    """Seconds from each (re)start of training to its last record, summed over sessions."""
    starts = finite(r.get("time") for r in run.records.get("start", []))
    times = sorted(
        finite(r.get("time") for k, recs in run.records.items() if k != "start" for r in recs)
    )
    if starts and times:
        total, sessions = 0.0, 0
        bounds = [*sorted(starts), math.inf]
        for begin, nxt in itertools.pairwise(bounds):
            inside = [t for t in times if begin <= t < nxt]
            total += (inside[-1] - begin) if inside else 0.0
            sessions += bool(inside)  # a start that logged nothing (a logger failed) is none
        return total, f"{sessions} session(s), from the start of training to the last record"
    if f.train_time is not None:
        return (
            f.train_time + f.eval_time,
            "training + evaluation time (this run's metrics carry no wall clock; start-up and "
            "checkpoints are not included)",
        )
    return None, "not recorded"


def model_size(run: RunData, start: dict) -> tuple[dict | None, float | None]:
    """Parameter counts and FLOPs per token: from the run's start record, else rebuilt from
    config.yaml on the meta device (no memory, no compute)."""
    if isinstance(start.get("params"), dict):
        return start["params"], start.get("flops_per_token")
    cfg = run.run_config
    if cfg is None:
        return None, None
    import torch

    with torch.device("meta"):
        model = cfg.model.build()
    return model.param_counts(), float(model.flops_per_token(cfg.train.seq_len))

"""What calibrates the step model (plan/speed.py): public measurements and benches on disk.

For a GPU without a bench of its own, the published points of eager PyTorch training
(calibration.yaml: each a run file of the same model and its measured tokens/s):

    ratio = predicted step time / measured step time     (per point; > 1: the model is fast)
    CUDA prediction = step model / mean ratio

`littlelm bench` writes one JSON record per run to CACHE/bench/ (CACHE = $LITTLELM_CACHE or
~/.cache/littlelm) and a copy into the run directory. Its `speed_ratio` (measured step time over
the step model's) calibrates the plan of any run on the same GPU model (catalog key) or the same
machine (`probe.device_key`); its memory figures apply to the same workload (model shape,
sequence length, precision and compile: `workload_key`) and micro-batch.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from pydantic import Field

from littlelm.config import Cfg, read_yaml, to_tree
from littlelm.data.cache import cache_root, digest
from littlelm.plan import speed
from littlelm.plan.catalog import Catalog
from littlelm.plan.shapes import Dims
from littlelm.schema import load_run

POINTS = Path(__file__).with_name("calibration.yaml")
PLANS = Path(__file__).parent.parent / "configs" / "plans"


class Point(Cfg):
    """One published measurement."""

    name: str = Field(..., description="What was measured, in a few words.")
    config: str = Field(..., description="Run file of the same model, in configs/plans/.")
    gpu: str = Field(..., description="Catalog key of the GPU it ran on.")
    overrides: dict[str, float] = Field(
        default_factory=dict, description="Catalog fields of that GPU's variant that differ."
    )
    devices: int = Field(1, description="Data-parallel GPUs.", ge=1)
    recompute: float = Field(0.0, description="Fraction of the forward recomputed.", ge=0, le=1)
    tokens_per_s_per_gpu: float = Field(..., description="Measured speed per GPU.", gt=0)
    source: str = Field(..., description="Where the figure is published.")


@dataclass(frozen=True)
class Calibration:
    ratio: float  # predicted / measured step time (divide predictions' speed by it)
    source: str


def load_points(path: Path = POINTS) -> list[Point]:
    return [Point(**p) for p in read_yaml(path).get("points") or []]


def point_ratio(p: Point, catalog: Catalog) -> float:
    """The step model's tokens/s for the point over the measured tokens/s."""
    cfg = load_run(PLANS / p.config, world_size=1)
    d = replace(Dims.of(cfg), world=p.devices)
    gpu = catalog.gpus[p.gpu].model_copy(update=p.overrides)
    rates = speed.catalog_rates(gpu, catalog, d)
    st = speed.step_time(d, rates, p.devices, p.recompute)
    predicted = d.tokens * d.grad_accum / st.raw
    return predicted / p.tokens_per_s_per_gpu


@cache
def _cuda(catalog_id: int, catalog: Catalog) -> Calibration:
    points = load_points()
    ratios = [point_ratio(p, catalog) for p in points]
    if not ratios:
        return Calibration(1.0, "uncalibrated ceilings")
    mean = sum(ratios) / len(ratios)
    names = "; ".join(f"{p.name} ({r:.2f}x)" for p, r in zip(points, ratios))
    return Calibration(mean, f"calibrated from {names}")


def cuda_calibration(catalog: Catalog) -> Calibration:
    """The mean ratio of the packaged points, computed once per catalog."""
    return _cuda(id(catalog), catalog)


# ----------------------------------------------------------------------------------------------
# Bench records


def workload_key(cfg) -> str:
    """What MFU depends on: the model's shape and features, seq_len, precision, compile."""
    t = cfg.train
    return digest(
        {
            "model": to_tree(cfg.model),
            "seq_len": t.seq_len,
            "precision": "bf16" if t.precision == "auto" else t.precision,  # as plans GPUs
            "compile": t.compile,
        }
    )


def bench_dir() -> Path:
    return cache_root() / "bench"


def save_measurement(record: dict, run_dir: Path | None = None) -> Path:
    """Write `record` (plus a timestamp) to the bench cache and the run directory."""
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **record}
    stamp = record["time"].replace(":", "")
    who = str(record.get("gpu") or record["device"])
    name = f"{stamp}-{who}-{digest(record)[:8]}.json".replace(" ", "_").replace("/", "_")
    path = bench_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=1)
    path.write_text(text)
    if run_dir is not None:
        with contextlib.suppress(OSError):
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "bench.json").write_text(text)
    return path


def load_measurements(directory: Path | None = None) -> list[dict]:
    """Every readable measurement, oldest first (unreadable files are skipped)."""
    d = directory or bench_dir()
    out = []
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            rec = json.loads(f.read_text())
            if isinstance(rec, dict) and ("mfu" in rec or "speed_ratio" in rec):
                out.append(rec)
    return sorted(out, key=lambda r: str(r.get("time", "")))


def speed_calibrations(
    records: list[dict], gpu: str | None = None, device_key: str | None = None
) -> list[dict]:
    """The measurements on this GPU (catalog key) or this machine (`probe.device_key`) whose
    step time was compared with the step model's (`speed_ratio`), oldest first: each
    calibrates the step model for every workload on that device, not only the one measured."""
    return [
        r
        for r in records
        if (r.get("speed_ratio") or 0) > 0
        and ((gpu and r.get("gpu") == gpu) or (device_key and r.get("device_key") == device_key))
    ]


def measured_memory(records: list[dict], gpu: str, workload: str, micro_batch: int) -> dict | None:
    """The newest CUDA measurement of this workload at this micro-batch on `gpu`."""
    hits = [
        r
        for r in records
        if r.get("gpu") == gpu
        and r.get("workload") == workload
        and r.get("micro_batch") == micro_batch
        and r.get("peak_reserved")
    ]
    return hits[-1] if hits else None

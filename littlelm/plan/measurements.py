"""Bench measurements on disk, so that `plan` can calibrate its step model on a device it ran on.

`littlelm bench` writes one JSON file per run to CACHE/bench/ (CACHE = $LITTLELM_CACHE or
~/.cache/littlelm) and a copy into the run directory. Its `speed_ratio` (measured step time over
the step model's, plan/speed.py) calibrates the plan of any run on the same GPU model (catalog
key) or the same machine (`device_key`); its memory figures apply to the same workload (model
shape, sequence length, precision and compile: the `workload` fingerprint) and micro-batch.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from littlelm.config import to_tree
from littlelm.data.cache import cache_root, digest


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


def speed_calibration(
    records: list[dict], gpu: str | None = None, device_key: str | None = None
) -> dict | None:
    """The newest measurement on this GPU (catalog key) or this machine (`probe.device_key`)
    whose measured step time was compared with the step model's (`speed_ratio`): it calibrates
    the step model for every workload on that device, not only the one measured."""
    hits = speed_calibrations(records, gpu, device_key)
    return hits[-1] if hits else None


def speed_calibrations(
    records: list[dict], gpu: str | None = None, device_key: str | None = None
) -> list[dict]:
    """Every such measurement on that device, oldest first."""
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

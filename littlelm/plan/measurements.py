"""Bench measurements on disk, so that `plan` can use a measured MFU instead of an assumed one.

`littlelm bench` writes one JSON file per run to CACHE/bench/ (CACHE = $LITTLELM_CACHE or
~/.cache/littlelm) and a copy into the run directory. A measurement applies to a plan when it was
taken on the same GPU model (catalog key) for the same workload: model shape, sequence length,
precision and compile (the `workload` fingerprint).
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
            "precision": t.precision,
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
            if isinstance(rec, dict) and "mfu" in rec:
                out.append(rec)
    return sorted(out, key=lambda r: str(r.get("time", "")))


def measured_mfu(records: list[dict], gpu: str, workload: str) -> dict | None:
    """The newest measurement on `gpu` of this workload with a usable MFU."""
    hits = [
        r
        for r in records
        if r.get("gpu") == gpu and r.get("workload") == workload and (r.get("mfu") or 0) > 0
    ]
    return hits[-1] if hits else None


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

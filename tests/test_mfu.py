"""MFU on a CPU is measured against a probed matmul peak; a run that computes faster than the
probe read (a busy machine at probe time) must not report MFU above 100%."""

from __future__ import annotations

import json

from littlelm.schema import load_run
from littlelm.train import device as dev
from littlelm.train.trainer import Trainer


def test_a_low_cpu_peak_is_raised_to_what_the_run_reaches(tiny_config, monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    monkeypatch.setenv("LITTLELM_CACHE", str(cache))
    monkeypatch.setattr(dev, "probe_matmul", lambda dtype: 1e3)  # a probe that read far too low
    logged = []
    t = Trainer(load_run(tiny_config), resume="never")
    t.log = logged.append
    t.fit()
    recs = [json.loads(line) for line in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    mfus = [r["mfu"] for r in recs if r.get("mfu") is not None]
    assert mfus and max(mfus) <= 1.0
    assert any("above the CPU peak probed at start" in line for line in logged)
    peaks = json.loads((cache / "cpu_peak.json").read_text())
    assert max(peaks.values()) > 1e3  # later runs start from what this one reached

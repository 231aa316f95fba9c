"""The plan's checkpoint costs (plan/saves.py): size, host RAM for a background save's staged
copy, the time a save takes at --write-gbs and the share of the run it costs."""

from __future__ import annotations

import json

import pytest

from littlelm.cli import main
from littlelm.plan.saves import DEFAULT_WRITE_GBS, STAGE_GBS


def plan_json(capsys, *args: str) -> dict:
    assert main(["plan", "demo", "--no-trace", "--json", "--gpu", "H100-SXM", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_checkpoint_costs_follow_the_write_bandwidth_and_the_interval(capsys):
    slow = plan_json(capsys, "--write-gbs", "0.1", "checkpoint.every=100")["checkpoints"]
    fast = plan_json(capsys, "--write-gbs", "1", "checkpoint.every=100")["checkpoints"]
    size = slow["size_bytes"]
    assert size > 0 and slow["host_bytes"] == size  # the staged copy is the checkpoint
    assert slow["write_s"] == pytest.approx(size / 0.1e9)
    assert fast["write_s"] == pytest.approx(slow["write_s"] / 10)
    assert slow["stage_s"] == pytest.approx(size / (STAGE_GBS * 1e9))
    assert slow["sync_hours"] == pytest.approx(slow["saves"] * slow["write_s"] / 3600)
    assert 0 < slow["async_share"] < slow["sync_share"] < 1
    assert slow["sync_dollars"] > fast["sync_dollars"] > 0
    assert slow["write_source"] == "--write-gbs"
    rare = plan_json(capsys, "checkpoint.every=1000")["checkpoints"]
    assert rare["write_gbs"] == DEFAULT_WRITE_GBS and "assumed" in rare["write_source"]
    assert rare["saves"] < slow["saves"]


def test_the_plan_prints_the_checkpoint_line(capsys):
    assert main(["plan", "demo", "--no-trace", "--gpu", "H100-SXM", "--write-gbs", "0.25"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "checkpoints:" in out and "at 0.25 GB/s" in out
    assert "GiB host RAM" in out
    assert "H100-SXM: blocking" in out and ", background" in out

"""Run directories, checkpoints and YAML files written by the littlelm of 2026-12-04 (before the
configs, the CLI and the model description were restructured) load and resume with today's code.

tests/fixtures/old_runs/ was written by tests/fixtures/make_old_runs.py at the commit named in its
expected.json: a tiny pretraining run and an SFT run from it in that day's layout (`grow:
parent:` and a `chat` source), each cut back to its step-6 checkpoint as if killed there. Resuming
each must train steps 7 and 8 as the uninterrupted run did.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "old_runs"

pytestmark = pytest.mark.precision  # .ci/run: again with bf16 forced and with fp32


@pytest.fixture
def old_runs(tmp_path) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "old_runs")
    return tmp_path / "old_runs"


# the precision the fixture was written in (its checkpoints record it): `auto` would pick bf16
# on a CPU with bf16 units, and bf16 steps differ from the fp32 ones expected.json keeps
PINNED = ("train.precision=fp32", "optimizer.ns_dtype=fp32")


def train(where: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "littlelm", "train", *args, *PINNED],
        cwd=where,
        capture_output=True,
        text=True,
    )


def close(a: float, b: float) -> bool:
    # bitwise on the kind of CPU that wrote the fixture; other CPUs' kernels round differently
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("run", ["base", "sft"])
def test_an_old_run_resumes_from_its_checkpoint_and_trains_as_it_would_have(old_runs, run):
    expected = json.loads((old_runs / "expected.json").read_text())["resumed"][run]
    done = train(old_runs, f"{run}.yaml")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "resum" in done.stdout.lower()  # it resumed; it did not start over
    # a default changed since the fixture was written: the run keeps the value it trained with
    assert "optimizer.scalar_lr stays 0.5 as this run trained with it" in done.stdout
    records = [
        json.loads(line)
        for line in (old_runs / "runs" / run / "metrics.jsonl").read_text().splitlines()
    ]
    resumed = [r for r in records if r["kind"] == "train" and r["step"] > 6]
    assert [r["step"] for r in resumed] == [e["step"] for e in expected]
    for got, want in zip(resumed, expected):
        for key in ("loss", "grad_norm", "lr_mult"):
            assert close(got[key], want[key]), (run, got["step"], key, got[key], want[key])


@pytest.mark.slow
def test_an_old_run_directorys_own_config_yaml_resumes_it(old_runs):
    done = train(old_runs, "runs/base/config.yaml")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    steps = [
        json.loads(line)
        for line in (old_runs / "runs" / "base" / "metrics.jsonl").read_text().splitlines()
    ]
    assert max(r["step"] for r in steps if r["kind"] == "train") == 8


def test_an_old_checkpoint_loads_for_sampling_and_evaluation(old_runs):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "littlelm",
            "sample",
            "runs/sft",
            "--prompt",
            "reverse abc",
            "--max-tokens",
            "4",
            "--temperature",
            "0",
        ],
        cwd=old_runs,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "reverse abc" in done.stdout


def test_a_changed_default_is_kept_on_resume_unless_the_config_sets_it():
    from littlelm.optim.groups import MuonConfig
    from littlelm.schema import RunConfig
    from littlelm.train.checkpoint.resume import keep_old_defaults

    def run(**optimizer) -> RunConfig:
        tree = {
            "model": {"name": "gpt", "vocab_size": 64},
            "optimizer": {"name": "muon", **optimizer},
        }
        tree["data"] = {
            "tokenizer": {"name": "byte"},
            "sources": {"t": {"name": "text", "path": "x"}},
        }
        return RunConfig.model_validate(tree)

    saved = {"optimizer": {"name": "muon", "scalar_lr": 0.5}}
    kept, notes = keep_old_defaults(run(), saved)
    assert isinstance(kept.optimizer, MuonConfig) and kept.optimizer.scalar_lr == 0.5
    assert notes == [
        "optimizer.scalar_lr stays 0.5 as this run trained with it (the default before "
        "2026-12-05, 0.002 since); set optimizer.scalar_lr to change it"
    ]
    # the config names it: its value wins; a checkpoint that trained at another value: as is
    assert keep_old_defaults(run(scalar_lr=0.002), saved)[0].optimizer.scalar_lr == 0.002
    assert keep_old_defaults(run(), {"optimizer": {"scalar_lr": 0.01}})[1] == []
    # a checkpoint whose config does not have it: nothing kept
    assert keep_old_defaults(run(), {})[1] == []

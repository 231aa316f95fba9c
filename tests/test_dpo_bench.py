"""benchmarks/dpo.py --task DIR, the measurement behind DPO's defaults: a run is named by every
value it trains with (a changed setting trains anew instead of reusing a run measured with
another), and a missing task or base is refused with the commands that make them."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    module = load_benchmark("dpo.py")
    return module


def test_a_run_is_named_by_every_value_it_trains_with(bench):
    args = argparse.Namespace(sft_steps=300, loss="sigmoid", beta=0.1, dpo_steps=100)
    v = {"lr": 5e-5, "rpo": 1.0, "seed": 1}
    name = bench.dpo_name(args, v)
    others = [
        bench.dpo_name(argparse.Namespace(**{**vars(args), key: value}), v)
        for key, value in (("sft_steps", 150), ("loss", "ipo"), ("beta", 0.5), ("dpo_steps", 50))
    ]
    changed = {"lr": 1e-4, "rpo": 2.0, "seed": 2}
    others += [bench.dpo_name(args, {**v, key: value}) for key, value in changed.items()]
    assert len({name, *others}) == 1 + len(others)  # each value changes the name
    assert bench.sft_name(Path("t/mul"), 300) != bench.sft_name(Path("t/mul"), 150)


def test_missing_task_and_base_are_refused_with_the_fix(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/dpo.py"),
            "--task",
            str(tmp_path / "mul"),
            "--base",
            str(tmp_path / "base"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert f"error: {tmp_path / 'mul'} is not a task benchmarks/post_tasks.py wrote" in proc.stderr
    assert f"run python benchmarks/post_tasks.py --out {tmp_path}" in proc.stderr
    assert f"no base run at {tmp_path / 'base'}: train one (littlelm train demo)" in proc.stderr
    assert proc.stdout == ""

"""benchmarks/lora.py, the measurement behind LoRA's defaults: a run is named by the values it
trains with (so a changed default trains anew instead of reusing a stale run), and a missing
base or task directory is refused with the commands that make them."""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import load_benchmark
from littlelm.components import register_all
from littlelm.model.lora import LoRAConfig

ROOT = Path(__file__).resolve().parents[1]
BASE = ["model.vocab_size=4096"]  # no tokenizer to read: the config is only resolved


@pytest.fixture(scope="module")
def bench():
    module = load_benchmark("lora.py")
    register_all()
    return module


def test_a_variant_is_named_by_its_resolved_values(bench):
    default = LoRAConfig()
    name = bench.variant_name(BASE, "")
    # the defaults spelled out are the same run; the name carries the default lr itself
    assert name == bench.variant_name(BASE, f"lr={default.lr},rank={default.rank}")
    assert f"lr{default.lr:g}" in name
    assert bench.variant_name(BASE, f"lr={default.lr * 10}") != name
    # a key outside rank, alpha, lr and targets is named only when it is not the default
    wide = bench.variant_name(BASE, "train_embeddings=true")
    assert wide == f"{name}-train_embeddings=True"
    with pytest.raises(SystemExit, match="is not KEY=VALUE"):
        bench.lora_overrides("lr")


def test_missing_base_and_task_are_refused_with_the_fix(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/lora.py"),
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
    assert str(tmp_path / "mul" / "sft.jsonl") in proc.stderr
    assert str(tmp_path / "base") in proc.stderr
    assert "benchmarks/post_tasks.py" in proc.stderr and "littlelm train demo" in proc.stderr
    assert proc.stdout == ""

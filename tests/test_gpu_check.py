"""benchmarks/gpu_check.py's CPU-checkable parts: the refusal without a GPU, the section runner,
the deadline and the results file (the GPU sections themselves run on a GPU only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
def test_refuses_without_a_gpu_and_names_the_dry_run(tmp_path):
    done = run(tmp_path=tmp_path)
    assert done.returncode == 2
    assert "needs a CUDA GPU" in done.stderr and "--dry-run" in done.stderr


def test_unknown_section_is_a_usage_error(tmp_path):
    done = run("--dry-run", "--only", "env,bogus", tmp_path=tmp_path)
    assert done.returncode == 2
    assert "bogus" in done.stderr and "bench-largest" in done.stderr


def test_sections_past_the_deadline_are_skipped_and_said_so(tmp_path):
    done = run("--dry-run", "--only", "env,bench-largest", "--deadline", "30", tmp_path=tmp_path)
    doc = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    env, largest = doc["sections"]["env"], doc["sections"]["bench-largest"]
    assert env["ok"] and env["torch"] == torch.__version__
    # the 3B bench needs its whole time limit: with 30 s in all it must not start
    assert not largest["ok"] and "deadline" in largest["line"]
    assert done.returncode == 1 and "FAIL: bench-largest" in done.stdout
    assert "== env: ok" in (tmp_path / "out" / "gpu_check.log").read_text()

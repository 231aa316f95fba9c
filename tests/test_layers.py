"""The package's shape: import-linter's contracts in pyproject.toml (the layers, top to bottom,
and no import cycles in any package) hold, and they do catch a violation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"


def lint(root: Path) -> subprocess.CompletedProcess:
    exe = str(LINT) if LINT.exists() else shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports not found: pip install import-linter (the dev extra has it)")
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [exe, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


def test_layers_and_no_cycles():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "littlelm layers KEPT" in out.stdout and "no import cycles KEPT" in out.stdout


def copy_package(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "littlelm", tmp_path / "littlelm", ignore=shutil.ignore_patterns("*.pyc")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def add_import(module: Path, line: str) -> None:
    """Append a function holding `line`: an import inside a function counts as much as one at
    the top of the module."""
    module.write_text(module.read_text() + f"\n\ndef _probe():\n    {line}  # noqa\n")


def test_an_upward_import_breaks_the_layers(tmp_path):
    root = copy_package(tmp_path)
    add_import(root / "littlelm/data/meter.py", "from littlelm.train.trainer import Trainer")
    out = lint(root)
    assert out.returncode != 0
    assert "littlelm layers BROKEN" in out.stdout
    assert "littlelm.data.meter -> littlelm.train.trainer" in out.stdout


def test_a_cycle_inside_a_layer_breaks_the_contract(tmp_path):
    root = copy_package(tmp_path)
    add_import(root / "littlelm/train/callbacks.py", "from littlelm.train.trainer import Trainer")
    out = lint(root)
    assert out.returncode != 0
    assert "littlelm layers KEPT" in out.stdout and "no import cycles BROKEN" in out.stdout


def test_a_module_outside_every_layer_is_refused(tmp_path):
    root = copy_package(tmp_path)
    (root / "littlelm/stray.py").write_text('"""Placed in no layer."""\n')
    out = lint(root)
    assert out.returncode != 0 and "littlelm.stray" in out.stdout

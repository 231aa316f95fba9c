"""Where a run's checkpoints are: the names of their directories and finding the complete ones
(reading and writing them is littlelm/train/checkpoint/files.py).

    RUN_DIR/checkpoints/step_000500/            complete (state.json is written last)
    RUN_DIR/checkpoints/step_000500.tmp-PID/    a save in progress, or one that was killed
    RUN_DIR/checkpoints/step_000500.replaced-PID/  an older copy moved aside by a re-save

This sits in the bottom layer so that every layer (a saved tokenizer read from a run directory,
`eval`, `sample`, growth, the trainer) finds checkpoints the same way.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

from littlelm.errors import CheckpointError

STEP_DIR = re.compile(r"^step_(\d+)$")
REPLACED_DIR = re.compile(r"^step_(\d+)\.replaced-\d+$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:06d}"


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint directory holds, from its name (`step_000500[.replaced-PID]`)."""
    m = STEP_DIR.match(path.name) or REPLACED_DIR.match(path.name)
    if m is None:
        return json.loads((path / "state.json").read_text())["step"]
    return int(m.group(1))


def scan(root: Path) -> tuple[dict[int, Path], list[Path], dict[int, Path]]:
    """(complete step -> dir, temporary dirs, moved-aside step -> dir) under `root`."""
    done: dict[int, Path] = {}
    partial: list[Path] = []
    replaced: dict[int, Path] = {}
    if not root.is_dir():
        return done, partial, replaced
    for d in root.iterdir():
        m, r = STEP_DIR.match(d.name), REPLACED_DIR.match(d.name)
        if m and (d / "state.json").is_file():
            done[int(m.group(1))] = d
        elif r and (d / "state.json").is_file():
            replaced[int(r.group(1))] = d
        elif d.is_dir() and ".tmp-" in d.name:
            partial.append(d)
    return done, partial, replaced


def list_checkpoints(root: Path, warn: bool = True) -> list[Path]:
    """Complete checkpoints under `root`, oldest first. Leftover temporary directories from a
    killed save are reported and ignored; a checkpoint moved aside by a save of the same step
    that was killed before its rename counts as that step's checkpoint."""
    done, partial, replaced = scan(root)
    for step, d in replaced.items():
        done.setdefault(step, d)
    if warn:
        for d in sorted(partial):
            warnings.warn(
                f"ignoring incomplete checkpoint {d} (a save was interrupted)", stacklevel=2
            )
    return [done[s] for s in sorted(done)]


def latest_checkpoint(root: Path, warn: bool = True) -> Path | None:
    found = list_checkpoints(root, warn)
    return found[-1] if found else None


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory, or the newest complete checkpoint of a run directory."""
    path = Path(path)
    if (path / "state.json").is_file():
        return path
    latest = latest_checkpoint(path / "checkpoints")
    if latest is None:
        raise CheckpointError(
            f"no complete checkpoint at {path} (looked for state.json and checkpoints/step_*)"
        )
    return latest

"""docs/architecture.md's "One optimizer step": the files of littlelm that one `Trainer.train_step`
crosses, measured, are the ones the page lists, and there are at most 11: issue 30's 10, and
model/blocks.py since the MLP variants are one description the planner and export read too
(issue 47)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import littlelm
from littlelm.data.loader import Prefetcher
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer

PACKAGE = Path(littlelm.__file__).parent
DOC = PACKAGE.parent / "docs" / "architecture.md"


def files_called(fn) -> set[str]:
    """The littlelm files (relative to the package) whose Python functions `fn()` calls, in
    this thread and in any thread it starts."""
    files: set[str] = set()
    prefix = str(PACKAGE) + "/"

    def profile(frame, event, arg):
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(prefix):
            files.add(name[len(prefix) :])

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return files


def documented_step_files() -> list[str]:
    """The files the page's step list names: the first word of each unindented line."""
    section = DOC.read_text().split("## One optimizer step", 1)[1]
    block = section.split("```", 2)[1]
    return [line.split()[0] for line in block.splitlines() if line and not line[0].isspace()]


def test_one_step_crosses_the_documented_files_and_at_most_eleven(tiny_config):
    cfg = load_run(tiny_config, ["train.max_steps=100"])
    trainer = Trainer(cfg, resume="never")
    batches = Prefetcher(trainer.loader, cfg.data.prefetch)
    try:
        trainer.train_step(batches)  # the first step: lazy imports, first-call set-up
        crossed = files_called(lambda: trainer.train_step(batches))
    finally:
        batches.close()
    listed = documented_step_files()
    assert len(listed) == len(set(listed)) <= 11, listed
    assert crossed == set(listed), (
        f"crossed but not listed: {sorted(crossed - set(listed))}; "
        f"listed but not crossed: {sorted(set(listed) - crossed)}"
    )

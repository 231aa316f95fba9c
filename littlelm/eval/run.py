"""`littlelm eval`: score a checkpoint on a task directory and print the per-task table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from littlelm.checkpoint_dirs import find_checkpoint
from littlelm.eval.bundle import default_bundle_dir
from littlelm.eval.core import (
    EvalOptions,
    SuiteResult,
    evaluate_suite,
    format_table,
    load_suite,
)
from littlelm.eval.tasks import (
    TaskSpec,
    bundle_differences,
    check_data_dir,
    load_task_list,
    resolve_bundle,
    select_tasks,
)
from littlelm.load import load_model
from littlelm.train.device import autocast, inference_precision, pick_device


def tasks_and_data(
    bundle: str | Path | None, task_file: str | Path | None, labels: list[str] | None
) -> tuple[list[TaskSpec], Path]:
    """The tasks to run and the directory their files are in."""
    root = Path(bundle).expanduser() if bundle else default_bundle_dir()
    listed, data_dir = resolve_bundle(root)
    listed = Path(task_file).expanduser() if task_file else listed
    specs = select_tasks(load_task_list(listed), labels)
    check_data_dir(specs, data_dir, listed)
    for line in bundle_differences(root, specs):
        print(f"warning: {line}", file=sys.stderr)
    return specs, data_dir


def run_eval(
    checkpoint: str | Path,
    bundle: str | Path | None = None,
    labels: list[str] | None = None,
    task_file: str | Path | None = None,
    opts: EvalOptions | None = None,
    device: str = "auto",
    precision: str = "auto",
    out: str | Path | None = None,
) -> SuiteResult:
    opts = opts or EvalOptions()
    path = find_checkpoint(checkpoint)  # a wrong checkpoint path first, then the bundle
    tasks, data_dir = tasks_and_data(bundle, task_file, labels)
    loaded = load_suite(tasks, data_dir)
    dev = pick_device(device)
    model, tok, cfg = load_model(path, dev)
    precision = inference_precision(precision, cfg.train.precision, dev)
    context = cfg.model.max_seq_len
    print(
        f"evaluating {path} ({context}-token context, {precision}) on "
        f"{len(tasks)} task(s) from {data_dir}",
        file=sys.stderr,
    )
    with autocast(dev, precision):
        suite = evaluate_suite(model, tok, loaded, opts, log=lambda m: print(m, file=sys.stderr))
    print(format_table(suite))
    if out is not None:
        write_results(Path(out), suite, path)
    return suite


def write_results(path: Path, suite: SuiteResult, checkpoint: Path) -> None:
    """JSON with every task's record and per-item decisions."""
    doc = {
        "checkpoint": str(checkpoint),
        "mean_centered": suite.mean_centered,
        "core": suite.mean_centered if suite.is_core else None,
        "tasks": [{**t.record(), "decisions": t.decisions} for t in suite.tasks],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))


def parse_labels(text: str | None) -> list[str] | None:
    """'a,b' -> ['a', 'b']; 'a,a' -> ['a'] (scored and averaged once); None or '' -> None."""
    if not text:
        return None
    return list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))

"""`littlelm eval RUN --harness TASKS`: lm-evaluation-harness on a littlelm checkpoint.

The model is scored in-process through `lm_adapter.LittleLMAdapter` (no export needed): any
lm_eval task by name, or your own task YAMLs from a directory (`--include DIR`, lm_eval's
include_path; a task may read local JSONL with `dataset_path: json`). lm_eval is an optional
extra: `pip install -e '.[harness]'` in a clone (`pip install 'littlelm[harness]'` from an index).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from littlelm.errors import EvalError, did_you_mean
from littlelm.extras import require
from littlelm.load import find_checkpoint, load_model
from littlelm.train.device import autocast, inference_precision, pick_device


def task_manager(tasks: list[str], include: str | Path | None):
    """lm_eval's TaskManager that knows `tasks`: the YAMLs under `include` alone when they hold
    every task (indexing lm_eval's 14,000 built-in tasks takes 15-50 s), else all of them."""
    require("lm_eval", extra="harness", feature="littlelm eval --harness")
    from lm_eval.tasks import TaskManager

    if not tasks:
        raise EvalError("--harness needs task names, e.g. --harness hellaswag,arc_easy")
    if include is not None:
        if not Path(include).is_dir():
            raise EvalError(f"--include {include}: not a directory of lm_eval task YAML files")
        own = TaskManager(include_path=str(include), include_defaults=False)
        if all(t in own.all_tasks for t in tasks):
            return own
    check_hub([t for t in tasks if include is None or t not in own.all_tasks])
    manager = TaskManager(include_path=str(include) if include else None)
    check_tasks(manager, tasks)
    return manager


OFFLINE_FIX = (
    "evaluate local tasks instead: a task YAML with `dataset_path: json` and "
    "`dataset_kwargs: {data_files: {test: FILE.jsonl}}` in a directory, passed as `--include DIR` "
    "(docs/interop.md); or run once with the hub reachable, after which HF_DATASETS_OFFLINE=1 "
    "reads the cached datasets"
)


def check_hub(tasks: list[str]) -> None:
    """Built-in tasks read their datasets from the Hugging Face hub: when it cannot be reached,
    say so now (lm_eval would index 14,000 tasks, retry the download and end in a traceback).
    HF_DATASETS_OFFLINE=1 or HF_HUB_OFFLINE=1 says the datasets are in the local cache: go on."""
    if os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        return
    import requests

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        requests.head(endpoint, timeout=5)
    except requests.RequestException as e:
        reason = type(e).__name__
        raise EvalError(
            f"lm_eval's task(s) {', '.join(tasks)} download their datasets from the Hugging Face "
            f"hub, which cannot be reached ({endpoint}: {reason}); {OFFLINE_FIX}"
        ) from None


@contextmanager
def hub_errors(tasks: list[str]):
    """A dataset that is neither reachable nor cached: one error naming the fix, no traceback."""
    try:
        yield
    except ConnectionError as e:  # datasets' "Couldn't reach 'Rowan/hellaswag' on the Hub"
        raise EvalError(f"{e} (tasks {', '.join(tasks)}); {OFFLINE_FIX}") from None


@contextmanager
def quiet_git_hash():
    """lm_eval records `git describe` of the working directory; outside a git repository git
    prints "fatal: not a git repository" on our stderr. Ask it quietly (the same answer)."""
    import lm_eval.evaluator as evaluator

    def git_hash() -> str | None:
        try:
            out = subprocess.run(
                ["git", "describe", "--always"], capture_output=True, text=True, check=False
            )
        except OSError:  # git not installed
            return None
        return out.stdout.strip() or None

    original = evaluator.get_git_commit_hash
    evaluator.get_git_commit_hash = git_hash
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = original


def check_tasks(manager, tasks: list[str]) -> None:
    known = set(manager.all_tasks)
    for t in tasks:
        if t not in known:
            raise EvalError(
                f"lm_eval has no task {t!r}{did_you_mean(t, known)}; list them with "
                "`lm_eval ls tasks`, or point --include at a directory with your task YAML"
            )


def run_harness(
    checkpoint: str | Path,
    tasks: list[str],
    include: str | Path | None = None,
    limit: int | None = None,
    num_fewshot: int | None = None,
    device: str = "auto",
    precision: str = "auto",
    out: str | Path | None = None,
    batch_size: int = 16,
    chat: bool = False,
) -> dict:
    """Score a checkpoint on lm_eval `tasks`; print lm_eval's table; return its results."""
    manager = task_manager(tasks, include)
    import lm_eval
    from lm_eval.utils import make_table

    from littlelm.interop.lm_adapter import LittleLMAdapter

    dev = pick_device(device)
    path = find_checkpoint(checkpoint)
    model, tok, cfg = load_model(path, dev)
    precision = inference_precision(precision, cfg.train.precision, dev)
    print(f"lm-evaluation-harness on {path} ({precision}): {', '.join(tasks)}", file=sys.stderr)
    with autocast(dev, precision), hub_errors(tasks), quiet_git_hash():
        res = lm_eval.simple_evaluate(
            model=LittleLMAdapter(model, tok, batch_size, chat),
            tasks=tasks,
            task_manager=manager,
            limit=limit,
            num_fewshot=num_fewshot,
            log_samples=False,
            bootstrap_iters=0,
            apply_chat_template=chat,  # the model's chat format (data/chat.py)
        )
    print(make_table(res))
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(
            json.dumps({"checkpoint": str(path), "results": res["results"]}, indent=1, default=str)
        )
    return res["results"]

"""Task lists and task files for in-context-learning evaluation, in the DCLM eval-bundle format.

A task list is YAML: `tasks:` followed by entries with `label`, `dataset_uri` (a JSONL file,
relative to the data directory), `icl_task_type` (multiple_choice, schema or
language_modeling), `num_fewshot`, `continuation_delimiter` and `random_baseline` (percent).
The 22 CORE tasks ship with littlelm as `core_tasks.yaml`; a directory with its own `tasks.yaml`
(the dev suite, or your own tasks) uses that instead.

Item formats, one JSON object per line (other keys are ignored; blank lines are skipped):

    multiple_choice:    {"query": str, "choices": [str, ...], "gold": int}
    schema:             {"context_options": [str, ...], "continuation": str, "gold": int}
    language_modeling:  {"context": str, "continuation": str}

A malformed line is an error naming file:line; nothing is skipped silently.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
from pathlib import Path
from typing import Literal

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from littlelm.errors import EvalError, did_you_mean
from littlelm.eval.foundry import from_icl_tasks

TaskType = Literal["multiple_choice", "schema", "language_modeling"]
CORE_TASKS = Path(__file__).parent / "core_tasks.yaml"
DATA_FOLDERS = ("eval_data", "local_data")  # the public bundle's; llm-foundry's scripts/eval
SHUFFLE_SEED = 1337  # items are shuffled once so that max_per_task takes a fair sample


class TaskSpec(BaseModel):
    """One task of a task list."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(description="Task name, as reported.")
    dataset_uri: str = Field(description="JSONL file of items, relative to the data directory.")
    icl_task_type: TaskType = Field(description="How items are scored.")
    num_fewshot: int = Field(ge=0, description="Solved examples placed before each item.")
    continuation_delimiter: str = Field(" ", description="Text between a query and its answer.")
    example_delimiter: str = Field("\n\n", description="Text after each few-shot example.")
    random_baseline: float = Field(ge=0, lt=100, description="Accuracy of guessing, percent.")

    @field_validator("num_fewshot", mode="before")
    @classmethod
    def _one_shot_count(cls, v):
        # llm-foundry files write `num_fewshot: [10]`; one value is all a score can use
        if isinstance(v, list) and len(v) == 1:
            return v[0]
        return v

    @property
    def baseline(self) -> float:
        """Random baseline as a fraction."""
        return self.random_baseline / 100.0

    def centered(self, accuracy: float) -> float:
        """(accuracy - baseline) / (1 - baseline): 0 at chance, 1 when perfect."""
        return (accuracy - self.baseline) / (1.0 - self.baseline)


def not_utf8(path: Path) -> EvalError:
    """The error for a file that does not decode as UTF-8: where the first bad byte is."""
    data = Path(path).read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        line = data.count(b"\n", 0, e.start) + 1
        # the bytes before the bad one on its line are valid UTF-8: count them as characters
        column = len(data[line_start : e.start].decode("utf-8")) + 1
        return EvalError(
            f"{path}:{line}: not valid UTF-8 (byte 0x{data[e.start]:02x} at column {column}); "
            "save the file as UTF-8 (for example `iconv -f latin1 -t utf-8 FILE > NEW`)"
        )
    return EvalError(f"{path}: not valid UTF-8; save the file as UTF-8")


def read_text(path: Path) -> str:
    """A task or bundle file's text; bytes that are not UTF-8 are an error naming file:line."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise not_utf8(path) from None


def load_task_list(path: Path | None = None) -> list[TaskSpec]:
    """The tasks of a task-list file (default: the packaged 22 CORE tasks)."""
    path = Path(path) if path is not None else CORE_TASKS
    if not path.is_file():
        raise EvalError(f"task list not found: {path}")
    try:
        tree = yaml.safe_load(read_text(path))
    except yaml.YAMLError as e:
        raise EvalError(f"{path}: malformed YAML: {e}") from None
    entries, problems = task_entries(tree, path)
    specs = []
    for i, entry in enumerate(entries):
        try:
            specs.append(TaskSpec.model_validate(entry))
        except pydantic.ValidationError as e:
            where = entry.get("label", f"entry {i}") if isinstance(entry, dict) else f"entry {i}"
            for err in e.errors():
                key = ".".join(str(p) for p in err["loc"]) or "(entry)"
                problems.append(f"{where}: {key}: {err['msg']}")
    labels = [s.label for s in specs]
    problems += [
        f"task {lab!r} is listed twice" for lab in sorted(set(labels)) if labels.count(lab) > 1
    ]
    if problems:
        raise EvalError(f"{path}: bad task list:\n" + "\n".join(f"  - {p}" for p in problems))
    return specs


def task_entries(tree, path: Path) -> tuple[list, list[str]]:
    """(entries, problems) of a parsed task list: littlelm's `tasks:` or llm-foundry's `icl_tasks:`."""
    if isinstance(tree, dict) and "icl_tasks" in tree:
        if "tasks" in tree:
            raise EvalError(f"{path}: has both `tasks:` and `icl_tasks:`; keep one of them")
        entries = tree["icl_tasks"]
        if isinstance(entries, str):
            raise EvalError(
                f"{path}: icl_tasks names another file ({entries}); pass that file as --task-file"
            )
        if not isinstance(entries, list) or not entries:
            raise EvalError(f"{path}: expected a non-empty `icl_tasks:` list of task entries")
        return from_icl_tasks(entries, {**core_baselines(), **meta_baselines(path.parent)})
    entries = tree.get("tasks") if isinstance(tree, dict) else None
    if not isinstance(entries, list) or not entries:
        raise EvalError(
            f"{path}: expected a non-empty `tasks:` list of task entries "
            "(or llm-foundry's `icl_tasks:` list)"
        )
    return entries, []


def core_baselines() -> dict[str, float]:
    """Random baseline (percent) of each packaged CORE task."""
    return {s.label: s.random_baseline for s in load_task_list(CORE_TASKS)}


def meta_baselines(folder: Path) -> dict[str, float]:
    """Random baselines (percent) from an eval_meta_data.csv in `folder` (DCLM's, nanochat's)."""
    path = Path(folder) / "eval_meta_data.csv"
    if not path.is_file():
        return {}
    reader = csv.DictReader(io.StringIO(read_text(path)))
    out = {}
    for row in reader:
        lineno = reader.line_num
        try:
            out[row["Eval Task"]] = float(row["Random baseline"])
        except (KeyError, TypeError, ValueError):
            raise EvalError(
                f"{path}:{lineno}: expected an 'Eval Task' name and a 'Random baseline' number "
                "(percent); fix the row, or set `random_baseline:` in the task file instead"
            ) from None
    return out


def select_tasks(specs: list[TaskSpec], labels: list[str] | None) -> list[TaskSpec]:
    """The named tasks, in the order given (all of them when `labels` is None)."""
    if not labels:
        return list(specs)
    by_label = {s.label: s for s in specs}
    unknown = [lab for lab in labels if lab not in by_label]
    if unknown:
        hints = "".join(did_you_mean(lab, by_label) for lab in unknown)
        raise EvalError(
            f"unknown task(s) {', '.join(unknown)}{hints}; known: {', '.join(by_label)}"
        )
    return [by_label[lab] for lab in labels]


def resolve_bundle(bundle: Path) -> tuple[Path, Path]:
    """(task list, data directory) of an eval directory.

    A directory with its own `tasks.yaml` uses it (the dev suite, or your own tasks); otherwise
    it is an eval bundle: the packaged CORE task list, with data under `eval_data/` (the layout
    of the public bundle) or `local_data/` (llm-foundry's `scripts/eval`) when one exists, else
    in the directory itself.
    """
    bundle = Path(bundle)
    if not bundle.is_dir():
        raise EvalError(
            f"eval directory not found: {bundle}; fetch the CORE bundle with "
            "`littlelm eval-bundle`, or pass --bundle DIR"
        )
    if (bundle / "tasks.yaml").is_file():
        return bundle / "tasks.yaml", bundle
    for name in DATA_FOLDERS:
        if (bundle / name).is_dir():
            return CORE_TASKS, bundle / name
    return CORE_TASKS, bundle


def check_data_dir(specs: list[TaskSpec], data_dir: Path, listed: Path) -> None:
    """When not one task file is under `data_dir`, stop and name the folder that holds them.

    (When some are there, `load_items` names each missing one.)
    """
    data_dir = Path(data_dir)
    if not specs or any((data_dir / s.dataset_uri).is_file() for s in specs):
        return
    probe = specs[0].dataset_uri
    found = find_data_dir(data_dir, probe)
    if found is None:
        hint = (
            "point --bundle at the folder that holds them: the CORE bundle (`littlelm "
            "eval-bundle` fetches it), or llm-foundry's scripts/eval (its local_data/ folder)"
        )
    else:
        task_file = "" if listed == CORE_TASKS else f" --task-file {listed}"
        hint = f"they are under {found}: pass --bundle {found}{task_file}"
    raise EvalError(
        f"none of the {len(specs)} task files is under {data_dir} (no {data_dir / probe}); {hint}"
    )


def find_data_dir(start: Path, probe: str, depth: int = 4, limit: int = 5000) -> Path | None:
    """The folder near `start` (below it, then above it) that holds the file `probe`."""
    start = start.resolve()
    for seen, (folder, subdirs, _) in enumerate(os.walk(start), 1):
        if (Path(folder) / probe).is_file():
            return Path(folder)
        level = len(Path(folder).relative_to(start).parts)
        subdirs[:] = [] if level >= depth else sorted(d for d in subdirs if not d.startswith("."))
        if seen >= limit:
            break
    for parent in list(start.parents)[:3]:
        if (parent / probe).is_file():
            return parent
    return None


def bundle_differences(bundle: Path, specs: list[TaskSpec]) -> list[str]:
    """Where the bundle's own core.yaml (if any) disagrees with the task list in use.

    The packaged list is what littlelm scores; a bundle whose core.yaml names other shots or
    delimiters was changed upstream, and its numbers would not compare with published ones.
    """
    path = Path(bundle) / "core.yaml"
    if not path.is_file():
        return []
    try:
        theirs = {t["label"]: t for t in yaml.safe_load(read_text(path))["icl_tasks"]}
    except (yaml.YAMLError, KeyError, TypeError) as e:
        return [f"{path}: unreadable ({e}); using littlelm's task list"]
    except EvalError as e:  # not UTF-8: only compared, never scored, so a warning is enough
        return [f"unreadable: {e}; using littlelm's task list"]
    out = []
    for s in specs:
        t = theirs.get(s.label)
        if t is None:
            continue
        mine = (s.dataset_uri, s.icl_task_type, s.num_fewshot, s.continuation_delimiter)
        other = (
            t.get("dataset_uri"),
            t.get("icl_task_type"),
            TaskSpec._one_shot_count(t.get("num_fewshot")),  # llm-foundry's [N]
            t.get("continuation_delimiter", " "),
        )
        if mine != other:
            out.append(f"{path}: {s.label} is {other} there but {mine} in littlelm's task list")
    return out


def load_items(path: Path, task: TaskSpec) -> list[dict]:
    """Every item of a task file, checked against its task type."""
    if not path.is_file():
        raise EvalError(f"task {task.label}: file not found: {path}")
    try:
        items = _read_items(path, task)
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    if not items:
        raise EvalError(f"{path}: no items (the file is empty); task {task.label} cannot be scored")
    if len(items) <= task.num_fewshot:
        raise EvalError(
            f"{path}: {len(items)} item(s), but task {task.label} uses {task.num_fewshot} few-shot "
            f"examples and needs at least {task.num_fewshot + 1} (an item is never its own example)"
        )
    return items


def _read_items(path: Path, task: TaskSpec) -> list[dict]:
    items = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise EvalError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            problem = check_item(item, task.icl_task_type)
            if problem:
                raise EvalError(f"{path}:{lineno}: {problem} (task {task.label})")
            items.append(item)
    return items


def _is_str_list(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def check_item(item, task_type: TaskType) -> str | None:
    """What is wrong with one item, or None."""
    if not isinstance(item, dict):
        return f"expected a JSON object, got {type(item).__name__}"
    if task_type == "language_modeling":
        if not isinstance(item.get("context"), str):
            return "`context` must be a string"
        if not isinstance(item.get("continuation"), str) or not item["continuation"]:
            return "`continuation` must be a non-empty string"
        return None
    key = "choices" if task_type == "multiple_choice" else "context_options"
    if task_type == "multiple_choice" and not isinstance(item.get("query"), str):
        return "`query` must be a string"
    if task_type == "schema" and (
        not isinstance(item.get("continuation"), str) or not item["continuation"]
    ):
        return "`continuation` must be a non-empty string"
    if not _is_str_list(item.get(key)) or len(item[key]) < 2:
        return f"`{key}` must be a list of at least two strings"
    if task_type == "multiple_choice" and not all(item[key]):
        return "every choice must be a non-empty string"
    gold = item.get("gold")
    if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(item[key]):
        return f"`gold` must be an index into `{key}` (0..{len(item[key]) - 1}), got {gold!r}"
    return None


def shuffled(items: list[dict]) -> list[dict]:
    """A fixed shuffle (seed 1337, as nanochat), so that a prefix is a fair sample."""
    out = list(items)
    random.Random(SHUFFLE_SEED).shuffle(out)
    return out

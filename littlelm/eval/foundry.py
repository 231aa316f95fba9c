"""llm-foundry's task lists (`icl_tasks:`), the format DCLM and nanochat use, as littlelm entries.

    icl_tasks:
      - label: hellaswag
        dataset_uri: eval/local_data/language_understanding/hellaswag.jsonl
        num_fewshot: [0, 10]
        icl_task_type: multiple_choice
        continuation_delimiter: " "

Each entry becomes one littlelm task per shot count: the label as written when `num_fewshot`
holds one count (so CORE's labels match the packaged list), `LABEL/N-shot` (llm-foundry's own
metric name) when it holds several. `dataset_uri` loses everything up to `local_data/`, llm-foundry's
data folder, so the path is relative to the folder `--bundle` resolves to. The random baseline
(percent) comes from the entry's `random_baseline`, else from the baselines passed in (an
eval_meta_data.csv beside the file, then the packaged CORE list), else 0 for language_modeling
(guessing an exact continuation scores 0); otherwise the entry is refused.

Fields that change how items are scored and that littlelm does not implement, and task types
other than multiple_choice, schema and language_modeling, are refused by name: a score computed
without them would not be the one the file asks for. Other top-level keys (model, tokenizer,
...) configure llm-foundry's run, not the tasks, and are not read.
"""

from __future__ import annotations

from pathlib import PurePosixPath

SCORED_TYPES = ("multiple_choice", "schema", "language_modeling")
READ = (
    "label",
    "dataset_uri",
    "icl_task_type",
    "num_fewshot",
    "continuation_delimiter",
    "example_delimiter",
    "random_baseline",
)
# fields that do not change a task's score: accepted and not used
IGNORED = {
    "has_categories": "the whole file is scored as one task, as nanochat does",
    "batch_size": "littlelm batches by --batch-tokens",
}


def from_icl_tasks(entries: list, baselines: dict[str, float]) -> tuple[list[dict], list[str]]:
    """(littlelm task entries, problems) of an `icl_tasks:` list; `baselines` maps label -> %."""
    out: list[dict] = []
    problems: list[str] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.append(f"entry {i}: expected a mapping of task fields, got {entry!r}")
            continue
        where = str(entry.get("label", f"entry {i}"))
        problems += entry_problems(where, entry)
        shots = entry.get("num_fewshot")
        counts = shots if isinstance(shots, list) else [shots]
        if not counts:
            problems.append(f"{where}: num_fewshot is an empty list")
        base = {k: v for k, v in entry.items() if k in READ}
        if isinstance(base.get("dataset_uri"), str):
            base["dataset_uri"] = under_local_data(base["dataset_uri"])
        if "random_baseline" not in base:
            rb = baselines.get(
                where, 0 if entry.get("icl_task_type") == "language_modeling" else None
            )
            if rb is None:
                problems.append(
                    f"{where}: no random baseline: add `random_baseline: PERCENT` to the entry, or "
                    "an eval_meta_data.csv ('Eval Task', 'Random baseline' columns) beside the file"
                )
            base["random_baseline"] = rb
        for n in counts:
            label = where if len(counts) == 1 else f"{where}/{n}-shot"
            out.append({**base, "label": label, "num_fewshot": n})
    return out, problems


def entry_problems(where: str, entry: dict) -> list[str]:
    """Unsupported fields and task types of one entry."""
    problems = []
    unknown = [k for k in entry if k not in READ and k not in IGNORED]
    if unknown:
        problems.append(
            f"{where}: unsupported field(s) {', '.join(map(str, unknown))}; littlelm reads "
            f"{', '.join(READ)} (and ignores {', '.join(IGNORED)}): remove them, or score "
            "this task with `littlelm eval --harness`"
        )
    kind = entry.get("icl_task_type")
    if kind is not None and kind not in SCORED_TYPES:
        problems.append(
            f"{where}: icl_task_type {kind!r} is not supported (littlelm scores "
            f"{', '.join(SCORED_TYPES)}); remove the entry, or score it with "
            "`littlelm eval --harness`"
        )
    return problems


def under_local_data(uri: str) -> str:
    """'eval/local_data/world_knowledge/x.jsonl' -> 'world_knowledge/x.jsonl'; others unchanged."""
    parts = PurePosixPath(uri).parts
    folders = parts[:-1]
    if "local_data" not in folders:
        return uri
    last = len(folders) - 1 - folders[::-1].index("local_data")
    return str(PurePosixPath(*parts[last + 1 :]))

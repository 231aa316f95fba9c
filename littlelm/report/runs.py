"""Reading a run directory for a report: config.yaml, metrics.jsonl and samples.txt.

Nothing here depends on a fixed metrics schema. Records are grouped by their `kind`; any numeric
field of any kind becomes a series (nested mappings flattened to `field.key`); a field that is
null in a record (how metrics.jsonl stores NaN and infinity) is a gap, counted as non-finite.
A record repeated for the same step (a resumed run re-logging a step, or an older littlelm that
re-evaluated a finished run started again) replaces the earlier one.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import yaml

from littlelm.errors import LittleLMError


class ReportError(LittleLMError):
    """A run directory that cannot be reported on, or a report that cannot be written."""


@dataclass
class Series:
    """One metric of one run: values (NaN where non-finite) by step and tokens seen."""

    step: np.ndarray
    tokens: np.ndarray
    value: np.ndarray


@dataclass
class RunData:
    path: Path
    name: str
    config: dict
    config_text: str
    records: dict[str, list[dict]]
    notes: list[str] = field(default_factory=list)
    sample: str | None = None

    @cached_property
    def run_config(self):
        """config.yaml loaded as a RunConfig with this littlelm (None, and a note, if it does not
        load: a run from another version). Loaded once."""
        from littlelm.schema import load_run

        try:
            return load_run(self.path / "config.yaml") if self.config else None
        except LittleLMError as e:
            self.notes.append(
                f"config.yaml does not load with this littlelm version, so the parameter "
                f"count and the schedule curve are left out ({e})"
            )

    def grown_start(self) -> dict | None:
        """Where a grown run starts on its parent's axes ({step, tokens, checkpoint}), as its
        start record says (train/callbacks.py); None for a run that was not grown."""
        for rec in self.records.get("start", []):
            start = rec.get("grown_from")
            if isinstance(start, dict) and is_number(start.get("tokens")):
                return {"checkpoint": "?", "step": 0, **start}
        return None

    def fields(self, kind: str) -> list[str]:
        """Every field of `kind` records that holds a number (or null) somewhere, in order."""
        seen: dict[str, None] = {}
        for rec in self.records.get(kind, []):
            for key, value in flat(rec).items():
                if value is None or is_number(value):
                    seen.setdefault(key, None)
        return [k for k in seen if any(is_number(flat(r).get(k)) for r in self.records[kind])]

    def series(self, kind: str, name: str) -> Series | None:
        rows = [(r, flat(r)) for r in self.records.get(kind, [])]
        rows = [(r, f) for r, f in rows if name in f]
        if not rows:
            return None
        step = np.array([r.get("step", np.nan) for r, _ in rows], dtype=float)
        tokens = np.array([r.get("tokens", np.nan) for r, _ in rows], dtype=float)
        value = np.array([f[name] if is_number(f[name]) else np.nan for _, f in rows], dtype=float)
        return Series(step, tokens, value)

    def last(self, kind: str) -> dict | None:
        recs = self.records.get(kind)
        return recs[-1] if recs else None

    def cfg(self, dotted: str, default=None):
        """A value of the resolved config by dotted key, e.g. 'train.batch_tokens'."""
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def flat(record: dict, prefix: str = "") -> dict:
    """{'a': {'b': 1}, 'c': None} -> {'a.b': 1, 'c': None} (every leaf, numeric or not)."""
    out: dict = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def load_run_dir(path: str | Path) -> RunData:
    """Read a run directory; raises ReportError when it holds no metrics to report."""
    path = Path(path)
    if not path.is_dir():
        raise ReportError(f"run directory not found: {path} (pass a directory like runs/NAME)")
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise ReportError(
            f"{path} has no metrics.jsonl; is it a run directory (runs/NAME) whose training "
            "has logged at least one step?"
        )
    notes: list[str] = []
    bad: list[tuple[int, str]] = []
    records = read_metrics(metrics, notes, bad)
    if not any(records.get(k) for k in ("train", "eval")):
        if bad:  # garbage, not a run that has not logged yet
            (lineno, what), more = bad[0], len(bad) - 1
            raise ReportError(
                f"{metrics}:{lineno}: {what}"
                + (f" (and {more} more bad line(s))" if more else "")
                + "; the file holds no train or eval records, so it is not a littlelm "
                "metrics.jsonl or is damaged: pass a run directory (runs/NAME)"
            )
        raise ReportError(f"{metrics} has no train or eval records yet; nothing to report")
    if bad:  # the note read_metrics just added, said on the terminal as well
        warnings.warn(notes[-1], stacklevel=2)
    config, config_text = read_config(path / "config.yaml", notes)
    name = (config.get("run") or {}).get("name") or path.name
    return RunData(
        path=path,
        name=str(name),
        config=config,
        config_text=config_text,
        records=records,
        notes=notes,
        sample=last_sample(path / "samples.txt"),
    )


# Kinds whose records at one step may be distinct events, told apart by this field as well: two
# rollbacks to the same checkpoint fail at different steps (a replayed one at the same step).
EVENT_FIELD = {"rollback": "failed_at"}


def read_metrics(path: Path, notes: list[str], bad: list[tuple[int, str]]) -> dict[str, list[dict]]:
    """Records by kind, in file order, the last one kept where a (kind, step) repeats. Lines
    that are not JSON objects, and train or eval records without a numeric step, are skipped
    (noted, and listed in `bad` as (line number, what is wrong))."""
    by_key: dict[tuple, dict] = {}
    for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            bad.append((lineno, f"not JSON ({_excerpt(line)})"))
            continue
        if not isinstance(rec, dict):
            bad.append((lineno, f"not a JSON object ({_excerpt(line)})"))
            continue
        kind = str(rec.get("kind", "train"))
        if kind in ("train", "eval") and not is_number(rec.get("step")):
            bad.append((lineno, f"a {kind} record without a step ({_excerpt(line)})"))
            continue
        if "step" in rec and kind != "start":
            key = (kind, rec["step"], rec.get(EVENT_FIELD.get(kind, "")))
        else:
            key = (kind, "line", lineno)
        by_key.pop(key, None)  # a repeat moves to the end, where it was written
        by_key[key] = rec
    if bad:
        shown = ", ".join(str(n) for n, _ in bad[:5]) + (" ..." if len(bad) > 5 else "")
        notes.append(
            f"{path}: {len(bad)} line(s) that are not JSON objects or littlelm records skipped "
            f"(line {shown})"
        )
    records: dict[str, list[dict]] = {}
    for (kind, *_), rec in by_key.items():
        records.setdefault(kind, []).append(rec)
    for recs in records.values():
        recs.sort(key=lambda r: r.get("step", math.inf) if is_number(r.get("step")) else math.inf)
    return records


def _excerpt(line: str, n: int = 40) -> str:
    line = line.strip()
    return repr(line if len(line) <= n else line[:n] + "...")


def read_config(path: Path, notes: list[str]) -> tuple[dict, str]:
    if not path.is_file():
        notes.append("config.yaml is missing: model and configuration sections are empty")
        return {}, ""
    text = path.read_text()
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as e:
        notes.append(f"config.yaml is not valid YAML ({e}); shown as it is")
        return {}, text
    return (tree if isinstance(tree, dict) else {}), text


def last_sample(path: Path, max_lines: int = 40) -> str | None:
    """The newest sample in samples.txt (blocks start with '=== step N'), cut to max_lines."""
    if not path.is_file():
        return None
    text = path.read_text(errors="replace")
    blocks = [b for b in re.split(r"(?m)^=== step ", text) if b.strip()]
    if not blocks:
        return None
    lines = ("step " + blocks[-1]).rstrip("\n").splitlines()
    if len(lines) > max_lines:
        lines = [*lines[:max_lines], f"... ({len(lines) - max_lines} more lines in samples.txt)"]
    return "\n".join(lines)

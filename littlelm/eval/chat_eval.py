"""`littlelm eval RUN --chat DIR`: chat tasks, asked in the model's chat format (data/chat.py).

A task directory holds `tasks.yaml` and one JSONL file per task:

    tasks:
      - {label: gsm8k, file: gsm8k.jsonl, kind: generative}
      - {label: arc_easy, file: arc_easy.jsonl, kind: choice}

generative  rows {"question": str} or {"messages": [..., user turn]}, and "answer": str. The
            model replies (greedy, up to `max_tokens`); its answer is what follows the last
            `####` in the reply (GSM8K style), else the whole reply; exact match after trimming
            spaces (and commas, for numbers). Random baseline 0.
choice      rows {"question": str, "choices": [str, ...], "answer": index or letter}. The question
            and its lettered choices are one user turn ending "Answer with the letter."; the
            model's choice is the letter whose token it rates highest first in its reply.
            Random baseline 1 / number of choices.

A row whose prompt does not fit the model's context (with room for one reply token) is left
out, never cropped: a cropped prompt asks another question. The rows left out are counted in
the table's `skipped` column and named (FILE:LINE, tokens) on stderr and in --out's JSON, and
the accuracy is over the rows asked. A task none of whose rows fits is an error.

The table gives each task's accuracy and its centred score, (accuracy - baseline) /
(1 - baseline), and the mean centred score, like CORE's.
"""

from __future__ import annotations

import json
import string
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from littlelm.data.chat import check_messages, extract, json_lines
from littlelm.errors import DataError

KINDS = ("generative", "choice")


@dataclass
class ChatTask:
    label: str
    file: str
    kind: str


@dataclass
class ChatResult:
    label: str
    kind: str
    items: int
    accuracy: float
    baseline: float
    seconds: float
    skipped: int = 0  # rows whose prompt does not fit the context

    @property
    def centred(self) -> float:
        return (self.accuracy - self.baseline) / (1 - self.baseline)


def load_tasks(root: Path) -> list[ChatTask]:
    listed = root / "tasks.yaml"
    if not listed.is_file():
        raise DataError(f"{root}: no tasks.yaml; a chat task directory lists its tasks there")
    try:
        tasks = (yaml.safe_load(listed.read_text()) or {}).get("tasks")
    except yaml.YAMLError as e:
        raise DataError(f"{listed}: not YAML ({e})") from None
    if not isinstance(tasks, list) or not tasks:
        raise DataError(f"{listed}: expected `tasks:` with a list of {{label, file, kind}}")
    out = []
    for i, t in enumerate(tasks, 1):
        if not isinstance(t, dict) or not {"label", "file", "kind"} <= set(t):
            raise DataError(f"{listed}: task {i} needs label, file and kind")
        if t["kind"] not in KINDS:
            raise DataError(f"{listed}: task {t['label']!r} kind {t['kind']!r}; kinds: {KINDS}")
        if not (root / t["file"]).is_file():
            raise DataError(f"{listed}: task {t['label']!r}: no file {root / t['file']}")
        out.append(ChatTask(str(t["label"]), str(t["file"]), t["kind"]))
    return out


def read_rows(path: Path, kind: str) -> list[dict]:
    """The task's rows, each with its `messages` (ending with the user turn), checked."""
    rows = []
    for where, row in json_lines(path.read_text().splitlines(), str(path)):
        if not isinstance(row, dict) or "answer" not in row:
            raise DataError(f"{where}: a row needs an answer")
        if kind == "choice":
            choices = row.get("choices")
            if not isinstance(choices, list) or not 2 <= len(choices) <= 26:
                raise DataError(f"{where}: a choice row needs 2-26 choices")
            gold, last = row["answer"], string.ascii_uppercase[len(choices) - 1]
            if isinstance(gold, str):  # a letter, either case ("b" is B); anything else is wrong
                letter = gold.strip().upper()
                ok = len(letter) == 1 and letter in string.ascii_uppercase
                gold = string.ascii_uppercase.index(letter) if ok else None
            if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
                raise DataError(
                    f"{where}: answer {row['answer']!r} is not one of the choices: give one "
                    f"letter A-{last} or an index 0-{len(choices) - 1}"
                )
            letters = "\n".join(f"{string.ascii_uppercase[i]}. {c}" for i, c in enumerate(choices))
            question = f"{row.get('question', '')}\n{letters}\nAnswer with the letter."
            messages = [{"role": "user", "content": question}]
            row = {**row, "gold": gold}
        else:
            messages = row.get("messages") or [{"role": "user", "content": row.get("question")}]
        stand_in = [*messages, {"role": "assistant", "content": "-"}]
        rows.append({**row, "messages": check_messages(stand_in, where)[:-1], "where": where})
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def score_generative(chat, rows: list[dict]) -> tuple[float, list[dict]]:
    decisions = []
    for row in rows:
        chat.reset()
        chat.messages = list(row["messages"])
        reply = chat.respond()
        ok = extract(reply) == extract(str(row["answer"]))
        decisions.append({"reply": reply, "answer": row["answer"], "correct": ok})
    return sum(d["correct"] for d in decisions) / len(rows), decisions


@torch.no_grad()
def score_choice(model, fmt, rows: list[dict]) -> tuple[float, list[dict]]:
    tok, device = fmt.tokenizer, model.wte.weight.device
    decisions = []
    for row in rows:
        letters = [tok.encode(string.ascii_uppercase[i])[0] for i in range(len(row["choices"]))]
        ids = fmt.encode(row["messages"], add_generation_prompt=True)  # fits: fitting()
        logits = model(torch.tensor([ids], device=device))[0, -1]
        pick = int(torch.argmax(logits[letters]))
        decisions.append({"pick": pick, "gold": row["gold"], "correct": pick == row["gold"]})
    return sum(d["correct"] for d in decisions) / len(rows), decisions


def fitting(fmt, rows: list[dict], limit: int) -> tuple[list[dict], list[str]]:
    """(the rows whose prompt leaves room for a reply token in a `limit`-token context, and
    'FILE:LINE (N tokens)' of each that does not)."""
    fit, left_out = [], []
    for row in rows:
        n = len(fmt.encode(row["messages"], add_generation_prompt=True))
        if n < limit:
            fit.append(row)
        else:
            left_out.append(f"{row['where']} ({n:,} tokens)")
    return fit, left_out


def run_chat_eval(
    checkpoint: str | Path,
    root: str | Path,
    labels: list[str] | None = None,
    max_per_task: int | None = None,
    max_tokens: int = 64,
    device: str = "auto",
    precision: str = "auto",
    out: str | Path | None = None,
) -> list[ChatResult]:
    """Score `checkpoint` on the chat tasks of `root`; prints the table."""
    from littlelm.eval.chat import Chat
    from littlelm.load import load_model
    from littlelm.train.device import autocast, inference_precision, pick_device

    root = Path(root).expanduser()
    tasks = [t for t in load_tasks(root) if not labels or t.label in labels]
    if not tasks:
        raise DataError(f"none of the tasks {labels} is in {root / 'tasks.yaml'}")
    rows = {t.label: read_rows(root / t.file, t.kind)[:max_per_task] for t in tasks}
    dev = pick_device(device)
    model, tok, cfg = load_model(checkpoint, dev)
    chat = Chat(model, tok, max_tokens=max_tokens)
    results, details, skipped = [], {}, {}
    with autocast(dev, inference_precision(precision, cfg.train.precision, dev)):
        for t in tasks:
            t0 = time.perf_counter()
            limit = cfg.model.max_seq_len
            asked, left_out = fitting(chat.format, rows[t.label], limit)
            if left_out:
                print(
                    f"{t.label}: {len(left_out)} of {len(rows[t.label])} rows left out, their "
                    f"prompt does not fit the model's {limit:,}-token context: "
                    + ", ".join(left_out[:5])
                    + (" ..." if len(left_out) > 5 else ""),
                    file=sys.stderr,
                )
            if not asked:
                raise DataError(
                    f"task {t.label!r}: no row of {root / t.file} fits the model's "
                    f"{limit:,}-token context (the shortest prompt needs more); shorten the "
                    "rows, or evaluate a model with a longer context (model.max_seq_len)"
                )
            if t.kind == "generative":
                acc, dec = score_generative(chat, asked)
                base = 0.0
            else:
                acc, dec = score_choice(model, chat.format, asked)
                base = sum(1 / len(r["choices"]) for r in asked) / len(asked)
            took = time.perf_counter() - t0
            results.append(ChatResult(t.label, t.kind, len(dec), acc, base, took, len(left_out)))
            details[t.label], skipped[t.label] = dec, left_out
    print(format_table(results))
    if out:
        record = {
            "checkpoint": str(checkpoint),
            "tasks": [{**r.__dict__, "centred": r.centred} for r in results],
            "mean_centred": mean_centred(results),
            "decisions": details,
            "left_out": skipped,  # FILE:LINE (tokens) of the rows too long to ask
        }
        Path(out).write_text(json.dumps(record, indent=2))
    return results


def mean_centred(results: list[ChatResult]) -> float:
    return sum(r.centred for r in results) / len(results)


def format_table(results: list[ChatResult]) -> str:
    head = (
        f"{'task':<24} {'kind':<10} {'items':>6} {'skipped':>7} {'acc':>7} {'centred':>8} "
        f"{'secs':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.label:<24} {r.kind:<10} {r.items:>6} {r.skipped:>7} {r.accuracy:>7.4f} "
            f"{r.centred:>8.4f} {r.seconds:>6.1f}"
        )
    lines.append(f"mean centred {mean_centred(results):.4f} over {len(results)} chat task(s)")
    return "\n".join(lines)

"""The comparison of a sweep's variants (`littlelm report SWEEP_DIR`, and the end of `sweep`).

SWEEP_DIR/sweep.json (written by `littlelm sweep`) lists the variants; each has a run directory
beside it. Writes SWEEP_DIR/report/comparison.md (one row per variant: final val loss and bits
per byte, the CORE or dev-task score when an in-context eval ran, tokens, tokens/s, training
time, dollars; with repeats, the mean and the spread over seeds) and three overlaid plots: loss
against time, tokens and dollars, one colour per variant (repeats share it, dashed).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from littlelm.report.plots import LINESTYLES, PALETTE, Line, Panel, line_figure, save_png
from littlelm.report.runs import ReportError, RunData, load_run_dir
from littlelm.report.summary import last_value

MANIFEST = "sweep.json"


def is_sweep_dir(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


@dataclass
class Row:
    name: str
    group: str
    run: RunData | None
    val_loss: float | None = None
    val_bpb: float | None = None
    score: float | None = None  # CORE (or the dev tasks' mean centered accuracy)
    tokens: int | None = None
    tok_s: float | None = None
    seconds: float | None = None  # training wall-clock (the budget's count when there is one)
    dollars: float | None = None
    finished: bool = False


def seconds_of(run: RunData) -> float | None:
    """Training wall-clock: the budget's count, else the pure step time of the last record."""
    for kind in ("end", "train", "eval"):
        value = last_value(run, kind, "budget_spent")
        if value is not None:
            return value
    return last_value(run, "end", "train_time") or last_value(run, "train", "train_time")


def row_of(variant: dict, sweep_dir: Path, price: float | None) -> Row:
    name = variant["name"]
    group = name.rsplit(",seed=", 1)[0] if variant.get("seed") is not None else name
    try:
        run = load_run_dir(sweep_dir / name)
    except ReportError:
        return Row(name, group, None)
    r = Row(name, group, run, finished=bool(run.records.get("end")))
    r.val_loss, r.val_bpb = last_value(run, "eval", "val_loss"), last_value(run, "eval", "val_bpb")
    r.score = last_value(run, "icl", "core")
    if r.score is None:
        r.score = last_value(run, "icl", "mean_centered")
    r.tokens = last_value(run, "end", "tokens") or last_value(run, "train", "tokens")
    r.seconds = seconds_of(run)
    train_time = last_value(run, "end", "train_time") or last_value(run, "train", "train_time")
    if r.tokens and train_time:
        r.tok_s = r.tokens / train_time
    r.dollars = last_value(run, "end", "budget_dollars")
    if r.dollars is None and price is not None and r.seconds is not None:
        r.dollars = r.seconds / 3600 * price
    return r


def fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return format(value, spec)


def spread(values: list[float | None], spec: str) -> str:
    """'mean ± half the range (n)' over seeds; a single value as it is."""
    known = [v for v in values if v is not None]
    if not known:
        return "n/a"
    if len(known) == 1:
        return format(known[0], spec)
    mean = statistics.fmean(known)
    return f"{format(mean, spec)} ± {format((max(known) - min(known)) / 2, spec)} ({len(known)})"


COLUMNS = ["variant", "val loss", "val bpb", "score", "tokens", "tok/s", "time", "$", "status"]


def table_rows(rows: list[Row]) -> list[list[str]]:
    out = []
    for r in rows:
        status = "finished" if r.finished else ("not started" if r.run is None else "unfinished")
        out.append(
            [
                r.name,
                fmt(r.val_loss, ".4f"),
                fmt(r.val_bpb, ".4f"),
                fmt(r.score, ".4f"),
                fmt(r.tokens, ","),
                fmt(r.tok_s, ",.0f"),
                fmt(r.seconds, ".1f") + (" s" if r.seconds is not None else ""),
                fmt(r.dollars, ".4f"),
                status,
            ]
        )
    return out


def seed_rows(rows: list[Row]) -> list[list[str]]:
    """One line per variant over its seeds: mean ± half the range (count)."""
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(r.group, []).append(r)
    return [
        [
            g,
            spread([r.val_loss for r in rs], ".4f"),
            spread([r.val_bpb for r in rs], ".4f"),
            spread([r.score for r in rs], ".4f"),
        ]
        for g, rs in groups.items()
    ]


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def price_per_second(run: RunData, price: float | None) -> float | None:
    """What one second of the run costs: its budget's price per GPU-hour × GPUs, else `price`
    (per GPU-hour) × its processes."""
    world = run.cfg("distributed.world_size") or 1
    per_gpu = run.cfg("train.budget.price_per_gpu_hour") or price
    if per_gpu is None:
        return None
    return per_gpu * (run.cfg("train.budget.gpus") or world) / 3600


def curves(run: RunData, kind: str, key: str, rate: float | None) -> dict[str, list]:
    """x values (time, tokens, dollars) and y of `key` in `kind` records, finite ones only."""
    out: dict[str, list] = {"time": [], "tokens": [], "dollars": [], "y": []}
    for rec in run.records.get(kind, []):
        y, t = rec.get(key), rec.get("budget_spent", rec.get("train_time"))
        if y is None or t is None or not math.isfinite(y):
            continue
        out["y"].append(y)
        out["time"].append(t / 60)
        out["tokens"].append(rec.get("tokens", 0) / 1e6)
        out["dollars"].append(t * rate if rate is not None else math.nan)
    return out


XAXES = {
    "time": "training time, evaluations and saves included (minutes)",
    "tokens": "tokens seen (millions)",
    "dollars": "cost (dollars)",
}


def plot_rows(rows: list[Row], out: Path, price: float | None) -> list[Path]:
    """loss_vs_time.png, loss_vs_tokens.png and (with a price) loss_vs_dollars.png."""
    colours = {
        g: PALETTE[i % len(PALETTE)] for i, g in enumerate(dict.fromkeys(r.group for r in rows))
    }
    seen: dict[str, int] = {}
    lines: dict[str, list[Line]] = {x: [] for x in XAXES}
    for r in rows:
        if r.run is None:
            continue
        style = LINESTYLES[seen.get(r.group, 0) % len(LINESTYLES)]
        seen[r.group] = seen.get(r.group, 0) + 1
        rate = price_per_second(r.run, price)
        train, val = curves(r.run, "train", "loss", rate), curves(r.run, "eval", "val_loss", rate)
        for x in XAXES:
            c = colours[r.group]
            lines[x].append(Line(f"{r.name} train", train[x], train["y"], c, style))
            lines[x].append(Line(f"{r.name} val", val[x], val["y"], c, style, marker="o"))
    paths = []
    for x, label in XAXES.items():
        if x == "dollars" and any(math.isnan(v) for ln in lines[x] for v in ln.x):
            continue  # no price for some run: no dollar axis
        panel = Panel("loss (nats/token)", lines[x], title="lines: training loss; dots: validation")
        fig = line_figure(f"Sweep: loss against {x}", [panel], xlabel=label)
        paths.append(save_png(fig, out / f"loss_vs_{x}.png"))
    return paths


def write_sweep_report(sweep_dir: str | Path, price: float | None = None) -> tuple[Path, str]:
    """Write SWEEP_DIR/report/comparison.md and the plots; returns its path and the table."""
    sweep_dir = Path(sweep_dir)
    try:
        manifest = json.loads((sweep_dir / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise ReportError(f"cannot read {sweep_dir / MANIFEST}: {e}") from None
    price = price if price is not None else manifest.get("price_per_hour")
    rows = [row_of(v, sweep_dir, price) for v in manifest["variants"]]
    if not any(r.run for r in rows):
        raise ReportError(f"no variant of {sweep_dir} has logged a step yet; nothing to compare")
    out = sweep_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(COLUMNS, table_rows(rows))
    parts = [
        f"# Sweep {sweep_dir.name}",
        f"Base `{manifest['base']}`; budget {manifest.get('budget') or 'the base config’s'}.",
        table,
    ]
    if any(v.get("seed") is not None for v in manifest["variants"]):
        parts.append("Over seeds (mean ± half the range, runs):")
        parts.append(markdown_table(["variant", "val loss", "val bpb", "score"], seed_rows(rows)))
    figs = plot_rows(rows, out, price)
    parts += [f"![{p.stem}]({p.name})" for p in figs]
    path = out / "comparison.md"
    path.write_text("\n\n".join(parts) + "\n")
    return path, table

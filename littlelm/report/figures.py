"""Run data -> the report's figures: every plottable field of every run, grouped by the catalog.

Each figure holds one panel per metric (metrics that share a panel, like train and validation
loss, share an axis); several runs are drawn on the same panels in different colours.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from littlelm.report.catalog import Metric, describe, figure_order, figure_title
from littlelm.report.plots import (
    LINESTYLES,
    PALETTE,
    Line,
    Panel,
    line_figure,
    save_png,
    token_scale,
)
from littlelm.report.runs import RunData, Series

CAPTIONS = {
    "loss": "Train loss (the mean over each logging window) and validation loss, in nats per "
    "token, over all held-out data and over each named validation set (eval.sets). Lower is "
    "better; a validation loss that rises while the train loss falls is overfitting.",
    "bpb": "Validation bits per byte (all held-out data, and each named validation set): loss "
    "normalised by the bytes of text each token covers, comparable across tokenizers.",
    "lr": "The schedule's learning-rate multiplier; each parameter group's lr is its base lr "
    "(the start-up table, or the optimizer section of the config) times this.",
    "throughput": "Training tokens per second (excluding evaluation and checkpoints) and model "
    "FLOPs utilisation against the device's dense bf16 peak.",
    "grad_norm": "Global L2 norm of the gradients before clipping, the mean over each logging "
    "window (log scale); spikes often come before loss spikes.",
    "memory": "Memory as logged by the trainer.",
    "data": "Data pipeline statistics as logged by the loader.",
    "evals": "Evaluation scores logged at evaluation steps.",
    "rl": "An RL run's sampled replies (train/rl.py): their mean reward and the fraction that "
    "score 1 (pass@1 at the sampling temperature), the k3 KL to the SFT model per reply token, "
    "reply length, groups with equal rewards, and the seconds per step sampling vs computing "
    "the loss and gradients.",
    "other": "Further numeric fields found in metrics.jsonl, plotted as logged.",
}


@dataclass
class Entry:
    run: int
    kind: str
    metric: Metric
    series: Series


@dataclass
class FigureFile:
    key: str
    title: str
    path: Path
    caption: str
    figure: Figure  # kept so that tests can check what was drawn


def collect(runs: list[RunData]) -> dict[str, dict[tuple[str, str], list[Entry]]]:
    """figure -> (panel, unit) -> entries, in catalog order of figures and first-seen panels.

    In a comparison a grown run's series continue its parent's axes (RunData.grown_start)."""
    figures: dict[str, dict[tuple[str, str], list[Entry]]] = {}
    for i, run in enumerate(runs):
        start = run.grown_start() if len(runs) > 1 else None
        for kind in run.records:
            if kind in ("start", "end"):
                continue
            names = run.fields(kind)
            for name in names:
                metric = describe(kind, name)
                series = shifted(run.series(kind, name), start)
                if metric is None or series is None or single_source_mix(name, names):
                    continue
                panel = (metric.panel or f"{kind}:{name}", metric.unit)
                figures.setdefault(metric.figure, {}).setdefault(panel, []).append(
                    Entry(i, kind, metric, series)
                )
        schedule = shifted(schedule_series(run), start)
        if schedule is not None:
            metric = describe("config", "lr_mult")
            assert metric is not None, "the catalog describes the schedule's lr_mult"
            entries = figures.setdefault(metric.figure, {}).setdefault(
                (metric.panel, metric.unit), []
            )
            first = next((n for n, e in enumerate(entries) if e.run == i), len(entries))
            entries.insert(first, Entry(i, "config", metric, schedule))
    return dict(sorted(figures.items(), key=lambda kv: figure_order(kv[0])))


def single_source_mix(name: str, names: list[str]) -> bool:
    """A data-mix share of the only source: 1.0 at every step, a panel that says nothing."""
    return name.startswith("mix.") and sum(n.startswith("mix.") for n in names) == 1


def shifted(series: Series | None, start: dict | None) -> Series | None:
    """`series` moved along by a grown run's starting step and tokens (its parent's)."""
    if series is None or start is None:
        return series
    return Series(series.step + start["step"], series.tokens + start["tokens"], series.value)


def schedule_series(run: RunData, points: int = 2000) -> Series | None:
    """The lr multiplier of every step, from the config's schedule (a pure function): the logged
    values are only every log_every steps, which hides a short warmup."""
    cfg = run.run_config
    if cfg is None or not cfg.train.max_steps or not cfg.train.batch_tokens:
        return None
    if cfg.train.budget is not None and cfg.train.budget.kind in ("hours", "dollars"):
        return None  # the schedule followed measured time (train/budget.py): the logged lr shows it
    from littlelm.optim.schedule import step_progress

    fn, total = cfg.schedule.build(), cfg.train.max_steps
    idx = np.unique(np.r_[np.arange(min(total, 200)), np.linspace(0, total - 1, points).round()])
    mult = np.array([fn(int(s), step_progress(int(s), total)) for s in idx])
    steps = idx + 1  # the multiplier of step index s is logged with the record of step s + 1
    return Series(steps, steps * cfg.train.batch_tokens, mult)


def render_figures(runs: list[RunData], out: Path) -> list[FigureFile]:
    xaxis = XAxis.for_runs(runs)
    out.mkdir(parents=True, exist_ok=True)
    for run in runs if len(runs) > 1 else []:
        if (start := run.grown_start()) is not None:
            run.notes.append(
                f"grown from {start['checkpoint']}: its curves continue the parent's, from "
                f"{start['tokens']:,} tokens (step {start['step']})"
            )
    files = []
    for key, panels in collect(runs).items():
        built = [build_panel(entries, runs, xaxis) for entries in panels.values()]
        cols = 2 if len(built) > 3 else 1
        fig = line_figure(figure_title(key), built, xaxis.label, xaxis.top_axis(), cols)
        path = save_png(fig, out / f"{key}.png")
        files.append(FigureFile(key, figure_title(key), path, CAPTIONS.get(key, ""), fig))
    return files


def build_panel(entries: list[Entry], runs: list[RunData], xaxis: XAxis) -> Panel:
    fields = list(dict.fromkeys(e.metric.label for e in entries))
    first = entries[0].metric
    many_runs = len({e.run for e in entries}) > 1 or len(runs) > 1
    ylabel = first.axis if len(fields) == 1 else f"{first.panel} ({first.unit})"
    computed = any(e.kind == "config" for e in entries)
    lines, notes = [], []
    for e in entries:
        style = LINESTYLES[fields.index(e.metric.label) % len(LINESTYLES)]
        color = PALETTE[(e.run if many_runs else fields.index(e.metric.label)) % len(PALETTE)]
        words = [runs[e.run].name] * many_runs + [e.metric.label] * (len(fields) > 1)
        label = " ".join(words) or e.metric.label
        x = xaxis.values(e.series)
        marker = "o" if e.kind not in ("train", "config") and len(x) <= 60 else None
        if (computed and e.kind != "config") or e.metric.points:  # points, not a line
            style, marker = "none", "o"
        lines.append(Line(label, x, e.series.value * e.metric.scale, color, style, marker))
        bad = int(np.sum(~np.isfinite(e.series.value)))
        if bad:
            notes.append(f"{label}: non-finite at {bad} logged step(s), drawn as gaps")
    ys = [np.asarray(ln.y) for ln in lines]  # numpy already (the series' values)
    log_y = first.log_y and all(np.all(y[np.isfinite(y)] > 0) for y in ys)
    ylim = None
    if first.from_zero and not log_y:
        highs = [np.nanmax(ln.y) for ln in lines if np.any(np.isfinite(ln.y))]
        ylim = (0.0, 1.08 * max(highs)) if highs and max(highs) > 0 else None
    elif first.unit == "nats/token":
        ylim, note = loss_ylim(lines)
        notes += [note] if note else []
    return Panel(ylabel, lines, log_y=log_y, ylim=ylim, notes=notes)


def loss_ylim(lines: list[Line]) -> tuple[tuple[float, float] | None, str]:
    """Loss starts near ln(vocab) and falls fast; show the part of the curve worth reading.

    The top is the highest value after the first tenth of each line, so the steep start is cut
    off; the returned note says what was cut."""
    tails, lows, highs = [], [], []
    for ln in lines:
        y = np.asarray(ln.y, dtype=float)
        finite = y[np.isfinite(y)]
        if finite.size == 0:
            continue
        lows.append(finite.min())
        highs.append(finite.max())
        tails.append(finite[len(finite) // 10 :].max() if finite.size >= 10 else finite.max())
    if not tails:
        return None, ""
    top, low = max(tails), min(lows)
    top += 0.05 * (top - low or 1.0)
    low -= 0.05 * (top - low or 1.0)
    if max(highs) <= top:
        return (low, top), ""
    above = sum(int(np.sum(np.asarray(ln.y) > top)) for ln in lines)
    return (
        low,
        top,
    ), f"axis cut at {top:.2f}: {above} early point(s) above, up to {max(highs):.2f}"


@dataclass
class XAxis:
    """Tokens seen (scaled to thousands, millions or billions), or steps when tokens are absent."""

    use_tokens: bool
    div: float
    label: str
    batch_tokens: float | None  # set when every run has the same fixed batch: steps on top

    @classmethod
    def for_runs(cls, runs: list[RunData]) -> XAxis:
        logged = [r.get("tokens") for run in runs for recs in run.records.values() for r in recs]
        tokens = [t for t in logged if isinstance(t, (int, float))]
        use_tokens = bool(logged) and len(tokens) == len(logged)  # every record has tokens
        if not use_tokens:
            return cls(False, 1.0, "optimizer step", None)
        starts = [run.grown_start() for run in runs] if len(runs) > 1 else []
        div, word = token_scale(max(tokens) + max((s["tokens"] for s in starts if s), default=0))
        label = f"tokens seen ({word})" if word else "tokens seen (tokens)"
        return cls(True, div, label, common_batch(runs))

    def values(self, s: Series) -> np.ndarray:
        return s.tokens / self.div if self.use_tokens else s.step

    def top_axis(self):
        if not self.batch_tokens:
            return None
        per_step = self.batch_tokens / self.div
        return ("optimizer step", lambda x: x / per_step, lambda s: s * per_step)


def common_batch(runs: list[RunData]) -> float | None:
    """The batch size in tokens when all runs share it and every record has tokens = step × it."""
    sizes = {run.cfg("train.batch_tokens") for run in runs}
    if len(sizes) != 1 or not isinstance(bt := sizes.pop(), int) or bt <= 0:
        return None
    for run in runs:
        start = run.grown_start() if len(runs) > 1 else None
        if start is not None and start["tokens"] != start["step"] * bt:  # a parent's other batch
            return None
        for recs in run.records.values():
            for r in recs:
                if isinstance(r.get("step"), int) and r.get("tokens") != r["step"] * bt:
                    return None
    return float(bt)

"""The report's Markdown: summary, model, figures, evaluations, sample, notes and config."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timezone

from littlelm.config import flatten
from littlelm.progress import duration
from littlelm.report.catalog import NOT_PLOTTED, describe
from littlelm.report.figures import FigureFile
from littlelm.report.runs import RunData, flat, is_number
from littlelm.report.summary import Facts, facts

# Metrics a reader expects; when a run lacks one, the notes say so instead of a silent gap.
EXPECTED = {
    "train loss": ("train", "loss"),
    "validation loss": ("eval", "val_loss"),
    "validation bits per byte": ("eval", "val_bpb"),
    "learning-rate multiplier": ("train", "lr_mult"),
    "throughput": ("train", "tok_per_s"),
    "MFU": ("train", "mfu"),
    "gradient norm": ("train", "grad_norm"),
}
MAX_EVAL_ROWS = 25


def render_markdown(runs: list[RunData], figs: list[FigureFile], price: float | None) -> str:
    """The whole page: summary, model, plots, evaluations, last sample, notes and config."""
    all_facts = [facts(r, price) for r in runs]
    names = [r.name for r in runs]
    parts = [
        header(runs),
        "## Summary\n\n" + kv_table(names, summary_rows(all_facts, price)),
        "## Model\n\n" + kv_table(names, known_rows(model_rows(runs, all_facts))),
        figures_section(figs),
    ]
    evals = [(r, eval_table(r)) for r in runs]
    if any(t for _, t in evals):
        parts.append("## Evaluations")
        for run, t in evals:
            if t:
                parts.append((f"### {run.name}\n\n" if len(runs) > 1 else "") + t)
    samples = [(r, r.sample) for r in runs if r.sample]
    if samples:
        parts.append("## Last sample")
        for run, text in samples:
            parts.append((f"### {run.name}\n\n" if len(runs) > 1 else "") + fence(text))
    notes = [(r, [*warning_notes(r), *r.notes, *missing_notes(r)]) for r in runs]
    if any(n for _, n in notes):
        lines = [f"- {r.name}: {' '.join(n.split())}" for r, ns in notes for n in ns]
        parts.append("## Notes\n\n" + "\n".join(lines))
    parts.append(config_section(runs))
    return "\n\n".join(parts) + "\n"


def known_rows(rows: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """Rows where at least one run has a value (a config from another version may lack some)."""
    return [(label, vals) for label, vals in rows if any(v != "n/a" for v in vals)]


def config_section(runs: list[RunData]) -> str:
    parts = ["## Configuration"]
    if len(runs) > 1:
        flats = [flatten(r.config) for r in runs]
        keys = sorted({k for f in flats for k in f})
        differ = [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1]
        if differ:
            rows = [[f"`{k}`", *(str(f.get(k, "(absent)")) for f in flats)] for k in differ]
            parts.append(
                "Settings that differ:\n\n" + table(["key", *(r.name for r in runs)], rows)
            )
        else:
            parts.append("The runs' resolved configurations are identical.")
    for run in runs:
        title = f"Resolved config of {run.name}" if len(runs) > 1 else "Resolved config"
        text = run.config_text or "(config.yaml missing)"
        parts.append(f"### {title} (`{run.path / 'config.yaml'}`)\n\n" + fence(text, "yaml"))
    return "\n\n".join(parts)


def table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A GitHub-flavoured Markdown table; `align` is one of l/r per column (default l)."""

    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    marks = ["---:" if a == "r" else "---" for a in (align or "l" * len(header))]
    lines = ["| " + " | ".join(map(cell, header)) + " |", "| " + " | ".join(marks) + " |"]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def fence(text: str, lang: str = "") -> str:
    """A fenced code block that no backtick run inside `text` can close early."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def num(value, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def big(n: float | None) -> str:
    """1310720 -> '1,310,720 (1.31M)'."""
    if n is None:
        return "n/a"
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n:,.0f} ({n / div:.3g}{unit})"
    return f"{n:,.0f}"


def secs(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.0f} s" if value < 60 else f"{duration(round(value))} ({value:,.0f} s)"


def summary_rows(facts: list[Facts], price: float | None) -> list[tuple[str, list[str]]]:
    def row(label, fn):
        return (label, [fn(f) for f in facts])

    rows = [
        row("status", lambda f: f.status),
        row(
            "steps", lambda f: f"{f.step if f.step is not None else 'n/a'} of {f.max_steps or '?'}"
        ),
        row("tokens seen", lambda f: big(f.tokens)),
        row("last train loss (nats/token)", lambda f: num(f.train_loss)),
        row("last validation loss (nats/token)", lambda f: num(f.val_loss)),
        row("last validation bits per byte", lambda f: num(f.val_bpb)),
        row(
            "best validation bits per byte",
            lambda f: (
                f"{f.best_val_bpb[0]:.4f} at step {f.best_val_bpb[1]}" if f.best_val_bpb else "n/a"
            ),
        ),
        row("training time (steps only)", lambda f: secs(f.train_time)),
        row("evaluation time", lambda f: f"{secs(f.eval_time)}, {f.evals} evaluation(s)"),
        row("wall time", lambda f: f"{secs(f.wall_time)}: {f.wall_note}"),
        row("throughput (tokens/s)", throughput),
        row("MFU (median of logged windows)", mfu),
    ]
    if price is None:
        rows.append(("cost", ["pass --price-per-hour to see it"] * len(facts)))
    else:
        rows.append(row(f"cost at ${price:g}/hour", cost))
    return rows


def throughput(f: Facts) -> str:
    if f.tok_per_s is None:
        return "n/a"
    text = f"{f.tok_per_s:,.0f} over the run"
    if f.tok_per_s_median is not None:
        text += f"; median {f.tok_per_s_median:,.0f} per logged window"
    return text


def mfu(f: Facts) -> str:
    if f.mfu_median is None:
        return "not logged"
    text = f"{100 * f.mfu_median:.1f}%"
    if f.peak_flops:
        text += f" of {f.peak_flops / 1e12:.3g} TFLOP/s {f.precision} peak"
    return text + (f" ({f.device})" if f.device else "")


def cost(f: Facts) -> str:
    if f.cost is None:
        return "n/a (no wall time)"
    text = f"${f.cost:,.2f}"
    if f.cost_per_btok is not None:
        text += f" (${f.cost_per_btok:,.2f} per billion tokens)"
    return text


def model_rows(runs: list[RunData], facts: list[Facts]) -> list[tuple[str, list[str]]]:
    def params(f: Facts, key: str) -> str:
        return big(f.params.get(key)) if f.params and key in f.params else "n/a"

    def cfg(key: str, fmt=str):
        return [fmt(run.cfg(key)) if run.cfg(key) is not None else "n/a" for run in runs]

    return [
        ("parameters", [params(f, "total") for f in facts]),
        ("non-embedding parameters", [params(f, "non_embedding") for f in facts]),
        ("embedding parameters", [params(f, "embedding") for f in facts]),
        (
            "training FLOPs per token",
            [big(f.flops_per_token) if f.flops_per_token else "n/a" for f in facts],
        ),
        ("model", cfg("model.name")),
        ("layers", cfg("model.n_layer")),
        ("width (d_model)", cfg("model.d_model")),
        ("attention heads (query / key-value)", [heads(run) for run in runs]),
        ("MLP", [f"{run.cfg('model.mlp', 'n/a')}" for run in runs]),
        ("vocabulary", cfg("model.vocab_size", lambda v: f"{v:,}")),
        ("sequence length (tokens)", cfg("train.seq_len", lambda v: f"{v:,}")),
        ("batch", [batch(run) for run in runs]),
        ("optimizer", cfg("optimizer.name")),
        ("schedule", cfg("schedule.name")),
        ("precision", cfg("train.precision")),
    ]


def heads(run: RunData) -> str:
    q, kv = run.cfg("model.n_head"), run.cfg("model.n_kv_head")
    return "n/a" if q is None else f"{q} / {kv or q}"


def batch(run: RunData) -> str:
    bt, mb = run.cfg("train.batch_tokens"), run.cfg("train.micro_batch_size")
    seq, acc = run.cfg("train.seq_len"), run.cfg("train.grad_accum")
    if bt is None:
        return "n/a"
    if None in (mb, seq, acc):
        return f"{bt:,} tokens per step"
    devices = bt // (mb * seq * acc)
    parts = f"{mb} sequences × {seq} tokens × {acc} micro-batch(es)"
    parts += f" × {devices} devices" if devices > 1 else ""
    return f"{bt:,} tokens per step = {parts}"


def kv_table(names: list[str], rows: list[tuple[str, list[str]]]) -> str:
    return table(["", *names], [[label, *vals] for label, vals in rows])


def eval_table(run: RunData) -> str | None:
    recs = run.records.get("eval", [])
    if not recs:
        return None
    cols: list[str] = []
    for rec in recs:
        for key, value in flat(rec).items():
            known = key not in ("kind", *NOT_PLOTTED) and describe("eval", key) is not None
            wanted = known and (is_number(value) or value is None)  # not val_sets.NAME.tokens
            if wanted and key not in cols:
                cols.append(key)
    shown = recs
    if len(recs) > MAX_EVAL_ROWS:  # every k-th, and always the last
        k = -(-len(recs) // MAX_EVAL_ROWS)
        shown = [*recs[::k][: MAX_EVAL_ROWS - 1], recs[-1]]
    head = ["step", "tokens", *(eval_label(c) for c in cols)]
    rows = []
    for rec in shown:
        f = flat(rec)
        tokens = f"{rec['tokens']:,}" if is_number(rec.get("tokens")) else ""
        rows.append([str(rec.get("step", "")), tokens, *(cell(f.get(c, "")) for c in cols)])
    text = table(head, rows, "r" * len(head))
    if len(shown) < len(recs):
        text += f"\n\n{len(shown)} of {len(recs)} evaluations shown (evenly spaced, and the last)."
    return text


def eval_label(col: str) -> str:
    """'val_bpb' -> 'val_bpb (bits/byte)': the field name, as in metrics.jsonl, and its unit."""
    metric = describe("eval", col)
    assert metric is not None, "eval_table shows described fields only"
    return f"{col} ({metric.unit})"


def cell(value) -> str:
    if value is None:
        return "non-finite"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def warning_notes(run: RunData) -> list[str]:
    """The warnings the run's console gave, from its records: DPO's chosen replies falling while
    the margin rises (train/dpo.py), at which steps, and the first in full."""
    from littlelm.train.dpo import CHOSEN_DROP, over_optimising

    cfg = run.run_config
    limit = cfg.dpo.warn_chosen_drop if cfg is not None and cfg.dpo is not None else CHOSEN_DROP
    notes = []
    for kind, prefix, where in (("train", "", "training"), ("eval", "val_", "held-out")):
        hits = [
            (r.get("step"), w)
            for r in run.records.get(kind, [])
            if (w := over_optimising(r, prefix, limit)) is not None
        ]
        if hits:
            steps = ", ".join(str(s) for s, _ in hits[:8]) + (" ..." if len(hits) > 8 else "")
            notes.append(
                f"WARNING ({where} pairs, {len(hits)} record(s), at step {steps}): {hits[0][1]}"
            )
    return notes


def missing_notes(run: RunData) -> list[str]:
    missing = [label for label, (kind, key) in EXPECTED.items() if key not in run.fields(kind)]
    return [f"not logged by this run: {', '.join(missing)}"] if missing else []


def header(runs: list[RunData]) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if len(runs) == 1:
        title = f"# Run report: {runs[0].name}"
    else:
        title = f"# Run comparison: {', '.join(r.name for r in runs)}"
    dirs = "\n".join(f"- `{r.path}`" for r in runs)
    return f"{title}\n\nMade by `littlelm report` on {when} from:\n\n{dirs}"


def figures_section(figs: list[FigureFile]) -> str:
    parts = ["## Plots"]
    for f in figs:
        parts.append(f"### {f.title}\n\n![{f.title}]({f.path.name})\n\n{f.caption}".rstrip())
    return "\n\n".join(parts)

"""`littlelm report`: a Markdown report with PNG plots of one run, or several compared.

    from littlelm.report import write_report
    write_report(["runs/a", "runs/b"], out="report-a-vs-b", price_per_hour=2.5)

runs.py reads run directories, catalog.py says what each metric is, figures.py and plots.py
draw, summary.py computes the summary's numbers and markdown.py writes the page.
"""

from __future__ import annotations

from pathlib import Path

from littlelm.config import flatten
from littlelm.report.figures import render_figures
from littlelm.report.markdown import (
    eval_table,
    fence,
    figures_section,
    header,
    kv_table,
    missing_notes,
    model_rows,
    summary_rows,
    table,
)
from littlelm.report.runs import ReportError, RunData, load_run_dir
from littlelm.report.summary import facts

__all__ = ["ReportError", "default_out", "write_report"]


def default_out(run_dirs: list[str | Path]) -> Path:
    """RUN_DIR/report for one run; report-A-vs-B in the current directory for several."""
    if len(run_dirs) == 1:
        return Path(run_dirs[0]) / "report"
    names = [Path(d).resolve().name for d in run_dirs]
    return Path("report-" + "-vs-".join(names))


def write_report(
    run_dirs: list[str | Path], out: str | Path | None = None, price_per_hour: float | None = None
) -> Path:
    """Write OUT/report.md and its PNGs; returns the Markdown file's path."""
    if not run_dirs:
        raise ReportError("name at least one run directory")
    if price_per_hour is not None and price_per_hour < 0:
        raise ReportError(f"--price-per-hour must be >= 0, got {price_per_hour}")
    runs = label_runs([load_run_dir(d) for d in run_dirs])
    out = Path(out) if out is not None else default_out(run_dirs)
    try:
        out.mkdir(parents=True, exist_ok=True)
        figs = render_figures(runs, out)
        path = out / "report.md"
        path.write_text(render_markdown(runs, figs, price_per_hour))
    except OSError as e:
        raise ReportError(f"cannot write the report to {out}: {e}; pass --out DIR") from e
    return path


def label_runs(runs: list[RunData]) -> list[RunData]:
    """Runs with the same run.name are told apart by their directories."""
    names = [r.name for r in runs]
    for r in runs:
        if names.count(r.name) > 1:
            r.name = str(r.path)
    return runs


def render_markdown(runs: list[RunData], figs, price: float | None) -> str:
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
    notes = [(r, [*r.notes, *missing_notes(r)]) for r in runs]
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

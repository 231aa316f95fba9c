"""`littlelm report`: a Markdown report with PNG plots of one run, or several compared.

    from littlelm.report import write_report
    write_report(["runs/a", "runs/b"], out="report-a-vs-b", price_per_hour=2.5)

runs.py reads run directories, catalog.py says what each metric is, figures.py and plots.py
draw, summary.py computes the summary's numbers and markdown.py writes the page.
"""

from __future__ import annotations

from pathlib import Path

from littlelm.report.figures import render_figures
from littlelm.report.markdown import render_markdown
from littlelm.report.runs import ReportError, RunData, load_run_dir

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

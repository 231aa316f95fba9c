"""`littlelm report`: its typed function, whose docstring is its --help (cli.py registers it)."""

from __future__ import annotations

from littlelm.cli_args import Dollars

# Each verb imports what it runs inside its body: `littlelm VERB --help` and tab completion import
# none of it.


def report(
    run_dirs: list[str], /, *, out: str | None = None, price_per_hour: Dollars = None
) -> None:
    """Write a Markdown report with plots of one or more runs (a sweep's: its comparison).

    examples:
      littlelm report runs/demo
      littlelm report runs/a runs/b --out cmp/ --price-per-hour 2.5

    Args:
        run_dirs: run directories to report on
        out: output directory (default RUN_DIR/report for one run, ./report-A-vs-B for several)
        price_per_hour: what the machine costs per hour (all its GPUs), to state each run's cost
    """
    from pathlib import Path

    from littlelm.report import write_report
    from littlelm.report.compare import is_sweep_dir, write_sweep_report

    if len(run_dirs) == 1 and is_sweep_dir(run_dirs[0]):
        path, table = write_sweep_report(run_dirs[0], price_per_hour)
        print(table)
    else:
        path = write_report([*map(Path, run_dirs)], out, price_per_hour)
    print(f"wrote {path} and its plots ({path.parent})")

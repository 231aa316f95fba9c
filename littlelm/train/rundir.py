"""The rules for run names and run directories (docs/reliability.md, "Run names and directories").

A run's directory is `run.out_dir/run.name`. littlelm writes into it, prunes checkpoints in it
and (in `bench`) deletes scratch files, so it must never be a directory that belongs to someone
else:

- `run.name` is one non-empty path component: no `/` or `\\`, not `.` or `..`, no NUL, at most
  200 bytes;
- the directory is absent, empty, or a run (it holds `.lock`, which every `littlelm train`
  creates before writing anything, or `checkpoints/`); any other non-empty directory is refused;
- `littlelm bench` works only inside a directory it made itself, marked by `BENCH_MARKER`, and a
  training run never uses such a directory.
"""

from __future__ import annotations

from pathlib import Path

from littlelm.errors import RunDirError

RUN_MARKERS = (".lock", "checkpoints")  # what makes a directory a run
BENCH_MARKER = ".littlelm-bench"  # written by `littlelm bench` into the directory it made


def is_run_dir(path: Path) -> bool:
    return any((path / m).exists() for m in RUN_MARKERS)


def check_run_dir(path: Path) -> None:
    """Refuse a run directory that holds something other than a run (module docstring)."""
    if (path / BENCH_MARKER).exists():
        raise RunDirError(
            f"{path} is a scratch directory of `littlelm bench`, not a run; choose another "
            "run.name (or delete the directory)"
        )
    if path.is_file():
        raise RunDirError(f"{path} is a file, not a run directory; choose another run.name")
    if not path.is_dir() or is_run_dir(path) or not any(path.iterdir()):
        return
    raise RunDirError(
        f"{path} already exists and is not a littlelm run directory (it holds other files, and "
        "no .lock or checkpoints/); choose another run.name or run.out_dir, or empty it"
    )

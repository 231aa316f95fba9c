"""The run directory: what may be one, and one trainer at a time in it (docs/reliability.md, "Run
names and directories").

A run's directory is `run.out_dir/run.name`. littlelm writes into it, prunes checkpoints in it
and (in `bench`) deletes scratch files, so it must never be a directory that belongs to someone
else:

- `run.name` is one non-empty path component: no `/` or `\\`, not `.` or `..`, no NUL, at most
  200 bytes;
- the directory is absent, empty, or a run (it holds `.lock`, which every `littlelm train`
  creates before writing anything, or `checkpoints/`); any other non-empty directory is refused;
- `littlelm bench` works only inside a directory it made itself, marked by `BENCH_MARKER`, and a
  training run never uses such a directory.

One trainer per run directory: Two processes training into the same run directory would prune each other's checkpoints and
interleave their metrics, e.g. when a restart loop starts a new `littlelm train` while the old
one is still saving. `RunLock` holds an exclusive `fcntl.flock` on RUN_DIR/.lock for the whole of
`fit()`; the kernel releases it when the process dies, even by SIGKILL, so a crashed run never
leaves a stale lock behind. (flock is advisory and local: on a network filesystem shared by
several machines it may not exclude a process on another machine.)
"""

from __future__ import annotations

import fcntl
import os
import warnings
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


class RunLock:
    def __init__(self, run_dir: Path):
        self.path = run_dir / ".lock"
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunDirError(
                f"cannot use the run directory {self.path.parent}: {e.strerror}; "
                "point run.out_dir at a writable directory"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirError(
                f"{self.path.parent} is in use by another littlelm process (pid {holder}); "
                "wait for it to finish or stop it, or train under another run.name"
            ) from None
        except OSError as e:  # ENOLCK, EOPNOTSUPP: a filesystem without locks
            os.close(fd)
            warnings.warn(
                f"cannot lock {self.path} ({e.strerror}); make sure no other littlelm process "
                "trains into this run directory",
                stacklevel=2,
            )
            return self
        try:  # the pid, for the message of a second process; a full disk fails here
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError as e:
            os.close(fd)
            raise RunDirError(
                f"cannot write to the run directory {self.path.parent}: {e.strerror}; free disk "
                "space, or point run.out_dir at a writable disk with room"
            ) from None
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

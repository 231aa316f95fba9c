"""User-facing errors.

Anything a user can cause (a bad config, a missing file, a corrupt shard, a run that does not fit)
raises a subclass of `LittleLMError`. The CLI prints its message, without a traceback, and exits
with its `exit_code`. Internal invariants use `assert` and surface as ordinary tracebacks.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class LittleLMError(Exception):
    """An error the user can fix; its message says what happened and how to fix it."""

    exit_code = 2


class ConfigError(LittleLMError):
    """One or more problems in a run's configuration, all reported together."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = problems
        head = f"{len(problems)} problem(s) in the configuration"
        head += f" {source}:" if source else ":"
        super().__init__("\n".join([head, *(f"  - {p}" for p in problems)]))


class DataError(LittleLMError):
    """Missing, unreadable, corrupt or mismatched data."""


class CheckpointError(LittleLMError):
    """A checkpoint that cannot be written, read or applied to this run."""


class DependencyError(LittleLMError):
    """An optional package that a configured feature needs is not installed."""


class EvalError(LittleLMError):
    """An evaluation that cannot run: a bad task list, task file, bundle or option."""


class RunDirError(LittleLMError):
    """A run directory that cannot be used: unwritable, or in use by another process."""


class DistributedError(LittleLMError):
    """A missing, inconsistent or broken multi-process environment (torchrun, ranks, devices)."""


class TrainingError(LittleLMError):
    """Training cannot go on (non-finite loss that rollback cannot cure, out of memory, ...)."""

    exit_code = 3


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest option, or '' when none is close."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""

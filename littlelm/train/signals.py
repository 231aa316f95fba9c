"""A clean stop on SIGTERM and SIGINT.

    with StopSignals() as stop:
        while training and not stop.requested:
            step()
        save()

The first SIGTERM (what schedulers and spot-instance reclaimers send) or SIGINT (Ctrl-C) only
sets `requested`: the trainer finishes the step in progress, saves a checkpoint and exits 0. A
second SIGINT raises KeyboardInterrupt at once, wherever the main thread is: a save in progress
is abandoned (its temporary directory is removed) and the previous checkpoint stays the newest.
A repeated SIGTERM changes nothing. In the command line (`persist`, set by `littlelm train`),
neither does any signal after the stop's save, during teardown: the process is on its way out,
so the signals are then ignored (SIG_IGN: a Python handler would not do, as the interpreter
puts the default back while it finalizes) and the documented exit 0 cannot become 143; a
scheduler that wants the process gone sends SIGKILL after its grace period, which the atomic
checkpoints survive. A Trainer used as a library (a notebook, a test, several trainers in one
process) gets the handlers in place before back when the stop ends: Ctrl-C works there again,
and the processes it starts later do not inherit SIG_IGN across exec (they could not be
stopped by SIGTERM).

The handler writes its notice with os.write on file descriptor 2: a signal handler that used a
buffered Python stream could interrupt the main thread in the middle of a write to that stream.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    def __init__(self, persist: bool = False) -> None:
        # after a stop, keep ignoring the signals until the process exits (the command line)
        self.persist = persist
        self.requested: str | None = None  # the name of the first signal received
        # a stop decided elsewhere: under torchrun, another rank's signal (`share`)
        self.agreed: str | None = None
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}

    def __enter__(self) -> StopSignals:
        self.requested = self.agreed = None
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        stopped = self.requested or self.agreed
        for sig, handler in self._previous.items():
            # a command line stopped by a signal is on its way out (teardown, interpreter exit):
            # a repeated signal there is ignored, so the exit stays 0 as promised instead of 143
            # or -2; on a rank stopped by another rank's signal too (torchrun would exit 1)
            signal.signal(sig, signal.SIG_IGN if stopped and self.persist else handler)
        self._previous.clear()

    def share(self, parallel, loss, norm) -> tuple[float, float]:
        """Under torchrun, once per step: the mean loss and largest gradient norm over the ranks
        (Parallel.agree_step), and a signal any rank received becomes `agreed` on every rank
        (counted from the step after it arrived, so all stop together)."""
        mine = signal.Signals[self.requested].value if self.requested else 0
        value, norm_value, agreed = parallel.agree_step(loss, norm, mine)
        if agreed and self.agreed is None:
            self.agreed = signal.Signals(agreed).name  # its teardown ignores signals too
        return value, norm_value

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is None:
            self.requested = name
            again = " (Ctrl-C again aborts at once)" if signum == signal.SIGINT else ""
            _notice(f"{name} received: finishing this step, saving a checkpoint, exiting{again}")
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt(f"second {name}")
        else:
            _notice(f"{name} received again: already stopping after the current step and save")


def _notice(text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"\n{text}\n".encode())

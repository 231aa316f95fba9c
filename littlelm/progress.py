"""The live progress line: rewritten in place on a terminal, one plain line per log step in a file.

Whatever goes through `Progress` is printable text: control characters (from generated samples,
say) are escaped, and cursor codes and colours are used only when the stream is a terminal, so a
log file or a pipe holds plain lines that grep and less read as they are.
"""

from __future__ import annotations

import re
import sys
import time

# C0/C1 control characters except tab and newline (ESC, CR, BEL, backspace, ...).
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character but tab and newline written as an escape (\\x1b)."""
    return CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def human(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


def duration(seconds: float) -> str:
    if seconds != seconds or seconds < 0 or seconds == float("inf"):  # NaN, or no end known
        return "?"
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def progress_line(m: dict, max_steps: int | str) -> str:
    parts = [
        f"step {m['step']}/{max_steps}",
        f"loss {m['loss']:.4f}",
        f"lr×{m['lr_mult']:.3f}",
        f"{human(m['tok_per_s'])} tok/s",
    ]
    if m.get("grad_norm") is not None:
        parts.insert(2, f"gnorm {m['grad_norm']:.3g}")
    if m.get("mfu") is not None:
        parts.append(f"MFU {100 * m['mfu']:.1f}%")
    parts.append(f"ETA {duration(m['eta_s'])}")
    if m.get("budget"):  # a time or money budget: spent so far (train/budget.py)
        parts.append(m["budget"])
    return " | ".join(parts)


class Progress:
    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self._open = False

    def console_options(self) -> dict:
        """Keyword arguments for a rich Console on this stream: colours only on a terminal
        (rich would otherwise honour FORCE_COLOR and write escape codes into a log file)."""
        if self.tty:
            return {"file": self.stream, "width": 100}
        return {"file": self.stream, "width": 100, "color_system": None, "force_terminal": False}

    def update(self, line: str) -> None:
        line = printable(line)
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            self._open = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A normal log message; ends an in-place progress line first."""
        if self._open:
            self.stream.write("\n")
            self._open = False
        self.stream.write(printable(text) + "\n")
        self.stream.flush()


class FirstSteps:
    """The first steps of a session, shown before the first `log_every` step: the time from the
    start of the loop to the first step (data loading, warm-up and compilation fall in it), then
    each of the next few steps with its time, so a slow start shows life instead of silence."""

    def __init__(self, start_step: int, log_every: int, count: int = 3):
        self.start, self.log_every, self.count = start_step, log_every, count
        self.t0 = self.last = time.perf_counter()

    def wants(self, step: int) -> bool:
        """True for the session's first step, and for the next ones up to `count` that are not
        log steps (those print the usual line)."""
        n = step - self.start
        return n == 1 or (n <= self.count and step % self.log_every != 0)

    def show(self, progress: Progress, step: int, max_steps: int, loss: float) -> None:
        """The first step as a line of its own (it stays on a terminal), the next in place."""
        text = self.line(step, max_steps, loss)
        if step - self.start == 1:
            progress.message(text)
        else:
            progress.update(text)

    def line(self, step: int, max_steps: int, loss: float) -> str:
        now = time.perf_counter()
        took, self.last = now - self.last, now
        if step - self.start == 1:
            return (
                f"step {step}/{max_steps} | loss {loss:.4f} | first step after {took:.1f}s "
                "(data loading, warm-up and compilation included)"
            )
        return f"step {step}/{max_steps} | loss {loss:.4f} | {took:.2f}s/step"

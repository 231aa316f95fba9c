"""The live progress line: rewritten in place on a terminal, one plain line per log step in a file.

Whatever goes through `Progress` is printable text: control characters (from generated samples,
say) are escaped, and cursor codes and colours are used only when the stream is a terminal, so a
log file or a pipe holds plain lines that grep and less read as they are.
"""

from __future__ import annotations

import re
import sys

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

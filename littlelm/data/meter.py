"""The progress line of `littlelm data prepare`: done share, units, MB/s, tokens/s, ETA.

On a terminal the line is rewritten in place twice a second; in a log file one line is written
every 10 seconds and when the last unit finishes.
"""

from __future__ import annotations

import time

from littlelm.data.sources import Unit
from littlelm.progress import Progress, duration, human


class Meter:
    def __init__(
        self, label: str, units: list[Unit], done: dict[int, dict], progress: Progress | None
    ):
        self.label, self.units = label, units
        self.progress = progress or Progress()
        self.total_input = sum(u.size for u in units) or 1
        self.done_units = set(done)
        self.done_input = sum(units[i].size for i in done)
        self.done_text = sum(r["bytes"] for r in done.values())
        self.start_text = self.text = self.done_text  # text bytes, this session's start and now
        self.tokens = 0
        self.t0 = self.last = time.monotonic()
        self.interval = 0.5 if self.progress.tty else 10.0
        self.frac0 = self.fraction()

    def add(self, text_bytes: int, tokens: int) -> None:
        self.text += text_bytes
        self.tokens += tokens
        self._tick()

    def unit_done(self, uid: int, record: dict) -> None:
        self.done_units.add(uid)
        self.done_input += self.units[uid].size
        self.done_text += record["bytes"]
        self._tick(force=len(self.done_units) == len(self.units))

    def _tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.interval:
            self.last = now
            self.progress.update(self.line(now))

    def fraction(self) -> float:
        if len(self.done_units) == len(self.units):
            return 1.0
        ratio = self.done_text / self.done_input if self.done_input else 1.0  # text per input byte
        return min(0.99, self.text / max(1.0, self.total_input * ratio))

    def line(self, now: float | None = None) -> str:
        secs = max(1e-9, (now or time.monotonic()) - self.t0)
        rate = (self.text - self.start_text) / secs
        frac = self.fraction()
        gained = frac - self.frac0
        eta = "0s" if frac >= 1 else (duration(secs * (1 - frac) / gained) if gained > 0 else "?")
        return (
            f"prepare {self.label}: {100 * frac:.0f}% | {len(self.done_units)}/{len(self.units)} units"
            f" | {rate / 1e6:.1f} MB/s | {human(self.tokens / secs)} tok/s"
            f" | {human(self.tokens)} tokens | ETA {eta}"
        )

    def close(self) -> None:
        if self.progress._open:
            self.progress.message("")

"""A plain-text progress line on stderr: done/total, rate and the time left."""

from __future__ import annotations

import sys
import time


def _fmt_s(s: float) -> str:
    s = max(0.0, s)
    return f"{s:.0f}s" if s < 90 else f"{s // 60:.0f}m{s % 60:02.0f}s"


class Progress:
    """Counts weighted work units; ``step`` redraws at most every ``every_s`` seconds.

    On a terminal the line is redrawn in place; elsewhere (logs, pipes) a new line is
    printed at most every 10 seconds. ``stream=None`` disables output.
    """

    def __init__(self, total: float, *, stream=sys.stderr, every_s: float = 0.2):
        self.total, self.done = float(total), 0.0
        self.stream, self.start = stream, time.perf_counter()
        self._tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self._every_s = every_s if self._tty else 10.0
        self._last = -1e9

    def add_total(self, units: float) -> None:
        self.total += units

    def eta_s(self) -> float:
        elapsed = time.perf_counter() - self.start
        if self.done <= 0:
            return float("nan")
        return elapsed / self.done * max(self.total - self.done, 0.0)

    def step(self, units: float = 1.0, what: str = "", force: bool = False) -> None:
        self.done += units
        now = time.perf_counter()
        if self.stream is None or (not force and now - self._last < self._every_s):
            return
        self._last = now
        frac = min(self.done / self.total, 1.0) if self.total > 0 else 1.0
        bar = "#" * int(24 * frac) + "." * (24 - int(24 * frac))
        eta = self.eta_s()
        line = (f"[{bar}] {100 * frac:5.1f}%  {_fmt_s(now - self.start)} elapsed, "
                f"{'?' if eta != eta else _fmt_s(eta)} left  {what[:40]}")
        if self._tty:
            self.stream.write("\r" + line.ljust(100))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self._tty:
            self.stream.write("\n")
            self.stream.flush()

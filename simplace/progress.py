"""Progress on stderr: the one place that decides how simplace reports long work.

* ``note(message)``: a status line ``  [message]``; the CLI's progress callback (tracing,
  search and validation messages).
* ``Throttle``: true at most once every so many seconds, for messages that would
  otherwise come once per step.
* ``Line``: a throttled one-line status. On a terminal it is redrawn in place (``\\r``)
  at most every ``every_s`` seconds (0.2 s); elsewhere (a log file, a pipe) each update is
  a new line, at most every ``plain_every_s`` seconds (10 s), so logs stay readable.
* ``Progress``: a step counter over weighted work units with a bar, the time spent and
  the time left, drawn on a ``Line`` (calibration).

``Line`` and ``Progress`` write to the ``sys.stderr`` of the moment they are made unless
given a stream; ``stream=None`` makes them silent.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

TTY_EVERY_S = 0.2  # seconds between redraws of a line on a terminal
PLAIN_EVERY_S = 10.0  # seconds between lines written to a log or a pipe
BAR_WIDTH = 24

_STDERR = object()  # default stream: sys.stderr when the Line is made (tests swap it)


def note(message: str, stream: TextIO | None = None) -> None:
    """Write ``  [message]`` as a line on ``stream`` (default: stderr), at once."""
    print(f"  [{message}]", file=sys.stderr if stream is None else stream, flush=True)


def is_tty(stream) -> bool:
    """Whether ``stream`` is a terminal (redrawn in place) rather than a file or pipe."""
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """``[######..................]``: ``fraction`` (clipped to 0..1) of ``width`` filled."""
    n = int(width * min(max(fraction, 0.0), 1.0))
    return f"[{'#' * n}{'.' * (width - n)}]"


def format_duration(s: float) -> str:
    """``42s`` under 90 seconds, else ``3m07s``."""
    s = max(0.0, s)
    return f"{s:.0f}s" if s < 90 else f"{s // 60:.0f}m{s % 60:02.0f}s"


class Throttle:
    """Calling it says whether at least ``every_s`` seconds passed since it last said
    yes (the first call says yes; ``force=True`` always does)."""

    def __init__(self, every_s: float, clock: Callable[[], float] = time.perf_counter):
        self.every_s, self.clock, self.last = every_s, clock, -float("inf")

    def __call__(self, force: bool = False) -> bool:
        now = self.clock()
        if not force and now - self.last < self.every_s:
            return False
        self.last = now
        return True


class Line:
    """A one-line status on ``stream``, redrawn in place on a terminal and written as
    plain lines elsewhere (see the module docstring).

    ``due(force)`` says whether an update would be shown now (and, if so, counts it as
    shown), so callers build the text only when it is; ``update(text)`` is both.
    """

    def __init__(self, stream=_STDERR, *, every_s: float = TTY_EVERY_S,
                 plain_every_s: float = PLAIN_EVERY_S,
                 clock: Callable[[], float] = time.perf_counter):
        self.stream = sys.stderr if stream is _STDERR else stream
        self.tty = is_tty(self.stream)
        self.throttle = Throttle(every_s if self.tty else plain_every_s, clock)
        self._width = 0  # of the text drawn last on the terminal, to blank its leftovers
        self.drawn = False

    def due(self, force: bool = False) -> bool:
        """Whether to draw now (at most once per period unless ``force``)."""
        return self.stream is not None and self.throttle(force)

    def draw(self, text: str) -> None:
        """Show ``text`` now, whatever the throttle says."""
        if self.stream is None:
            return
        if self.tty:
            self.stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
            self.drawn = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def update(self, text: str, force: bool = False) -> bool:
        """Draw ``text`` if due; whether it was drawn."""
        if not self.due(force):
            return False
        self.draw(text)
        return True

    def close(self) -> None:
        """End the terminal line, so what follows starts on a line of its own."""
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn, self._width = False, 0


class Progress:
    """Counts weighted work units; ``step`` redraws at most every ``every_s`` seconds on a
    terminal, and every 10 seconds elsewhere (logs, pipes). ``stream=None``: silent.

    Weights in rough seconds make the time left sensible from the first step on.
    """

    def __init__(self, total: float, *, stream=_STDERR, every_s: float = TTY_EVERY_S,
                 clock: Callable[[], float] = time.perf_counter):
        self.total, self.done = float(total), 0.0
        self.clock = clock
        self.start = clock()
        self.line = Line(stream, every_s=every_s, clock=clock)

    def add_total(self, units: float) -> None:
        """More work found on the way."""
        self.total += units

    def eta_s(self) -> float:
        """Seconds left at the rate so far; NaN before any work is done."""
        if self.done <= 0:
            return float("nan")
        return (self.clock() - self.start) / self.done * max(self.total - self.done, 0.0)

    def step(self, units: float = 1.0, what: str = "", force: bool = False) -> None:
        """``units`` more done, ``what`` being the work just finished or now started."""
        self.done += units
        if not self.line.due(force):
            return
        frac = min(self.done / self.total, 1.0) if self.total > 0 else 1.0
        eta = self.eta_s()
        self.line.draw(f"{bar(frac)} {100 * frac:5.1f}%  "
                       f"{format_duration(self.clock() - self.start)} elapsed, "
                       f"{'?' if eta != eta else format_duration(eta)} left  {what[:40]}")

    def close(self) -> None:
        """End the line on a terminal."""
        self.line.close()

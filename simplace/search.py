"""One search session: what every search method (``local``, ``rl-*``) shares.

A search scores batches of candidate placements until a stop. What is common to all of
them lives here, once:

* the **clock**: the budget runs from the moment ``optimize`` was called, so start
  heuristics, warm starts and compilation all count; a step is started only when it is
  expected to end before the deadline (its expected length is the longest of the last
  few steps, or the first step's after a recompilation), so a search returns within the
  budget plus about one step. The first batch (the first scored placements, whose
  compilation cannot be predicted) is always built: ``first_batch_s`` says when it was
  ready, and a search returns by ``1.1 * budget_s + first_batch_s``.
* the **stop reason** (``"time budget"``, ``"interrupted"`` and the method's own);
* the **best placement** and a store of the ``top_k`` best distinct placements, ranked by
  penalised score (``penalised``: OOM placements ``OOM_PENALTY`` behind every placement
  that fits);
* the **history** rows (each gets ``wall_s``) and the **progress** line;
* the **validation hook** ``hook(step, candidates, cost_model) -> CostModel | None``,
  called every ``validate_every`` steps (0: only at the end, where ``step`` is -1) with the
  kept placements, best first. A returned cost model (drift-corrected, see
  ``simplace.validate.make_validation_callback``) is what the search is judged under from
  then on: the session re-scores what it keeps under it and records it, so the result
  says which model its score belongs to (``SearchSession.cost_model``).
* **interrupts**: ``request_stop()`` (or SIGINT/SIGTERM inside ``stop_on_signals()``,
  which the CLI uses) makes every running session stop at its next step with stop reason
  ``"interrupted"``, keeping what it found; a second signal raises KeyboardInterrupt.

The session does not score placements itself: each method scores in its own way (the
batched simulator, or inside RL's jitted update) and reports scores to it.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from simplace._argtypes import check_int
from simplace.progress import Line, Throttle
from simplace.progress import bar as bar_text

# An OOM placement scores as if it took this much longer; large enough that any placement
# that fits wins, while still ordering OOM placements by step time.
OOM_PENALTY = 1e6

# (step, candidates best first, the cost model the search uses now) -> a corrected
# cost model to go on against, or None. ``step`` is -1 on the call at the end.
ValidationHook = Callable[[int, Sequence[np.ndarray], Any], Any]


def _hook(value):
    if not callable(value):
        raise TypeError(f"value must be a callable (step, candidates, cost_model) -> "
                        f"CostModel | None, got {type(value).__name__}.")
    return value


# The options every search method takes, each as ``(doc, default, parse)``: the fields of
# a typed ``simplace.placers.Option``, which each search method declares
# (``Option(*spec)``; the registry sits above this module, which cannot import it).
SESSION_OPTIONS = {
    "validate": ("validation hook (step, candidates, cost_model) -> CostModel | None",
                 None, _hook),
    "validate_every": ("call the hook every N steps (rounds or updates); 0 (the default): "
                       "at the end only", 0, lambda v: check_int(v, "value", 0)),
    "top_k": ("distinct best placements kept and handed to the hook (default 5)", 5,
              lambda v: check_int(v, "value", 1)),
}
PROGRESS_EVERY_S = 3.0  # seconds between progress messages
_RECENT = 3  # steps whose longest duration predicts the next one's


def penalised(step_time_s, oom) -> np.ndarray:
    """Step times with OOM placements pushed behind every placement that fits."""
    step = np.asarray(step_time_s, dtype=np.float64)
    return np.where(np.asarray(oom), step + OOM_PENALTY, step)


def penalised_text(score: float) -> str:
    """A penalised step time as text: milliseconds, and whether it is out of memory."""
    if score >= OOM_PENALTY:
        return f"{(score - OOM_PENALTY) * 1e3:.3f} ms, out of memory"
    return f"{score * 1e3:.3f} ms"


# ------------------------------------------------------------------------ interrupts
_STOP = threading.Event()


def request_stop() -> None:
    """Ask every running search to stop at its next step and return what it found."""
    _STOP.set()


def stop_requested() -> bool:
    """Whether ``request_stop`` was called (or a signal arrived in ``stop_on_signals``)."""
    return _STOP.is_set()


def clear_stop() -> None:
    """Forget an earlier stop request (a new search should run)."""
    _STOP.clear()


@contextlib.contextmanager
def stop_on_signals(signals=(signal.SIGINT, signal.SIGTERM), message=None):
    """While inside, the first SIGINT/SIGTERM requests a graceful stop (searches return
    their best so far with stop reason ``"interrupted"``); a second raises
    KeyboardInterrupt. Yields a dict whose ``"signal"`` is the first signal's name (or
    None). Main thread only (Python's rule for signal handlers); elsewhere it does
    nothing. ``message(text)`` is told when a stop is requested."""
    got: dict[str, Any] = {"signal": None}
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def handler(signum, _frame):
        if got["signal"] is not None:
            raise KeyboardInterrupt
        got["signal"] = signal.Signals(signum).name
        request_stop()
        if message is not None:
            message(f"{got['signal']}: stopping at the next step and keeping the best "
                    "placement so far (send it again to stop at once, keeping nothing more)")

    old = {s: signal.signal(s, handler) for s in signals}
    clear_stop()
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        clear_stop()  # a later search in this process must not stop at once


# ------------------------------------------------------------------------ the store
class TopK:
    """The ``k`` best distinct placements seen, with their scores (lower is better)."""

    def __init__(self, k: int):
        self.k = int(k)
        self.items: dict[bytes, tuple[float, np.ndarray]] = {}

    def add(self, p: np.ndarray, score: float) -> None:
        """Keep ``p`` if it is among the ``k`` best (a placement already kept gets the
        new score)."""
        key = np.asarray(p, np.int32).tobytes()
        if key in self.items or len(self.items) < self.k or score < max(
                s for s, _ in self.items.values()):
            self.items[key] = (float(score), np.asarray(p, np.int32).copy())
            if len(self.items) > self.k:
                worst = max(self.items, key=lambda q: self.items[q][0])
                del self.items[worst]

    def ranked(self) -> list[tuple[float, np.ndarray]]:
        """[(score, placement)], best first."""
        return sorted(self.items.values(), key=lambda sp: sp[0])

    def placements(self) -> list[np.ndarray]:
        """The kept placements, best first."""
        return [p for _, p in self.ranked()]


# ------------------------------------------------------------------------ progress
class ProgressLine:
    """The one progress display of a search: a message through ``progress`` every few
    seconds, or (``bar=True``) a status line on stderr (``simplace.progress.Line``:
    redrawn in place on a terminal, plain lines in a log)."""

    def __init__(self, label: str, progress: Callable[[str], None] | None, *,
                 bar: bool = False, total: int | None = None, unit: str = "evaluations",
                 stream=None):
        self.label, self.progress, self.bar, self.total, self.unit = (
            label, progress, bar, total, unit)
        self.line = Line(stream if stream is not None else sys.stderr) if bar else None
        self.every = Throttle(PROGRESS_EVERY_S)

    def show(self, count: int, rate: float, best_s: float, current_s: float,
             current_name: str = "current", elapsed_s: float | None = None,
             budget_s: float | None = None, force: bool = False) -> None:
        """Report ``count`` evaluations at ``rate`` per second, the best and the current
        (or batch mean) step time; at most every 0.2 s (bar on a terminal), 10 s (bar in
        a log) or 3 s (messages)."""
        if self.bar:
            if not self.line.due(force):
                return
        elif self.progress is None or not self.every(force):
            return
        cur = "-" if not math.isfinite(current_s) else f"{_ms(current_s)} ms"
        clock = ""
        if elapsed_s is not None:
            clock = f", {elapsed_s:.0f}" + (f"/{budget_s:.3g} s" if budget_s else " s")
        if self.bar:
            head = (f"{bar_text(count / self.total)} {count}/{self.total}" if self.total
                    else f"{count}")
            self.line.draw(f"{self.label} {head} {self.unit}, {rate:,.0f}/s, best "
                           f"{_ms(best_s)} ms, {current_name} {cur}{clock}")
        else:
            self.progress(f"{self.label}: {count} {self.unit} ({rate:,.0f}/s), best "
                          f"{_ms(best_s)} ms, {current_name} {cur}{clock}")

    def close(self) -> None:
        """End the bar's line."""
        if self.line is not None:
            self.line.close()


def _ms(t: float) -> str:
    if t >= OOM_PENALTY:
        return f"{(t - OOM_PENALTY) * 1e3:.4g} (OOM)"
    return f"{t * 1e3:.4g}"


# ------------------------------------------------------------------------ the session
class SearchSession:
    """The clock, best placement, kept candidates, history, progress and validation of
    one search (see the module docstring).

    Args:
      label: the method's name (progress messages).
      cost_model: the model the search starts under (``cost_model`` follows the hook).
      budget_s: wall-time budget (None: no deadline).
      t_begin: ``time.perf_counter()`` when the work began (default: now).
      hook, validate_every, top_k: the validation hook and how often; placements kept.
      progress: ``progress(message)``; bar/total/unit: see ``ProgressLine``.
    """

    def __init__(self, label: str, cost_model, *, budget_s: float | None = None,
                 t_begin: float | None = None, hook: ValidationHook | None = None,
                 validate_every: int = 0, top_k: int = 5,
                 progress: Callable[[str], None] | None = None, bar: bool = False,
                 total: int | None = None, unit: str = "evaluations"):
        from simplace.errors import OptionError

        if hook is not None and not callable(hook):
            raise OptionError(f"{label}: validate must be a callable (step, candidates, "
                              f"cost_model) -> CostModel | None, got {type(hook).__name__}.")
        if int(validate_every) < 0 or int(top_k) < 1:
            raise OptionError(f"{label}: validate_every must be >= 0 and top_k >= 1, got "
                              f"{validate_every} and {top_k}.")
        if budget_s is not None and not (float(budget_s) > 0 and math.isfinite(budget_s)):
            raise OptionError(f"{label}: the time budget must be a positive number of "
                              f"seconds, got {budget_s}.")
        self.label = label
        self.cost_model = cost_model
        self.budget_s = None if budget_s is None else float(budget_s)
        self.t_begin = time.perf_counter() if t_begin is None else float(t_begin)
        self.deadline = math.inf if budget_s is None else self.t_begin + float(budget_s)
        self.hook, self.validate_every = hook, int(validate_every)
        self.top = TopK(max(int(top_k), 1))
        self.best: np.ndarray | None = None
        self.best_score = math.inf
        self.history: list[dict] = []
        self.stop: str | None = None
        self.first_batch_s: float | None = None
        self.over_budget = False  # the first batch alone took longer than the budget
        self.validation = {"calls": 0, "corrections": 0}
        self.line = ProgressLine(label, progress, bar=bar, total=total, unit=unit)
        self._progress = progress
        self._durations: list[float] = []
        self._step_start: float | None = None
        self._expect: float | None = None  # a recompilation is due: the first step's time
        self._marks: dict[str, float] = {}

    # ---------------------------------------------------------------- clock
    def elapsed(self) -> float:
        """Seconds since the work began."""
        return time.perf_counter() - self.t_begin

    def time_left(self) -> float:
        """Seconds to the deadline (inf without a budget)."""
        return self.deadline - time.perf_counter()

    def step_started(self) -> None:
        """Mark the start of a step (a round, an update); ``step_done`` ends it."""
        self._step_start = time.perf_counter()

    def step_done(self) -> None:
        """Mark the end of a step; the first one ends the first batch. A step that
        compiled (the first, or one after ``expect_compile``) does not predict the next."""
        now = time.perf_counter()
        compiled = self.first_batch_s is None or self._expect is not None
        if self.first_batch_s is None:
            self.first_batch_s = now - self.t_begin
            self._first_batch_over()
        if self._step_start is not None and not compiled:
            self._durations.append(now - self._step_start)
            del self._durations[:-_RECENT]
        self._step_start = None
        self._expect = None

    def first_batch_ready(self) -> None:
        """Mark the first scored placements (when that is not a step, e.g. the starts of
        a local search)."""
        if self.first_batch_s is None:
            self.first_batch_s = self.elapsed()
            self._first_batch_over()

    def _first_batch_over(self) -> None:
        """Say so when the first batch alone took longer than the whole budget (its
        compilation cannot be bounded): the search stops at once with what it has."""
        if self.budget_s is not None and self.first_batch_s > self.budget_s:
            self.over_budget = True
            self.note(f"its first batch (compilation included) took "
                      f"{self.first_batch_s:.1f} s, past its {self.budget_s:.3g} s budget: "
                      "it stops there with the best so far (a larger budget lets it search)")

    def expect_compile(self, seconds: float | None = None) -> None:
        """The next step recompiles (a new cost model): expect it to take ``seconds``
        (default: as long as the first batch took)."""
        self._expect = seconds if seconds is not None else (self.first_batch_s or 0.0)

    def expected_step_s(self) -> float:
        """How long the next step is expected to take (0 before any step)."""
        est = max(self._durations, default=0.0)
        return max(est, self._expect or 0.0)

    def should_stop(self) -> str | None:
        """``"interrupted"`` after ``request_stop``; ``"time budget"`` when the next step
        is not expected to end before the deadline (never before the first batch is
        ready); else None. Sets ``stop``."""
        if stop_requested():
            self.stop = "interrupted"
        elif self.first_batch_s is not None and \
                time.perf_counter() + self.expected_step_s() > self.deadline:
            self.stop = "time budget"
        return self.stop if self.stop in ("interrupted", "time budget") else None

    def due(self, name: str, every_s: float) -> bool:
        """True at most every ``every_s`` seconds per ``name`` (periodic saves); the first
        call only starts the period."""
        now = time.perf_counter()
        last = self._marks.setdefault(name, now)
        if every_s > 0 and now - last >= every_s:
            self._marks[name] = now
            return True
        return False

    # ---------------------------------------------------------------- results
    def offer(self, placement: np.ndarray, score: float) -> bool:
        """Report a scored placement (penalised score); True when it is a new best."""
        score = float(score)
        self.top.add(placement, score)
        if score < self.best_score:
            self.best, self.best_score = np.asarray(placement, np.int32).copy(), score
            return True
        return False

    def record(self, row: dict, wall_offset_s: float = 0.0) -> None:
        """Append a history row; ``wall_s`` (seconds since the work began, plus
        ``wall_offset_s``, e.g. an earlier run's time) is added."""
        self.history.append({"wall_s": wall_offset_s + self.elapsed(), **row})

    def show(self, count: int, rate: float, current_s: float, current_name: str = "current",
             force: bool = False) -> None:
        """The progress line (see ``ProgressLine.show``)."""
        self.line.show(count, rate, self.best_score, current_s, current_name,
                       self.elapsed(), self.budget_s, force=force)

    def note(self, message: str) -> None:
        """A one-off message through ``progress``."""
        if self._progress is not None:
            self._progress(f"{self.label}: {message}")

    # ---------------------------------------------------------------- validation
    def validation_due(self, step: int) -> bool:
        """Whether the hook is to be called after step ``step`` (1-based)."""
        return self.hook is not None and self.validate_every > 0 and \
            step % self.validate_every == 0

    def validate(self, step: int, rescore: Callable[[Any, np.ndarray], np.ndarray]):
        """Call the hook with the kept placements (best first) and the current model.

        When it returns a cost model, the session switches to it: the kept placements and
        the best are re-scored with ``rescore(new_model, placements int32[B, M]) ->
        float64[B]`` (penalised scores) and re-ranked, and the new model is returned (the
        caller points its simulators at it); else None. ``step`` -1: the final call."""
        if self.hook is None:
            return None
        held = self.top.placements()
        if self.best is not None and not any(np.array_equal(self.best, p) for p in held):
            held.append(self.best)
        if not held:
            return None
        self.validation["calls"] += 1
        new = self.hook(int(step), list(held), self.cost_model)
        if new is None:
            return None
        self.validation["corrections"] += 1
        self.cost_model = new
        scores = np.asarray(rescore(new, np.stack(held)), dtype=np.float64)
        self.top = TopK(self.top.k)
        self.best, self.best_score = None, math.inf
        for p, s in zip(held, scores, strict=True):
            self.offer(p, float(s))
        self.expect_compile()
        return new

    def finish(self, stop: str | None = None) -> dict:
        """Close the progress line; the session's figures for ``info``: stop reason, wall
        and first-batch times, budget, validation calls."""
        if stop is not None and self.stop not in ("interrupted",):
            self.stop = stop
        self.line.close()
        info = {"stop": self.stop or "done", "wall_s": self.elapsed(),
                "first_batch_s": self.first_batch_s, "budget_s": self.budget_s,
                "first_batch_over_budget": self.over_budget}
        if self.hook is not None:
            info["validation"] = dict(self.validation)
        return info

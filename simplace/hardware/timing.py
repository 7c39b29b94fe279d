"""One timing harness for ops, links and whole placements.

``time_fn`` runs a function a few times to warm up (compilation, caches, allocator),
then repeats it until the median is stable, ``max_repeats`` is reached or a time budget
is spent, blocking on the results each time. ``robust_stats`` summarises samples with
statistics that a few slow runs (a context switch, a page fault) cannot move: the
median, the median absolute deviation (MAD) and a count of the outliers left out.
Every sample is kept, outliers included, so that records can be audited and refitted.

Importing this module does not start a JAX backend; ``jax`` is imported when a function
is timed.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from simplace.errors import CalibrationError

# 1.4826 * MAD estimates the standard deviation of normal data.
MAD_TO_SIGMA = 1.4826
# Iglewicz & Hoaglin's cut-off for the modified z-score: |x - median| / (1.4826 MAD).
OUTLIER_Z = 3.5
# The standard error of a sample median is sqrt(pi / 2) ~ 1.2533 times that of the mean.
_MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)
# Timers are not finer than this; it keeps the spread of identical samples above zero.
_TIMER_RESOLUTION_S = 1e-9


@dataclasses.dataclass(frozen=True)
class Timing:
    """Robust summary of repeated timings of one thing.

    Attributes:
      median_s: median of the samples left after dropping outliers (seconds).
      mad_s: median absolute deviation of those samples from ``median_s`` (seconds).
      samples_s: every sample in the order taken, outliers included (seconds).
      outliers_dropped: how many samples the modified z-score rule left out.
      repeats: number of timed runs (``len(samples_s)``), warm-up runs not counted.
    """

    median_s: float
    mad_s: float
    samples_s: tuple[float, ...]
    outliers_dropped: int
    repeats: int

    def __post_init__(self):
        object.__setattr__(self, "samples_s", tuple(float(s) for s in self.samples_s))
        if self.repeats != len(self.samples_s):
            raise CalibrationError(f"Timing.repeats is {self.repeats} but there are "
                                   f"{len(self.samples_s)} samples; they must agree.")

    @property
    def rel_mad(self) -> float:
        """``mad_s / median_s``: the relative spread of the samples (inf at median 0)."""
        return self.mad_s / self.median_s if self.median_s > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (every field, samples as a list)."""
        return {"median_s": self.median_s, "mad_s": self.mad_s,
                "samples_s": list(self.samples_s), "outliers_dropped": self.outliers_dropped,
                "repeats": self.repeats}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Timing:
        """Inverse of ``to_dict``; the statistics are recomputed from the samples so that
        a hand-edited record cannot disagree with itself."""
        if not isinstance(d, Mapping) or "samples_s" not in d:
            raise CalibrationError("A timing must be an object with a 'samples_s' list of "
                                   f"seconds, got {d!r}.")
        return robust_stats(d["samples_s"])


def robust_stats(samples_s: Sequence[float]) -> Timing:
    """Robust ``Timing`` of given samples (seconds).

    Samples whose modified z-score ``|x - median| / (1.4826 MAD)`` exceeds 3.5 are
    outliers: they are counted, kept in ``samples_s``, and left out of ``median_s`` and
    ``mad_s``. Samples are rounded to the nanosecond (the timer's resolution; it halves
    the records files). Raises CalibrationError for an empty, non-finite or negative
    sample list.
    """
    try:
        x = np.asarray([float(s) for s in samples_s], dtype=np.float64)
    except (TypeError, ValueError):
        raise CalibrationError(f"Timing samples must be numbers of seconds, got "
                               f"{samples_s!r}.") from None
    if x.size == 0:
        raise CalibrationError("No timing samples: time the function at least once.")
    if not np.all(np.isfinite(x)) or np.any(x < 0):
        raise CalibrationError(f"Timing samples must be finite and >= 0, got {x.tolist()}.")
    x = np.round(x, 9)
    keep = _inliers(x)
    kept = x[keep]
    med = float(np.median(kept))
    mad = float(np.median(np.abs(kept - med)))
    return Timing(median_s=med, mad_s=mad, samples_s=tuple(x.tolist()),
                  outliers_dropped=int(x.size - keep.sum()), repeats=int(x.size))


def _inliers(x: np.ndarray) -> np.ndarray:
    med = np.median(x)
    mad = np.median(np.abs(x - med))
    # With half the samples equal MAD is 0 and every other sample would be an outlier;
    # a floor of 1% of the median (and the timer's resolution) keeps honest jitter in.
    scale = MAD_TO_SIGMA * max(mad, 0.01 * abs(med), _TIMER_RESOLUTION_S)
    return np.abs(x - med) <= OUTLIER_Z * scale


def _stable(samples: list[float], rel_tol: float) -> bool:
    """True when the standard error of the median is within ``rel_tol`` of it."""
    x = np.asarray(samples)
    x = x[_inliers(x)]
    med = float(np.median(x))
    if med <= 0:
        return True
    sigma = MAD_TO_SIGMA * float(np.median(np.abs(x - med)))
    return _MEDIAN_SE_FACTOR * sigma / math.sqrt(x.size) <= rel_tol * med


def _check_args(warmup, min_repeats, max_repeats, budget_s, rel_tol):
    for name, v in (("warmup", warmup), ("min_repeats", min_repeats),
                    ("max_repeats", max_repeats)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise CalibrationError(f"{name} must be an int >= 0, got {v!r}.")
    if max_repeats < 1:
        raise CalibrationError(f"max_repeats must be >= 1, got {max_repeats}.")
    if min_repeats > max_repeats:
        raise CalibrationError(f"min_repeats ({min_repeats}) must be <= max_repeats "
                               f"({max_repeats}).")
    if not (isinstance(budget_s, (int, float)) and budget_s >= 0):
        raise CalibrationError(f"budget_s must be a number of seconds >= 0, got {budget_s!r}.")
    if not (isinstance(rel_tol, (int, float)) and rel_tol >= 0):
        raise CalibrationError(f"rel_tol must be a fraction >= 0, got {rel_tol!r}.")


def time_fn(fn: Callable[..., Any], *args: Any, warmup: int = 2, min_repeats: int = 5,
            max_repeats: int = 100, budget_s: float = 1.0, rel_tol: float = 0.02,
            timer: Callable[[], float] = time.perf_counter,
            dispatch_s: list | None = None) -> Timing:
    """Time ``fn(*args)`` robustly, blocking on its results each run.

    Args:
      fn: called as ``fn(*args)``; returns a pytree of JAX arrays (or anything
        ``jax.block_until_ready`` accepts), which is waited for inside each sample.
      warmup: untimed runs first (compilation, caches, allocation).
      min_repeats: timed runs always made (at least one, even if 0 is given).
      max_repeats: timed runs never exceeded.
      budget_s: after ``min_repeats``, stop once this many seconds were spent timing
        (warm-up included).
      rel_tol: stop once the standard error of the median is within this fraction of
        the median (checked after each round of ``max(min_repeats, 3)`` runs).
      timer: clock in seconds (``time.perf_counter``); tests pass a fake one.
      dispatch_s: a list to which each timed run's host time is appended: from the call
        to its return, before the wait (the device idle at each call, as every run is
        waited for before the next).

    Returns:
      A ``Timing`` with every sample and robust statistics (see ``robust_stats``).
    """
    _check_args(warmup, min_repeats, max_repeats, budget_s, rel_tol)
    import jax  # lazily: importing the harness must not start a backend

    start = timer()
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    # Samples are taken in back-to-back rounds and the stopping rule is checked only
    # between rounds: work done between two runs (the statistics) evicts the dispatch
    # path from the caches and makes the next run measurably slower on small ops.
    round_size = max(min_repeats, 3)
    samples: list[float] = []
    while len(samples) < max_repeats:
        for _ in range(min(round_size, max_repeats - len(samples))):
            t0 = timer()
            res = fn(*args)
            if dispatch_s is not None:
                dispatch_s.append(max(timer() - t0, 0.0))
            jax.block_until_ready(res)
            samples.append(max(timer() - t0, 0.0))
            if len(samples) >= max(min_repeats, 1) and timer() - start >= budget_s:
                return robust_stats(samples)
        if len(samples) >= max(min_repeats, 3) and _stable(samples, rel_tol):
            break
    return robust_stats(samples)

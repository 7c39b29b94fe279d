"""Local moves on a unit placement: what REINFORCE's best samples are refined with.

A policy proposes; the best placement the run has sampled (its elite) is then improved
greedily by block moves scored with the batched simulator, and the improved placement
goes back to the policy as the target of self-imitation (``reinforce.Trainer``). Moves
act on *runs*, maximal ranges of consecutive units (topological order) on one device,
because under segment semantics every change of device costs a segment launch and a
dispatch: a good placement has few runs, and the useful moves shift run boundaries or
move whole runs:

* every run to every other device;
* every boundary between two runs shifted by one unit, either way;
* every run merged into both its neighbours' devices at once (the run disappears).

All candidates are fixed by the elite (no randomness), so refinement is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def runs(units: np.ndarray) -> np.ndarray:
    """int64[R + 1]: where each run of equal devices starts (and the end, U)."""
    u = len(units)
    change = np.flatnonzero(units[1:] != units[:-1]) + 1
    return np.concatenate([[0], change, [u]]).astype(np.int64)


def block_moves(units, num_devices: int) -> np.ndarray:
    """int32[C, U]: the distinct neighbours of unit placement ``units`` (module doc),
    without ``units`` itself; in a fixed order (boundary shifts first: the cheapest
    changes, then run moves)."""
    units = np.asarray(units, np.int32)
    u = len(units)
    if u == 0 or num_devices < 2:
        return np.zeros((0, u), np.int32)
    starts = runs(units)
    out = []
    # Boundary shifts: the first unit of run r joins run r-1, or the last unit of run
    # r-1 joins run r.
    for b in starts[1:-1]:
        a = units.copy()
        a[b] = units[b - 1]
        out.append(a)
        a = units.copy()
        a[b - 1] = units[b]
        out.append(a)
    for r in range(len(starts) - 1):
        lo, hi = starts[r], starts[r + 1]
        for d in range(num_devices):
            if d != units[lo]:
                a = units.copy()
                a[lo:hi] = d
                out.append(a)
    if not out:
        return np.zeros((0, u), np.int32)
    cand = np.unique(np.stack(out), axis=0)
    keep = ~np.all(cand == units[None], axis=1)
    return cand[keep]


def refine(score: Callable[[np.ndarray], np.ndarray], units, units_score: float,
           num_devices: int, batch: int, max_batches: int) -> tuple[np.ndarray, float, int]:
    """Greedy descent from unit placement ``units`` (penalised score ``units_score``):
    score all ``block_moves`` (in batches of exactly ``batch``, padded with ``units``),
    move to the best if it is better, and go on from there, for at most
    ``max_batches`` batches. ``score(int32[batch, U]) -> float64[batch]`` penalised
    scores. Returns (best unit placement, its score, batches scored)."""
    best = np.asarray(units, np.int32)
    best_s = float(units_score)
    used = 0
    while used < max_batches:
        cand = block_moves(best, num_devices)
        if not len(cand):
            break
        found = None
        for i in range(0, len(cand), batch):
            if used >= max_batches:
                break
            chunk = cand[i:i + batch]
            pad = batch - len(chunk)
            if pad:
                chunk = np.concatenate([chunk, np.repeat(best[None], pad, axis=0)])
            s = np.asarray(score(chunk), np.float64)[:batch - pad]
            used += 1
            j = int(np.argmin(s))
            if s[j] < best_s and (found is None or s[j] < found[1]):
                found = (chunk[j].copy(), float(s[j]))
        if found is None:
            break
        best, best_s = found
    return best, best_s, used

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

``polish`` makes the same moves on an op placement (at the run's end, finer than the
units). All candidates are fixed by the elite and an offset (where in the placement the list
starts; the trainer moves it on at every refinement), never random, so refinement is
deterministic.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# Op-level boundary shifts of ``polish`` move up to this many ops.
POLISH_REACH = 4
# A screened batch (``screened_scores``) checks its fastest candidates up to the first of
# these counts with the memory check, and the next ones up to the following count while
# none of those fits. Without the memory check, 128 placements of inception_v3 on 8 K40s
# simulate in half the time (3.5 against 6.7 ms; section 0 of
# bench/results/pretrained_2026-11-28k_vm_screened-descent.txt).
SCREEN_CHECKS = (2, 8, 32)


def runs(units: np.ndarray) -> np.ndarray:
    """int64[R + 1]: where each run of equal devices starts (and the end, U)."""
    u = len(units)
    change = np.flatnonzero(units[1:] != units[:-1]) + 1
    return np.concatenate([[0], change, [u]]).astype(np.int64)


def block_moves(units, num_devices: int, limit: int | None = None,
                offset: int = 0, reach: int = 1) -> np.ndarray:
    """int32[C, U]: the distinct neighbours of unit placement ``units`` (module doc),
    without ``units`` itself, in a fixed order: the boundary shifts (the cheapest
    changes) then the run moves, each list starting at boundary (run) ``offset`` modulo
    their number and wrapping around. ``limit``: at most that many, generated lazily (a
    big placement has thousands of neighbours and a refinement scores a few hundred:
    building them all cost more than scoring those). ``reach``: boundaries are shifted
    by 1 to ``reach`` units (a short chain of ops, such as a bias gradient's, moves
    only as a whole)."""
    units = np.asarray(units, np.int32)
    u = len(units)
    if u == 0 or num_devices < 2:
        return np.zeros((0, u), np.int32)
    # The moves as ranges (``range_moves``: per boundary 2 * reach shifts, per run one
    # move to each other device), each list rotated to start at ``offset``.
    moves = range_moves(units, num_devices, reach)
    nr = len(runs(units)) - 1
    nb = nr - 1
    shifts, whole = moves[:nb * 2 * reach], moves[nb * 2 * reach:]
    if nb:
        shifts = np.roll(shifts.reshape(nb, -1, 3), -(offset % nb), axis=0).reshape(-1, 3)
    whole = np.roll(whole.reshape(nr, -1, 3), -(offset % nr), axis=0).reshape(-1, 3)
    cap = np.inf if limit is None else int(limit)
    out, seen = [], {units.tobytes()}
    for lo, hi, d in np.concatenate([shifts, whole]):
        a = units.copy()
        a[lo:hi] = d
        key = a.tobytes()
        if key not in seen:
            seen.add(key)
            out.append(a)
            if len(out) >= cap:
                break
    return np.stack(out) if out else np.zeros((0, u), np.int32)


def refine(score: Callable[[np.ndarray], np.ndarray], units, units_score: float,
           num_devices: int, batch: int, max_batches: int,
           offset: int = 0) -> tuple[np.ndarray, float, int]:
    """Greedy descent from unit placement ``units`` (penalised score ``units_score``):
    score its ``block_moves`` (in batches of exactly ``batch``, padded with ``units``;
    from boundary ``offset`` on, so that successive refinements of a big placement
    visit different parts of it), move to the best if it is better, and go on from
    there, for at most ``max_batches`` batches. ``score(int32[batch, U]) ->
    float64[batch]`` penalised scores. Returns (best unit placement, its score, batches
    scored)."""
    best = np.asarray(units, np.int32)
    best_s = float(units_score)
    used = 0
    while used < max_batches:
        cand = block_moves(best, num_devices, limit=(max_batches - used) * batch,
                           offset=offset)
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


def range_moves(placement, num_devices: int, reach: int = 1, edges=None) -> np.ndarray:
    """int64[C, 3]: the neighbours of ``placement`` as range assignments ``(lo, hi,
    device)`` (``p[lo:hi] = device``; each changes something), without materialising
    them (a big graph's placement has thousands): ``block_moves``' boundary shifts by 1
    to ``reach`` and run moves, then, given the graph's ``edges`` (src, dst), the cut
    moves: for every edge between devices, its producer to the consumer's device and
    the consumer to the producer's."""
    p = np.asarray(placement, np.int64)
    starts = runs(p)
    out = []
    for k in range(len(starts) - 2):
        lo, b, hi = starts[k], starts[k + 1], starts[k + 2]
        for j in range(1, reach + 1):
            out.append((b, min(b + j, hi), p[b - 1]))
            out.append((max(b - j, lo), b, p[b]))
    for r in range(len(starts) - 1):
        for d in range(num_devices):
            if d != p[starts[r]]:
                out.append((starts[r], starts[r + 1], d))
    moves = np.asarray(out, np.int64).reshape(-1, 3)
    if edges is not None:
        src, dst = np.asarray(edges[0], np.int64), np.asarray(edges[1], np.int64)
        cross = p[src] != p[dst]
        ops = np.concatenate([src[cross], dst[cross]])
        dev = np.concatenate([p[dst[cross]], p[src[cross]]])
        cut = np.unique(np.stack([ops, ops + 1, dev], 1), axis=0)
        moves = np.concatenate([moves, cut])
    return moves


def screened_scores(cands: np.ndarray, scores, screen, below: float = np.inf) -> np.ndarray:
    """float64[K]: the candidates' ``scores`` (``scores(int32[k, M]) -> float64[k]``, the
    memory-checked ones), computed only for the fastest few by ``screen`` (the same
    step times without the memory check, far cheaper where memory is tight) and the rest
    ``inf``: the fastest ``SCREEN_CHECKS[0]`` of those the screen puts below ``below``, then
    the next ones up to each following count while none checked is below ``below``. A
    candidate the screen puts at or above ``below`` is never checked: the memory check
    only makes a step time worse."""
    fast = np.asarray(screen(cands), np.float64)
    rank = np.argsort(fast, kind="stable")
    rank = rank[fast[rank] < below]
    s = np.full(len(cands), np.inf)
    lo = 0
    for hi in SCREEN_CHECKS:
        top = rank[lo:hi]
        if top.size == 0:
            break
        s[top] = np.asarray(scores(cands[top]), np.float64)
        if (s[top] < below).any():
            break
        lo = hi
    return s


def _apply(placement: np.ndarray, moves: np.ndarray) -> np.ndarray:
    out = np.repeat(placement[None], len(moves), axis=0)
    for i, (lo, hi, d) in enumerate(moves):
        out[i, lo:hi] = d
    return out


def polish(score: Callable[[np.ndarray], np.ndarray], placement, placement_score: float,
           num_devices: int, batch: int, max_batches: int,
           deadline: float = np.inf, edges=None,
           screen=None) -> tuple[np.ndarray, float, int]:
    """First-improvement descent by ``range_moves`` of an *op* placement: what a run's
    best placement gets at its end, at a finer grain than the policy's units (a unit
    placement cannot move one op of a unit; these moves can).

    The neighbourhood of the current placement (``range_moves``: block moves, and
    given the graph's ``edges`` (src, dst) one op to the device across a transfer, what
    a unit placement cannot do) is scored in batches of exactly
    ``batch`` (padded with the placement) from a rotating position; the first batch
    with a better placement moves to its best, the neighbourhood is rebuilt and the scan
    goes on from where it was. Stops when a whole neighbourhood holds nothing better,
    after ``max_batches`` batches, or when ``time.perf_counter()`` passes ``deadline``
    (seconds; the only input that is not deterministic). ``score(int32[batch, M]) ->
    float64[batch]`` penalised scores. ``screen``: optionally, the step times without
    the memory check; each batch is then ranked by it and only the candidates it puts
    below the current score are checked (``screened_scores``), so a batch that holds
    nothing better costs one screen. Returns (best placement, its score, batches)."""
    import time

    best = np.asarray(placement, np.int32)
    best_s = float(placement_score)
    used, pos, idle = 0, 0, 0
    moves = range_moves(best, num_devices, POLISH_REACH, edges)
    while len(moves) and used < max_batches and time.perf_counter() < deadline:
        pos %= len(moves)
        chunk = _apply(best, moves[pos:pos + batch])
        n = len(chunk)
        if n < batch:
            chunk = np.concatenate([chunk, np.repeat(best[None], batch - n, axis=0)])
        if screen is None:
            s = np.asarray(score(chunk), np.float64)[:n]
        else:  # padded to ``batch`` for the screen's compiled shape; only the n checked
            s = screened_scores(chunk, score, screen, best_s)[:n]
        used += 1
        j = int(np.argmin(s))
        if s[j] < best_s:
            best, best_s = chunk[j].copy(), float(s[j])
            moves, idle = range_moves(best, num_devices, POLISH_REACH, edges), 0
            continue
        pos, idle = pos + n, idle + n
        if idle >= len(moves):
            break
    return best, best_s, used

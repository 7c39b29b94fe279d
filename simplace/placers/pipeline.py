"""``pipeline``: contiguous stages of the graph order, one per device, balanced.

The split PipeDream and the DP of Tarnawski et al. search over: the ops, in a
topological order, are cut into ``s`` contiguous stages on ``s`` devices, for every
``s`` from 1 to the number of devices, the fastest devices first (by the whole graph's
time on each). The boundaries start where the prefix sum of the ops' work (each op at
its fastest time on those devices) reaches equal shares; then each boundary in turn is
moved to the best of up to ``positions`` places between its neighbours, every place
scored in one call of the batched simulator (or the cost model's ruler, so transfers
and memory count as the objective counts them), for ``rounds`` rounds or until a round
changes nothing. Two orders are tried: the graph's, and the graph's with every op
moved as late as it can go (just before its first consumer: parameters and constants
join the stage that uses them, not the first one). The best split of any order and
``s`` is returned. It is a start for the searches
as much as a method: pipelined steps balance best with splits of this shape, and moves
of single ops find them slowly.
"""

from __future__ import annotations

import numpy as np

from simplace._argtypes import check_int
from simplace.placers import PlacerContext, PlacerOutput, register

DEFAULT_ROUNDS = 3
DEFAULT_POSITIONS = 128


@register("pipeline", options={
    "rounds": f"rounds of moving each boundary to its best place (default {DEFAULT_ROUNDS})",
    "positions": f"places tried per boundary move, at most (default {DEFAULT_POSITIONS})"})
def place(ctx: PlacerContext) -> PlacerOutput:
    """Contiguous balanced stages over the fastest devices (see the module)."""
    m, d = ctx.graph.num_ops, ctx.inputs.num_devices
    rounds = check_int(ctx.options.get("rounds", DEFAULT_ROUNDS), "rounds", 0)
    positions = check_int(ctx.options.get("positions", DEFAULT_POSITIONS), "positions", 1)
    if m == 0:
        return PlacerOutput(np.zeros(0, dtype=np.int32), info={"stages": 0})
    t_all = np.asarray(ctx.op_times, dtype=np.float64)
    order = np.argsort(t_all.sum(axis=0), kind="stable")  # fastest devices first
    best, best_s, best_stages, scored = None, np.inf, 0, 0
    for ops in (np.arange(m), _as_late_as_possible(ctx.graph)):
        t = t_all[ops]
        for s in range(1, min(d, m) + 1):
            p, score, n = _stages(ctx, t, order[:s], ops, rounds, positions)
            scored += n
            if score < best_s:
                best, best_s, best_stages = p, score, s
    return PlacerOutput(best, info={"stages": best_stages, "candidates_scored": scored})


def _stages(ctx, t, devs, ops, rounds: int, positions: int):
    """(placement, score, placements scored): ``len(devs)`` stages over the ops in the
    order ``ops`` (``t``: their op times in that order), boundaries moved as the module
    says."""
    m, s = len(ops), len(devs)
    work = np.cumsum(t[:, devs].min(axis=1))
    if work[-1] <= 0:
        work = np.arange(1, m + 1, dtype=np.float64)
    cuts = np.searchsorted(work, work[-1] * np.arange(1, s) / s, side="right")
    cuts = np.clip(cuts, 1, m - 1)
    score = float(ctx.score(_split(devs, cuts, ops)[None])[0])
    scored = 1
    for _ in range(rounds if s > 1 else 0):
        moved = False
        for i in range(s - 1):
            lo = cuts[i - 1] + 1 if i > 0 else 1
            hi = cuts[i + 1] - 1 if i + 1 < s - 1 else m - 1
            if hi < lo:
                continue
            places = np.unique(np.linspace(lo, hi, min(positions, hi - lo + 1)).astype(int))
            trial = np.repeat(cuts[None], len(places), axis=0)
            trial[:, i] = places
            scores = ctx.score(np.stack([_split(devs, c, ops) for c in trial]))
            scored += len(places)
            k = int(np.argmin(scores))
            if scores[k] < score:
                score, cuts, moved = float(scores[k]), trial[k], True
        if not moved:
            break
    return _split(devs, cuts, ops), score, scored


def _split(devs: np.ndarray, cuts: np.ndarray, ops: np.ndarray) -> np.ndarray:
    """int32[M]: the ops before ``cuts[0]`` in the order ``ops`` on ``devs[0]``, then the
    next stage, and so on."""
    p = np.empty(len(ops), dtype=np.int32)
    p[ops] = devs[np.searchsorted(np.sort(cuts), np.arange(len(ops)), side="right")]
    return p


def _as_late_as_possible(graph) -> np.ndarray:
    """A topological order with each op just before its first consumer (sinks keep their
    place in the graph's order; ties keep the graph's order)."""
    m = graph.num_ops
    key = np.arange(m, dtype=np.float64)
    first = np.full(m, np.inf)
    src, dst = np.asarray(graph.src), np.asarray(graph.dst)
    by_src = np.argsort(src, kind="stable")
    ptr = np.searchsorted(src[by_src], np.arange(m + 1))
    step = 1.0 / (m + 1)
    for v in range(m - 1, -1, -1):  # the graph's order is topological: successors first
        out = dst[by_src[ptr[v]:ptr[v + 1]]]
        if len(out):
            first[v] = key[out].min()
            key[v] = first[v] - step
    return np.lexsort((np.arange(m), key))

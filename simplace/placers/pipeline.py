"""``pipeline``: contiguous stages of the graph order, one per device, balanced.

The split PipeDream and the DP of Tarnawski et al. search over: the ops, in a
topological order, are cut into ``s`` contiguous stages on ``s`` devices, for every
``s`` from 1 to the number of devices, the fastest devices first (by the whole graph's
time on each). The boundaries start where the prefix sum of the ops' work (each op at
its fastest time on those devices) reaches equal shares; then each boundary in turn is
moved to the best of up to ``positions`` places between its neighbours, every place
scored in one call of the batched simulator (or the cost model's ruler, so transfers
and memory count as the objective counts them), for ``rounds`` rounds or until a round
changes nothing. Beside it, the exact split of a stage-load model (each stage's work
plus the copies into and out of it, as PipeDream and Tarnawski et al. count them) by a
dynamic programme over ranges of the order (graphs of at most ``RANGE_DP_MAX_OPS`` ops),
scored by the objective too. Two orders are tried: the graph's, and the graph's with
every op moved as late as it can go (just before its first consumer: parameters and
constants join the stage that uses them, not the first one); under a ruler with
colocation classes, each class's ops are moved together to its first op's place, and
stages cut only between classes. The best split of any order and ``s`` is returned;
with a time budget, the (order, stage count) pairs go best balanced split first (those
that fit before those that do not, these the least memory over capacity first), and the
search stops at the next split once the budget is spent. It is a start
for the searches as much as a method: pipelined steps balance best with splits of this
shape, and moves of single ops find them slowly.
"""

from __future__ import annotations

import math
import time

import numpy as np

from simplace._numba import njit
from simplace.placers import OOM_PENALTY, PlacerContext, PlacerOutput, penalised, register
from simplace.placers.memory_repair import repair_answer
from simplace.placers.registry import Cost, int_option, option_values
from simplace.search import stop_requested

DEFAULT_ROUNDS = 3
DEFAULT_POSITIONS = 128
# The range DP's tables are (M + 1)^2 floats: 50 MB at this many ops, and the loop that
# fills them grows as M^2. Larger graphs get the boundary moves only.
RANGE_DP_MAX_OPS = 2500


@register("pipeline", cost=Cost(0.3, 1.5e-5, kernels=("simulator", "pipeline")), rank=5,
          options={
    "rounds": int_option(f"rounds of moving each boundary to its best place (default "
                         f"{DEFAULT_ROUNDS})", DEFAULT_ROUNDS, 0),
    "positions": int_option(f"places tried per boundary move, at most (default "
                            f"{DEFAULT_POSITIONS})", DEFAULT_POSITIONS, 1)})
def place(ctx: PlacerContext) -> PlacerOutput:
    """Contiguous balanced stages over the fastest devices (see the module)."""
    m, d = ctx.graph.num_ops, ctx.inputs.num_devices
    opts = option_values("pipeline", ctx.options)
    rounds, positions = opts["rounds"], opts["positions"]
    if m == 0:
        return PlacerOutput(np.zeros(0, dtype=np.int32), info={"stages": 0})
    t_all = np.asarray(ctx.op_times, dtype=np.float64)
    order = np.argsort(t_all.sum(axis=0), kind="stable")  # fastest devices first
    # A time budget (compare's share for the fast methods) stops the search at the next
    # split once spent; the best split so far is returned (one stage at least).
    deadline = ctx.deadline
    best, best_s, best_stages, scored, stop = None, np.inf, 0, 0, "done"
    copy_s = _copy_s(ctx) if m <= RANGE_DP_MAX_OPS else None
    orders = _orders(ctx)
    copies = (None, None)  # (order index, its range copies): M^2 floats, one at a time
    # (order, stage count, balanced split's score): every one unbudgeted; under a budget
    # the most promising first, over both orders (nmt_4layer on 4 K40s: no balanced
    # split of the graph's order fits, the late order's 5 stages do).
    plan = (_promising_first(ctx, t_all, order, [ops for ops, _ in orders])
            if math.isfinite(deadline) else
            [(k, s, None) for k in range(len(orders)) for s in range(1, min(d, m) + 1)])
    for k, s, balanced_s in plan:
        if best is not None and (time.perf_counter() > deadline or stop_requested()):
            stop = "time budget" if not stop_requested() else "interrupted"
            break
        ops, cut_ok = orders[k]
        t = t_all[ops]
        candidates = [_stages(ctx, t, order[:s], ops, rounds, positions, deadline, balanced_s)]
        if s > 1 and copy_s is not None:  # the stage-load model's best split
            if copies[0] != k:
                copies = (k, _range_copies(ctx.graph, ops, copy_s, cut_ok))
            cuts = _best_cuts(copies[1], t[:, order[:s]].min(axis=1), s)
            p = _split(order[:s], cuts, ops)
            candidates.append((p, float(ctx.score(p[None])[0]), 1))
        for p, score, n in candidates:
            scored += n
            if score < best_s:
                best, best_s, best_stages = p, score, s
    info = {"stages": best_stages, "candidates_scored": scored, "stop": stop}
    if best_s >= OOM_PENALTY:  # no split fits (a stage is one segment: see memory_repair)
        best, _, _ = repair_answer(ctx, best, best_s - OOM_PENALTY, info, what="split")
    return PlacerOutput(best, info=info)


def _orders(ctx) -> list:
    """[(op order, where a stage may begin)] of the two orders the module names, each
    with its colocation classes' ops together (``_blocked``)."""
    classes = _classes(ctx)
    return [_blocked(base, classes)
            for base in (np.arange(ctx.graph.num_ops), _as_late_as_possible(ctx.graph))]


def balanced_starts(ctx) -> np.ndarray:
    """int32[S, M]: the balanced splits (no boundary moves) of both orders into 1..D
    stages over the fastest devices, the first every op on the fastest device: cheap
    starts that fit where some balanced split does."""
    t_all = np.asarray(ctx.op_times, dtype=np.float64)
    order = np.argsort(t_all.sum(axis=0), kind="stable")
    return balanced_splits(t_all, order, [ops for ops, _ in _orders(ctx)])[1]


def _classes(ctx) -> np.ndarray | None:
    """int[M]: the colocation class of each op under the objective's ruler (-1: none),
    or None when there are none."""
    from simplace.sim.objective import Ruler

    objective = ctx.inputs.objective
    if not isinstance(objective, Ruler) or objective.colocation is None:
        return None
    col = np.asarray(objective.colocation)
    return col if (col >= 0).any() else None


def _blocked(order: np.ndarray, classes: np.ndarray | None):
    """(order, bool[M + 1]): ``order`` with the ops of each colocation class moved
    together to where its first op is (they run on one device, so a stage holds all of
    them), and where a stage may begin: between two blocks."""
    m = len(order)
    if classes is None:
        return order, np.ones(m + 1, dtype=bool)
    label = np.where(classes >= 0, classes, -1 - np.arange(m))  # lone ops: own blocks
    lab = label[order]
    first = {}
    for k, x in enumerate(lab.tolist()):
        first.setdefault(x, k)
    key = np.array([first[x] for x in lab.tolist()])
    blocked = order[np.argsort(key, kind="stable")]
    lab = label[blocked]
    cut_ok = np.ones(m + 1, dtype=bool)
    cut_ok[1:m] = lab[1:] != lab[:-1]
    return blocked, cut_ok


def _copy_s(ctx) -> np.ndarray:
    """float64[M]: what sending op i's outputs to another device costs (its largest
    tensor over the median link, latency included)."""
    inp, g = ctx.inputs, ctx.graph
    d = inp.num_devices
    off = ~np.eye(d, dtype=bool)
    bw = float(np.median(inp.bandwidth_bytes_per_s[off])) if d > 1 else np.inf
    lat = float(np.median(inp.latency_s[off])) if d > 1 else 0.0
    out = np.zeros(g.num_ops)
    np.maximum.at(out, np.asarray(g.src), np.asarray(g.edge_bytes, dtype=np.float64))
    has = np.zeros(g.num_ops, bool)
    has[np.asarray(g.src)] = True
    return np.where(has, lat + out / bw, 0.0)


def _range_copies(graph, ops: np.ndarray, copy_s: np.ndarray, cut_ok: np.ndarray):
    """float64[M + 1, M + 1]: what the ops at positions a..b-1 of the order ``ops`` pay
    for copies as one stage under the stage-load model of PipeDream and Tarnawski et
    al.: ``copy_s`` of every op outside it that feeds it (once per op) and of every op
    in it that feeds one outside (the order need not be topological: a training step's
    classes hold forward and backward ops); inf where b <= a or where ``cut_ok``
    (bool[M + 1]) forbids a stage to begin or end (inside a colocation block)."""
    m = len(ops)
    pos = np.empty(m, dtype=np.int64)
    pos[ops] = np.arange(m)
    src, dst = pos[np.asarray(graph.src)], pos[np.asarray(graph.dst)]
    by_src, by_dst = np.argsort(src, kind="stable"), np.argsort(dst, kind="stable")
    out_ptr = np.searchsorted(src[by_src], np.arange(m + 1))
    in_ptr = np.searchsorted(dst[by_dst], np.arange(m + 1))
    copies = _range_loads(m, out_ptr, dst[by_src], in_ptr, src[by_dst],
                          np.ascontiguousarray(copy_s[ops], dtype=np.float64))
    copies[~cut_ok, :] = np.inf
    copies[:, ~cut_ok] = np.inf
    return copies


def _best_cuts(copies: np.ndarray, work: np.ndarray, s: int) -> np.ndarray:
    """Cut positions of the split into at most ``s`` contiguous stages that minimises the
    largest stage load, the stage's ``work`` plus its ``copies`` (a dynamic programme
    over ranges of the order)."""
    m = len(work)
    cum_w = np.concatenate([[0.0], np.cumsum(work)])
    load = copies + (cum_w[None, :] - cum_w[:, None])  # inf stays inf
    best = np.full((s + 1, m + 1), np.inf)
    arg = np.zeros((s + 1, m + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for k in range(1, s + 1):
        # best[k, b] = min over a < b of max(best[k - 1, a], load[a, b])
        cand = np.maximum(best[k - 1][:, None], load)
        arg[k] = np.argmin(cand, axis=0)
        best[k] = cand[arg[k], np.arange(m + 1)]
    k = int(np.argmin(best[1:, m])) + 1
    cuts, b = [], m
    for kk in range(k, 0, -1):
        b = int(arg[kk, b])
        cuts.append(b)
    cuts = sorted(x for x in cuts if 0 < x < m)
    # Fewer stages than devices: the unused devices take empty stages at the end.
    return np.asarray(cuts + [m] * (s - 1 - len(cuts)), dtype=np.int64)


def _stages(ctx, t, devs, ops, rounds: int, positions: int, deadline: float,
            balanced_s: float | None = None):
    """(placement, score, placements scored): ``len(devs)`` stages over the ops in the
    order ``ops`` (``t``: their op times in that order), boundaries moved as the module
    says until ``deadline`` (``time.perf_counter()``), from the balanced split (its score
    ``balanced_s`` when already known)."""
    m, s = len(ops), len(devs)
    cuts = _balanced_cuts(t, devs)
    if balanced_s is None:
        score, scored = float(ctx.score(_split(devs, cuts, ops)[None])[0]), 1
    else:
        score, scored = float(balanced_s), 0
    for _ in range(rounds if s > 1 else 0):
        moved = False
        for i in range(s - 1):
            if time.perf_counter() > deadline:
                break
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


def _balanced_cuts(t: np.ndarray, devs: np.ndarray) -> np.ndarray:
    """int[len(devs) - 1]: where the prefix sum of the ops' work (``t``, in the stage
    order; each op at its fastest on ``devs``) reaches equal shares."""
    m, s = len(t), len(devs)
    work = np.cumsum(t[:, devs].min(axis=1))
    if work[-1] <= 0:
        work = np.arange(1, m + 1, dtype=np.float64)
    cuts = np.searchsorted(work, work[-1] * np.arange(1, s) / s, side="right")
    return np.clip(cuts, 1, m - 1)


def balanced_splits(t_all: np.ndarray, order: np.ndarray,
                    orders: list) -> tuple[list, np.ndarray]:
    """([(index into ``orders``, stage count)], int32[len, M]): the balanced split of
    each op order of ``orders`` into 1..min(D, M) stages over the fastest devices
    (``order``), before any boundary moves; ``t_all`` the op times."""
    plan, splits = [], []
    for k, ops in enumerate(orders):
        t = t_all[ops]
        for s in range(1, min(len(order), len(ops)) + 1):
            plan.append((k, s))
            splits.append(_split(order[:s], _balanced_cuts(t, order[:s]), ops))
    return plan, np.stack(splits)


def fitting_first(ctx, placements: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rank, penalised scores) of ``placements`` (one batch): those that fit by score,
    then those that do not by their memory over capacity, the least first."""
    res = ctx.batched(placements)
    scores = np.asarray(penalised(res.step_time_s, res.oom), dtype=np.float64)
    over = np.maximum(np.asarray(res.peak_memory_bytes) - ctx.inputs.memory_bytes[None, :], 0)
    excess = np.where(np.asarray(res.oom), np.nansum(over, axis=1), 0.0)
    return np.lexsort((scores, excess)), scores


def _promising_first(ctx, t_all: np.ndarray, order: np.ndarray, orders: list) -> list:
    """[(index into ``orders``, stage count, its balanced split's penalised score)] for
    every op order of ``orders`` and the counts 1..min(D, M), the best split first (all
    scored in one batch): under a time budget the boundary moves go where they pay most
    before it runs out, rather than to one and two stages. Splits that do not fit come
    after those that do, the least memory over capacity first (``fitting_first``): when
    none fits, the moves begin where a fitting split is nearest (nmt_4layer on 4 K40s:
    with 1 s, the fastest split, one stage, came first and was returned out of memory)."""
    plan, splits = balanced_splits(t_all, order, orders)
    rank, scores = fitting_first(ctx, splits)
    return [(*plan[i], float(scores[i])) for i in rank]


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


@njit()
def _range_loads(m, out_ptr, out_dst, in_ptr, in_src, c):
    """float64[M + 1, M + 1]: the copies the ops at positions a..b-1 pay as one stage
    (``_range_copies``), inf where b <= a. For each start, the stage grows one op at a time,
    counting for every op its consumers outside (an op inside with any pays its copy out)
    and its consumers inside (an op outside with any pays its copy in)."""
    load = np.full((m + 1, m + 1), np.inf)
    inside = np.zeros(m, dtype=np.bool_)
    n_out = np.zeros(m, dtype=np.int64)
    n_in = np.zeros(m, dtype=np.int64)
    for a in range(m):
        inside[:] = False
        n_out[:] = 0
        n_in[:] = 0
        cin = 0.0
        cout = 0.0
        for b in range(a + 1, m + 1):
            x = b - 1
            if n_in[x] > 0:  # it fed the stage from outside; now it is in it
                cin -= c[x]
            inside[x] = True
            k = 0
            for e in range(out_ptr[x], out_ptr[x + 1]):
                if not inside[out_dst[e]]:
                    k += 1
            n_out[x] = k
            if k > 0:
                cout += c[x]
            for e in range(in_ptr[x], in_ptr[x + 1]):
                w = in_src[e]
                if w == x:
                    continue
                if inside[w]:
                    n_out[w] -= 1
                    if n_out[w] == 0:
                        cout -= c[w]
                else:
                    n_in[w] += 1
                    if n_in[w] == 1:
                        cin += c[w]
            load[a, b] = max(cin, 0.0) + max(cout, 0.0)
    return load

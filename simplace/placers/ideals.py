"""``ideals``: pipeline stages as differences of nested ideals, by an exact DP.

The split Tarnawski et al. (NeurIPS 2020) search for the time between pipelined steps:
an ideal is a set of blocks closed under predecessors; a chain of nested ideals
``{} = I0 < I1 < ... < Is = all`` cuts the graph into ``s`` stages ``I(k) - I(k-1)``,
each on one device. Ranges of one topological order (``pipeline``) are the special case
of a chain of prefixes; ideals also let a stage hold one branch of a fork without the
other. A dynamic programme over (ideal, devices used of each kind) finds the chain whose
largest stage load is least, for every device kind and count at once.

Blocks: the ops of a colocation class (the objective's ruler's) are one block, as are
the ops merged with them below; every other op is a block of its own. Where classes tie
backward ops to forward ones (a training step's layers: simplace's ``backward/`` name
paths, or an msr file's backward nodes), ideals are taken over the forward part only,
each block carrying its backward ops along (their order mirrors the forward one); a
block of backward ops only joins the forward part through its backward neighbours,
with those edges reversed. Blocks on a cycle of the forward part are merged (their
classes make them depend on each other), and so, repeatedly, is a block that costs no
time on any device into its only neighbouring block (a parameter into its consumer: a
stage apart would only pay its copy).

A stage's load on a device kind is its ops' time there plus, where that kind pays for
copies, the copy of every op whose output crosses the stage's boundary, once per op
(PipeDream's and Tarnawski et al.'s stage load). Its bytes, the parameters its ops read
(``OpGraph.param_bytes``), are within the kind's memory. The programme runs once with
every kind paying for copies and once with each kind in turn exempt (msr's CPU pays
none); the objective scores each result, and the best is returned.

Bounds: a run visits, for every ideal, the smaller ideals whose difference with it works
at most a threshold; a chain within the threshold is then the exact optimum. The ideals
are first restricted to a window of the blocks' topological order (all blocks before it
in, none past it; a window of one block gives prefixes, the ranges of ``pipeline``),
whose threshold starts at a lower bound on the answer and is raised by
``THRESHOLD_GROWTH`` until a chain fits; the window is then doubled up to every block,
each run's threshold the previous window's answer (a wider window holds every chain of a
narrower one). The search stops with the best split found so far where the next window
has more than ``max_ideals`` ideals, where ``max_pairs`` (ideal, smaller ideal) pairs
have been visited in all or the next window would pass that (its pairs estimated from
the last window's, growing as the square of the ideals; all these are deterministic:
the same split on any machine), or where a time budget is spent (checked between slices
of a run); before any run ends, the answer is the best of ``pipeline``'s balanced splits
(no boundary moves; every op on the fastest device among them), those that fit first.
"""

from __future__ import annotations

import heapq
import math
import time

import numpy as np

from simplace._numba import njit
from simplace.placers import (
    OOM_PENALTY,
    Cost,
    PlacerContext,
    PlacerOutput,
    int_option,
    register,
)
from simplace.placers.memory_repair import repair_answer, repair_s
from simplace.placers.pipeline import balanced_starts, fitting_first
from simplace.placers.registry import option_values
from simplace.search import stop_requested

DEFAULT_MAX_IDEALS = 100_000
DEFAULT_MAX_PAIRS = 100_000_000
# A run returns to check the clock after about this many pairs (a few tens of ms).
SLICE_PAIRS = 500_000
# Enumerating ideals reads the clock every this many ideals of a level (a few ms).
_CLOCK_IDEALS = 1024
# Each failed threshold multiplies it by this. A run's cost grows with its threshold (at
# least linearly), so doubling keeps the failed runs together below the last one, which
# overshoots the answer at most twofold; the first run that finds a chain is exact.
THRESHOLD_GROWTH = 2.0
# Under a budget, when none of the starts fits, the programme stops early by what this
# many rounds of the repair of its answer take (memory_repair.repair_s): 2-5 rounds made
# the zoo's models fit on cpu_vm2core_x4.
REPAIR_RESERVE_ROUNDS = 5
# The programme's table has one row per vector of device counts (one count per kind);
# beyond this many rows, the largest kinds are cut down.
MAX_COUNT_VECTORS = 4096


@register("ideals", cost=Cost(0.0, 0.0, 1.2e-7, kernels=("simulator", "ideals")), rank=10,
          options={
    "max_ideals": int_option(f"ideals at most, else a window of the order (default "
                             f"{DEFAULT_MAX_IDEALS})", DEFAULT_MAX_IDEALS, 1),
    "max_pairs": int_option(f"(ideal, smaller ideal) pairs visited in all, at most (default "
                            f"{DEFAULT_MAX_PAIRS})", DEFAULT_MAX_PAIRS, 1)})
def place(ctx: PlacerContext) -> PlacerOutput:
    """Stages as differences of nested ideals, by a DP (see the module)."""
    m = ctx.graph.num_ops
    opts = option_values("ideals", ctx.options)
    max_ideals, max_pairs = opts["max_ideals"], opts["max_pairs"]
    if m == 0:
        return PlacerOutput(np.zeros(0, dtype=np.int32), info={"stages": 0})
    deadline = ctx.deadline
    t_all = np.asarray(ctx.op_times, dtype=np.float64)
    # The start: the best of pipeline's balanced splits (one stage on the fastest device
    # among them), those that fit first. When no run ends (nmt_4layer's 22k blocks: no
    # window's run ended within max_pairs, 14 s), it is the answer, and every op on the
    # fastest device does not fit there.
    starts = balanced_starts(ctx)
    rank, start_scores = fitting_first(ctx, starts)
    best, best_s = starts[rank[0]].astype(np.int32), float(start_scores[rank[0]])
    if best_s >= OOM_PENALTY and math.isfinite(deadline):
        # No start fits: the programme leaves time for the answer's memory repair.
        deadline -= repair_s(ctx, REPAIR_RESERVE_ROUNDS)
    block, nb, edges = blocks(ctx)
    kinds, kind_times, kind_caps = _kinds(ctx, t_all)
    problem = _Problem(ctx, block, nb, kind_times, kind_caps, [len(k) for k in kinds])
    variants = [np.ones(len(kinds))]
    if len(kinds) > 1:
        variants += [1.0 - np.eye(len(kinds))[t] for t in range(len(kinds))]
    last = [None] * len(variants)  # each variant's answer in the last window
    info = {"stages": len(np.unique(best)), "stop": "done", "pairs": 0, "blocks": nb,
            "ideals": 0, "window": 0}
    spent = 0  # pairs the last window's runs visited
    for window in _windows(nb):
        try:
            lattice = enumerate_ideals(nb, edges, max_ideals, window, deadline=deadline)
        except _TimeUp:
            _stopped(deadline, info)
            break
        if lattice is None:
            info["stop"] = "max_ideals"
            break
        n = len(lattice[0])
        if n == info["ideals"]:  # as many as the narrower window: the same ideals
            continue
        if info["ideals"] and spent * (n / info["ideals"]) ** 2 > max_pairs - info["pairs"]:
            info["stop"] = "max_pairs"  # the wider window would not end in the pairs left
            break
        before = info["pairs"]
        for v, pays in enumerate(variants):
            if _stopped(deadline, info):
                break
            found = problem.solve(lattice[1:], pays, last[v], max_pairs - info["pairs"],
                                  deadline)
            info["pairs"] += found["pairs"]
            if found["chains"] is None:
                if found["stop"] != "no chain fits":  # out of pairs or time: stop here
                    info["stop"] = found["stop"]
                    break
                continue
            last[v] = found["value"]
            # The model leaves out what the objective may count besides stage loads
            # (links, launches, the host): every device count's best chain is scored.
            cand = np.unique(np.stack([_placement(c, lattice[0], block, kinds, nb)
                                       for c in found["chains"]]), axis=0)
            scores = ctx.score(cand)
            k = int(np.argmin(scores))
            if scores[k] < best_s:
                best, best_s = cand[k], float(scores[k])
                info.update(stages=len(np.unique(best)), copies_paid_by=pays.tolist())
        if info["stop"] != "done":
            break
        spent = info["pairs"] - before
        info.update(ideals=n, window=window)
    if best_s >= OOM_PENALTY:  # no chain nor balanced split fits: see memory_repair
        best, _, _ = repair_answer(ctx, best, best_s - OOM_PENALTY, info, what="split")
    return PlacerOutput(best, info=info)


def _stopped(deadline: float, info: dict) -> bool:
    """True (and ``info["stop"]`` says why) once the budget is spent or a stop asked."""
    if stop_requested():
        info["stop"] = "interrupted"
    elif time.perf_counter() > deadline:
        info["stop"] = "time budget"
    else:
        return False
    return True


def _windows(nb: int):
    """The windows tried: one block (prefixes), doubled up to every block."""
    w = 1
    while w < nb:
        yield w
        w *= 2
    yield max(nb, 1)


class _Problem:
    """What the programme reads besides the ideals, built once for all its runs."""

    def __init__(self, ctx, block, nb, kind_times, kind_caps, kind_sizes):
        from simplace.placers.pipeline import _copy_s

        g = ctx.graph
        m = g.num_ops
        src, dst = np.asarray(g.src, dtype=np.int64), np.asarray(g.dst, dtype=np.int64)
        by_dst = np.argsort(dst, kind="stable")
        self.pred_ptr = np.searchsorted(dst[by_dst], np.arange(m + 1)).astype(np.int64)
        self.pred = np.ascontiguousarray(src[by_dst])
        self.outdeg = np.bincount(src, minlength=m).astype(np.int64)
        self.copy_s = np.ascontiguousarray(_copy_s(ctx), dtype=np.float64)
        order = np.argsort(block, kind="stable")
        self.blk_ptr = np.searchsorted(block[order], np.arange(nb + 1)).astype(np.int64)
        self.blk_ops = order.astype(np.int64)
        self.blk_work = np.zeros((nb, kind_times.shape[1]))
        for t in range(kind_times.shape[1]):
            self.blk_work[:, t] = np.bincount(block, weights=kind_times[:, t], minlength=nb)
        self.blk_bytes = np.bincount(block, weights=np.asarray(g.param_bytes, dtype=np.float64),
                                     minlength=nb)
        self.caps = np.asarray(kind_caps, dtype=np.float64)
        self.counts, self.prev = count_vectors(kind_sizes)
        n_dev = int(self.counts[-1].sum())
        least = self.blk_work.min(axis=1)
        self.bound = max(float(least.sum()) / max(n_dev, 1), float(least.max(initial=0.0)))
        # No stage ever works more than the whole graph on its slowest kind: past that,
        # the threshold prunes nothing and another rise cannot help.
        self.ceiling = float(self.blk_work.sum(axis=0).max()) * (1 + 1e-9)

    def solve(self, lower, pays, start, max_pairs: int, deadline: float) -> dict:
        """The best chain of the ideals whose lower covers are ``lower`` (offsets, ideals,
        blocks) under ``pays`` (float[K]: 1 where a kind pays for copies), the threshold
        starting at ``start`` (a load some chain reaches; None: the lower bound):
        ``{"chains": the best chain for each row of device counts a chain fits, each
        [(ideal, smaller ideal, kind), ...] from the full ideal down (None where none
        fits), "value": the least largest load, "pairs", "stop"}``."""
        n = len(lower[0]) - 1
        k_all = len(self.counts)
        pays = np.asarray(pays, dtype=np.float64)
        # A start from a coarser window is a load some chain here reaches too; the
        # margin covers sums taken in another order.
        threshold = self.bound if start is None else start * (1 + 1e-9)
        pairs = 0
        while True:
            dp = np.full((k_all, n), np.inf)
            arg_sub = np.full((k_all, n), -1, dtype=np.int64)
            arg_kind = np.full((k_all, n), -1, dtype=np.int64)
            top = 1
            while top < n:
                if pairs >= max_pairs:
                    return {"chains": None, "pairs": pairs, "stop": "max_pairs"}
                if stop_requested() or time.perf_counter() > deadline:
                    return {"chains": None, "pairs": pairs, "stop": "time budget"}
                top, visited = _run(
                    top, n, *lower, self.blk_ptr, self.blk_ops, self.blk_work,
                    self.blk_bytes, self.pred_ptr, self.pred, self.outdeg, self.copy_s, pays,
                    self.caps, self.prev, threshold, min(SLICE_PAIRS, max_pairs - pairs), dp,
                    arg_sub, arg_kind)
                pairs += visited
            if np.isfinite(dp[k_all - 1, n - 1]):
                break
            if threshold == math.inf:
                return {"chains": None, "pairs": pairs, "stop": "no chain fits"}
            # Past the ceiling the work prunes nothing; the last run drops the threshold
            # (copies may still push every chain over it where memory forbids one stage).
            threshold = math.inf if threshold >= self.ceiling else min(
                max(threshold, 1e-300) * THRESHOLD_GROWTH, self.ceiling)
        chains = []
        for row in np.flatnonzero(np.isfinite(dp[:, n - 1])).tolist():
            chain, k, ideal = [], row, n - 1
            while ideal != 0:
                sub, kind = int(arg_sub[k, ideal]), int(arg_kind[k, ideal])
                if sub != ideal:
                    chain.append((ideal, sub, kind))
                k, ideal = int(self.prev[k, kind]), sub
            chains.append(chain)
        return {"chains": chains, "value": float(dp[k_all - 1, n - 1]), "pairs": pairs,
                "stop": "done"}


def _placement(chain, bits, block, kinds, nb: int) -> np.ndarray:
    """int32[M]: each stage ``bits[ideal] - bits[sub]`` on the next unused device of its
    kind."""
    used = [0] * len(kinds)
    dev_of_block = {}
    for ideal, sub, kind in chain:
        dev = int(kinds[kind][used[kind]])
        used[kind] += 1
        diff = bits[ideal] & ~bits[sub]
        while diff:
            low = diff & -diff
            dev_of_block[low.bit_length() - 1] = dev
            diff ^= low
    lookup = np.array([dev_of_block[b] for b in range(nb)], dtype=np.int32)
    return lookup[block]


def _kinds(ctx, t_all: np.ndarray):
    """(list of int arrays: the devices of each kind, float64[M, K] op times per kind,
    float64[K] memory per kind). Devices of one kind run every op in the same time and
    hold as much."""
    mem = np.asarray(ctx.inputs.memory_bytes, dtype=np.float64)
    keys = {}
    for d in range(t_all.shape[1]):
        keys.setdefault((t_all[:, d].tobytes(), float(mem[d])), []).append(d)
    kinds = [np.asarray(v, dtype=np.int64) for v in keys.values()]
    times = np.stack([t_all[:, k[0]] for k in kinds], axis=1)
    caps = np.array([mem[k[0]] for k in kinds])
    return kinds, times, caps


def count_vectors(sizes: list[int]):
    """(int64[C, K] every vector of device counts ``0 <= c[k] <= sizes[k]`` in mixed-radix
    order, int64[C, K] the row of ``c - e_k``, -1 where ``c[k] == 0``). The last row is
    ``sizes``. Kinds are cut down (the largest first) until ``C <= MAX_COUNT_VECTORS``."""
    sizes = list(sizes)
    while math.prod(s + 1 for s in sizes) > MAX_COUNT_VECTORS:
        sizes[int(np.argmax(sizes))] -= 1
    radix = np.array([s + 1 for s in sizes], dtype=np.int64)
    c_all = int(np.prod(radix))
    idx = np.arange(c_all, dtype=np.int64)
    stride = np.concatenate([[1], np.cumprod(radix[:-1])]).astype(np.int64)
    counts = (idx[:, None] // stride[None, :]) % radix[None, :]
    prev = np.where(counts > 0, idx[:, None] - stride[None, :], -1)
    return counts, prev


def _backward_ops(graph) -> np.ndarray:
    """bool[M]: ops of the backward pass: simplace's traced name paths mark them, and
    ``simplace.external.msr`` names an msr file's backward nodes' op ``msr_backward``."""
    from simplace.graph import split_name_path

    traced = [split_name_path(str(p))[0] for p in graph.name_path]
    return np.array(traced, dtype=bool) | (np.asarray(graph.op).astype(str) == "msr_backward")


def blocks(ctx):
    """(int64[M] block of each op, number of blocks, int64[E', 2] the edges of the blocks'
    DAG): blocks numbered in a topological order of that DAG (see the module)."""
    from simplace.placers.pipeline import _classes

    g = ctx.graph
    m = g.num_ops
    src, dst = np.asarray(g.src, dtype=np.int64), np.asarray(g.dst, dtype=np.int64)
    classes = _classes(ctx)
    label = np.arange(m) if classes is None else np.where(classes >= 0, m + classes,
                                                          np.arange(m))
    _, block = np.unique(label, return_inverse=True)
    back = _backward_ops(g)
    nb0 = int(block.max()) + 1
    has_fwd = np.zeros(nb0, dtype=bool)
    has_fwd[block[~back]] = True
    has_bwd = np.zeros(nb0, dtype=bool)
    has_bwd[block[back]] = True
    if not (has_fwd & has_bwd).any():  # no class ties the passes: one DAG of all ops
        back = np.zeros(m, dtype=bool)
    times = np.asarray(ctx.op_times, dtype=np.float64)
    idle = ~(times > 0).any(axis=1)
    while True:
        nb = int(block.max()) + 1
        bs, bd = block[src], block[dst]
        cross = bs != bd
        fwd = cross & ~back[src] & ~back[dst]
        orphan = np.ones(nb, dtype=bool)
        orphan[block[~back]] = False
        mirror = cross & back[src] & back[dst] & (orphan[bs] | orphan[bd])
        ea = np.concatenate([bs[fwd], bd[mirror]])
        eb = np.concatenate([bd[fwd], bs[mirror]])
        merged = _merge(nb, ea, eb, bs[cross], bd[cross], idle, block)
        if merged is None:
            break
        block = merged
    rank = _topological_rank(nb, ea, eb, block)
    block = rank[block]
    edges = np.unique(np.stack([rank[ea], rank[eb]], axis=1), axis=0).reshape(-1, 2)
    return block.astype(np.int64), nb, edges


def _merge(nb, ea, eb, na, nbr, idle, block):
    """A coarser numbering of the blocks (int64[M]), or None where nothing merges: the
    blocks of each cycle of the forward edges ``ea -> eb`` merged, else each block whose
    ops are all ``idle`` (no time on any device) with exactly one neighbour over the
    graph's edges ``na -> nbr`` (block numbers) merged into it."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    adj = coo_matrix((np.ones(len(ea)), (ea, eb)), shape=(nb, nb)).tocsr()
    n_scc, scc = connected_components(adj, directed=True, connection="strong")
    if n_scc < nb:
        return np.unique(scc, return_inverse=True)[1][block]
    idle_blk = np.ones(nb, dtype=bool)
    idle_blk[block[~idle]] = False
    pairs = np.unique(np.stack([np.concatenate([na, nbr]), np.concatenate([nbr, na])],
                               axis=1), axis=0)
    n_nbrs = np.bincount(pairs[:, 0], minlength=nb)
    target = np.arange(nb)
    done = np.zeros(nb, dtype=bool)
    changed = False
    for a, b in pairs.tolist():
        if idle_blk[a] and n_nbrs[a] == 1 and not done[b]:
            target[a], done[a], changed = b, True, True
    if not changed:
        return None
    return np.unique(target, return_inverse=True)[1][block]


def _topological_rank(nb, ea, eb, block):
    """int64[nb]: each block's place in a topological order of the edges ``ea -> eb``,
    ties to the block holding the earlier op of the graph's order."""
    first = np.full(nb, np.iinfo(np.int64).max)
    np.minimum.at(first, block, np.arange(len(block)))
    indeg = np.bincount(eb, minlength=nb)
    order = np.argsort(ea, kind="stable")
    ptr = np.searchsorted(ea[order], np.arange(nb + 1))
    succ = eb[order]
    heap = [(int(first[b]), b) for b in range(nb) if indeg[b] == 0]
    heapq.heapify(heap)
    rank = np.empty(nb, dtype=np.int64)
    k = 0
    while heap:
        _, b = heapq.heappop(heap)
        rank[b] = k
        k += 1
        for c in succ[ptr[b]:ptr[b + 1]].tolist():
            indeg[c] -= 1
            if indeg[c] == 0:
                heapq.heappush(heap, (int(first[c]), c))
    return rank


class _TimeUp(Exception):
    """The time budget ran out while ideals were being enumerated."""


def enumerate_ideals(nb: int, edges: np.ndarray, max_ideals: int, window: int, *,
                     deadline: float = math.inf):
    """The ideals of the blocks' DAG (``edges``: int[E, 2], blocks numbered in a
    topological order) within ``window`` blocks: every block before the first one
    missing is in, none ``window`` or more past it. Returns (list of int bitsets, ideal 0
    empty and the last the full set, ordered by size; int64[N + 1] offsets; int64[L]
    the lower covers ``J = I - {b}`` of each ideal I: J's number; int64[L] b), or None
    where there are more than ``max_ideals``. Raises ``_TimeUp`` past ``deadline``
    (``time.perf_counter()`` time, read once per level of ideals and every
    ``_CLOCK_IDEALS`` ideals: a wide graph's first window alone took seconds)."""
    preds = [0] * nb
    succ = [[] for _ in range(nb)]
    for a, b in np.asarray(edges, dtype=np.int64).reshape(-1, 2).tolist():
        preds[b] |= 1 << a
        succ[a].append(b)
    ids = {0: 0}
    bits = [0]
    addable = [tuple(v for v in range(nb) if preds[v] == 0)]
    lower = [[]]
    level = [0]
    timed = math.isfinite(deadline)
    while level:
        if timed and (stop_requested() or time.perf_counter() > deadline):
            raise _TimeUp
        nxt = []
        for n_done, i in enumerate(level):
            if timed and n_done % _CLOCK_IDEALS == _CLOCK_IDEALS - 1 and (
                    stop_requested() or time.perf_counter() > deadline):
                raise _TimeUp
            cur = bits[i]
            for v in addable[i]:
                new = cur | (1 << v)
                lo = (~new & (new + 1)).bit_length() - 1
                if new.bit_length() - 1 - lo >= window:
                    continue
                j = ids.get(new)
                if j is None:
                    j = ids[new] = len(bits)
                    if j >= max_ideals:
                        return None
                    bits.append(new)
                    addable.append(tuple([u for u in addable[i] if u != v] +
                                         [w for w in succ[v] if preds[w] & ~new == 0]))
                    lower.append([])
                    nxt.append(j)
                lower[j].append((i, v))
        level = nxt
    ptr = np.zeros(len(bits) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in lower], out=ptr[1:])
    flat = np.array([p for x in lower for p in x], dtype=np.int64).reshape(-1, 2)
    return bits, ptr, flat[:, 0].copy(), flat[:, 1].copy()


@njit()
def _run(first, n, low_ptr, low_ideal, low_block, blk_ptr, blk_ops, blk_work, blk_bytes,
         pred_ptr, pred, outdeg, copy_s, pays, caps, prev, threshold, quota, dp, arg_sub,
         arg_kind):
    """A slice of one run of the programme (ideals in size order, 0 empty, n - 1 full):
    fills ``dp[c, I]`` (the least largest load of a chain to ideal I with device counts
    row c), ``arg_sub`` and ``arg_kind`` for the ideals from ``first`` on, up to the one
    where the pairs visited reach ``quota``; returns (the next ideal, pairs visited).

    For every ideal I, a depth-first walk down its lower covers visits each smaller ideal
    J once, the stage ``S = I - J`` grown one block per step, its work per kind, bytes
    and copies kept up to date (undone on the way back); a branch stops where no kind can
    take S (work over ``threshold`` or bytes over the cap), as S only grows below it."""
    n_rows, n_kinds = prev.shape
    m = outdeg.shape[0]
    n_blocks = blk_work.shape[0]
    inside = np.zeros(m, dtype=np.bool_)
    n_in = np.zeros(m, dtype=np.int64)  # consumers of each op inside S
    stamp = np.full(n, -1, dtype=np.int64)
    st_ideal = np.empty(n_blocks + 1, dtype=np.int64)
    st_pos = np.empty(n_blocks + 1, dtype=np.int64)
    st_block = np.empty(n_blocks + 1, dtype=np.int64)
    work = np.zeros(n_kinds)
    loads = np.zeros(n_kinds)
    visited = 0
    dp[:, 0] = 0.0
    top = first
    while top < n and visited < quota:
        work[:] = 0.0
        held = 0.0
        comm = 0.0
        depth = 0
        st_ideal[0] = top
        st_pos[0] = low_ptr[top]
        stamp[top] = top
        while depth >= 0:
            x = st_ideal[depth]
            if st_pos[depth] == low_ptr[x + 1]:  # done below x: undo its block, go up
                if depth > 0:
                    b = st_block[depth]
                    comm = _remove(b, blk_ptr, blk_ops, pred_ptr, pred, outdeg, copy_s, inside,
                                   n_in, comm)
                    for t in range(n_kinds):
                        work[t] -= blk_work[b, t]
                    held -= blk_bytes[b]
                depth -= 1
                continue
            e = st_pos[depth]
            st_pos[depth] += 1
            j = low_ideal[e]
            if stamp[j] == top:
                continue
            stamp[j] = top
            b = low_block[e]
            ok = False
            for t in range(n_kinds):
                if work[t] + blk_work[b, t] <= threshold and held + blk_bytes[b] <= caps[t]:
                    ok = True
            if not ok:
                continue
            visited += 1
            comm = _add(b, blk_ptr, blk_ops, pred_ptr, pred, outdeg, copy_s, inside, n_in,
                        comm)
            for t in range(n_kinds):
                work[t] += blk_work[b, t]
            held += blk_bytes[b]
            for t in range(n_kinds):
                loads[t] = work[t] + pays[t] * max(comm, 0.0)
                if loads[t] > threshold or held > caps[t]:
                    loads[t] = np.inf
            for r in range(n_rows):
                for t in range(n_kinds):
                    q = prev[r, t]
                    if q >= 0 and loads[t] < np.inf:
                        cand = max(dp[q, j], loads[t])
                        if cand < dp[r, top]:
                            dp[r, top] = cand
                            arg_sub[r, top] = j
                            arg_kind[r, top] = t
            depth += 1
            st_ideal[depth] = j
            st_pos[depth] = low_ptr[j]
            st_block[depth] = b
        for r in range(n_rows):  # a device left empty: the chain of c - e_k to I
            for t in range(n_kinds):
                q = prev[r, t]
                if q >= 0 and dp[q, top] < dp[r, top]:
                    dp[r, top] = dp[q, top]
                    arg_sub[r, top] = top
                    arg_kind[r, top] = t
        top += 1
    return top, visited


@njit()
def _add(b, blk_ptr, blk_ops, pred_ptr, pred, outdeg, copy_s, inside, n_in, comm):
    """Block b's ops join S; returns S's copies: each op inside with a consumer outside,
    each op outside with a consumer inside, once."""
    for k in range(blk_ptr[b], blk_ptr[b + 1]):
        x = blk_ops[k]
        inside[x] = True
        if n_in[x] > 0:
            comm -= copy_s[x]
        if outdeg[x] - n_in[x] > 0:
            comm += copy_s[x]
        for e in range(pred_ptr[x], pred_ptr[x + 1]):
            w = pred[e]
            n_in[w] += 1
            if inside[w]:
                if outdeg[w] - n_in[w] == 0:
                    comm -= copy_s[w]
            elif n_in[w] == 1:
                comm += copy_s[w]
    return comm


@njit()
def _remove(b, blk_ptr, blk_ops, pred_ptr, pred, outdeg, copy_s, inside, n_in, comm):
    """The exact inverse of ``_add`` (ops and edges in reverse order)."""
    for k in range(blk_ptr[b + 1] - 1, blk_ptr[b] - 1, -1):
        x = blk_ops[k]
        for e in range(pred_ptr[x + 1] - 1, pred_ptr[x] - 1, -1):
            w = pred[e]
            if inside[w]:
                if outdeg[w] - n_in[w] == 0:
                    comm += copy_s[w]
            elif n_in[w] == 1:
                comm -= copy_s[w]
            n_in[w] -= 1
        if outdeg[x] - n_in[x] > 0:
            comm -= copy_s[x]
        if n_in[x] > 0:
            comm += copy_s[x]
        inside[x] = False
    return comm

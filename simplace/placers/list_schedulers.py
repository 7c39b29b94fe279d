"""List schedulers: ``heft``, and Baechi's memory-constrained ``m_topo``, ``m_etf``, ``m_sct``.

Each method builds its own schedule estimate to decide where ops go; the front end then
re-simulates the placement (the simulator runs each device's ops in graph order, not in
the scheduler's order), so the estimates in ``info`` are the heuristics' own, never the
reported step time. Every method is a deterministic function of the graph and machine:
ties go to the lower op index, then the lower device index.

Shared cost figures (``t[i, d]`` op time, ``lat``/``bw`` link latency and bandwidth with
drift corrections folded in, as the simulators see them):

* Communication of the tensors op ``p`` sends to op ``i`` (``b`` bytes: the sum of the
  edges ``p -> i``) from device ``a`` to ``d``: ``lat[a, d] + b / bw[a, d]``. As in the
  simulator a producer's output reaches a device once: once sent to ``d`` for one
  consumer, later consumers on ``d`` reuse that arrival. ``m_topo``, ``m_etf`` and
  ``m_sct`` model each link as a FIFO (a transfer starts when the producer has ended and
  the link is free); ``heft`` uses the classic contention-free model (its ops are not
  committed in time order, so a FIFO link would queue a transfer behind later ones).
* Mean costs (HEFT's ranks, SCT's LP): ``w_i = mean_d t[i, d]``;
  ``c_pi = mean(lat) + b / mean(bw)`` with both means over the off-diagonal device
  pairs (``c = 0`` on one device).
* Upward rank: ``rank_i = w_i + max_{i -> j} (c_ij + rank_j)`` (``w_i`` for sinks).

Memory (Baechi's model, every method): a device holds the parameters of the ops placed
on it, each parameter once per device (a per-device set of resident parameters), plus
``out_bytes`` of each op placed there, plus the bytes of every tensor it receives from
another device (once per producer and device). Op ``i`` is eligible on ``d`` only if
``used[d] + new parameters + out_bytes[i] + new received bytes <= memory_bytes[d]``.
With ``memory="conservative"`` (the default, Baechi's choice) nothing is ever freed:
outputs are kept to the end of the step, an upper bound on any schedule's peak, so a
placement that fits under it is not OOM in the simulator (up to the scheduler's
approximations of which tensors are sent). ``memory="liveness"`` frees an output (and
its received copies) once all its consumers are placed (graph outputs never): a
frontier estimate of the peak that packs far more onto a device, but without a
guarantee. If no device can hold an op it goes to the device with the most free memory
and ``info["note"]`` says so (``info["unplaceable_ops"]`` counts them).

Options (``optimize(..., method=..., memory=..., lp_max_edges=...)``):
  memory: ``"conservative"`` (default) or ``"liveness"``.
  lp_max_edges: m_sct solves its LP only for graphs with at most this many connected op
    pairs (default 20,000); larger graphs use the greedy favourite child.
  fifo_links: heft only; model links as FIFOs as the other methods do (default False).
"""

from __future__ import annotations

import bisect
import heapq
import math
import time

import numpy as np

from simplace.errors import SimplaceError
from simplace.placers import PlacerContext, PlacerOutput, register

MEMORY_MODELS = ("conservative", "liveness")
LP_MAX_EDGES = 20_000
# HEFT's insertion search looks at most this many idle gaps per device before appending
# (bounds the worst case on graphs with very fragmented timelines).
_MAX_GAPS = 2000


# --------------------------------------------------------------------------- problem data
class _Problem:
    """Graph structure and machine figures as plain Python lists (fast in loops)."""

    def __init__(self, ctx: PlacerContext):
        from simplace.sim.inputs import sim_inputs

        g = ctx.graph
        inp = sim_inputs(g, ctx.cost_model)
        m, d = inp.num_ops, inp.num_devices
        self.m, self.d = m, d
        self.t_np = inp.op_time_s
        self.t = inp.op_time_s.tolist()
        self.lat = inp.latency_s.tolist()
        self.bw = inp.bandwidth_bytes_per_s.tolist()
        self.mem = inp.memory_bytes.tolist()
        self.group = inp.exclusive_group.tolist()
        self.num_groups = inp.num_groups
        self.out_bytes = g.out_bytes.tolist()
        self.is_output = g.is_output.tolist()

        # Connected op pairs: bytes summed over the tensors an edge pair carries.
        src = g.src.astype(np.int64)
        dst = g.dst.astype(np.int64)
        if len(src):
            key, inv = np.unique(src * max(m, 1) + dst, return_inverse=True)
            pair_bytes = np.bincount(inv.reshape(-1), weights=g.edge_bytes,
                                     minlength=len(key))
            ps, pd = (key // max(m, 1)).astype(np.int64), (key % max(m, 1)).astype(np.int64)
        else:
            ps = pd = np.zeros(0, np.int64)
            pair_bytes = np.zeros(0)
        self.pair_src, self.pair_dst, self.pair_bytes = ps, pd, pair_bytes
        self.preds: list[list[tuple[int, float]]] = [[] for _ in range(m)]
        self.succs: list[list[tuple[int, float]]] = [[] for _ in range(m)]
        for p, j, b in zip(ps.tolist(), pd.tolist(), pair_bytes.tolist(), strict=True):
            self.preds[j].append((p, b))
            self.succs[p].append((j, b))

        params: list[list[int]] = [[] for _ in range(m)]
        for op, k in sorted(set(zip(g.param_op.tolist(), g.param_index.tolist(),
                                    strict=True))):
            params[op].append(k)
        self.params = params
        self.param_sizes = g.param_sizes.tolist()

        # Mean costs.
        self.mean_t = inp.op_time_s.mean(axis=1) if d else np.zeros(m)
        if d > 1:
            off = ~np.eye(d, dtype=bool)
            self.mean_lat = float(inp.latency_s[off].mean())
            self.mean_bw = float(inp.bandwidth_bytes_per_s[off].mean())
        else:
            self.mean_lat, self.mean_bw = 0.0, math.inf

    def mean_comm(self, nbytes: float) -> float:
        if self.d <= 1:
            return 0.0
        return self.mean_lat + nbytes / self.mean_bw

    def upward_rank(self) -> list[float]:
        w = self.mean_t.tolist()
        rank = [0.0] * self.m
        for i in range(self.m - 1, -1, -1):
            best = 0.0
            for j, b in self.succs[i]:
                v = self.mean_comm(b) + rank[j]
                if v > best:
                    best = v
            rank[i] = w[i] + best
        return rank

    def comm(self, nbytes: float, a: int, d: int) -> float:
        return 0.0 if a == d else self.lat[a][d] + nbytes / self.bw[a][d]


# --------------------------------------------------------------------------- schedule state
class _State:
    """Partial schedule: where and when placed ops run, arrivals, links and memory."""

    def __init__(self, pb: _Problem, *, memory: str, contention: bool):
        m, d = pb.m, pb.d
        self.pb = pb
        self.liveness = memory == "liveness"
        self.contention = contention
        self.dev = [-1] * m
        self.start = [0.0] * m
        self.end = [0.0] * m
        self.arr: list[dict[int, float] | None] = [None] * m  # producer -> {device: arrival}
        self.link_free = [[0.0] * d for _ in range(d)]
        self.group_free = [0.0] * max(pb.num_groups, 1)
        self.used = [0.0] * d
        self.resident: list[set[int]] = [set() for _ in range(d)]
        self.copies: list[list[tuple[int, float]] | None] = [None] * m
        self.remaining = [len(s) for s in pb.succs]
        self.unplaceable: list[int] = []

    # ---------------------------------------------------------------- evaluation
    def ready_and_need(self, i: int) -> tuple[list[float], list[float]]:
        """Per device: when op i's inputs could be there, and the bytes op i would add."""
        pb, dcount = self.pb, self.pb.d
        drt = [0.0] * dcount
        need = [pb.out_bytes[i]] * dcount
        dev, end, arr, lat, bw, lf = self.dev, self.end, self.arr, pb.lat, pb.bw, self.link_free
        contention = self.contention
        for p, b in pb.preds[i]:
            a, e, ap = dev[p], end[p], arr[p]
            la, ba, lfa = lat[a], bw[a], lf[a]
            for d in range(dcount):
                if d == a:
                    r = e
                else:
                    r = ap.get(d) if ap is not None else None
                    if r is None:
                        s = lfa[d] if contention and lfa[d] > e else e
                        r = s + la[d] + b / ba[d]
                        need[d] += b
                if r > drt[d]:
                    drt[d] = r
        ps = pb.params[i]
        if ps:
            sizes = pb.param_sizes
            for d in range(dcount):
                res = self.resident[d]
                need[d] += sum(sizes[k] for k in ps if k not in res)
        return drt, need

    def fits(self, d: int, need: float) -> bool:
        return self.used[d] + need <= self.pb.mem[d]

    def most_free(self) -> int:
        free = [mem - u for mem, u in zip(self.pb.mem, self.used, strict=True)]
        return max(range(len(free)), key=lambda d: (free[d], -d))

    # ---------------------------------------------------------------- commit
    def commit_inputs(self, i: int, d: int) -> float:
        """Send op i's missing inputs to device d (FIFO links); their latest arrival."""
        pb = self.pb
        drt = 0.0
        recv = 0.0
        for p, b in pb.preds[i]:
            a = self.dev[p]
            if a == d:
                r = self.end[p]
            else:
                ap = self.arr[p]
                if ap is None:
                    ap = self.arr[p] = {}
                r = ap.get(d)
                if r is None:
                    s = self.end[p]
                    if self.contention:
                        s = max(s, self.link_free[a][d])
                    r = s + pb.lat[a][d] + b / pb.bw[a][d]
                    if self.contention:
                        self.link_free[a][d] = r
                    ap[d] = r
                    recv += b
                    if self.liveness:
                        if self.copies[p] is None:
                            self.copies[p] = []
                        self.copies[p].append((d, b))
            drt = max(drt, r)
        self.used[d] += recv
        return drt

    def commit(self, i: int, d: int, start: float) -> None:
        """Op i runs on d from ``start``; account its parameters, output and frees."""
        pb = self.pb
        self.dev[i] = d
        self.start[i] = start
        self.end[i] = start + pb.t[i][d]
        res = self.resident[d]
        for k in pb.params[i]:
            if k not in res:
                res.add(k)
                self.used[d] += pb.param_sizes[k]
        self.used[d] += pb.out_bytes[i]
        if self.liveness:
            for p, _ in pb.preds[i]:
                self.remaining[p] -= 1
                if self.remaining[p] == 0:
                    self._free(p)
            if self.remaining[i] == 0:
                self._free(i)

    def _free(self, p: int) -> None:
        if self.pb.is_output[p]:
            return
        self.used[self.dev[p]] -= self.pb.out_bytes[p]
        for d, b in self.copies[p] or ():
            self.used[d] -= b
        self.copies[p] = None

    def makespan(self) -> float:
        return max(self.end, default=0.0)

    def info(self, memory: str) -> dict:
        out = {"memory_model": memory, "estimated_makespan_s": self.makespan(),
               "unplaceable_ops": len(self.unplaceable)}
        if self.unplaceable:
            i = self.unplaceable[0]
            more = len(self.unplaceable) - 1
            out["note"] = (
                f"no device can hold op {i} ({self.pb.out_bytes[i]:.0f} output bytes plus "
                f"its parameters and inputs, under the {memory} memory model)"
                + (f" nor {more} more ops" if more else "")
                + "; placed on the device with the most free memory")
        return out


def _memory_option(ctx: PlacerContext) -> str:
    memory = ctx.options.get("memory", "conservative")
    if memory not in MEMORY_MODELS:
        raise SimplaceError(f"memory={memory!r} is not a memory model; use one of "
                            f"{', '.join(MEMORY_MODELS)}.")
    return memory


def _empty(pb: _Problem, memory: str) -> PlacerOutput | None:
    if pb.m == 0:
        return PlacerOutput(np.zeros(0, np.int32), info={
            "memory_model": memory, "estimated_makespan_s": 0.0, "unplaceable_ops": 0})
    return None


# --------------------------------------------------------------------------- HEFT
class _Timeline:
    """Busy intervals of one exclusive group, sorted by start (they never overlap)."""

    def __init__(self):
        self.starts: list[float] = []
        self.ends: list[float] = []

    def earliest(self, ready: float, dur: float) -> tuple[float, int]:
        """Earliest start >= ready of an idle gap of length dur, and where it goes."""
        starts, ends = self.starts, self.ends
        n = len(starts)
        k = bisect.bisect_right(ends, ready)
        s = ready
        for _ in range(_MAX_GAPS):
            if k >= n or s + dur <= starts[k]:
                return s, k
            if ends[k] > s:
                s = ends[k]
            k += 1
        return max(s, ends[-1]), n

    def insert(self, s: float, e: float, k: int) -> None:
        self.starts.insert(k, s)
        self.ends.insert(k, e)


@register("heft")
def heft(ctx: PlacerContext) -> PlacerOutput:
    """HEFT (Topcuoglu et al. 2002), memory-aware.

    Ops go in decreasing upward rank (mean op time over devices, mean communication
    ``mean(lat) + bytes / mean(bw)`` over off-diagonal pairs), taken from a heap of ready
    ops so precedence always holds (ties: lower op index). Each op goes to the device
    with the earliest finish time **with insertion**: it may fill an idle gap of its
    device's timeline (devices of one exclusive group share one timeline) between
    already-scheduled ops if the gap is long enough and starts after its inputs arrive
    (contention-free links unless ``fifo_links=True``, one transfer per producer and
    device). Unlike the paper's
    HEFT, devices that cannot hold the op under the memory model (module docstring) are
    skipped.
    """
    memory = _memory_option(ctx)
    pb = _Problem(ctx)
    if (out := _empty(pb, memory)) is not None:
        return out
    st = _State(pb, memory=memory, contention=bool(ctx.options.get("fifo_links", False)))
    rank = pb.upward_rank()
    timelines = [_Timeline() for _ in range(max(pb.num_groups, 1))]
    indeg = [len(p) for p in pb.preds]
    heap = [(-rank[i], i) for i in range(pb.m) if indeg[i] == 0]
    heapq.heapify(heap)
    t, group = pb.t, pb.group
    while heap:
        _, i = heapq.heappop(heap)
        drt, need = st.ready_and_need(i)
        best = None
        eligible = [d for d in range(pb.d) if st.fits(d, need[d])]
        if not eligible:
            st.unplaceable.append(i)
            eligible = [st.most_free()]
        for d in eligible:
            dur = t[i][d]
            s, k = timelines[group[d]].earliest(drt[d], dur)
            if best is None or s + dur < best[0]:
                best = (s + dur, d, s, k)
        _, d, _, _ = best
        ready = st.commit_inputs(i, d)
        dur = t[i][d]
        s, k = timelines[group[d]].earliest(ready, dur)
        timelines[group[d]].insert(s, s + dur, k)
        st.commit(i, d, s)
        for j, _ in pb.succs[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, (-rank[j], j))
    return PlacerOutput(np.asarray(st.dev, dtype=np.int32), info=st.info(memory))


# --------------------------------------------------------------------------- m-TOPO
@register("m_topo")
def m_topo(ctx: PlacerContext) -> PlacerOutput:
    """Baechi's m-TOPO: fill devices in turn, in topological order, under memory caps.

    Devices are taken fastest first (smallest total op time ``T_d = sum_i t[i, d]``,
    ties by index). A balanced share of the compute for device ``d`` is
    ``cap_d = T* / n_g`` of its own time, with ``T* = 1 / sum_g (1 / T_g)`` the makespan of
    a perfect split over the exclusive groups (``T_g``: the group's fastest member,
    ``n_g``: its size); on identical devices this is ``sum_i t_i / D``. Ops go in graph
    (topological) order to the current device until its load ``sum t[i, d]`` reaches
    ``cap_d``; then the next device takes over (the last one takes the rest). An op that
    does not fit the current device's memory moves the fill on to the next device that
    holds it (then any earlier device that does, else the device with the most free
    memory).
    """
    memory = _memory_option(ctx)
    pb = _Problem(ctx)
    if (out := _empty(pb, memory)) is not None:
        return out
    st = _State(pb, memory=memory, contention=True)
    total = pb.t_np.sum(axis=0)
    order = [int(d) for d in np.argsort(total, kind="stable")]
    group_total: dict[int, float] = {}
    group_size: dict[int, int] = {}
    for d in range(pb.d):
        g = pb.group[d]
        group_total[g] = min(group_total.get(g, math.inf), float(total[d]))
        group_size[g] = group_size.get(g, 0) + 1
    if all(v > 0 for v in group_total.values()):
        t_star = 1.0 / sum(1.0 / v for v in group_total.values())
    else:
        t_star = 0.0
    cap = [t_star / group_size[pb.group[d]] for d in range(pb.d)]
    load = [0.0] * pb.d
    cur = 0
    for i in range(pb.m):
        while cur < pb.d - 1 and load[order[cur]] >= cap[order[cur]] and (
                load[order[cur]] > 0 or cap[order[cur]] > 0):
            cur += 1
        drt, need = st.ready_and_need(i)
        d = order[cur]
        if not st.fits(d, need[d]):
            ahead = [k for k in range(cur + 1, pb.d) if st.fits(order[k], need[order[k]])]
            if ahead:
                cur = ahead[0]
                d = order[cur]
            else:
                behind = [order[k] for k in range(cur) if st.fits(order[k], need[order[k]])]
                if behind:
                    d = behind[0]
                else:
                    st.unplaceable.append(i)
                    d = st.most_free()
        ready = st.commit_inputs(i, d)
        g = pb.group[d]
        s = max(st.group_free[g], ready)
        st.group_free[g] = s + pb.t[i][d]
        load[d] += pb.t[i][d]
        st.commit(i, d, s)
    info = st.info(memory)
    info["device_order"] = order
    info["share_s"] = [float(c) for c in cap]
    return PlacerOutput(np.asarray(st.dev, dtype=np.int32), info=info)


# --------------------------------------------------------------------------- ETF family
def _etf(pb: _Problem, memory: str, fav_parent: list[int] | None = None) -> _State:
    """Earliest-task-first list scheduling, memory-constrained (see ``m_etf``).

    Each ready op waits in the queue of the device it would currently go to: ``avail[d]``
    (its inputs are there by the time d is free; start ``= free time of d``, order by
    ``(-rank, index)``) or ``pending[d]`` (start ``= data-ready time``). The next op is
    the head with the earliest start over all devices (ties: higher rank, lower index,
    lower device); its device is re-checked when it is taken (devices fill up as the
    schedule grows) and, if another device now suits it better, it moves to that
    device's queue instead. Data-ready times and memory needs are computed once, when
    the op becomes ready (the commit then sends its inputs over the FIFO links exactly).
    """
    st = _State(pb, memory=memory, contention=True)
    m, dcount = pb.m, pb.d
    neg_rank = [-r for r in pb.upward_rank()]
    t, group, gfree = pb.t, pb.group, st.group_free
    avail: list[list] = [[] for _ in range(dcount)]
    pending: list[list] = [[] for _ in range(dcount)]
    drt_of: list = [None] * m
    need_of: list = [None] * m

    def device_of(i: int) -> tuple[int, bool]:
        """(device, fits) where op i would go now: the earliest finish among devices
        that can hold it (SCT: its favourite parent's device when close enough)."""
        drt, need, ti = drt_of[i], need_of[i], t[i]
        best_f, best_d = math.inf, -1
        starts = [0.0] * dcount
        ok = [False] * dcount
        for d in range(dcount):
            s = gfree[group[d]]
            if drt[d] > s:
                s = drt[d]
            starts[d] = s
            if st.fits(d, need[d]):
                ok[d] = True
                f = s + ti[d]
                if f < best_f:
                    best_f, best_d = f, d
        if best_d < 0:  # fits nowhere: the device with the most free memory
            return st.most_free(), False
        if fav_parent is not None and (q := fav_parent[i]) >= 0:
            dq = st.dev[q]
            if dq != best_d and ok[dq]:
                b = next(b for p, b in pb.preds[i] if p == q)
                if starts[dq] + ti[dq] <= best_f + pb.comm(b, dq, best_d):
                    return dq, True
        return best_d, True

    def enqueue(i: int, d: int) -> None:
        r = drt_of[i][d]
        if r <= gfree[group[d]]:
            heapq.heappush(avail[d], (neg_rank[i], i))
        else:
            heapq.heappush(pending[d], (r, neg_rank[i], i))

    def make_ready(i: int) -> None:
        drt_of[i], need_of[i] = st.ready_and_need(i)
        enqueue(i, device_of(i)[0])

    indeg = [len(p) for p in pb.preds]
    for i in range(m):
        if indeg[i] == 0:
            make_ready(i)
    placed = 0
    while placed < m:
        best = None
        for d in range(dcount):
            gf = gfree[group[d]]
            ad, pdq = avail[d], pending[d]
            while pdq and pdq[0][0] <= gf:
                _, nr, i = heapq.heappop(pdq)
                heapq.heappush(ad, (nr, i))
            if ad:
                cand = (gf, ad[0][0], ad[0][1], d, ad)
            elif pdq:
                cand = (pdq[0][0], pdq[0][1], pdq[0][2], d, pdq)
            else:
                continue
            if best is None or cand[:4] < best[:4]:
                best = cand
        _, _, i, d, queue = best
        heapq.heappop(queue)
        e, fits = device_of(i)
        if e != d:  # the device filled up or got busy since: queue it where it goes now
            enqueue(i, e)
            continue
        if not fits:
            st.unplaceable.append(i)
        ready = st.commit_inputs(i, d)
        g = group[d]
        start = max(gfree[g], ready)
        gfree[g] = start + t[i][d]
        st.commit(i, d, start)
        drt_of[i] = need_of[i] = None
        placed += 1
        for j, _ in pb.succs[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                make_ready(j)
    return st


@register("m_etf")
def m_etf(ctx: PlacerContext) -> PlacerOutput:
    """Baechi's m-ETF: earliest-task-first list scheduling under memory caps.

    Repeatedly schedule, among ready ops (all predecessors scheduled), the one that can
    start earliest: op ``i``'s start on ``d`` is ``max(free time of d's exclusive group,
    arrival of its last input on d)`` (FIFO links, one transfer per producer and
    device), over the devices that can still hold it (module docstring). Ties: higher
    upward rank, then lower op index. Each op's device is the eligible one where it
    *finishes* first (lower index on ties): on identical devices that is exactly Hwang
    et al.'s ETF (the earliest-start pair); on heterogeneous machines it stops an idle
    slow CPU from taking every op. Devices run their ops back to back (no insertion).
    Implementation: per-device queues, re-checked lazily (see ``_etf``); O(M D log M).
    """
    memory = _memory_option(ctx)
    pb = _Problem(ctx)
    if (out := _empty(pb, memory)) is not None:
        return out
    st = _etf(pb, memory)
    return PlacerOutput(np.asarray(st.dev, dtype=np.int32), info=st.info(memory))


# --------------------------------------------------------------------------- m-SCT
def favourite_children_lp(pb: _Problem) -> tuple[list[int], dict]:
    """Favourite child of each op from the SCT LP relaxation (Hanen & Munier 1995).

    Variables: ``x_e in [0, 1]`` per connected op pair ``e = (i, j)`` ("j is NOT the
    favourite child of i"), start times ``s_i >= 0`` and the makespan ``W``. Units: op
    and communication times divided by their mean positive op time.

        minimise  W + eps * sum_i s_i          (eps = 1e-3 / M: prefer early starts
                                               among the optimal-W solutions)
        s_i + w_i + c_ij x_ij <= s_j           for every pair (i, j)
        s_i + w_i <= W                         for every sink i
        sum_j x_ij >= |succ(i)| - 1            at most one favourite child per op
        sum_i x_ij >= |pred(j)| - 1            at most one favourite parent per op

    with ``w_i``, ``c_ij`` the mean costs. Rounding: j is i's favourite child when
    ``x_ij < 0.5`` (the constraints allow at most one such child per op and one such
    parent per op; ties to the smaller x, then the lower index). Solved with
    ``scipy.optimize.linprog(method="highs")``.
    Returns ``fav_parent[j]`` (-1: none) and info.
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    m = pb.m
    ps, pd, pbytes = pb.pair_src, pb.pair_dst, pb.pair_bytes
    e = len(ps)
    w = np.asarray(pb.mean_t, dtype=np.float64)
    c = np.array([pb.mean_comm(b) for b in pbytes.tolist()], dtype=np.float64)
    pos = w[w > 0]
    unit = float(pos.mean()) if pos.size else 1.0
    w, c = w / unit, c / unit
    nx, ns = e, m
    n = nx + ns + 1  # x, s, W
    rows, cols, vals, rhs = [], [], [], []
    r = 0
    ar = np.arange(e)
    # precedence: s_i - s_j + c x <= -w_i
    rows += [r + ar, r + ar, r + ar]
    cols += [nx + ps, nx + pd, ar]
    vals += [np.ones(e), -np.ones(e), c]
    rhs.append(-w[ps])
    r += e
    outdeg = np.bincount(ps, minlength=m)
    indeg = np.bincount(pd, minlength=m)
    sinks = np.flatnonzero(outdeg == 0)
    k = len(sinks)
    rows += [r + np.arange(k), r + np.arange(k)]
    cols += [nx + sinks, np.full(k, n - 1)]
    vals += [np.ones(k), -np.ones(k)]
    rhs.append(-w[sinks])
    r += k
    # -sum_j x_ij <= 1 - outdeg(i) for ops with >= 2 children, and
    # -sum_i x_ij <= 1 - indeg(j) for ops with >= 2 parents.
    for deg, end in ((outdeg, ps), (indeg, pd)):
        multi = deg >= 2
        sel = np.flatnonzero(multi[end])
        row_of = np.full(m, -1)
        row_of[multi] = r + np.arange(int(multi.sum()))
        rows.append(row_of[end[sel]])
        cols.append(sel)
        vals.append(-np.ones(len(sel)))
        rhs.append(1.0 - deg[multi])
        r += int(multi.sum())
    a_ub = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(r, n)).tocsr()
    b_ub = np.concatenate(rhs)
    cost = np.zeros(n)
    cost[n - 1] = 1.0
    cost[nx:nx + ns] = 1e-3 / max(m, 1)
    bounds = np.zeros((n, 2))
    bounds[:nx, 1] = 1.0
    bounds[nx:, 1] = np.inf
    t0 = time.perf_counter()
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    lp_s = time.perf_counter() - t0
    info = {"favourite_children": "lp", "lp_status": int(res.status),
            "lp_message": str(res.message), "lp_wall_s": lp_s,
            "lp_variables": n, "lp_constraints": r}
    if res.status != 0 or res.x is None:
        fav, ginfo = favourite_children_greedy(pb)
        info.update(ginfo)
        info["favourite_children"] = "greedy"
        info["note_lp"] = f"the SCT LP failed ({res.message}); greedy favourite children"
        return fav, info
    x = res.x[:nx]
    info["lp_makespan_s"] = float(res.x[n - 1] * unit)
    fav_parent = [-1] * m
    fav_x = [math.inf] * m
    best_child: dict[int, tuple[float, int]] = {}
    for idx in np.flatnonzero(x < 0.5).tolist():
        i, j, xv = int(ps[idx]), int(pd[idx]), float(x[idx])
        cur = best_child.get(i)
        if cur is None or (xv, j) < cur:
            best_child[i] = (xv, j)
    for i in sorted(best_child):
        xv, j = best_child[i]
        if xv < fav_x[j]:  # numerically two parents could both sit just under 0.5
            fav_parent[j], fav_x[j] = i, xv
    info["favourite_pairs"] = sum(1 for q in fav_parent if q >= 0)
    return fav_parent, info


def favourite_children_greedy(pb: _Problem) -> tuple[list[int], dict]:
    """Favourite children by the largest tensor: connected op pairs in decreasing bytes
    (ties: lower parent, then lower child index), each pair taken when its parent has
    no favourite child yet and its child no favourite parent (a greedy matching)."""
    fav_parent = [-1] * pb.m
    has_child = [False] * pb.m
    order = np.lexsort((pb.pair_dst, pb.pair_src, -pb.pair_bytes))
    for k in order.tolist():
        i, j = int(pb.pair_src[k]), int(pb.pair_dst[k])
        if not has_child[i] and fav_parent[j] < 0:
            has_child[i] = True
            fav_parent[j] = i
    return fav_parent, {"favourite_children": "greedy",
                        "favourite_pairs": sum(1 for q in fav_parent if q >= 0)}


@register("m_sct")
def m_sct(ctx: PlacerContext) -> PlacerOutput:
    """Baechi's m-SCT: m-ETF plus favourite children from the SCT LP relaxation.

    Favourite children come from ``favourite_children_lp`` (the LP and its rounding are
    documented there); for graphs with more than ``lp_max_edges`` connected op pairs
    (default 20,000) the LP is skipped and ``favourite_children_greedy`` picks favourites
    by the largest tensor (``info["favourite_children"]`` says which).
    Scheduling is ``m_etf``'s, except for the device of an op j whose favourite parent q
    sits on device ``d_q``: j goes to ``d_q`` when ``d_q`` can hold it and j's finish
    there is no later than its best finish elsewhere (on ``d*``) plus the time the
    tensor ``q -> j`` would take over the link ``d_q -> d*``.
    """
    memory = _memory_option(ctx)
    pb = _Problem(ctx)
    if (out := _empty(pb, memory)) is not None:
        out.info["favourite_children"] = "none"
        return out
    limit = int(ctx.options.get("lp_max_edges", LP_MAX_EDGES))
    if len(pb.pair_src) == 0:
        fav, finfo = [-1] * pb.m, {"favourite_children": "lp", "favourite_pairs": 0}
    elif len(pb.pair_src) <= limit:
        fav, finfo = favourite_children_lp(pb)
    else:
        fav, finfo = favourite_children_greedy(pb)
        finfo["note_lp"] = (f"{len(pb.pair_src)} connected op pairs > lp_max_edges={limit}: "
                            "greedy favourite children (the largest tensor) instead of the "
                            "SCT LP")
    st = _etf(pb, memory, fav)
    info = st.info(memory)
    info.update(finfo)
    info["favourite_parent"] = fav
    return PlacerOutput(np.asarray(st.dev, dtype=np.int32), info=info)

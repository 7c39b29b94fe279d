"""HEFT for the program: HEFT's own schedule (``heft_proposal``) proposes a device per
op, and ``heft`` places units in graph order on the proposed device or the open
segment's, whichever ends them first (``simplace.placers.list_schedulers`` describes
the runs they share)."""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from simplace.placers import PlacerContext, PlacerOutput, register
from simplace.placers._list_runs import COMMON_OPTIONS, Problem, Setup, earliest
from simplace.placers.registry import Cost, bool_option, option_values

# HEFT's insertion search looks at most this many idle gaps per device before appending
# (bounds the worst case on graphs with very fragmented timelines).
_MAX_GAPS = 2000
# The first this many gaps are scanned in Python, the rest vectorised (numpy's call costs
# more than a few Python steps, and most searches end in the first gaps).
_SHORT_SCAN = 16


# --------------------------------------------------------------------------- HEFT's own state
class _State:
    """HEFT's own partial schedule (op by op in its order, no segments, no host): where
    and when placed ops run, arrivals, links and Baechi's memory. Only ``heft_proposal``
    uses it; the methods' schedules are ``IncrementalProgram``'s."""

    def __init__(self, pb: Problem, *, memory: str, contention: bool):
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


# --------------------------------------------------------------------------- HEFT
class _Timeline:
    """Busy intervals of one exclusive group, sorted by start (they never overlap, so their
    ends are sorted too): Python lists for the first few gaps of an insertion search, and
    a numpy copy, grown by doubling, for a long one (one Python loop step per gap took 2
    of heft's 3.4 s on nmt_2layer, whose timelines hold thousands of short gaps)."""

    def __init__(self):
        self.starts: list[float] = []
        self.ends: list[float] = []
        self._np_starts = np.empty(64)
        self._np_ends = np.empty(64)

    def earliest(self, ready: float, dur: float) -> tuple[float, int]:
        """Earliest start >= ready of an idle gap of length dur, and where it goes: the
        first of at most ``_MAX_GAPS`` gaps from the first interval ending after ready,
        else after the last interval."""
        starts, ends = self.starts, self.ends
        n = len(starts)
        k = bisect.bisect_right(ends, ready)
        s = ready
        # The gap before interval j > k begins at ends[j - 1] (>= ends[k] > ready).
        for j in range(k, min(n, k + _SHORT_SCAN)):
            if s + dur <= starts[j]:
                return s, j
            s = ends[j]
        lo = k + _SHORT_SCAN
        hi = min(n, k + _MAX_GAPS)
        if lo >= hi:
            return (s, n) if n <= k + _SHORT_SCAN else (ends[-1], n)
        fits = self._np_ends[lo - 1:hi - 1] + dur <= self._np_starts[lo:hi]
        j = int(np.argmax(fits))
        if fits[j]:
            return ends[lo + j - 1], lo + j
        return ends[-1], n

    def insert(self, s: float, e: float, k: int) -> None:
        n = len(self.starts)
        self.starts.insert(k, s)
        self.ends.insert(k, e)
        if n == len(self._np_starts):
            self._np_starts = np.concatenate([self._np_starts, np.empty(n)])
            self._np_ends = np.concatenate([self._np_ends, np.empty(n)])
        st, en = self._np_starts, self._np_ends
        if k < n:  # (numpy copies an overlapping slice before it assigns)
            st[k + 1:n + 1] = st[k:n]
            en[k + 1:n + 1] = en[k:n]
        st[k], en[k] = s, e


def heft_proposal(ctx: PlacerContext, memory: str, *, fifo_links: bool = False
                  ) -> tuple[np.ndarray, float]:
    """HEFT's own schedule (Topcuoglu et al. 2002), memory-aware: device per op and its
    estimated makespan.

    Ops go in decreasing upward rank (mean op time over devices, mean communication
    ``mean(lat) + bytes / mean(bw)`` over off-diagonal pairs), taken from a heap of ready
    ops so precedence always holds (ties: lower op index). Each op goes to the device
    with the earliest finish time **with insertion**: it may fill an idle gap of its
    device's timeline (devices of one exclusive group share one timeline) if the gap is
    long enough and starts after its inputs arrive (contention-free links unless
    ``fifo_links``, one transfer per producer and device). Devices that cannot hold the
    op under the memory model are skipped. This schedule ignores segments and the
    program's op order: ``heft`` uses it only to propose devices.
    """
    pb = Problem(ctx)
    st = _State(pb, memory=memory, contention=fifo_links)
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
        eligible = [d for d in range(pb.d) if st.fits(d, need[d])] or [st.most_free()]
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
    return np.asarray(st.dev, dtype=np.int32), st.makespan()


@register("heft", cost=Cost(0.0, 1.6e-5), rank=9, options={
    **COMMON_OPTIONS,
    "fifo_links": bool_option("HEFT's own schedule models links as FIFOs (default False: "
                              "contention-free)", False)})
def heft(ctx: PlacerContext) -> PlacerOutput:
    """HEFT's device choices, scheduled in the program's order.

    Each unit (op or block, in graph order) goes to the device HEFT's own schedule gives
    most of its work (``heft_proposal``) or stays on the open segment's device, whichever
    ends it first under the program's semantics (module docstring). Option
    ``fifo_links``: HEFT's own schedule models links as FIFOs (default: contention-free,
    the classic model)."""
    s = Setup(ctx)
    if s.m == 0:
        return s.finish([{"placement": np.zeros(0, np.int32), "estimated_s": 0.0,
                          "unplaceable": []}])
    fifo = option_values("heft", ctx.options)["fifo_links"]
    proposals: dict[bool, tuple[list[int], float]] = {}  # per memory model (liveness?)

    def proposal(liveness: bool) -> list[int]:
        if liveness not in proposals:
            prop, est = heft_proposal(ctx, "liveness" if liveness else "conservative",
                                      fifo_links=fifo)
            proposals[liveness] = (prop.tolist(), est)
        return proposals[liveness][0]

    t = s.prog.t

    def choose(run, a, b, eligible):
        prop_l = proposal(run.mem.liveness)
        if b == a + 1:
            want = prop_l[a]
        else:
            load: dict[int, float] = {}
            for i in range(a, b):
                load[prop_l[i]] = load.get(prop_l[i], 0.0) + t[i][prop_l[i]]
            want = max(sorted(load), key=lambda d: load[d])
        cands = [d for d in dict.fromkeys((want, run.prog.cur)) if d in eligible]
        if not cands:
            return earliest(run, a, b, eligible)[0]
        ends = run.ends(a, b, cands)
        return min(cands, key=lambda d: (ends[d], d != want))  # ties: HEFT's choice

    runs = s.unit_runs(choose)
    for r in runs:
        r["info"] = {"heft_estimated_makespan_s":
                     float(proposals[r["memory"] == "liveness"][1])}
    return s.finish(runs)

"""List schedulers that schedule the program simplace runs: ``heft``, ``m_topo``, ``m_etf``,
``m_sct`` (Baechi's memory-constrained list schedulers, and HEFT).

The program (``simplace.apply``; the design notes, "Simulation semantics") runs ops in
graph order: a *segment* is a maximal run of consecutive ops on one device, one jitted
call; one host thread dispatches the segments and the ``device_put`` of their inputs in
graph order; each segment pays a launch; a producer's outputs reach another device once,
by one put, over a FIFO link; outputs appear when their segment ends. A classic list
scheduler picks its own op order, which the program does not follow, and places op by op,
which the program pays for in launches and host dispatches: both made these methods
slower than one device. Here every method schedules **in graph order, under the
program's semantics**:

* **The estimate is the program.** ``_Program`` simulates the placement incrementally, op
  by op in graph order, exactly as the reference simulator does (segment start =
  latest of its device group free, its inputs' arrival and its dispatch; launch, largest
  per-op launch, fused and unfused op costs; host time of each put and dispatch, and the
  host's wait for a copy between PjRt clients (``put_waits``); FIFO links whose latencies
  overlap; one put per producer and device). Placing the next op
  (or run of ops) on a device gives the exact end of the segment it joins or opens; the
  only approximation is that a put carries the outputs its first reader needs (the
  program sends every output any reader on that device needs).
* **Units.** A unit is a run of consecutive ops placed together: one op; a block (ops of
  about equal work, ``sum_i min_d t[i, d]`` split into k parts, k in ``BLOCK_COUNTS``
  below M); or a module run (consecutive ops of one module path cut to a depth in
  ``MODULE_DEPTHS``, forward and backward apart: a layer, an LSTM cell step, an attention
  block, the pieces an expert places). Each method places units in graph order; a unit
  is tried on each device by simulating it there and rolling the trial back. Coarse
  units cannot fragment the program into many small segments; fine ones find parallel
  work. Each unit family runs once, and once more (but op units) with **one-unit
  lookahead**: a unit's end on a device counts as the later of that end and the
  earliest end of the next unit on any device after it, so that a unit may end a
  little later to leave its device free for what follows (this is how cell steps of
  stacked LSTM layers pipeline across devices, as the expert placement does). Then
  **segment re-passes**: the segments of the best placement so far become the units of
  a new run (units aligned with what the first runs found; up to ``repasses`` times,
  while it helps). The run whose simulated step time is lowest wins (``info["unit"]``;
  every run in ``info["runs"]``).
* **Device rules** (what tells the methods apart):
  - ``m_etf``: earliest task first in the program's order: the unit goes to the device
    that can hold it where its segment ends first (ties: the device of the open
    segment, which adds no segment; then the lower index).
  - ``m_sct``: ``m_etf``, plus SCT's favourite children (from the LP relaxation of
    Hanen & Munier, or by the largest tensor on big graphs, see
    ``favourite_children_lp``): a unit goes to the device of its ops' favourite parents
    when that device can hold it and its end there is no later than the best end plus
    the time the favourite tensors would take to cross over.
  - ``heft``: HEFT's own schedule (upward rank order, earliest finish with insertion,
    memory-aware, see ``heft``) proposes a device per op; in graph order a unit goes to
    its proposed device (the one holding most of its work under HEFT) or stays on the
    device of the open segment, whichever ends it first (ties: the proposed device).
  - ``m_topo``: Baechi's fill in topological (graph) order: the fastest k devices in
    turn, each up to its share of the work, for every k = 1..D; no unit runs (its
    placements are contiguous already).
* **Memory** (Baechi's model, every method): a device holds the parameters of the ops
  placed on it (each once), the output of each op placed there and the bytes of every
  tensor it receives (once per producer and device). A unit is eligible on a device only
  if what it adds fits. ``memory="conservative"`` (Baechi's choice) frees nothing, an
  upper bound on the program's peak; ``memory="liveness"`` frees an output and its
  copies once all its readers are placed (graph outputs never): it packs far more onto a
  device, without a guarantee (the program keeps a segment's outputs until the segment
  ends). ``memory="auto"`` (default) runs under the conservative model, and when memory
  kept some unit off a device (big training graphs on 12 GB GPUs), under liveness too.
  Whatever the model, the reference simulator has the last word: runs are simulated in
  order of estimated step time (at most ``_MAX_CHECKS``, plus the best conservative
  one) until one fits, and that one is the schedule (``info["checked"]``,
  ``info["memory_model"]``). A unit that fits nowhere goes to the device with the most
  free memory, op by op (``info["unplaceable_ops"]``, ``info["note"]``).
* **Never worse than one device.** The winning schedule is simulated by the reference
  simulator and compared with the single-device placements ``single`` considers (devices
  by the step time of the whole graph alone, the first that fits memory); when one of
  them is faster (or the schedule runs out of memory and it does not), it is returned
  instead and ``info["returned"]`` says ``"single"`` (else ``"schedule"``), with both
  step times in ``info``.

Every method is a deterministic function of the graph and machine (no random choice)
unless given a time budget (``budget_s``; ``local`` gives its starts one): then no new
run starts once it is spent (at least one run always completes; ``info["runs_skipped"]``).
Cost: O(M D) Python steps per run (O(M D^2) with lookahead), about 20
runs per memory model: seconds on graphs of a few thousand ops, longer on the zoo's
biggest graphs.

Options (``optimize(..., method=..., memory=..., ...)``):
  memory: ``"auto"`` (default), ``"conservative"`` or ``"liveness"``.
  lp_max_edges: m_sct solves its LP only for graphs with at most this many connected op
    pairs (default 20,000); larger graphs use the greedy favourite child.
  units: block counts of the unit runs, 0 meaning op units (default: 0 and
    ``BLOCK_COUNTS``); module_depths (default ``MODULE_DEPTHS``, [] for none); lookahead
    (default True); repasses (default ``REPASSES``). Not m_topo's.
  fallback_single: return the fastest single device that fits when it beats the
    schedule (default True; False returns the schedule whatever it costs).
  fifo_links: heft only, for HEFT's own schedule (default False: contention-free).
"""

from __future__ import annotations

import bisect
import heapq
import math
import time

import numpy as np

from simplace.errors import SimplaceError
from simplace.graph import split_name_path
from simplace.placers import PlacerContext, PlacerOutput, penalised, register
from simplace.sim.inputs import put_waits_of
from simplace.sim.reference import segments_of

MEMORY_MODELS = ("auto", "conservative", "liveness")
# Runs the reference simulator checks for memory before it settles for the best that fits.
_MAX_CHECKS = 4
LP_MAX_EDGES = 20_000
# Block counts tried besides op units: from a few big blocks (close to one device per
# phase of the model) to many small ones.
BLOCK_COUNTS = (8, 32, 128, 512, 1024, 2048)
# Module-path depths whose runs of consecutive ops are tried as units (a layer, a cell
# step, an attention block...: the pieces an expert would place).
MODULE_DEPTHS = (1, 2, 3, 4)
# Re-runs over the segments of the best placement so far (each one only while it helps).
REPASSES = 3
# The keyword options every method here takes (``optimize`` refuses others).
_COMMON_OPTIONS = {
    "memory": "memory model: 'auto' (default: conservative, then liveness if memory was "
              "tight), 'conservative' (nothing freed) or 'liveness'",
    "units": "block counts of the unit runs, 0 for op units (default [0, 8, 32, 128, 512, "
             "1024, 2048], those below the number of ops)",
    "module_depths": "module-path depths whose runs are tried as units (default [1, 2, 3, 4])",
    "repasses": "re-runs over the best placement's segments (default 3)",
    "lookahead": "also run each unit family (but op units) looking one unit ahead "
                 "(default True)",
    "fallback_single": "return the fastest single device that fits when it is faster "
                       "(default True)",
}
# HEFT's insertion search looks at most this many idle gaps per device before appending
# (bounds the worst case on graphs with very fragmented timelines).
_MAX_GAPS = 2000


# --------------------------------------------------------------------------- problem data
class _Problem:
    """Graph structure and machine figures as plain Python lists (fast in loops)."""

    def __init__(self, ctx: PlacerContext):
        g = ctx.graph
        inp = ctx.inputs  # the context's cached arrays (the program estimate uses them too)
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


# --------------------------------------------------------------------------- HEFT's own state
class _State:
    """HEFT's own partial schedule (op by op in its order, no segments, no host): where
    and when placed ops run, arrivals, links and Baechi's memory. Only ``heft_proposal``
    uses it; the methods' schedules are ``_Program``'s."""

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



# --------------------------------------------------------------------------- the program
class _Program:
    """The program's schedule, built op by op in graph order (``reference._simulate``'s
    rules, incrementally), with a journal to try a unit on a device and roll it back.

    State: ``p`` (device per placed op, -1 not yet), ``seg``/``seg_end`` (closed
    segments' ends), ``arr[j]`` (device -> arrival of op j's put), group and link free
    times, ``host`` (host time, the open segment's puts included, its dispatch not), and
    the open segment: device ``cur``, first op ``first``, ``ready`` (group free at its
    opening and its inputs' arrivals), ``work`` (launch plus op costs) and ``pw`` (its
    ops' pool work so far: the pool's launch is added when it reaches the minimum).
    """

    def __init__(self, graph, inp):
        m, d = inp.num_ops, inp.num_devices
        self.m, self.d = m, d
        self.t = inp.op_time_s.tolist()
        self.unf = inp.op_unfused_s.tolist()
        self.pool_work = inp.op_pool_work.tolist()
        self.pool_min = inp.pool_min_work.tolist()
        self.pool_launch = inp.pool_launch_s.tolist()
        self.lat = inp.latency_s.tolist()
        self.bw = inp.bandwidth_bytes_per_s.tolist()
        self.put = inp.put_s.tolist()
        self.waits = put_waits_of(inp).tolist()
        self.launch = inp.launch_s.tolist()
        self.disp = inp.dispatch_s.tolist()
        self.group = inp.exclusive_group.tolist()
        self.num_groups = inp.num_groups
        src = graph.src.tolist()
        eout = graph.edge_output.tolist()
        tensor_bytes: dict[tuple[int, int], float] = {}
        for s_, k, nb in zip(src, eout, graph.edge_bytes.tolist(), strict=True):
            tensor_bytes[s_, k] = max(tensor_bytes.get((s_, k), 0.0), nb)
        in_ptr, in_order = (a.tolist() for a in graph.in_edges)
        # ins[i]: (producer, bytes of its distinct outputs op i reads), producers in the
        # order of op i's first in-edge from each (the order the program issues puts).
        self.ins: list[list[tuple[int, float]]] = []
        for i in range(m):
            outs: dict[int, set[int]] = {}
            for e in in_order[in_ptr[i]:in_ptr[i + 1]]:
                outs.setdefault(src[e], set()).add(eout[e])
            self.ins.append([(j, float(sum(tensor_bytes[j, k] for k in sorted(ks))))
                             for j, ks in outs.items()])
        self.reset()

    def reset(self) -> None:
        m, d = self.m, self.d
        self.p = [-1] * m
        self.seg = [0] * m
        self.seg_end: list[float] = []
        self.arr: list[dict[int, float] | None] = [None] * m
        self.gfree = [0.0] * max(self.num_groups, 1)
        self.lfree = [[0.0] * d for _ in range(d)]
        self.host = 0.0
        self.max_arrival = 0.0
        self.cur, self.first = -1, 0
        self.ready = self.work = self.pw = 0.0
        self.journal: list | None = None  # the innermost trial's changes (None: no trial)
        self._saved: list[tuple] = []

    def open_end(self) -> float:
        """End of the open segment if it were closed now (0 when there is none)."""
        c = self.cur
        if c < 0:
            return 0.0
        return max(self.ready, self.host + self.disp[c]) + self.work + self._pool(c, self.pw)

    def _pool(self, d: int, pool_work: float) -> float:
        """The pool's launch a segment on device d with this much pool work pays."""
        return self.pool_launch[d] if pool_work >= self.pool_min[d] else 0.0

    def end_on(self, i: int, d: int) -> float:
        """End of op i's segment if op i (the next op) went to device d; no change."""
        c, p, arr = self.cur, self.p, self.arr
        if d == c:
            h, ready, first, ce = self.host, self.ready, self.first, -1.0
        else:
            ce = self.open_end()
            h = self.host + (self.disp[c] if c >= 0 else 0.0)
            g = self.group[d]
            ready = ce if c >= 0 and self.group[c] == g else self.gfree[g]
            first = i
        fused = False
        links = None
        for j, nb in self.ins[i]:
            if j >= first:
                fused = True
                continue
            a = p[j]
            if a == d:
                continue
            aj = arr[j]
            r = aj.get(d) if aj is not None else None
            if r is None:
                h += self.put[a][d]
                se = ce if j >= self.first and c >= 0 and d != c else self.seg_end[self.seg[j]]
                if links is None:
                    links = {}
                busy = nb / self.bw[a][d]
                t0 = max(h, se, links.get(a, self.lfree[a][d]))
                links[a] = t0 + busy
                r = t0 + self.lat[a][d] + busy
                if self.waits[a][d] and r > h:  # put_waits: the host waits for the copy
                    h = r
            if r > ready:
                ready = r
        if d == c:
            work = self.work + self.t[i][d] + (0.0 if fused else self.unf[i][d])
            pw = self.pw + self.pool_work[i][d]
        else:
            work = self.launch[d] + self.t[i][d] + self.unf[i][d]
            pw = self.pool_work[i][d]
        return max(ready, h + self.disp[d]) + work + self._pool(d, pw)

    def mark(self) -> None:
        """Start a trial: ``undo`` brings the state back to this point (trials nest)."""
        self._saved.append((self.journal, self.host, self.cur, self.first, self.ready,
                            self.work, self.pw, self.max_arrival, len(self.seg_end),
                            list(self.gfree)))
        self.journal = []

    def undo(self) -> None:
        for kind, a, b, v in reversed(self.journal):
            if kind == 0:
                self.p[a] = -1
            elif kind == 1:
                del self.arr[a][b]
            else:
                self.lfree[a][b] = v
        (self.journal, self.host, self.cur, self.first, self.ready, self.work, self.pw,
         self.max_arrival, n_seg, self.gfree) = self._saved.pop()
        del self.seg_end[n_seg:]

    def commit(self, i: int, d: int) -> None:
        """Op i (the next op) runs on device d."""
        p, arr, jr = self.p, self.arr, self.journal
        if d != self.cur:
            c = self.cur
            if c >= 0:  # close the open segment: its dispatch, then its end is known
                end = self.open_end()
                self.host += self.disp[c]
                self.seg_end.append(end)
                self.gfree[self.group[c]] = end
            self.cur, self.first = d, i
            self.ready = self.gfree[self.group[d]]
            self.work, self.pw = self.launch[d], 0.0
        fused = False
        ready = self.ready
        for j, nb in self.ins[i]:
            if j >= self.first:
                fused = True
                continue
            a = p[j]
            if a == d:
                continue
            aj = arr[j]
            if aj is None:
                aj = arr[j] = {}
            r = aj.get(d)
            if r is None:
                self.host += self.put[a][d]
                busy = nb / self.bw[a][d]
                t0 = max(self.host, self.seg_end[self.seg[j]], self.lfree[a][d])
                if jr is not None:
                    jr.append((2, a, d, self.lfree[a][d]))
                    jr.append((1, j, d, None))
                self.lfree[a][d] = t0 + busy
                r = aj[d] = t0 + self.lat[a][d] + busy
                if r > self.max_arrival:
                    self.max_arrival = r
                if self.waits[a][d] and r > self.host:  # put_waits: the host waits
                    self.host = r
            if r > ready:
                ready = r
        self.ready = ready
        self.work += self.t[i][d] + (0.0 if fused else self.unf[i][d])
        self.pw += self.pool_work[i][d]
        p[i] = d
        self.seg[i] = len(self.seg_end)
        if jr is not None:
            jr.append((0, i, None, None))

    def step_time(self) -> float:
        """The step time once every op is placed (the reference simulator's, up to the
        put sizes, see the module docstring)."""
        c = self.cur
        if c < 0:
            return 0.0
        return max(self.host + self.disp[c], self.open_end(), self.max_arrival,
                   max(self.seg_end, default=0.0))

    def replay(self, placement) -> float:
        """Simulate a whole placement from scratch; its step time."""
        self.reset()
        for i, d in enumerate(placement):
            self.commit(i, int(d))
        return self.step_time()


class _Memory:
    """Baechi's memory accounting for placements built in graph order (module docstring).

    ``used[d]``: bytes charged to device d; ``sent[j]``: device -> bytes of op j's put
    there (received copies, charged to the receiver)."""

    def __init__(self, graph, inp, prog: _Program, *, liveness: bool):
        m, d = inp.num_ops, inp.num_devices
        self.prog = prog
        self.cap = inp.memory_bytes.tolist()
        self.used = [0.0] * d
        self.resident: list[set[int]] = [set() for _ in range(d)]
        self.out = graph.out_bytes.tolist()
        self.is_output = graph.is_output.tolist()
        params: list[list[int]] = [[] for _ in range(m)]
        for op, k in sorted(set(zip(graph.param_op.tolist(), graph.param_index.tolist(),
                                    strict=True))):
            params[op].append(k)
        self.params = params
        self.param_sizes = graph.param_sizes.tolist()
        self.sent: list[dict[int, float] | None] = [None] * m
        self.liveness = liveness
        readers = [0] * m
        for ins in prog.ins:
            for j, _ in ins:
                readers[j] += 1
        self.remaining = readers

    def need(self, a: int, b: int, d: int) -> float:
        """Bytes that ops a..b-1 (the next ops) would add to device d."""
        p, sent, res = self.prog.p, self.sent, self.resident[d]
        n = 0.0
        new: set[int] = set()
        got: set[int] = set()
        for i in range(a, b):
            n += self.out[i]
            for j, nb in self.prog.ins[i]:
                if j >= a or p[j] == d or j in got:
                    continue
                sj = sent[j]
                if sj is None or d not in sj:
                    n += nb
                    got.add(j)
            for k in self.params[i]:
                if k not in res and k not in new:
                    new.add(k)
                    n += self.param_sizes[k]
        return n

    def fits(self, d: int, nbytes: float) -> bool:
        return self.used[d] + nbytes <= self.cap[d]

    def most_free(self) -> int:
        return max(range(len(self.cap)), key=lambda d: (self.cap[d] - self.used[d], -d))

    def commit(self, i: int, d: int) -> None:
        """Charge op i on device d (call before ``_Program.commit`` of the same op)."""
        p, used = self.prog.p, self.used
        used[d] += self.out[i]
        for j, nb in self.prog.ins[i]:
            if p[j] != d:
                sj = self.sent[j]
                if sj is None:
                    sj = self.sent[j] = {}
                if d not in sj:
                    sj[d] = nb
                    used[d] += nb
        res = self.resident[d]
        for k in self.params[i]:
            if k not in res:
                res.add(k)
                used[d] += self.param_sizes[k]
        if self.liveness:
            for j, _ in self.prog.ins[i]:
                self.remaining[j] -= 1
                if self.remaining[j] == 0:
                    self._free(j, p[j])
            if self.remaining[i] == 0:
                self._free(i, d)

    def _free(self, j: int, dev: int) -> None:
        if self.is_output[j]:
            return
        self.used[dev] -= self.out[j]
        for to, nb in (self.sent[j] or {}).items():
            self.used[to] -= nb
        self.sent[j] = None


# --------------------------------------------------------------------------- one run
def _blocks(work: np.ndarray, k: int) -> list[tuple[int, int]]:
    """Ops 0..M-1 cut into at most k runs of about equal ``work`` (0: one op per run)."""
    m = len(work)
    if k <= 0 or k >= m:
        return [(i, i + 1) for i in range(m)]
    # A tiny floor so that runs of zero-work ops are still split by count.
    c = np.cumsum(work + 1e-9 * (float(work.max()) + 1e-9))
    cuts = np.searchsorted(c, c[-1] * np.arange(1, k) / k, side="right")
    cuts = sorted({0, m, *(int(x) for x in cuts)})
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=False) if b > a]


class _Run:
    """One pass of a device rule over units in graph order: the placement it builds, the
    simulated step time, the ops that fit nowhere."""

    def __init__(self, graph, inp, prog: _Program, *, liveness: bool):
        prog.reset()
        self.prog = prog
        self.mem = _Memory(graph, inp, prog, liveness=liveness)
        self.unplaceable: list[int] = []
        self.constrained = False  # some unit could not go to every device for memory
        self.next_unit: dict[int, tuple[int, int]] = {}  # lookahead: unit start -> next unit
        self.plain: dict[int, float] = {}  # the last ``ends`` call's ends without lookahead

    def _end(self, a: int, b: int, d: int) -> float:
        prog = self.prog
        if b == a + 1:
            return prog.end_on(a, d)
        prog.mark()
        for i in range(a, b):
            prog.commit(i, d)
        end = prog.open_end()
        prog.undo()
        return end

    def ends(self, a: int, b: int, devices) -> dict[int, float]:
        """Per device: the end of the segment that ops a..b-1 (the next ops) would end in,
        all placed there. With lookahead (a unit followed by the next one in the run), the
        later of that end and the earliest end of the next unit on any device after it:
        a unit that ends a little later but leaves its device free for what follows can
        win (pipelines of cell steps across devices)."""
        nxt = self.next_unit.get(a)
        if nxt is None or nxt[0] != b:
            self.plain = out = {d: self._end(a, b, d) for d in devices}
            return out
        prog = self.prog
        out, self.plain = {}, {}
        for d in devices:
            prog.mark()
            for i in range(a, b):
                prog.commit(i, d)
            end = self.plain[d] = prog.open_end()
            after = min(self._end(nxt[0], nxt[1], e) for e in range(prog.d))
            prog.undo()
            out[d] = max(end, after)
        return out

    def place(self, a: int, b: int, d: int) -> None:
        for i in range(a, b):
            self.mem.commit(i, d)
            self.prog.commit(i, d)

    def run(self, units, choose, *, lookahead: bool = False) -> None:
        """``choose(a, b, eligible) -> device`` for each unit that fits somewhere; units
        that fit nowhere as a whole go op by op (an op that fits nowhere: the device with
        the most free memory). ``lookahead``: ``ends`` looks one unit ahead."""
        if lookahead:
            self.next_unit = {a: nxt for (a, _), nxt in zip(units, units[1:], strict=False)}
        mem = self.mem
        alldev = range(self.prog.d)
        for a, b in units:
            eligible = [d for d in alldev if mem.fits(d, mem.need(a, b, d))]
            if len(eligible) < len(alldev):
                self.constrained = True
            if eligible:
                self.place(a, b, choose(a, b, eligible))
                continue
            for i in range(a, b):
                eligible = [d for d in alldev if mem.fits(d, mem.need(i, i + 1, d))]
                if eligible:
                    d = choose(i, i + 1, eligible)
                else:
                    self.unplaceable.append(i)
                    d = mem.most_free()
                self.place(i, i + 1, d)


def _earliest(run: _Run, a: int, b: int, eligible) -> tuple[int, dict[int, float]]:
    """The eligible device where the unit ends first (ties: the open segment's device,
    then the lower index), and every eligible device's end."""
    ends = run.ends(a, b, eligible)
    cur, plain = run.prog.cur, run.plain
    return min(eligible, key=lambda d: (ends[d], plain[d], d != cur, d)), ends


# --------------------------------------------------------------------------- runs and result
def _memory_option(ctx: PlacerContext) -> str:
    memory = ctx.options.get("memory", "auto")
    if memory not in MEMORY_MODELS:
        raise SimplaceError(f"memory={memory!r} is not a memory model; use one of "
                            f"{', '.join(MEMORY_MODELS)}.")
    return memory


def _unit_counts(ctx: PlacerContext, m: int) -> list[int]:
    units = ctx.options.get("units")
    if units is None:
        return [0] + [k for k in BLOCK_COUNTS if k < m]
    try:
        counts = sorted({int(k) for k in units})
    except (TypeError, ValueError):
        raise SimplaceError(f"units={units!r}: give a list of block counts (0 for op "
                            "units), e.g. units=[0, 32].") from None
    if not counts or counts[0] < 0:
        raise SimplaceError(f"units={units!r}: give a non-empty list of block counts >= 0 "
                            "(0 for op units).")
    return counts


def _module_depths(ctx: PlacerContext) -> list[int]:
    depths = ctx.options.get("module_depths", MODULE_DEPTHS)
    try:
        depths = sorted({int(k) for k in depths})
    except (TypeError, ValueError):
        raise SimplaceError(f"module_depths={depths!r}: give a list of depths >= 1, "
                            "e.g. module_depths=[2, 3].") from None
    if depths and depths[0] < 1:
        raise SimplaceError(f"module_depths={depths!r}: depths start at 1 (the top "
                            "module); give [] for none.")
    return depths


def _module_runs(graph, depth: int) -> list[tuple[int, int]]:
    """Ops 0..M-1 cut where the module path, cut to ``depth`` parts, or the forward /
    backward flag changes: one unit per run of consecutive ops of one module."""
    keys = [(bw, parts[:depth]) for bw, parts in map(split_name_path,
                                                     graph.name_path.tolist())]
    cuts = [0] + [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]] + [len(keys)]
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b > a]


def _unit_label(k: int, m: int) -> str:
    return "ops" if k <= 0 or k >= m else f"{k} blocks"


class _Setup:
    """What every method shares: inputs, the program simulator, memory model."""

    def __init__(self, ctx: PlacerContext):
        self.ctx = ctx
        self.memory = _memory_option(ctx)
        self.inp = ctx.inputs
        self.graph = ctx.graph
        self.m, self.d = self.inp.num_ops, self.inp.num_devices
        self.prog = _Program(ctx.graph, self.inp)
        self.work = self.inp.op_time_s.min(axis=1) if self.m else np.zeros(0)
        # A time budget (``budget_s``, e.g. when ``local`` runs this as a start) stops new
        # runs once spent; without one the method is deterministic. A whole call took 1-10 s
        # on graphs of a few thousand ops, 20-60 s on nmt_2layer and nmt_4layer (13k, 22k
        # ops) on a 2-core VM at load 10
        # (bench/results/placers_2026-11-23_list-schedulers_vm-2core-loaded.txt).
        self.deadline = (time.perf_counter() + float(ctx.budget_s)
                         if ctx.budget_s is not None else None)
        self.skipped = 0

    def late(self) -> bool:
        """True once the time budget is spent (never without one)."""
        return self.deadline is not None and time.perf_counter() > self.deadline

    def run(self, units, choose, *, lookahead: bool = False,
            memory: str = "conservative") -> dict:
        """One run of ``choose(run, a, b, eligible) -> device`` over ``units``: its
        placement, simulated step time, unplaceable ops, and how it was made."""
        r = _Run(self.graph, self.inp, self.prog, liveness=memory == "liveness")
        r.run(units, lambda a, b, eligible: choose(r, a, b, eligible), lookahead=lookahead)
        return {"placement": np.asarray(self.prog.p, dtype=np.int32),
                "estimated_s": self.prog.step_time(), "unplaceable": r.unplaceable,
                "lookahead": lookahead, "memory": memory, "constrained": r.constrained}

    def memory_runs(self, runs_under) -> list[dict]:
        """``runs_under(memory model)`` under the model asked for; with ``"auto"``,
        under the conservative model, then under liveness as well if memory kept some
        unit off a device."""
        if self.memory != "auto":
            return runs_under(self.memory)
        runs = runs_under("conservative")
        if any(r["constrained"] for r in runs):
            if self.late():
                self.skipped += 1
            else:
                runs += runs_under("liveness")
        return runs

    def unit_runs(self, choose) -> list[dict]:
        """One run per unit family (ops, blocks, module runs; identical unit lists run
        once), each family but op units once more with lookahead (option ``lookahead``),
        then re-runs over the segments of the best placement so far while that helps (at
        most ``repasses`` times); per memory model (``memory_runs``)."""
        ctx, m = self.ctx, self.m
        families = [(_unit_label(k, m), _blocks(self.work, k))
                    for k in _unit_counts(ctx, m)]
        for depth in _module_depths(ctx):
            families.append((f"module depth {depth}", _module_runs(self.graph, depth)))
        looks = (False, True) if ctx.options.get("lookahead", True) else (False,)
        repasses = int(ctx.options.get("repasses", REPASSES))

        def runs_under(memory: str) -> list[dict]:
            runs, seen = [], set()
            for label, units in families:
                key = tuple(a for a, _ in units)
                if key in seen:
                    continue
                seen.add(key)
                for look in looks if len(units) < m else (False,):
                    if runs and self.late():
                        self.skipped += 1
                        continue
                    r = self.run(units, choose, lookahead=look, memory=memory)
                    r["unit"] = label + (" + lookahead" if look else "")
                    runs.append(r)
            for _ in range(repasses):
                if self.late():
                    break
                best = min(runs, key=lambda r: r["estimated_s"])
                units = segments_of(best["placement"])
                key = tuple(a for a, _ in units)
                if key in seen:
                    break
                seen.add(key)
                r = self.run(units, choose, lookahead=best["lookahead"], memory=memory)
                r["unit"] = f"segments of {best['unit']}"
                runs.append(r)
                if r["estimated_s"] >= best["estimated_s"]:
                    break
            return runs

        return self.memory_runs(runs_under)

    def finish(self, runs: list[dict], info: dict | None = None) -> PlacerOutput:
        """The best run that fits, checked by the reference simulator, against
        ``single``'s candidates (module docstring)."""
        from simplace.placers.single import single_device_candidates, single_device_step_s

        ctx, m = self.ctx, self.m
        for r in runs:  # (the empty graph's placeholder run)
            r.setdefault("memory", "liveness" if self.memory == "liveness" else "conservative")
            r.setdefault("unit", None)
        order = sorted(range(len(runs)), key=lambda k: (runs[k]["estimated_s"], k))
        best, res, checked = runs[order[0]], None, []
        if m:
            # The memory models only estimate the program's peak: the reference simulator
            # decides. Runs in order of simulated step time until one fits (a few at most;
            # the conservative model's best is always among them).
            cons = [k for k in order if runs[k]["memory"] == "conservative"][:1]
            tries = list(dict.fromkeys(order[:_MAX_CHECKS] + cons))
            tries.sort(key=lambda k: (runs[k]["estimated_s"], k))
            scored = []
            for k in tries:
                r_ = ctx.simulate(runs[k]["placement"])
                checked.append({"unit": runs[k]["unit"], "memory": runs[k]["memory"],
                                "step_time_s": float(r_.step_time_s), "oom": bool(r_.oom)})
                scored.append((float(penalised(r_.step_time_s, r_.oom)), k, r_))
                if not r_.oom:
                    break
            _, k, res = min(scored, key=lambda x: (x[0], x[1]))
            best = runs[k]
        out = {"memory": self.memory, "memory_model": best["memory"],
               "unit": best.get("unit"), "estimated_makespan_s": float(best["estimated_s"]),
               "unplaceable_ops": len(best["unplaceable"]),
               "runs": [{"unit": r.get("unit"), "memory": r["memory"],
                         "estimated_step_s": float(r["estimated_s"])} for r in runs],
               "checked": checked}
        out.update(info or {})
        out.update(best.get("info", {}))
        if self.skipped:
            out["runs_skipped"] = self.skipped
            out["note_budget"] = (f"the time budget ({ctx.budget_s:g} s) was spent: "
                                  f"{self.skipped} runs were not started")
        if best["unplaceable"]:
            i = best["unplaceable"][0]
            more = len(best["unplaceable"]) - 1
            out["note"] = (
                f"no device can hold op {i} ({self.graph.out_bytes[i]:.0f} output bytes "
                f"plus its parameters and inputs, under the {best['memory']} memory model)"
                + (f" nor {more} more ops" if more else "")
                + "; placed on the device with the most free memory")
        placement = best["placement"]
        if m == 0:
            out["returned"] = "schedule"
            return PlacerOutput(placement, info=out)
        score = float(penalised(res.step_time_s, res.oom))
        out["returned"] = "schedule"
        out["schedule_step_time_s"] = float(res.step_time_s)
        if not ctx.options.get("fallback_single", True):
            return PlacerOutput(placement, info=out)
        alone = single_device_step_s(ctx)
        for d in single_device_candidates(ctx):
            if alone[d] >= score:  # no single device left that could beat the schedule
                break
            one = np.full(m, d, dtype=np.int32)
            r1 = ctx.simulate(one)
            if r1.oom:
                continue  # single skips it as well
            if r1.step_time_s < score:
                out.update(returned="single", single_device=int(d),
                           single_step_time_s=float(r1.step_time_s),
                           note_single=(
                               f"the schedule ({res.step_time_s * 1e3:.3f} ms"
                               f"{', out of memory' if res.oom else ''}) is slower than the "
                               f"whole graph on device {d} ({r1.step_time_s * 1e3:.3f} ms): "
                               "returned that"))
                out.pop("note", None)
                out["unplaceable_ops"] = 0
                return PlacerOutput(one, info=out)
            break  # the first device that fits is single's choice
        return PlacerOutput(placement, info=out)


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
    pb = _Problem(ctx)
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


@register("heft", options={
    **_COMMON_OPTIONS,
    "fifo_links": "HEFT's own schedule models links as FIFOs (default False: contention-free)"})
def heft(ctx: PlacerContext) -> PlacerOutput:
    """HEFT's device choices, scheduled in the program's order.

    Each unit (op or block, in graph order) goes to the device HEFT's own schedule gives
    most of its work (``heft_proposal``) or stays on the open segment's device, whichever
    ends it first under the program's semantics (module docstring). Option
    ``fifo_links``: HEFT's own schedule models links as FIFOs (default: contention-free,
    the classic model)."""
    s = _Setup(ctx)
    if s.m == 0:
        return s.finish([{"placement": np.zeros(0, np.int32), "estimated_s": 0.0,
                          "unplaceable": []}])
    fifo = bool(ctx.options.get("fifo_links", False))
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
            return _earliest(run, a, b, eligible)[0]
        ends = run.ends(a, b, cands)
        return min(cands, key=lambda d: (ends[d], d != want))  # ties: HEFT's choice

    runs = s.unit_runs(choose)
    for r in runs:
        r["info"] = {"heft_estimated_makespan_s":
                     float(proposals[r["memory"] == "liveness"][1])}
    return s.finish(runs)


# --------------------------------------------------------------------------- m-TOPO
@register("m_topo", options={"memory": _COMMON_OPTIONS["memory"],
                             "fallback_single": _COMMON_OPTIONS["fallback_single"]})
def m_topo(ctx: PlacerContext) -> PlacerOutput:
    """Baechi's m-TOPO: fill devices in turn, in graph order, under memory caps.

    Over the fastest k devices for every k, the best simulated.

    Devices are ranked fastest first (smallest total op time ``T_d = sum_i t[i, d]``,
    ties by index). For k = 1..D the first k take part: device ``d``'s share is
    ``cap_d = T* / n_g`` of its own time, with ``T* = 1 / sum_g (1 / T_g)`` the makespan
    of a perfect split over the exclusive groups among them (``T_g``: the group's
    fastest member, ``n_g``: its members taking part); on identical devices this is
    ``sum_i t_i / k``. Ops go in graph order to the current device until its load
    ``sum t[i, d]`` reaches ``cap_d``; then the next device takes over (the last one
    takes the rest). An op that does not fit the current device's memory moves the fill
    on to the next device that holds it (then any earlier one that does, then any device
    that does, else the device with the most free memory). ``info["devices_used"]``: the
    k that won, ``info["device_order"]`` its devices.
    """
    s = _Setup(ctx)
    if s.m == 0:
        return s.finish([{"placement": np.zeros(0, np.int32), "estimated_s": 0.0,
                          "unplaceable": []}], {"device_order": [], "share_s": []})
    total = s.inp.op_time_s.sum(axis=0)
    ranked = [int(d) for d in np.argsort(total, kind="stable")]
    group = s.prog.group
    t = s.prog.t

    def runs_under(memory: str) -> list[dict]:
        runs = []
        for k in range(1, s.d + 1):
            if runs and s.late():
                s.skipped += 1
                continue
            order = ranked[:k]
            g_total: dict[int, float] = {}
            g_size: dict[int, int] = {}
            for d in order:
                g_total[group[d]] = min(g_total.get(group[d], math.inf), float(total[d]))
                g_size[group[d]] = g_size.get(group[d], 0) + 1
            t_star = (1.0 / sum(1.0 / v for v in g_total.values())
                      if all(v > 0 for v in g_total.values()) else 0.0)
            cap = {d: t_star / g_size[group[d]] for d in order}
            load = dict.fromkeys(order, 0.0)
            state = {"cur": 0}

            def choose(run, a, b, eligible, order=order, cap=cap, load=load, state=state):
                cur = state["cur"]
                while cur < len(order) - 1 and load[order[cur]] >= cap[order[cur]] and (
                        load[order[cur]] > 0 or cap[order[cur]] > 0):
                    cur += 1
                state["cur"] = cur
                d = order[cur]
                if d not in eligible:
                    ahead = [x for x in range(cur + 1, len(order)) if order[x] in eligible]
                    if ahead:
                        state["cur"] = cur = ahead[0]
                        d = order[cur]
                    else:
                        behind = [order[x] for x in range(cur) if order[x] in eligible]
                        d = behind[0] if behind else min(eligible, key=ranked.index)
                if d in load:
                    load[d] += sum(t[i][d] for i in range(a, b))
                return d

            r = s.run(_blocks(s.work, 0), choose, memory=memory)
            r.update(unit=f"{k} devices", info={
                "devices_used": k, "device_order": order,
                "share_s": [float(cap[d]) for d in order]})
            runs.append(r)
        return runs

    return s.finish(s.memory_runs(runs_under))


# --------------------------------------------------------------------------- ETF family
@register("m_etf", options=_COMMON_OPTIONS)
def m_etf(ctx: PlacerContext) -> PlacerOutput:
    """Baechi's m-ETF in the program's order: each unit to the device where it ends first.

    Each unit (op or block, in graph order) goes to the device that can hold it where its
    segment ends first, under the program's semantics (ties: the open segment's device,
    then the lower index); the best of the unit runs, never worse than ``single``
    (module docstring)."""
    s = _Setup(ctx)
    if s.m == 0:
        return s.finish([{"placement": np.zeros(0, np.int32), "estimated_s": 0.0,
                          "unplaceable": []}])
    return s.finish(s.unit_runs(lambda run, a, b, eligible: _earliest(run, a, b,
                                                                      eligible)[0]))


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


@register("m_sct", options={
    **_COMMON_OPTIONS,
    "lp_max_edges": "connected op pairs above which the favourite-child LP gives way to the "
                    "greedy favourite (default 20,000)"})
def m_sct(ctx: PlacerContext) -> PlacerOutput:
    """Baechi's m-SCT in the program's order: ``m_etf`` plus favourite children.

    Favourite children come from ``favourite_children_lp`` (the LP and its rounding are
    documented there); for graphs with more than ``lp_max_edges`` connected op pairs
    (default 20,000) the LP is skipped and ``favourite_children_greedy`` picks favourites
    by the largest tensor (``info["favourite_children"]`` says which). A unit whose ops
    have favourite parents placed before it (outside the unit) leans to their device
    ``d_q`` (the one holding the most favourite bytes): it goes there when ``d_q`` can
    hold it and its end there is no later than its earliest end (on ``d*``) plus the time
    those favourite tensors would take over the link ``d_q -> d*``; else to ``d*``.
    """
    s = _Setup(ctx)
    if s.m == 0:
        return s.finish([{"placement": np.zeros(0, np.int32), "estimated_s": 0.0,
                          "unplaceable": []}], {"favourite_children": "none"})
    pb = _Problem(ctx)
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
    fav_bytes = [0.0] * pb.m
    for j, q in enumerate(fav):
        if q >= 0:
            fav_bytes[j] = next(b for p, b in pb.preds[j] if p == q)

    def choose(run, a, b, eligible):
        best, ends = _earliest(run, a, b, eligible)
        p = run.prog.p
        lean: dict[int, float] = {}
        for j in range(a, b):
            q = fav[j]
            if 0 <= q < a:
                lean[p[q]] = lean.get(p[q], 0.0) + fav_bytes[j]
        if lean:
            dq = max(sorted(lean), key=lambda d: lean[d])
            if dq != best and dq in ends and ends[dq] <= ends[best] + pb.comm(lean[dq], dq,
                                                                                best):
                return dq
        return best

    info = dict(finfo)
    info["favourite_parent"] = fav
    return s.finish(s.unit_runs(choose), info)

"""The incremental simulator: the reference simulator's rules applied op by op, in graph
order, to a placement being built, with trials that roll back.

``IncrementalProgram(graph, inputs)`` holds a partial placement (ops ``0..i-1`` placed)
and its schedule so far: closed segments' ends, copies' arrivals, group, link and host
times, and the open segment. ``end_on(i, d)`` is the end of the segment op ``i`` would
end in on device ``d``, without changing anything; ``commit(i, d)`` places it;
``mark()``/``undo()`` bracket trials (they nest), and ``unit_end(a, b, d)`` is a trial of
ops ``a..b-1`` on ``d`` without them; ``step_time()`` is the step time once
every op is placed. The list schedulers (``simplace.placers.list_schedulers``) build
their placements with it: placing a unit is exact under the program's semantics, where
simulating each candidate from scratch would cost O(M) per try.

The rules are ``simplace.sim.reference``'s: segment start = the latest of its device
group's free time, its inputs' arrivals and its dispatch; launch, pool launch, fused and
unfused op costs; host time of each put and dispatch, and the host's wait for a copy
between PjRt clients (``put_waits``); FIFO links whose latencies overlap; one put per
producer and device. One thing a placement being built cannot know: which outputs of a
producer later readers on a device will read. A put carries the outputs its first
reader reads (the reference's put carries every output any reader there reads), so
step times agree where each producer has one output, or each reader reads all its
producer's outputs. ``replay(placement)`` simulates a whole placement, knows every
reader, and sends what the reference sends: its step time is the reference's. Sums are
taken in the reference's order (a segment's ``launch + pool launch``, then its op costs
one by one), so times are equal bit for bit, not only to rounding.
"""

from __future__ import annotations

from simplace.sim.inputs import put_waits_of


class IncrementalProgram:
    """The program's schedule, built op by op in graph order (``reference._simulate``'s
    rules, incrementally), with a journal to try a unit on a device and roll it back.

    State: ``p`` (device per placed op, -1 not yet), ``seg``/``seg_end`` (closed
    segments' ends), ``arr[j]`` (device -> arrival of op j's put), group and link free
    times, ``host`` (host time, the open segment's puts included, its dispatch not), and
    the open segment: device ``cur``, first op ``first``, ``ready`` (group free at its
    opening and its inputs' arrivals), ``work`` (launch plus op costs), ``work_pool``
    (launch and pool launch, plus op costs) and ``pw`` (its ops' pool work so far: the
    segment lasts ``work_pool`` once that reaches the minimum). Sums are taken in the
    reference's order, so that times equal its times bit for bit.
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
        # (What replay needs to size each put as the reference does.)
        self._tensor_bytes = tensor_bytes
        self._edges = (src, graph.dst.tolist(), eout)
        self._put_bytes: dict[tuple[int, int], float] | None = None
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
        """Forget every placed op: the empty placement, no trial open."""
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
        self.ready = self.work = self.work_pool = self.pw = 0.0
        self.journal: list | None = None  # the innermost trial's changes (None: no trial)
        self._saved: list[tuple] = []

    def open_end(self) -> float:
        """End of the open segment if it were closed now (0 when there is none)."""
        c = self.cur
        if c < 0:
            return 0.0
        work = self.work_pool if self.pw >= self.pool_min[c] else self.work
        return max(self.ready, self.host + self.disp[c]) + work

    def end_on(self, i: int, d: int) -> float:
        """End of op i's segment if op i (the next op) went to device d; no change."""
        return self.unit_end(i, i + 1, d)

    def unit_end(self, a: int, b: int, d: int) -> float:
        """End of the segment ops ``a..b-1`` (the next ops) would end in, all on device
        d; no change. What ``mark``, ``commit`` of each, ``open_end`` and ``undo`` give,
        bit for bit, without the journal: the list schedulers try every unit on every
        device, and the journal's bookkeeping was most of those trials' time."""
        c, p, arr = self.cur, self.p, self.arr
        h = self.host
        ce = -1.0
        if d == c:
            first, ready = self.first, self.ready
            work, work_pool, pw = self.work, self.work_pool, self.pw
        else:
            g = self.group[d]
            if c >= 0:  # the open segment closes: its dispatch, then its end is known
                ce = self.open_end()
                h += self.disp[c]
                ready = ce if self.group[c] == g else self.gfree[g]
            else:
                ready = self.gfree[g]
            first = a
            work, pw = self.launch[d], 0.0
            work_pool = self.launch[d] + self.pool_launch[d]
        # Made at the unit's first put (most trials make none): producer -> arrival of
        # the puts made for this unit, and source -> free time of the links they used.
        sent: dict[int, float] | None = None
        links: dict[int, float] | None = None
        t, unf, pool_work = self.t, self.unf, self.pool_work
        for i in range(a, b):
            fused = False
            for j, nb in self.ins[i]:
                if j >= first:
                    fused = True
                    continue
                src = p[j]
                if src == d:
                    continue
                r = sent.get(j) if sent is not None else None
                if r is None:
                    aj = arr[j]
                    r = aj.get(d) if aj is not None else None
                if r is None:
                    if sent is None:
                        sent, links = {}, {}
                    h += self.put[src][d]
                    se = ce if j >= self.first and c >= 0 and d != c else self.seg_end[self.seg[j]]
                    busy = nb / self.bw[src][d]
                    t0 = max(h, se, links.get(src, self.lfree[src][d]))
                    links[src] = t0 + busy
                    r = sent[j] = t0 + self.lat[src][d] + busy
                    if self.waits[src][d] and r > h:  # put_waits: the host waits
                        h = r
                if r > ready:
                    ready = r
            cost = t[i][d] + (0.0 if fused else unf[i][d])
            work += cost
            work_pool += cost
            pw += pool_work[i][d]
        return max(ready, h + self.disp[d]) + (work_pool if pw >= self.pool_min[d] else work)

    def mark(self) -> None:
        """Start a trial: ``undo`` brings the state back to this point (trials nest)."""
        self._saved.append((self.journal, self.host, self.cur, self.first, self.ready,
                            self.work, self.work_pool, self.pw, self.max_arrival,
                            len(self.seg_end), list(self.gfree)))
        self.journal = []

    def undo(self) -> None:
        """End the innermost trial: the state ``mark`` saved, every change since undone."""
        for kind, a, b, v in reversed(self.journal):
            if kind == 0:
                self.p[a] = -1
            elif kind == 1:
                del self.arr[a][b]
            else:
                self.lfree[a][b] = v
        (self.journal, self.host, self.cur, self.first, self.ready, self.work,
         self.work_pool, self.pw, self.max_arrival, n_seg, self.gfree) = self._saved.pop()
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
            self.work_pool = self.launch[d] + self.pool_launch[d]
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
                if self._put_bytes is not None:  # replay: every reader on d is known
                    nb = self._put_bytes[j, d]
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
        cost = self.t[i][d] + (0.0 if fused else self.unf[i][d])
        self.work += cost
        self.work_pool += cost
        self.pw += self.pool_work[i][d]
        p[i] = d
        self.seg[i] = len(self.seg_end)
        if jr is not None:
            jr.append((0, i, None, None))

    def step_time(self) -> float:
        """The step time once every op is placed: the reference simulator's where each
        put carried what the reference's carries (see the module docstring)."""
        c = self.cur
        if c < 0:
            return 0.0
        return max(self.host + self.disp[c], self.open_end(), self.max_arrival,
                   max(self.seg_end, default=0.0))

    def replay(self, placement) -> float:
        """Simulate a whole placement (int[M]) from scratch; its step time, the reference
        simulator's bit for bit (each put carries every output of its producer read on
        its device, as there)."""
        p = [int(d) for d in placement]
        outs_on: dict[tuple[int, int], set[int]] = {}
        for s_, c, k in zip(*self._edges, strict=True):
            outs_on.setdefault((s_, p[c]), set()).add(k)
        tb = self._tensor_bytes
        self._put_bytes = {(j, d): float(sum(tb[j, k] for k in sorted(ks)))
                           for (j, d), ks in outs_on.items()}
        try:
            self.reset()
            for i, d in enumerate(p):
                self.commit(i, d)
            return self.step_time()
        finally:
            self._put_bytes = None

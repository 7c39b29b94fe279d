"""The reference simulator: plain Python, event by event, written to be read.

It is the oracle the batched simulator and every placer are checked against. It
predicts what ``simplace.apply`` does on JAX (the design notes, "Simulation
semantics"), not an op-by-op executor:

1. **Segments.** Ops, in graph order, fall into segments: maximal runs of consecutive
   ops on one device. Each segment is one jitted XLA computation: it starts once, when
   every input it reads from outside itself is on its device, and all its outputs
   appear together at its end. It lasts ``launch_s[d]``, plus ``pool_launch_s[d]`` if
   its ops' ``op_pool_work[i, d]`` add up (in op order) to ``pool_min_work[d]`` or more
   (XLA:CPU hands such a computation to a worker thread, which wakes up for it, and
   runs a smaller one inline), plus the sum of its ops' fused costs
   ``op_time_s[i, d]``, plus ``op_unfused_s[i, d]`` for each op none of whose inputs
   comes from the segment itself (it cannot fuse into an in-segment producer).
   Segments of one exclusive group run one at a time, in graph order; a segment's
   inputs from earlier segments of its own device are ready by then (the device ran
   them first).
2. **One host thread** dispatches everything in graph order; each call costs host
   time and is asynchronous. For each segment, in order: first the transfers its ops
   need (below), then the segment call itself (``dispatch_s[d]``); a segment cannot
   start before its call was made.
3. **Transfers.** Op j's outputs are moved to a device d != p[j] once, by one
   ``jax.device_put`` of all its distinct outputs consumed on d, issued just before the
   first segment on d that reads one of them; within a segment, in the order its ops
   and their in-edges come (``graph.in_edges``). The call costs host time
   ``put_s[p[j], d]``; the copy starts when the call was made, j's segment has ended and
   the link (ordered device pair) is free, and arrives ``latency_s + bytes /
   bandwidth_bytes_per_s`` later. Each link carries copies one after another in issue
   order, busy for ``bytes / bandwidth_bytes_per_s`` each: the latency of consecutive
   copies overlaps (a copy engine or memcpy thread is pipelined). On a link with
   ``put_waits`` (between PjRt clients: the CPU and a GPU) the call returns only once
   the copy has arrived: the host waits for it before its next call.
4. Step time: the last segment end, copy arrival or host call (0 for an empty graph).
5. Memory per device, peak over time: the parameters any op on the device reads (each
   once) for the whole step, plus live intervals, half-open ``[alloc, free)``: the
   activation of op i (``out_bytes``) from its segment's start until the latest of its
   segment's end, the ends of the segments on its device that read it, and the arrivals
   of its copies (the step end for graph outputs); each received copy from its arrival
   until the end of the last segment on that device that reads it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from simplace.sim.inputs import SimInputs, check_placement, put_waits_of, sim_inputs


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """The full simulated schedule of one placement (for Gantt charts and debugging).

    Per segment (``[S]``, in graph order): ``segment_first``/``segment_stop`` (its ops
    are ``first..stop-1``), ``segment_device``, ``segment_dispatch_s`` (when the host
    call was made), ``segment_start_s``, ``segment_end_s``.
    Per op (``[M]``): ``op_device``, and ``op_start_s``/``op_end_s``: where the op sits
    inside its segment if its ops ran back to back after the launch (a drawing aid: XLA
    fuses them; only the segment's start and end are events).
    Per transfer (``[T]``, in issue order): ``transfer_op`` (the producer),
    ``transfer_from``, ``transfer_to`` (devices), ``transfer_bytes``, ``transfer_issue_s``
    (host call made), ``transfer_start_s`` (the link starts carrying it) and
    ``transfer_end_s`` (arrival), ``transfer_segment`` (the segment whose call the put
    was issued for: the host makes a segment's puts, then its call).
    """

    segment_first: np.ndarray
    segment_stop: np.ndarray
    segment_device: np.ndarray
    segment_dispatch_s: np.ndarray
    segment_start_s: np.ndarray
    segment_end_s: np.ndarray
    op_start_s: np.ndarray
    op_end_s: np.ndarray
    op_device: np.ndarray
    transfer_op: np.ndarray
    transfer_from: np.ndarray
    transfer_to: np.ndarray
    transfer_bytes: np.ndarray
    transfer_issue_s: np.ndarray
    transfer_start_s: np.ndarray
    transfer_end_s: np.ndarray
    transfer_segment: np.ndarray

    @property
    def op_segment(self) -> np.ndarray:
        """int[M]: the segment index of each op."""
        return np.repeat(np.arange(len(self.segment_first)),
                         self.segment_stop - self.segment_first)


@dataclasses.dataclass(frozen=True, eq=False)
class SimResult:
    """What one simulated step of one placement costs.

    step_time_s: makespan, seconds.
    busy_s: float64[D], time each device spends running segments (launches included).
    peak_memory_bytes: float64[D], resident parameters plus the peak of live tensors.
    bytes_moved: total bytes of all transfers.
    oom: True if some device's peak exceeds its memory.
    oom_devices: the indices of those devices.
    num_segments, num_transfers: segments run and ``device_put`` calls made.
    host_s: when the host thread's last call returns: the host time spent on calls
      (segments and transfers), plus its waits for copies on ``put_waits`` links.
    schedule: the full ``Schedule`` when asked for (``schedule=True``), else None.
    """

    step_time_s: float
    busy_s: np.ndarray
    peak_memory_bytes: np.ndarray
    bytes_moved: float
    oom: bool
    oom_devices: tuple[int, ...]
    num_segments: int = 0
    num_transfers: int = 0
    host_s: float = 0.0
    schedule: Schedule | None = None


def simulate(graph, cost_model, placement, *, schedule: bool = False) -> SimResult:
    """Simulate one step of ``graph`` placed by ``placement`` on a machine.

    Args:
      graph: an ``OpGraph``.
      cost_model: a ``CostModel`` (or anything with its interface) or a ``SimInputs``.
      placement: int[M], the device index of each op.
      schedule: also return the full schedule (per-op and per-transfer times).

    Returns:
      A ``SimResult``; its ``step_time_s`` is the model's objective (the step time, the
      throughput's time between steps, or a ruler's verdict: ``simplace.sim.objective``).
      Raises ``PlacementError`` for a placement that does not fit the graph or the
      machine.
    """
    inp = sim_inputs(graph, cost_model)
    p = check_placement(placement, graph.num_ops, inp.num_devices)
    res = _simulate(graph, inp, p, schedule=schedule)
    if inp.objective == "latency":
        return res
    from simplace.sim.objective import objective_result

    return objective_result(graph, inp, p, res)


def segments_of(placement) -> list[tuple[int, int]]:
    """``[(first, stop), ...]``: the maximal runs of one device in ``placement``."""
    p = np.asarray(placement).reshape(-1)
    if p.size == 0:
        return []
    cuts = [0] + (np.flatnonzero(np.diff(p)) + 1).tolist() + [p.size]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def segment_pool_launch(inp: SimInputs, first: int, stop: int, device: int) -> float:
    """The pool launch a segment of ops ``first..stop-1`` on ``device`` pays: its
    ``pool_launch_s`` if their ``op_pool_work`` add up, in op order, to the device's
    ``pool_min_work``, else 0."""
    total = 0.0
    for w in inp.op_pool_work[first:stop, device].tolist():
        total += w
    return float(inp.pool_launch_s[device]) if total >= inp.pool_min_work[device] else 0.0


def _simulate(graph, inp: SimInputs, placement: np.ndarray, *, schedule: bool) -> SimResult:
    m, d_count = graph.num_ops, inp.num_devices
    p = placement.tolist()
    op_time = inp.op_time_s
    lat, bw = inp.latency_s.tolist(), inp.bandwidth_bytes_per_s.tolist()
    launch, dispatch = inp.launch_s.tolist(), inp.dispatch_s.tolist()
    put = inp.put_s.tolist()
    waits = put_waits_of(inp).tolist()
    group = inp.exclusive_group.tolist()
    src, dst = graph.src.tolist(), graph.dst.tolist()
    edge_bytes, edge_output = graph.edge_bytes.tolist(), graph.edge_output.tolist()
    in_ptr, in_order = (a.tolist() for a in graph.in_edges)

    # A tensor is (producer, output index); its size is the largest edge_bytes among the
    # edges carrying it (they should all be equal). sent_bytes[j][d]: bytes of op j's
    # distinct outputs consumed on device d (what one put to d carries).
    tensor_bytes: dict[tuple[int, int], float] = {}
    for s_, k, nb in zip(src, edge_output, edge_bytes, strict=True):
        tensor_bytes[s_, k] = max(tensor_bytes.get((s_, k), 0.0), nb)
    outs_on: list[dict[int, set[int]]] = [{} for _ in range(m)]
    for s_, c, k in zip(src, dst, edge_output, strict=True):
        outs_on[s_].setdefault(p[c], set()).add(k)

    segs = segments_of(placement)
    seg_of = [0] * m
    for s_, (a, b) in enumerate(segs):
        for i in range(a, b):
            seg_of[i] = s_
    seg_start = [0.0] * len(segs)
    seg_end = [0.0] * len(segs)
    seg_disp = [0.0] * len(segs)
    arrival: list[dict[int, float]] = [{} for _ in range(m)]  # op -> device -> arrival
    group_free = [0.0] * (max(group) + 1 if group else 1)
    link_free = [[0.0] * d_count for _ in range(d_count)]
    host = 0.0
    transfers = []  # (op, from, to, bytes, issue, start, end, segment), in issue order

    op_cost = [0.0] * m  # in-segment cost, unfused part included (for the schedule)
    for s_, (a, b) in enumerate(segs):
        dev = p[a]
        ready = group_free[group[dev]]
        work = launch[dev] + segment_pool_launch(inp, a, b, dev)
        for i in range(a, b):
            op_cost[i] = float(op_time[i, dev])
            fused = False
            for e in in_order[in_ptr[i]:in_ptr[i + 1]]:
                j = src[e]
                if j >= a:  # produced inside this segment: fused, no wait
                    fused = True
                    continue
                frm = p[j]
                if frm == dev:  # an earlier segment of this device: done before this one
                    continue
                if dev not in arrival[j]:
                    host += put[frm][dev]
                    nbytes = sum(tensor_bytes[j, k] for k in sorted(outs_on[j][dev]))
                    t0 = max(host, seg_end[seg_of[j]], link_free[frm][dev])
                    arrive = t0 + lat[frm][dev] + nbytes / bw[frm][dev]
                    # The link is busy for the bytes; latency overlaps the next copy.
                    link_free[frm][dev] = t0 + nbytes / bw[frm][dev]
                    arrival[j][dev] = arrive
                    transfers.append((j, frm, dev, nbytes, host, t0, arrive, s_))
                    if waits[frm][dev]:  # JAX fetches the value to the host first
                        host = max(host, arrive)
                # (A copy sent for an earlier segment on this device arrived before that
                # segment started, so this max changes nothing then; the batched
                # simulator relies on it and only follows first sends.)
                ready = max(ready, arrival[j][dev])
            if not fused:
                op_cost[i] += float(inp.op_unfused_s[i, dev])
            work += op_cost[i]
        host += dispatch[dev]
        seg_disp[s_] = host
        seg_start[s_] = max(ready, host)
        seg_end[s_] = seg_start[s_] + work
        group_free[group[dev]] = seg_end[s_]

    step_time = max([0.0, host] + seg_end + [t[6] for t in transfers])
    busy = np.zeros(d_count)
    for s_, (a, _) in enumerate(segs):
        busy[p[a]] += seg_end[s_] - seg_start[s_]
    peak = _peak_memory(graph, inp, p, seg_of, seg_start, seg_end, arrival, outs_on,
                        tensor_bytes, step_time)
    oom_devices = tuple(int(d) for d in np.flatnonzero(peak > inp.memory_bytes))

    sched = None
    if schedule:
        cols = list(zip(*transfers, strict=True)) if transfers else [()] * 8
        op_start = np.zeros(m)
        op_end = np.zeros(m)
        for s_, (a, b) in enumerate(segs):
            t = seg_start[s_] + launch[p[a]] + segment_pool_launch(inp, a, b, p[a])
            for i in range(a, b):
                op_start[i] = t
                t += op_cost[i]
                op_end[i] = t
        f64, i32 = np.float64, np.int32
        sched = Schedule(
            segment_first=np.asarray([a for a, _ in segs], dtype=i32),
            segment_stop=np.asarray([b for _, b in segs], dtype=i32),
            segment_device=np.asarray([p[a] for a, _ in segs], dtype=i32),
            segment_dispatch_s=np.asarray(seg_disp, dtype=f64),
            segment_start_s=np.asarray(seg_start, dtype=f64),
            segment_end_s=np.asarray(seg_end, dtype=f64),
            op_start_s=op_start, op_end_s=op_end, op_device=np.asarray(p, dtype=i32),
            transfer_op=np.asarray(cols[0], dtype=i32),
            transfer_from=np.asarray(cols[1], dtype=i32),
            transfer_to=np.asarray(cols[2], dtype=i32),
            transfer_bytes=np.asarray(cols[3], dtype=f64),
            transfer_issue_s=np.asarray(cols[4], dtype=f64),
            transfer_start_s=np.asarray(cols[5], dtype=f64),
            transfer_end_s=np.asarray(cols[6], dtype=f64),
            transfer_segment=np.asarray(cols[7], dtype=i32),
        )
    return SimResult(step_time_s=float(step_time), busy_s=busy, peak_memory_bytes=peak,
                     bytes_moved=float(sum(t[3] for t in transfers)), oom=bool(oom_devices),
                     oom_devices=oom_devices, num_segments=len(segs),
                     num_transfers=len(transfers), host_s=float(host), schedule=sched)


def _peak_memory(graph, inp, p, seg_of, seg_start, seg_end, arrival, outs_on, tensor_bytes,
                 step_time) -> np.ndarray:
    m, d_count = graph.num_ops, inp.num_devices
    src, dst = graph.src.tolist(), graph.dst.tolist()
    out_bytes, is_output = graph.out_bytes.tolist(), graph.is_output.tolist()

    # last_use[i][d]: the latest end of a segment on device d that reads op i.
    last_use: list[dict[int, float]] = [{} for _ in range(m)]
    for s_, c in zip(src, dst, strict=True):
        d, e = p[c], seg_end[seg_of[c]]
        last_use[s_][d] = max(last_use[s_].get(d, e), e)

    intervals: list[list[tuple[float, float, float]]] = [[] for _ in range(d_count)]
    for i in range(m):
        dev = p[i]
        own_end = seg_end[seg_of[i]]
        free = max([own_end, last_use[i].get(dev, own_end)] + list(arrival[i].values()))
        if is_output[i]:
            free = step_time
        intervals[dev].append((seg_start[seg_of[i]], free, out_bytes[i]))
        for to, arrive in arrival[i].items():
            nbytes = sum(tensor_bytes[i, k] for k in sorted(outs_on[i][to]))
            intervals[to].append((arrive, last_use[i][to], nbytes))
    # Parameters: resident for the whole step on every device running an op that reads
    # them, counted once per device.
    resident = [set() for _ in range(d_count)]
    for op, j in zip(graph.param_op.tolist(), graph.param_index.tolist(), strict=True):
        resident[p[op]].add(j)
    sizes = graph.param_sizes
    peak = np.array([float(sum(sizes[j] for j in sorted(r))) for r in resident])

    for d in range(d_count):
        # Sweep: at equal times frees (kind 0) come before allocations (kind 1), so an
        # interval ending at t and one starting at t never overlap; empty ones never count.
        events = []
        for a, f, size in intervals[d]:
            if f > a and size > 0:
                events.append((f, 0, -size))
                events.append((a, 1, size))
        events.sort(key=lambda ev: (ev[0], ev[1]))
        live = best = 0.0
        for _, _, delta in events:
            live += delta
            best = max(best, live)
        peak[d] += best
    return peak

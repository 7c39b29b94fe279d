"""The reference simulator: plain Python, event by event, written to be read.

It is the oracle the batched simulator and every placer are checked against, so it
follows the simulation semantics of the design notes ("Simulation semantics") literally:

1. Ops are processed in graph order (a topological order). Each exclusive group runs its
   ops one at a time in that order: an op starts when its group is free and all its
   inputs have arrived on its device; it ends ``op_time_s[i, device]`` later.
2. When an op ends it sends, to every other device holding at least one of its
   consumers, ONE transfer carrying all its distinct outputs consumed there. A transfer
   waits for its link (ordered device pair) to be free and takes
   ``latency_s + bytes / bandwidth_bytes_per_s``. Transfers of one op go in increasing
   destination order (different links, so the order does not matter).
   Why graph order is exact: every transfer on link (a, b) is sent by an op on device a,
   and the ops of a's exclusive group end in graph order; so issuing transfers in graph
   order is issuing them in time order, and each link is a FIFO in graph order. The same
   argument makes the batched simulator's single scan over ops exact.
3. Step time = the last op end or transfer arrival (0 for an empty graph).
4. Memory per device, peak over time: the parameters any op on the device reads (each
   once) for the whole step, plus live intervals, half-open ``[alloc, free)``:
   the activation of op i (``out_bytes``) on its device from its start until its last
   use there or its last transfer's arrival (the step end for graph outputs), and each
   received copy from its arrival until its last consumer on that device ends.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from simplace.sim.inputs import SimInputs, check_placement, sim_inputs


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """The full simulated schedule of one placement (for Gantt charts and debugging).

    Per op (``[M]``): ``op_start_s``, ``op_end_s``, ``op_device``.
    Per transfer (``[T]``, in issue order): ``transfer_op`` (the producer),
    ``transfer_from``, ``transfer_to`` (devices), ``transfer_bytes``, ``transfer_start_s``
    (when the link starts carrying it) and ``transfer_end_s`` (arrival).
    """

    op_start_s: np.ndarray
    op_end_s: np.ndarray
    op_device: np.ndarray
    transfer_op: np.ndarray
    transfer_from: np.ndarray
    transfer_to: np.ndarray
    transfer_bytes: np.ndarray
    transfer_start_s: np.ndarray
    transfer_end_s: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class SimResult:
    """What one simulated step of one placement costs.

    step_time_s: makespan, seconds.
    busy_s: float64[D], sum of the op times on each device.
    peak_memory_bytes: float64[D], resident parameters plus the peak of live tensors.
    bytes_moved: total bytes of all transfers.
    oom: True if some device's peak exceeds its memory.
    oom_devices: the indices of those devices.
    schedule: the full ``Schedule`` when asked for (``schedule=True``), else None.
    """

    step_time_s: float
    busy_s: np.ndarray
    peak_memory_bytes: np.ndarray
    bytes_moved: float
    oom: bool
    oom_devices: tuple[int, ...]
    schedule: Schedule | None = None


def simulate(graph, cost_model, placement, *, schedule: bool = False) -> SimResult:
    """Simulate one step of ``graph`` placed by ``placement`` on a machine.

    Args:
      graph: an ``OpGraph``.
      cost_model: a ``CostModel`` (or anything with its interface) or a ``SimInputs``.
      placement: int[M], the device index of each op.
      schedule: also return the full schedule (per-op and per-transfer times).

    Returns:
      A ``SimResult``. Raises ``PlacementError`` for a placement that does not fit the
      graph or the machine.
    """
    inp = sim_inputs(graph, cost_model)
    return _simulate(graph, inp, check_placement(placement, graph.num_ops, inp.num_devices),
                     schedule=schedule)


def _simulate(graph, inp: SimInputs, placement: np.ndarray, *, schedule: bool) -> SimResult:
    m, d_count = graph.num_ops, inp.num_devices
    p = placement.tolist()
    op_time = inp.op_time_s
    lat, bw = inp.latency_s.tolist(), inp.bandwidth_bytes_per_s.tolist()
    group = inp.exclusive_group.tolist()
    src, dst = graph.src.tolist(), graph.dst.tolist()
    edge_bytes, edge_output = graph.edge_bytes.tolist(), graph.edge_output.tolist()
    in_ptr, in_order = (a.tolist() for a in graph.in_edges)
    out_ptr, out_order = (a.tolist() for a in graph.out_edges)

    start = [0.0] * m
    end = [0.0] * m
    # arrival[i][d]: when op i's outputs are available on device d != p[i].
    arrival: list[dict[int, float]] = [{} for _ in range(m)]
    transfer_bytes: list[dict[int, float]] = [{} for _ in range(m)]
    group_free = [0.0] * (max(group) + 1)
    link_free = [[0.0] * d_count for _ in range(d_count)]
    transfers = []  # (op, from, to, bytes, start, end), in issue order
    # A tensor is (producer, output index); its size is the largest edge_bytes among the
    # edges carrying it (they should all be equal).
    tensor_bytes: dict[tuple[int, int], float] = {}
    for s, k, nb in zip(src, edge_output, edge_bytes, strict=True):
        tensor_bytes[s, k] = max(tensor_bytes.get((s, k), 0.0), nb)

    for i in range(m):
        dev = p[i]
        ready = group_free[group[dev]]
        for e in in_order[in_ptr[i]:in_ptr[i + 1]]:
            s = src[e]
            ready = max(ready, end[s] if p[s] == dev else arrival[s][dev])
        start[i] = ready
        end[i] = ready + float(op_time[i, dev])
        group_free[group[dev]] = end[i]

        # One transfer per destination device, carrying each distinct output once.
        outputs_by_dest: dict[int, set[int]] = {}
        for e in out_order[out_ptr[i]:out_ptr[i + 1]]:
            to = p[dst[e]]
            if to != dev:
                outputs_by_dest.setdefault(to, set()).add(edge_output[e])
        for to in sorted(outputs_by_dest):
            nbytes = sum(tensor_bytes[i, k] for k in sorted(outputs_by_dest[to]))
            t0 = max(end[i], link_free[dev][to])
            arrive = t0 + lat[dev][to] + nbytes / bw[dev][to]
            link_free[dev][to] = arrive
            arrival[i][to] = arrive
            transfer_bytes[i][to] = nbytes
            transfers.append((i, dev, to, nbytes, t0, arrive))

    step_time = max([0.0] + end + [t[5] for t in transfers])
    busy = np.zeros(d_count)
    for i in range(m):
        busy[p[i]] += op_time[i, p[i]]
    peak = _peak_memory(graph, inp, p, start, end, arrival, transfer_bytes, step_time)
    oom_devices = tuple(int(d) for d in np.flatnonzero(peak > inp.memory_bytes))

    sched = None
    if schedule:
        cols = list(zip(*transfers, strict=True)) if transfers else [()] * 6
        sched = Schedule(
            op_start_s=np.asarray(start, dtype=np.float64),
            op_end_s=np.asarray(end, dtype=np.float64),
            op_device=np.asarray(p, dtype=np.int32),
            transfer_op=np.asarray(cols[0], dtype=np.int32),
            transfer_from=np.asarray(cols[1], dtype=np.int32),
            transfer_to=np.asarray(cols[2], dtype=np.int32),
            transfer_bytes=np.asarray(cols[3], dtype=np.float64),
            transfer_start_s=np.asarray(cols[4], dtype=np.float64),
            transfer_end_s=np.asarray(cols[5], dtype=np.float64),
        )
    return SimResult(step_time_s=float(step_time), busy_s=busy, peak_memory_bytes=peak,
                     bytes_moved=float(sum(t[3] for t in transfers)), oom=bool(oom_devices),
                     oom_devices=oom_devices, schedule=sched)


def _peak_memory(graph, inp, p, start, end, arrival, transfer_bytes, step_time) -> np.ndarray:
    m, d_count = graph.num_ops, inp.num_devices
    src, dst = graph.src.tolist(), graph.dst.tolist()
    out_bytes, is_output = graph.out_bytes.tolist(), graph.is_output.tolist()

    # last_use[i][d]: the latest end of a consumer of op i on device d.
    last_use: list[dict[int, float]] = [{} for _ in range(m)]
    for s, c in zip(src, dst, strict=True):
        d = p[c]
        last_use[s][d] = max(last_use[s].get(d, end[c]), end[c])

    intervals: list[list[tuple[float, float, float]]] = [[] for _ in range(d_count)]
    for i in range(m):
        dev = p[i]
        free = max([end[i], last_use[i].get(dev, end[i])] + list(arrival[i].values()))
        if is_output[i]:
            free = step_time
        intervals[dev].append((start[i], free, out_bytes[i]))
        for to, arrive in arrival[i].items():
            intervals[to].append((arrive, last_use[i][to], transfer_bytes[i][to]))

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

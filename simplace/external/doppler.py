"""Doppler instances (Yao et al., ICLR 2026: ``xinyuyao/Doppler``, ``compute_graph/*.txt``).

The file, as Doppler's ``utils._read_compute_graph`` reads it::

    417                        total node count, the graph's input tensors included
    0, 1, 2, ...               ids of the input tensors: only their count is used
    16, 16, 17, ...            edge sources
    20, 24, 28, ...            edge destinations
    1000000,4000000[,type]     one line per node: compute cost, communication cost and,
    ...                        in the ``gdp_`` files, an op type

The graph has ``total - len(inputs)`` nodes, numbered from 0 in file order; costs are
integers in Doppler's units (``Simulator.get_cost`` reports ``env.now / 1e10``, so here
one second is ``FILE_UNITS_PER_S`` units).

How Doppler's ``env/cost.py`` (SimPy) scores a placement, which ``DopplerMakespan``
replays exactly: each device is a ``simpy.Resource`` of capacity 1 whose requests are
granted in the order they were made; an op requests its device once every input has
arrived, then computes for its compute cost; each edge is its own process that waits for
its producer and then for the producer's communication cost when the two ends are on
different devices (0 otherwise): one copy per edge, links never contend. The makespan is
the time of the last event. Requests made at one instant are ordered by SimPy's event
queue (time, then creation order), so ties follow from the order in which processes were
created: edges by producer, then by the first appearance of the consumer among the
producer's edges in the file; ops in file order.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np

from simplace._numba import njit
from simplace.external import ExternalFormatError, Instance
from simplace.external._machine import TRANSFER_BANDWIDTH_BYTES_PER_S, imported_machine
from simplace.sim.objective import Ruler
from simplace.sim.results import BatchResult

# Doppler's Simulator.get_cost returns env.now / 1e10: file units per second.
FILE_UNITS_PER_S = 1e10
# Times are exact int64 sums of file units (ties decide SimPy's order): the bound on them.
_MAX_UNITS = 2**62
_GPUS_BY_PREFIX = (("8gpu_", 8),)
_DEFAULT_GPUS = 4
_INT = re.compile(r"\s*(\d+)\s*$")




# ---------------------------------------------------------------------------- parsing
def _ints(text: str, path: str, lineno: int, what: str) -> list[int]:
    """The comma-separated non-negative integers of one line (a trailing comma allowed)."""
    body = text.strip()
    if body.endswith(","):
        body = body[:-1]
    if not body.strip():
        return []
    out = []
    for k, field in enumerate(body.split(",")):
        m = _INT.fullmatch(field)
        if m is None:
            raise ExternalFormatError(
                f"{path}, line {lineno}: entry {k} of the {what} is {field.strip()!r}, not a "
                "non-negative integer.")
        out.append(int(m.group(1)))
    return out


def _parse(path: str):
    """(node count, input ids, src, dst, compute int64[n], comm int64[n], op types or
    None) of a Doppler file; ``ExternalFormatError`` naming the line otherwise."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        raise ExternalFormatError(f"{path}: no such Doppler graph file.") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ExternalFormatError(f"{path}: cannot read it as text ({e}).") from None
    # Trailing blank lines are harmless; everything before them is positional.
    while len(lines) > 4 and not lines[-1].strip():
        lines.pop()
    if len(lines) < 4:
        raise ExternalFormatError(
            f"{path}: {len(lines)} lines, but a Doppler graph has at least 4 (node count, "
            "input ids, edge sources, edge destinations) and one line per node.")
    total = _ints(lines[0], path, 1, "node count")
    if len(total) != 1:
        raise ExternalFormatError(f"{path}, line 1: the node count must be one integer.")
    inputs = _ints(lines[1], path, 2, "input ids")
    src = _ints(lines[2], path, 3, "edge sources")
    dst = _ints(lines[3], path, 4, "edge destinations")
    n = total[0] - len(inputs)
    if n < 1:
        raise ExternalFormatError(
            f"{path}, line 1: {total[0]} nodes with {len(inputs)} inputs leaves {n} nodes "
            "to place; there must be at least one.")
    if len(src) != len(dst):
        raise ExternalFormatError(
            f"{path}, lines 3-4: {len(src)} edge sources but {len(dst)} edge destinations.")
    for lineno, ids in ((3, src), (4, dst)):
        bad = [v for v in ids if v >= n]
        if bad:
            raise ExternalFormatError(
                f"{path}, line {lineno}: edge endpoint {bad[0]} is out of range: the graph "
                f"has {n} nodes (0..{n - 1}).")
    body = lines[4:]
    if len(body) != n:
        raise ExternalFormatError(
            f"{path}: {len(body)} cost lines after line 4, but the header implies {n} nodes "
            f"({total[0]} - {len(inputs)} inputs): the file is truncated or its counts are "
            "wrong.")
    comp = np.empty(n, dtype=np.int64)
    comm = np.empty(n, dtype=np.int64)
    types: list[str] = []
    for i, text in enumerate(body):
        lineno = i + 5
        fields = [f.strip() for f in text.split(",")]
        if len(fields) == 3 and re.fullmatch(r"[A-Za-z_]+", fields[2]):
            types.append(fields[2])
            fields = fields[:2]
        if len(fields) != 2:
            raise ExternalFormatError(
                f"{path}, line {lineno} (node {i}): expected 'compute_cost,"
                f"communication_cost[,op_type]', got {text.strip()!r}.")
        for k, f in enumerate(fields):
            what = ("compute", "communication")[k]
            if f.startswith("-"):
                raise ExternalFormatError(
                    f"{path}, line {lineno} (node {i}): negative {what} cost {f}.")
            if not f.isdigit():
                raise ExternalFormatError(
                    f"{path}, line {lineno} (node {i}): the {what} cost {f!r} is not a "
                    "non-negative integer (Doppler reads integers only).")
        comp[i], comm[i] = int(fields[0]), int(fields[1])
    if types and len(types) != n:
        raise ExternalFormatError(
            f"{path}: {len(types)} of {n} node lines give an op type; give it on all or none.")
    # A makespan is at most every compute cost plus every edge's copy, in int64.
    bound = sum(comp.tolist()) + sum(comm[s] for s in src) if n else 0
    if bound >= _MAX_UNITS:
        raise ExternalFormatError(
            f"{path}: costs this large (up to {bound} units in one step) overflow the "
            "exact integer times the replay keeps.")
    return (total[0], inputs, np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64),
            comp, comm, types or None)


def _topological(n: int, src: np.ndarray, dst: np.ndarray, path: str) -> np.ndarray:
    """int64[n]: file ids in a topological order, the file's own order where it already
    is one (smallest ready id first); ``ExternalFormatError`` naming a cycle."""
    import heapq

    indeg = np.bincount(dst, minlength=n)
    succ: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(src.tolist(), dst.tolist(), strict=True):
        succ[s].append(d)
    ready = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        u = heapq.heappop(ready)
        order.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(ready, v)
    if len(order) < n:
        import networkx as nx

        g = nx.DiGraph(zip(src.tolist(), dst.tolist(), strict=True))
        cycle = [u for u, _ in nx.find_cycle(g.subgraph(np.flatnonzero(indeg > 0).tolist()))]
        raise ExternalFormatError(
            f"{path}: the edges form a cycle through nodes {' -> '.join(map(str, cycle))}; "
            "a Doppler graph must be acyclic.")
    return np.asarray(order, dtype=np.int64)


def default_devices(path) -> int:
    """The GPU count Doppler runs a file with: 8 for ``8gpu_*`` files, else 4 (its
    configs' ``num_device``; ``main.py`` picks the ``8gpu_`` graphs for 8)."""
    stem = Path(path).name
    return next((k for prefix, k in _GPUS_BY_PREFIX if stem.startswith(prefix)), _DEFAULT_GPUS)


def load(path, *, devices: int | None = None) -> Instance:
    """Read a Doppler ``compute_graph`` file into an ``Instance`` on ``devices`` GPUs
    (default: ``default_devices(path)``), scored by ``DopplerMakespan``.

    Op i is the file's node ``node_ids[i]``: the file's order where it is topological
    (every published file is), else a topological order closest to it. Edges repeated in
    the file are kept once (Doppler waits on each (producer, consumer) pair once)."""
    from simplace.graph import OpGraph

    path = os.fspath(path)
    if devices is None:
        devices = default_devices(path)
    if isinstance(devices, bool) or not isinstance(devices, (int, np.integer)) or devices < 1:
        raise ExternalFormatError(f"{path}: devices must be an integer >= 1, got {devices!r}.")
    devices = int(devices)
    total, inputs, src, dst, comp, comm, types = _parse(path)
    n = comp.shape[0]
    loops = np.flatnonzero(src == dst)
    if loops.size:
        raise ExternalFormatError(
            f"{path}: edge {int(loops[0])} is a self-loop on node {int(src[loops[0]])}; a "
            "Doppler graph must be acyclic.")
    # One edge per (producer, consumer), first appearance kept: Doppler's AllOf waits on a
    # dict keyed by the pair.
    _, first = np.unique(src * n + dst, return_index=True)
    keep = np.sort(first)
    duplicates = int(src.size - keep.size)
    src, dst = src[keep], dst[keep]
    node_ids = _topological(n, src, dst, path)
    op_of = np.empty(n, dtype=np.int64)
    op_of[node_ids] = np.arange(n)
    ruler = DopplerMakespan(comp, comm, src, dst, devices, node_ids=node_ids)
    e_src, e_dst = op_of[src], op_of[dst]
    stem = Path(path).stem
    kind = np.asarray(types, dtype=object)[node_ids] if types else np.full(n, "node", object)
    graph = OpGraph(
        op=kind, signature=kind, name_path=[f"node{int(i)}" for i in node_ids],
        flops=np.zeros(n), bytes_accessed=np.zeros(n), out_bytes=np.zeros(n),
        src=e_src, dst=e_dst,
        edge_bytes=comm[src] / FILE_UNITS_PER_S * TRANSFER_BANDWIDTH_BYTES_PER_S,
        name=stem)
    differs = (
        "simplace's own simulation sends one copy per (producer, device) and runs a "
        "device's ops in its own order; Doppler sends one copy per edge and runs them in "
        "the order their inputs complete (DopplerMakespan replays that)")
    machine = imported_machine(
        f"doppler:{stem}", graph, ["gpu"] * devices, [math.inf] * devices,
        {"gpu": comp[node_ids] / FILE_UNITS_PER_S},
        notes=[f"Doppler graph {path}", f"{devices} GPUs, no memory caps",
               f"seconds = file units / {FILE_UNITS_PER_S:g}", differs])
    info = {
        "devices": devices, "file_nodes": total, "input_tensors": len(inputs),
        "nodes": n, "edges": int(src.size), "duplicate_edges_dropped": duplicates,
        "reordered": bool(np.any(node_ids != np.arange(n))),
        "op_types": types is not None, "file_units_per_s": FILE_UNITS_PER_S,
        "differs_from_simplace": differs,
    }
    return Instance(
        graph=graph, cost_model=machine.with_objective(ruler), fmt="doppler", path=path,
        node_ids=node_ids, colocation=np.full(n, -1, dtype=np.int32),
        rulers={"latency": ruler}, default_objective="latency", info=info)


# ---------------------------------------------------------------------------- the ruler
# Events of the replay; each is what SimPy processes at one step of its queue.
_ALLOF, _GRANT, _DONE, _RELEASE, _FINISH, _ARRIVE, _EDGE_END = range(7)


@njit(nogil=True)
def _replay(p, comp, comm, out_ptr, out_dst, indeg, sources, remaining, busy, queue, q_head,
            q_tail, ev_kind, ev_id, h_time, h_seq, h_kind, h_id):
    """The makespan (file units) of one placement (int32[n], file ids) as Doppler's SimPy
    simulation computes it; see the module docstring. The other arguments are scratch.

    Events at the current instant run in a FIFO (SimPy's queue orders equal times by
    creation); timeouts that end later wait in a binary heap keyed (time, creation)."""
    remaining[:] = indeg
    busy[:] = False
    q_head[:] = 0
    q_tail[:] = 0
    head = 0
    tail = 0
    h_n = 0
    seq = 0
    now = 0
    for k in range(sources.shape[0]):
        ev_kind[tail] = _ALLOF
        ev_id[tail] = sources[k]
        tail += 1
    while True:
        while head < tail:
            kind = ev_kind[head]
            x = ev_id[head]
            head += 1
            if kind == _ALLOF:
                d = p[x]
                queue[d, q_tail[d]] = x
                q_tail[d] += 1
                if not busy[d]:
                    # Resource._trigger_put grants the oldest request, not always this one.
                    busy[d] = True
                    ev_kind[tail] = _GRANT
                    ev_id[tail] = queue[d, q_head[d]]
                    q_head[d] += 1
                    tail += 1
            elif kind == _GRANT:
                if comp[x] > 0:
                    _push(h_time, h_seq, h_kind, h_id, h_n, now + comp[x], seq, _DONE, x)
                    h_n += 1
                    seq += 1
                else:
                    ev_kind[tail] = _DONE
                    ev_id[tail] = x
                    tail += 1
            elif kind == _DONE:
                # Leaving ``with request``: the device is free at once, the next request
                # is granted when the Release event runs; then the op's finish event.
                busy[p[x]] = False
                ev_kind[tail] = _RELEASE
                ev_id[tail] = x
                ev_kind[tail + 1] = _FINISH
                ev_id[tail + 1] = x
                tail += 2
            elif kind == _RELEASE:
                d = p[x]
                if not busy[d] and q_head[d] < q_tail[d]:
                    busy[d] = True
                    ev_kind[tail] = _GRANT
                    ev_id[tail] = queue[d, q_head[d]]
                    q_head[d] += 1
                    tail += 1
            elif kind == _FINISH:
                for k in range(out_ptr[x], out_ptr[x + 1]):
                    delay = comm[x] if p[out_dst[k]] != p[x] else 0
                    if delay > 0:
                        _push(h_time, h_seq, h_kind, h_id, h_n, now + delay, seq, _ARRIVE, k)
                        h_n += 1
                        seq += 1
                    else:
                        ev_kind[tail] = _ARRIVE
                        ev_id[tail] = k
                        tail += 1
            elif kind == _ARRIVE:
                # The edge's process returns: its Process event is one more step.
                ev_kind[tail] = _EDGE_END
                ev_id[tail] = x
                tail += 1
            else:  # _EDGE_END
                w = out_dst[x]
                remaining[w] -= 1
                if remaining[w] == 0:
                    ev_kind[tail] = _ALLOF
                    ev_id[tail] = w
                    tail += 1
        if h_n == 0:
            break
        # Every timeout ending at the next instant runs before anything it schedules.
        now = h_time[0]
        head = 0
        tail = 0
        while h_n > 0 and h_time[0] == now:
            ev_kind[tail] = h_kind[0]
            ev_id[tail] = h_id[0]
            tail += 1
            h_n -= 1
            _pop(h_time, h_seq, h_kind, h_id, h_n)
    return now


@njit(nogil=True)
def _push(h_time, h_seq, h_kind, h_id, n, t, seq, kind, ident):
    """Add the timeout (t, seq) of event ``kind`` for ``ident`` to the heap of ``n``."""
    i = n
    while i > 0:
        par = (i - 1) >> 1
        if h_time[par] < t or (h_time[par] == t and h_seq[par] < seq):
            break
        h_time[i] = h_time[par]
        h_seq[i] = h_seq[par]
        h_kind[i] = h_kind[par]
        h_id[i] = h_id[par]
        i = par
    h_time[i] = t
    h_seq[i] = seq
    h_kind[i] = kind
    h_id[i] = ident


@njit(nogil=True)
def _pop(h_time, h_seq, h_kind, h_id, n):
    """Remove the heap's least entry: its last entry (index ``n``, the heap now holding
    ``n``) sifts down from the root."""
    if n == 0:
        return
    lt, ls, lk, li = h_time[n], h_seq[n], h_kind[n], h_id[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (h_time[c + 1] < h_time[c] or (
                h_time[c + 1] == h_time[c] and h_seq[c + 1] < h_seq[c])):
            c += 1
        if lt < h_time[c] or (lt == h_time[c] and ls < h_seq[c]):
            break
        h_time[i] = h_time[c]
        h_seq[i] = h_seq[c]
        h_kind[i] = h_kind[c]
        h_id[i] = h_id[c]
        i = c
    h_time[i] = lt
    h_seq[i] = ls
    h_kind[i] = lk
    h_id[i] = li


@njit(nogil=True)
def _replay_batch(placements, comp, comm, out_ptr, out_dst, indeg, sources, num_devices,
                  out):
    """out[b] = ``_replay`` of placements[b] (int32[B, n], file ids)."""
    n = comp.shape[0]
    e = out_dst.shape[0]
    remaining = np.empty(n, dtype=np.int64)
    busy = np.zeros(num_devices, dtype=np.bool_)
    # One FIFO of waiting ops per device: an op requests its device once.
    queue = np.empty((num_devices, n), dtype=np.int64)
    q_head = np.zeros(num_devices, dtype=np.int64)
    q_tail = np.zeros(num_devices, dtype=np.int64)
    # Each op and edge puts a bounded number of events through the FIFO at one instant
    # (an op 5, an edge 2), and has at most one timeout pending.
    ev_kind = np.empty(5 * n + 2 * e + 8, dtype=np.int64)
    ev_id = np.empty(5 * n + 2 * e + 8, dtype=np.int64)
    h_time = np.empty(n + e, dtype=np.int64)
    h_seq = np.empty(n + e, dtype=np.int64)
    h_kind = np.empty(n + e, dtype=np.int64)
    h_id = np.empty(n + e, dtype=np.int64)
    for b in range(placements.shape[0]):
        out[b] = _replay(placements[b], comp, comm, out_ptr, out_dst, indeg, sources,
                         remaining, busy, queue, q_head, q_tail, ev_kind, ev_id, h_time,
                         h_seq, h_kind, h_id)


class DopplerMakespan(Ruler):
    """The makespan Doppler's SimPy simulator (``env/cost.py``) gives a placement.

    Args:
      compute_units, comm_units: int64[n], each file node's costs (file units).
      src, dst: int64[E], the file's edges (file ids), each (producer, consumer) once,
        in file order (it decides SimPy's order of equal-time events).
      num_devices: D.
      node_ids: int64[n], the file id of op i (default: op i is node i).
    """

    name = "doppler"
    objective = "latency"

    def __init__(self, compute_units, comm_units, src, dst, num_devices: int, *,
                 node_ids=None):
        comp = np.ascontiguousarray(compute_units, dtype=np.int64)
        comm = np.ascontiguousarray(comm_units, dtype=np.int64)
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        n = comp.shape[0]
        self.num_ops = n
        self.num_devices = int(num_devices)
        self.memory_bytes = np.full(self.num_devices, math.inf)
        self.colocation = None
        self._comp, self._comm = comp, comm
        self._comp_s = comp / FILE_UNITS_PER_S
        self._cut_s = comm[src] / FILE_UNITS_PER_S
        # Out-edges grouped by producer, consumers in order of first appearance: the
        # order nx.MultiDiGraph (from DGL's to_networkx) iterates them, so the order in
        # which the edges' SimPy processes were created.
        order = np.argsort(src, kind="stable")
        self._out_dst = np.ascontiguousarray(dst[order])
        self._out_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=n), out=self._out_ptr[1:])
        self._indeg = np.bincount(dst, minlength=n).astype(np.int64)
        self._sources = np.flatnonzero(self._indeg == 0).astype(np.int64)
        self._src, self._dst = src, dst
        ids = np.arange(n) if node_ids is None else np.asarray(node_ids, dtype=np.int64)
        # Placement columns in file order: file node ids[i] is op i.
        self._to_file = None if np.array_equal(ids, np.arange(n)) else np.argsort(ids)
        self._file_units_per_s = FILE_UNITS_PER_S

    def _file_order(self, placements: np.ndarray) -> np.ndarray:
        p = np.ascontiguousarray(placements, dtype=np.int32)
        return p if self._to_file is None else np.ascontiguousarray(p[:, self._to_file])

    def makespan_units(self, placements) -> np.ndarray:
        """int64[B]: Doppler's ``env.now`` at the end (file units) for int32[B, M]
        placements in op order."""
        p = np.atleast_2d(np.asarray(placements))
        if p.ndim != 2 or p.shape[1] != self.num_ops:
            raise ValueError(f"placements must be int[B, {self.num_ops}], got shape "
                             f"{p.shape}.")
        if p.size and (p.min() < 0 or p.max() >= self.num_devices):
            raise ValueError(f"placements must name devices 0..{self.num_devices - 1}, got "
                             f"{int(p.min())}..{int(p.max())}.")
        pf = self._file_order(p)
        out = np.zeros(pf.shape[0], dtype=np.int64)
        _replay_batch(pf, self._comp, self._comm, self._out_ptr, self._out_dst, self._indeg,
                      self._sources, self.num_devices, out)
        return out

    def evaluate(self, placements: np.ndarray) -> BatchResult:
        """``BatchResult`` of int32[B, M] placements (op order): ``step_time_s`` Doppler's
        makespan, ``busy_s`` each device's compute, ``bytes_moved`` the cut edges' copies
        (one per edge, the producer's communication time times the link bandwidth); no
        memory (Doppler has none)."""
        p = np.atleast_2d(np.asarray(placements))
        units = self.makespan_units(p)
        b, d = p.shape[0], self.num_devices
        pf = self._file_order(p).astype(np.int64)
        key = (pf + np.arange(b)[:, None] * d).reshape(-1)
        busy = np.bincount(key, weights=np.tile(self._comp_s, b), minlength=b * d)
        busy = busy.reshape(b, d)
        cut = pf[:, self._src] != pf[:, self._dst]
        moved = cut @ self._cut_s
        return BatchResult(
            step_time_s=units / FILE_UNITS_PER_S,
            peak_memory_bytes=np.zeros((b, d)), oom=np.zeros(b, dtype=bool), busy_s=busy,
            bytes_moved=moved * TRANSFER_BANDWIDTH_BYTES_PER_S,
            num_transfers=cut.sum(axis=1))

    def lower_bound_s(self) -> float:
        """max(the longest path of compute costs alone, total compute / D), seconds."""
        finish = self._comp.astype(np.float64)
        for u in np.argsort(_topo_rank(self.num_ops, self._src, self._dst), kind="stable"):
            lo, hi = self._out_ptr[u], self._out_ptr[u + 1]
            for w in self._out_dst[lo:hi]:
                finish[w] = max(finish[w], finish[u] + self._comp[w])
        path = float(finish.max()) if finish.size else 0.0
        return max(path, float(self._comp.sum()) / self.num_devices) / FILE_UNITS_PER_S

    def describe(self) -> str:
        """One line: what this ruler computes."""
        return ("doppler (latency): Doppler's SimPy makespan, FIFO devices, one copy per "
                "cut edge, uncontended links")


def _topo_rank(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """int64[n]: each node's position in a topological order."""
    order = _topological(n, src, dst, "<graph>")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    return rank

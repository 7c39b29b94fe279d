"""The msr instances (Tarnawski et al., NeurIPS 2020; msr-fiddle/dnn-partitioning).

A file is one JSON object: ``maxSizePerFPGA`` (bytes an accelerator holds), ``maxFPGAs``
(accelerators, "FPGA" meaning any accelerator), ``maxCPUs``, ``nodes`` (``id``,
``supportedOnFpga``, ``cpuLatency``, ``fpgaLatency``, ``isBackwardNode``, optional
``colorClass`` and ``size``, optional ``name``) and ``edges`` (``sourceId``, ``destId``,
``cost``: the time to move the source's output between an accelerator and CPU DRAM, one
value per source).

The graph: op i is the file's i-th node in increasing id order, its id kept in
``node_ids`` and in its ``name_path`` (``"{name}:{id}"``, or ``"{id}"``). Where that
order is not topological (their training LayerGraphs, whose backward ids are not
increasing along edges) the ops are sorted topologically, lowest id first among ready
ones, and ``info["reordered"]`` says so. A node's ``size`` is a parameter of its op, so
simplace's memory check holds it where the op runs; repeated edges are kept once.

The machine: device 0 is ``"cpu"`` and devices 1..k are ``"gpu"`` (k = ``maxFPGAs``, or
``devices``), holding ``maxSizePerFPGA`` bytes each; the CPU has no cap (their programs
check none). The CPU cores are one device: ``dp.cpp``'s scorer
(``computeLoadForResultOrg``, also used by ``-expert``, ``-oneFpga`` and
``-localSearch``) sums every CPU node's ``cpuLatency`` into one group, and
``greedy.cpp``'s ``computeLatency`` runs each CPU node on its own as soon as its inputs
are ready, whatever the core count. ``maxCPUs`` only matters to their DP, which may
give each of up to ``maxCPUs`` contiguous CPU pieces its own load; its own check then
sums them, so with ``maxCPUs > 1`` a DP split's CPU load here (and in that check) can
exceed the DP's printed value. ``maxCPUs == 0`` forbids the CPU: a placement using it
is marked infeasible (``oom``).

Times: the files' unit is milliseconds (the paper reports time-per-sample and latency
in ms; a BERT-24 layer's ``fpgaLatency`` is 5.655). Op times and edge bytes are
converted to seconds (``FILE_TIME_UNIT_S``) and the rulers report seconds like every
``step_time_s``: multiply by 1000 to compare with the programs' printed figures. A node
with ``supportedOnFpga`` false costs ``UNSUPPORTED_S`` on an accelerator in simplace's
own simulator (its inputs must be finite); the rulers mark such placements ``oom``.

Rulers: ``MsrMaxLoad`` (``"throughput"``) and ``MsrLatency`` (``"latency"``) reproduce
``dp.cpp``'s and ``greedy.cpp``'s figures. The default objective is ``"throughput"``
for files under a ``throughput-inputs`` folder, ``"latency"`` under ``latency-inputs``,
and ``"throughput"`` elsewhere (the paper's main objective).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from simplace._numba import njit
from simplace.external import ExternalFormatError, Instance
from simplace.external._machine import NO_CAP_BYTES, TRANSFER_BANDWIDTH_BYTES_PER_S
from simplace.sim.objective import Ruler

# Seconds per unit of the files' times (milliseconds).
FILE_TIME_UNIT_S = 1e-3
# An op's time on an accelerator that cannot run it, for simplace's own simulator.
UNSUPPORTED_S = 1e6
# Their programs accept two edge costs of one source that differ by at most this.
COST_TOLERANCE = 1e-6


# ------------------------------------------------------------------------ reading
def _fail(path, what: str):
    raise ExternalFormatError(f"{path}: {what}")


def _number(path, where: str, obj: dict, key: str, *, default=None, integer=False,
            minimum=0.0) -> float:
    if key not in obj:
        if default is not None:
            return default
        _fail(path, f"{where} has no field '{key}'.")
    v = obj[key]
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not math.isfinite(v):
        kind = "an integer" if integer else "a finite number"
        _fail(path, f"{where}: '{key}' must be {kind}, got {v!r}.")
    if minimum is not None and v < minimum:
        _fail(path, f"{where}: '{key}' is {v!r}, below {minimum:g} (it is a time, size or "
                    "count).")
    return v


def _flag(path, where: str, obj: dict, key: str) -> bool:
    if key not in obj:
        _fail(path, f"{where} has no field '{key}'.")
    v = obj[key]
    if v in (True, False, 0, 1) and isinstance(v, (bool, int)):
        return bool(v)
    _fail(path, f"{where}: '{key}' must be true/false or 0/1, got {v!r}.")


def _read(path: Path) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        _fail(path, "no such file.")
    except (OSError, UnicodeDecodeError) as err:
        _fail(path, f"cannot read it ({err}).")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        _fail(path, f"not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
                    "is the file complete?")
    if not isinstance(doc, dict):
        _fail(path, "the top level must be a JSON object with maxSizePerFPGA, maxFPGAs, "
                    "maxCPUs, nodes and edges.")
    return doc


class _Parsed:
    """The file's nodes in op order, times in the file's unit."""

    def __init__(self, path: Path, doc: dict):
        self.cap_bytes = _number(path, "the instance", doc, "maxSizePerFPGA")
        self.max_fpgas = int(_number(path, "the instance", doc, "maxFPGAs", integer=True))
        self.max_cpus = int(_number(path, "the instance", doc, "maxCPUs", integer=True))
        for key in ("nodes", "edges"):
            if not isinstance(doc.get(key), list):
                _fail(path, f"the instance needs a list '{key}'.")
        rows = []
        seen = set()
        for k, n in enumerate(doc["nodes"]):
            if not isinstance(n, dict):
                _fail(path, f"nodes[{k}] is not an object.")
            nid = int(_number(path, f"nodes[{k}]", n, "id", integer=True, minimum=None))
            where = f"node {nid}"
            if nid in seen:
                _fail(path, f"node id {nid} appears twice.")
            seen.add(nid)
            cc = n.get("colorClass")
            if cc is not None and (isinstance(cc, bool) or not isinstance(cc, int)):
                _fail(path, f"{where}: 'colorClass' must be an integer, got {cc!r}.")
            rows.append((nid, _flag(path, where, n, "supportedOnFpga"),
                         _number(path, where, n, "cpuLatency"),
                         _number(path, where, n, "fpgaLatency"),
                         _flag(path, where, n, "isBackwardNode"), cc,
                         _number(path, where, n, "size", default=0.0), n.get("name")))
        rows.sort(key=lambda r: r[0])
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        index = {int(i): k for k, i in enumerate(ids)}
        m = len(rows)
        cost = np.full(m, np.nan)
        pairs = set()
        for k, e in enumerate(doc["edges"]):
            if not isinstance(e, dict):
                _fail(path, f"edges[{k}] is not an object.")
            a = int(_number(path, f"edges[{k}]", e, "sourceId", integer=True, minimum=None))
            b = int(_number(path, f"edges[{k}]", e, "destId", integer=True, minimum=None))
            c = _number(path, f"edges[{k}] ({a} -> {b})", e, "cost")
            for x in (a, b):
                if x not in index:
                    _fail(path, f"edges[{k}] ({a} -> {b}): node {x} is not among the nodes.")
            i = index[a]
            if math.isnan(cost[i]):
                cost[i] = c
            elif abs(cost[i] - c) > COST_TOLERANCE:
                _fail(path, f"node {a} has two different outgoing edge costs ({cost[i]!r} and "
                            f"{c!r}); a cost is the transfer time of the node's output, one "
                            "per node.")
            pairs.add((i, index[b]))
        self.duplicate_edges = len(doc["edges"]) - len(pairs)
        src = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
        from simplace.graph import find_cycle, topological_order

        order = topological_order(m, src[:, 0], src[:, 1])
        if order is None:
            cyc = find_cycle(m, src[:, 0], src[:, 1])
            _fail(path, "the edges form a cycle: " + " -> ".join(str(ids[i]) for i in cyc) +
                  "; a DNN graph must be acyclic.")
        order = np.asarray(order, dtype=np.int64)
        self.reordered = bool(np.any(order != np.arange(m)))
        pos = np.empty(m, dtype=np.int64)
        pos[order] = np.arange(m)
        rows = [rows[i] for i in order]
        self.ids = ids[order]
        self.supported = np.array([r[1] for r in rows], dtype=bool)
        self.cpu = np.array([r[2] for r in rows], dtype=np.float64)
        self.fpga = np.array([r[3] for r in rows], dtype=np.float64)
        self.backward = np.array([r[4] for r in rows], dtype=bool)
        self.size = np.array([r[6] for r in rows], dtype=np.float64)
        self.names = [r[7] for r in rows]
        self.out_cost = np.nan_to_num(cost[order], nan=0.0)
        edges = pos[src]
        keep = np.lexsort((edges[:, 1], edges[:, 0]))
        self.src = edges[keep, 0].copy()
        self.dst = edges[keep, 1].copy()
        # Colour classes numbered by first op; -1 where a node has none.
        classes: dict[int, int] = {}
        self.colocation = np.array(
            [-1 if r[5] is None else classes.setdefault(r[5], len(classes)) for r in rows],
            dtype=np.int32)


def _check_fits(path, d: _Parsed, k: int) -> None:
    """Every node and colour class fits some device: the CPU if allowed, else one
    accelerator (supported there and within its memory)."""
    if d.max_cpus > 0:
        return
    if k == 0:
        _fail(path, "maxCPUs is 0 and there are no accelerators: nothing can run.")
    for i in np.flatnonzero(~d.supported | (d.size > d.cap_bytes)):
        why = ("is not supported on an accelerator" if not d.supported[i] else
               f"needs {d.size[i]:g} bytes, more than maxSizePerFPGA {d.cap_bytes:g}")
        _fail(path, f"node {d.ids[i]} {why}, and maxCPUs is 0: it fits no device.")
    col = d.colocation
    if col.size and col.max() >= 0:
        total = np.bincount(col[col >= 0], weights=d.size[col >= 0])
        big = np.flatnonzero(total > d.cap_bytes)
        if big.size:
            members = d.ids[col == big[0]]
            _fail(path, f"the colour class of nodes {members[:8].tolist()} needs "
                        f"{total[big[0]]:g} bytes together, more than maxSizePerFPGA "
                        f"{d.cap_bytes:g}, and maxCPUs is 0: the class fits no device.")


def _default_objective(path: Path) -> str:
    parts = {p.lower() for p in path.resolve().parts}
    if "latency-inputs" in parts:
        return "latency"
    return "throughput"


def load(path, *, devices: int | None = None) -> Instance:
    """Read an msr instance file into an ``Instance`` (see the module's docstring).

    ``devices``: the number of accelerators (default: the file's ``maxFPGAs``).
    Raises ``ExternalFormatError`` naming the file and the field or node for a file
    that cannot be read."""
    from simplace.external._machine import imported_machine
    from simplace.graph import OpGraph

    path = Path(path)
    d = _Parsed(path, _read(path))
    if devices is not None and (isinstance(devices, bool) or not isinstance(devices, int)
                                or devices < 0):
        raise ExternalFormatError(f"devices must be an accelerator count >= 0, got "
                                  f"{devices!r}.")
    k = d.max_fpgas if devices is None else devices
    _check_fits(path, d, k)
    m = d.ids.size
    names = [f"{n}:{i}" if n is not None else f"{i}" for n, i in zip(d.names, d.ids,
                                                                         strict=True)]
    has = np.flatnonzero(d.size > 0)
    graph = OpGraph(
        op=np.where(d.backward, "msr_backward", "msr_forward"), name_path=names,
        flops=np.zeros(m), bytes_accessed=np.zeros(m), out_bytes=np.zeros(m),
        signature=[f"msr:{i}" for i in d.ids], src=d.src, dst=d.dst,
        edge_bytes=d.out_cost[d.src] * FILE_TIME_UNIT_S * TRANSFER_BANDWIDTH_BYTES_PER_S,
        param_names=[f"size:{d.ids[i]}" for i in has], param_sizes=d.size[has],
        param_op=has, param_index=np.arange(has.size),
        name=f"msr:{path.parent.name}/{path.stem}",
        meta={"source": str(path), "node_ids": d.ids.tolist()})
    memory = [NO_CAP_BYTES] + [d.cap_bytes] * k
    args = (d, k, memory)
    rulers = {"throughput": MsrMaxLoad(*args), "latency": MsrLatency(*args)}
    default = _default_objective(path)
    gpu_s = np.where(d.supported, d.fpga * FILE_TIME_UNIT_S, UNSUPPORTED_S)
    notes = [f"msr instance {path}", "times: the file's milliseconds as seconds",
             f"{int((~d.supported).sum())} nodes unsupported on an accelerator cost "
             f"{UNSUPPORTED_S:g} s there"]
    model = imported_machine(
        f"msr:{path.stem}", graph, ["cpu"] + ["gpu"] * k, memory,
        {"cpu": d.cpu * FILE_TIME_UNIT_S, "gpu": gpu_s}, notes=notes)
    info = {"maxSizePerFPGA": d.cap_bytes, "maxFPGAs": d.max_fpgas, "maxCPUs": d.max_cpus,
            "accelerators": k, "time_unit": "ms", "reordered": d.reordered,
            "duplicate_edges": d.duplicate_edges,
            "backward_nodes": int(d.backward.sum()),
            "unsupported_on_accelerator": int((~d.supported).sum()),
            "cpu_memory": "no cap (their programs check none)"}
    return Instance(graph=graph, cost_model=model.with_objective(rulers[default]), fmt="msr",
                    path=str(path), node_ids=d.ids.copy(), colocation=d.colocation.copy(),
                    rulers=rulers, default_objective=default, info=info)


# ------------------------------------------------------------------------ rulers
class _MsrRuler(Ruler):
    """What both rulers share: the file's numbers in op order and the feasibility rules
    (an accelerator's nodes within ``maxSizePerFPGA``, no unsupported node on an
    accelerator, no CPU node where ``maxCPUs`` is 0)."""

    name = "msr"

    def __init__(self, d: _Parsed, accelerators: int, memory_bytes):
        self.num_ops = int(d.ids.size)
        self.num_devices = 1 + int(accelerators)
        self.memory_bytes = np.asarray(memory_bytes, dtype=np.float64)
        self.colocation = d.colocation.copy()
        self.cpu_ms, self.fpga_ms, self.size = d.cpu, d.fpga, d.size
        self.out_cost_ms = d.out_cost
        self.src, self.dst = d.src, d.dst
        self.cap_bytes = float(d.cap_bytes)
        self.cpu_allowed = d.max_cpus > 0
        self.unsupported = ~d.supported
        m = self.num_ops
        self._pred_ptr, self._pred = _csr(self.dst, self.src, m)
        self._succ_ptr, self._succ = _csr(self.src, self.dst, m)

    def _loads(self, placements):
        """(int32[B, M] placements, busy ms [B, D], held bytes [B, D], oom [B], comm ms
        [B, D], copies [B], ms moved [B]). comm[r, d]: for each producer j with a
        consumer on another device, ``cost(j)`` on j's device and on each other consuming
        device (``computeLoadForResultOrg``); copies: one per (producer, other device)."""
        from simplace.placement import check_placements

        p = np.ascontiguousarray(check_placements(placements, self.num_ops,
                                                  self.num_devices))
        b, dev = p.shape[0], self.num_devices
        busy, held, comm = (np.zeros((b, dev)) for _ in range(3))
        copies = np.zeros(b, dtype=np.int64)
        moved = np.zeros(b)
        bad = np.zeros(b, dtype=np.bool_)
        if b and self.num_ops:
            _loads_batch(p, dev, self.cpu_ms, self.fpga_ms, self.size,
                                    self.unsupported, self._succ_ptr, self._succ,
                                    self.out_cost_ms, busy, held, comm, copies, moved, bad)
        oom = bad | np.any(held[:, 1:] > self.cap_bytes, axis=1)
        if not self.cpu_allowed:
            oom |= np.any(p == 0, axis=1)
        return p, busy, held, oom, comm, copies, moved

    def _result(self, step_ms, busy, held, oom, copies, moved):
        from simplace.sim.batched import BatchResult

        unit = FILE_TIME_UNIT_S
        return BatchResult(
            step_time_s=step_ms * unit, peak_memory_bytes=held, oom=oom, busy_s=busy * unit,
            bytes_moved=moved * unit * TRANSFER_BANDWIDTH_BYTES_PER_S,
            num_transfers=copies, host_s=np.zeros(step_ms.shape[0]))


class MsrMaxLoad(_MsrRuler):
    """Their max-load (time per sample), as ``dp.cpp``'s ``computeLoadForResultOrg``.

    Device 0 (every CPU node) loads the sum of its nodes' ``cpuLatency`` and pays no
    communication; accelerator d loads its nodes' ``fpgaLatency`` plus, for every node
    j with a consumer on another device, ``cost(j)`` once if j is on d and once if d is
    one of j's other consuming devices. The time is the largest load, in seconds."""

    objective = "throughput"

    def evaluate(self, placements):
        """``BatchResult`` of int32[B, M] placements (colour classes kept)."""
        p, busy, held, oom, comm, copies, moved = self._loads(placements)
        load = busy + comm
        load[:, 0] = busy[:, 0]  # the CPU pays no communication
        return self._result(load.max(axis=1, initial=0.0), busy, held, oom, copies, moved)

    def lower_bound_s(self) -> float:
        """The larger of: the least total compute spread over the CPU and every
        accelerator, and the costliest colour class (it sits on one device whole)."""
        least = np.minimum(self.cpu_ms, self.fpga_ms)
        bound = least.sum() / self.num_devices
        col = self.colocation
        if col.size and col.max() >= 0:
            on = col >= 0
            cpu = np.bincount(col[on], weights=self.cpu_ms[on])
            gpu = np.bincount(col[on], weights=self.fpga_ms[on])
            bound = max(bound, float(np.minimum(cpu, gpu).max()))
        if least.size:
            bound = max(bound, float(least.max()))
        return float(bound) * FILE_TIME_UNIT_S

    def describe(self) -> str:
        """One line: what this ruler computes."""
        return "msr max-load (dp.cpp computeLoadForResultOrg; throughput)"


class MsrLatency(_MsrRuler):
    """Their single-sample latency, as ``greedy.cpp``'s ``-computeLatency``.

    Each accelerator's nodes are first cut into contiguous pieces
    (``reworkSplitIntoContiguous``: a node's piece is one more than the latest piece of
    that accelerator it is reached from through other devices). Every CPU node is a
    piece of its own. In a topological order of the pieces, a CPU node finishes at
    ``cpuLatency`` after its last input; an accelerator piece at the latest finish of
    the nodes feeding it, plus the ``cost`` of each of those nodes, plus its nodes'
    ``fpgaLatency``, plus the ``cost`` of each of its nodes consumed outside it. The
    time is the latest finish, in seconds."""

    objective = "latency"

    def evaluate(self, placements):
        """``BatchResult`` of int32[B, M] placements (colour classes kept). Where the
        pieces depend on each other both ways (two pieces on different accelerators,
        each feeding the other through different nodes) their program stops ("contracted
        graph is not acyclic"): the placement is ``oom`` (infeasible) and its time a finite
        bound above every placement's, ``infeasible_ms`` (a search and a policy's reward
        need finite numbers)."""
        p, busy, held, oom, _, copies, moved = self._loads(placements)
        step = np.zeros(p.shape[0])
        if p.shape[0] and self.num_ops:
            _latency_batch(p, self.num_devices, self._pred_ptr, self._pred,
                                      self._succ_ptr, self._succ, self.cpu_ms, self.fpga_ms,
                                      self.out_cost_ms, step)
        stuck = np.isinf(step)
        oom |= stuck
        step[stuck] = self.infeasible_ms
        return self._result(step, busy, held, oom, copies, moved)

    @property
    def infeasible_ms(self) -> float:
        """Above any latency of any split: every node at its slower time, every cost paid
        on both ends of every piece boundary, plus one (file units)."""
        slow = np.maximum(self.cpu_ms, np.where(self.unsupported, 0.0, self.fpga_ms))
        return float(slow.sum() + 2 * self.num_devices * self.out_cost_ms.sum() + 1.0)

    def lower_bound_s(self) -> float:
        """The longest path with each node at the lesser of its two times (pieces are
        contiguous, so a path crosses each piece once; transfers only add)."""
        least = np.minimum(self.cpu_ms, self.fpga_ms)
        finish = least.copy()
        for v in range(self.num_ops):
            lo, hi = self._pred_ptr[v], self._pred_ptr[v + 1]
            if hi > lo:
                finish[v] = least[v] + finish[self._pred[lo:hi]].max()
        return float(finish.max(initial=0.0)) * FILE_TIME_UNIT_S

    def describe(self) -> str:
        """One line: what this ruler computes."""
        return "msr latency (greedy.cpp computeLatency after reworkSplitIntoContiguous)"


def _csr(key, val, m):
    """(int64[m + 1] offsets, int64[E] values): ``val`` grouped by ``key``."""
    order = np.argsort(key, kind="stable")
    ptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(key, minlength=m), out=ptr[1:])
    return ptr, np.ascontiguousarray(val[order], dtype=np.int64)




@njit()
def _loads_batch(p, dev, cpu, fpga, size, unsupported, succ_ptr, succ, cost, busy, held,
                 comm, copies, moved, bad):
    """Per placement p[r]: each device's compute (busy) and bytes (held), the
    communication ``computeLoadForResultOrg`` charges each device (comm), the copies
    and their cost, and whether an unsupported node sits on an accelerator (bad)."""
    b, m = p.shape
    seen = np.empty(dev, dtype=np.int64)
    for r in range(b):
        pr = p[r]
        seen[:] = -1
        for u in range(m):
            du = pr[u]
            if du == 0:
                busy[r, 0] += cpu[u]
            else:
                busy[r, du] += fpga[u]
                if unsupported[u]:
                    bad[r] = True
            held[r, du] += size[u]
            sent = False
            for e in range(succ_ptr[u], succ_ptr[u + 1]):
                dv = pr[succ[e]]
                if dv != du and seen[dv] != u:
                    seen[dv] = u
                    comm[r, dv] += cost[u]
                    copies[r] += 1
                    moved[r] += cost[u]
                    sent = True
            if sent:
                comm[r, du] += cost[u]


@njit()
def _latency_batch(p, dev, pred_ptr, pred, succ_ptr, succ, cpu, fpga, cost, out):
    """out[r] = ``greedy.cpp``'s latency of placement p[r] (file units); inf where the
    pieces form a cycle (their program fails there)."""
    b, m = p.shape
    level = np.zeros((m, dev), dtype=np.int64)
    piece = np.empty(m, dtype=np.int64)
    slot = np.empty(dev * (m + 1), dtype=np.int64)
    base = np.empty(m)
    ready = np.empty(m)
    finish = np.empty(m)
    indeg = np.empty(m, dtype=np.int64)
    mark = np.empty(m, dtype=np.int64)
    is_cpu = np.empty(m, dtype=np.bool_)
    count = np.empty(m + 1, dtype=np.int64)
    members = np.empty(m, dtype=np.int64)
    queue = np.empty(m, dtype=np.int64)
    for r in range(b):
        pr = p[r]
        # reworkSplitIntoContiguous, every accelerator at once: level[v, d] is the latest
        # piece of accelerator d that v is reached from (v's own piece if v is on d).
        for v in range(m):
            pv = pr[v]
            for d in range(1, dev):
                level[v, d] = 1 if pv == d else 0
            for e in range(pred_ptr[v], pred_ptr[v + 1]):
                u = pred[e]
                pu = pr[u]
                for d in range(1, dev):
                    x = level[u, d]
                    if pv == d and pu != d:
                        x += 1
                    if x > level[v, d]:
                        level[v, d] = x
        # Pieces: every CPU node alone, (accelerator, level) for the others.
        slot[:] = -1
        n = 0
        for v in range(m):
            pv = pr[v]
            if pv == 0:
                piece[v] = n
                is_cpu[n] = True
                base[n] = cpu[v]
                n += 1
            else:
                s = pv * (m + 1) + level[v, pv]
                if slot[s] < 0:
                    slot[s] = n
                    is_cpu[n] = False
                    base[n] = 0.0
                    n += 1
                piece[v] = slot[s]
                base[piece[v]] += fpga[v]
        # Transfers: a producer outside an accelerator piece feeding it costs once there;
        # an accelerator node consumed outside its piece costs once in its piece.
        mark[:n] = -1
        indeg[:n] = 0
        for u in range(m):
            q0 = piece[u]
            leaves = False
            for e in range(succ_ptr[u], succ_ptr[u + 1]):
                q = piece[succ[e]]
                if q != q0:
                    leaves = True
                    indeg[q] += 1
                    if not is_cpu[q] and mark[q] != u:
                        mark[q] = u
                        base[q] += cost[u]
            if leaves and not is_cpu[q0]:
                base[q0] += cost[u]
        # Members of each piece (a counting sort), then Kahn's order over the pieces.
        count[: n + 1] = 0
        for v in range(m):
            count[piece[v] + 1] += 1
        for q in range(n):
            count[q + 1] += count[q]
        for v in range(m):
            q = piece[v]
            members[count[q]] = v
            count[q] += 1
        for q in range(n - 1, 0, -1):
            count[q] = count[q - 1]
        count[0] = 0
        head = 0
        tail = 0
        for q in range(n):
            ready[q] = 0.0
            if indeg[q] == 0:
                queue[tail] = q
                tail += 1
        best = 0.0
        while head < tail:
            q = queue[head]
            head += 1
            f = ready[q] + base[q]
            finish[q] = f
            if f > best:
                best = f
            stop = count[q + 1] if q + 1 < n else m
            for k in range(count[q], stop):
                u = members[k]
                for e in range(succ_ptr[u], succ_ptr[u + 1]):
                    q2 = piece[succ[e]]
                    if q2 != q:
                        if f > ready[q2]:
                            ready[q2] = f
                        indeg[q2] -= 1
                        if indeg[q2] == 0:
                            queue[tail] = q2
                            tail += 1
        out[r] = best if tail == n else np.inf


# ------------------------------------------------------------------------ splits
def to_split(instance: Instance, placement) -> dict:
    """Their split JSON of ``placement`` (int[M]; colour classes projected onto their
    first op's device first): ``{"cpus": [{"nodes": ids}], "fpgas": [{"nodes": ids},
    ...]}``, one ``fpgas`` entry per accelerator (accelerator i is device i + 1), ids
    ascending. ``dp -expert`` and ``greedy -computeLatency`` read it."""
    ruler = instance.ruler("throughput")
    from simplace.placement import check_placement

    p = ruler.project(check_placement(placement, ruler.num_ops, ruler.num_devices))
    ids = np.asarray(instance.node_ids)

    def nodes(d):
        return sorted(int(i) for i in ids[p == d])

    return {"cpus": [{"nodes": nodes(0)}],
            "fpgas": [{"nodes": nodes(d)} for d in range(1, ruler.num_devices)]}


def from_split(instance: Instance, split) -> np.ndarray:
    """int32[M]: the placement of one of their splits (every ``cpus`` entry on device 0,
    ``fpgas[i]`` on device i + 1). Nodes the split leaves out take the device of the
    placed nodes of their colour class, as ``dp -expert`` does
    (``augmentHumanExpertToTrainingWithColocations``): a training instance scored with
    an inference split gets its backward nodes so. ``ExternalFormatError`` for a
    malformed split, an unknown or repeated id, more accelerators than the instance
    has, or a node whose device cannot be inferred (no class, or none or two devices
    among its class)."""
    where = "the split"
    if not isinstance(split, dict) or not all(isinstance(split.get(k), list)
                                              for k in ("cpus", "fpgas")):
        raise ExternalFormatError(f"{where} must be an object with lists 'cpus' and 'fpgas' "
                                  "(their output JSON).")
    k = instance.ruler("throughput").num_devices - 1
    if len(split["fpgas"]) > k:
        raise ExternalFormatError(f"{where} uses {len(split['fpgas'])} accelerators; the "
                                  f"instance {instance.path} has {k}.")
    index = {int(i): n for n, i in enumerate(np.asarray(instance.node_ids).tolist())}
    m = len(index)
    p = np.full(m, -1, dtype=np.int32)
    groups = [(0, g) for g in split["cpus"]] + [(d + 1, g) for d, g in
                                               enumerate(split["fpgas"])]
    for dev, g in groups:
        if not isinstance(g, dict) or not isinstance(g.get("nodes"), list):
            raise ExternalFormatError(f"{where}: every entry of 'cpus' and 'fpgas' needs a "
                                      "list 'nodes'.")
        for nid in g["nodes"]:
            if isinstance(nid, bool) or not isinstance(nid, int) or nid not in index:
                raise ExternalFormatError(f"{where}: node {nid!r} is not a node id of "
                                          f"{instance.path}.")
            if p[index[nid]] >= 0:
                raise ExternalFormatError(f"{where}: node {nid} is placed twice.")
            p[index[nid]] = dev
    missing = np.flatnonzero(p < 0)
    if missing.size:
        col = np.asarray(instance.colocation)
        placed = p.copy()
        for i in missing.tolist():
            c = col[i]
            devs = set() if c < 0 else set(placed[(col == c) & (placed >= 0)].tolist())
            if len(devs) != 1:
                why = ("it has no colour class" if c < 0 else "no node of its colour class is "
                       "placed" if not devs else f"its colour class sits on devices "
                       f"{sorted(devs)}")
                raise ExternalFormatError(
                    f"{where} leaves node {instance.node_ids[i]} out and its device cannot be "
                    f"inferred: {why}.")
            p[i] = devs.pop()
    return p

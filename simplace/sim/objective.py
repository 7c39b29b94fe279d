"""What a placement is judged by: the objective, and rulers from other systems.

Two objectives, for every simulator, bound, method and the RL reward:

* ``"latency"``: the step time (the simulators' makespan), as always;
* ``"throughput"``: the time between steps when consecutive steps are pipelined over
  the devices, the largest load on one resource: a device's busy time (segments,
  launches included), an exclusive group's (its devices share compute), a link's
  busy time (``bytes / bandwidth`` per copy, as the simulators send them: a link's
  latency overlaps the next copy), or the host thread's. It is never above the step
  time. This is how PipeDream and the msr instances score a split: a resource cannot
  be busy more than the time between steps.

A ``Ruler`` replaces simplace's simulation altogether: it scores placements the way
another placement system scores them (``simplace.external``), so that a placement is
compared with that system's on its own terms. A cost model carries its objective
(``CostModel.with_objective``); pricing puts it in ``SimInputs.objective``, and the
simulators (``simulate``, ``batched_simulator``) return the objective's time as
``step_time_s``.
"""

from __future__ import annotations

import abc
import contextlib
import weakref
from collections.abc import Sequence

import numpy as np

from simplace._numba import njit
from simplace.errors import OptionError

OBJECTIVES = ("latency", "throughput")


def check_objective(objective) -> None:
    """Raise ``OptionError`` unless ``objective`` is an objective name or a ``Ruler``."""
    if isinstance(objective, Ruler) or objective in OBJECTIVES:
        return
    raise OptionError(f"objective must be one of {', '.join(OBJECTIVES)} (or a Ruler), "
                      f"got {objective!r}.")


def objective_name(objective) -> str:
    """``"latency"`` or ``"throughput"``: what the objective (or ruler) measures."""
    return objective.objective if isinstance(objective, Ruler) else str(objective)


class Ruler(abc.ABC):
    """Scores placements by another system's rules instead of simplace's simulation.

    Subclasses set ``name`` (e.g. ``"doppler"``), ``objective`` (``"latency"`` or
    ``"throughput"``), ``num_ops``, ``num_devices``, ``memory_bytes`` (float64[D]) and
    ``colocation`` (int32[M], the colocation class of each op, -1 for none; or None),
    and implement ``evaluate`` and ``lower_bound_s``.

    Colocation classes: every op of a class runs where the class's first op (in graph
    order) runs. ``project`` applies that rule; ``__call__`` scores projected
    placements, and ``optimize`` returns projected placements, so no method can split a
    class.
    """

    name: str = ""
    objective: str = "latency"
    num_ops: int = 0
    num_devices: int = 0
    memory_bytes: np.ndarray
    colocation: np.ndarray | None = None

    @abc.abstractmethod
    def evaluate(self, placements: np.ndarray):
        """``BatchResult`` of int32[B, M] placements that keep the colocation classes:
        ``step_time_s`` is this system's time, ``busy_s`` each device's compute,
        ``peak_memory_bytes`` what each device holds, ``oom`` where that exceeds a
        capacity or an op sits on a device that cannot run it."""

    @abc.abstractmethod
    def lower_bound_s(self) -> float:
        """A time no placement can beat under these rules."""

    def project(self, placements: np.ndarray) -> np.ndarray:
        """int32[B, M] (or [M]): each colocation class moved to its first op's device."""
        p = np.asarray(placements, dtype=np.int32)
        if self.colocation is None:
            return p
        leader = self.__dict__.get("_leader")
        if leader is None:  # computed once per ruler: searches project every batch
            leader = self.__dict__["_leader"] = _leaders(self.colocation)
        return p[..., leader]

    def __call__(self, placements):
        return self.evaluate(self.project(np.atleast_2d(placements)))

    def describe(self) -> str:
        """One line: what this ruler computes (for results and help)."""
        return f"{self.name} ({self.objective})"


def _leaders(colocation: np.ndarray) -> np.ndarray:
    """int[M]: for each op, the first op of its colocation class (itself if none)."""
    col = np.asarray(colocation)
    leader = np.arange(col.shape[0])
    first: dict[int, int] = {}
    for i, c in enumerate(col.tolist()):
        if c >= 0:
            leader[i] = first.setdefault(c, i)
    return leader


def link_loads_s(src: np.ndarray, dst: np.ndarray, edge_output: np.ndarray,
                 edge_bytes: np.ndarray, bandwidth_bytes_per_s: np.ndarray,
                 placements: np.ndarray) -> np.ndarray:
    """float64[B, D, D]: seconds each ordered link is busy with copies per step.

    As the simulators send them: op j's distinct outputs consumed on device d != p[j]
    go in one copy per (j, d), which keeps the link busy ``bytes / bandwidth`` (its
    latency overlaps the next copy's; a copy of nothing costs the link nothing)."""
    m = int(max(np.max(src, initial=-1), np.max(dst, initial=-1))) + 1
    p = np.atleast_2d(np.asarray(placements, dtype=np.int64))
    return _link_loads(p, _tensors(src, dst, edge_output, edge_bytes, max(m, p.shape[1])),
                       np.asarray(bandwidth_bytes_per_s, dtype=np.float64))


def _tensors(src, dst, edge_output, edge_bytes, m: int):
    """(t_ptr, c_ptr, consumers, t_bytes): the tensors of op j are ``t_ptr[j]..
    t_ptr[j + 1]``, the ops consuming tensor t ``consumers[c_ptr[t]:c_ptr[t + 1]]``, and
    its bytes ``t_bytes[t]`` (the largest of its edges'). A tensor is (producer, output)."""
    src = np.asarray(src, dtype=np.int64)
    if src.size == 0:
        return (np.zeros(m + 1, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64),
                np.zeros(0))
    tensors, t_of_edge = np.unique(np.stack([src, np.asarray(edge_output, np.int64)]),
                                   axis=1, return_inverse=True)
    t_of_edge = t_of_edge.reshape(-1)
    n_t = tensors.shape[1]
    t_bytes = np.zeros(n_t)
    np.maximum.at(t_bytes, t_of_edge, np.asarray(edge_bytes, dtype=np.float64))
    order = np.argsort(t_of_edge, kind="stable")
    c_ptr = np.searchsorted(t_of_edge[order], np.arange(n_t + 1))
    t_ptr = np.searchsorted(tensors[0], np.arange(m + 1))  # tensors sorted by producer
    return t_ptr, c_ptr, np.asarray(dst, dtype=np.int64)[order], t_bytes


def _link_loads(p: np.ndarray, tensors, bw: np.ndarray) -> np.ndarray:
    b, d = p.shape[0], bw.shape[0]
    out = np.zeros((b, d, d))
    if b:
        _link_loads_kernel(p, *tensors, bw, out)
    return out


@njit(nogil=True)
def _link_loads_kernel(p, t_ptr, c_ptr, consumers, t_bytes, bw, out):
    """out[r] += each copy's bytes / bandwidth on its link, for placement p[r]: per
    producer, each destination device once per tensor, one copy per destination."""
    d = bw.shape[0]
    mark = np.zeros(d, dtype=np.int64)
    to = np.zeros(d)
    stamp = 0
    for r in range(p.shape[0]):
        for j in range(t_ptr.shape[0] - 1):
            pj = p[r, j]
            to[:] = 0.0
            for t in range(t_ptr[j], t_ptr[j + 1]):
                stamp += 1
                for e in range(c_ptr[t], c_ptr[t + 1]):
                    dv = p[r, consumers[e]]
                    if dv != pj and mark[dv] != stamp:
                        mark[dv] = stamp
                        to[dv] += t_bytes[t]
            for dv in range(d):
                if to[dv] > 0.0:
                    out[r, pj, dv] += to[dv] / bw[pj, dv]


def throughput_s(busy_s: np.ndarray, exclusive_group: np.ndarray, host_s,
                 link_s: np.ndarray) -> np.ndarray:
    """float64[B]: the largest load on a device, an exclusive group, a link or the host
    (see the module's docstring)."""
    busy = np.atleast_2d(busy_s)
    groups = np.asarray(exclusive_group)
    group_s = np.zeros((busy.shape[0], int(groups.max()) + 1 if groups.size else 1))
    np.add.at(group_s.T, groups, busy.T)
    host = np.zeros(busy.shape[0]) if host_s is None else np.asarray(host_s, dtype=float)
    parts: Sequence[np.ndarray] = (busy.max(axis=1, initial=0.0),
                                   group_s.max(axis=1, initial=0.0),
                                   link_s.reshape(link_s.shape[0], -1).max(axis=1, initial=0.0),
                                   host.reshape(-1))
    return np.max(np.stack(parts), axis=0)


class ObjectiveSimulator:
    """A batched simulator that reports its inputs' objective as ``step_time_s``.

    For ``"throughput"`` it runs ``inner`` (the native or JAX simulator) and replaces
    the step time by the largest load (``throughput_s``); for a ``Ruler`` it runs the
    ruler alone. Same interface as the simulators (``num_ops``, ``num_devices``,
    ``memory``, ``max_batch``, ``f(placements) -> BatchResult``)."""

    def __init__(self, graph, inputs, inner=None):
        self.graph, self.inputs, self.inner = graph, inputs, inner
        self.objective = inputs.objective
        self.num_ops, self.num_devices = inputs.num_ops, inputs.num_devices
        self.memory = getattr(inner, "memory", True)
        self.max_batch = getattr(inner, "max_batch", 256)
        self._tensors = _graph_tensors(graph)

    def __call__(self, placements):
        from simplace.placement import check_placements

        p = check_placements(placements, self.num_ops, self.num_devices)
        if isinstance(self.objective, Ruler):
            return self.objective(p)
        res = self.inner(p)
        inp = self.inputs
        links = _link_loads(p.astype(np.int64), self._tensors, inp.bandwidth_bytes_per_s)
        return res._replace(step_time_s=throughput_s(res.busy_s, inp.exclusive_group,
                                                     res.host_s, links))


def _graph_tensors(graph):
    """``_tensors`` of a graph's edges (an edge without an output index reads output 0),
    built once per graph: the reference simulator asks for them on every placement."""
    try:
        return _TENSORS[graph]
    except (KeyError, TypeError):  # TypeError: a graph that takes no weak reference
        pass
    src = np.asarray(graph.src, dtype=np.int64)
    out = graph.edge_output if graph.edge_output is not None else np.zeros_like(src)
    tensors = _tensors(src, graph.dst, out, graph.edge_bytes, graph.num_ops)
    with contextlib.suppress(TypeError):
        _TENSORS[graph] = tensors
    return tensors


_TENSORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def objective_result(graph, inputs, placement, result):
    """``result`` (a reference ``SimResult`` of ``placement``) with the inputs'
    objective as its step time: the throughput, or the ruler's verdict (``busy_s``,
    peaks, OOM and bytes moved from the ruler too; no schedule)."""
    import dataclasses

    objective = inputs.objective
    p = np.asarray(placement, dtype=np.int32)[None]
    if isinstance(objective, Ruler):
        r = objective(p)
        oom_devices = tuple(int(d) for d in np.flatnonzero(
            r.peak_memory_bytes[0] > np.asarray(inputs.memory_bytes)))
        return dataclasses.replace(
            result, step_time_s=float(r.step_time_s[0]), busy_s=np.asarray(r.busy_s[0]),
            peak_memory_bytes=np.asarray(r.peak_memory_bytes[0]),
            bytes_moved=float(r.bytes_moved[0]), oom=bool(r.oom[0]),
            oom_devices=oom_devices or ((0,) if r.oom[0] else ()), num_segments=0,
            num_transfers=0, host_s=0.0, schedule=None)
    links = _link_loads(p.astype(np.int64), _graph_tensors(graph),
                        np.asarray(inputs.bandwidth_bytes_per_s, dtype=np.float64))
    t = throughput_s(result.busy_s[None], inputs.exclusive_group, [result.host_s], links)
    return dataclasses.replace(result, step_time_s=float(t[0]))

"""Lower bounds on the step time of any placement of a graph on a machine."""

from __future__ import annotations

import numpy as np

from simplace.sim.inputs import sim_inputs


def lower_bound(graph, cost_model) -> float:
    """A step time no placement can beat, in seconds (0 for an empty graph).

    The larger of two bounds, both valid for any placement, any link speeds and any
    memory under the simulators' segment semantics (``simplace.sim.reference``:
    communication and the host only ever delay a segment's start):
      * critical path: along any dependency chain the ops run one after another (in one
        segment, or in segments that wait for each other), op i taking at least
        ``f_i = min_d op_time_s[i, d]``, or ``min_d (op_time_s[i, d] + op_unfused_s[i,
        d])`` when it has no in-edges (it can never fuse into an in-segment producer).
        The chain's first segment starts only after the host dispatched it, and pays a
        launch: ``min_d (dispatch_s[d] + launch_s[d])`` comes on top;
      * total work: an exclusive group runs one segment at a time. All segments together
        run at least ``W = sum_i f_i + min_d launch_s[d] + max_i min_d op_launch_s[i,
        d]`` (there is at least one segment, and the one holding op i pays at least op
        i's extra launch), so the busiest of the G groups is busy at least ``W / G``,
        starting no earlier than the first dispatch, ``min_d dispatch_s[d]``. (Dividing
        by the number of devices instead would be wrong when devices share compute.)
    Both are tight on one device: one segment, ``dispatch + launch + its ops``.

    Args:
      graph: an ``OpGraph``.
      cost_model: a ``CostModel`` (or its interface) or a ``SimInputs``.
    """
    inp = sim_inputs(graph, cost_model)
    if graph.num_ops == 0:
        return 0.0
    times = np.asarray(inp.op_time_s, dtype=np.float64)
    no_inputs = np.diff(graph.in_edges[0]) == 0
    times = times + inp.op_unfused_s * no_inputs[:, None]
    fastest = times.min(axis=1)
    launch = np.asarray(inp.launch_s, dtype=np.float64)
    dispatch = np.asarray(inp.dispatch_s, dtype=np.float64)
    extra = float(inp.op_launch_s.min(axis=1).max())  # a segment pays its largest once
    chain = critical_path_s(graph, fastest) + float((dispatch + launch).min())
    work = float(dispatch.min()) + (fastest.sum() + float(launch.min()) + extra) / inp.num_groups
    return float(max(chain, work))


def critical_path_s(graph, op_time_s: np.ndarray) -> float:
    """The longest path through ``graph`` when op i takes ``op_time_s[i]`` seconds and
    communication is free (ops are in a topological order, so one pass suffices)."""
    m = graph.num_ops
    if m == 0:
        return 0.0
    finish = np.zeros(m)
    ptr, order = graph.in_edges
    src = graph.src[order]
    for i in range(m):
        lo, hi = ptr[i], ptr[i + 1]
        ready = finish[src[lo:hi]].max() if hi > lo else 0.0
        finish[i] = ready + op_time_s[i]
    return float(finish.max())

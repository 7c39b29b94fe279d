"""Lower bounds on the step time of any placement of a graph on a machine."""

from __future__ import annotations

import numpy as np

from simplace.sim.inputs import sim_inputs


def lower_bound(graph, cost_model) -> float:
    """A step time no placement can beat, in seconds (0 for an empty graph).

    The larger of two bounds, both valid for any placement, any link speeds and any
    memory (communication only ever delays an op):
      * critical path: along any dependency chain the ops run one after another, and
        each takes at least its fastest device time ``min_d op_time_s[i, d]``;
      * total work: an exclusive group runs one op at a time, so the busiest of the G
        groups is busy at least ``sum_i min_d op_time_s[i, d] / G`` and the step lasts at
        least that long. (Dividing by the number of devices instead would be wrong when
        devices share compute.)

    Args:
      graph: an ``OpGraph``.
      cost_model: a ``CostModel`` (or its interface) or a ``SimInputs``.
    """
    inp = sim_inputs(graph, cost_model)
    if graph.num_ops == 0:
        return 0.0
    fastest = inp.op_time_s.min(axis=1)
    return float(max(critical_path_s(graph, fastest), fastest.sum() / inp.num_groups))


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

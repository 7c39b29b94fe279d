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
      * total work: an exclusive group runs one segment at a time, starting no earlier
        than the first dispatch, ``min_d dispatch_s[d]``, so the step lasts at least
        that plus ``work_g``, the busy time of any group g, hence at least that plus
        any weighted mean ``sum_g w_g work_g`` (weights ``w >= 0`` summing to 1). Each
        op i adds at least ``min_d w_g(d) t_i[d]`` to that mean wherever it runs, and
        the segment holding op i adds at least ``min_d w_g(d) (launch_s[d] +
        op_launch_s[i, d])`` for its launch (for any one i). Equal weights give the
        balanced bound ``(sum_i f_i + launches) / G``; the weights that maximise the
        op term (a small linear program over distinct rows of per-group op times)
        account for slow groups: a CPU beside four GPUs takes far less than a fifth of
        the work. (Dividing by the number of devices instead would be wrong when
        devices share compute.)
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
    chain = critical_path_s(graph, fastest) + float((dispatch + launch).min())
    group = np.asarray(inp.exclusive_group, dtype=np.int64)
    g = inp.num_groups
    seg = launch[None, :] + np.asarray(inp.op_launch_s, dtype=np.float64)  # [M, D]
    work = max(_weighted_work(times, seg, group, w)
               for w in (np.full(g, 1.0 / g), _best_weights(times, group, g)))
    return float(max(chain, float(dispatch.min()) + work))


def _weighted_work(times, seg, group, w) -> float:
    """``sum_g w_g work_g`` is at least this for any placement (``lower_bound``)."""
    wd = w[group]  # [D]
    ops = (times * wd[None, :]).min(axis=1).sum()
    return float(ops + (seg * wd[None, :]).min(axis=1).max())


def _best_weights(times, group, g: int) -> np.ndarray:
    """Group weights (summing to 1) maximising ``sum_i min_d w_g(d) t_i[d]``, by a linear
    program over the distinct rows of per-group op times; equal weights if it fails."""
    equal = np.full(g, 1.0 / g)
    if g == 1:
        return equal
    per_group = np.full((times.shape[0], g), np.inf)
    for k in range(g):  # the fastest device of each group
        per_group[:, k] = times[:, group == k].min(axis=1)
    scale = float(np.max(per_group[np.isfinite(per_group)], initial=0.0))
    if not scale > 0:
        return equal
    rows, counts = np.unique(per_group / scale, axis=0, return_counts=True)
    u = len(rows)
    # Variables: w (g), then y (u); maximise sum counts * y, i.e. minimise its negative,
    # subject to y_r <= w_k rows[r, k] for each finite entry and sum w = 1.
    r_idx, k_idx = np.nonzero(np.isfinite(rows))
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    n = len(r_idx)
    a_ub = coo_matrix((np.concatenate([np.ones(n), -rows[r_idx, k_idx]]),
                       (np.concatenate([np.arange(n), np.arange(n)]),
                        np.concatenate([g + r_idx, k_idx]))), shape=(n, g + u))
    res = linprog(np.concatenate([np.zeros(g), -counts.astype(np.float64)]),
                  A_ub=a_ub.tocsr(), b_ub=np.zeros(n),
                  A_eq=np.concatenate([np.ones(g), np.zeros(u)])[None, :], b_eq=[1.0],
                  bounds=[(0, None)] * g + [(0, None)] * u, method="highs")
    if res.status != 0:
        return equal
    w = np.clip(res.x[:g], 0.0, None)
    return w / w.sum() if w.sum() > 0 else equal


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

"""Baechi's m-SCT for the program: ``m_etf``'s rule plus favourite children, from the
SCT LP relaxation (``favourite_children_lp``) or by the largest tensor
(``favourite_children_greedy``) (``simplace.placers.list_schedulers`` describes the
runs they share)."""

from __future__ import annotations

import math
import time

import numpy as np

from simplace.placers import Cost, PlacerContext, PlacerOutput, int_option, register
from simplace.placers._list_runs import COMMON_OPTIONS, Problem, Setup, earliest
from simplace.placers.registry import option_values

# Connected op pairs above which the favourite-child LP gives way to the greedy favourite.
LP_MAX_EDGES = 20_000


# --------------------------------------------------------------------------- m-SCT
def favourite_children_lp(pb: Problem) -> tuple[list[int], dict]:
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


def favourite_children_greedy(pb: Problem) -> tuple[list[int], dict]:
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


@register("m_sct", cost=Cost(0.2, 3e-5), rank=8, options={
    **COMMON_OPTIONS,
    "lp_max_edges": int_option("connected op pairs above which the favourite-child LP "
                               "gives way to the greedy favourite (default 20,000)",
                               LP_MAX_EDGES, 0)})
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
    s = Setup(ctx)
    if s.m == 0:
        return s.finish([{"placement": np.zeros(0, np.int32), "estimated_s": 0.0,
                          "unplaceable": []}], {"favourite_children": "none"})
    pb = Problem(ctx)
    limit = option_values("m_sct", ctx.options)["lp_max_edges"]
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
        best, ends = earliest(run, a, b, eligible)
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

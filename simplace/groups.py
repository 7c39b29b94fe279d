"""Groupings of ops: "these ops run on the same device" constraints, and quotient graphs.

A grouping is ``int32[M]``: a group id per op. Placers place groups; ``expand`` turns a
group placement back into an op placement, and simulation always runs on the original
graph with that expansion. ``coarsen`` builds the quotient OpGraph for algorithms that
need a smaller DAG.

Which rules keep the quotient acyclic (so ``coarsen`` accepts them):
  * ``chain_collapse`` (rule b) contracts edges u -> v where v has exactly one
    predecessor. The contracted edges form out-trees, and a tree can only be entered at
    its root, so a quotient cycle would be a cycle of the original graph.
  * ``colocate_free_ops`` (rule a) contracts the same kind of edge (a no-work op with one
    predecessor) and merges a no-work op with no predecessor into its *earliest*
    consumer; such a source adds no entry to its group, and any path out of it reaches
    only later consumers, so the argument above still holds. Rules a and b together are
    acyclic.
  * ``target_count`` (rule d) cuts a topological order of an acyclic quotient into
    contiguous ranges, which is always acyclic.
  * ``by_module`` (rule c) and ``colocate_gradients`` (rule e) can make cycles: a module
    used twice (a shared embedding), or a layer's backward ops joined with its forward ops
    (forward A -> forward B -> backward B -> backward A). They are valid placement
    constraints but ``coarsen`` refuses their quotient.
"""

from __future__ import annotations

import collections
import numbers

import numpy as np
from networkx.utils import UnionFind

from simplace._per_graph import per_graph
from simplace.errors import GraphError, GroupingError
from simplace.graph import OpGraph, split_name_path


def normalize(groups) -> np.ndarray:
    """Relabel group ids densely 0..G-1 in order of first appearance."""
    groups = np.asarray(groups).reshape(-1)
    if groups.size == 0:
        return np.zeros(0, dtype=np.int32)
    _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse].astype(np.int32)


def members(groups, num_groups: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(order, ptr)``, int64: the ops of group g are ``order[ptr[g]:ptr[g + 1]]``, for
    groups ``0..num_groups-1`` (default: up to the largest id; a group may be empty)."""
    groups = np.asarray(groups, dtype=np.int64).reshape(-1)
    n = int(groups.max()) + 1 if num_groups is None else int(num_groups)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(groups, minlength=n), out=ptr[1:])
    return np.argsort(groups, kind="stable").astype(np.int64), ptr


def distinct_groupings(named, num_ops: int) -> list[tuple[str, np.ndarray]]:
    """Of ``(name, groups)`` pairs (dense ids), those of 2 to ``num_ops - 1`` groups, each
    distinct grouping once (under its first name), as int64: the groupings a search moves
    whole groups of (one group, or single ops, would move nothing new)."""
    out, seen = [], set()
    for name, groups in named:
        groups = np.asarray(groups, dtype=np.int64).reshape(-1)
        key = groups.tobytes()
        if not 2 <= int(groups.max()) + 1 < num_ops or key in seen:
            continue
        seen.add(key)
        out.append((name, groups))
    return out


def check_groups(graph: OpGraph, groups) -> np.ndarray:
    """Validate a grouping for ``graph`` and return it as int32[M] (not relabelled)."""
    arr = np.asarray(groups)
    if arr.ndim != 1 or len(arr) != graph.num_ops:
        raise GroupingError(
            f"A grouping needs one group id per op: got shape {arr.shape} for a graph of "
            f"{graph.num_ops} ops."
        )
    if arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0):
        raise GroupingError("Group ids must be non-negative integers.")
    return arr.astype(np.int32)


def _union_from(graph: OpGraph, groups) -> UnionFind:
    """A union-find over the ops 0..M-1 with the groups of ``groups`` (None: singletons)
    already joined; the rules add their merges, then ``_labels`` reads it."""
    uf = UnionFind(range(graph.num_ops))
    if groups is not None:
        groups = check_groups(graph, groups)
        members = collections.defaultdict(list)
        for i, g in enumerate(groups.tolist()):
            members[g].append(i)
        for ops in members.values():
            uf.union(*ops)
    return uf


def _labels(uf: UnionFind, num_ops: int) -> np.ndarray:
    """Group ids of a union-find over ops 0..num_ops-1, numbered by first op (normalize),
    so they do not depend on which member the union-find made each set's root."""
    return normalize(np.array([uf[i] for i in range(num_ops)], dtype=np.int64))


def _distinct_preds(graph: OpGraph) -> list[list[int]]:
    """Each op's distinct producer ops, sorted (computed once per graph: not to be
    modified)."""
    def make():
        preds = [set() for _ in range(graph.num_ops)]
        for s, d in zip(graph.src.tolist(), graph.dst.tolist(), strict=True):
            preds[d].add(s)
        return [sorted(p) for p in preds]

    return per_graph(graph, "distinct_preds", make)


def _key(groups):
    """A grouping argument as part of a ``per_graph`` key (None: singletons)."""
    if groups is None:
        return None
    arr = np.asarray(groups)
    return (arr.dtype.str, arr.shape, arr.tobytes())


def singletons(graph: OpGraph) -> np.ndarray:
    """Every op its own group."""
    return np.arange(graph.num_ops, dtype=np.int32)


def no_work(graph: OpGraph) -> np.ndarray:
    """bool[M]: ops that do no arithmetic (reshape, broadcast, convert, transpose...)."""
    return graph.flops == 0


def colocate_free_ops(graph: OpGraph, groups=None) -> np.ndarray:
    """Rule (a): an op that does no work joins its producer, or its earliest consumer.

    A no-work op with exactly one producer op joins it; one with no producer op (it reads
    only inputs, parameters or constants) joins its earliest consumer. A no-work op with
    several producers stays where it is, since joining any of them could make a cycle.
    """
    return per_graph(graph, ("colocate_free_ops", _key(groups)),
                     lambda: _colocate_free_ops(graph, groups)).copy()


def _colocate_free_ops(graph: OpGraph, groups) -> np.ndarray:
    uf = _union_from(graph, groups)
    preds = _distinct_preds(graph)
    free = no_work(graph)
    ptr, order = graph.out_edges
    for i in np.flatnonzero(free).tolist():
        if len(preds[i]) == 1:
            uf.union(preds[i][0], i)
        elif not preds[i]:
            consumers = graph.dst[order[ptr[i]:ptr[i + 1]]]
            if consumers.size:
                uf.union(i, int(consumers.min()))
    return _labels(uf, graph.num_ops)


def chain_collapse(graph: OpGraph, groups=None) -> np.ndarray:
    """Rule (b), HSDAG's coarsening: merge an op into its successor when that successor
    has exactly one predecessor op."""
    return per_graph(graph, ("chain_collapse", _key(groups)),
                     lambda: _chain_collapse(graph, groups)).copy()


def _chain_collapse(graph: OpGraph, groups) -> np.ndarray:
    uf = _union_from(graph, groups)
    for v, p in enumerate(_distinct_preds(graph)):
        if len(p) == 1:
            uf.union(p[0], v)
    return _labels(uf, graph.num_ops)


def by_module(graph: OpGraph, depth: int, *, join_backward: bool = False) -> np.ndarray:
    """Rule (c): one group per module path cut at ``depth`` components.

    Backward ops form their own groups (``backward/`` + path) unless ``join_backward``,
    which puts them with the forward ops of the same path (see ``colocate_gradients``).
    May make a cyclic quotient (see the module docstring).
    """
    if depth < 0:
        raise GroupingError(f"depth must be >= 0, got {depth}.")
    # Each distinct path is split once (a graph has far fewer paths than ops), and the
    # groups are numbered in order of their first op.
    paths, first, inverse = np.unique(np.asarray(graph.name_path, dtype=object),
                                      return_index=True, return_inverse=True)
    index, label = {}, np.empty(len(paths), np.int32)
    for u in np.argsort(first, kind="stable").tolist():
        backward, parts = split_name_path(paths[u])
        label[u] = index.setdefault((backward and not join_backward, parts[:depth]),
                                    len(index))
    return label[np.asarray(inverse).reshape(-1)]


def colocate_gradients(graph: OpGraph, groups=None) -> np.ndarray:
    """Rule (e): backward ops join the forward ops of their module path, as TensorFlow's
    ``colocate_gradients_with_ops`` and Baechi do.

    The trace links a gradient op to its forward op only through the module path, so the
    path is the unit matched: all forward ops of a path and the backward ops of that path
    (or of its longest prefix that has forward ops) form one group. Backward ops whose
    path names no forward op keep their group. The quotient is generally cyclic: use it
    as a placement constraint, not with ``coarsen``.
    """
    uf = _union_from(graph, groups)
    forward_of = {}
    paths = [split_name_path(p) for p in graph.name_path.tolist()]
    for i, (backward, parts) in enumerate(paths):
        if not backward and parts:
            if parts in forward_of:
                uf.union(forward_of[parts], i)
            else:
                forward_of[parts] = i
    for i, (backward, parts) in enumerate(paths):
        if backward:
            for k in range(len(parts), 0, -1):
                j = forward_of.get(parts[:k])
                if j is not None:
                    uf.union(j, i)
                    break
    return _labels(uf, graph.num_ops)


def target_count(graph: OpGraph, num_groups: int, groups=None, weights=None) -> np.ndarray:
    """Rule (d): merge groups into at most ``num_groups`` groups of balanced weight.

    Takes a topological order of the (acyclic) quotient of ``groups`` and cuts it into
    contiguous ranges, which keeps the quotient acyclic. ``weights`` (float[M], default
    ``flops``, or op counts when the graph has no flops) is what is balanced.
    """
    if isinstance(num_groups, bool) or not isinstance(num_groups, numbers.Integral) \
            or num_groups < 1:
        raise GroupingError(f"num_groups must be an integer >= 1, got {num_groups!r}.")
    base = normalize(singletons(graph) if groups is None else check_groups(graph, groups))
    if graph.num_ops == 0 or num_groups >= int(base.max()) + 1:
        return base  # as many groups as asked, or more: nothing to merge
    w = np.asarray(graph.flops if weights is None else weights, dtype=np.float64)
    if len(w) != graph.num_ops:
        raise GroupingError(f"weights needs {graph.num_ops} entries, got {len(w)}.")
    if w.sum() <= 0:
        w = np.ones(graph.num_ops)
    num_base = int(base.max()) + 1
    order = _quotient_order(graph, base)
    group_w = np.bincount(base, weights=w, minlength=num_base)[order]
    # Cut where the cumulative weight crosses k/num_groups of the total; each range gets
    # at least one group.
    cum = np.cumsum(group_w)
    total = cum[-1]
    targets = total * np.arange(1, num_groups) / num_groups
    cuts = np.searchsorted(cum, targets, side="left") + 1
    cuts = np.unique(np.clip(cuts, 1, num_base))
    cuts = cuts[cuts < num_base]
    chunk_of_rank = np.zeros(num_base, dtype=np.int32)
    chunk_of_rank[cuts] = 1
    chunk_of_rank = np.cumsum(chunk_of_rank)
    chunk = np.empty(num_base, dtype=np.int32)
    chunk[order] = chunk_of_rank
    return normalize(chunk[base])


def expand(groups, group_placement) -> np.ndarray:
    """Op placement int32[M] from a placement of groups (``group_placement[groups]``)."""
    groups = _int_entries(groups, "groups", "a group index")
    gp = _int_entries(group_placement, "group_placement", "a device index")
    if groups.size and (gp.ndim != 1 or gp.shape[0] <= int(groups.max())):
        raise GroupingError(
            f"The group placement has {gp.shape[0] if gp.ndim else 0} entries but the "
            f"grouping uses {int(groups.max()) + 1} groups: give one device per group."
        )
    return gp[groups].astype(np.int32)


def _int_entries(values, name: str, what: str) -> np.ndarray:
    """A 1-D int64 array of non-negative integers, or GroupingError: booleans and
    fractions are refused rather than truncated, negatives rather than wrapped."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise GroupingError(f"{name} must be a 1-D list, {what} per entry; got shape "
                            f"{arr.shape}.")
    if arr.size and arr.dtype.kind not in "iu":
        whole = arr.dtype.kind == "f" and bool(np.all(np.isfinite(arr))
                                               and np.all(arr == np.round(arr)))
        if not whole:
            k = 0 if arr.dtype.kind != "f" else int(np.flatnonzero(
                ~np.isfinite(arr) | (arr != np.round(arr)))[0])
            raise GroupingError(f"{name} entry {k} is {arr[k].item()!r}: each entry must be "
                                f"{what} (an integer >= 0).")
    if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(np.int32).max):
        k = int(np.argmin(arr)) if arr.min() < 0 else int(np.argmax(arr))
        raise GroupingError(f"{name} entry {k} is {arr[k].item()!r}: each entry must be {what} "
                            f"(an integer >= 0 that fits int32).")
    return arr.astype(np.int64)


def _quotient_edges(graph: OpGraph, groups: np.ndarray):
    cross = groups[graph.src] != groups[graph.dst]
    return groups[graph.src[cross]], groups[graph.dst[cross]], np.flatnonzero(cross)


def _quotient_order(graph: OpGraph, groups: np.ndarray) -> np.ndarray:
    from simplace.graph import find_cycle, topological_order

    n = int(groups.max()) + 1 if groups.size else 0
    gs, gd, _ = _quotient_edges(graph, groups)
    order = topological_order(n, gs, gd)
    if order is None:
        cycle = find_cycle(n, gs, gd)
        raise GroupingError(
            f"This grouping's quotient graph has a cycle through groups {cycle}: some path "
            "leaves a group and comes back into it. Groups from chain_collapse, "
            "colocate_free_ops and target_count are always acyclic; by_module and "
            "colocate_gradients can make cycles (use them as placement constraints, not "
            "with coarsen)."
        )
    return order


def coarsen(graph: OpGraph, groups) -> OpGraph:
    """The quotient OpGraph of a grouping: one op per group, costs summed, internal edges
    dropped.

    Quotient op ``q`` stands for the original ops ``meta['op_to_group'] == q``; a placement
    of the quotient expands back with ``expand(meta['op_to_group'], placement)``. Its ops
    record no shapes (``in_avals``, ``out_avals`` and ``attrs`` are None); its parameters
    keep theirs (``param_avals``).
    Raises GroupingError when the quotient would have a cycle.
    """
    groups = normalize(check_groups(graph, groups))
    if graph.num_ops == 0:
        return graph
    order = _quotient_order(graph, groups)
    n = len(order)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    q = rank[groups]  # quotient index of each op, in topological order
    members = collections.defaultdict(list)
    for i, g in enumerate(q.tolist()):
        members[g].append(i)

    ops, paths, sigs = [], [], []
    for g in range(n):
        idx = members[g]
        prims = collections.Counter(graph.op[idx].tolist())
        ops.append(prims.most_common(1)[0][0] if len(idx) == 1 else "group")
        paths.append(_common_path([graph.name_path[i] for i in idx]))
        sigs.append(graph.signature[idx[0]] if len(idx) == 1 else
                    "group|" + "|".join(sorted(set(graph.signature[idx].tolist()))))
    sums = {f: np.bincount(q, weights=getattr(graph, f), minlength=n)
            for f in ("flops", "bytes_accessed", "out_bytes")}
    is_output = np.bincount(q, weights=graph.is_output, minlength=n) > 0

    # One quotient edge per distinct tensor crossing groups; a tensor is (src op, output).
    cross = q[graph.src] != q[graph.dst]
    s_op, o, d_op = graph.src[cross], graph.edge_output[cross], graph.dst[cross]
    b = graph.edge_bytes[cross]
    tensor_ids: dict[tuple[int, int], int] = {}
    per_group_out: dict[int, int] = collections.Counter()
    edges = {}
    for so, oo, do, bb in zip(s_op.tolist(), o.tolist(), d_op.tolist(), b.tolist(),
                              strict=True):
        gs = int(q[so])
        if (so, oo) not in tensor_ids:
            tensor_ids[(so, oo)] = per_group_out[gs]
            per_group_out[gs] += 1
        key = (gs, int(q[do]), tensor_ids[(so, oo)])
        edges[key] = max(edges.get(key, 0.0), bb)
    keys = sorted(edges)
    uses = sorted({(int(q[op]), int(p)) for op, p in
                   zip(graph.param_op.tolist(), graph.param_index.tolist(), strict=True)})
    try:
        return OpGraph(
            op=ops, name_path=paths, signature=sigs, is_output=is_output, **sums,
            src=[k[0] for k in keys], dst=[k[1] for k in keys],
            edge_output=[k[2] for k in keys], edge_bytes=[edges[k] for k in keys],
            param_names=graph.param_names, param_sizes=graph.param_sizes,
            param_op=[u[0] for u in uses], param_index=[u[1] for u in uses],
            # A group has no one primitive, so no operand shapes or parameters: its shape
            # fields stay unrecorded (None); the parameters are the same tensors.
            in_avals=None, out_avals=None, attrs=None, param_avals=graph.param_avals,
            name=f"{graph.name}/coarse{n}" if graph.name else f"coarse{n}",
            meta={"coarsened_from": graph.hash, "op_to_group": q.tolist()},
        )
    except GraphError as err:  # cannot happen for an acyclic quotient; say so if it does
        raise GroupingError(f"Could not build the quotient graph: {err}") from None


def _common_path(paths: list[str]) -> str:
    split = [p.split("/") for p in paths]
    common = []
    for parts in zip(*split, strict=False):
        if all(x == parts[0] for x in parts):
            common.append(parts[0])
        else:
            break
    return "/".join(common)

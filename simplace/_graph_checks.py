"""The checks an OpGraph passes at construction: per-op, per-edge and per-parameter
fields of matching lengths, sizes finite and within bounds, indices in range, edges
forward (a topological order) and unique, and recorded shapes that agree with the byte
counts."""

from __future__ import annotations

import numpy as np

from simplace._graph_fields import (
    _EDGE_FIELDS,
    _OP_FLOAT_FIELDS,
    _OP_SHAPE_FIELDS,
    _OP_STR_FIELDS,
    MAX_BYTES,
    MAX_FLOPS,
    Aval,
)
from simplace._graph_order import find_cycle
from simplace.errors import GraphError


# ------------------------------------------------------------------ validation
def check_graph(g) -> None:
    """Raise GraphError saying what is wrong with OpGraph ``g``'s fields, if anything."""
    m, e, p = g.num_ops, g.num_edges, g.num_params
    for f in _OP_STR_FIELDS + _OP_FLOAT_FIELDS + ("is_output",):
        if len(getattr(g, f)) != m:
            raise GraphError(
                f"OpGraph field '{f}' has length {len(getattr(g, f))} but 'op' has {m}: "
                "every per-op field needs one entry per op."
            )
    for f in _EDGE_FIELDS:
        if len(getattr(g, f)) != e:
            raise GraphError(
                f"OpGraph edge field '{f}' has length {len(getattr(g, f))} but 'src' "
                f"has {e}: every per-edge field needs one entry per edge."
            )
    if len(g.param_sizes) != p:
        raise GraphError(
            f"'param_sizes' has {len(g.param_sizes)} entries but 'param_names' has {p}."
        )
    if len(g.param_index) != len(g.param_op):
        raise GraphError(
            f"'param_op' has {len(g.param_op)} entries but 'param_index' has "
            f"{len(g.param_index)}: each parameter use is one (op, parameter) pair."
        )
    for f in _OP_FLOAT_FIELDS + ("edge_bytes", "param_sizes"):
        v = getattr(g, f)
        top = MAX_FLOPS if f == "flops" else MAX_BYTES
        bad = np.flatnonzero(~np.isfinite(v) | (v < 0) | (v > top))
        if bad.size:
            i = int(bad[0])
            where = f"op {i} ({g.op[i]} at '{g.name_path[i]}')" if (
                f in _OP_FLOAT_FIELDS) else f"entry {i}"
            raise GraphError(
                f"OpGraph field '{f}' must be finite and >= 0, and at most {top:g} (more "
                f"than any op of a real model {'computes' if f == 'flops' else 'moves'}"
                f"), but {where} is {float(v[i])!r} ({bad.size} bad entries in all): check "
                "its units."
            )
    for f, n, what in (("src", m, "op"), ("dst", m, "op"), ("param_op", m, "op"),
                       ("param_index", p, "parameter")):
        v = getattr(g, f)
        bad = np.flatnonzero((v < 0) | (v >= n))
        if bad.size:
            raise GraphError(
                f"OpGraph field '{f}' entry {int(bad[0])} is {int(v[bad[0]])}, not a valid "
                f"{what} index (there are {n} {what}s)."
            )
    for f in _OP_SHAPE_FIELDS:
        v = getattr(g, f)
        if v is not None and len(v) != m:
            raise GraphError(f"OpGraph field '{f}' has {len(v)} entries but 'op' has {m}: "
                             "give one entry per op, or None when not known.")
    if g.param_avals is not None:
        if len(g.param_avals) != p:
            raise GraphError(f"'param_avals' has {len(g.param_avals)} entries but "
                             f"'param_names' has {p}.")
        for k, a in enumerate(g.param_avals):
            if a.nbytes != g.param_sizes[k]:
                raise GraphError(
                    f"Parameter {k} ('{g.param_names[k]}') has shape {a.shape} of "
                    f"{a.dtype} ({a.nbytes} bytes) in 'param_avals' but "
                    f"'param_sizes' says {g.param_sizes[k]:g} bytes.")
    if e and np.any(g.edge_output < 0):
        raise GraphError("'edge_output' must be >= 0 (an output index of the producer).")
    self_loops = np.flatnonzero(g.src == g.dst)
    if self_loops.size:
        i = int(g.src[self_loops[0]])
        raise GraphError(f"Edge {int(self_loops[0])} is a self-loop on op {i}: "
                         "an op cannot consume its own output.")
    backward = np.flatnonzero(g.src > g.dst)
    if backward.size:
        cycle = find_cycle(m, g.src, g.dst)
        if cycle:
            path = " -> ".join(f"{i} ({g.op[i]})" for i in cycle)
            raise GraphError(f"The graph has a cycle: {path}. A computation graph must be "
                             "acyclic; remove one of these edges.")
        k = int(backward[0])
        raise GraphError(
            f"Ops are not in a topological order: edge {k} goes from op {int(g.src[k])} "
            f"to op {int(g.dst[k])}. Build the graph with OpGraph.from_unordered(...), "
            "which sorts the ops topologically."
        )
    if e:
        key = (g.src.astype(np.int64) * (m + 1) + g.dst) * (int(
            g.edge_output.max()) + 1) + g.edge_output
        if np.unique(key).size != e:
            raise GraphError("Duplicate edges: an (src, dst, edge_output) triple appears "
                             "twice. Keep one edge per tensor an op consumes.")
    if g.out_avals is not None:
        _check_out_avals(g)


def _check_out_avals(g) -> None:
    """Output shapes agree with the byte counts: an op's outputs add up to its
    ``out_bytes``, and every edge carries an output the producer has, of its size."""
    # Over the distinct rows (ops with equal outputs share one tuple), then in numpy:
    # graphs have tens of thousands of ops and edges.
    seen: dict[int, int] = {}
    distinct: list[tuple[Aval, ...]] = []
    row_id = np.empty(g.num_ops, dtype=np.int64)
    for i, row in enumerate(g.out_avals):
        k = seen.get(id(row))
        if k is None:
            k = seen[id(row)] = len(distinct)
            distinct.append(row)
        row_id[i] = k
    total = np.array([sum(a.nbytes for a in r) for r in distinct] + [0], dtype=np.float64)
    bad = np.flatnonzero(total[row_id] != g.out_bytes)
    if bad.size:
        i = int(bad[0])
        raise GraphError(
            f"Op {i} ({g.op[i]} at '{g.name_path[i]}'): its 'out_avals' add up to "
            f"{total[row_id[i]]:g} bytes but 'out_bytes' says {g.out_bytes[i]:g}.")
    if not g.num_edges:
        return
    lens = np.array([len(r) for r in distinct], dtype=np.int64)
    ptr = np.concatenate([[0], np.cumsum(lens)])
    flat = np.array([a.nbytes for r in distinct for a in r] + [0], dtype=np.float64)
    rs, eo = row_id[g.src], g.edge_output.astype(np.int64)
    bad = np.flatnonzero(eo >= lens[rs])
    if bad.size:
        k = int(bad[0])
        s_, o = int(g.src[k]), int(eo[k])
        raise GraphError(f"Edge {k} carries output {o} of op {s_} ({g.op[s_]}), which "
                         f"has {lens[rs[k]]} output(s) in 'out_avals'.")
    bad = np.flatnonzero(flat[ptr[rs] + eo] != g.edge_bytes)
    if bad.size:
        k = int(bad[0])
        s_, o = int(g.src[k]), int(eo[k])
        a = g.out_avals[s_][o]
        raise GraphError(
            f"Edge {k} carries output {o} of op {s_} ({g.op[s_]}): {a.shape} of "
            f"{a.dtype} is {a.nbytes} bytes but 'edge_bytes' says {g.edge_bytes[k]:g}.")

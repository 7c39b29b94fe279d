"""The layer graph PaSE searches over, read off an OpGraph's module paths.

A *layer* is a group of forward ops (with the backward ops of the same module path
attributed to it) that share one *iteration space*: named dimensions with sizes that a
configuration splits. Layers are found from the trace's ``name_path``:

* an LSTM module (a path ``P`` with ``P/input`` and ``P/recurrent`` matmuls, as the
  zoo's RNNLM and NMT) is one layer over all its unrolled time steps (kind ``lstm``);
* every other module path is one layer (a shared Dense called once per step stays one
  layer); if that would make the layer graph cyclic (glue ops of a parent module called
  between its children, like AlexNet's pooling), the path is cut into its connected
  pieces, ``path#0``, ``path#1``...

The kind of a layer follows from its ops: ``conv`` (a convolution; dims n, co, h, w, ci),
``matmul`` (a dot_general with a parameter operand, e.g. Dense; dims: the activation's
free dims, n, k), ``attention`` (two activation-activation dot_generals: scores and
context; dims b, h, q, k, d, of which b, h, q split), ``embedding`` (a gather from a
parameter table; dims of the ids, d, v), ``pool`` (reduce_window), ``elementwise``
(everything else made of elementwise, reduction and data-movement ops; dims = the
shape of its largest boundary tensor) and ``unsupported`` (loops, conditionals, sorts and
other ops PaSE has no split rule for): such layers keep one configuration, replicated.

Each layer lists its *tensors*: for every edge crossing the layer boundary, which layer
dimension each tensor axis follows (by shape alignment against the layer's canonical
input or output shape: equal shapes map axis to axis, a reshape maps the major axis of
each merged group, otherwise axes of equal size are matched in order).

Shapes, dtypes and primitive parameters are read from the graph's data (``in_avals``,
``out_avals``, ``param_avals``, ``attrs``), never from signature text; a graph without
them (hand-built, coarsened) cannot be parallelized.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import networkx as nx
import numpy as np

from simplace.cost_model import CostModel, op_classes
from simplace.errors import ParallelizeError
from simplace.graph import BACKWARD_PREFIX, Aval, OpGraph, split_name_path

__all__ = ["Layer", "LayerGraph", "ParallelizeError", "Tensor", "build_layer_graph"]


# Primitives PaSE has no split rule for: a layer holding one is replicated.
_UNSUPPORTED = frozenset({"scan", "while", "cond", "sort", "top_k", "cumsum", "cumprod",
                          "cummax", "cummin", "cumlogsumexp", "argsort", "custom_call",
                          "fft", "eigh", "svd", "qr", "lu", "cholesky", "triangular_solve",
                          "custom_jvp_call", "custom_vjp_call", "shard_map"})
KINDS = ("conv", "matmul", "attention", "lstm", "embedding", "pool", "elementwise",
         "unsupported")


def _inputs(graph: OpGraph, i: int) -> tuple[Aval, ...]:
    """Op ``i``'s operands (shape, dtype, itemsize), in the primitive's order."""
    return graph.in_avals[i]


def _attr(graph: OpGraph, i: int, name: str, default=None):
    """Parameter ``name`` of op ``i``'s primitive (``attrs``), ``default`` if absent."""
    return default if graph.attrs is None else graph.attrs[i].get(name, default)


def _flat_ints(v) -> list[int]:
    """The integers of a nested parameter value (tuples of tuples of ints), in order."""
    if isinstance(v, bool):
        return []
    if isinstance(v, int):
        return [v]
    if isinstance(v, tuple):
        return [x for item in v for x in _flat_ints(item)]
    return []


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A tensor at a layer boundary (or a parameter) and the layer dims its axes follow.

    shape: the tensor's shape (``()`` when unknown); nbytes: its size in bytes;
    axis_dims: per axis, the index of the layer dimension the axis is split with, or -1
    (never split); edge: the OpGraph edge index it travels on (-1 for parameters);
    param: the parameter index (-1 for activations); role: ``"in"``, ``"out"`` or
    ``"param"``; first: False for a later edge carrying a tensor the layer already
    listed (one producer output read by several ops), which costs nothing again;
    is_float: whether it has a gradient (integer ids do not).
    """

    shape: tuple[int, ...]
    nbytes: float
    axis_dims: tuple[int, ...]
    role: str
    edge: int = -1
    param: int = -1
    first: bool = True
    is_float: bool = True

    def dims(self) -> frozenset[int]:
        """The layer dims that some axis of this tensor is split with."""
        return frozenset(d for d in self.axis_dims if d >= 0)


@dataclasses.dataclass(frozen=True)
class Layer:
    """One vertex of the layer graph.

    name: module path (``#k`` suffix for a path cut into pieces); kind: one of ``KINDS``;
    dim_names, dim_sizes: the iteration space; splittable: per dim, whether a
    configuration may split it; batch_dim: index of the batch dim or -1; ops: forward op
    indices; backward_ops: the attributed backward op indices; time_s: seconds of all
    those ops on one reference device; overhead_s: the part of ``time_s`` that is per-op
    overhead (each op's class overhead inside a segment; does not shrink when split);
    tensors: boundary tensors and parameters; steps: time steps of an LSTM layer (1
    otherwise); window: kernel or pooling window along (h, w) for halo exchange
    (``(1, 1)`` when none).
    """

    name: str
    kind: str
    dim_names: tuple[str, ...]
    dim_sizes: tuple[int, ...]
    splittable: tuple[bool, ...]
    batch_dim: int
    ops: tuple[int, ...]
    backward_ops: tuple[int, ...]
    time_s: float
    overhead_s: float
    tensors: tuple[Tensor, ...]
    itemsize: int = 4
    steps: int = 1
    window: tuple[int, int] = (1, 1)

    def dim(self, name: str) -> int:
        """Index of the dim called ``name``, -1 if none."""
        return self.dim_names.index(name) if name in self.dim_names else -1


@dataclasses.dataclass(frozen=True)
class LayerGraph:
    """Layers in a topological order and the edges between them.

    edges: ``(src_layer, dst_layer, src_tensor, dst_tensor)``, one per OpGraph tensor
    that crosses from one layer to another; the tensor indices point into
    ``layers[src].tensors`` and ``layers[dst].tensors``. training: whether the graph has
    a backward pass (costs then count gradients). unattributed_time_s: op time no layer
    owns (backward ops of no known path), added to every strategy alike.
    """

    layers: tuple[Layer, ...]
    edges: tuple[tuple[int, int, int, int], ...]
    training: bool
    unattributed_time_s: float
    batch_size: int
    graph_name: str = ""

    @property
    def unsupported(self) -> list[str]:
        """Names of the layers of kind ``unsupported``."""
        return [lay.name for lay in self.layers if lay.kind == "unsupported"]

    def neighbours(self) -> list[set[int]]:
        """Per layer, the set of layers it shares an edge with (either way, no self-loops)."""
        nb: list[set[int]] = [set() for _ in self.layers]
        for s, d, _, _ in self.edges:
            if s != d:
                nb[s].add(d)
                nb[d].add(s)
        return nb


# --------------------------------------------------------------------------- alignment
def align(shape: tuple[int, ...], canon: tuple[int, ...], dims: tuple[int, ...]) -> tuple:
    """Per axis of ``shape``, the layer dim it follows, given a canonical shape ``canon``
    whose axes follow ``dims``: identical shapes map axis to axis; a reshape (equal
    element counts) maps each merged group's major axis; equal ranks map by position;
    otherwise axes of equal size are matched in order."""
    if not shape:
        return ()
    if tuple(shape) == tuple(canon):
        return tuple(dims)
    if math.prod(shape) == math.prod(canon) and canon:
        out = [-1] * len(shape)
        i = j = 0
        while i < len(shape) and j < len(canon):
            a, b = shape[i], canon[j]
            i0, j0 = i, j
            i += 1
            j += 1
            while a != b:
                if a < b and i < len(shape):
                    a *= shape[i]
                    i += 1
                elif b < a and j < len(canon):
                    b *= canon[j]
                    j += 1
                else:
                    break
            if a == b and shape[i0] > 1:
                # the major axes of a merged group split alike: block k of one is block k
                # of the other when the split divides the major axis
                out[i0] = dims[j0] if canon[j0] > 1 or i - i0 == 1 else -1
        return tuple(out)
    if len(shape) == len(canon):
        return tuple(dims)
    out = [-1] * len(shape)
    j = 0
    for i, n in enumerate(shape):
        for jj in range(j, len(canon)):
            if canon[jj] == n:
                out[i] = dims[jj]
                j = jj + 1
                break
    return tuple(out)


# --------------------------------------------------------------------------- grouping
def _lstm_prefixes(graph: OpGraph, forward: np.ndarray) -> list[str]:
    paths = {str(p) for p, f, o in zip(graph.name_path, forward, graph.op, strict=True)
             if f and o == "dot_general"}
    out = []
    for p in paths:
        if p.endswith("/recurrent"):
            base = p[: -len("/recurrent")]
            if base + "/input" in paths:
                out.append(base)
    return sorted(out, key=len, reverse=True)


def _group_ops(graph: OpGraph, forward: np.ndarray, lstm: list[str]):
    """Forward op -> group id, group keys; acyclic quotient."""
    m = graph.num_ops

    def key_of(path: str) -> str:
        for base in lstm:
            if path == base or path.startswith(base + "/"):
                return base
        return path

    keys = [key_of(str(p)) if forward[i] else None for i, p in enumerate(graph.name_path)]
    fwd_edges = [(int(s), int(d)) for s, d in zip(graph.src, graph.dst, strict=True)
                 if forward[s] and forward[d]]
    # start from one group per key, cut cyclic keys into connected pieces
    label = {}
    for i in range(m):
        if keys[i] is not None:
            label[i] = (keys[i], 0)
    param_keys = {keys[int(o)] for o in graph.param_op.tolist() if keys[int(o)] is not None}
    for attempt in range(6):
        q = nx.DiGraph()
        q.add_nodes_from(set(label.values()))
        for s, d in fwd_edges:
            if label[s] != label[d]:
                q.add_edge(label[s], label[d])
        bad = [c for c in nx.strongly_connected_components(q) if len(c) > 1]
        if not bad:
            break
        cut = set().union(*bad)
        if attempt == 0:
            # first cut only glue (paths without parameters): a shared Dense called once
            # per step stays one layer when the glue around it is what closes the cycle
            glue = {lab for lab in cut if lab[0] not in param_keys}
            cut = glue or cut
        # each group in the cycle splits into its connected pieces (forward edges inside
        # the group), a piece named after its first op
        pieces = nx.Graph()
        pieces.add_nodes_from(i for i in label if label[i] in cut)
        pieces.add_edges_from((s, d) for s, d in fwd_edges
                              if label[s] == label[d] and label[s] in cut)
        for piece in list(nx.connected_components(pieces)):
            r = min(piece)
            for i in piece:
                # after a few rounds, one op per group: a DAG of single ops is acyclic
                label[i] = (label[i][0], (i if attempt >= 4 else r) + 1)
    else:
        raise ParallelizeError("Could not cut the layer graph into an acyclic graph.")
    # dense ids in topological order (by first op)
    first: dict[tuple, int] = {}
    for i in sorted(label):
        first.setdefault(label[i], i)
    order = sorted(first, key=first.get)
    gid = {lab: k for k, lab in enumerate(order)}
    group = np.full(m, -1, dtype=np.int64)
    for i, lab in label.items():
        group[i] = gid[lab]
    counts = defaultdict(int)
    for lab in order:
        counts[lab[0]] += 1
    seen = defaultdict(int)
    names = []
    for lab in order:
        k = lab[0] or "(root)"
        if counts[lab[0]] > 1:
            names.append(f"{k}#{seen[lab[0]]}")
            seen[lab[0]] += 1
        else:
            names.append(k)
    return group, names, [lab[0] for lab in order], key_of


def _param_shapes(graph: OpGraph, k: int) -> list[tuple[int, ...]]:
    """Shapes parameter ``k`` may have: its own when the graph records it, else the input
    shapes of the ops reading it with its byte size."""
    if graph.param_avals is not None:
        return [graph.param_avals[k].shape]
    nbytes = graph.param_sizes[k]
    out = []
    for u in np.flatnonzero(graph.param_index == k):
        for a in _inputs(graph, int(graph.param_op[u])):
            if a.nbytes == nbytes and a.shape not in out:
                out.append(a.shape)
    return out


# --------------------------------------------------------------------------- per kind
@dataclasses.dataclass
class _Space:
    kind: str
    names: list[str]
    sizes: list[int]
    splittable: list[bool]
    canon_in: list[tuple[tuple[int, ...], tuple[int, ...]]]  # (shape, dims) candidates
    canon_out: tuple[tuple[int, ...], tuple[int, ...]]
    main_operands: dict = dataclasses.field(default_factory=dict)  # param shape -> dims
    itemsize: int = 4
    steps: int = 1
    window: tuple[int, int] = (1, 1)


def _dot_space(graph: OpGraph, i: int, param_rhs: bool, batch: int) -> _Space | None:
    avals = _inputs(graph, i)
    if len(avals) < 2:
        return None
    isz, ls, rs = avals[0].itemsize, avals[0].shape, avals[1].shape
    # dimension_numbers = (((lhs contracting), (rhs contracting)), ((lhs batch), (rhs batch)))
    try:
        (lc, rc), (lb, rb) = _attr(graph, i, "dimension_numbers")
    except (TypeError, ValueError):  # not recorded
        return None
    lc, rc, lb, rb = (list(_flat_ints(x)) for x in (lc, rc, lb, rb))
    lfree = [a for a in range(len(ls)) if a not in lc and a not in lb]
    rfree = [a for a in range(len(rs)) if a not in rc and a not in rb]
    names, sizes = [], []
    ldims = [-1] * len(ls)
    rdims = [-1] * len(rs)
    for k, (a, b) in enumerate(zip(lb, rb, strict=True)):
        ldims[a] = rdims[b] = len(names)
        names.append("b" if k == 0 else f"g{k}")
        sizes.append(ls[a])
    first_batch = not lb and lfree and lfree[0] == 0 and ls[0] == batch
    for k, a in enumerate(lfree):
        ldims[a] = len(names)
        nm = "b" if (k == 0 and first_batch) else ("t" if k == 1 and first_batch else f"i{k}")
        names.append(nm)
        sizes.append(ls[a])
    for k, a in enumerate(rfree):
        rdims[a] = len(names)
        names.append("n" if k == 0 else f"n{k}")
        sizes.append(rs[a])
    for k, (a, b) in enumerate(zip(lc, rc, strict=True)):
        ldims[a] = rdims[b] = len(names)
        names.append("k" if k == 0 else f"k{k}")
        sizes.append(ls[a])
    out_dims = tuple(range(len(lb))) + tuple(ldims[a] for a in lfree) + tuple(
        rdims[a] for a in rfree)
    out_shape = tuple(sizes[d] for d in out_dims)
    sp = _Space("matmul", names, sizes, [True] * len(names),
                [(tuple(ls), tuple(ldims)), (tuple(rs), tuple(rdims))],
                (out_shape, out_dims), itemsize=isz)
    if param_rhs:
        sp.main_operands[tuple(rs)] = tuple(rdims)
        sp.canon_in = [(tuple(ls), tuple(ldims))]
    return sp


def _conv_space(graph: OpGraph, i: int) -> _Space | None:
    avals = _inputs(graph, i)
    if len(avals) < 2:
        return None
    isz, ls, rs = avals[0].itemsize, avals[0].shape, avals[1].shape
    # ConvDimensionNumbers: lhs_spec (n, c, h, w), rhs_spec (o, i, h, w), out_spec (n, c, h, w)
    dn = _attr(graph, i, "dimension_numbers", {})
    specs = [_flat_ints(dn.get(k)) if hasattr(dn, "get") else []
             for k in ("lhs_spec", "rhs_spec", "out_spec")]
    if len(ls) != 4 or any(len(x) != 4 for x in specs):
        return None
    lhs, rhs, out = specs
    strides = _flat_ints(_attr(graph, i, "window_strides")) or [1, 1]
    pad = _flat_ints(_attr(graph, i, "padding")) or [0, 0, 0, 0]
    n, ci = ls[lhs[0]], ls[lhs[1]]
    hin, win = ls[lhs[2]], ls[lhs[3]]
    co = rs[rhs[0]]
    kh, kw = rs[rhs[2]], rs[rhs[3]]
    ho = max(1, (hin + pad[0] + pad[1] - kh) // strides[0] + 1)
    wo = max(1, (win + pad[2] + pad[3] - kw) // strides[1] + 1)
    names = ["n", "co", "h", "w", "ci"]
    sizes = [n, co, ho, wo, ci]
    ldims = [-1] * 4
    ldims[lhs[0]], ldims[lhs[1]], ldims[lhs[2]], ldims[lhs[3]] = 0, 4, 2, 3
    rdims = [-1] * 4
    rdims[rhs[0]], rdims[rhs[1]] = 1, 4
    odims = [-1] * 4
    oshape = [0] * 4
    for pos, d, s in ((out[0], 0, n), (out[1], 1, co), (out[2], 2, ho), (out[3], 3, wo)):
        odims[pos], oshape[pos] = d, s
    sp = _Space("conv", names, sizes, [True] * 5, [(tuple(ls), tuple(ldims))],
                (tuple(oshape), tuple(odims)), itemsize=isz, window=(kh, kw))
    sp.main_operands[tuple(rs)] = tuple(rdims)
    return sp


def _attention_space(graph: OpGraph, i: int) -> _Space | None:
    """Scores ``dot(q[b,q,h,d], k[b,k,h,d])`` with batch dims (b, h), contracting d."""
    sp = _dot_space(graph, i, False, -1)
    if sp is None or len(sp.names) != 5:
        return None
    # order of dims from _dot_space: batch (b, g1), lhs free (q), rhs free (k), contract
    sp.kind = "attention"
    sp.names = ["b", "h", "q", "k", "d"]
    # Only batch, heads and queries split: splitting keys or head features needs
    # reductions inside the softmax that the cost model does not price.
    sp.splittable = [True, True, True, False, False]
    (qs, qd), (ks, kd) = sp.canon_in
    sp.canon_in = [(qs, qd), (ks, kd)]
    sp.canon_out = (qs, qd)  # context has the queries' shape
    return sp


def _shape_space(kind: str, shape: tuple[int, ...], batch: int, isz: int) -> _Space:
    names = []
    for a, n in enumerate(shape):
        names.append("b" if a == 0 and n == batch else f"x{a}")
    dims = tuple(range(len(shape)))
    return _Space(kind, names, list(shape), [True] * len(shape), [(tuple(shape), dims)],
                  (tuple(shape), dims), itemsize=isz)


# --------------------------------------------------------------------------- build
def build_layer_graph(graph: OpGraph, cost_model: CostModel, device: int = 0) -> LayerGraph:
    """The layer graph of ``graph`` with layer times on device ``device`` of ``cost_model``.

    Raises ParallelizeError when the graph has no forward ops.
    """
    is_bwd = _backward_mask(graph)
    forward = ~is_bwd
    times = cost_model.op_times(graph)[:, device]
    # The per-op part of each op's time, which does not shrink when the op is split:
    # its class's in-segment overhead (elementwise ops fused into a neighbour's loop may
    # have none), never more than the op's whole time.
    overhead_op = np.minimum(
        times, cost_model.devices[device]._overhead_by_class[op_classes(graph)])
    batch = _batch_size(graph, forward)
    lstm = _lstm_prefixes(graph, forward)
    group, names, keys, key_of = _group_ops(graph, forward, lstm)
    ng = len(names)
    members: list[list[int]] = [[] for _ in range(ng)]
    for i in np.flatnonzero(group >= 0):
        members[group[i]].append(int(i))
    bwd_members, bwd_extra_s, unattributed_s = _attribute_backward(
        graph, is_bwd, times, members, keys, key_of)
    # boundary tensors per group
    in_edges: list[list[int]] = [[] for _ in range(ng)]
    out_edges: list[list[int]] = [[] for _ in range(ng)]
    cross = []
    for e in range(graph.num_edges):
        s, d = int(graph.src[e]), int(graph.dst[e])
        gs, gd = group[s], group[d]
        if gs >= 0 and gd >= 0 and gs != gd:
            in_edges[gd].append(e)
            out_edges[gs].append(e)
            cross.append(e)
    params_of: list[list[int]] = [[] for _ in range(ng)]
    for o, k in zip(graph.param_op.tolist(), graph.param_index.tolist(), strict=True):
        if group[o] >= 0 and k not in params_of[group[o]]:
            params_of[group[o]].append(k)
    param_ops = set(graph.param_op.tolist())

    layers: list[Layer] = []
    tensor_of_edge: dict[tuple[int, int], int] = {}
    for g in range(ng):
        ops = members[g]
        space = _layer_space(graph, ops, keys[g] in lstm, in_edges[g] + out_edges[g],
                             batch, param_ops)
        tensors = _layer_tensors(graph, space, in_edges[g], out_edges[g], params_of[g],
                                 tensor_of_edge)
        all_ops = ops + bwd_members[g]
        over = float(overhead_op[all_ops].sum())
        t = float(times[all_ops].sum() + bwd_extra_s[g])
        batch_dim = space.names.index("b") if "b" in space.names else (
            0 if space.kind == "conv" else -1)
        layers.append(Layer(
            name=names[g], kind=space.kind, dim_names=tuple(space.names),
            dim_sizes=tuple(int(x) for x in space.sizes),
            splittable=tuple(bool(x) and n > 1 for x, n in zip(space.splittable, space.sizes,
                                                                strict=True)),
            batch_dim=batch_dim, ops=tuple(ops), backward_ops=tuple(bwd_members[g]),
            time_s=t, overhead_s=min(t, over), tensors=tuple(tensors),
            itemsize=space.itemsize, steps=space.steps, window=space.window))
    edges = []
    for e in cross:
        s, d = int(group[graph.src[e]]), int(group[graph.dst[e]])
        edges.append((s, d, tensor_of_edge[(e, True)], tensor_of_edge[(e, False)]))
    return LayerGraph(tuple(layers), tuple(edges), training=bool(is_bwd.any()),
                      unattributed_time_s=unattributed_s, batch_size=batch,
                      graph_name=graph.name)


def _backward_mask(graph: OpGraph) -> np.ndarray:
    """bool[n_ops]: the backward ops of ``graph``; raises ParallelizeError for what PaSE
    cannot split (not an OpGraph, no forward op, no recorded shapes)."""
    if not isinstance(graph, OpGraph):
        raise ParallelizeError(f"parallelize needs an OpGraph, got {type(graph).__name__}. "
                               "Trace the model first: simplace.trace(fn, *args).")
    m = graph.num_ops
    is_bwd = np.array([str(p).startswith(BACKWARD_PREFIX) or str(p) == "backward"
                       for p in graph.name_path], dtype=bool) if m else np.zeros(0, bool)
    if is_bwd.all():
        raise ParallelizeError(
            f"Graph {graph.name!r} has no forward ops ({m} ops in all), so it has no "
            "layers to split. Trace a model function (simplace.trace) with at least one op.")
    if graph.in_avals is None or graph.out_avals is None:
        raise ParallelizeError(
            f"Graph {graph.name!r} does not record its ops' shapes (in_avals/out_avals are "
            "None: a hand-built or coarsened graph), and PaSE splits by shape. Parallelize "
            "a traced graph: simplace.trace(fn, *args), or a graph saved by `simplace graph "
            "MODEL --out FILE`.")
    return is_bwd


def _attribute_backward(graph: OpGraph, is_bwd: np.ndarray, times: np.ndarray,
                        members: list[list[int]], keys: list[str], key_of
                        ) -> tuple[list[list[int]], np.ndarray, float]:
    """Backward ops -> groups of the same forward path (longest matching key prefix):
    ``(backward ops per group, backward time shared out to the groups of a path cut into
    pieces, time of backward ops no group takes)``."""
    ng = len(keys)
    by_key: dict[str, list[int]] = defaultdict(list)
    for g, k in enumerate(keys):
        by_key[k].append(g)
    bwd_members: list[list[int]] = [[] for _ in range(ng)]
    bwd_extra_s = np.zeros(ng)
    unattributed_s = 0.0
    fwd_time = np.array([times[members[g]].sum() for g in range(ng)])
    for i in np.flatnonzero(is_bwd):
        _, parts = split_name_path(str(graph.name_path[i]))
        gs = None
        for cut in range(len(parts), -1, -1):
            k = key_of("/".join(parts[:cut]))
            if k in by_key:
                gs = by_key[k]
                break
        if gs is None:
            unattributed_s += float(times[i])
        elif len(gs) == 1:
            bwd_members[gs[0]].append(int(i))
        else:  # a path cut into pieces: share its backward time as the forward time
            w = fwd_time[gs] + 1e-30
            bwd_extra_s[gs] += float(times[i]) * w / w.sum()
    return bwd_members, bwd_extra_s, unattributed_s


def _layer_space(graph: OpGraph, ops: list[int], is_lstm: bool, boundary: list[int],
                 batch: int, param_ops: set):
    """The iteration space of the layer of ``ops``: an LSTM's, the main op's, else the
    largest boundary tensor's shape (not splittable for unsupported primitives)."""
    prims = {str(graph.op[i]) for i in ops}
    space = None
    if is_lstm:
        space = _lstm_space(graph, ops, batch)
    elif not prims & _UNSUPPORTED:
        space = _main_space(graph, ops, prims, batch, param_ops)
    if space is None:
        kind = "unsupported" if prims & _UNSUPPORTED or is_lstm else None
        avals = [graph.edge_aval(e) for e in boundary]
        # No shaped boundary tensor: a layer with no dims, whose itemsize no cost reads.
        big = max((a for a in avals if a.shape), key=lambda a: a.nbytes,
                  default=Aval((), "float32", 4))
        space = _shape_space(kind or "elementwise", big.shape, batch, big.itemsize)
        if kind == "unsupported":
            space.splittable = [False] * len(space.names)
    return space


def _layer_tensors(graph: OpGraph, space, in_edges: list[int], out_edges: list[int],
                   params: list[int], tensor_of_edge: dict[tuple[int, int], int]
                   ) -> list[Tensor]:
    """The layer's boundary tensors (inputs, outputs) and parameters, each with its axes
    in ``space``; records each boundary edge's tensor index in ``tensor_of_edge`` under
    ``(edge, is output)``."""
    tensors: list[Tensor] = []
    seen_t: set = set()
    for role, edges in (("in", in_edges), ("out", out_edges)):
        for e in edges:
            aval = graph.edge_aval(e)
            axis = _tensor_axes(space, role, aval.shape, graph, e)
            tensor_of_edge[(e, role == "out")] = len(tensors)
            key = (role, int(graph.src[e]), int(graph.edge_output[e]))
            tensors.append(Tensor(aval.shape, float(graph.edge_bytes[e]), axis, role,
                                  edge=e, first=key not in seen_t,
                                  is_float=aval.is_inexact))
            seen_t.add(key)
    for k in params:
        shapes = _param_shapes(graph, k)
        known = [s for s in shapes if s in space.main_operands]
        if known:
            shape = known[0]
            axis = space.main_operands[shape]
        else:
            axes = [(_param_axes(space, s), s) for s in shapes]
            axis, shape = max(axes, key=lambda a: sum(d >= 0 for d in a[0]),
                              default=((), ()))
        tensors.append(Tensor(shape, float(graph.param_sizes[k]), axis, "param", param=k))
    return tensors


def _batch_size(graph: OpGraph, forward: np.ndarray) -> int:
    """The most common leading size of the forward matmul / conv inputs."""
    counts: dict[int, int] = defaultdict(int)
    for i in np.flatnonzero(forward):
        if graph.op[i] in ("dot_general", "conv_general_dilated"):
            av = _inputs(graph, i)
            if av and av[0].shape:
                counts[av[0].shape[0]] += 1
    return max(counts, key=lambda k: (counts[k], k)) if counts else -1


def _main_space(graph, ops, prims, batch, param_ops) -> _Space | None:
    convs = [i for i in ops if graph.op[i] == "conv_general_dilated"]
    if convs:
        main = max(convs, key=lambda i: graph.flops[i])
        return _conv_space(graph, main)
    dots = [i for i in ops if graph.op[i] == "dot_general"]
    param_dots = [i for i in dots if i in param_ops]
    if param_dots:
        main = max(param_dots, key=lambda i: graph.flops[i])
        return _dot_space(graph, main, True, batch)
    if len(dots) >= 2:
        main = min(dots)  # the scores come first
        sp = _attention_space(graph, main)
        if sp is not None:
            return sp
    if dots:
        main = max(dots, key=lambda i: graph.flops[i])
        return _dot_space(graph, main, False, batch)
    gathers = [i for i in ops if graph.op[i] == "gather" and i in param_ops]
    if gathers:
        av = _inputs(graph, gathers[0])
        if len(av) >= 2 and len(av[0].shape) == 2:
            isz, (v, d), ids = av[0].itemsize, av[0].shape, av[1].shape
            idshape = ids[:-1] if ids and ids[-1] == 1 else ids
            sp = _shape_space("embedding", tuple(idshape) + (d,), batch, isz)
            sp.names.append("v")
            sp.sizes.append(v)
            sp.splittable.append(True)
            sp.main_operands[(v, d)] = (len(sp.names) - 1, len(idshape))
            return sp
    pools = [i for i in ops if str(graph.op[i]).startswith("reduce_window")]
    if pools:
        main = max(pools, key=lambda i: graph.flops[i])
        av = _inputs(graph, main)
        if av and len(av[0].shape) == 4:
            sp = _shape_space("pool", av[0].shape, batch, av[0].itemsize)
            win = _flat_ints(_attr(graph, main, "window_dimensions"))
            if len(win) == 4:
                sp.window = (win[1], win[2])
            return sp
    return None


def _lstm_space(graph, ops, batch) -> _Space | None:
    """LSTM layer: dims (b, h, k): batch, hidden units (gates follow them), inputs."""
    inp = [i for i in ops if graph.op[i] == "dot_general"
           and str(graph.name_path[i]).endswith("/input")]
    rec = [i for i in ops if graph.op[i] == "dot_general"
           and str(graph.name_path[i]).endswith("/recurrent")]
    if not inp or not rec:
        return None
    av = _inputs(graph, inp[0])
    rav = _inputs(graph, rec[0])
    if len(av) < 2 or len(av[0].shape) != 2 or len(rav) < 2:
        return None
    isz, (b, k), (_, four_h) = av[0].itemsize, av[0].shape, av[1].shape
    hidden = four_h // 4
    sp = _Space("lstm", ["b", "h", "k"], [b, hidden, k], [True, True, True],
                [((b, k), (0, 2))], ((b, hidden), (0, 1)), itemsize=isz, steps=len(inp))
    sp.main_operands[(k, four_h)] = (2, 1)
    sp.main_operands[(hidden, four_h)] = (-1, 1)
    sp.main_operands[(four_h,)] = (1,)
    return sp


def _tensor_axes(space: _Space, role: str, shape, graph, e) -> tuple[int, ...]:
    if not shape:
        return ()
    if role == "out":
        cs, cd = space.canon_out
        return align(shape, cs, cd)
    cands = space.canon_in
    if space.kind == "attention" and len(cands) == 2:
        src_path = str(graph.name_path[int(graph.src[e])])
        use_kv = src_path.endswith("/key") or src_path.endswith("/value")
        cs, cd = cands[1] if use_kv else cands[0]
        return align(shape, cs, cd)
    cs, cd = cands[0]
    return align(shape, cs, cd)


def _param_axes(space: _Space, shape) -> tuple[int, ...]:
    """A bias / scale: its axes follow the trailing axes of the output when sizes match."""
    if not shape:
        return ()
    cs, cd = space.canon_out
    out = [-1] * len(shape)
    if len(shape) <= len(cs) and tuple(cs[len(cs) - len(shape):]) == tuple(shape):
        for a in range(len(shape)):
            out[a] = cd[len(cs) - len(shape) + a]
    return tuple(out)

"""OpGraph: the one computation-graph representation every part of simplace works on."""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

import networkx as nx
import numpy as np

from simplace._graph_checks import check_graph
from simplace._graph_fields import (
    _EDGE_FIELDS,
    _OP_FLOAT_FIELDS,
    _OP_SHAPE_FIELDS,
    _OP_STR_FIELDS,
    MAX_BYTES,
    MAX_FLOPS,
    Aval,
    _aval_rows,
    _bool_array,
    _float_array,
    _freeze_attrs,
    _frozen,
    _index_array,
    _rows,
    _str_array,
    _to_aval,
)
from simplace._graph_json import (
    _HASH_SALT,
    SCHEMA,
    SCHEMA_VERSION,
    graph_from_dict,
    graph_to_dict,
)
from simplace._graph_order import _csr, _permuted, find_cycle, topological_order
from simplace._jsonfile import read_json, write_json
from simplace.errors import GraphError

# Defined in the modules of the graph's parts, and imported from here.
__all__ = ["BACKWARD_PREFIX", "MAX_BYTES", "MAX_FLOPS", "SCHEMA", "SCHEMA_VERSION", "Aval",
           "OpGraph", "find_cycle", "format_bytes", "split_name_path", "topological_order"]

# name_path of an op of the backward pass: this prefix, then the module path of the
# forward op it differentiates ("backward/ResNet/stage2/block1/Conv_0"). A prefix keeps the
# path readable and lets grouping rules put a layer's gradient ops with (or apart from)
# its forward ops.
BACKWARD_PREFIX = "backward/"


def split_name_path(path: str) -> tuple[bool, tuple[str, ...]]:
    """``(is_backward, module path components)`` of an op's ``name_path``."""
    backward = path.startswith(BACKWARD_PREFIX) or path == BACKWARD_PREFIX.rstrip("/")
    if backward:
        path = path[len(BACKWARD_PREFIX):]
    return backward, tuple(p for p in path.split("/") if p)


@dataclasses.dataclass(frozen=True, eq=False)
class OpGraph:
    """An immutable op graph: M ops in a topological order, E edges, P parameters.

    Per op (shape ``[M]``):
      op: primitive name (``dot_general``, ``conv_general_dilated``, ``add``...).
      name_path: module / named-scope path from the trace (``ResNet/stage2/block1/Conv_0``).
      flops: floating-point operations of one execution.
      bytes_accessed: bytes read plus bytes written by the op.
      out_bytes: bytes of all the op's outputs (the activation it allocates).
      signature: the key under which op times are measured (primitive, input
        shapes/dtypes and the parameters that change its cost).
      is_output: True when an output of the op is returned by the traced function,
        so it stays allocated until the end of the step.
    Per edge (shape ``[E]``), one per distinct tensor an op consumes:
      src, dst: producer and consumer op indices, ``src < dst``.
      edge_bytes: bytes of the tensor.
      edge_output: which output of ``src`` the tensor is (two edges with the same
        ``(src, edge_output)`` carry the same tensor, so it is sent to a device once).
    Parameters (shape ``[P]``) and their uses (shape ``[K]``):
      param_names, param_sizes: name and bytes of each parameter leaf.
      param_op, param_index: op ``param_op[k]`` reads parameter ``param_index[k]``;
        a parameter must be resident on every device that runs an op reading it.
    Shapes and dtypes (each ``None`` when not recorded: hand-built and coarsened graphs):
      in_avals: per op (``[M]``) a tuple of ``Aval`` (shape, dtype, itemsize), one per
        operand in the primitive's order (literals and function inputs included).
      out_avals: per op (``[M]``) a tuple of ``Aval``, one per output: output ``k`` is
        the tensor of the edges with ``edge_output == k``.
      attrs: per op (``[M]``) the primitive's parameters as read-only JSON-like data
        (mappings, tuples, numbers, strings; named tuples and dataclasses become
        mappings, enums and dtypes their names; sub-jaxprs and functions left out), e.g.
        a dot_general's ``dimension_numbers`` as
        ``(((lhs contracting), (rhs contracting)), ((lhs batch), (rhs batch)))``.
      param_avals: per parameter (``[P]``) its ``Aval``.
    Derived: ``param_bytes[M]``, the bytes of parameters each op reads.

    Construct with keyword arrays; ops must already be in a topological order
    (``OpGraph.from_unordered`` sorts them). Validation happens at construction.
    """

    op: np.ndarray
    name_path: np.ndarray
    flops: np.ndarray
    bytes_accessed: np.ndarray
    out_bytes: np.ndarray
    signature: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    edge_bytes: np.ndarray
    edge_output: np.ndarray | None = None
    is_output: np.ndarray | None = None
    param_names: np.ndarray | None = None
    param_sizes: np.ndarray | None = None
    param_op: np.ndarray | None = None
    param_index: np.ndarray | None = None
    in_avals: tuple[tuple[Aval, ...], ...] | None = None
    out_avals: tuple[tuple[Aval, ...], ...] | None = None
    attrs: tuple[Mapping[str, Any], ...] | None = None
    param_avals: tuple[Aval, ...] | None = None
    name: str = ""
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        set_ = functools.partial(object.__setattr__, self)
        for f in _OP_STR_FIELDS:
            set_(f, _frozen(_str_array(getattr(self, f))))
        for f in _OP_FLOAT_FIELDS:
            set_(f, _frozen(_float_array(getattr(self, f), f)))
        m = len(self.op)
        set_("src", _frozen(_index_array(self.src, "src")))
        set_("dst", _frozen(_index_array(self.dst, "dst")))
        set_("edge_bytes", _frozen(_float_array(self.edge_bytes, "edge_bytes")))
        e = len(self.src)
        eo = np.zeros(e, dtype=np.int32) if self.edge_output is None else self.edge_output
        set_("edge_output", _frozen(_index_array(eo, "edge_output")))
        io = np.zeros(m, dtype=bool) if self.is_output is None else self.is_output
        set_("is_output", _frozen(_bool_array(io, "is_output")))
        set_("param_names", _frozen(_str_array([] if self.param_names is None
                                               else self.param_names)))
        ps = [] if self.param_sizes is None else self.param_sizes
        set_("param_sizes", _frozen(_float_array(ps, "param_sizes")))
        for f in ("param_op", "param_index"):
            v = getattr(self, f)
            set_(f, _frozen(_index_array([] if v is None else v, f)))
        cache: dict[int, Aval] = {}
        for f in ("in_avals", "out_avals"):
            v = getattr(self, f)
            if v is not None:
                set_(f, _aval_rows(v, f, cache))
        if self.param_avals is not None:
            set_("param_avals", tuple(_to_aval(a, "param_avals", k, cache) for k, a in
                                      enumerate(_rows(self.param_avals, "param_avals"))))
        if self.attrs is not None:
            frozen: dict[int, Mapping] = {}
            set_("attrs", tuple(_freeze_attrs(a, i, frozen)
                                for i, a in enumerate(_rows(self.attrs, "attrs"))))
        set_("meta", dict(self.meta))
        check_graph(self)

    def avals(self, i: int) -> tuple[tuple[Aval, ...], tuple[Aval, ...]]:
        """``(inputs, outputs)`` of op ``i`` as ``Aval`` tuples; empty when not recorded."""
        return (() if self.in_avals is None else self.in_avals[i],
                () if self.out_avals is None else self.out_avals[i])

    def edge_aval(self, e: int) -> Aval | None:
        """The ``Aval`` of the tensor edge ``e`` carries; None when not recorded."""
        if self.out_avals is None:
            return None
        return self.out_avals[int(self.src[e])][int(self.edge_output[e])]

    @classmethod
    def from_unordered(cls, **fields) -> OpGraph:
        """Build an OpGraph from per-op arrays in any order; ops are sorted topologically.

        The sort is stable (among ready ops the lowest original index goes first);
        ``meta['original_index']`` records the op order it came from.
        Raises GraphError naming a cycle if there is one.
        """
        m = len(fields["op"])
        src = _index_array(fields["src"], "src").astype(np.int64)
        dst = _index_array(fields["dst"], "dst").astype(np.int64)
        for f, v in (("src", src), ("dst", dst)):
            if v.size and (v.min() < 0 or v.max() >= m):
                raise GraphError(f"Edge field '{f}' refers to an op outside 0..{m - 1}.")
        order = topological_order(m, src, dst)
        if order is None:
            cycle = find_cycle(m, src, dst)
            path = " -> ".join(f"{i} ({fields['op'][i]})" for i in cycle)
            raise GraphError(f"The graph has a cycle: {path}. A computation graph must be "
                             "acyclic; remove one of these edges.")
        out = _permuted(dict(fields, src=src, dst=dst), order)
        meta = dict(out.get("meta") or {})
        meta["original_index"] = [int(i) for i in order]
        out["meta"] = meta
        return cls(**out)

    def reordered(self, order) -> OpGraph:
        """This graph with its ops in ``order`` (int[M], a topological order: op
        ``order[k]`` becomes op ``k``), edges and parameter uses renumbered; e.g. to
        simulate a placement whose ops run in another order than the trace's.
        ``meta['original_index']`` maps the new ops to the original trace's. Raises
        GraphError if ``order`` is not a permutation of the ops or not topological."""
        m = self.num_ops
        order = np.asarray(order)
        if order.shape != (m,) or not np.array_equal(np.sort(order), np.arange(m)):
            raise GraphError(f"An op order must list each of the graph's {m} ops "
                             f"(0..{m - 1}) exactly once; this one (shape {order.shape}) "
                             "does not.")
        order = order.astype(np.int64)
        rank = np.empty(m, dtype=np.int64)
        rank[order] = np.arange(m)
        late = np.flatnonzero(rank[self.src] >= rank[self.dst])
        if len(late):
            e = int(late[0])
            raise GraphError(f"The op order puts op {int(self.dst[e])} before op "
                             f"{int(self.src[e])}, whose output it reads: give a "
                             "topological order.")
        out = _permuted({f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                        order)
        meta = dict(self.meta)
        original = meta.get("original_index", range(m))
        meta["original_index"] = [int(original[i]) for i in order]
        out["meta"] = meta
        return OpGraph(**out)

    # ------------------------------------------------------------------ sizes and derived
    @property
    def num_ops(self) -> int:
        """Number of ops (M)."""
        return len(self.op)

    @property
    def num_edges(self) -> int:
        """Number of edges (E)."""
        return len(self.src)

    @property
    def num_params(self) -> int:
        """Number of parameters (P)."""
        return len(self.param_names)

    @functools.cached_property
    def param_bytes(self) -> np.ndarray:
        """float64[M]: bytes of the parameters each op reads."""
        out = np.zeros(self.num_ops)
        np.add.at(out, self.param_op, self.param_sizes[self.param_index])
        return _frozen(out)

    @functools.cached_property
    def hash(self) -> str:
        """Content hash (hex sha256) over ops, edges and parameters; not name, meta or
        the shape fields (``in_avals``, ``out_avals``, ``attrs``, ``param_avals``): for a
        traced graph the signatures already determine them."""
        h = hashlib.sha256()
        h.update(_HASH_SALT.encode())
        for f in _OP_STR_FIELDS + ("param_names",):
            h.update(f.encode())
            h.update(json.dumps(getattr(self, f).tolist()).encode())
        for f in _OP_FLOAT_FIELDS + ("is_output",) + _EDGE_FIELDS + (
                "param_sizes", "param_op", "param_index"):
            h.update(f.encode())
            v = getattr(self, f)
            v = v.astype("<f8") if v.dtype.kind == "f" else v.astype("<i8")
            h.update(v.tobytes())
        return h.hexdigest()

    @functools.cached_property
    def in_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR of edges by consumer: edges into op i are ``order[ptr[i]:ptr[i+1]]``."""
        return _csr(self.dst, self.num_ops)

    @functools.cached_property
    def out_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR of edges by producer: edges out of op i are ``order[ptr[i]:ptr[i+1]]``."""
        return _csr(self.src, self.num_ops)

    def predecessors(self, i: int) -> np.ndarray:
        """The distinct ops with an edge into op ``i``, sorted."""
        ptr, order = self.in_edges
        return np.unique(self.src[order[ptr[i]:ptr[i + 1]]])

    def successors(self, i: int) -> np.ndarray:
        """The distinct ops that op ``i`` has an edge to, sorted."""
        ptr, order = self.out_edges
        return np.unique(self.dst[order[ptr[i]:ptr[i + 1]]])

    # ------------------------------------------------------------------ conversions
    def to_networkx(self):
        """A ``networkx.DiGraph`` with one node per op (all per-op fields as attributes)
        and one edge per connected op pair (``bytes`` summed over the tensors it carries)."""
        g = nx.DiGraph(name=self.name, hash=self.hash)
        pb = self.param_bytes
        for i in range(self.num_ops):
            g.add_node(i, op=str(self.op[i]), name_path=str(self.name_path[i]),
                       flops=float(self.flops[i]), bytes_accessed=float(self.bytes_accessed[i]),
                       out_bytes=float(self.out_bytes[i]), param_bytes=float(pb[i]),
                       signature=str(self.signature[i]), is_output=bool(self.is_output[i]))
            for f in _OP_SHAPE_FIELDS:
                v = getattr(self, f)
                if v is not None:
                    g.nodes[i][f] = v[i]
        for s, d, b in zip(self.src.tolist(), self.dst.tolist(), self.edge_bytes.tolist(),
                           strict=True):
            if g.has_edge(s, d):
                g[s][d]["bytes"] += b
            else:
                g.add_edge(s, d, bytes=b)
        return g

    def to_dict(self) -> dict:
        """The JSON form (see ``save``). Shapes are interned: ``avals`` is a table of
        the distinct ``(shape, dtype, itemsize)``, and ``ops.in_avals``/``ops.out_avals``/
        ``params.param_avals`` hold indices into it; ``attrs`` is a table of the distinct
        parameter mappings and ``ops.attrs`` indices into it. A field not recorded is
        null."""
        return graph_to_dict(self)

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "<dict>") -> OpGraph:
        """The graph of a ``to_dict`` form; ``source`` names it in errors. Checks the
        schema version, every field's type and the content hash."""
        return graph_from_dict(cls, d, source=source)

    def save(self, path: str | os.PathLike) -> None:
        """Write the graph as JSON (schema-versioned, with its content hash), atomically."""
        write_json(path, self.to_dict(), compact=True)

    @classmethod
    def load(cls, path: str | os.PathLike) -> OpGraph:
        """Read a graph written by ``save``; checks schema version and content hash."""
        return cls.from_dict(read_json(path, GraphError, "Graph file"), source=str(path))

    # ------------------------------------------------------------------ reporting
    def stats(self) -> dict:
        """Totals used by ``summary`` and the CLI."""
        return {
            "ops": self.num_ops,
            "edges": self.num_edges,
            "gflops": float(self.flops.sum()) / 1e9,
            "param_bytes": float(self.param_sizes.sum()),
            "activation_bytes": float(self.out_bytes.sum()),
            "primitives": collections.Counter(self.op.tolist()),
        }

    def summary(self, top: int = 8) -> str:
        """A short human-readable description."""
        s = self.stats()
        lines = [
            f"OpGraph {self.name or '(unnamed)'}  hash {self.hash[:12]}",
            f"  ops {s['ops']:,}   edges {s['edges']:,}   parameters {self.num_params:,}",
            f"  compute {_fmt_flops(s['gflops'] * 1e9)}   "
            f"parameters {format_bytes(s['param_bytes'])}"
            f"   activations {format_bytes(s['activation_bytes'])}",
        ]
        if s["primitives"]:
            common = ", ".join(f"{k} {v}" for k, v in s["primitives"].most_common(top))
            lines.append(f"  most common primitives: {common}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"OpGraph(name={self.name!r}, ops={self.num_ops}, edges={self.num_edges}, "
                f"params={self.num_params}, hash={self.hash[:12]})")


def _fmt_flops(n: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if n >= scale:
            return f"{n / scale:.3f} {unit}"
    return f"{n:.0f} FLOP"


def format_bytes(n: float) -> str:
    """``n`` bytes for people: "512 B", "1.5 KiB", ... "2.0 TiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


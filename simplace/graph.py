"""OpGraph: the one computation-graph representation every part of simplace works on."""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import networkx as nx
import numpy as np

from simplace._jsonfile import read_json, write_json
from simplace.errors import GraphError

SCHEMA = "simplace.opgraph"
# 2: ops carry their input and output shapes and dtypes (``in_avals``, ``out_avals``), their
# primitive's parameters (``attrs``) and parameters their shapes (``param_avals``).
SCHEMA_VERSION = 2
# The content hash covers ops, edges and parameters as in version 1 and is salted with
# "/1" still: the shape fields added in version 2 are not hashed (for a traced graph they
# follow from the signatures, which hold the input shapes, dtypes and parameters), so
# placements and validation records made for a version 1 graph match the same graph
# traced again.
_HASH_SALT = f"{SCHEMA}/1"

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


class Aval(NamedTuple):
    """The abstract value of one tensor: what an op reads or writes, without the data.

    shape: sizes of the axes (``()`` for a scalar).
    dtype: numpy name of the element type (``float32``, ``bfloat16``, ``int8``, ``bool``),
      an extended dtype's name (``key<fry>``), or for a value that is not an array (a
      token) its abstract type's name, with shape ``()`` and itemsize 0.
    itemsize: bytes per element, as the trace sized it (numpy's itemsize; an extended
      dtype counts its physical representation).
    """

    shape: tuple[int, ...]
    dtype: str
    itemsize: int

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tensor."""
        return math.prod(self.shape) * self.itemsize

    @property
    def is_inexact(self) -> bool:
        """Floating point or complex: a value that has a gradient (integer ids do not)."""
        return self.dtype.startswith(("float", "bfloat", "complex"))


_OP_STR_FIELDS = ("op", "name_path", "signature")
_OP_FLOAT_FIELDS = ("flops", "bytes_accessed", "out_bytes")
_EDGE_FIELDS = ("src", "dst", "edge_bytes", "edge_output")
_PARAM_FIELDS = ("param_names", "param_sizes", "param_op", "param_index")


def _str_array(values) -> np.ndarray:
    arr = np.asarray(list(values), dtype=object)
    return arr.astype(str) if arr.size else np.zeros(0, dtype=str)


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr = np.array(arr, copy=True)
    arr.flags.writeable = False
    return arr


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
        self._validate()

    # ------------------------------------------------------------------ validation
    def _validate(self):
        m, e, p = self.num_ops, self.num_edges, self.num_params
        for f in _OP_STR_FIELDS + _OP_FLOAT_FIELDS + ("is_output",):
            if len(getattr(self, f)) != m:
                raise GraphError(
                    f"OpGraph field '{f}' has length {len(getattr(self, f))} but 'op' has {m}: "
                    "every per-op field needs one entry per op."
                )
        for f in _EDGE_FIELDS:
            if len(getattr(self, f)) != e:
                raise GraphError(
                    f"OpGraph edge field '{f}' has length {len(getattr(self, f))} but 'src' "
                    f"has {e}: every per-edge field needs one entry per edge."
                )
        if len(self.param_sizes) != p:
            raise GraphError(
                f"'param_sizes' has {len(self.param_sizes)} entries but 'param_names' has {p}."
            )
        if len(self.param_index) != len(self.param_op):
            raise GraphError(
                f"'param_op' has {len(self.param_op)} entries but 'param_index' has "
                f"{len(self.param_index)}: each parameter use is one (op, parameter) pair."
            )
        for f in _OP_FLOAT_FIELDS + ("edge_bytes", "param_sizes"):
            v = getattr(self, f)
            top = MAX_FLOPS if f == "flops" else MAX_BYTES
            bad = np.flatnonzero(~np.isfinite(v) | (v < 0) | (v > top))
            if bad.size:
                i = int(bad[0])
                where = f"op {i} ({self.op[i]} at '{self.name_path[i]}')" if (
                    f in _OP_FLOAT_FIELDS) else f"entry {i}"
                raise GraphError(
                    f"OpGraph field '{f}' must be finite and >= 0, and at most {top:g} (more "
                    f"than any op of a real model {'computes' if f == 'flops' else 'moves'}"
                    f"), but {where} is {float(v[i])!r} ({bad.size} bad entries in all): check "
                    "its units."
                )
        for f, n, what in (("src", m, "op"), ("dst", m, "op"), ("param_op", m, "op"),
                           ("param_index", p, "parameter")):
            v = getattr(self, f)
            bad = np.flatnonzero((v < 0) | (v >= n))
            if bad.size:
                raise GraphError(
                    f"OpGraph field '{f}' entry {int(bad[0])} is {int(v[bad[0]])}, not a valid "
                    f"{what} index (there are {n} {what}s)."
                )
        for f in _OP_SHAPE_FIELDS:
            v = getattr(self, f)
            if v is not None and len(v) != m:
                raise GraphError(f"OpGraph field '{f}' has {len(v)} entries but 'op' has {m}: "
                                 "give one entry per op, or None when not known.")
        if self.param_avals is not None:
            if len(self.param_avals) != p:
                raise GraphError(f"'param_avals' has {len(self.param_avals)} entries but "
                                 f"'param_names' has {p}.")
            for k, a in enumerate(self.param_avals):
                if a.nbytes != self.param_sizes[k]:
                    raise GraphError(
                        f"Parameter {k} ('{self.param_names[k]}') has shape {a.shape} of "
                        f"{a.dtype} ({a.nbytes} bytes) in 'param_avals' but "
                        f"'param_sizes' says {self.param_sizes[k]:g} bytes.")
        if e and np.any(self.edge_output < 0):
            raise GraphError("'edge_output' must be >= 0 (an output index of the producer).")
        self_loops = np.flatnonzero(self.src == self.dst)
        if self_loops.size:
            i = int(self.src[self_loops[0]])
            raise GraphError(f"Edge {int(self_loops[0])} is a self-loop on op {i}: "
                             "an op cannot consume its own output.")
        backward = np.flatnonzero(self.src > self.dst)
        if backward.size:
            cycle = find_cycle(m, self.src, self.dst)
            if cycle:
                path = " -> ".join(f"{i} ({self.op[i]})" for i in cycle)
                raise GraphError(f"The graph has a cycle: {path}. A computation graph must be "
                                 "acyclic; remove one of these edges.")
            k = int(backward[0])
            raise GraphError(
                f"Ops are not in a topological order: edge {k} goes from op {int(self.src[k])} "
                f"to op {int(self.dst[k])}. Build the graph with OpGraph.from_unordered(...), "
                "which sorts the ops topologically."
            )
        if e:
            key = (self.src.astype(np.int64) * (m + 1) + self.dst) * (int(
                self.edge_output.max()) + 1) + self.edge_output
            if np.unique(key).size != e:
                raise GraphError("Duplicate edges: an (src, dst, edge_output) triple appears "
                                 "twice. Keep one edge per tensor an op consumes.")
        if self.out_avals is not None:
            self._validate_out_avals()

    def _validate_out_avals(self):
        """Output shapes agree with the byte counts: an op's outputs add up to its
        ``out_bytes``, and every edge carries an output the producer has, of its size."""
        # Over the distinct rows (ops with equal outputs share one tuple), then in numpy:
        # graphs have tens of thousands of ops and edges.
        seen: dict[int, int] = {}
        distinct: list[tuple[Aval, ...]] = []
        row_id = np.empty(self.num_ops, dtype=np.int64)
        for i, row in enumerate(self.out_avals):
            k = seen.get(id(row))
            if k is None:
                k = seen[id(row)] = len(distinct)
                distinct.append(row)
            row_id[i] = k
        total = np.array([sum(a.nbytes for a in r) for r in distinct] + [0], dtype=np.float64)
        bad = np.flatnonzero(total[row_id] != self.out_bytes)
        if bad.size:
            i = int(bad[0])
            raise GraphError(
                f"Op {i} ({self.op[i]} at '{self.name_path[i]}'): its 'out_avals' add up to "
                f"{total[row_id[i]]:g} bytes but 'out_bytes' says {self.out_bytes[i]:g}.")
        if not self.num_edges:
            return
        lens = np.array([len(r) for r in distinct], dtype=np.int64)
        ptr = np.concatenate([[0], np.cumsum(lens)])
        flat = np.array([a.nbytes for r in distinct for a in r] + [0], dtype=np.float64)
        rs, eo = row_id[self.src], self.edge_output.astype(np.int64)
        bad = np.flatnonzero(eo >= lens[rs])
        if bad.size:
            k = int(bad[0])
            s_, o = int(self.src[k]), int(eo[k])
            raise GraphError(f"Edge {k} carries output {o} of op {s_} ({self.op[s_]}), which "
                             f"has {lens[rs[k]]} output(s) in 'out_avals'.")
        bad = np.flatnonzero(flat[ptr[rs] + eo] != self.edge_bytes)
        if bad.size:
            k = int(bad[0])
            s_, o = int(self.src[k]), int(eo[k])
            a = self.out_avals[s_][o]
            raise GraphError(
                f"Edge {k} carries output {o} of op {s_} ({self.op[s_]}): {a.shape} of "
                f"{a.dtype} is {a.nbytes} bytes but 'edge_bytes' says {self.edge_bytes[k]:g}.")

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
        table: dict[Aval, int] = {}

        def index(a: Aval) -> int:
            k = table.get(a)
            if k is None:
                k = table[a] = len(table)
            return k

        def rows(v):
            if v is None:
                return None
            done: dict[int, list[int]] = {}  # ops share row tuples: index each once
            out = []
            for row in v:
                r = done.get(id(row))
                if r is None:
                    r = done[id(row)] = [index(a) for a in row]
                out.append(r)
            return out

        ops = {f: getattr(self, f).tolist() for f in
               _OP_STR_FIELDS + _OP_FLOAT_FIELDS + ("is_output",)}
        ops["in_avals"], ops["out_avals"] = rows(self.in_avals), rows(self.out_avals)
        attr_table: dict[str, int] = {}
        attr_values: list = []
        if self.attrs is None:
            ops["attrs"] = None
        else:
            ops["attrs"] = []
            by_id: dict[int, int] = {}  # ops share mappings: serialise each once
            for a in self.attrs:
                k = by_id.get(id(a))
                if k is None:
                    plain = _thaw(a)
                    key = json.dumps(plain, sort_keys=True)
                    k = attr_table.get(key)
                    if k is None:
                        k = attr_table[key] = len(attr_values)
                        attr_values.append(plain)
                    by_id[id(a)] = k
                ops["attrs"].append(k)
        params = {f: getattr(self, f).tolist() for f in _PARAM_FIELDS}
        params["param_avals"] = (None if self.param_avals is None else
                                 [index(a) for a in self.param_avals])
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "hash": self.hash,
            "name": self.name,
            "meta": self.meta,
            "ops": ops,
            "edges": {f: getattr(self, f).tolist() for f in _EDGE_FIELDS},
            "params": params,
            "avals": {"shape": [list(a.shape) for a in table],
                      "dtype": [a.dtype for a in table],
                      "itemsize": [a.itemsize for a in table]},
            "attrs": attr_values,
        }

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "<dict>") -> OpGraph:
        """The graph of a ``to_dict`` form; ``source`` names it in errors. Checks the
        schema version, every field's type and the content hash."""
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise GraphError(f"{source} is not a simplace op graph (its 'schema' field is not "
                             f"'{SCHEMA}'). Save graphs with OpGraph.save or `simplace graph "
                             "--out`.")
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            args = _remake_args(d.get("name"))
            how = (" (MODEL: the zoo name or file.py:factory, with the --batch, --small or "
                   "--inference options it was made with)" if args == "MODEL" else
                   " (as its name records; a model of your own is path/file.py:factory)")
            remake = (f"Make it again from its model: `simplace graph {args} --out "
                      f"{source}`{how}, or trace the model and OpGraph.save it.")
            if type(version) is int and version < SCHEMA_VERSION:
                why = (" (ops without their shapes and dtypes)" if version == 1 else "")
                raise GraphError(f"{source} is an op graph of schema_version {version}"
                                 f"{why}, an older format than this simplace reads (version "
                                 f"{SCHEMA_VERSION}). {remake}")
            raise GraphError(f"{source} has op-graph schema_version {version!r}; this simplace "
                             f"reads version {SCHEMA_VERSION}. Use the simplace that wrote it, "
                             f"or: {remake}")
        fields = {}
        for section, names in (("ops", _OP_STR_FIELDS + _OP_FLOAT_FIELDS + ("is_output",)),
                               ("edges", _EDGE_FIELDS), ("params", _PARAM_FIELDS)):
            sec = d.get(section)
            if not isinstance(sec, dict):
                raise GraphError(f"{source}: section '{section}' is missing or not an object.")
            for f in names:
                if f not in sec:
                    raise GraphError(f"{source}: field '{section}.{f}' is missing.")
                _check_json_list(sec[f], f, f"{section}.{f}", source)
                fields[f] = sec[f]
        fields.update(_shape_fields_from_json(d, source))
        if not isinstance(d.get("name", ""), str):
            raise GraphError(f"{source}: field 'name' must be a string, got "
                             f"{json.dumps(d['name'])[:40]}.")
        if not isinstance(d.get("meta") or {}, dict):
            raise GraphError(f"{source}: field 'meta' must be an object.")
        if not isinstance(d.get("hash", ""), str | None):
            raise GraphError(f"{source}: field 'hash' must be a string.")
        try:
            g = cls(name=d.get("name", ""), meta=d.get("meta") or {}, **fields)
        except (TypeError, ValueError, OverflowError) as err:
            if isinstance(err, GraphError):
                raise GraphError(f"{source}: {err}") from None
            raise GraphError(f"{source}: a field has values of the wrong type ({err}).") from None
        want = d.get("hash")
        if want is not None and want != g.hash:
            raise GraphError(
                f"{source}: the content hash does not match (file says {want[:12]}..., content "
                f"gives {g.hash[:12]}...): the graph was changed after it was saved. If the "
                "change is intended, delete the 'hash' field and load it again."
            )
        return g

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


def _permuted(fields: dict, order: np.ndarray) -> dict:
    """OpGraph fields (``src`` and ``dst`` given as index arrays) with op ``order[k]``
    made op ``k``: per-op fields reordered, edges and parameter uses renumbered."""
    m = len(order)
    rank = np.empty(m, dtype=np.int64)
    rank[order] = np.arange(m)
    out = dict(fields)
    for f in _OP_STR_FIELDS + _OP_FLOAT_FIELDS + ("is_output",):
        if out.get(f) is not None:
            out[f] = np.asarray(out[f])[order] if m else out[f]
    for f in _OP_SHAPE_FIELDS:
        if out.get(f) is not None:
            rows = _rows(out[f], f)
            if len(rows) != m:
                raise GraphError(f"OpGraph field '{f}' has {len(rows)} entries but 'op' "
                                 f"has {m}: give one entry per op, or None.")
            out[f] = tuple(rows[k] for k in order.tolist())
    out["src"], out["dst"] = rank[np.asarray(out["src"])], rank[np.asarray(out["dst"])]
    if out.get("param_op") is not None:
        out["param_op"] = rank[_index_array(out["param_op"], "param_op")]
    return out


def _remake_args(name) -> str:
    """The ``simplace graph`` arguments that made a graph named ``name`` by the CLI's
    convention (``model/train|inference[/small][/bN]``, see ``models.load_graph``);
    ``MODEL`` when the name does not follow it. Only a hint in an error message."""
    parts = name.split("/") if isinstance(name, str) else []
    if len(parts) < 2 or parts[1] not in ("train", "inference") or not parts[0]:
        return "MODEL"
    args = [parts[0]]
    if parts[1] == "inference":
        args.append("--inference")
    for p in parts[2:]:
        if p == "small":
            args.append("--small")
        elif p[:1] == "b" and p[1:].isdigit():
            args.append(f"--batch {p[1:]}")
    return " ".join(args)


def _shape_fields_from_json(d: dict, source: str) -> dict:
    """``in_avals``, ``out_avals``, ``attrs`` and ``param_avals`` of a graph file, from its
    ``avals`` and ``attrs`` tables and the index lists in ``ops`` and ``params``."""
    tab = d.get("avals")
    if not isinstance(tab, dict):
        raise GraphError(f"{source}: section 'avals' (the table of shapes and dtypes) is "
                         "missing or not an object.")
    cols = {}
    for f, ok, want in (("shape", lambda x: type(x) is list and all(
                            type(n) is int and n >= 0 for n in x), "a list of sizes >= 0"),
                        ("dtype", lambda x: type(x) is str and x != "", "a dtype name"),
                        ("itemsize", lambda x: type(x) is int and x >= 0,
                         "an integer >= 0 (bytes)")):
        v = tab.get(f)
        if type(v) is not list:
            raise GraphError(f"{source}: field 'avals.{f}' is missing or not a list.")
        for k, x in enumerate(v):
            if not ok(x):
                raise GraphError(f"{source}: field 'avals.{f}' entry {k} is "
                                 f"{json.dumps(x)[:40]}; it must be {want}.")
        cols[f] = v
    n = len(cols["shape"])
    if len(cols["dtype"]) != n or len(cols["itemsize"]) != n:
        raise GraphError(f"{source}: 'avals.shape', 'avals.dtype' and 'avals.itemsize' must "
                         f"have one entry per aval; they have {n}, {len(cols['dtype'])} and "
                         f"{len(cols['itemsize'])}.")
    avals = [Aval(tuple(sh), dt, sz) for sh, dt, sz in
             zip(cols["shape"], cols["dtype"], cols["itemsize"], strict=True)]

    def aval_at(k, where: str) -> Aval:
        if type(k) is not int or not 0 <= k < n:
            raise GraphError(f"{source}: field '{where}' holds {json.dumps(k)[:40]}; it must "
                             f"be an index into 'avals' (0..{n - 1}).")
        return avals[k]

    out: dict[str, Any] = {}
    for section, f in (("ops", "in_avals"), ("ops", "out_avals"), ("ops", "attrs"),
                       ("params", "param_avals")):
        if f not in d[section]:
            raise GraphError(f"{source}: field '{section}.{f}' is missing (null when not "
                             "recorded).")
        v = d[section][f]
        if v is not None and type(v) is not list:
            raise GraphError(f"{source}: field '{section}.{f}' must be a list or null.")
        out[f] = v
    if out["param_avals"] is not None:
        out["param_avals"] = [aval_at(k, f"params.param_avals[{j}]")
                              for j, k in enumerate(out["param_avals"])]
    if out["attrs"] is not None:
        table = d.get("attrs")
        if type(table) is not list or not all(type(a) is dict for a in table):
            raise GraphError(f"{source}: section 'attrs' (the table of op parameters) must "
                             "be a list of objects.")
        frozen: dict[int, Mapping] = {}
        try:
            table = [_freeze_attrs(a, k, frozen, "'attrs' table entry") for k, a in
                     enumerate(table)]
        except GraphError as err:
            raise GraphError(f"{source}: {err}") from None
        attrs = []
        for i, k in enumerate(out["attrs"]):
            if type(k) is not int or not 0 <= k < len(table):
                raise GraphError(f"{source}: field 'ops.attrs' entry {i} is "
                                 f"{json.dumps(k)[:40]}; it must be an index into 'attrs' "
                                 f"(0..{len(table) - 1}).")
            attrs.append(table[k])
        out["attrs"] = attrs
    return _lookup_rows(out, avals, source)


def _lookup_rows(out: dict, avals: list[Aval], source: str) -> dict:
    """``ops.in_avals``/``ops.out_avals`` index rows replaced by Aval tuples; equal rows
    share one tuple (so the graph checks each once)."""
    n = len(avals)
    for f in ("in_avals", "out_avals"):
        if out[f] is None:
            continue
        interned: dict[tuple, tuple[Aval, ...]] = {}
        rows = []
        for i, row in enumerate(out[f]):
            if type(row) is not list:
                raise GraphError(f"{source}: field 'ops.{f}' entry {i} must be a list of "
                                 "indices into 'avals'.")
            if not all(type(k) is int and 0 <= k < n for k in row):
                k = next(k for k in row if not (type(k) is int and 0 <= k < n))
                raise GraphError(f"{source}: field 'ops.{f}[{i}]' holds "
                                 f"{json.dumps(k)[:40]}; it must be an index into 'avals' "
                                 f"(0..{n - 1}).")
            key = tuple(row)
            r = interned.get(key)
            if r is None:
                r = interned[key] = tuple(avals[k] for k in row)
            rows.append(r)
        out[f] = rows
    return out


_OP_SHAPE_FIELDS = ("in_avals", "out_avals", "attrs")


def _rows(values, field: str) -> Sequence:
    """A per-op (or per-parameter) sequence; numpy object arrays are taken as lists."""
    if isinstance(values, np.ndarray):
        return values.tolist() if values.ndim else []
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
        raise GraphError(f"OpGraph field '{field}' must be a sequence with one entry per "
                         f"op (or parameter), got {type(values).__name__}.")
    return values


def _aval_rows(values, field: str, cache: dict[int, Aval]) -> tuple[tuple[Aval, ...], ...]:
    """Per op, its values as a tuple of checked ``Aval``. Rows and Avals are checked once
    per distinct object (the trace and the loader share them among ops)."""
    done: dict[int, tuple[Aval, ...]] = {}
    out = []
    for i, row in enumerate(_rows(values, field)):
        r = done.get(id(row))
        if r is None:
            if isinstance(row, (str, bytes, Mapping)) or not isinstance(row, (
                    Sequence, np.ndarray)):
                raise GraphError(f"'{field}' of op {i} must be a sequence of Avals, got "
                                 f"{type(row).__name__}.")
            r = done[id(row)] = tuple(cache.get(id(a)) or _to_aval(a, field, i, cache)
                                      for a in row)
        out.append(r)
    return tuple(out)


def _to_aval(x, field: str, i: int, cache: dict[int, Aval]) -> Aval:
    """``x`` as an ``Aval`` (from an Aval or a ``(shape, dtype, itemsize)`` triple), checked:
    sizes and itemsize are integers >= 0, dtype a non-empty name; errors name ``field``
    of op (or parameter) ``i``. ``cache`` maps ids of values already checked (the trace
    shares one Aval among many ops)."""
    hit = cache.get(id(x))
    if hit is not None:
        return hit
    where = f"'{field}' entry {i}" if field == "param_avals" else f"'{field}' of op {i}"
    try:
        shape, dtype, itemsize = x
        dims = tuple(shape)
    except (TypeError, ValueError):
        raise GraphError(f"{where} must be a (shape, dtype, itemsize) Aval, got "
                         f"{x!r:.60}.") from None
    for n in dims:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise GraphError(f"{where}: shape {dims!r:.60} must hold integer sizes >= 0.")
    if not isinstance(dtype, str) or not dtype:
        raise GraphError(f"{where}: dtype must be a dtype name (float32, bfloat16...), got "
                         f"{dtype!r:.40}.")
    if isinstance(itemsize, bool) or not isinstance(itemsize, (int, np.integer)) or (
            itemsize < 0):
        raise GraphError(f"{where}: itemsize must be an integer >= 0 (bytes per element), "
                         f"got {itemsize!r:.40}.")
    out = Aval(tuple(int(n) for n in dims), dtype, int(itemsize))
    if type(x) is Aval and x == out:
        out = x
    cache[id(x)] = out
    return out


class _FrozenDict(dict):
    """A read-only dict: an op's ``attrs``. A dict (not a MappingProxyType) so that graphs
    pickle (process pools) and the mapping serialises as it is."""

    __slots__ = ()

    def _read_only(self, *args, **kwargs):
        raise TypeError("OpGraph attrs are read-only; build a new graph to change them.")

    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only

    def __reduce__(self):
        return (_FrozenDict, (dict(self),))

    def __repr__(self) -> str:
        return f"attrs({dict.__repr__(self)})"


def _freeze(v, where: str):
    """JSON-like ``v`` made read-only: mappings become read-only dicts, lists tuples."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        if not math.isfinite(v):
            raise GraphError(f"{where}: {v!r} is not a finite number (JSON has none).")
        return float(v)
    if isinstance(v, Mapping):
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise GraphError(f"{where}: keys must be strings, got {k!r:.40}.")
            out[k] = _freeze(x, f"{where}.{k}")
        return _FrozenDict(out)
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x, f"{where}[{k}]") for k, x in enumerate(v))
    raise GraphError(f"{where}: {type(v).__name__} is not JSON-like data (mappings, lists, "
                     "numbers, strings, booleans, null).")


def _freeze_attrs(a, i: int, cache: dict[int, Mapping], what: str = "'attrs' of op") -> Mapping:
    """Op ``i``'s parameters, frozen once per distinct mapping object (``cache``)."""
    hit = cache.get(id(a))
    if hit is not None:
        return hit
    if not isinstance(a, Mapping):
        raise GraphError(f"{what} {i} must be a mapping of parameter names to values, got "
                         f"{type(a).__name__}.")
    out = cache[id(a)] = _freeze(a, f"{what} {i}")
    return out


def _thaw(v):
    """The JSON form of a frozen value: mappings to dicts, tuples to lists."""
    if isinstance(v, Mapping):
        return {k: _thaw(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return [_thaw(x) for x in v]
    return v


_INT_FIELDS = ("src", "dst", "edge_output", "param_op", "param_index")
# Bounds of an op's work and of any tensor's bytes: far beyond any real model (a
# zettaFLOP op takes 11 days at a PFLOP/s; an exbibyte tensor fits no machine), so a value
# past them is a unit error or garbage, never a graph to price.
MAX_FLOPS = 1e21
MAX_BYTES = float(2**60)
_STR_FIELDS = _OP_STR_FIELDS + ("param_names",)


def _check_json_list(values, field: str, where: str, source: str) -> None:
    """Strict types of one field of a graph file, before numpy converts anything: indices
    are integers (numpy would truncate 2.7 to 2 and read ``true`` as 1), sizes are
    numbers (not booleans), ``is_output`` entries are booleans, names are strings."""
    if not isinstance(values, list):
        raise GraphError(f"{source}: field '{where}' must be a list, got "
                         f"{type(values).__name__}.")
    if field in _INT_FIELDS:
        ok, want = (lambda x: type(x) is int), "an integer (an index)"
    elif field == "is_output":
        ok, want = (lambda x: type(x) is bool), "true or false"
    elif field in _STR_FIELDS:
        ok, want = (lambda x: type(x) is str), "a string"
    else:
        ok, want = (lambda x: type(x) in (int, float)), "a number"
    for i, x in enumerate(values):
        if not ok(x):
            raise GraphError(f"{source}: field '{where}' entry {i} is {json.dumps(x)[:40]}; "
                             f"it must be {want}.")


def _index_array(values, field: str) -> np.ndarray:
    """int32[N] of op, output or parameter indices; booleans and non-integral numbers are
    refused rather than truncated, and values beyond int32 (how indices are stored)
    rather than wrapped."""
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind == "O" and all(
            isinstance(x, numbers.Integral) and not isinstance(x, bool | np.bool_)
            for x in arr.reshape(-1)):
        arr = np.array([int(x) for x in arr.reshape(-1)], dtype=object)  # big Python ints
    elif arr.size and arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f":
            frac = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
            if frac.size:
                k = int(frac[0])
                raise GraphError(f"OpGraph field '{field}' holds indices, which must be "
                                 f"integers; entry {k} is {arr.reshape(-1)[k]!r}.")
        else:
            raise GraphError(f"OpGraph field '{field}' holds indices, which must be integers; "
                             f"got values of type {arr.dtype}.")
    flat = arr.reshape(-1)
    if flat.size:
        lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
        out = [k for k in (int(np.argmin(flat)), int(np.argmax(flat)))
               if not lo <= flat[k] <= hi]
        if out:
            k = out[0]
            raise GraphError(f"OpGraph field '{field}' entry {k} is {int(flat[k])}, beyond "
                             f"the int32 range indices are stored in ({lo}..{hi}): not a "
                             "valid index.")
    return flat.astype(np.int64).astype(np.int32)


def _float_array(values, field: str) -> np.ndarray:
    """float64[N] of sizes or counts; strings, booleans and None are refused rather than
    converted."""
    arr = np.asarray(values)
    # numpy reads [True, 2] as integers: look at the entries of a list themselves.
    if arr.size and (arr.dtype.kind not in "iuf" or (
            isinstance(values, list | tuple) and any(isinstance(x, bool) for x in values))):
        flat = arr.reshape(-1) if arr.dtype.kind not in "iuf" else list(values)
        for k, x in enumerate(flat):
            if not isinstance(x, numbers.Real) or isinstance(x, bool | np.bool_):
                x = x.item() if isinstance(x, np.generic) else x
                raise GraphError(f"OpGraph field '{field}' holds numbers; entry {k} is "
                                 f"{x!r} ({type(x).__name__}).")
        try:
            return np.array([float(x) for x in flat], dtype=np.float64)
        except OverflowError:
            raise GraphError(f"OpGraph field '{field}' has a number too large for a "
                             "float64.") from None
    return arr.astype(np.float64).reshape(-1)


def _bool_array(values, field: str) -> np.ndarray:
    """bool[N]; integers 0/1 are taken as booleans, anything else is refused."""
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind != "b" and (
            arr.dtype.kind not in "iu" or not np.all((arr == 0) | (arr == 1))):
        raise GraphError(f"OpGraph field '{field}' must hold booleans (True/False); got "
                         f"values of type {arr.dtype}.")
    return arr.astype(bool).reshape(-1)


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


def _csr(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(keys, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.add.at(ptr, keys + 1, 1)
    return _frozen(np.cumsum(ptr)), _frozen(order)


def _digraph(m: int, src, dst) -> nx.DiGraph:
    """Nodes 0..m-1 (in that order) and the edges ``src[k] -> dst[k]``."""
    g = nx.DiGraph()
    g.add_nodes_from(range(m))
    g.add_edges_from(zip(np.asarray(src).tolist(), np.asarray(dst).tolist(), strict=True))
    return g


def topological_order(m: int, src, dst) -> np.ndarray | None:
    """A topological order of nodes 0..m-1 under the edges ``src -> dst``, the lowest
    index first among ready nodes (so an already ordered graph keeps its order); None if
    there is a cycle (``find_cycle`` names one)."""
    src, dst = np.asarray(src), np.asarray(dst)
    if np.all(src < dst):
        # Every edge goes forward, so each node's predecessors come before it and the
        # lowest unplaced node is always ready: the order is the identity. This is the
        # common case (traced graphs, quotients numbered by first op) and skips building
        # a networkx graph, about 0.2 s for a 22k-op graph.
        return np.arange(m, dtype=np.int64)
    try:
        order = nx.lexicographical_topological_sort(_digraph(m, src, dst))
        return np.fromiter(order, dtype=np.int64, count=m)
    except nx.NetworkXUnfeasible:
        return None


def find_cycle(m: int, src, dst) -> list[int]:
    """The nodes of one cycle, first node repeated at the end; [] if there is none."""
    try:
        cyc = nx.find_cycle(_digraph(m, src, dst))
    except nx.NetworkXNoCycle:
        return []
    return [int(u) for u, _ in cyc] + [int(cyc[0][0])]

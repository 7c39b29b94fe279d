"""OpGraph: the one computation-graph representation every part of simplace works on."""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import heapq
import json
import os
from typing import Any

import numpy as np

from simplace._jsonfile import read_json, write_json
from simplace.errors import GraphError

SCHEMA = "simplace.opgraph"
SCHEMA_VERSION = 1

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
    name: str = ""
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        set_ = functools.partial(object.__setattr__, self)
        for f in _OP_STR_FIELDS:
            set_(f, _frozen(_str_array(getattr(self, f))))
        for f in _OP_FLOAT_FIELDS:
            set_(f, _frozen(np.asarray(getattr(self, f), dtype=np.float64).reshape(-1)))
        m = len(self.op)
        set_("src", _frozen(_index_array(self.src, "src")))
        set_("dst", _frozen(_index_array(self.dst, "dst")))
        set_("edge_bytes", _frozen(np.asarray(self.edge_bytes, dtype=np.float64).reshape(-1)))
        e = len(self.src)
        eo = np.zeros(e, dtype=np.int32) if self.edge_output is None else self.edge_output
        set_("edge_output", _frozen(_index_array(eo, "edge_output")))
        io = np.zeros(m, dtype=bool) if self.is_output is None else self.is_output
        set_("is_output", _frozen(_bool_array(io, "is_output")))
        set_("param_names", _frozen(_str_array([] if self.param_names is None
                                               else self.param_names)))
        ps = [] if self.param_sizes is None else self.param_sizes
        set_("param_sizes", _frozen(np.asarray(ps, dtype=np.float64).reshape(-1)))
        for f in ("param_op", "param_index"):
            v = getattr(self, f)
            set_(f, _frozen(_index_array([] if v is None else v, f)))
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
            bad = np.flatnonzero(~np.isfinite(v) | (v < 0))
            if bad.size:
                i = int(bad[0])
                where = f"op {i} ({self.op[i]} at '{self.name_path[i]}')" if (
                    f in _OP_FLOAT_FIELDS) else f"entry {i}"
                raise GraphError(
                    f"OpGraph field '{f}' must be finite and >= 0, but {where} is {v[i]!r} "
                    f"({bad.size} bad entries in all)."
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
        if e and np.any(self.edge_output < 0):
            raise GraphError("'edge_output' must be >= 0 (an output index of the producer).")
        self_loops = np.flatnonzero(self.src == self.dst)
        if self_loops.size:
            i = int(self.src[self_loops[0]])
            raise GraphError(f"Edge {int(self_loops[0])} is a self-loop on op {i}: "
                             "an op cannot consume its own output.")
        backward = np.flatnonzero(self.src > self.dst)
        if backward.size:
            cycle = _find_cycle(m, self.src, self.dst)
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
        order = _topological_order(m, src, dst)
        if order is None:
            cycle = _find_cycle(m, src, dst)
            path = " -> ".join(f"{i} ({fields['op'][i]})" for i in cycle)
            raise GraphError(f"The graph has a cycle: {path}. A computation graph must be "
                             "acyclic; remove one of these edges.")
        rank = np.empty(m, dtype=np.int64)
        rank[order] = np.arange(m)
        out = dict(fields)
        per_op = _OP_STR_FIELDS + _OP_FLOAT_FIELDS + ("is_output",)
        for f in per_op:
            if out.get(f) is not None:
                out[f] = np.asarray(out[f])[order] if m else out[f]
        out["src"], out["dst"] = rank[src], rank[dst]
        if out.get("param_op") is not None:
            out["param_op"] = rank[_index_array(out["param_op"], "param_op")]
        meta = dict(out.get("meta") or {})
        meta["original_index"] = [int(i) for i in order]
        out["meta"] = meta
        return cls(**out)

    # ------------------------------------------------------------------ sizes and derived
    @property
    def num_ops(self) -> int:
        return len(self.op)

    @property
    def num_edges(self) -> int:
        return len(self.src)

    @property
    def num_params(self) -> int:
        return len(self.param_names)

    @functools.cached_property
    def param_bytes(self) -> np.ndarray:
        """float64[M]: bytes of the parameters each op reads."""
        out = np.zeros(self.num_ops)
        np.add.at(out, self.param_op, self.param_sizes[self.param_index])
        return _frozen(out)

    @functools.cached_property
    def hash(self) -> str:
        """Content hash (hex sha256) over ops, edges and parameters; not name or meta."""
        h = hashlib.sha256()
        h.update(f"{SCHEMA}/{SCHEMA_VERSION}".encode())
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
        ptr, order = self.in_edges
        return np.unique(self.src[order[ptr[i]:ptr[i + 1]]])

    def successors(self, i: int) -> np.ndarray:
        ptr, order = self.out_edges
        return np.unique(self.dst[order[ptr[i]:ptr[i + 1]]])

    # ------------------------------------------------------------------ conversions
    def to_networkx(self):
        """A ``networkx.DiGraph`` with one node per op (all per-op fields as attributes)
        and one edge per connected op pair (``bytes`` summed over the tensors it carries)."""
        import networkx as nx

        g = nx.DiGraph(name=self.name, hash=self.hash)
        pb = self.param_bytes
        for i in range(self.num_ops):
            g.add_node(i, op=str(self.op[i]), name_path=str(self.name_path[i]),
                       flops=float(self.flops[i]), bytes_accessed=float(self.bytes_accessed[i]),
                       out_bytes=float(self.out_bytes[i]), param_bytes=float(pb[i]),
                       signature=str(self.signature[i]), is_output=bool(self.is_output[i]))
        for s, d, b in zip(self.src.tolist(), self.dst.tolist(), self.edge_bytes.tolist(),
                           strict=True):
            if g.has_edge(s, d):
                g[s][d]["bytes"] += b
            else:
                g.add_edge(s, d, bytes=b)
        return g

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "hash": self.hash,
            "name": self.name,
            "meta": self.meta,
            "ops": {f: getattr(self, f).tolist() for f in
                    _OP_STR_FIELDS + _OP_FLOAT_FIELDS + ("is_output",)},
            "edges": {f: getattr(self, f).tolist() for f in _EDGE_FIELDS},
            "params": {f: getattr(self, f).tolist() for f in _PARAM_FIELDS},
        }

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "<dict>") -> OpGraph:
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise GraphError(f"{source} is not a simplace op graph (its 'schema' field is not "
                             f"'{SCHEMA}'). Save graphs with OpGraph.save or `simplace graph "
                             "--out`.")
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise GraphError(f"{source} has op-graph schema_version {version!r}; this simplace "
                             f"reads version {SCHEMA_VERSION}. Re-save the graph with this "
                             "version.")
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
            f"  compute {_fmt_flops(s['gflops'] * 1e9)}   parameters {_fmt_bytes(s['param_bytes'])}"
            f"   activations {_fmt_bytes(s['activation_bytes'])}",
        ]
        if s["primitives"]:
            common = ", ".join(f"{k} {v}" for k, v in s["primitives"].most_common(top))
            lines.append(f"  most common primitives: {common}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"OpGraph(name={self.name!r}, ops={self.num_ops}, edges={self.num_edges}, "
                f"params={self.num_params}, hash={self.hash[:12]})")


_INT_FIELDS = ("src", "dst", "edge_output", "param_op", "param_index")
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
    refused rather than truncated."""
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f":
            frac = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
            if frac.size:
                k = int(frac[0])
                raise GraphError(f"OpGraph field '{field}' holds indices, which must be "
                                 f"integers; entry {k} is {arr.reshape(-1)[k]!r}.")
        else:
            raise GraphError(f"OpGraph field '{field}' holds indices, which must be integers; "
                             f"got values of type {arr.dtype}.")
    return arr.astype(np.int64).reshape(-1).astype(np.int32)


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


def _fmt_bytes(n: float) -> str:
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


def _topological_order(m: int, src, dst) -> np.ndarray | None:
    """Kahn's algorithm, lowest index first among ready ops; None if there is a cycle."""
    indeg = np.zeros(m, dtype=np.int64)
    np.add.at(indeg, dst, 1)
    succ = [[] for _ in range(m)]
    for s, d in zip(np.asarray(src).tolist(), np.asarray(dst).tolist(), strict=True):
        succ[s].append(d)
    ready = [i for i in range(m) if indeg[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    return np.asarray(order, dtype=np.int64) if len(order) == m else None


def _find_cycle(m: int, src, dst) -> list[int]:
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(range(m))
    g.add_edges_from(zip(np.asarray(src).tolist(), np.asarray(dst).tolist(), strict=True))
    try:
        cyc = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        return []
    return [int(u) for u, _ in cyc] + [int(cyc[0][0])]

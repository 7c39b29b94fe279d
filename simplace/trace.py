"""Trace a JAX function into an ``OpGraph``.

``trace(fn, *args)`` runs ``jax.make_jaxpr`` once and walks the jaxpr:

- call-like equations (jit/pjit, closed_call, core_call, custom_jvp_call, custom_vjp_call,
  remat/checkpoint, and any other primitive with a single sub-jaxpr whose inputs and
  outputs match the equation's) are inlined, so their inner equations become ops and
  edges run across the former call boundary;
- ``scan`` and ``while`` become one op costed as body x trip count (flops and bytes:
  a loop's bytes_accessed is its body's, times the trips), ``cond`` one op costed as its
  most expensive branch. A ``while`` trip count is inferred for the fori_loop pattern
  with literal bounds; otherwise it counts as one trip and the trace warns;
- every other equation is one op, costed by ``simplace._primitive_costs``;
- dead code (results that reach no output and have no effect) is dropped.

Edges join a consumer to the op that produced each tensor it reads (one edge per
distinct tensor); function inputs and literals make no edges.

Each op carries its operands' and outputs' shapes and dtypes (``OpGraph.in_avals``,
``out_avals``) and its primitive's parameters (``attrs``) as data; its ``signature``
prints the same for the cost model's op-time tables and is never parsed back.

For simplace's own modules, not in ``__all__``: ``walk`` (the walk ``trace`` makes,
returned as a ``Walk`` whose ``graph`` is ``trace``'s result), ``Builder`` and ``Value``
(what a walk records, extended by ``simplace.validate.executor`` so that op i of a
placed program is op i of the graph), and ``aval_nbytes``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from simplace import _primitive_costs as costs
from simplace._lazy import LazyModule
from simplace._trace_paths import _common_module_prefix, _join_path, module_path
from simplace._trace_values import (
    _aval_str,
    _dtype_bytes,  # noqa: F401 - tests read it here
    _make_aval,
    _params,
    aval_nbytes,
)
from simplace.errors import TraceError
from simplace.graph import Aval, OpGraph

__all__ = ["trace", "op_specs", "module_path"]

# Imported on first use: ``import simplace`` (which exports ``trace``) must not wait for
# JAX in commands that never trace.
jax = LazyModule("jax")
jcore = LazyModule("jax.extend.core")

LOOP_PRIMITIVES = frozenset({"scan", "while"})


# --------------------------------------------------------------------------- the walk
class Value:
    """What a jaxpr variable holds during the walk: output ``out`` of op ``op`` (-1: no
    op), parameter leaf ``param`` (-1: none), its ``nbytes``, and a scalar ``literal``'s
    value (None otherwise). Subclasses may add slots (the executor records where an
    input or constant comes from)."""

    __slots__ = ("op", "out", "param", "nbytes", "literal")

    def __init__(self, op=-1, out=0, param=-1, nbytes=0, literal=None):
        self.op, self.out, self.param, self.nbytes, self.literal = (
            op, out, param, nbytes, literal)


def _sub_jaxpr(v):
    """(Jaxpr, consts) for a Jaxpr or ClosedJaxpr param value, else None."""
    if isinstance(v, jcore.ClosedJaxpr):
        return v.jaxpr, v.consts
    if isinstance(v, jcore.Jaxpr):
        return v, ()
    return None


def _avals_match(vars_a, vars_b) -> bool:
    if len(vars_a) != len(vars_b):
        return False
    for a, b in zip(vars_a, vars_b, strict=True):
        sa, sb = getattr(a.aval, "shape", None), getattr(b.aval, "shape", None)
        if sa != sb:
            return False
    return True


def _inline_target(eqn):
    """The (jaxpr, consts) to inline for a call-like equation, or None."""
    subs = [s for v in eqn.params.values() if (s := _sub_jaxpr(v)) is not None]
    if len(subs) != 1:
        return None
    jaxpr, consts = subs[0]
    # Only a true call: same inputs and outputs (shard_map, pmap... change shapes).
    if len(jaxpr.constvars) != len(consts) or not _avals_match(jaxpr.invars, eqn.invars) \
            or not _avals_match(jaxpr.outvars, eqn.outvars):
        return None
    return jaxpr, consts


class Builder:
    """The walk of a jaxpr into per-op lists (``op``, ``flops``, ``src``/``dst``...) that
    ``Walk.graph`` turns into an OpGraph. ``walk`` makes one; a subclass can record more
    through three hooks, each calling ``super()`` where it overrides: ``input_val`` (a
    function input), ``const_val`` (a closed-over constant) and ``emit`` (one op, with
    the ``env`` of variable values before its outputs are bound)."""

    def __init__(self, unknown: dict[str, int], loose_whiles: list[str],
                 keep_specs: bool = False):
        self.unknown = unknown  # primitive -> count, shared with nested loop bodies
        self.loose_whiles = loose_whiles  # while loops whose trip count is unknown
        self.keep_specs = keep_specs
        self.specs: list[tuple] = []  # per op (primitive, params, in avals), when asked
        self.effectful: list[bool] = []  # ops with side effects are never dead code
        self.op: list[str] = []
        self.name_path: list[str] = []
        self.flops: list[float] = []
        self.bytes: list[float] = []
        self.out_bytes: list[float] = []
        self.signature: list[str] = []
        self.in_avals: list[tuple[Aval, ...]] = []
        self.out_avals: list[tuple[Aval, ...]] = []
        self.attrs: list[dict] = []
        self.param_avals: list[Aval] = []  # set by walk()
        self.src: list[int] = []
        self.dst: list[int] = []
        self.edge_bytes: list[float] = []
        self.edge_output: list[int] = []
        self.param_op: list[int] = []
        self.param_index: list[int] = []
        self.loops = 0
        self._path_cache: dict[tuple, str] = {}
        self._aval_cache: dict[Any, str] = {}
        self._aval_data_cache: dict[Any, Aval] = {}
        self._aval_rows: dict[tuple[Aval, ...], tuple[Aval, ...]] = {}
        self._attrs_cache: dict[tuple[str, str], dict] = {}
        self._body_paths: list[str] = []  # name paths inside the loop being costed

    # -- variables
    # Hooks for what a function input or a closed-over constant holds; the executor
    # (simplace.validate.executor) overrides them to remember where each value comes from.
    def input_val(self, leaf: int, var, param: int) -> Value:
        """The Value of a function input: parameter leaf ``param``, no op."""
        return Value(param=param, nbytes=aval_nbytes(var.aval))

    def const_val(self, var, value) -> Value:
        """The Value of a closed-over constant: no op, no parameter."""
        return Value(nbytes=aval_nbytes(var.aval))

    @staticmethod
    def read(env: dict, v) -> Value:
        """The Value of jaxpr atom ``v``: from ``env``, or a literal's (a scalar keeps its
        value)."""
        if isinstance(v, jcore.Literal):
            val = v.val  # keep scalar values: while-loop bounds are often literals
            lit = val.item() if np.ndim(val) == 0 and hasattr(val, "item") else (
                val if isinstance(val, (int, float, bool)) else None)
            return Value(nbytes=aval_nbytes(v.aval), literal=lit)
        return env[v]

    def _path(self, stack) -> str:
        key = stack.stack
        p = self._path_cache.get(key)
        if p is None:
            p = self._path_cache[key] = module_path(key)
        return p

    def _avals_str(self, invars) -> str:
        out = []
        for v in invars:
            a = v.aval
            try:
                s = self._aval_cache.get(a)
            except TypeError:
                s = None
                a = None
            if s is None:
                s = _aval_str(v.aval)
                if a is not None:
                    self._aval_cache[a] = s
            out.append(s)
        return ",".join(out)

    def _avals(self, avals) -> tuple[Aval, ...]:
        out = []
        cache = self._aval_data_cache
        for a in avals:
            try:
                x = cache.get(a)
            except TypeError:  # an unhashable abstract value
                x = _make_aval(a)
            else:
                if x is None:
                    x = cache[a] = _make_aval(a)
            out.append(x)
        out = tuple(out)
        # one tuple per distinct row: the graph checks and the file stores each once
        return self._aval_rows.setdefault(out, out)

    # -- walking
    def walk(self, jaxpr, env: dict, prefix) -> None:
        """Walk the equations of ``jaxpr``, inlining true calls and emitting one op per other
        equation; ``prefix`` is the enclosing name stack."""
        read = self.read
        for eqn in jaxpr.eqns:
            stack = prefix + eqn.source_info.name_stack if prefix is not None else \
                eqn.source_info.name_stack
            name = eqn.primitive.name
            if name not in LOOP_PRIMITIVES and name != "cond":
                target = _inline_target(eqn)
                if target is not None:
                    sub, consts = target
                    inner = {cv: self.const_val(cv, c)
                             for cv, c in zip(sub.constvars, consts, strict=True)}
                    for iv, ov in zip(sub.invars, eqn.invars, strict=True):
                        inner[iv] = read(env, ov)
                    self.walk(sub, inner, stack)
                    for ov, iv in zip(eqn.outvars, sub.outvars, strict=True):
                        if not isinstance(ov, jcore.DropVar):
                            env[ov] = read(inner, iv)
                    continue
            self.emit(eqn, env, stack)

    def emit(self, eqn, env: dict, stack) -> None:
        """Record one op for equation ``eqn``: its costs, its edges from ``env``'s values, and its
        outputs bound in ``env``."""
        name = eqn.primitive.name
        ins = [self.read(env, v) for v in eqn.invars]
        in_avals = [v.aval for v in eqn.invars]
        out_avals = [v.aval for v in eqn.outvars]
        sig_extra = ""
        path = self._path(stack)
        if name in LOOP_PRIMITIVES or name == "cond":
            self._body_paths = []
            flops, nbytes, sig_extra = self._control_flow_cost(eqn, ins)
            self.loops += name in LOOP_PRIMITIVES
            path = _join_path(path, _common_module_prefix(self._body_paths))
        else:
            flops = costs.flops(name, eqn.params, in_avals, out_avals)
            if flops is None:
                self.unknown[name] = self.unknown.get(name, 0) + 1
                flops = costs.generic_flops(out_avals)
            nbytes = None
        out_nbytes = [aval_nbytes(a) for a in out_avals]
        if nbytes is None:
            if costs.is_view(name):
                nbytes = 0.0
            else:
                seen_ids = set()
                nbytes = float(sum(out_nbytes))
                for val, v in zip(ins, eqn.invars, strict=True):
                    if isinstance(v, jcore.Literal) or id(val) in seen_ids:
                        continue  # literals are baked into the op; a value read twice is
                    seen_ids.add(id(val))  # fetched once
                    nbytes += val.nbytes
        i = len(self.op)
        params_str, attrs = _params(eqn.params)
        sig = f"{name}|{self._avals_str(eqn.invars)}|{params_str}{sig_extra}"
        self.op.append(name)
        self.name_path.append(path)
        self.flops.append(float(flops))
        self.bytes.append(float(nbytes))
        self.out_bytes.append(float(sum(out_nbytes)))
        self.signature.append(sig)
        self.in_avals.append(self._avals(in_avals))
        self.out_avals.append(self._avals(out_avals))
        # Equal parameter text, equal parameters: one mapping shared by those ops.
        self.attrs.append(self._attrs_cache.setdefault((name, params_str), attrs))
        self.effectful.append(bool(eqn.effects))
        if self.keep_specs:
            self.specs.append((eqn.primitive, dict(eqn.params), tuple(
                jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "shape") else a
                for a in in_avals)))
        seen: set[tuple[int, int]] = set()
        params_read: set[int] = set()
        for val in ins:
            if val.op >= 0:
                key = (val.op, val.out)
                if key not in seen:
                    seen.add(key)
                    self.src.append(val.op)
                    self.dst.append(i)
                    self.edge_bytes.append(float(val.nbytes))
                    self.edge_output.append(val.out)
            elif val.param >= 0 and val.param not in params_read:
                params_read.add(val.param)
                self.param_op.append(i)
                self.param_index.append(val.param)
        for k, (v, b) in enumerate(zip(eqn.outvars, out_nbytes, strict=True)):
            if not isinstance(v, jcore.DropVar):
                env[v] = Value(op=i, out=k, nbytes=b)

    # -- loops and conditionals
    def _body_cost(self, closed):
        """(flops, bytes, digest) of one run of a sub-jaxpr, nested loops included."""
        jaxpr, _ = _sub_jaxpr(closed)
        sub = Builder(self.unknown, self.loose_whiles)
        env = {cv: Value(nbytes=aval_nbytes(cv.aval)) for cv in jaxpr.constvars}
        for v in jaxpr.invars:
            env[v] = Value(nbytes=aval_nbytes(v.aval))
        sub.walk(jaxpr, env, None)
        self.loops += sub.loops
        digest = hashlib.sha1("\n".join(sub.signature).encode()).hexdigest()[:12]
        self._body_paths.extend(sub.name_path)
        return float(sum(sub.flops)), float(sum(sub.bytes)), digest

    def _control_flow_cost(self, eqn, ins: list[Value]) -> tuple[float, float, str]:
        name, p = eqn.primitive.name, eqn.params
        if name == "scan":
            f, b, d = self._body_cost(p["jaxpr"])
            n = int(p["length"])
            return f * n, b * n, f";body={d}"
        if name == "cond":
            best = (-1.0, 0.0)
            digests = []
            for br in p["branches"]:
                f, b, d = self._body_cost(br)
                best = max(best, (f, b))
                digests.append(d)
            return best[0], best[1], f";branches=({','.join(digests)})"
        # while: cost (cond + body) x trip count
        fc, bc, dc = self._body_cost(p["cond_jaxpr"])
        fb, bb, db = self._body_cost(p["body_jaxpr"])
        trips = _while_trip_count(eqn, ins)
        if trips is None:
            trips = 1
            self.loose_whiles.append(eqn.primitive.name)
        return (fc + fb) * trips, (bc + bb) * trips, f";trips={trips};cond={dc};body={db}"


def _position(var, seq) -> int | None:
    """Index of ``var`` in ``seq`` by identity (Literals compare by value otherwise)."""
    for k, x in enumerate(seq):
        if x is var:
            return k
    return None


def _while_trip_count(eqn, ins: list[Value]) -> int | None:
    """Trip count of a ``fori_loop``-shaped while loop with known bounds, else None.

    The pattern: the condition is ``lt(carry[i], carry[j] or a literal)`` and the body
    adds the literal 1 to carry[i] and passes carry[j] through unchanged.
    """
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    carries = ins[cn + bn:]
    cond, body = p["cond_jaxpr"].jaxpr, p["body_jaxpr"].jaxpr
    if len(cond.eqns) != 1 or cond.eqns[0].primitive.name != "lt":
        return None
    cond_carry = cond.invars[cn:]
    lo_var, hi_var = cond.eqns[0].invars
    i = _position(lo_var, cond_carry)
    if cond.outvars[0] is not cond.eqns[0].outvars[0] or i is None:
        return None
    lo = carries[i].literal
    j = _position(hi_var, cond_carry)
    if isinstance(hi_var, jcore.Literal):
        hi = hi_var.val
    elif j is not None:
        hi = carries[j].literal
    else:
        return None
    body_carry = body.invars[bn:]
    if j is not None and body.outvars[j] is not body_carry[j]:
        return None  # the bound changes inside the loop
    step_ok = any(
        e.primitive.name == "add" and e.outvars[0] is body.outvars[i]
        and _position(body_carry[i], e.invars) is not None
        and any(isinstance(x, jcore.Literal) and np.ndim(x.val) == 0 and x.val == 1
                for x in e.invars)
        for e in body.eqns)
    try:
        lo_i, hi_i = int(lo), int(hi)
    except (TypeError, ValueError):
        return None
    return max(0, hi_i - lo_i) if step_ok else None


# --------------------------------------------------------------------------- parameters
def _key_str(path) -> str:
    return jax.tree_util.keystr(tuple(path), simple=True, separator="/")


def _param_leaves(args: tuple, param_argnums: tuple[int, ...]):
    """Per flat input leaf: parameter index or -1; plus parameter names, sizes and Avals."""
    leaf_param: list[int] = []
    names: list[str] = []
    sizes: list[float] = []
    avals: list[Aval] = []
    multi = len(param_argnums) > 1
    for argnum, arg in enumerate(args):
        leaves, _ = jax.tree_util.tree_flatten_with_path(arg)
        is_param = argnum in param_argnums
        for path, leaf in leaves:
            if is_param and hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
                key = _key_str(path)
                prefix = f"arg{argnum}" if (multi or not key) else ""
                names.append("/".join(s for s in (prefix, key) if s))
                avals.append(_make_aval(leaf))
                sizes.append(float(avals[-1].nbytes))
                leaf_param.append(len(names) - 1)
            else:
                leaf_param.append(-1)
    return leaf_param, names, sizes, avals


def _normalize_argnums(param_argnums, nargs: int) -> tuple[int, ...]:
    if isinstance(param_argnums, int):
        param_argnums = (param_argnums,)
    out = []
    for a in param_argnums:
        if not isinstance(a, int) or not -nargs <= a < nargs:
            raise TraceError(
                f"param_argnums contains {a!r}, but the function was given {nargs} "
                f"positional argument(s) (valid indices 0..{nargs - 1}). Pass the index of "
                "the argument that holds the model parameters, or param_argnums=() for none."
            )
        a %= nargs
        if a not in out:
            out.append(a)
    return tuple(out)


# --------------------------------------------------------------------------- public API
def _make_jaxpr(fn, args):
    if not callable(fn):
        raise TraceError(f"trace() needs a callable as its first argument, got "
                         f"{type(fn).__name__}.")
    try:
        return jax.make_jaxpr(fn, return_shape=True)(*args)
    except Exception as err:  # noqa: BLE001 - re-raised with context
        raise TraceError(
            f"jax.make_jaxpr failed on {getattr(fn, '__name__', fn)!r}: "
            f"{type(err).__name__}: {str(err).rstrip('.')}. Check that the function runs on "
            "these arguments; "
            "array leaves may be arrays or jax.ShapeDtypeStruct, and non-array options "
            "should be bound with functools.partial."
        ) from err


def walk(fn, args: Sequence, param_argnums: int | Sequence[int] = (0,), *,
         keep_specs: bool = False, builder: type[Builder] | None = None) -> Walk:
    """Walk ``fn(*args)``'s jaxpr with a ``builder`` (default ``Builder``), as ``trace``
    does; ``Walk.graph`` assembles the OpGraph. The builder keeps, besides the ops,
    ``outputs`` (the ``Value`` of each jaxpr output), ``out_shape`` and ``out_tree`` (the
    ShapeDtypeStructs and pytree structure of ``fn``'s result). ``keep_specs``: also
    keep each op's primitive, parameters and input shapes (``op_specs``)."""
    argnums = _normalize_argnums(param_argnums, len(args))
    closed, out_shape = _make_jaxpr(fn, args)
    jaxpr = closed.jaxpr
    leaf_param, names, sizes, param_avals = _param_leaves(args, argnums)
    if len(leaf_param) != len(jaxpr.invars):
        raise TraceError(
            f"The traced function has {len(jaxpr.invars)} inputs but its arguments have "
            f"{len(leaf_param)} leaves; simplace cannot tell which inputs are parameters. "
            "Pass only pytrees of arrays as positional arguments (no keyword arguments)."
        )
    unknown: dict[str, int] = {}
    loose_whiles: list[str] = []
    b = (builder or Builder)(unknown, loose_whiles, keep_specs)
    b.param_avals = param_avals
    env: dict = {cv: b.const_val(cv, c)
                 for cv, c in zip(jaxpr.constvars, closed.consts, strict=True)}
    for k, (v, pidx) in enumerate(zip(jaxpr.invars, leaf_param, strict=True)):
        env[v] = b.input_val(k, v, pidx)
    b.walk(jaxpr, env, None)
    is_output = np.zeros(len(b.op), dtype=bool)
    b.outputs = [Builder.read(env, v) for v in jaxpr.outvars]
    b.out_shape = out_shape
    b.out_tree = jax.tree_util.tree_structure(out_shape)
    for val in b.outputs:
        if val.op >= 0:
            is_output[val.op] = True
    _warn(unknown, loose_whiles)
    return Walk(b, is_output, names, sizes, unknown)


def _warn(unknown: dict[str, int], loose_whiles: list[str]) -> None:
    parts = []
    if unknown:
        listed = ", ".join(f"{k} (x{n})" for k, n in sorted(unknown.items()))
        parts.append(f"no cost rule for primitive(s) {listed}: costed generically as one "
                     "FLOP per output element and bytes = inputs + outputs")
    if loose_whiles:
        parts.append(f"{len(loose_whiles)} while loop(s) with a trip count that cannot be "
                     "inferred statically: costed as ONE iteration")
    if parts:
        warnings.warn("simplace.trace: " + "; ".join(parts) + ". Calibrate these ops by "
                      "signature, or add a rule to simplace/_primitive_costs.py.",
                      stacklevel=4)  # the caller of trace()


def trace(fn, *args, param_argnums: int | Sequence[int] = (0,), name: str = "",
          dce: bool = True) -> OpGraph:
    """Trace ``fn(*args)`` into an OpGraph (one op per primitive after inlining calls).

    ``args`` may hold arrays or ``jax.ShapeDtypeStruct`` leaves (nothing is allocated).
    Every array leaf of the arguments at ``param_argnums`` is a parameter, named by its
    pytree path (``params/Conv_0/kernel``). ``name`` defaults to ``fn.__name__``.
    Primitives without a cost rule are costed generically and listed in one warning.
    With ``dce`` (default) ops whose results are never used are dropped, as XLA would.
    """
    t0 = time.perf_counter()
    return walk(fn, args, param_argnums).graph(name=name or getattr(fn, "__name__", ""),
                                               dce=dce, t0=t0)


@dataclasses.dataclass(eq=False)
class Walk:
    """One walk of a function's jaxpr (``walk``), before dead code is dropped.

    builder: the ``Builder`` (or subclass) that walked it: per op, in jaxpr order.
    is_output: bool[ops], the ops whose results are the function's outputs.
    param_names, param_sizes: one per parameter leaf.
    unknown: primitives without a cost rule, and how many ops each.
    """

    builder: Builder
    is_output: np.ndarray
    param_names: tuple
    param_sizes: tuple
    unknown: dict[str, int]

    def live_ops(self) -> np.ndarray:
        """bool[ops]: ops whose result reaches an output (or that have side effects).
        jaxprs keep dead code (a loss value under ``jax.grad``, zero cotangents...) that
        XLA never runs; ``graph(dce=True)`` drops the rest."""
        b, is_output = self.builder, self.is_output
        live = is_output | np.asarray(b.effectful, dtype=bool)
        succ: list[list[int]] = [[] for _ in range(len(b.op))]
        for s, d in zip(b.src, b.dst, strict=True):
            succ[s].append(d)
        for i in range(len(b.op) - 1, -1, -1):  # consumers come after producers
            if not live[i]:
                live[i] = any(live[d] for d in succ[i])
        return live

    def graph(self, *, name: str, dce: bool = True, t0: float | None = None) -> OpGraph:
        """The OpGraph of this walk (``trace``'s result); ``dce``: drop dead ops; ``t0``:
        when tracing began (``time.perf_counter()``), for ``meta["trace_s"]``."""
        b, is_output = self.builder, self.is_output
        names, sizes, unknown = self.param_names, self.param_sizes, self.unknown
        if t0 is None:
            t0 = time.perf_counter()
        live = self.live_ops() if dce else np.ones(len(b.op), dtype=bool)
        new_index = np.cumsum(live) - 1
        src, dst = np.asarray(b.src, dtype=np.int64), np.asarray(b.dst, dtype=np.int64)
        keep_edge = live[dst] if len(dst) else np.zeros(0, dtype=bool)
        param_op = np.asarray(b.param_op, dtype=np.int64)
        keep_use = live[param_op] if len(param_op) else np.zeros(0, dtype=bool)

        def per_op(values, dtype):
            return np.asarray(values, dtype=dtype)[live]

        def rows(values):
            return tuple(v for v, keep in zip(values, live.tolist(), strict=True) if keep)

        meta = {
            "jax_version": jax.__version__,
            "trace_s": time.perf_counter() - t0,
            "unknown_primitives": sorted(unknown),
            "loops": b.loops,
            "dead_ops_removed": int((~live).sum()),
        }
        return OpGraph(
            op=per_op(b.op, object), name_path=per_op(b.name_path, object),
            flops=per_op(b.flops, np.float64), bytes_accessed=per_op(b.bytes, np.float64),
            out_bytes=per_op(b.out_bytes, np.float64), signature=per_op(b.signature, object),
            src=new_index[src[keep_edge]], dst=new_index[dst[keep_edge]],
            edge_bytes=np.asarray(b.edge_bytes, dtype=np.float64)[keep_edge],
            edge_output=np.asarray(b.edge_output, dtype=np.int64)[keep_edge],
            is_output=is_output[live], param_names=names, param_sizes=sizes,
            param_op=new_index[param_op[keep_use]],
            param_index=np.asarray(b.param_index, dtype=np.int64)[keep_use],
            in_avals=rows(b.in_avals), out_avals=rows(b.out_avals), attrs=rows(b.attrs),
            param_avals=b.param_avals, name=name, meta=meta,
        )


def op_specs(fn, *args, param_argnums: int | Sequence[int] = (0,),
             dce: bool = True) -> dict[str, tuple]:
    """``{signature: (primitive, params, input ShapeDtypeStructs)}`` for the ops of
    ``trace(fn, *args)``: enough to rebuild and time any op alone with
    ``primitive.bind(*inputs, **params)`` (``primitive`` is the JAX Primitive object;
    loop ops keep their body jaxprs in ``params``). Traces ``fn`` again."""
    w = walk(fn, args, param_argnums, keep_specs=True)
    b = w.builder
    live = w.live_ops() if dce else np.ones(len(b.op), dtype=bool)
    specs: dict[str, tuple] = {}
    for sig, spec, keep in zip(b.signature, b.specs, live.tolist(), strict=True):
        if keep:
            specs.setdefault(sig, spec)
    return specs

"""Run a placement for real: split the op sequence by device, compile, move tensors.

``apply(fn, example_args, placement)`` traces ``fn`` with the same walk as
``simplace.trace`` (so op ``i`` of the placement is op ``i`` of the traced graph) and
returns a ``PlacedFunction``:

* the ops, in graph order, are cut into **segments**: maximal runs of consecutive ops on
  one device. Each segment is one ``jax.jit`` function that evaluates its jaxpr
  equations (``primitive.bind``, as ``jax.core.eval_jaxpr`` does) and runs on its device
  because its inputs are committed there;
* a tensor produced on one device and read on another is moved with ``jax.device_put``,
  once per destination device, in one call per producing op and destination carrying
  all its outputs read there, issued just before the first segment there that reads
  one (as the simulator sends it; ``transfers="segment"`` batches a segment's receipts
  instead);
* parameters and other inputs live on the devices whose ops read them
  (``PlacedFunction.place_args`` puts them there once; calling the function does it on
  every call);
* the outputs equal ``fn``'s (to float tolerance: XLA fuses each segment on its own, so
  the rounding of fused ops may differ) and stay on the devices that computed them.

Segments with the same equations and wiring share one jitted function (ResNet blocks,
single ops of a fragmented placement), so a placement costs one XLA compilation per
distinct segment and device, not per segment. ``Program`` keeps that cache across
placements of one traced function (``prepare(fn, args).place(p1)``, ``.place(p2)``...).

``measure`` times a placed function's step with the timing harness
(``simplace.hardware.timing.time_fn``: warm-up, repeats, robust median), and each
segment alone where asked.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from simplace.errors import PlacementError, SimplaceError
from simplace.graph import OpGraph
from simplace.hardware.devices import resolve_devices
from simplace.placement import Placement, check_placement
from simplace.sim.reference import segments_of
from simplace.trace import Builder, Value, aval_nbytes, walk

__all__ = ["PlacedFunction", "Program", "Segment", "Measurement", "apply", "measure",
           "prepare", "resolve_devices"]


# --------------------------------------------------------------------------- tracing
# A reference to a value of the flattened program:
#   ("op", j, k): output k of (post-DCE) op j;  ("in", k): flat input leaf k;
#   ("const", k): constant k (closed-over arrays, literals passed into inlined calls).
Ref = tuple


class _Src(Value):
    """A ``Value`` that also remembers which input leaf or constant it is."""

    __slots__ = ("src",)

    def __init__(self, src, **kw):
        super().__init__(**kw)
        self.src = src


class _ExecBuilder(Builder):
    """The tracer's walk, also recording per op its equation and where its inputs come
    from, so that the ops can be evaluated again outside the jaxpr."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.eqns: list = []  # per (pre-DCE) op
        self.ins: list[tuple] = []  # per op: per invar a Ref or a jaxpr Literal
        self.consts: list[Any] = []

    def input_val(self, leaf, var, param):
        return _Src(("in", leaf), param=param, nbytes=aval_nbytes(var.aval))

    def const_val(self, var, value):
        self.consts.append(value)
        return _Src(("const", len(self.consts) - 1), nbytes=aval_nbytes(var.aval))

    def ref(self, val, aval) -> Ref:
        if val.op >= 0:
            return ("op", val.op, val.out)
        if isinstance(val, _Src):
            return val.src
        if val.literal is not None:
            # A literal passed into an inlined call: the walk kept its value, not its
            # dtype; the variable it was bound to has that.
            self.consts.append(np.asarray(val.literal, dtype=aval.dtype))
            return ("const", len(self.consts) - 1)
        raise SimplaceError(  # a gap in the walk, not a user error
            "simplace.apply: an op reads a value whose origin the trace lost (a "
            "non-scalar literal passed into an inlined call?); please report this model.")

    def emit(self, eqn, env, stack):
        ins = tuple(v if isinstance(v, jcore.Literal) else self.ref(env[v], v.aval)
                    for v in eqn.invars)
        super().emit(eqn, env, stack)
        self.eqns.append(eqn)
        self.ins.append(ins)


@dataclasses.dataclass(frozen=True, eq=False)
class _Op:
    eqn: Any
    ins: tuple  # Ref or Literal per input
    n_out: int
    live_out: tuple[int, ...]  # output indices that are real variables (not DropVar)


class Program:
    """A traced function ready to run under any placement of its graph.

    Attributes:
      graph: the ``OpGraph`` (identical to ``simplace.trace(fn, *args)``'s).
      num_leaves: the number of array leaves of the arguments.
    Use ``place(placement)`` to get a ``PlacedFunction``. Compiled segments are cached
    on the program and shared by every placement made from it.
    """

    def __init__(self, fn, args: tuple, *, param_argnums=(0,), name: str = ""):
        t0 = time.perf_counter()
        w = walk(fn, args, param_argnums, builder=_ExecBuilder)
        b = w.builder
        self.graph: OpGraph = w.graph(name=name or getattr(fn, "__name__", ""), dce=True,
                                      t0=t0)
        live = w.live_ops()
        new_index = np.cumsum(live) - 1

        def remap(r):
            if isinstance(r, tuple) and r[0] == "op":
                if not live[r[1]]:  # cannot happen: liveness flows to producers
                    raise SimplaceError("simplace.apply: a live op reads a dead one.")
                return ("op", int(new_index[r[1]]), r[2])
            return r

        self._ops: list[_Op] = []
        for i in np.flatnonzero(live).tolist():
            eqn = b.eqns[i]
            self._ops.append(_Op(
                eqn=eqn, ins=tuple(remap(r) for r in b.ins[i]), n_out=len(eqn.outvars),
                live_out=tuple(k for k, v in enumerate(eqn.outvars)
                               if not isinstance(v, jcore.DropVar))))
        if [op.eqn.primitive.name for op in self._ops] != self.graph.op.tolist():
            raise SimplaceError("simplace.apply: the op sequence does not match the "
                                "traced graph; please report this model.")
        self._outputs = []
        for val, leaf in zip(b.outputs, jax.tree_util.tree_leaves(b.out_shape), strict=True):
            self._outputs.append(remap(b.ref(val, leaf)))
        self._consts = b.consts  # ref() may have added literal outputs
        self._out_tree = b.out_tree
        flat, self._in_tree = jax.tree_util.tree_flatten(args)
        self._in_avals = [(tuple(getattr(x, "shape", ())), np.dtype(getattr(x, "dtype",
                           np.asarray(x).dtype))) for x in flat]
        self.num_leaves = len(flat)
        self._seg_cache: dict[tuple, Any] = {}
        self.trace_s = time.perf_counter() - t0

    # ------------------------------------------------------------------ placing
    def place(self, placement, *, devices: Sequence | None = None, cost_model=None,
              transfers: str = "producer") -> PlacedFunction:
        """A ``PlacedFunction`` running this program under ``placement``.

        Args:
          placement: a ``Placement`` (its graph hash must be this graph's, and its device
            names name the JAX devices, e.g. ``cpu:0``) or an int[M] device index per op.
          devices: the JAX devices of indices 0..D-1 (default: from the placement's
            device names, else ``cost_model``'s, else ``jax.devices()`` in order).
          cost_model: checks a ``Placement`` against this machine (``Placement.check``).
          transfers: ``"producer"`` (default): one ``jax.device_put`` call per producing
            op and destination device (all its outputs read there), the transfer the
            simulator charges, so that measured and simulated steps do the same moves;
            ``"segment"``:
            one call per segment for everything it receives (fewer calls: faster when a
            placement moves many tensors, further from the simulator's model).
        Raises ``PlacementError`` when the placement was made for another graph, has the
        wrong length, or names devices JAX does not have.
        """
        names = None
        if isinstance(placement, Placement):
            if placement.graph_hash != self.graph.hash:
                raise PlacementError(
                    f"This placement was made for graph {placement.graph_hash[:12]}..., but "
                    f"the function given traces to graph {self.graph.hash[:12]}... "
                    f"({self.graph.name or 'unnamed'}, {self.graph.num_ops} ops): apply it to "
                    "the model, sizes (batch, training/inference) and example arguments it "
                    "was made for, or optimize a placement for this graph.")
            if cost_model is not None:
                placement.check(self.graph, cost_model)
            names = list(placement.device_names)
            assignment = np.asarray(placement.assignment)
        else:
            assignment = np.asarray(placement)
            if cost_model is not None:
                names = list(cost_model.device_names)
        if assignment.ndim == 1 and len(assignment) != self.graph.num_ops:
            raise PlacementError(
                f"The placement has {len(assignment)} entries but the function traces to "
                f"{self.graph.num_ops} ops ({self.graph.name or 'unnamed'}, graph "
                f"{self.graph.hash[:12]}...): it was made for another model or other sizes; "
                "optimize a placement for this graph.")
        if devices is None:
            if names is not None:
                devices = resolve_devices(names)
            else:
                n = int(assignment.max()) + 1 if assignment.size else 1
                devices = jax.devices()[:max(n, 1)]
        devices = list(devices)
        assignment = check_placement(assignment, self.graph.num_ops, len(devices))
        return PlacedFunction(self, assignment, devices, transfers=transfers)

    # ------------------------------------------------------------------ segments
    def _segment_fn(self, start: int, stop: int, in_refs: list[Ref], out_refs: list[Ref]):
        """The jitted function of ops ``start..stop-1`` taking ``in_refs`` and returning
        ``out_refs``; cached by equations and wiring, so equal segments share it."""
        local: dict[Ref, int] = {r: k for k, r in enumerate(in_refs)}
        prog, key = [], []
        for j in range(start, stop):
            op = self._ops[j]
            ins = []
            for r in op.ins:
                if isinstance(r, jcore.Literal):
                    a = np.asarray(r.val)
                    ins.append(r)
                    key.append(("lit", str(r.aval), a.dtype.str, a.tobytes()))
                else:
                    ins.append(local[r])
                    key.append(local[r])
            outs = []
            for k in op.live_out:
                local[("op", j, k)] = len(local)
                outs.append((k, local[("op", j, k)]))
            eqn = op.eqn
            prog.append((eqn.primitive, eqn.primitive.get_bind_params(eqn.params), eqn.ctx,
                         tuple(ins), tuple(outs)))
            key.append((eqn.primitive, _hashable(eqn.params), _hashable(eqn.ctx),
                        tuple(outs)))
        out_idx = tuple(local[r] for r in out_refs)
        key.append(out_idx)
        key = tuple(key)
        fn = self._seg_cache.get(key)
        if fn is None:
            fn = jax.jit(_make_segment(prog, len(local), out_idx))
            self._seg_cache[key] = fn
        return fn

    @property
    def num_compiled_segments(self) -> int:
        """Distinct segment functions made so far (each compiles once per device)."""
        return len(self._seg_cache)


def _make_segment(prog, n_values: int, out_idx: tuple[int, ...]):
    """A function evaluating ``prog`` (primitive, bind params, context, inputs,
    outputs per equation) as ``jax.core.eval_jaxpr`` does, over numbered values."""

    def segment(*inputs):
        env: list = list(inputs) + [None] * (n_values - len(inputs))
        for prim, params, ctx, ins, outs in prog:
            args = [env[x] if type(x) is int else x.val for x in ins]
            with ctx.manager:
                ans = prim.bind(*args, **params)
            if not prim.multiple_results:
                ans = (ans,)
            for k, idx in outs:
                env[idx] = ans[k]
        return tuple(env[i] for i in out_idx)

    return segment


def _hashable(v):
    """A hashable stand-in for a primitive parameter (values compared, not identity,
    wherever Python allows; identity for objects that cannot be compared)."""
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    if isinstance(v, np.ndarray):
        return ("ndarray", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
        return (type(v).__name__,) + tuple(_hashable(x) for x in v)
    try:
        hash(v)
    except TypeError:
        return ("id", id(v))
    return v


# --------------------------------------------------------------------------- placing
@dataclasses.dataclass(frozen=True)
class Segment:
    """A maximal run of consecutive ops on one device: ops ``start..stop-1`` on device
    index ``device``; ``num_inputs``/``num_outputs``: tensors it reads from / gives to
    the rest of the step; ``num_received``: tensors moved to its device just before it
    is dispatched (from other devices)."""

    device: int
    start: int
    stop: int
    num_inputs: int
    num_outputs: int
    num_received: int


@dataclasses.dataclass(frozen=True, eq=False)
class PlacedArgs:
    """Arguments already on their devices (``PlacedFunction.place_args``): reuse them to
    run or time a step without moving the parameters again."""

    slots: tuple
    leaves: tuple


class PlacedFunction:
    """``fn`` running under a placement; call it like ``fn``.

    Attributes:
      program: the ``Program`` (traced function, graph, compiled-segment cache).
      graph: the ``OpGraph`` the placement places.
      assignment: int32[M], the device index of each op.
      devices: the JAX device of each index.
      segments: the ``Segment`` list, in execution order.
      num_transfers, bytes_transferred: tensors moved between devices per step, and
        their bytes (each tensor once per destination device, as the simulator sends it).
      put_links: ``(from, to)`` device indices of each ``jax.device_put`` call of a step,
        in order (``from`` is -1 for a ``transfers="segment"`` call gathering several).
      steps: the host calls of one step, in order, over numbered value slots (what
        ``run`` does; calibration times each one): ``("call", fn, input slots, output
        slots)`` for a segment's jitted function, ``("put", source slots, destination
        slots, device)`` for a ``jax.device_put``.
      segment_steps: the index in ``steps`` of each segment's call.
    """

    def __init__(self, program: Program, assignment: np.ndarray, devices: list, *,
                 transfers: str = "producer"):
        if transfers not in ("segment", "producer"):
            raise SimplaceError(f"transfers must be 'segment' or 'producer', got "
                                f"{transfers!r}.")
        self.transfers = transfers
        self.program = program
        self.graph = program.graph
        self.assignment = assignment
        self.devices = devices
        ops = program._ops
        m = len(ops)
        # Segments: maximal runs of one device in graph order, as the simulator cuts them.
        runs = segments_of(assignment)
        seg_of_op = np.zeros(m, dtype=np.int64)
        for s, (a, b) in enumerate(runs):
            seg_of_op[a:b] = s
        # Per segment, the values it reads from outside itself, in first-use order.
        seg_inputs: list[list[Ref]] = []
        last_reader: dict[Ref, int] = {}
        for s, (a, b) in enumerate(runs):
            seen: dict[Ref, None] = {}
            for j in range(a, b):
                for r in ops[j].ins:
                    if isinstance(r, jcore.Literal):
                        continue
                    if r[0] == "op" and seg_of_op[r[1]] == s:
                        continue
                    seen[r] = None
                    last_reader[r] = s
            seg_inputs.append(list(seen))
        outputs = set(r for r in program._outputs if r[0] == "op")
        slot: dict[tuple, int] = {}

        def slot_of(ref, dev):
            key = (ref, dev)
            if key not in slot:
                slot[key] = len(slot)
            return slot[key]

        steps: list[tuple] = []
        self.segments: list[Segment] = []
        self.put_links: list[tuple[int, int]] = []  # (from, to) of each put, in order
        self.segment_steps: list[int] = []
        leaf_puts: dict[int, list[tuple[int, int]]] = {}  # device -> [(leaf, slot)]
        const_puts: dict[int, list[tuple[int, int]]] = {}
        moved_bytes = 0.0
        n_moved = 0
        # Outputs of each op needed on each other device (what one put there carries).
        needed: dict[tuple[int, int], set[int]] = {}
        for s, (a, _) in enumerate(runs):
            dev = int(assignment[a])
            for r in seg_inputs[s]:
                if r[0] == "op" and int(assignment[r[1]]) != dev:
                    needed.setdefault((r[1], dev), set()).add(r[2])
        for s, (a, b) in enumerate(runs):
            dev = int(assignment[a])
            moved_before = n_moved
            in_slots, recv_src, recv_dst = [], [], []
            for r in seg_inputs[s]:
                if r[0] == "op" and int(assignment[r[1]]) != dev:
                    j = r[1]
                    if (r, dev) not in slot and transfers == "producer":
                        # First use of op j's outputs on this device: one put of all of
                        # them that any segment here reads, issued now (the simulator's
                        # transfer: one per producing op and destination, in the order the
                        # consuming ops and their inputs come).
                        src_dev = int(assignment[j])
                        refs = [("op", j, k) for k in sorted(needed[(j, dev)])]
                        steps.append(("put", tuple(slot[(x, src_dev)] for x in refs),
                                      tuple(slot_of(x, dev) for x in refs), devices[dev]))
                        self.put_links.append((src_dev, dev))
                        for x in refs:
                            moved_bytes += aval_nbytes(ops[j].eqn.outvars[x[2]].aval)
                            n_moved += 1
                    elif (r, dev) not in slot:  # transfers == "segment": batched below
                        recv_src.append(slot[(r, int(assignment[j]))])
                        recv_dst.append(slot_of(r, dev))
                        moved_bytes += aval_nbytes(ops[j].eqn.outvars[r[2]].aval)
                        n_moved += 1
                    in_slots.append(slot[(r, dev)])
                    continue
                fresh = (r, dev) not in slot
                k = slot_of(r, dev)
                in_slots.append(k)
                if fresh and r[0] == "in":
                    leaf_puts.setdefault(dev, []).append((r[1], k))
                elif fresh and r[0] == "const":
                    const_puts.setdefault(dev, []).append((r[1], k))
            if recv_src:
                steps.append(("put", tuple(recv_src), tuple(recv_dst), devices[dev]))
                self.put_links.append((-1, dev))  # from several devices
            out_refs = []
            for j in range(a, b):
                for k in ops[j].live_out:
                    r = ("op", j, k)
                    if r in outputs or last_reader.get(r, -1) > s:
                        out_refs.append(r)
            out_slots = tuple(slot_of(r, dev) for r in out_refs)
            fn = program._segment_fn(a, b, seg_inputs[s], out_refs)
            self.segment_steps.append(len(steps))
            steps.append(("call", fn, tuple(in_slots), out_slots))
            self.segments.append(Segment(dev, a, b, len(in_slots), len(out_slots),
                                         n_moved - moved_before))
        self.steps = steps
        self._num_slots = len(slot)
        self._leaf_puts = leaf_puts
        self._const_vals: list[tuple[int, Any]] = []
        for dev, items in const_puts.items():
            vals = jax.device_put([program._consts[c] for c, _ in items], devices[dev])
            self._const_vals += [(k, v) for (_, k), v in zip(items, vals, strict=True)]
        self._out_slots = []
        for r in program._outputs:
            if r[0] == "op":
                self._out_slots.append(("slot", slot[(r, int(assignment[r[1]]))]))
            else:
                self._out_slots.append(r)
        self.num_transfers = n_moved
        self.bytes_transferred = moved_bytes

    @property
    def input_devices(self) -> list[list[int]]:
        """Per flat argument leaf, the device indices it is put on (those of the ops
        that read it; none for a leaf no op reads)."""
        out: list[list[int]] = [[] for _ in range(self.program.num_leaves)]
        for dev, items in self._leaf_puts.items():
            for leaf, _ in items:
                out[leaf].append(dev)
        return [sorted(x) for x in out]

    def __repr__(self) -> str:
        return (f"PlacedFunction({self.graph.name or 'unnamed'}: {self.graph.num_ops} ops in "
                f"{len(self.segments)} segments on {len(set(self.assignment.tolist()))} "
                f"devices, {self.num_transfers} transfers)")

    # ------------------------------------------------------------------ running
    def place_args(self, *args) -> PlacedArgs:
        """Put every argument leaf on each device whose ops read it (parameters live
        where they are used); returns ``PlacedArgs`` for ``run``."""
        p = self.program
        leaves, tree = jax.tree_util.tree_flatten(args)
        if tree != p._in_tree or len(leaves) != p.num_leaves:
            raise SimplaceError(
                f"The arguments do not have the structure the function was traced with "
                f"({p.num_leaves} array leaves, {p._in_tree}); got {len(leaves)} leaves "
                f"({tree}). Pass arguments shaped like the example arguments.")
        for k, (x, (shape, dtype)) in enumerate(zip(leaves, p._in_avals, strict=True)):
            xs = tuple(getattr(x, "shape", np.shape(x)))
            xd = np.dtype(getattr(x, "dtype", np.asarray(x).dtype))
            if xs != shape or xd != dtype:
                raise SimplaceError(
                    f"Argument leaf {k} has shape {xs} and dtype {xd}, but the function was "
                    f"traced with {shape} {dtype}: pass arguments shaped like the example "
                    "arguments (or apply the placement to a function traced at these sizes).")
            if isinstance(x, jax.ShapeDtypeStruct):
                raise SimplaceError(f"Argument leaf {k} is a jax.ShapeDtypeStruct: running a "
                                    "placement needs real arrays (zoo.get(..., "
                                    "abstract=False)).")
        slots: list = [None] * self._num_slots
        for k, v in self._const_vals:
            slots[k] = v
        for dev, items in self._leaf_puts.items():
            vals = jax.device_put([leaves[leaf] for leaf, _ in items], self.devices[dev])
            for (_, k), v in zip(items, vals, strict=True):
                slots[k] = v
        return PlacedArgs(tuple(slots), tuple(leaves))

    def run(self, placed: PlacedArgs, *, keep_values: bool = False):
        """One step on arguments from ``place_args``; returns ``fn``'s outputs (arrays on
        the devices that computed them). Dispatch is asynchronous, as for any JAX call:
        block on the result (``jax.block_until_ready``) to wait for it. ``keep_values``:
        return ``(outputs, values)``, ``values`` being every slot of ``steps`` (each
        segment's inputs, to run it again alone)."""
        vals = list(placed.slots)
        for step in self.steps:
            if step[0] == "call":
                _, fn, ins, outs = step
                res = fn(*[vals[i] for i in ins])
                for k, v in zip(outs, res, strict=True):
                    vals[k] = v
            else:
                _, src, dst, dev = step
                moved = jax.device_put([vals[i] for i in src], dev)
                for k, v in zip(dst, moved, strict=True):
                    vals[k] = v
        flat = []
        for o in self._out_slots:
            if o[0] == "slot":
                flat.append(vals[o[1]])
            elif o[0] == "in":
                flat.append(placed.leaves[o[1]])
            else:
                flat.append(self.program._consts[o[1]])
        out = jax.tree_util.tree_unflatten(self.program._out_tree, flat)
        return (out, vals) if keep_values else out

    def __call__(self, *args):
        return self.run(self.place_args(*args))


# --------------------------------------------------------------------------- front ends
def prepare(fn, example_args: Sequence, *, param_argnums=(0,), name: str = "") -> Program:
    """Trace ``fn(*example_args)`` once into a ``Program`` that any placement of its graph
    can run (``program.place(placement)``); ``program.graph`` is ``simplace.trace``'s
    graph of ``fn`` (same ops, same hash). ``example_args`` may be abstract
    (``jax.ShapeDtypeStruct``); running needs real arrays."""
    return Program(fn, tuple(example_args), param_argnums=param_argnums, name=name)


def apply(fn, example_args: Sequence | None, placement, *, devices: Sequence | None = None,
          cost_model=None, graph: OpGraph | None = None, param_argnums=(0,),
          transfers: str = "producer") -> PlacedFunction:
    """``fn`` placed by ``placement``: a function with ``fn``'s signature and outputs whose
    ops run on the devices the placement gives them.

    Args:
      fn: the function (as given to ``simplace.trace``), or a ``Program`` from
        ``prepare`` (then ``example_args`` may be None).
      example_args: arguments ``fn`` is traced with (arrays or ShapeDtypeStructs).
      placement: a ``Placement`` (checked against the traced graph's hash) or int[M].
      devices: JAX device of each device index (default: from the placement's device
        names or ``cost_model``'s, else ``jax.devices()`` in order).
      cost_model: the machine the placement was made for (checks device names/count).
      graph: the ``OpGraph`` the placement was optimised on; refused unless ``fn``
        traces to the same graph (same hash).
      param_argnums: which arguments hold parameters (as in ``trace``).
      transfers: ``"producer"`` or ``"segment"`` (see ``Program.place``).

    Returns:
      A ``PlacedFunction``: call it as ``fn``; ``place_args``/``run`` to keep parameters on
      their devices between steps. Raises ``PlacementError`` for a placement (or graph)
      that does not match the function.
    """
    program = fn if isinstance(fn, Program) else prepare(fn, example_args,
                                                         param_argnums=param_argnums)
    if graph is not None and graph.hash != program.graph.hash:
        raise PlacementError(
            f"The graph given ({graph.name or 'unnamed'}, {graph.num_ops} ops, hash "
            f"{graph.hash[:12]}...) is not the graph of the function ({program.graph.num_ops} "
            f"ops, hash {program.graph.hash[:12]}...): trace the same model with the same "
            "sizes and example arguments.")
    return program.place(placement, devices=devices, cost_model=cost_model,
                         transfers=transfers)


# --------------------------------------------------------------------------- timing
@dataclasses.dataclass(frozen=True)
class Measurement:
    """Measured times of one placed step.

    step: ``Timing`` of the whole step (median_s, mad_s, samples_s...), arguments already
      on their devices, outputs waited for.
    segments_s: float64[S] median time of each segment alone on its inputs (None unless
      asked; segments overlap in a real step, so these need not add up to the step).
    num_segments, num_transfers, bytes_transferred: the placed function's shape.
    """

    step: Any
    segments_s: np.ndarray | None
    num_segments: int
    num_transfers: int
    bytes_transferred: float

    @property
    def step_time_s(self) -> float:
        """The median step time, seconds."""
        return float(self.step.median_s)

    def to_dict(self) -> dict:
        """JSON-able fields (the record layout)."""
        return {"step": self.step.to_dict(), "segments_s": None if self.segments_s is None
                else self.segments_s.tolist(), "num_segments": self.num_segments,
                "num_transfers": self.num_transfers,
                "bytes_transferred": self.bytes_transferred}


def measure(placed: PlacedFunction, args: Sequence, *, per_segment: bool = False,
            **timing) -> Measurement:
    """Time one step of ``placed`` on ``args`` with the timing harness.

    Arguments are put on their devices first (parameters stay resident, as the simulator
    assumes); each timed call runs the whole step and waits for every output.
    ``timing`` goes to ``simplace.hardware.timing.time_fn`` (warmup, min_repeats,
    max_repeats, budget_s, rel_tol). With ``per_segment`` each segment is also timed
    alone on the inputs it had in a real step.
    """
    from simplace.hardware.timing import time_fn

    placed_args = placed.place_args(*args)
    # Compile every segment first, outside the harness: its time budget counts its
    # warm-up runs, and a first run that compiles would spend it all.
    jax.block_until_ready(placed.run(placed_args))
    step_t = time_fn(placed.run, placed_args, **timing)
    seg_s = None
    if per_segment:
        _, vals = placed.run(placed_args, keep_values=True)
        jax.block_until_ready([v for v in vals if v is not None])
        seg_s = np.empty(len(placed.segments))
        for s, k in enumerate(placed.segment_steps):
            _, fn, ins, _ = placed.steps[k]
            inputs = [vals[i] for i in ins]
            seg_s[s] = time_fn(lambda *xs, fn=fn: jax.block_until_ready(fn(*xs)), *inputs,
                               **timing).median_s
    return Measurement(step=step_t, segments_s=seg_s, num_segments=len(placed.segments),
                       num_transfers=placed.num_transfers,
                       bytes_transferred=placed.bytes_transferred)

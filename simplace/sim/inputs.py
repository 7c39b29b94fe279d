"""The plain arrays both simulators run on, taken from a cost model and a graph.

Simulators never look inside a cost model: they read one ``SimInputs`` bundle, built by
``sim_inputs`` from anything that offers the cost-model interface (duck-typed), or given
directly (tests build them from random arrays).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simplace.errors import CostModelError

# Re-exported: the simulators validate placements with the placement module's checks.
from simplace.placement import check_placement, check_placements  # noqa: F401


class SimInputs(NamedTuple):
    """Everything a simulator needs to know about one machine running one graph.

    op_time_s: float64[M, D], seconds op ``i`` takes on device ``d`` (finite, >= 0).
    latency_s: float64[D, D], per-transfer latency of each ordered link (diagonal unused).
    bandwidth_bytes_per_s: float64[D, D] > 0, bandwidth of each ordered link (diagonal
      unused). Any link-time scale (drift correction) is already folded into these two.
    memory_bytes: float64[D], capacity of each device.
    exclusive_group: int32[D], devices with the same id share compute and run one
      segment at a time between them; ids are normalised to ``0..G-1``.
    launch_s: float64[D] >= 0, device time each segment costs on top of its ops.
    dispatch_s: float64[D] >= 0, host time to dispatch one segment to the device.
    put_s: float64[D, D] >= 0, host time of one ``jax.device_put`` call on each ordered
      link (diagonal unused).
    op_pool_work: float64[M, D] >= 0, op i's part of the work that sends a segment on
      device d to a worker thread, and pool_min_work: float64[D] > 0 (inf: never), how
      much work does: a segment whose ops' ``op_pool_work`` add up to at least
      ``pool_min_work[d]`` pays ``pool_launch_s[d]`` (float64[D] >= 0) once, on top of
      its launch. XLA:CPU runs a small computation inline in the calling thread and
      hands a larger one to a worker thread, which wakes up for it; on the calibrated
      CPUs the flops of the whole computation decide. A rule that holds for single ops
      (0/1 flags, threshold 1) is the special case of one op.
    op_unfused_s: float64[M, D] >= 0, extra time op i costs when none of its inputs
      comes from its own segment: XLA fuses an elementwise op into the loop of an
      in-segment producer, but one that starts a segment's data flow runs a loop of its
      own.
    put_waits: bool[D, D], the links whose ``device_put`` holds the host thread until the
      copy has arrived (diagonal False). JAX cannot copy an array between two PjRt
      clients (the CPU and a GPU) directly: it fetches the value to the host, waiting
      for the computation that makes it, and uploads it again. Puts between devices of
      one client (GPUs of one host, or virtual CPU devices) are asynchronous.

    objective: ``"latency"`` (the step time), ``"throughput"`` (the time between
      pipelined steps) or a ``Ruler`` (another system's scorer): what the simulators
      return as ``step_time_s`` (``simplace.sim.objective``).
    op_argument_s: float64[M, D], 0 <= op_argument_s <= op_time_s: the part of
      ``op_time_s`` that is the host's time passing call arguments (``Device.argument_s``
      per parameter an op reads and graph output it returns). The simulators charge it
      inside ``op_time_s``; it is apart only because a scale of host time must not
      scale device work (``simplace.scales.apply_scales``). None: zeros.

    ``op_time_s`` holds in-segment (fused) op costs: no launch, no dispatch; see
    ``simplace.sim.reference`` for how the simulators combine these arrays.
    """

    op_time_s: np.ndarray
    latency_s: np.ndarray
    bandwidth_bytes_per_s: np.ndarray
    memory_bytes: np.ndarray
    exclusive_group: np.ndarray
    launch_s: np.ndarray
    dispatch_s: np.ndarray
    put_s: np.ndarray
    op_pool_work: np.ndarray
    pool_min_work: np.ndarray
    pool_launch_s: np.ndarray
    op_unfused_s: np.ndarray
    put_waits: np.ndarray | None = None  # make_sim_inputs sets it; see put_waits_of
    # What the simulators report as ``step_time_s``: "latency", "throughput" or a
    # ``simplace.sim.objective.Ruler`` (see that module).
    objective: object = "latency"
    op_argument_s: np.ndarray | None = None  # make_sim_inputs sets it; see argument_part

    @property
    def num_ops(self) -> int:
        """Number of ops (M)."""
        return self.op_time_s.shape[0]

    @property
    def num_devices(self) -> int:
        """Number of devices (D)."""
        return self.op_time_s.shape[1]

    @property
    def num_groups(self) -> int:
        """Number of exclusive groups of devices (0 for no devices)."""
        return int(self.exclusive_group.max()) + 1 if len(self.exclusive_group) else 0


def frozen_inputs(inp: SimInputs, **changes) -> SimInputs:
    """``inp`` with ``changes`` (arrays of the same shapes and meanings, e.g. a drift
    correction's scaled op times), made read-only so that the simulators take it as it
    is: for a caller that derives many variants of one priced problem and has checked
    what it changes."""
    return inp._replace(**{k: _frozen(np.asarray(v, dtype=np.float64))
                           for k, v in changes.items()})


def _is_frozen(inp: SimInputs) -> bool:
    """Every array of ``inp`` read-only (made by ``make_sim_inputs`` or ``frozen_inputs``)."""
    return all(not x.flags.writeable for x in inp if isinstance(x, np.ndarray))


def put_waits_of(inp: SimInputs) -> np.ndarray:
    """bool[D, D]: ``inp.put_waits``, all False for a ``SimInputs`` built without it
    (``make_sim_inputs`` always sets it)."""
    if inp.put_waits is None:
        return np.zeros((inp.num_devices, inp.num_devices), bool)
    return inp.put_waits


def argument_part(inp: SimInputs) -> np.ndarray:
    """float64[M, D]: ``inp.op_argument_s``, zeros for a ``SimInputs`` built without it
    (``make_sim_inputs`` always sets it)."""
    if inp.op_argument_s is None:
        return np.zeros_like(inp.op_time_s)
    return inp.op_argument_s


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.flags.writeable = False
    return a


def make_sim_inputs(op_time_s, latency_s, bandwidth_bytes_per_s, memory_bytes,
                    exclusive_group=None, launch_s=None, dispatch_s=None,
                    put_s=None, op_pool_work=None, pool_min_work=None, pool_launch_s=None,
                    op_unfused_s=None, put_waits=None, objective="latency",
                    op_argument_s=None) -> SimInputs:
    """Validate and normalise raw arrays into a ``SimInputs`` (read-only float64/int32).

    ``exclusive_group`` defaults to one group per device; ``launch_s``, ``dispatch_s``,
    ``put_s``, ``op_pool_work``, ``pool_launch_s``, ``op_unfused_s`` and ``op_argument_s``
    default to zeros
    (a machine whose segments and transfers cost no host time and no launch),
    ``pool_min_work`` to inf (no segment goes to a pool), ``put_waits`` to all False (every
    put asynchronous), ``objective`` to ``"latency"`` (``simplace.sim.objective``). Raises
    ``CostModelError`` naming the bad field (``OptionError`` for the objective).
    """
    t = np.asarray(op_time_s, dtype=np.float64)
    if t.ndim != 2:
        raise CostModelError(f"op_time_s must be float[M, D], got shape {t.shape}.")
    m, d = t.shape
    if d < 1:
        raise CostModelError("op_time_s has no device column: a machine needs >= 1 device.")
    lat = np.asarray(latency_s, dtype=np.float64)
    bw = np.asarray(bandwidth_bytes_per_s, dtype=np.float64)
    mem = np.asarray(memory_bytes, dtype=np.float64).reshape(-1)
    grp = np.arange(d) if exclusive_group is None else np.asarray(exclusive_group)
    launch = np.zeros(d) if launch_s is None else np.asarray(launch_s, dtype=np.float64)
    dispatch = np.zeros(d) if dispatch_s is None else np.asarray(dispatch_s, dtype=np.float64)
    put = np.zeros((d, d)) if put_s is None else np.asarray(put_s, dtype=np.float64)
    pool_work = np.zeros((m, d)) if op_pool_work is None else np.asarray(op_pool_work,
                                                                         dtype=np.float64)
    pool_min = (np.full(d, np.inf) if pool_min_work is None
                else np.asarray(pool_min_work, dtype=np.float64))
    pool_launch = (np.zeros(d) if pool_launch_s is None
                   else np.asarray(pool_launch_s, dtype=np.float64))
    unfused = np.zeros((m, d)) if op_unfused_s is None else np.asarray(op_unfused_s,
                                                                       dtype=np.float64)
    waits = np.zeros((d, d), bool) if put_waits is None else np.asarray(put_waits)
    arg = np.zeros((m, d)) if op_argument_s is None else np.asarray(op_argument_s,
                                                                     dtype=np.float64)
    for name, arr, shape in (("latency_s", lat, (d, d)), ("bandwidth_bytes_per_s", bw, (d, d)),
                             ("memory_bytes", mem, (d,)), ("exclusive_group", grp, (d,)),
                             ("launch_s", launch, (d,)), ("dispatch_s", dispatch, (d,)),
                             ("put_s", put, (d, d)), ("op_pool_work", pool_work, (m, d)),
                             ("pool_min_work", pool_min, (d,)),
                             ("pool_launch_s", pool_launch, (d,)),
                             ("op_unfused_s", unfused, (m, d)), ("put_waits", waits, (d, d)),
                             ("op_argument_s", arg, (m, d))):
        if arr.shape != shape:
            raise CostModelError(f"{name} must have shape {shape} for {d} devices (op_time_s "
                                 f"has {d} columns), got {arr.shape}.")
    if m and not np.all(np.isfinite(t) & (t >= 0)):
        i, j = np.argwhere(~(np.isfinite(t) & (t >= 0)))[0]
        raise CostModelError(f"op_time_s[{i}, {j}] is {t[i, j]!r}; op times must be finite "
                             "and >= 0 seconds.")
    off = ~np.eye(d, dtype=bool)
    if not np.all(np.isfinite(lat[off]) & (lat[off] >= 0)):
        raise CostModelError("latency_s must be finite and >= 0 on every link.")
    if not np.all(bw[off] > 0) or np.any(np.isnan(bw[off])):
        raise CostModelError("bandwidth_bytes_per_s must be > 0 on every link (inf allowed).")
    if np.any(np.isnan(mem)) or np.any(mem < 0):
        raise CostModelError("memory_bytes must be >= 0 (inf allowed for 'unlimited').")
    for name, arr in (("launch_s", launch), ("dispatch_s", dispatch), ("put_s", put),
                      ("pool_launch_s", pool_launch), ("op_unfused_s", unfused)):
        if not np.all(np.isfinite(arr) & (arr >= 0)):
            raise CostModelError(f"{name} must be finite and >= 0 seconds, got {arr.tolist()}.")
    if not np.all((arg >= 0) & (arg <= t)):
        raise CostModelError("op_argument_s must be >= 0 and at most op_time_s (it is the "
                             "host-time part of the op times).")
    if not np.all(np.isfinite(pool_work) & (pool_work >= 0)):
        raise CostModelError("op_pool_work must be finite and >= 0 (an op's flops, or 0/1 "
                             "flags).")
    if not np.all(pool_min > 0) or np.any(np.isnan(pool_min)):
        raise CostModelError(f"pool_min_work must be > 0 (inf: never), got "
                             f"{pool_min.tolist()}.")
    if waits.dtype.kind != "b":
        raise CostModelError(f"put_waits must be booleans (the host waits for the copy), got "
                             f"dtype {waits.dtype}.")
    if grp.dtype.kind not in "iu":
        raise CostModelError(f"exclusive_group must hold integer ids, got dtype {grp.dtype}.")
    # Diagonals are never used (no transfer to oneself); pin them so arithmetic on
    # whole rows stays finite.
    lat = lat.copy()
    bw = bw.copy()
    put = put.copy()
    waits = waits.copy()
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(bw, np.inf)
    np.fill_diagonal(put, 0.0)
    np.fill_diagonal(waits, False)
    _, grp = np.unique(grp, return_inverse=True)
    from simplace.sim.objective import check_objective

    check_objective(objective)
    return SimInputs(_frozen(t), _frozen(lat), _frozen(bw), _frozen(mem),
                     _frozen(grp.reshape(-1).astype(np.int32)), _frozen(launch),
                     _frozen(dispatch), _frozen(put), _frozen(pool_work),
                     _frozen(pool_min), _frozen(pool_launch), _frozen(unfused),
                     _frozen(waits), objective, _frozen(arg))


def sim_inputs(graph, cost_model) -> SimInputs:
    """The ``SimInputs`` of ``graph`` on the machine ``cost_model``.

    ``cost_model`` is a ``SimInputs`` (checked against the graph and returned; validated
    and normalised unless it is already: every array read-only, as ``make_sim_inputs`` and
    ``frozen_inputs`` leave them), an object with a ``price(graph) -> SimInputs`` method
    (``CostModel.price``: the one place where a graph, a machine and its profile become
    op and link costs), or any other object with the cost-model interface, assembled by
    ``assemble_inputs``.
    """
    if isinstance(cost_model, SimInputs):
        inp = cost_model if _is_frozen(cost_model) else make_sim_inputs(*cost_model)
    elif callable(getattr(cost_model, "price", None)):
        inp = cost_model.price(graph)
    else:
        inp = assemble_inputs(graph, cost_model)
    if inp.num_ops != graph.num_ops:
        raise CostModelError(f"The op times cover {inp.num_ops} ops but the graph has "
                             f"{graph.num_ops}: build SimInputs for this graph.")
    return inp


def assemble_inputs(graph, cost_model) -> SimInputs:
    """``SimInputs`` from any object with the cost-model interface (duck-typed):
    ``op_times(graph) -> float[M, D]``,
    ``latency_s``, ``bandwidth_bytes_per_s``, ``memory_bytes``, ``exclusive_group_ids``,
    optionally ``launch_s``, ``dispatch_s`` (float[D]), ``put_s`` (float[D, D]) and
    ``op_unfused_times(graph)`` (-> float[M, D]) (missing means zeros),
    ``pool_rule(graph)`` (-> ``(op_pool_work, pool_min_work, pool_launch_s)``; missing
    means no pool), ``put_waits`` (bool[D, D]; missing means every put asynchronous).
    The figures are taken as they are: an object with scales of its own applies them
    itself (``CostModel.price`` does, with ``simplace.scales.apply_scales``).
    """
    try:
        t = cost_model.op_times(graph)
        lat = np.asarray(cost_model.latency_s, dtype=np.float64)
        bw = np.asarray(cost_model.bandwidth_bytes_per_s, dtype=np.float64)
        mem = cost_model.memory_bytes
        grp = getattr(cost_model, "exclusive_group_ids", None)
        launch = getattr(cost_model, "launch_s", None)
        dispatch = getattr(cost_model, "dispatch_s", None)
        put = getattr(cost_model, "put_s", None)
        pool = (cost_model.pool_rule(graph) if hasattr(cost_model, "pool_rule")
                else (None, None, None))
        unfused = (cost_model.op_unfused_times(graph)
                   if hasattr(cost_model, "op_unfused_times") else None)
        waits = getattr(cost_model, "put_waits", None)
    except AttributeError as err:
        raise CostModelError(
            f"{type(cost_model).__name__} is neither SimInputs nor a cost model "
            f"(missing {err.name!r}); pass a simplace.CostModel or sim.SimInputs."
        ) from None
    return make_sim_inputs(t, lat, bw, mem, grp, launch, dispatch, put, *pool, unfused,
                           waits, getattr(cost_model, "objective", "latency"))


def check_simulator_options(memory, max_batch) -> None:
    """The options every batched simulator takes: ``memory`` in (True, False, "oom"),
    ``max_batch`` None or a positive number of placements."""
    if memory not in (True, False, "oom"):
        raise ValueError(f"memory must be True, False or 'oom', got {memory!r}")
    if max_batch is not None and int(max_batch) < 1:
        raise ValueError(f"max_batch must be a positive number of placements, got "
                         f"{max_batch!r}")

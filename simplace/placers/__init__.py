"""Placers and the ``optimize`` front end: one signature for every method.

A method is a function ``place(ctx: PlacerContext) -> PlacerOutput`` registered under a
name with ``@register("name")``; adding a method is adding one module that registers
itself (and importing it in ``_load_methods``). The front end re-simulates every
returned placement with the reference simulator, so the step time a method reports is
always the simulator's, never the method's own estimate.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from simplace.errors import SimplaceError


@dataclasses.dataclass
class PlacerOutput:
    """What a method returns: ``placement`` int32[M], and optionally a ``history`` of
    ``{"wall_s", "step_time_s", ...}`` rows (for search curves) and ``info`` (free form)."""

    placement: np.ndarray
    history: list[dict] = dataclasses.field(default_factory=list)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, eq=False)
class OptimizeResult:
    """The result of ``optimize``.

    placement: int32[M], device index per op.
    step_time_s, oom, peak_memory_bytes [D], busy_s [D], bytes_moved, num_segments,
      num_transfers, host_s: the reference simulator's verdict on ``placement`` (see
      ``SimResult``: segments run, ``device_put`` calls, host time spent dispatching).
    wall_s: the method's own wall time (seconds), simulation of the result excluded.
    method, seed: what produced it.
    history: search curve rows (method-specific; may be empty).
    info: method-specific details.
    """

    placement: np.ndarray
    step_time_s: float
    oom: bool
    peak_memory_bytes: np.ndarray
    busy_s: np.ndarray
    bytes_moved: float
    wall_s: float
    method: str
    seed: int
    history: list[dict]
    info: dict[str, Any]
    num_segments: int = 0
    num_transfers: int = 0
    host_s: float = 0.0


class PlacerContext:
    """Everything a method may use; costly pieces are built on first use and cached.

    Attributes:
      graph, cost_model, seed, budget_s (None: the method's default), options (dict of
      method-specific keyword options), rng (``np.random.Generator`` from ``seed``).
    """

    def __init__(self, graph, cost_model, *, seed: int = 0, budget_s: float | None = None,
                 options: dict | None = None, progress: Callable[[str], None] | None = None):
        self.graph = graph
        self.cost_model = cost_model
        self.seed = int(seed)
        self.budget_s = budget_s
        self.options = dict(options or {})
        self.rng = np.random.default_rng(self.seed)
        self._progress = progress

    @functools.cached_property
    def inputs(self):
        """The simulator's arrays for this problem (``SimInputs``): op times, corrected
        latency and bandwidth, memory, exclusive groups; works for a SimInputs too."""
        from simplace.sim import sim_inputs

        return sim_inputs(self.graph, self.cost_model)

    @functools.cached_property
    def op_times(self) -> np.ndarray:
        """float64[M, D] seconds of each op on each device."""
        return self.inputs.op_time_s

    @functools.cached_property
    def lower_bound_s(self) -> float:
        from simplace.sim import lower_bound

        return lower_bound(self.graph, self.cost_model)

    @functools.cached_property
    def batched(self):
        """The batched simulator (exact OOM flags; peaks only where memory is tight)."""
        from simplace.sim import batched_simulator

        return batched_simulator(self.graph, self.cost_model, memory="oom")

    def simulate(self, placement, **kw):
        """The reference simulator on one placement."""
        from simplace.sim import simulate

        return simulate(self.graph, self.cost_model, placement, **kw)

    def score(self, placements) -> np.ndarray:
        """float64[B]: each placement's step time, OOM ones pushed behind every placement
        that fits (see ``penalised``); the batched simulator, many placements per call."""
        res = self.batched(np.atleast_2d(placements))
        return penalised(res.step_time_s, res.oom)

    def progress(self, message: str) -> None:
        if self._progress is not None:
            self._progress(message)


# An OOM placement scores as if it took this much longer; large enough that any placement
# that fits wins, while still ordering OOM placements by step time.
OOM_PENALTY = 1e6


def penalised(step_time_s, oom) -> np.ndarray:
    """Step times with OOM placements pushed behind every placement that fits."""
    step = np.asarray(step_time_s, dtype=np.float64)
    return np.where(np.asarray(oom), step + OOM_PENALTY, step)


_METHODS: dict[str, Callable[[PlacerContext], PlacerOutput]] = {}
# Modules that register methods; imported on first use so that ``import simplace``
# stays light.
_METHOD_MODULES = ("single", "expert", "list_schedulers", "partitioners", "local", "exact",
                   "rl")


def register(name: str):
    """Decorator: make ``fn(ctx) -> PlacerOutput`` available as ``optimize(method=name)``."""

    def deco(fn):
        _METHODS[name] = fn
        return fn

    return deco


def _load_methods() -> None:
    for mod in _METHOD_MODULES:
        try:
            importlib.import_module(f"simplace.placers.{mod}")
        except ModuleNotFoundError as err:
            if err.name != f"simplace.placers.{mod}":
                raise


def methods() -> list[str]:
    """Names of the available methods (``all`` runs them all)."""
    _load_methods()
    return sorted(_METHODS)


def method_docs() -> dict[str, str]:
    """``{name: first line of its docstring}`` for every method."""
    _load_methods()
    docs = {}
    for name in sorted(_METHODS):
        fn = _METHODS[name]
        doc = (fn.__doc__ or sys.modules[fn.__module__].__doc__ or "").strip()
        first = doc.splitlines()[0] if doc else ""
        docs[name] = first.removeprefix(f"``{name}``:").strip()
    return docs


def optimize(graph, cost_model, method: str = "heft", *, seed: int = 0,
             budget_s: float | None = None, progress: Callable[[str], None] | None = None,
             **options) -> OptimizeResult:
    """Find a placement of ``graph`` on ``cost_model``'s machine with ``method``.

    Args:
      graph: an OpGraph.
      cost_model: a CostModel.
      method: one of ``methods()``, or ``"all"``: run them all (``compare``) and return
        the best, with every method's figures in ``info["compared"]``.
      seed: seeds every random choice; the same seed gives the same placement.
      budget_s: wall-time budget for search methods (None: the method's default).
      progress: called with short progress messages (the CLI prints them).
      **options: method-specific options.

    Returns:
      An ``OptimizeResult`` whose step time and OOM flag come from the reference
      simulator.
    """
    _load_methods()
    if method == "all":
        return best_of(compare(graph, cost_model, seed=seed, budget_s=budget_s,
                               progress=progress))
    if method not in _METHODS:
        raise SimplaceError(f"Unknown placement method {method!r}. Available: "
                            f"{', '.join(sorted(_METHODS))} (or 'all').")
    ctx = PlacerContext(graph, cost_model, seed=seed, budget_s=budget_s, options=options,
                        progress=progress)
    t0 = time.perf_counter()
    out = _METHODS[method](ctx)
    wall_s = time.perf_counter() - t0
    from simplace.placement import check_placement

    placement = check_placement(out.placement, graph.num_ops, ctx.inputs.num_devices)
    res = ctx.simulate(placement)
    return OptimizeResult(
        placement=placement, step_time_s=float(res.step_time_s), oom=bool(res.oom),
        peak_memory_bytes=res.peak_memory_bytes, busy_s=res.busy_s,
        bytes_moved=float(res.bytes_moved), wall_s=wall_s, method=method, seed=int(seed),
        history=list(out.history), info=dict(out.info), num_segments=int(res.num_segments),
        num_transfers=int(res.num_transfers), host_s=float(res.host_s))


def compare(graph, cost_model, methods_: list[str] | None = None, *, seed: int = 0,
            budget_s: float | None = None,
            progress: Callable[[str], None] | None = None) -> list[OptimizeResult]:
    """Run several methods (default: every one except ``exact`` and ``rl-*``) on one
    problem.

    ``local`` runs last, so that it can start from the others. A method that fails is
    reported through ``progress`` and left out, so one broken method does not hide the
    rest. Returns the results in the order run.
    """
    if methods_ is None:
        # exact is exponential and rl-* train for a minute each: run them by name.
        names = [m for m in methods() if m != "exact" and not m.startswith("rl-")]
        methods_ = sorted(names, key=lambda m: (m == "local", m))
    results = []
    for m in methods_:
        if progress:
            progress(f"running {m}...")
        try:
            results.append(optimize(graph, cost_model, m, seed=seed, budget_s=budget_s,
                                    progress=progress))
        except SimplaceError as err:
            if progress:
                progress(f"{m} failed: {err}")
    return results


def best_of(results: list[OptimizeResult]) -> OptimizeResult:
    """The fastest result that fits in memory (the fastest of all if none fits), with a
    summary of every result in ``info["compared"]``."""
    if not results:
        raise SimplaceError("No placement method succeeded; see the progress messages.")
    fitting = [r for r in results if not r.oom] or results
    best = min(fitting, key=lambda r: r.step_time_s)
    compared = [{"method": r.method, "step_time_s": r.step_time_s, "oom": r.oom,
                 "wall_s": r.wall_s} for r in results]
    return dataclasses.replace(best, info={**best.info, "compared": compared})

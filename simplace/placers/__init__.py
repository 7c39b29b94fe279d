"""Placers and the ``optimize`` front end: one signature for every method.

A method is a function ``place(ctx: PlacerContext) -> PlacerOutput`` registered under a
name with ``@register("name", options={...})``, which declares the keyword options it
takes (``optimize`` refuses any other, naming the valid ones); adding a method is adding
one module that registers itself (and importing it in ``_load_methods``). The front end
re-simulates every returned placement with the reference simulator, under the cost model
the method judged it by (a search that validated on hardware may have switched to a
drift-corrected one), so the step time a method reports is always the simulator's, never
the method's own estimate. Search methods share ``simplace.search.SearchSession`` (clock,
stop reason, best placement, history, progress, the validation hook).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from simplace._argtypes import check_budget, check_seed
from simplace.errors import OptionError, SimplaceError
from simplace.search import OOM_PENALTY, SearchSession, penalised, stop_requested
from simplace.sim.objective import Ruler


@dataclasses.dataclass
class PlacerOutput:
    """What a method returns: ``placement`` int32[M], and optionally a ``history`` of
    ``{"wall_s", "step_time_s", ...}`` rows (for search curves), ``info`` (free form) and
    ``cost_model``: the model the placement was judged under when it is not the one
    ``optimize`` was given (a search that switched to a drift-corrected model)."""

    placement: np.ndarray
    history: list[dict] = dataclasses.field(default_factory=list)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    cost_model: Any = None


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
    info: method-specific details (search methods: ``stop``, ``first_batch_s``,
      ``budget_s``, ...).
    cost_model: the cost model the figures above were simulated under: the one given to
      ``optimize``, or the drift-corrected one a validating search switched to. Compare
      results (and lower bounds) under the same model.
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
    cost_model: Any = None


class PlacerContext:
    """Everything a method may use; costly pieces are built on first use and cached.

    A context is never changed: ``with_cost_model`` gives a new one for another cost
    model (with its own simulators), sharing the rest (the random generator included).

    Attributes:
      graph, cost_model, seed, budget_s (None: the method's default), options (dict of
      method-specific keyword options), rng (``np.random.Generator`` from ``seed``),
      t_begin (``time.perf_counter()`` when the work began: budgets run from it).
    """

    def __init__(self, graph, cost_model, *, seed: int = 0, budget_s: float | None = None,
                 options: dict | None = None, progress: Callable[[str], None] | None = None,
                 t_begin: float | None = None, rng: np.random.Generator | None = None):
        self.graph = graph
        self.cost_model = cost_model
        self.seed = int(seed)
        self.budget_s = budget_s
        self.options = dict(options or {})
        self.rng = np.random.default_rng(self.seed) if rng is None else rng
        self.t_begin = time.perf_counter() if t_begin is None else t_begin
        self._progress = progress

    def with_cost_model(self, cost_model) -> PlacerContext:
        """A new context for ``cost_model`` (fresh simulators), the rest shared."""
        return PlacerContext(self.graph, cost_model, seed=self.seed, budget_s=self.budget_s,
                             options=self.options, progress=self._progress,
                             t_begin=self.t_begin, rng=self.rng)

    def session(self, label: str, *, default_budget_s: float | None = None, **kw
                ) -> SearchSession:
        """A ``SearchSession`` for this problem: its clock runs from ``t_begin`` with
        ``budget_s`` (or ``default_budget_s``), its hook and top-k from the options
        ``validate``, ``validate_every`` and ``top_k``; ``kw`` go to the session."""
        budget = self.budget_s if self.budget_s is not None else default_budget_s
        return SearchSession(label, self.cost_model, budget_s=budget, t_begin=self.t_begin,
                             hook=self.options.get("validate"),
                             validate_every=_int_option(self.options, "validate_every", 0),
                             top_k=_int_option(self.options, "top_k", 5),
                             progress=self._progress, **kw)

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


def _int_option(options: dict, name: str, default: int) -> int:
    val = options.get(name, default)
    if isinstance(val, bool) or not isinstance(val, int | np.integer):
        raise OptionError(f"Option {name} must be an integer, got {val!r}.")
    return int(val)


__all__ = ["OOM_PENALTY", "OptimizeResult", "PlacerContext", "PlacerOutput", "best_of",
           "compare", "method_options", "methods", "optimize", "penalised", "register"]

_METHODS: dict[str, Callable[[PlacerContext], PlacerOutput]] = {}
_OPTIONS: dict[str, dict[str, str]] = {}
# Modules that register methods; imported on first use so that ``import simplace``
# stays light.
_METHOD_MODULES = ("single", "expert", "list_schedulers", "partitioners", "local", "exact",
                   "rl")


def register(name: str, *, options: dict[str, str] | None = None):
    """Decorator: make ``fn(ctx) -> PlacerOutput`` available as ``optimize(method=name)``.

    ``options``: ``{option name: one-line description}`` of every keyword option the
    method reads from ``ctx.options``; ``optimize`` refuses any other."""

    def deco(fn):
        _METHODS[name] = fn
        _OPTIONS[name] = dict(options or {})
        return fn

    return deco


def method_options(method: str) -> dict[str, str]:
    """``{option: description}`` of the keyword options ``method`` takes."""
    _load_methods()
    if method not in _METHODS:
        raise SimplaceError(f"Unknown placement method {method!r}. Available: "
                            f"{', '.join(sorted(_METHODS))} (or 'all').")
    return dict(_OPTIONS.get(method, {}))


def _check_options(method: str, options: dict) -> None:
    valid = _OPTIONS.get(method, {})
    unknown = sorted(set(options) - set(valid))
    if unknown:
        which = ", ".join(repr(u) for u in unknown)
        takes = (f"Valid options: {', '.join(sorted(valid))}." if valid
                 else "It takes no options.")
        raise OptionError(f"Method {method!r} has no option{'s' * (len(unknown) > 1)} "
                          f"{which}. {takes}")


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
    """``{name: one-line summary}`` for every method: the first paragraph of its
    docstring (of its module's when it has none), whole, on one line."""
    _load_methods()
    docs = {}
    for name in sorted(_METHODS):
        fn = _METHODS[name]
        doc = (fn.__doc__ or sys.modules[fn.__module__].__doc__ or "").strip()
        first = " ".join(doc.split("\n\n")[0].split())
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
      **options: method-specific options (``method_options(method)`` lists them; any
        other is an ``OptionError``).

    Returns:
      An ``OptimizeResult`` whose step time and OOM flag come from the reference
      simulator, under ``result.cost_model`` (``cost_model``, or the drift-corrected
      model a validating search switched to). The step time is the model's objective
      (``CostModel.with_objective``): every method minimises that.
    """
    t_begin = time.perf_counter()
    _check_problem(graph, cost_model, seed, budget_s, progress)
    _load_methods()
    if not isinstance(method, str):
        raise OptionError(f"method must be a method name (a string: one of "
                          f"{', '.join(methods())} or 'all'), got {method!r}.")
    if method == "all":
        if options:
            raise OptionError(f"--method all takes no method options, got "
                              f"{', '.join(sorted(options))}.")
        return best_of(compare(graph, cost_model, seed=seed, budget_s=budget_s,
                               progress=progress))
    out, ctx = run_method(graph, cost_model, method, seed=seed, budget_s=budget_s,
                      progress=progress, options=options, t_begin=t_begin)
    wall_s = time.perf_counter() - t_begin
    from simplace.placement import check_placement
    from simplace.sim import simulate

    model = out.cost_model if out.cost_model is not None else cost_model
    placement = check_placement(out.placement, graph.num_ops, ctx.inputs.num_devices)
    if isinstance(ctx.inputs.objective, Ruler):  # its colocation classes kept together
        placement = ctx.inputs.objective.project(placement)
    res = simulate(graph, model, placement)
    return OptimizeResult(
        placement=placement, step_time_s=float(res.step_time_s), oom=bool(res.oom),
        peak_memory_bytes=res.peak_memory_bytes, busy_s=res.busy_s,
        bytes_moved=float(res.bytes_moved), wall_s=wall_s, method=method, seed=int(seed),
        history=list(out.history), info=dict(out.info), num_segments=int(res.num_segments),
        num_transfers=int(res.num_transfers), host_s=float(res.host_s), cost_model=model)


def _check_problem(graph, cost_model, seed, budget_s, progress) -> None:
    """The arguments every method shares, checked as the command line checks them.
    (Graph and machine are duck-typed: what the simulators read; tests hand-build them.)"""
    if isinstance(graph, str | bytes) or not hasattr(graph, "num_ops"):
        raise OptionError(f"graph must be an OpGraph (simplace.trace(fn, *args) or "
                          f"OpGraph.load(path)), got {type(graph).__name__}.")
    if isinstance(cost_model, str | bytes) or not hasattr(cost_model, "num_devices"):
        raise OptionError(f"cost_model must be a CostModel (CostModel.load(name)), got "
                          f"{type(cost_model).__name__}.")
    check_seed(seed)
    check_budget(budget_s)
    if progress is not None and not callable(progress):
        raise OptionError(f"progress must be a callable taking a message, or None; got "
                          f"{type(progress).__name__}.")


def run_method(graph, cost_model, method: str, *, seed: int = 0,
               budget_s: float | None = None, progress=None, options: dict | None = None,
               t_begin: float | None = None) -> tuple[PlacerOutput, PlacerContext]:
    """Run ``method`` and return its raw output (no re-simulation) and context: for
    searches that start from other methods' placements and score them themselves."""
    _check_problem(graph, cost_model, seed, budget_s, progress)
    _load_methods()
    if not isinstance(method, str) or method not in _METHODS:
        raise SimplaceError(f"Unknown placement method {method!r}. Available: "
                            f"{', '.join(sorted(_METHODS))} (or 'all').")
    options = dict(options or {})
    _check_options(method, options)
    ctx = PlacerContext(graph, cost_model, seed=seed, budget_s=budget_s, options=options,
                        progress=progress, t_begin=t_begin)
    return _METHODS[method](ctx), ctx


# ``compare`` without a budget: the total wall time it shares out (a default run of
# ``optimize --method all`` answers in about a minute, compilation included).
COMPARE_DEFAULT_BUDGET_S = 60.0
# Of a shared budget, the part the fast methods (heuristics, partitioners, list
# schedulers) may use before the searches get the rest.
_FAST_SHARE = 0.4
# A search is not started with less than this (it could not build its first batch).
_MIN_SEARCH_S = 1.0
# An RL policy compiles before its first batch (5-13 s for the zoo's training graphs on
# 2 CPU cores), so with a shorter part it would return its warm start after overrunning
# the budget: ``compare`` plans no policy a part under this and gives its time to local.
_MIN_POLICY_S = 8.0


def is_search(method: str) -> bool:
    """True for the methods that search within a time budget (``local`` and ``rl-*``)."""
    return method == "local" or method.startswith("rl-")


def compare(graph, cost_model, methods_: list[str] | None = None, *, seed: int = 0,
            budget_s: float | None = None,
            progress: Callable[[str], None] | None = None,
            prior: Sequence[OptimizeResult] = (),
            found: list | None = None) -> list[OptimizeResult]:
    """Run several methods (default: every one except ``exact``) on one problem, within
    one shared wall-time budget (default ``COMPARE_DEFAULT_BUDGET_S``).

    The fast methods run first, together within 40% of the budget; then the searches
    share what is left, each taking an equal part of the time remaining when it starts:
    ``local`` first, starting from every placement found before it (none is
    recomputed), then the ``rl-*`` methods, warm-started from every placement found so
    far, best first (the best seeds them; their restarts go to the next ones). So no
    search returns worse than the best method before it. Policies are planned first:
    only as many (in name order, rl-gnn first) as get a part of at least
    ``_MIN_POLICY_S`` each, so that a short budget goes to ``local`` rather than to
    compiling policies; the others are skipped and reported (without ``local``, one
    policy always runs). As for one search, the time
    to build a search's first batch (compilation) is outside its part, so the whole
    can overrun the budget by a first batch; to keep it to about one, a search is
    skipped (and reported) when its part is shorter than the longest first batch of the
    searches run before it: it would spend its part compiling, return its warm start,
    and add its compilation to the overrun. A search left with under a second is skipped
    too. A method that fails is reported through ``progress`` and left out, so one
    broken method does not hide the rest. After ``simplace.search.request_stop()``
    (Ctrl-C in the CLI) the method running finishes (a search at its next step) and the
    others are skipped, said through ``progress``. ``prior``: results of the same graph and
    machine computed before (for instance list schedulers run without a budget, so that
    their result does not depend on the machine's load): not run again, used like the
    fast methods' results (the searches start from them), and returned first. ``found``:
    a list each result is appended to as it comes (for a caller that acts before
    ``compare`` returns, e.g. on an interrupt). Returns the results in the order run.
    """
    _check_problem(graph, cost_model, seed, budget_s, progress)
    _load_methods()
    if methods_ is None:
        methods_ = [m for m in methods() if m != "exact"]
    if isinstance(methods_, str) or not isinstance(methods_, Sequence) or not methods_:
        raise OptionError(f"methods_ must be a non-empty list of method names (None: every "
                          f"method but exact), got {methods_!r}.")
    unknown = [m for m in methods_ if not isinstance(m, str) or m not in _METHODS]
    if unknown:
        raise SimplaceError(f"Unknown placement method(s) {', '.join(map(repr, unknown))}. "
                            f"Available: "
                            f"{', '.join(sorted(_METHODS))}.")
    done = {r.method for r in prior}
    methods_ = [m for m in methods_ if m not in done]
    fast = [m for m in methods_ if not is_search(m)]
    searches = sorted((m for m in methods_ if is_search(m)), key=lambda m: (m != "local", m))
    total_s = COMPARE_DEFAULT_BUDGET_S if budget_s is None else float(budget_s)
    t0 = time.perf_counter()
    fast_until = t0 + (_FAST_SHARE * total_s if searches else total_s)
    results = found if found is not None else []
    results.extend(prior)

    def run(m, budget, **options):
        if progress:
            progress(f"running {m} ({budget:.1f} s budget)...")
        try:
            results.append(optimize(graph, cost_model, m, seed=seed, budget_s=budget,
                                    progress=progress, **options))
        except SimplaceError as err:
            if progress:
                progress(f"{m} failed: {err}")

    def interrupted(rest: list[str]) -> bool:
        """After a stop request, the methods not begun are skipped (and said so)."""
        if not stop_requested():
            return False
        if progress and rest:
            progress(f"interrupted: skipped {', '.join(rest)}")
        return True

    for k, m in enumerate(fast):
        if interrupted(fast[k:] + searches):
            return results
        # Fast methods that honour a budget (the list schedulers) stop starting runs
        # when the fast share is spent; the others ignore it.
        run(m, max(fast_until - time.perf_counter(), 0.05 * total_s))
    if interrupted(searches):
        return results
    searches = _plan_searches(searches, t0 + total_s - time.perf_counter(), total_s,
                              progress)
    first_batch_s = 0.0  # the longest first batch of the searches run so far
    for i, m in enumerate(searches):
        if interrupted(searches[i:]):
            return results
        left_s = t0 + total_s - time.perf_counter()
        share_s = left_s / (len(searches) - i)
        if share_s < max(_MIN_SEARCH_S, first_batch_s):
            if progress:
                why = (f"; a search's first batch took {first_batch_s:.1f} s here"
                       if first_batch_s > _MIN_SEARCH_S else "")
                progress(f"{m} skipped: {max(left_s, 0.0):.1f} s of the {total_s:g} s "
                         f"budget left{why} (give more with --budget-s)")
            continue
        found = [r for r in results if not r.oom] or results
        if m == "local":
            options = {"starts": [r.placement for r in results]} if results else {}
        else:
            # Every placement found so far, best first: the policy starts from the best
            # and its portfolio restarts from the next distinct ones (other basins).
            ranked = sorted(found, key=lambda r: r.step_time_s)
            options = {"warm_start": np.stack([r.placement for r in ranked])} \
                if ranked else {}
        n_before = len(results)
        run(m, share_s, **options)
        if len(results) > n_before:
            first_batch_s = max(first_batch_s, results[-1].info.get("first_batch_s") or 0.0)
            wall_s = getattr(results[-1], "wall_s", None) or 0.0
            if progress and wall_s - share_s > max(0.1 * share_s, 1.0):
                progress(f"{m} ran {wall_s:.1f} s of a {share_s:.1f} s part "
                         f"(its first batch, compilation included, took "
                         f"{results[-1].info.get('first_batch_s') or 0.0:.1f} s); the "
                         "searches after it share what is left")
    return results


def _plan_searches(searches: list[str], left_s: float, total_s: float,
                   progress: Callable[[str], None] | None) -> list[str]:
    """The searches ``compare`` runs: ``local`` (if asked for), then as many policies as
    get at least ``_MIN_POLICY_S`` each of the ``left_s`` seconds shared equally (at
    least one when there is no ``local``); the others are reported as skipped."""
    local = [m for m in searches if m == "local"]
    policies = [m for m in searches if m != "local"]
    k = len(policies)
    while k > (0 if local else 1) and left_s / (len(local) + k) < _MIN_POLICY_S:
        k -= 1
    if progress:
        for m in policies[k:]:
            progress(f"{m} skipped: its part of the {total_s:g} s budget would be "
                     f"{max(left_s, 0.0) / (len(local) + k + 1):.1f} s, under the "
                     f"{_MIN_POLICY_S:g} s a policy needs to compile and train"
                     f"{'; local gets the time' if local else ''} (give more with "
                     f"--budget-s)")
    return local + policies[:k]


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

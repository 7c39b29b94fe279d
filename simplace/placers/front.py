"""The front ends: ``optimize`` (one method), ``compare`` (several within one budget),
``best_of``. The front end re-simulates every returned placement with the reference
simulator, under the cost model the method judged it by (a search that validated on
hardware may have switched to a drift-corrected one), so the step time a method reports
is always the simulator's, never the method's own estimate."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np

from simplace._argtypes import check_budget, check_seed
from simplace.errors import OptionError, SimplaceError
from simplace.kernels import note_cold
from simplace.placers.context import (
    REFERENCE_S_PER_OP,
    OptimizeResult,
    PlacerContext,
    PlacerOutput,
)
from simplace.placers.registry import (
    _load_methods,
    check_options,
    fast_cost_s,
    fast_rank,
    is_search,
    method_kind,
    methods,
    note_called,
    paces,
)
from simplace.placers.registry import method as registered
from simplace.search import stop_requested
from simplace.sim.objective import Ruler


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
    if is_search(method):
        note_cold(progress, budget_s)
    out, ctx = run_method(graph, cost_model, method, seed=seed,
                          budget_s=_search_budget(graph, budget_s), progress=progress,
                          options=options, t_begin=t_begin)
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


# The reference simulation of the result (below, after the method) counts against the
# budget: the method gets the budget less this many seconds per op (at most half of it),
# the reference simulator's (``context.REFERENCE_S_PER_OP``). With 8.7 us an op,
# rl-pretrained with --budget-s 1.8 answered in 1.75-1.89 s on nmt_4layer (22k ops).
FINAL_SIMULATION_S_PER_OP = REFERENCE_S_PER_OP


def _search_budget(graph, budget_s: float | None) -> float | None:
    """The budget a method gets within ``optimize``'s: ``budget_s`` less the expected
    seconds of the final reference simulation (at most half of it)."""
    if budget_s is None:
        return None
    return max(float(budget_s) - FINAL_SIMULATION_S_PER_OP * graph.num_ops,
               0.5 * float(budget_s))


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
    entry = registered(method)
    options = dict(options or {})
    check_options(method, options)
    ctx = PlacerContext(graph, cost_model, seed=seed, budget_s=budget_s, options=options,
                        progress=progress, t_begin=t_begin)
    try:
        return entry.fn(ctx), ctx
    finally:
        note_called(method)



# ``compare`` without a budget: the total wall time it shares out (a default run of
# ``optimize --method all`` answers in about a minute, compilation included).
COMPARE_DEFAULT_BUDGET_S = 60.0
# Of a shared budget, the part the fast methods (heuristics, partitioners, list
# schedulers) may use before the searches get the rest.
_FAST_SHARE = 0.4
# Only estimates of at least this much say something about the pace (below it, fixed
# overheads such as imports dominate), and the pace stays within these bounds.
_PACE_MIN_S = 0.05
_PACE_BOUNDS = (1 / 3, 3.0)
# Fast methods estimated under this go first (by registered rank): on a small graph the
# pretrained policy's first call in a process (compilation and caches loaded, which may
# take several seconds on a loaded machine) then comes after every other method.
_CHEAP_S = 0.25
# A search is not started with less than this (it could not build its first batch).
_MIN_SEARCH_S = 1.0
# An RL policy compiles before its first batch (5-13 s for the zoo's training graphs on
# 2 CPU cores), so with a shorter part it would return its warm start after overrunning
# the budget: ``compare`` plans no policy a part under this and gives its time to local.
_MIN_POLICY_S = 8.0


def compare(graph, cost_model, methods_: list[str] | None = None, *, seed: int = 0,
            budget_s: float | None = None,
            progress: Callable[[str], None] | None = None,
            prior: Sequence[OptimizeResult] = (),
            found: list | None = None) -> list[OptimizeResult]:
    """Run several methods (default: every one except ``exact``) on one problem, within
    one shared wall-time budget (default ``COMPARE_DEFAULT_BUDGET_S``).

    The fast methods run first (with their ``start_options``: they are the searches'
    starts), together within 40% of the budget, cheap ones first
    (those estimated under ``_CHEAP_S``, then the others, each group by registered
    ``rank``),
    each given an equal part of the fast share left (unused time goes
    to those after it) but at least its estimated cost (``fast_cost_s``, rescaled by
    what the methods that take no budget took here); one whose estimate does not fit
    the fast share left is skipped and reported (on a small graph every one runs). The
    list schedulers and ``ideals`` stop at the end of their part; then the searches
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
    methods_ = _methods_to_compare(methods_, prior)
    if any(is_search(m) for m in methods_):
        note_cold(progress, COMPARE_DEFAULT_BUDGET_S if budget_s is None else budget_s)
    num_ops, num_devices = int(graph.num_ops), int(cost_model.num_devices)
    fast = sorted((m for m in methods_ if not is_search(m)), key=lambda m: (
        fast_cost_s(m, num_ops, num_devices) >= _CHEAP_S, fast_rank(m)))
    # The annealer first (it starts from every placement found), then the policies.
    searches = sorted((m for m in methods_ if is_search(m)),
                      key=lambda m: (method_kind(m) != "annealer", m))
    run = _Comparison(graph, cost_model, seed, progress, found, prior,
                      COMPARE_DEFAULT_BUDGET_S if budget_s is None else float(budget_s))
    fast_s = _FAST_SHARE * run.total_s if searches else run.total_s
    if run.fast_methods(fast, fast_s, searches) and not run.interrupted(searches):
        run.searches(_plan_searches(searches, run.left_s(), run.total_s, progress))
    return run.results


def _methods_to_compare(methods_, prior) -> list[str]:
    """``compare``'s methods checked (default: all but the exhaustive), less those
    ``prior`` has results of."""
    _load_methods()
    if methods_ is None:
        methods_ = [m for m in methods() if method_kind(m) != "exhaustive"]
    if isinstance(methods_, str) or not isinstance(methods_, Sequence) or not methods_:
        raise OptionError(f"methods_ must be a non-empty list of method names (None: every "
                          f"method but exact), got {methods_!r}.")
    known = methods()
    unknown = [m for m in methods_ if not isinstance(m, str) or m not in known]
    if unknown:
        raise SimplaceError(f"Unknown placement method(s) {', '.join(map(repr, unknown))}. "
                            f"Available: {', '.join(known)}.")
    done = {r.method for r in prior}
    return [m for m in methods_ if m not in done]


class _Comparison:
    """One ``compare`` run: the problem, the shared clock and the results so far."""

    def __init__(self, graph, cost_model, seed, progress, found, prior, total_s: float):
        self.graph, self.cost_model, self.seed = graph, cost_model, seed
        self.progress = progress
        self.results = found if found is not None else []
        self.results.extend(prior)
        self.total_s = total_s
        self.t0 = time.perf_counter()

    def left_s(self) -> float:
        """Seconds of the whole budget left."""
        return self.t0 + self.total_s - time.perf_counter()

    def say(self, msg: str) -> None:
        if self.progress:
            self.progress(msg)

    def run(self, m: str, budget: float, **options) -> OptimizeResult | None:
        """Run ``m`` within ``budget``; its result (also appended), or None if it failed
        (said through ``progress``)."""
        self.say(f"running {m} ({budget:.1f} s budget)...")
        try:
            r = optimize(self.graph, self.cost_model, m, seed=self.seed, budget_s=budget,
                         progress=self.progress, **options)
        except SimplaceError as err:
            self.say(f"{m} failed: {err}")
            return None
        self.results.append(r)
        return r

    def interrupted(self, rest: list[str]) -> bool:
        """After a stop request, the methods not begun are skipped (and said so)."""
        if not stop_requested():
            return False
        if rest:
            self.say(f"interrupted: skipped {', '.join(rest)}")
        return True

    def fast_methods(self, fast: list[str], fast_s: float, searches: list[str]) -> bool:
        """Run the fast methods within ``fast_s`` seconds; False if interrupted."""
        num_ops, num_devices = int(self.graph.num_ops), int(self.cost_model.num_devices)
        fast_until = self.t0 + fast_s
        pace = _Pace()
        for k, m in enumerate(fast):
            if self.interrupted(fast[k:] + searches):
                return False
            # Each fast method gets an equal part of the fast share left (what one leaves
            # unused goes to those after it), but at least its estimated cost: the list
            # schedulers and ideals stop at the end of their part, the others run to
            # their end. One whose estimate does not fit the fast share left is skipped:
            # it would overrun it, and the searches after it would pay.
            left_s = fast_until - time.perf_counter()
            estimate_s = fast_cost_s(m, num_ops, num_devices)
            need_s = pace.factor * estimate_s
            if need_s > left_s:
                self.say(f"{m} skipped: it takes about {need_s:.1f} s on {num_ops:,} ops "
                         f"and {num_devices} devices, and {max(left_s, 0.0):.1f} s of the "
                         f"fast methods' {fast_s:.1f} s share of the {self.total_s:g} s "
                         "budget is left (give more with --budget-s)")
                continue
            # As the searches' starts, each with its start options (rl-pretrained: its
            # batch alone; the searches refine).
            r = self.run(m, max(left_s / (len(fast) - k), need_s),
                         **registered(m).start_options)
            if r is not None:
                pace.add(m, estimate_s, getattr(r, "wall_s", None))
        return True

    def searches(self, searches: list[str]) -> None:
        """Run the searches, each in an equal part of the time left when it starts."""
        first_batch_s = 0.0  # the longest first batch of the searches run so far
        for i, m in enumerate(searches):
            if self.interrupted(searches[i:]):
                return
            left_s = self.left_s()
            share_s = left_s / (len(searches) - i)
            if share_s < max(_MIN_SEARCH_S, first_batch_s):
                why = (f"; a search's first batch took {first_batch_s:.1f} s here"
                       if first_batch_s > _MIN_SEARCH_S else "")
                self.say(f"{m} skipped: {max(left_s, 0.0):.1f} s of the {self.total_s:g} s "
                         f"budget left{why} (give more with --budget-s)")
                continue
            r = self.run(m, share_s, **self._search_options(m))
            if r is None:
                continue
            batch_s = r.info.get("first_batch_s") or 0.0
            first_batch_s = max(first_batch_s, batch_s)
            wall_s = getattr(r, "wall_s", None) or 0.0
            if wall_s - share_s > max(0.1 * share_s, 1.0):
                self.say(f"{m} ran {wall_s:.1f} s of a {share_s:.1f} s part (its first "
                         f"batch, compilation included, took {batch_s:.1f} s); the "
                         "searches after it share what is left")

    def _search_options(self, m: str) -> dict:
        results = self.results
        if not results:
            return {}
        if method_kind(m) == "annealer":
            return {"starts": [r.placement for r in results]}
        # Every placement found so far, best first: the policy starts from the best and
        # its portfolio restarts from the next distinct ones (other basins).
        found = [r for r in results if not r.oom] or results
        ranked = sorted(found, key=lambda r: r.step_time_s)
        return {"warm_start": np.stack([r.placement for r in ranked])}


class _Pace:
    """How much slower than the estimates (``fast_cost_s``) this machine runs now: the
    geometric mean of wall / estimate of the methods of ``Cost.paces`` run so far
    (estimates of at least ``_PACE_MIN_S``), within ``_PACE_BOUNDS``; 1 before any."""

    def __init__(self):
        self.logs: list[float] = []

    def add(self, method: str, estimate_s: float, wall_s: float | None) -> None:
        if paces(method) and estimate_s >= _PACE_MIN_S and wall_s:
            self.logs.append(float(np.log(wall_s / estimate_s)))

    @property
    def factor(self) -> float:
        if not self.logs:
            return 1.0
        return float(np.clip(np.exp(np.mean(self.logs)), *_PACE_BOUNDS))


def _plan_searches(searches: list[str], left_s: float, total_s: float,
                   progress: Callable[[str], None] | None) -> list[str]:
    """The searches ``compare`` runs: ``local`` (if asked for), then as many policies as
    get at least ``_MIN_POLICY_S`` each of the ``left_s`` seconds shared equally (at
    least one when there is no ``local``); the others are reported as skipped."""
    local = [m for m in searches if method_kind(m) == "annealer"]
    policies = [m for m in searches if method_kind(m) != "annealer"]
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

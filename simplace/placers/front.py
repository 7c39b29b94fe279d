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
from simplace.placers.context import OptimizeResult, PlacerContext, PlacerOutput
from simplace.placers.registry import (
    _load_methods,
    check_options,
    is_search,
    method_kind,
    methods,
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
    entry = registered(method)
    options = dict(options or {})
    check_options(method, options)
    ctx = PlacerContext(graph, cost_model, seed=seed, budget_s=budget_s, options=options,
                        progress=progress, t_begin=t_begin)
    return entry.fn(ctx), ctx



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
    methods_ = [m for m in methods_ if m not in done]
    fast = [m for m in methods_ if not is_search(m)]
    # The annealer first (it starts from every placement found), then the policies.
    searches = sorted((m for m in methods_ if is_search(m)),
                      key=lambda m: (method_kind(m) != "annealer", m))
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
        if method_kind(m) == "annealer":
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

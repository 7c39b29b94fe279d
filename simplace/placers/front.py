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
# The order the fast methods run in: cheap ones first, then the list schedulers best
# first (m_etf and m_sct beat heft on all 21 rows of
# bench/results/placers_2026-11-23_list-schedulers_vm-2core-loaded.txt), the pretrained
# policy (it compiles for about 2 s) and ideals (its cost grows as the square of the
# ops) last; methods not named follow by name. Under a short budget the last are the
# ones skipped.
FAST_ORDER = ("single", "expert", "scotch", "metis", "pipeline", "m_topo", "m_etf", "m_sct",
              "rl-pretrained", "heft", "ideals")
# What a fast method costs at the least on M ops and D devices, in seconds:
# ``fixed + per_op_device * M * D + per_op2 * M^2``: the whole method for those that take
# no budget; one run (setup, its first run, the final checks; m_sct's LP) for the list
# schedulers, which stop there when their budget is spent; for ideals, its first window
# (prefixes: about M^2 / 2 pairs per threshold), before which it has nothing of its own.
# Measured on the 2-core VM at load 2-3 with budgets of 0.01 s (mlp, resnet50, rnnlm on
# haswell_k40x4 and haswell_k40x8, 2026-11-27), rounded up; ``compare`` rescales them by
# what the methods without a budget took here (``_Pace``).
_FAST_COST = {  # method: (fixed_s, per_op_device_s, per_op2_s)
    "single": (0.0, 1e-5, 0.0), "expert": (0.0, 5e-6, 0.0), "scotch": (0.0, 1e-5, 0.0),
    "metis": (0.0, 1.5e-5, 0.0), "pipeline": (0.3, 1.5e-5, 0.0),
    "m_topo": (0.0, 1.2e-5, 0.0), "m_etf": (0.0, 1.5e-5, 0.0), "m_sct": (0.2, 3e-5, 0.0),
    "heft": (0.0, 1.6e-5, 0.0), "rl-pretrained": (2.0, 1e-6, 0.0),
    "ideals": (0.0, 0.0, 1.2e-7)}
# A fast method not in the table (a new or a user's one).
_DEFAULT_FAST_COST = (0.0, 2e-5, 0.0)
# Methods whose wall time is their whole cost whatever the budget (no anytime runs, no
# compilation): what they took against their estimate rescales the others' estimates.
_PACE_METHODS = ("single", "expert", "scotch", "metis")
# Only estimates of at least this much say something about the pace (below it, fixed
# overheads such as imports dominate), and the pace stays within these bounds.
_PACE_MIN_S = 0.05
_PACE_BOUNDS = (1 / 3, 3.0)
# Fast methods estimated under this go first (in ``FAST_ORDER``): on a small graph the
# pretrained policy's compilation, which may take several seconds on a loaded machine,
# then comes after every other method.
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

    The fast methods run first, together within 40% of the budget, cheap ones first
    (those estimated under ``_CHEAP_S``, then the others, each group in ``FAST_ORDER``),
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
    num_ops, num_devices = int(graph.num_ops), int(cost_model.num_devices)
    fast = sorted((m for m in methods_ if not is_search(m)), key=lambda m: (
        fast_cost_s(m, num_ops, num_devices) >= _CHEAP_S, fast_rank(m)))
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

    fast_s = fast_until - t0
    pace = _Pace()
    for k, m in enumerate(fast):
        if interrupted(fast[k:] + searches):
            return results
        # Each fast method gets an equal part of the fast share left (what one leaves
        # unused goes to those after it), but at least its estimated cost: the list
        # schedulers and ideals stop at the end of their part, the others run to their
        # end. One whose estimate does not fit the fast share left is skipped: it would
        # overrun it, and the searches after it would pay.
        left_s = fast_until - time.perf_counter()
        need_s = pace.factor * fast_cost_s(m, num_ops, num_devices)
        if need_s > left_s:
            if progress:
                progress(f"{m} skipped: it takes about {need_s:.1f} s on {num_ops:,} ops and "
                         f"{num_devices} devices, and {max(left_s, 0.0):.1f} s of the fast "
                         f"methods' {fast_s:.1f} s share of the {total_s:g} s budget is "
                         "left (give more with --budget-s)")
            continue
        n_before = len(results)
        run(m, max(left_s / (len(fast) - k), need_s))
        if len(results) > n_before:
            pace.add(m, fast_cost_s(m, num_ops, num_devices),
                     getattr(results[-1], "wall_s", None))
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


def fast_cost_s(method: str, num_ops: int, num_devices: int) -> float:
    """The least wall time (seconds) fast method ``method`` is expected to take on a
    graph of ``num_ops`` ops and a machine of ``num_devices`` devices on the 2-core VM
    (``_FAST_COST``): ``compare`` and ``local``'s starts do not start a method whose
    estimate does not fit the time left."""
    fixed, per_op_device, per_op2 = _FAST_COST.get(method, _DEFAULT_FAST_COST)
    m, d = float(num_ops), float(num_devices)
    return fixed + per_op_device * m * d + per_op2 * m * m


def fast_rank(method: str) -> tuple[int, str]:
    """Sort key of the fast methods: ``FAST_ORDER``, then the others by name."""
    return (FAST_ORDER.index(method) if method in FAST_ORDER else len(FAST_ORDER), method)


class _Pace:
    """How much slower than the estimates (``fast_cost_s``) this machine runs now: the
    geometric mean of wall / estimate of the methods of ``_PACE_METHODS`` run so far
    (estimates of at least ``_PACE_MIN_S``), within ``_PACE_BOUNDS``; 1 before any."""

    def __init__(self):
        self.logs: list[float] = []

    def add(self, method: str, estimate_s: float, wall_s: float | None) -> None:
        if method in _PACE_METHODS and estimate_s >= _PACE_MIN_S and wall_s:
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

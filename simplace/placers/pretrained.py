"""``rl-pretrained``: the shipped universal policy places the graph zero-shot, no training;
``rl-universal``: the same policy fine-tuned on the graph within the time budget.

The policy (``simplace.rl.policies.universal``) was trained once over many graphs and
machines (``simplace train-policy``; its card is in the weights file). It places the
graph's ops (groups of them beyond ``simplace.rl.problem.MAX_UNITS`` ops) by its greedy
placement and ``samples`` (default 64) sampled ones, and likewise the graph coarsened to
a few block counts (``simplace.rl.pretrained.COARSE_UNITS``), scored in one batch with
every single device by the batched simulator. Then it improves the best of them by
``refine_rounds`` rounds (default ``REFINE_ROUNDS``; with a time budget, rounds until it
is spent) of policy-guided resampling (``simplace.rl.guided``: the policy's probabilities
propose the moves of a greedy search; no weight changes), fewer once they stop paying,
and returns the best. With a time budget the cheap heuristics run first
(``ZERO_SHOT_HEURISTIC_SHARE`` of it; ``info["heuristic_starts"]``), their placements are
scored in the batch, and the guided search races those that beat the policy's best from
their placements too, with the policy's proposals (on small graphs a list scheduler's
placement is sometimes a far better start than the policy's). Without a time budget the
result is a deterministic function of the seed. It is a fast method (kind heuristic), so
``local`` and ``--method all`` take it as one of their starts: as a start (of ``local``,
of the searches of ``--method all``, or an ``rl-*`` warm start) it gives its batch alone
(``start_options``), and the search refines.

Options: ``samples``; ``refine_rounds`` (0: the batch alone); ``weights``: a weights file
from ``simplace train-policy`` (default: the shipped one). When the shipped weights cannot
be read (a damaged install) the method says so and falls back to ``heft``
(``info["fallback"]``); weights named with ``weights`` that cannot be read are an error.
A machine with more devices than the policy takes (``simplace.rl.problem.MAX_DEVICES``)
is refused with the limit stated.

``rl-universal`` (kind policy) places zero-shot as above (``warm_start`` other than
``"pretrained"``, as ``rl-gnn`` takes it: the best of those placements if it is faster),
then trains the weights on this graph alone by the same REINFORCE
and imitation updates as pretraining (``simplace.rl.pretrain.train_universal``, the
imitation target being the best placement found so far) for ``1 - polish_share`` of the
time left (none when that is under ``MIN_UPDATES_S``; ``info["updates_skipped"]``).
Then the cheap heuristics run (``HEURISTIC_SHARE``), and ``m_etf`` within
``BASIN_SHARE`` of the time left unless it was among them. Of the time left,
``guided_share`` goes to the search the fine-tuned policy guides (``simplace.rl.guided``,
as ``rl-pretrained``'s, with the fine-tuned weights' probabilities), racing the best
placement so far, the heuristics' placements that are faster and ``m_etf``'s whatever
its score (``simplace.rl.guided.RACE_LANES`` in all) as ``local`` races its starts, and the
remainder to ``local``, started from that search's best and the zero-shot placement and
the heuristics' placements that are faster still, except ``END_POLISH_SHARE`` of it at the
end: an op-level descent (``simplace.rl.refine.polish``: segment boundaries shifted by a
few ops, whole runs and single ops across a cut moved), alternating with ``local`` while
it converges early (without a budget: ``updates`` updates, then the same descent, capped,
and deterministic). Why the race: on some graphs a heuristic's placement leads the
search to a faster basin than the policy's, even one that starts slower (``m_etf``'s on
inception_v3). Why the descent: the searches end a few ops
off the segment boundaries they would gain by. Why searches after the updates:
per second, searching from the policy's placement improves it faster than more updates
do, the policy's proposals lead the search on big graphs, and ``local``'s annealing
finishes what they converge to (``bench/pretrained.py`` compares them at equal wall
time). The result is never worse than its start. Options: ``samples``, ``weights``
(``"none"``: fresh weights, training from scratch), ``polish_share`` (default
``POLISH_SHARE``), ``guided_share`` (default ``GUIDED_SHARE``), ``updates`` (how many
without a budget; default ``DEFAULT_UPDATES``). Unlike the other ``rl-*`` methods it keeps
no checkpoint or history: a fine-tune is seconds.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np

from simplace.errors import SimplaceError
from simplace.placers import (
    Cost,
    Option,
    PlacerContext,
    PlacerOutput,
    float_option,
    int_option,
    methods_of_kind,
    path_option,
    register,
)
from simplace.placers.registry import option_values
from simplace.rl.cli_args import MAX_SAMPLES
from simplace.rl.guided import RACE_LANES, race_lanes

FALLBACK = "heft"
DEFAULT_UPDATES = 200
# Rounds of policy-guided resampling rl-pretrained runs by default: with its batch (0.1-0.6 s
# warm) it answers in about 2 s on the held-out graphs of up to 7k ops on the 2-core VM
# (a round scores simplace.rl.guided.BATCH placements; small graphs converge sooner).
REFINE_ROUNDS = 100
_UNCAPPED = 10**9
# The share of a budget left after the zero-shot start that goes to the searches (the
# rest to fine-tuning updates). 0.9 against 0.7: the training rows' geometric mean 0.7052
# against 0.7071 (the latter a session earlier), the held-out rows no slower than local-60
# 10, 12, 10 of 13 on seeds 0-2 against 9, 11, 10 and their geometric mean 0.9721
# against 0.9759; on inception_v3 the guided search pays more than the updates
# (bench/results/pretrained_2026-11-29i_vm_polish-share.txt).
POLISH_SHARE = 0.9
# Under a budget, the updates are skipped when their share is shorter than this (and
# the searches take it): the first update compiles (1.35 s on nmt_4layer in a fresh
# process, past a 2 s budget) and a few more do not move the weights; the searches
# from the shipped policy's placement pay from their first round. At 20 s on the
# held-out rows the share is about 1.9 s, so nothing changes there.
MIN_UPDATES_S = 1.0
# The share of that which the search guided by the fine-tuned policy takes first
# (``simplace.rl.guided``), from the best placement so far; local takes the rest.
GUIDED_SHARE = 0.8
# The guided race's last lane ends once it has converged this many times in a row without
# a new best (``simplace.rl.guided.race``'s ``last_restarts``; None: it restarts until its
# share is spent), and local gets the rest. Where its restarts do not pay, local's
# annealing does better with the time: on transformer on 8 K40s the last lane converged
# and restarted four times in 3.9 s for 1.6%, and local then took 2% off in 1.9 s; with 0
# the fine-tune's median over seeds 0-5 there went from 1.005-1.012 of local-60 to
# 0.998-1.000 (two blocks each). On inception_v3 the last lane does not converge, so
# nothing changes there. Training rows' geometric mean 0.7071 against 0.7076; held-out
# 0.9719 against 0.9746 (bench/results/pretrained_2026-11-29f_vm_last-lane.txt).
GUIDED_LAST_RESTARTS = 0
# The share of the time left after the cheap heuristics that the op-level descent
# (simplace.rl.refine.polish: segment boundaries shifted by a few ops, whole runs and
# single ops across a cut moved) takes at the end, after local. The searches' results
# end a few ops off a segment boundary: with the descent transformer on 8 K40s went from
# 1.012-1.019 of local-60's step time to 0.998-1.002, inception_v3 on 4 H100s from
# 1.009-1.068 to 0.989-1.000, and the training rows did not lose
# (bench/results/pretrained_2026-11-28j_vm_end-polish.txt).
END_POLISH_SHARE = 0.1
# A descent that converges with more than LOOP_FACTOR times its own time left (and
# MIN_LOCAL_S besides) hands the rest to local again, then descends from its result:
# the share above is a guess at the descent's time, and an early end would waste the rest.
LOOP_FACTOR = 2.0
MIN_LOCAL_S = 0.5
# local is not begun with less time left than its setup and first batch take, about this
# per op: begun with none left on nmt_4layer (22k ops) it took 0.26 s past the budget,
# the first call of a process at 2 s, where the guided search's first round had compiled.
LOCAL_FIRST_S_PER_OP = 12e-6



# As the start of another search (local's starts, compare's fast methods, the rl-* warm
# starts) it gives its batch alone: the search refines, in the time the resampling would
# have taken, and one that is deterministic for a seed stays so.
@register("rl-pretrained", cost=Cost(0.1, 2e-6, first_call_s=2.0,
                                      kernels=("simulator", "policy")), rank=2, learned=True,
          start_options={"refine_rounds": 0}, options={
    "samples": int_option("sampled placements scored besides the greedy one (default 64)",
                          64, 0, MAX_SAMPLES),
    "refine_rounds": int_option(f"rounds of policy-guided resampling of the best placement "
                                f"without a time budget (default {REFINE_ROUNDS}; with one, "
                                f"until it is spent; 0: the batch alone)",
                                REFINE_ROUNDS, 0),
    "weights": path_option("policy weights file (simplace train-policy; default: the "
                           "shipped ones)")})
def place(ctx: PlacerContext) -> PlacerOutput:
    """``rl-pretrained``: the pretrained universal policy, zero-shot (no training)."""
    from simplace.rl.pretrained import zero_shot

    opts = option_values("rl-pretrained", ctx.options)
    samples, weights = opts["samples"], opts["weights"]
    m, d = ctx.graph.num_ops, ctx.inputs.num_devices
    if m == 0 or d == 1:
        return PlacerOutput(np.zeros(m, np.int32), info={"note": "nothing to place"})
    rounds, until = opts["refine_rounds"], None
    if ctx.budget_s is not None:
        until = ctx.t_begin + float(ctx.budget_s)
        if rounds:  # with a budget, rounds until it is spent (or they stop paying)
            rounds = _UNCAPPED
    found = {}
    # with a budget, the cheap heuristics' placements race the policy's in its search
    # (not single: the batch has every single device)
    rivals = ([(n, p) for _, n, p in _cheap_heuristics(ctx, found, ZERO_SHOT_HEURISTIC_SHARE,
                                                       single=False)]
              if until is not None and rounds and ZERO_SHOT_HEURISTIC_SHARE > 0 else [])
    try:
        placement, info = zero_shot(ctx.graph, ctx.inputs, samples=samples, seed=ctx.seed,
                                    weights=weights, simulator=ctx.batched,
                                    screen=ctx.screen if rounds else None,
                                    refine_until=until,
                                    refine_rounds=rounds, rivals=rivals)
    except SimplaceError as err:
        if weights is not None or "weights" not in str(err):
            raise
        from simplace.placers import run_method

        ctx.progress(f"rl-pretrained: {err} Placing with {FALLBACK} instead.")
        out, _ = run_method(ctx.graph, ctx.cost_model, FALLBACK, seed=ctx.seed)
        return PlacerOutput(out.placement, info={"fallback": FALLBACK, "why": str(err)})
    return PlacerOutput(placement, info={**info, **found})


@register("rl-universal", kind="policy", options={
    "samples": int_option("placements per update (default 64)", 64, 2, MAX_SAMPLES),
    "weights": path_option("weights to start from: a weights file, or 'none' (default: "
                           "the shipped)"),
    "warm_start": Option("'pretrained' (the default), or as rl-gnn's: method names, 'best' "
                         "or placements, the best of which (or the zero-shot one) it starts "
                         "from", "pretrained"),
    "polish_share": float_option(f"share of the time left for local search from the "
                                 f"fine-tuned placement (default {POLISH_SHARE})",
                                 POLISH_SHARE, 0.0, 1.0, hi_open=True),
    "updates": int_option(f"training updates without a budget (default {DEFAULT_UPDATES})",
                          DEFAULT_UPDATES, 1),
    "guided_share": float_option(f"share of the time after the updates for the search "
                                 f"the fine-tuned policy guides, before local (default "
                                 f"{GUIDED_SHARE})", GUIDED_SHARE, 0.0, 1.0)})
def place_universal(ctx: PlacerContext) -> PlacerOutput:
    """``rl-universal``: the pretrained universal policy fine-tuned on this graph."""
    from simplace.rl.pretrain import PretrainConfig, make_training_problem, train_universal
    from simplace.rl.pretrained import SHIPPED, cached_weights
    from simplace.rl.refine import polish

    opts = option_values("rl-universal", ctx.options)
    samples, share, weights = opts["samples"], opts["polish_share"], opts["weights"]
    m, d = ctx.graph.num_ops, ctx.inputs.num_devices
    if m == 0 or d == 1:
        return PlacerOutput(np.zeros(m, np.int32), info={"note": "nothing to place"})
    # The zero-shot start without the resampling: the search that follows refines.
    start = place(ctx.with_options({"refine_rounds": 0} if weights in (None, "none")
                                   else {"weights": weights, "refine_rounds": 0}))
    best = np.asarray(start.placement, np.int32)
    best_s = float(ctx.score(best[None])[0])
    info = {"zero_shot_s": best_s, "zero_shot": start.info}
    ws = opts["warm_start"]
    if not (isinstance(ws, str) and (ws == "pretrained" or ws in methods_of_kind(
            "heuristic", learned=True))):
        from simplace.placers.rl import _warm_starts

        found, scores, missed = _warm_starts(ctx)  # placements or methods' (rl-* rules)
        info["warm_starts"] = {n: float(v) for (n, _), v in zip(found, scores, strict=True)}
        if missed:
            info["warm_starts_missed"] = missed
        if found and min(scores) < best_s:
            j = int(np.argmin(scores))
            best, best_s = np.asarray(found[j][1], np.int32), float(scores[j])
    params = None
    if weights != "none" and start.info.get("fallback") is None:
        params = cached_weights(os.fspath(SHIPPED if weights is None else weights))[0]
    deadline = (math.inf if ctx.budget_s is None
                else ctx.t_begin + float(ctx.budget_s))
    left = deadline - time.perf_counter()
    budget = None if not math.isfinite(left) else max(left * (1 - share), 0.0)
    updates = None if budget is not None else opts["updates"]
    trained, tuned_s = {"updates": 0}, best_s
    if budget is not None and budget < MIN_UPDATES_S:
        info["updates_skipped"] = f"{budget:.2f} s for the updates, under {MIN_UPDATES_S} s"
    else:
        # Scored by the context's simulator: the problem's objective (latency, throughput
        # or a ruler), its imitation target the best placement so far.
        tp = make_training_problem("graph", ctx.graph, ctx.inputs, target=best,
                                   simulator=ctx.batched)
        params, trained = train_universal([tp], updates=updates, budget_s=budget,
                                          seed=ctx.seed, params=params,
                                          config=PretrainConfig(samples=samples),
                                          progress=ctx.progress, progress_every_s=5.0)
        tuned = tp.problem.expand(tp.best_units)
        tuned_s = float(ctx.score(tuned[None])[0])
        if tuned_s < best_s:
            best, best_s = tuned, tuned_s
    info.update(updates=trained["updates"], fine_tuned_s=tuned_s)
    edges = (np.asarray(ctx.graph.src), np.asarray(ctx.graph.dst))
    # the descents rank their batches without the memory check, and check only what beats
    # the placement so far (refine.screened_scores)
    screen = lambda b: ctx.screen(b).step_time_s  # noqa: E731
    if math.isfinite(deadline):
        heuristics = _cheap_heuristics(ctx, info)
        guided = params is not None and opts["guided_share"] > 0
        basin = _basin_start(ctx, info, heuristics) if guided else None
        now = time.perf_counter()
        # the end's op-level descent gets its share of what is left; the searches the rest
        polish_at = deadline - END_POLISH_SHARE * max(deadline - now, 0.0)
        if guided:
            lanes = race_lanes(("fine-tuned", best, best_s),
                               [(n, p, s) for s, n, p in heuristics])
            lanes = _with_basin(lanes, basin)
            best, best_s = _guided(ctx, params, lanes,
                                   now + opts["guided_share"] * (polish_at - now), info)
        starts = _local_starts(best, best_s, start.placement, heuristics)
        best, best_s = _anneal_and_descend(ctx, best, best_s, starts, info, polish_at,
                                           deadline, samples, edges, screen)
    else:
        best, best_s, batches = polish(ctx.score, best, best_s, d, samples, 200,
                                       edges=edges, screen=screen)
        info.update(polish_batches=batches)
    info.update(score=best_s, stop="time budget" if math.isfinite(deadline) else "updates")
    return PlacerOutput(best, info=info)


def _guided(ctx: PlacerContext, params, starts: list, until: float, info: dict):
    """The guided search (``simplace.rl.guided.race``) with the fine-tuned policy's
    proposals until ``until``, racing ``starts`` (``(label, placement, score)``, the first
    the best so far; those that do not fit are left out). Returns (placement, score),
    never worse than the first start's; ``info["guided"]`` says how it went."""
    from simplace.rl.guided import race
    from simplace.rl.pretrained import policy_levels

    best, best_s = starts[0][1], starts[0][2]
    oom = np.asarray(ctx.batched(np.stack([np.asarray(p) for _, p, _ in starts])).oom)
    fit = [start for start, o in zip(starts, oom, strict=True) if not o]
    if not fit:  # an OOM start: local's penalty leads it to one that fits
        return best, best_s
    screen = ctx.screen

    def scores(batch):
        res = ctx.batched(batch)
        return np.where(np.asarray(res.oom), np.inf, np.asarray(res.step_time_s, np.float64))

    out, out_s, info["guided"] = race(policy_levels(ctx.graph, ctx.inputs, params), fit,
                                      scores, src=ctx.graph.src, dst=ctx.graph.dst,
                                      until=until, seed=ctx.seed,
                                      screen=lambda b: screen(b).step_time_s,
                                      last_restarts=GUIDED_LAST_RESTARTS)
    return (out, out_s) if out_s < best_s else (best, best_s)


def _local_starts(best, best_s: float, zero_shot, heuristics: list) -> list:
    """``local``'s starts after the guided search: its best, the zero-shot placement and
    the ``heuristics``' (``_cheap_heuristics``) that beat them."""
    starts = [best] if np.array_equal(best, zero_shot) else [best, zero_shot]
    return [np.asarray(p) for p in starts] + [p for s, _, p in heuristics if s < best_s]


def _anneal_and_descend(ctx: PlacerContext, best, best_s: float, starts: list, info: dict,
                        polish_at: float, deadline: float, batch: int, edges, screen):
    """``local`` from ``starts`` until ``polish_at``, then the op-level descent
    (``simplace.rl.refine.polish``) until ``deadline`` (``time.perf_counter()`` seconds).
    A descent that converges early leaves time: while what is left is more than
    ``LOOP_FACTOR`` times what the descent took and ``MIN_LOCAL_S`` for ``local``, ``local``
    anneals again from the result for the time left less the descent's, and the descent
    follows; ``local`` is not begun with less than ``LOCAL_FIRST_S_PER_OP`` per op
    left. Returns (placement, score), never worse than ``best``; ``info["local"]`` is
    the first ``local``'s (or why it was skipped), ``info["finish"]`` every cycle's
    scores (after ``local``, after the descent), batches and descent seconds.
    ``screen``: ``polish``'s."""
    from simplace.rl.refine import polish

    cycles, until = [], polish_at
    first_s = LOCAL_FIRST_S_PER_OP * ctx.graph.num_ops
    while True:
        if until - time.perf_counter() >= first_s:
            best, best_s, account = _local(ctx, best, best_s, starts, until)
        else:
            account = f"skipped: under {first_s:.2f} s left for it"
        if not cycles:
            info["local"] = account
        t, annealed = time.perf_counter(), best_s
        best, best_s, batches = polish(ctx.score, best, best_s, ctx.inputs.num_devices,
                                       batch, _UNCAPPED, deadline=deadline, edges=edges,
                                       screen=screen)
        took = time.perf_counter() - t
        cycles.append({"annealed": annealed, "descended": best_s, "batches": batches,
                       "descent_s": round(took, 3)})
        left = deadline - time.perf_counter()
        if left < LOOP_FACTOR * took + MIN_LOCAL_S:
            break
        starts, until = [best], deadline - took
    info["finish"] = cycles
    info["polish_batches"] = sum(c["batches"] for c in cycles)
    return best, best_s


def _local(ctx: PlacerContext, best, best_s: float, starts: list, until: float):
    """``local`` from ``starts`` until ``until`` (``time.perf_counter()`` seconds):
    (placement, score, account), the placement never worse than ``best``; the account is
    local's score, restarts and rounds, or why it failed."""
    from simplace.placers import run_method

    try:
        out, _ = run_method(ctx.graph, ctx.cost_model, "local", seed=ctx.seed,
                            budget_s=max(until - ctx.t_begin, 0.0), t_begin=ctx.t_begin,
                            options={"starts": starts})
    except SimplaceError as err:  # the placement so far stands
        return best, best_s, f"failed: {err}"
    s = float(ctx.score(np.asarray(out.placement)[None])[0])
    account = {"score": s, **{k: out.info[k] for k in ("restarts", "rounds")
                              if k in out.info}}
    if s < best_s:
        return np.asarray(out.placement, np.int32), s, account
    return best, best_s, account


# After the updates, heuristics that cost little next to the time left (together at most
# this share of it, cheapest ranks first) are run, and those faster than the fine-tuned
# placement join the guided search's race and local's. On small graphs they cost nothing
# and are sometimes far better starts than the policy's (the imported graphs: on Doppler's
# 8-GPU graph the guided search from m_sct's placement ends 10% faster than from the
# policy's); on big graphs the policy's is better, and the heuristics' seconds are the
# search's (a share of 0.125 took a fifth of the guided search's rounds on inception_v3;
# bench/results/pretrained_2026-11-28h_vm_guided-race.txt).
HEURISTIC_SHARE = 0.05
# rl-pretrained with a budget runs the cheap heuristics first, within this share of it,
# and its guided search races the fastest of their placements that beat the policy's. On
# Doppler's 8-GPU graph (held out) the search from the policy's placement ends at
# 1.15-1.22x of local-60 in 1.8 s, from m_etf's at 1.00x; on big graphs none fits this
# share. Chosen on the training rows: 0.1 took their geometric mean from 0.7548 to 0.7499,
# 0.2 to 0.7507 (bench/results/pretrained_2026-11-28l_vm_zero-shot-race.txt).
ZERO_SHOT_HEURISTIC_SHARE = 0.1


def _cheap_heuristics(ctx: PlacerContext, info: dict, share: float = HEURISTIC_SHARE,
                      single: bool = True) -> list:
    """``(score, name, placement)`` of the cheap fast heuristics (not learned; run as
    ``local`` runs its starts, within ``share`` of the time left; ``single`` always,
    unless ``single`` is False), best first; ``info["heuristic_starts"]`` has their
    scores."""
    from simplace.placers.registry import fast_rank

    if ctx.budget_s is None:
        return []
    names = sorted((n for n in methods_of_kind("heuristic", learned=False)
                    if single or n != "single"), key=fast_rank)
    out = _scored_starts(ctx, names, share, single)
    if out:
        info["heuristic_starts"] = {n: s for s, n, _ in out}
    return out


def _scored_starts(ctx: PlacerContext, names: list, share: float, single: bool) -> list:
    """``(score, name, placement)`` of the methods ``names``, run as ``local`` runs its
    starts (``single`` added unless ``single`` is False) within ``share`` of the time
    left of the budget, best first."""
    from simplace.placers.local import run_starts

    now = time.perf_counter()
    allowance = share * (ctx.t_begin + float(ctx.budget_s) - now)
    found, _ = run_starts(ctx.with_options({"starts": names}), now + allowance, allowance,
                          add_single=single)
    if not found:
        return []
    scores = ctx.score(np.stack([p for _, p in found]))
    return sorted(((float(s), n, np.asarray(p, np.int32)) for (n, p), s in
                   zip(found, scores, strict=True)), key=lambda x: x[0])


# After the cheap heuristics, the list scheduler BASIN_METHOD runs within this share of
# the time left (its runs stop at that budget, the most promising first), and its
# placement races in the guided search whatever its score: it starts slower than the
# fine-tuned policy's on the zoo's big graphs, but the search from it ends in a better
# basin on inception_v3 (from m_etf's full placement, 0.99-1.01x of local-60 in 5.7 s
# against 1.00-1.12x from the policy's: bench/results/pretrained_2026-11-29a_vm_guided-starts.txt).
# A share of 0.1 (1.3 s) stopped m_etf before its best family on 4 H100s; 0.16 (2.1 s)
# reached it (bench/results/pretrained_2026-11-29e_vm_basin-race.txt). 0: off.
BASIN_SHARE = 0.16
BASIN_METHOD = "m_etf"


def _basin_start(ctx: PlacerContext, info: dict, heuristics: list):
    """``BASIN_METHOD``'s placement as ``(label, placement, score)``: from ``heuristics``
    (``_cheap_heuristics``) when it ran there, else run within ``BASIN_SHARE`` of the
    time left; None when it is off or gave nothing. ``info["basin_start"]``: its score
    and the seconds it took."""
    if BASIN_SHARE <= 0 or ctx.budget_s is None:
        return None
    for s, name, p in heuristics:
        if name == BASIN_METHOD:
            return (name, p, s)
    now = time.perf_counter()
    found = _scored_starts(ctx, [BASIN_METHOD], BASIN_SHARE, single=False)
    if not found:
        return None
    s, name, p = found[0]
    info["basin_start"] = {"method": name, "score": s, "wall_s": time.perf_counter() - now}
    return (name, p, s)


def _with_basin(lanes: list, basin) -> list:
    """The guided race's ``lanes`` (``race_lanes``') with ``basin`` (``_basin_start``'s)
    as the last of ``RACE_LANES``, whatever its score, unless it is None or a lane
    places alike."""
    if basin is None or any(np.array_equal(basin[1], p) for _, p, _ in lanes):
        return lanes
    return lanes[:RACE_LANES - 1] + [basin]

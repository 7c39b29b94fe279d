"""Memory repair: a placement that does not fit device memory, made to fit by moving
whole groups of ops (chains, modules) off the overfull devices.

The list schedulers' memory models, the partitioners (which know no memory) and the
stage splitters (``pipeline``, ``ideals``) can end with a placement the simulator finds
out of memory; a user cannot run it. ``repair_answer`` repairs such an answer within the
budget and says so in ``info``; ``repair_memory`` is the moves themselves.
"""

from __future__ import annotations

import math
import time

import numpy as np

from simplace import groups as G
from simplace.placers import PlacerContext, penalised
from simplace.placers.context import BATCHED_LOAD_S, REFERENCE_S_PER_OP, batched_pays

# Rounds of group moves that ``repair_memory`` tries before giving up.
_MAX_REPAIR_ROUNDS = 30
# A round costs about this per op where it simulates by the batched simulator: its
# simulation 1.2 ms for nmt_2layer's 13k ops and 0.7 ms for inception_v3's 7k on the
# 2-core VM, twice that for the round's own numpy work and a loaded machine; the
# reference simulator takes ``REFERENCE_S_PER_OP``.
BATCHED_S_PER_OP = 2e-7
# Where its rounds are that cheap, a repair may run past the budget by at most this
# share of it: a list scheduler's runs spend the whole budget, and then at 3 s none of
# them had time to repair its answer on the VM's big graphs (answers out of memory that
# 2 rounds, 3 ms, would have made fit). A runnable answer is worth milliseconds late.
REPAIR_GRACE_SHARE = 0.05
# Rounds a repair is expected to take when it decides how to simulate them (the VM's big
# graphs took 2-7): the batched simulator is loaded for them where that costs less than
# this many rounds of reference simulations (``batched_pays``).
EXPECTED_ROUNDS = 4


def _batched_rounds(ctx: PlacerContext) -> bool:
    """Whether a repair's rounds simulate by the batched simulator (``batched_pays`` for
    its first placement and ``EXPECTED_ROUNDS`` rounds of one per target device)."""
    d = ctx.cost_model.num_devices
    return batched_pays(ctx.graph.num_ops, 1 + EXPECTED_ROUNDS * max(d - 1, 1))


def _peaks(ctx: PlacerContext, placements: np.ndarray, batched: bool):
    """(step times, OOM flags, peak bytes [K, D]) of placements int32[K, M]: by the
    batched simulator when ``batched`` (``_batched_rounds``: 1 ms a placement against the
    reference's 0.3 s for nmt_2layer's 13k ops, so a repair fits a budget that its
    reference rounds overran), else by the reference one. The numbers are the same; the
    batched one reports peaks only for placements out of memory (``memory="oom"``),
    which are the only ones a round reads them of."""
    placements = np.atleast_2d(placements)
    if batched:
        res = ctx.batched(placements)
        steps, ooms = np.asarray(res.step_time_s, np.float64), np.asarray(res.oom, bool)
        peaks = np.asarray(res.peak_memory_bytes, np.float64)
        if np.isfinite(peaks[ooms]).all():
            return steps, ooms, peaks
    out = [ctx.simulate(p) for p in placements]
    return (np.array([float(r.step_time_s) for r in out]), np.array([bool(r.oom) for r in out]),
            np.array([np.asarray(r.peak_memory_bytes, np.float64) for r in out]))


def repair_s(ctx: PlacerContext, rounds: int) -> float:
    """About how long ``rounds`` rounds of a repair take (one placement per target
    device each, as ``_batched_rounds`` decides to simulate them, loading included):
    what a method that must leave time for a repair sets aside."""
    from simplace.kernels import loaded

    m, d = ctx.graph.num_ops, ctx.cost_model.num_devices
    sims = rounds * max(d - 1, 1)
    if not _batched_rounds(ctx):
        return sims * m * REFERENCE_S_PER_OP
    return (0.0 if loaded("simulator") else BATCHED_LOAD_S) + sims * m * BATCHED_S_PER_OP


def repair_deadline(ctx: PlacerContext) -> float:
    """When a repair begun now begins no more rounds: the budget's deadline (or now, when
    the answer itself took past it), plus what a whole repair costs (chains, then ops)
    when its rounds run on the batched simulator, up to ``REPAIR_GRACE_SHARE`` of the
    budget; the budget's deadline when they would run on the reference simulator, or when
    loading the batched one (``BATCHED_LOAD_S``, not yet loaded) alone takes more."""
    from simplace.kernels import loaded

    deadline, m = ctx.deadline, ctx.graph.num_ops
    if not math.isfinite(deadline) or not _batched_rounds(ctx):
        return deadline
    cap = REPAIR_GRACE_SHARE * float(ctx.budget_s)
    load = 0.0 if loaded("simulator") else BATCHED_LOAD_S
    if load > cap:
        return deadline
    whole = load + 2 * (_MAX_REPAIR_ROUNDS + 1) * m * BATCHED_S_PER_OP  # chains, then ops
    return max(deadline, time.perf_counter()) + min(whole, cap)


def repair_memory(ctx: PlacerContext, placement, groups,
                  deadline: float = math.inf) -> tuple[np.ndarray, dict]:
    """Move whole groups off devices whose peak memory is over capacity.

    Each round takes the most overfull device and the groups on it (largest resident
    bytes first, parameters plus outputs) whose bytes cover the excess, and tries them on
    each device with free memory (never more than its headroom nor all of the source's
    groups), in one batch; it keeps the fastest of the moves that fit, else the one
    that leaves the least memory over capacity. No round begins after ``deadline``
    (``time.perf_counter()``). Returns the placement (the original one when no round
    helped) and a dict for ``info`` (``repair_rounds``, ``oom``) with the placement's
    penalised step time (``score``).
    """
    g = ctx.graph
    groups = np.asarray(groups)
    p = np.asarray(placement, dtype=np.int32).copy()
    batched = _batched_rounds(ctx)
    steps, ooms, peaks = _peaks(ctx, p, batched)
    if not ooms[0]:
        return p, {"oom": False, "score": float(steps[0])}
    peak = peaks[0]
    mem = ctx.cost_model.memory_bytes
    n_groups = int(groups.max()) + 1 if groups.size else 0
    resident = np.bincount(groups, weights=g.param_bytes + g.out_bytes, minlength=n_groups)
    best_p, best_excess = p.copy(), float(np.sum(np.maximum(peak - mem, 0)))
    best_s = float(penalised(steps[0], True))
    rounds = 0
    for rounds in range(1, _MAX_REPAIR_ROUNDS + 1):
        if time.perf_counter() > deadline:
            rounds -= 1
            break
        excess = peak - mem
        src = int(np.argmax(excess))
        headroom = mem - peak
        headroom[src] = -np.inf
        targets = np.flatnonzero(headroom > 0)
        on_src = np.unique(groups[p == src])
        if not targets.size or on_src.size <= 1:
            break
        order = on_src[np.argsort(-resident[on_src], kind="stable")]
        # Move enough to cover the excess, but never more than the target's headroom nor
        # all of the source's groups.
        cum = np.cumsum(resident[order])
        cover = int(np.searchsorted(cum, excess[src])) + 1
        cands = np.repeat(p[None], targets.size, axis=0)
        for row, dst in zip(cands, targets, strict=True):
            k = max(1, min(cover, on_src.size - 1, int(np.searchsorted(cum, headroom[dst])) or 1))
            row[np.isin(groups, order[:k])] = dst
        # Every target, not only the one with the most free memory: that one alone gave
        # repaired answers up to 6% slower (resnet50's split on the VM's CPUs).
        steps, ooms, peaks = _peaks(ctx, cands, batched)
        if not ooms.all():
            j = int(np.argmin(np.where(ooms, np.inf, steps)))
            return cands[j], {"oom": False, "repair_rounds": rounds, "score": float(steps[j])}
        over = np.maximum(peaks - mem, 0).sum(axis=1)
        j = int(np.lexsort((steps, over))[0])  # least over capacity, then fastest
        p, peak = cands[j], peaks[j]
        if over[j] < best_excess:
            best_p, best_excess = p.copy(), float(over[j])
            best_s = float(penalised(steps[j], True))
    return best_p, {"oom": True, "repair_rounds": rounds, "score": best_s}


def repair_answer(ctx: PlacerContext, placement, step_s: float, info: dict,
                  what: str = "schedule") -> tuple[np.ndarray, float, bool]:
    """(placement, step time, OOM) of a method's answer ``placement`` (out of memory,
    ``step_s`` its step time) after ``repair_memory`` with the graph's chains as groups,
    then single ops if that does not make it fit, no round begun past ``repair_deadline``;
    ``info`` gets ``repair_rounds`` and ``note_memory`` (and ``unrepaired_step_time_s``
    when it fits). ``what`` names the answer in the note."""
    chains = G.chain_collapse(ctx.graph, G.colocate_free_ops(ctx.graph))
    deadline = repair_deadline(ctx)
    rounds = 0
    # Chains first (whole chains keep their tensors together); where they are too coarse
    # (a chain holding most of the overfull device), single ops (unless chains are ops).
    m = ctx.graph.num_ops
    finer = [np.arange(m)] if m and int(chains.max()) + 1 < m else []
    for groups in [chains, *finer]:
        fixed, rep = repair_memory(ctx, placement, groups, deadline=deadline)
        rounds += rep.get("repair_rounds", 0)
        if not rep["oom"] or time.perf_counter() > deadline:
            break
    info["repair_rounds"] = rounds
    if rep["oom"]:
        info["note_memory"] = (
            f"the best {what} does not fit device memory, and moving chains and ops off "
            "the overfull devices did not make it fit" if info["repair_rounds"] else
            f"the best {what} does not fit device memory, and the time budget left no "
            "time to move chains off the overfull devices (a larger budget lets it)")
        return np.asarray(placement, np.int32), step_s, True
    info["note_memory"] = (f"the best {what} did not fit device memory: chains (or ops) "
                           "were moved off the overfull devices until it did")
    info["unrepaired_step_time_s"] = step_s
    return fixed, float(rep["score"]), False

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

# Rounds of group moves that ``repair_memory`` tries before giving up.
_MAX_REPAIR_ROUNDS = 30


def repair_memory(ctx: PlacerContext, placement, groups,
                  deadline: float = math.inf) -> tuple[np.ndarray, dict]:
    """Move whole groups off devices whose peak memory is over capacity.

    Each round takes the most overfull device, moves its groups (largest resident bytes
    first, parameters plus outputs) until their bytes cover the excess, onto the device
    with the most free memory, and re-simulates; no round begins after ``deadline``
    (``time.perf_counter()``). Returns the placement (the original one
    when no round helped) and a dict for ``info`` (``repair_rounds``, ``oom``) with the
    placement's penalised step time (``score``).
    """
    g = ctx.graph
    groups = np.asarray(groups)
    p = np.asarray(placement, dtype=np.int32).copy()
    res = ctx.simulate(p)
    if not res.oom:
        return p, {"oom": False, "score": float(res.step_time_s)}
    mem = ctx.cost_model.memory_bytes
    n_groups = int(groups.max()) + 1 if groups.size else 0
    resident = np.bincount(groups, weights=g.param_bytes + g.out_bytes, minlength=n_groups)
    best_p, best_excess = p.copy(), float(np.sum(np.maximum(res.peak_memory_bytes - mem, 0)))
    best_s = float(penalised(res.step_time_s, res.oom))
    rounds = 0
    for rounds in range(1, _MAX_REPAIR_ROUNDS + 1):
        if time.perf_counter() > deadline:
            rounds -= 1
            break
        excess = res.peak_memory_bytes - mem
        src = int(np.argmax(excess))
        headroom = mem - res.peak_memory_bytes
        headroom[src] = -np.inf
        dst = int(np.argmax(headroom))
        if headroom[dst] <= 0:
            break
        on_src = np.unique(groups[p == src])
        if on_src.size <= 1:
            break
        order = on_src[np.argsort(-resident[on_src], kind="stable")]
        # Move enough to cover the excess, but never more than the target's headroom nor
        # all of the source's groups.
        cum = np.cumsum(resident[order])
        k = int(np.searchsorted(cum, excess[src])) + 1
        k = max(1, min(k, on_src.size - 1, int(np.searchsorted(cum, headroom[dst])) or 1))
        p[np.isin(groups, order[:k])] = dst
        res = ctx.simulate(p)
        total_excess = float(np.sum(np.maximum(res.peak_memory_bytes - mem, 0)))
        if total_excess < best_excess:
            best_p, best_excess = p.copy(), total_excess
            best_s = float(penalised(res.step_time_s, res.oom))
        if not res.oom:
            return p, {"oom": False, "repair_rounds": rounds, "score": float(res.step_time_s)}
    return best_p, {"oom": True, "repair_rounds": rounds, "score": best_s}


def repair_answer(ctx: PlacerContext, placement, step_s: float, info: dict,
                  what: str = "schedule") -> tuple[np.ndarray, float, bool]:
    """(placement, step time, OOM) of a method's answer ``placement`` (out of memory,
    ``step_s`` its step time) after ``repair_memory`` with the graph's chains as groups,
    then single ops if that does not make it fit, no round begun past the budget;
    ``info`` gets ``repair_rounds`` and ``note_memory`` (and ``unrepaired_step_time_s``
    when it fits). ``what`` names the answer in the note."""
    deadline = ctx.deadline
    chains = G.chain_collapse(ctx.graph, G.colocate_free_ops(ctx.graph))
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

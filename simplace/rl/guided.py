"""Policy-guided resampling: the pretrained policy's probabilities as the proposals of a
short greedy search around the best placement found so far (what ``rl-pretrained`` does
after its one batch, its option ``refine_rounds``). No weight changes: the policy stays
zero-shot.

Each round scores ``batch`` neighbours of the incumbent in one call of the batched
simulator and keeps the fastest if it beats the incumbent (under a deadline, also by
simulated annealing's rule if it does not: ``TEMPERATURE``). A neighbour is, with even
odds:

* **policy moves**: 1 to 5 units of one level each go to a device drawn from the
  policy's probabilities for that unit, its current device left out. The levels: the
  policy's op-level units (half of these moves), the coarse groups ``zero_shot``
  placed, and (``group_levels``) the graph's module subtrees at depths 1 to 4 and its
  chains cut into ``RANGE_COUNTS`` ranges, whose probabilities are the mean of their
  ops';
* **cut moves**: 1 to 3 ops at a cut (an edge whose ends sit on two devices) each go to
  the device across the cut.

Why: the policy's per-unit probabilities are good proposals, but its batch of
independent samples rarely gets units that depend on each other right together; a
hundred greedy rounds mend much of that on graphs of a few hundred to a few thousand
ops. Group moves are what a big graph needs from a short search. The search stops after
its rounds, after ``PATIENCE`` rounds in a row without a gain (under a deadline: it
restarts a few random moves away from the best instead), or before a round that would
end past its deadline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from simplace.groups import members

# Neighbours scored per round (one call of the batched simulator).
BATCH = 128
# Rounds in a row without a gain after which the search has converged.
PATIENCE = 60
# A neighbour's number of policy moves and of cut moves, drawn uniformly from these.
_POLICY_MOVES = (1, 1, 2, 3, 5)
_CUT_MOVES = (1, 1, 2, 3)
# The share of policy moves that take the first level (the policy's own op-level units);
# the rest take any level.
FIRST_SHARE = 0.5
# The graph's chains (``simplace.groups.chain_collapse``) cut into these many ranges are
# levels of the search, as are its module subtrees at these depths. On inception_v3 (6,941
# ops) on the held-out GPU machines they took 1.5 s of search from 1.11-1.35x of local-60
# to 1.08-1.24x (bench/results/pretrained_2026-11-28_vm_guided-moves.txt, which also holds
# the variants that lost).
RANGE_COUNTS = (16, 64, 256)
MODULE_DEPTHS = (1, 2, 3, 4)
# A restart (under a deadline, once the search has converged) starts this many neighbour
# steps away from the best.
_KICK_STEPS = 4
# Under a deadline, a round whose best neighbour is no better is still taken with the
# probability of simulated annealing at this temperature (a share of the step time,
# falling from the first value to the second): it crosses plateaus of equal step time.
# On msr's inception layer graph it took 1.05-1.11x of local-60 to 1.02-1.06x over 3
# seeds, the other held-out rows within their spread
# (bench/results/pretrained_2026-11-28_vm_annealing.txt).
TEMPERATURE = (0.003, 0.0003)


@dataclass(frozen=True)
class Level:
    """One granularity the policy placed: ``probs`` float64[U, D], the policy's device
    probabilities per unit; ``unit_of_op`` int[M], each op's unit."""

    probs: np.ndarray
    unit_of_op: np.ndarray


def group_levels(graph, op_probs: np.ndarray) -> list[Level]:
    """Levels of whole groups of ops (module subtrees, ranges of chains; each distinct
    grouping of 2 to M-1 groups once), a group's probabilities the mean of its ops'
    ``op_probs`` (float[M, D])."""
    from simplace.groups import (
        by_module,
        chain_collapse,
        colocate_free_ops,
        distinct_groupings,
        normalize,
        target_count,
    )

    m = graph.num_ops
    chains = chain_collapse(graph, colocate_free_ops(graph))
    named = [(f"module{depth}", normalize(by_module(graph, depth))) for depth in MODULE_DEPTHS]
    named += [(f"ranges{k}", normalize(target_count(graph, k, chains)))
              for k in RANGE_COUNTS if k < m]
    out = []
    for _, grp in distinct_groupings(named, m):
        probs = np.zeros((int(grp.max()) + 1, op_probs.shape[1]))
        np.add.at(probs, grp, op_probs)
        out.append(Level(probs / probs.sum(axis=1, keepdims=True), grp))
    return out


class _Units:
    """A level's units as op lists (``simplace.groups.members``)."""

    def __init__(self, level: Level):
        self.probs = level.probs
        self.order, self.bounds = members(level.unit_of_op, level.probs.shape[0])

    def ops(self, u: int) -> np.ndarray:
        return self.order[self.bounds[u]:self.bounds[u + 1]]


def refine(levels: list[Level], placement, score: float, scores, *, src, dst, rounds: int,
           seed: int = 0, until: float | None = None,
           batch: int = BATCH) -> tuple[np.ndarray, float, dict]:
    """``(placement int32[M], score, info)``: the best placement the guided search finds
    from ``placement`` (whose score is ``score``) in at most ``rounds`` rounds, never
    worse than it.

    ``scores(int32[K, M]) -> float[K]``: the batch's scores, lower is better (a placement
    that does not fit scored ``inf``); ``src``, ``dst``: the graph's edges; ``until``: a
    ``time.perf_counter()`` deadline (no round starts that would end after it, by the last
    round's time). Without a deadline the result is a deterministic function of the seed.
    ``info``: rounds, gains, the start's and the end's scores, seconds, and why it stopped
    (``"rounds"``, ``"time"`` or, without a deadline, ``"converged"``: ``PATIENCE``
    rounds without a gain; with one, the search restarts then, ``restarts``)."""
    t0 = time.perf_counter()
    best = np.array(placement, dtype=np.int32)
    best_s = float(score)
    cur, cur_s = best, best_s  # where the search is (after a restart, not the best)
    start_s = best_s
    units = [_Units(lv) for lv in levels if lv.probs.shape[0] > 0]
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    d = int(units[0].probs.shape[1]) if units else 0
    rng = np.random.default_rng(seed)
    done = gains = idle = restarts = 0
    round_s = 0.0  # the last round's seconds
    stop = "rounds"
    while done < rounds:
        now = time.perf_counter()
        if until is not None and now + round_s > until:
            stop = "time"
            break
        if idle >= PATIENCE:
            if until is None:
                stop = "converged"
                break
            # With time left: a restart a few random moves away from the best.
            cur = best
            for _ in range(_KICK_STEPS):
                cur = _neighbours(cur, units, src, dst, d, 1, rng)[0]
            cur_s = float(np.asarray(scores(cur[None]), np.float64)[0])
            idle = 0
            restarts += 1
        cands = _neighbours(cur, units, src, dst, d, batch, rng)
        s = np.asarray(scores(cands), np.float64)
        j = int(np.argmin(s))
        done += 1
        if s[j] < cur_s:
            cur, cur_s = cands[j].copy(), float(s[j])
            idle = 0
            if cur_s < best_s:
                best, best_s = cur, cur_s
                gains += 1
        else:
            idle += 1
            if until is not None and np.isfinite(s[j]):
                # annealing: the temperature falls from TEMPERATURE[0] to [1] of the
                # current step time over the time to the deadline
                frac = min(max((now - t0) / max(until - t0, 1e-9), 0.0), 1.0)
                hot, cold = TEMPERATURE
                if rng.random() < np.exp(-(s[j] - cur_s) / (hot * (cold / hot) ** frac
                                                              * cur_s)):
                    cur, cur_s = cands[j].copy(), float(s[j])
        round_s = time.perf_counter() - now
    return best, best_s, {"rounds": done, "gains": gains, "restarts": restarts,
                          "from_s": start_s, "step_time_s": best_s,
                          "wall_s": time.perf_counter() - t0, "stop": stop}


def _neighbours(p: np.ndarray, units: list[_Units], src, dst, d: int, k: int,
                rng: np.random.Generator) -> np.ndarray:
    """int32[k, M]: ``k`` neighbours of ``p`` (module docstring)."""
    out = np.repeat(p[None], k, 0)
    cut = np.flatnonzero(p[src] != p[dst])
    policy = bool(units) and d >= 2
    if not (policy or cut.size):
        return out  # one device, or nothing to move
    for r in range(k):
        row = out[r]
        if cut.size and (not policy or rng.random() < 0.5):
            for _ in range(int(rng.choice(_CUT_MOVES))):
                e = cut[rng.integers(cut.size)]
                a, b = (src[e], dst[e]) if rng.random() < 0.5 else (dst[e], src[e])
                row[a] = row[b]
            continue
        lv = units[0 if rng.random() < FIRST_SHARE else int(rng.integers(len(units)))]
        for _ in range(int(rng.choice(_POLICY_MOVES))):
            u = int(rng.integers(lv.probs.shape[0]))
            ops = lv.ops(u)
            if ops.size == 0:
                continue
            q = lv.probs[u].copy()
            q[row[ops[0]]] = 0.0
            total = q.sum()
            if total <= 0.0:  # the policy is sure of the current device: any other
                q = np.ones(d)
                q[row[ops[0]]] = 0.0
                total = q.sum()
            row[ops] = int(rng.choice(d, p=q / total))
    return out

"""Policy-guided resampling: the pretrained policy's probabilities as the proposals of a
short greedy search around the best placement found so far (what ``rl-pretrained`` does
after its one batch, its option ``refine_rounds``). No weight changes: the policy stays
zero-shot.

Each round scores ``batch`` (``BATCH``) neighbours of the incumbent in one call of the
batched simulator and keeps the fastest if it beats the incumbent (under a deadline, also
by simulated annealing's rule if it does not: ``TEMPERATURE``). Given a simulator without
memory (``screen``), a round ranks its neighbours by that and checks only the fastest
few for memory. A neighbour is made (``CUT_SHARE``) by:

* **policy moves**: 1 to 5 units of one level each go to a device drawn from the
  policy's probabilities for that unit, its current device left out. The levels: the
  policy's op-level units (``FIRST_SHARE`` of these moves), the coarse groups
  ``zero_shot`` placed, and (``group_levels``) the graph's module subtrees at depths 1
  to 4 and its chains cut into ``RANGE_COUNTS`` ranges, whose probabilities are the mean
  of their ops';
* **cut moves**: 1 to 3 ops at a cut (an edge whose ends sit on two devices) each go to
  the device across the cut, alone or (``GROUP_CUT_SHARE``) with the whole unit of one
  level they belong to;
* **shift moves** (``SHIFT_SHARE`` of the neighbours, drawn first; none by default): the
  ops run in program order, a device's consecutive ops as one segment, so the boundary
  between two segments moves by 1 to 8 ops, or the whole run after a boundary joins the
  segment before it (``MERGE_SHARE``).

Each kind of policy or cut move and level is an arm; the shares above are the arms'
priors, and the search adapts them (``ADAPT_DECAY``): an arm that recently made more of
the rounds' winning neighbours than the others makes more neighbours.

Why: the policy's per-unit probabilities are good proposals, but its batch of
independent samples rarely gets units that depend on each other right together; a
few hundred greedy rounds mend much of that on graphs of a few hundred to a few thousand
ops. Group moves, by the policy or across a cut, are what a big graph needs from a short
search. The search stops after its rounds, after ``PATIENCE`` rounds in a row without a
gain (under a deadline: it restarts a few random moves away from the best instead), or
before a round that would end past its deadline. The neighbours are made by a compiled
kernel from random numbers the seeded generator draws. ``race`` runs the search from
several starts under one deadline, dropping the slower half at each rung (``rl-universal``
races the best placement so far with heuristics' placements that beat it: one of those
sometimes leads to a faster basin than the policy's).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import numpy as np

from simplace._numba import njit
from simplace.groups import members
from simplace.rl.refine import screened_scores

# Neighbours scored per round (one call of the batched simulator).
BATCH = 128
# Rounds in a row without a gain after which the search has converged.
PATIENCE = 60
# ``race``'s lanes run until their deadline, not a count of rounds.
_UNCAPPED = 2**31 - 1
# rl-universal races at most this many starts: the best placement so far and the cheap
# heuristics' placements that score better than it.
RACE_LANES = 3
# A neighbour's number of policy moves and of cut moves, drawn uniformly from these.
_POLICY_MOVES = (1, 1, 2, 3, 5)
_CUT_MOVES = (1, 1, 2, 3)
# The share of neighbours made by cut moves (the rest by policy moves).
CUT_SHARE = 0.5
# The share of neighbours made by a shift move instead (before the above): the ops run in
# program order, a device's consecutive ops as one segment, so a boundary between two
# segments moves by 1 to 8 ops (``_SHIFT_LENGTHS``), or (``MERGE_SHARE`` of these) the
# whole run past a boundary joins the segment before it. Off by default. Why they exist:
# on transformer on 8 K40s, where the fine-tune ended at 1.016x of local-60, none of 4,096
# policy and cut neighbours was faster, but 29 of 2,627 shifts were, and a greedy descent
# over shifts alone took it to 1.010 in 1.7 s. Why off: at 0.25 the fine-tune gained on
# transformer on K40s (1.019 -> 0.991x of local-60, 3 seeds) but lost on inception_v3 on
# 4 H100s (1.016 -> 1.074x) and resnet50 (0.4%, a training row); over the 13 held-out rows
# and 3 seeds the geometric mean went from 0.977 to 0.979 (a share adapted to the gains of
# shifts did no better: 0.979)
# (bench/results/pretrained_2026-11-28i_vm_shift-moves.txt).
SHIFT_SHARE = 0.0
MERGE_SHARE = 0.25
_SHIFT_LENGTHS = (1, 1, 2, 4, 8)
_NO_BOUNDS = np.zeros(0, np.int64)
# The share of policy moves that take the first level (the policy's own op-level units);
# the rest take any level.
FIRST_SHARE = 0.5
# The share of cut moves that move the whole unit (of a level drawn uniformly) of the op
# at the cut, rather than the op alone.
GROUP_CUT_SHARE = 0.75
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
# The arms' shares adapt (adaptive operator selection, as adaptive large neighbourhood
# search does): each arm (kind of move, level; ``_Proposer.prior``) makes its prior share
# of the neighbours times its recent rate of making the round's winning neighbour over
# the rate of all arms, at least ``ADAPT_FLOOR`` of its prior. Its uses and wins decay by
# ``ADAPT_DECAY`` a round, and ``ADAPT_PSEUDO_USES`` uses at the mean rate smooth an arm
# that has made few. 0 for ``ADAPT_DECAY``: the prior shares, no adaptation. Why: on
# inception_v3 module subtrees at depth 3 made a third of the search's gain with a
# twentieth of the neighbours. Over the 13 held-out rows zero-shot went from 1.025 to
# 1.013 of local-60 (geometric mean, 3 seeds), within 10% on 12 of 13 on each of 6 seeds
# (10-12 before); the training rows' geometric mean from 0.7480 to 0.7450 s; the
# fine-tune's worst row from 1.039 to 1.008
# (bench/results/pretrained_2026-11-28m_vm_adaptive-moves.txt).
ADAPT_DECAY = 0.99
ADAPT_PSEUDO_USES = 256.0
ADAPT_FLOOR = 0.1


@dataclass(frozen=True)
class Level:
    """One granularity the policy placed: ``probs`` float64[U, D], the policy's device
    probabilities per unit; ``unit_of_op`` int[M], each op's unit."""

    probs: np.ndarray
    unit_of_op: np.ndarray


def group_levels(graph, op_probs: np.ndarray, free=None) -> list[Level]:
    """Levels of whole groups of ops (module subtrees, ranges of chains; each distinct
    grouping of 2 to M-1 groups once), a group's probabilities the mean of its ops'
    ``op_probs`` (float[M, D]). ``free``: ``colocate_free_ops(graph)`` if the caller has
    it."""
    from simplace.groups import (
        by_module,
        chain_collapse,
        colocate_free_ops,
        distinct_groupings,
        normalize,
        target_count,
    )

    m = graph.num_ops
    chains = chain_collapse(graph, colocate_free_ops(graph) if free is None else free)
    named = [(f"module{depth}", normalize(by_module(graph, depth))) for depth in MODULE_DEPTHS]
    named += [(f"ranges{k}", normalize(target_count(graph, k, chains)))
              for k in RANGE_COUNTS if k < m]
    out = []
    for _, grp in distinct_groupings(named, m):
        probs = np.zeros((int(grp.max()) + 1, op_probs.shape[1]))
        np.add.at(probs, grp, op_probs)
        out.append(Level(probs / probs.sum(axis=1, keepdims=True), grp))
    return out


def refine(levels: list[Level], placement, score: float, scores, *, src, dst, rounds: int,
           seed: int = 0, until: float | None = None, screen=None,
           batch: int | None = None,
           max_restarts: int | None = None) -> tuple[np.ndarray, float, dict]:
    """``(placement int32[M], score, info)``: the best placement the guided search finds
    from ``placement`` (whose score is ``score``) in at most ``rounds`` rounds, never
    worse than it.

    ``scores(int32[K, M]) -> float[K]``: the batch's scores, lower is better (a placement
    that does not fit scored ``inf``); ``screen``: optionally, the same without the
    memory check (``inf`` never), cheaper: a round ranks its neighbours by it and scores
    only the fastest few (``simplace.rl.refine.SCREEN_CHECKS``, then the next ones while
    none fits);
    ``src``, ``dst``: the graph's edges; ``until``: a ``time.perf_counter()`` deadline (no
    round starts that would end after it, by the last round's time). Without a deadline
    the result is a deterministic function of the seed. ``info``: rounds, gains, the
    start's and the end's scores, seconds, and why it stopped
    (``"rounds"``, ``"time"`` or, without a deadline, ``"converged"``: ``PATIENCE``
    rounds without a gain; with one, the search restarts then, ``restarts``, unless
    ``max_restarts`` (if given) restarts in a row have found nothing faster than the
    best: then it stops, converged)."""
    t0 = time.perf_counter()
    batch = BATCH if batch is None else int(batch)
    best = np.array(placement, dtype=np.int32)
    best_s = float(score)
    cur, cur_s = best, best_s  # where the search is (after a restart, not the best)
    start_s = best_s
    propose = _Proposer(levels, src, dst)
    arms = _ArmStats(propose.prior)
    rng = np.random.default_rng(seed)
    done = gains = idle = restarts = futile = 0
    round_s = 0.0  # the last round's seconds
    stop = "rounds"
    while done < rounds:
        now = time.perf_counter()
        if until is not None and now + round_s > until:
            stop = "time"
            break
        if idle >= PATIENCE:
            if until is None or (max_restarts is not None and futile >= max_restarts):
                stop = "converged"
                break
            # With time left: a restart a few random moves away from the best.
            cur = best
            for _ in range(_KICK_STEPS):
                cur = propose(cur, 1, rng)[0]
            cur_s = float(np.asarray(scores(cur[None]), np.float64)[0])
            idle = 0
            restarts += 1
            futile += 1
        cands = propose(cur, batch, rng, arms.shares)
        s = _round_scores(cands, scores, screen)
        j = int(np.argmin(s))
        arms.update(propose.arms, int(propose.arms[j]) if s[j] < cur_s else None)
        done += 1
        if s[j] < cur_s:
            cur, cur_s = cands[j].copy(), float(s[j])
            idle = 0
            if cur_s < best_s:
                best, best_s = cur, cur_s
                gains += 1
                futile = 0
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


def race(levels: list[Level], starts: list, scores, *, src, dst, until: float,
         seed: int = 0, screen=None,
         last_restarts: int | None = None) -> tuple[np.ndarray, float, dict]:
    """``(placement, score, info)``: ``refine`` from each of ``starts`` (``(label,
    placement, score)``, placements that fit) until ``until``, raced as ``local`` races
    its starts: rungs of equal time, in each a stint of equal time per lane, the slower
    half of the lanes stopping at the end of each rung, the last rung one lane's. The
    best lane's best, never worse than any start. ``last_restarts``: the last rung's
    ``max_restarts`` (the race ends early when that lane's restarts stop paying: the
    caller's next search gets the time). ``info``: ``rounds`` (every lane's),
    ``start`` (the winning lane's label), ``step_time_s``, ``lanes`` (a row per lane:
    ``start``, ``from_s``, ``score``, ``rounds``; the winner last), ``stop`` (the last
    stint's: ``"time"``, or ``"converged"`` when it ended early)."""
    lanes = [{"start": label, "from_s": float(s), "score": float(s), "rounds": 0,
              "best": np.asarray(p, np.int32)} for label, p, s in starts]
    done = []
    rungs = 1 + math.ceil(math.log2(len(lanes)))
    stint = 0
    for rung in range(rungs):
        rung_end = time.perf_counter() + (until - time.perf_counter()) / (rungs - rung)
        for i, lane in enumerate(lanes):
            now = time.perf_counter()
            # a fresh seed per stint: a lane's next stint does not repeat its moves
            lane["best"], lane["score"], out = refine(
                levels, lane["best"], lane["score"], scores, src=src, dst=dst,
                rounds=_UNCAPPED, seed=seed + stint,
                until=now + (rung_end - now) / (len(lanes) - i), screen=screen,
                max_restarts=last_restarts if rung == rungs - 1 else None)
            lane["rounds"] += out["rounds"]
            stint += 1
        lanes.sort(key=lambda lane: lane["score"])
        keep = len(lanes) if rung == rungs - 1 else (len(lanes) + 1) // 2
        done += lanes[keep:]
        lanes = lanes[:keep]
    win = lanes[0]
    rows = [{k: v for k, v in lane.items() if k != "best"} for lane in done + [win]]
    return win["best"], win["score"], {"rounds": sum(r["rounds"] for r in rows),
                                       "start": win["start"], "step_time_s": win["score"],
                                       "lanes": rows, "stop": out["stop"]}


def race_lanes(first: tuple, others: list) -> list:
    """``race``'s starts: ``first`` (``(label, placement, score)``, the best placement
    so far) and the ``RACE_LANES - 1`` fastest distinct ``others`` (likewise) that beat
    it (two that place alike would race twice)."""
    from simplace.placers.local import _race_starts

    faster = [o for o in others if o[2] < first[2]]
    if not faster:
        return [first]
    rows = [first] + faster
    picked = _race_starts(np.stack([np.asarray(p) for _, p, _ in rows]),
                          np.array([s for _, _, s in rows], np.float64), RACE_LANES)
    # first (row 0) is the slowest: picked only when fewer others are distinct from it
    return [first] + [rows[k] for k in picked if k > 0][:RACE_LANES - 1]


class _ArmStats:
    """The arms' decayed uses and wins, and the shares they give (``ADAPT_DECAY``)."""

    def __init__(self, prior: np.ndarray):
        self.prior = np.asarray(prior, np.float64)
        self.uses = np.zeros_like(self.prior)
        self.wins = np.zeros_like(self.prior)
        self.shares = self.prior

    def update(self, used: np.ndarray, won: int | None) -> None:
        """A round's arms (``used``, one per neighbour) and the winning neighbour's arm
        (None: no neighbour beat the incumbent)."""
        if ADAPT_DECAY <= 0 or self.prior.size < 2:
            return
        self.uses *= ADAPT_DECAY
        self.wins *= ADAPT_DECAY
        self.uses += np.bincount(used, minlength=self.prior.size)
        if won is not None:
            self.wins[won] += 1.0
        total = self.wins.sum()
        if total <= 0:
            return
        mean = total / self.uses.sum()
        rate = (self.wins + ADAPT_PSEUDO_USES * mean) / (self.uses + ADAPT_PSEUDO_USES)
        self.shares = self.prior * np.maximum(rate / mean, ADAPT_FLOOR)


def _round_scores(cands: np.ndarray, scores, screen) -> np.ndarray:
    """float64[K]: the neighbours' scores; screened, only the fastest few's (the rest
    ``inf``; ``simplace.rl.refine.screened_scores``)."""
    if screen is None:
        return np.asarray(scores(cands), np.float64)
    return screened_scores(cands, scores, screen)


class _Proposer:
    """Neighbours of a placement (module docstring) by a compiled kernel: every level's
    units as op lists in one array (``simplace.groups.members``), their probabilities
    stacked, and the random numbers drawn by the caller's generator (deterministic for a
    seed)."""

    def __init__(self, levels: list[Level], src, dst):
        levels = [lv for lv in levels if lv.probs.shape[0] > 0]
        self.src = np.asarray(src, np.int64)
        self.dst = np.asarray(dst, np.int64)
        self.d = int(levels[0].probs.shape[1]) if levels else 0
        counts = [lv.probs.shape[0] for lv in levels]
        # unit g (of every level, in order) holds ops order[start[g]:end[g]]
        self.base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.probs = np.zeros((0, max(self.d, 1)))
        self.start = self.end = self.order = np.zeros(0, np.int64)
        self.unit_of = np.zeros((0, 0), np.int64)
        if levels:
            parts = [members(lv.unit_of_op, n) for lv, n in zip(levels, counts, strict=True)]
            offsets = np.cumsum([0] + [len(o) for o, _ in parts[:-1]])
            self.probs = np.ascontiguousarray(np.concatenate([lv.probs for lv in levels]),
                                              np.float64)
            pairs = list(zip(offsets, parts, strict=True))
            self.start = np.concatenate([o + b[:-1] for o, (_, b) in pairs]).astype(np.int64)
            self.end = np.concatenate([o + b[1:] for o, (_, b) in pairs]).astype(np.int64)
            self.order = np.concatenate([o for o, _ in parts]).astype(np.int64)
            self.unit_of = np.stack([np.asarray(lv.unit_of_op, np.int64) for lv in levels])

    @functools.cached_property
    def prior(self) -> np.ndarray:
        """float64[A]: the share of neighbours each arm (kind of move: ops across a cut;
        whole units of each level across a cut; policy moves of each level) makes by
        default: ``CUT_SHARE`` cut moves, ``GROUP_CUT_SHARE`` of them whole units of a
        level drawn uniformly; of the policy moves, ``FIRST_SHARE`` of the first level,
        the rest of a level drawn uniformly."""
        nlev = self.base.size - 1
        if nlev == 0:
            return np.ones(1)
        cut = np.concatenate([[CUT_SHARE * (1 - GROUP_CUT_SHARE)],
                              np.full(nlev, CUT_SHARE * GROUP_CUT_SHARE / nlev)])
        policy = np.full(nlev, (1 - CUT_SHARE) * (1 - FIRST_SHARE) / nlev)
        policy[0] += (1 - CUT_SHARE) * FIRST_SHARE
        return np.concatenate([cut, policy])

    def __call__(self, p: np.ndarray, k: int, rng: np.random.Generator,
                 shares: np.ndarray | None = None) -> np.ndarray:
        """int32[k, M]: ``k`` neighbours of ``p``, each made by an arm drawn from
        ``shares`` (float[A], default ``prior``); the arms drawn are left in
        ``self.arms``."""
        p = np.ascontiguousarray(p, np.int32)
        cum = np.cumsum(self.prior if shares is None else shares)
        self.arms = np.minimum(np.searchsorted(cum, rng.random(k) * cum[-1], side="right"),
                               cum.size - 1).astype(np.int64)
        cut = np.flatnonzero(p[self.src] != p[self.dst])
        # segment ends (each one's last op), for shift moves only: off by default, and this
        # runs every round
        bounds = (np.flatnonzero(p[:-1] != p[1:]).astype(np.int64) if SHIFT_SHARE > 0
                  else _NO_BOUNDS)
        out = np.empty((k, p.size), np.int32)
        _propose(p, out, self.src[cut], self.dst[cut], self.probs, self.start, self.end,
                 self.order, self.base, self.unit_of, self.d, rng.random((k, _DRAWS)),
                 self.arms,
                 np.asarray(_POLICY_MOVES, np.int64), np.asarray(_CUT_MOVES, np.int64),
                 bounds, SHIFT_SHARE, MERGE_SHARE, np.asarray(_SHIFT_LENGTHS, np.int64))
        return out


# Random numbers a neighbour takes: its kind, its level and its number of moves, and two
# per move (a cut and a side, or a unit and a device).
_DRAWS = 4 + 2 * max(max(_POLICY_MOVES), max(_CUT_MOVES))


@njit()
def _propose(p, out, cut_a, cut_b, probs, start, end, order, base, unit_of, d, draws, arms,
             policy_moves, cut_moves, bounds, shift_share, merge_share, shift_lengths):
    """Fill ``out`` (int32[k, M]) with neighbours of ``p``, row r by the kind of move
    ``arms[r]`` (``_Proposer``'s arms: 0 ops across a cut, 1 + l whole units of level l
    across a cut, 1 + L + l policy moves of level l) from ``draws[r]`` (uniform numbers):
    the number of moves, then two per move (a shift move instead where ``draws[r, 0]``
    is below ``shift_share``)."""
    k, m = out.shape
    nlev = base.size - 1
    ncut = cut_a.size
    nb = bounds.size
    policy = nlev > 0 and d >= 2
    for r in range(k):
        row = out[r]
        for i in range(m):
            row[i] = p[i]
        x = draws[r]
        if not (policy or ncut):
            continue  # one device, or nothing to move
        x0 = x[0]
        if nb and x0 < shift_share:
            # a segment boundary (after op b) moves: ops past it join the segment before,
            # or ops before it join the one after; or the whole next run joins
            b = bounds[min(int(x[4] * nb), nb - 1)]
            if x[1] < merge_share:
                dev = row[b]
                t = b + 1
                nxt = row[t]
                while t < m and row[t] == nxt:
                    row[t] = dev
                    t += 1
                continue
            n = shift_lengths[min(int(x[2] * shift_lengths.size), shift_lengths.size - 1)]
            if x[3] < 0.5:
                dev = row[b]
                for t in range(b + 1, min(b + 1 + n, m)):
                    row[t] = dev
            else:
                dev = row[b + 1]
                for t in range(max(b + 1 - n, 0), b + 1):
                    row[t] = dev
            continue
        arm = arms[r]
        if ncut and (not policy or arm <= nlev):
            n = cut_moves[min(int(x[1] * cut_moves.size), cut_moves.size - 1)]
            whole = 1 <= arm <= nlev  # (a policy arm here: no policy, ops alone)
            lv = arm - 1 if whole else 0
            for i in range(n):
                e = min(int(x[4 + 2 * i] * ncut), ncut - 1)
                a, b = cut_a[e], cut_b[e]
                if x[5 + 2 * i] >= 0.5:
                    a, b = b, a
                dev = row[b]
                if whole:  # a's whole unit of the level goes across
                    g = base[lv] + unit_of[lv, a]
                    for t in range(start[g], end[g]):
                        row[order[t]] = dev
                else:
                    row[a] = dev
            continue
        # a policy move (a cut arm without a cut: its level's units)
        lv = arm - nlev - 1 if arm > nlev else max(arm - 1, 0)
        units = base[lv + 1] - base[lv]
        n = policy_moves[min(int(x[3] * policy_moves.size), policy_moves.size - 1)]
        for i in range(n):
            g = base[lv] + min(int(x[4 + 2 * i] * units), units - 1)
            if start[g] == end[g]:
                continue
            cur = row[order[start[g]]]
            total = 0.0
            for j in range(d):
                if j != cur:
                    total += probs[g, j]
            dev = -1
            if total > 0.0:
                target = x[5 + 2 * i] * total
                acc = 0.0
                for j in range(d):
                    if j != cur:
                        acc += probs[g, j]
                        dev = j
                        if acc > target:
                            break
            else:  # the policy is sure of the current device: any other
                dev = min(int(x[5 + 2 * i] * (d - 1)), d - 2)
                if dev >= cur:
                    dev += 1
            for t in range(start[g], end[g]):
                row[order[t]] = dev

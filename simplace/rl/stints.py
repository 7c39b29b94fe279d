"""Restarts and polish of a REINFORCE run (``simplace.rl.reinforce``, "Restarts" and
"Polish"): the portfolio of warm starts the stints train from, the count of an update
against its stint, and the op-level polish of each stint's best at the end."""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from simplace.rl.trainer import Trainer, _State
from simplace.search import OOM_PENALTY, SearchSession

# A stint's best must improve by this fraction to count as progress
# (``simplace.rl.reinforce``, "Restarts"): a converged policy still finds 0.01% gains now and then.
STINT_MIN_GAIN = 1e-3


def portfolio_starts(warm_starts, warm_scores, n: int) -> list[tuple[str, np.ndarray]]:
    """The ``n`` best distinct warm starts that fit, best first ([(label, op placement)]);
    the best warm start alone when none fits (the first stint's start, as before)."""
    ranked = sorted(zip(warm_scores or [], range(len(warm_starts or [])), strict=True))
    out: list[tuple[str, np.ndarray]] = []
    for s, i in ranked:
        name, p = warm_starts[i]
        p = np.asarray(p, np.int32)
        if out and (s >= OOM_PENALTY or len(out) >= n):
            break
        if not any(np.array_equal(p, q) for _, q in out):
            out.append((name, p))
    return out


def _stint_step(trainer: Trainer, state: _State, stints: dict, s_best: float,
                session: SearchSession, update: int, lr: float, info: dict,
                t_end: float, p_best, stint_bests: list) -> _State:
    """Count an update against the current stint (``stints``, updated in place) and
    restart the policy once it has stalled ``patience`` updates: on the next portfolio
    start, else on the run's best placement (``simplace.rl.reinforce``, "Restarts")."""
    if not stint_bests or stints.get("current") != len(stint_bests) - 1:
        stint_bests.append((math.inf, None))  # this stint's best (score, op placement)
        stints["current"] = len(stint_bests) - 1
    if s_best < stint_bests[-1][0]:
        stint_bests[-1] = (s_best, np.asarray(p_best, np.int32))
    if s_best < stints["best"] * (1 - STINT_MIN_GAIN):
        stints["best"], stints["stall"] = s_best, 0
    else:
        stints["stall"] += 1
    now = time.perf_counter()
    t0 = stints.setdefault("t0", now)
    # Under a time budget (training ends at ``t_end``) a portfolio stint also ends after
    # its share of the training time left when it began: an equal part among the starts
    # not yet trained from and the restarts on the best placement after them (one part).
    left = len(stints["starts"]) - stints["next"]
    over = left > 0 and math.isfinite(t_end) and now - t0 >= (t_end - t0) / (left + 1)
    if stints["stall"] < trainer.cfg.patience and not over:
        return state
    if stints["next"] < len(stints["starts"]):
        name, target = stints["starts"][stints["next"]]
        stints["next"] += 1
    elif session.best is not None and session.best_score < OOM_PENALTY:
        name, target = "best", trainer.units.unit_placement(session.best)
    else:  # nothing that fits to restart on: go on
        stints["stall"] = 0
        return state
    state, _, _ = trainer.restart(state, np.asarray(target, np.int32), lr)
    stints["best"] = float(state.opt_state["elite_score"])
    stints["stall"], stints["at"], stints["t0"] = 0, update, time.perf_counter()
    stints["current"] = None  # the next update opens the new stint's entry
    info["restarts"] = info.get("restarts", 0) + 1
    if name != "best":
        info.setdefault("stints_from", []).append(name)
    return state


def _polish(trainer: Trainer, mode: str, session: SearchSession, info: dict,
            stint_bests: list) -> None:
    """Polish by op-level block moves (``RLConfig.polish_*``) the best placement of
    each stint (``stint_bests``: [(score, op placement)]; a stint is one basin the
    policy found), best first, until the session's deadline or ``polish_batches`` in
    all; the best polished placement is offered to the session."""
    from simplace.rl.refine import polish

    t0 = time.perf_counter()
    start = session.best_score

    def score(p):
        with jax.enable_x64(True):
            step_t, oom, unver = trainer._simulate(mode, jnp.asarray(p))
            step_t, oom = jax.device_get((step_t, oom | unver))
        return np.where(oom, step_t + OOM_PENALTY, step_t)

    # A polish batch is one simulator call, far shorter than an update: the deadline
    # itself bounds it (one batch past it at most).
    end = session.deadline
    g = trainer.graph
    cands = [(start, session.best)] + sorted(
        ((float(sc), p) for sc, p in stint_bests
         if sc < OOM_PENALTY and not np.array_equal(p, session.best)),
        key=lambda c: c[0])
    used, polished = 0, 0
    best, s = session.best, start
    for sc, p in cands:
        left = int(trainer.cfg.polish_batches) - used
        if left <= 0 or time.perf_counter() >= end:
            break
        b, bs, n = polish(score, p, sc, trainer.inputs.num_devices, trainer.k, left,
                          deadline=end, edges=(np.asarray(g.src), np.asarray(g.dst)))
        used, polished = used + n, polished + 1
        if bs < s:
            best, s = b, bs
    info["polished_starts"] = polished
    session.offer(best, s)
    spent = time.perf_counter() - t0
    info.update(polish_batches=used, polish_s=spent,
                polish_gain=max(0.0, (start - session.best_score) / start))
    if session.history and session.best_score < start:
        # The last update's row ends at the result (one row per update, as a resumed
        # run's history expects): the polished best, and the polish's time counted as
        # that update's refinement.
        last = session.history[-1]
        last.update(best_step_time_s=session.best_score, polish=True,
                    time_refine_s=last.get("time_refine_s", 0.0) + spent)

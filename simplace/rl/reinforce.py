"""The REINFORCE engine: each update samples, simulates, scores and steps.

Each update draws K placements of the units from the policy, expands them to ops (a
gather), simulates all K in one call of the batched simulator, turns step times into
rewards and takes one policy-gradient step:

  loss = -mean_k(A_k * log p(a_k)) - beta * mean_k(H_k),

with A_k = R_k - baseline (optionally divided by the batch's reward std) and H_k the
entropy of the distributions sample k was drawn from, summed over its decisions like
log p (so beta weighs one decision's entropy against one decision's log-probability).
The gradient comes from one ``jax.vjp`` of the sampling pass (no second,
teacher-forced pass): a jitted policy step samples and keeps the vjp, the simulator runs
on its own (compiled once per problem), and a jitted learning step finishes the
gradient (``Trainer.update_fn``).

Rewards (Mirhoseini et al. use sqrt): with t the step time over a reference time
``t_ref`` (the warm start's, or the first batch's mean), ``neg``: -t, ``sqrt``:
-sqrt(t), ``log``: -log(t). An OOM placement is scored as if it took
max(``oom_factor`` x t_ref, the batch's slowest time) and its advantage is clipped to
<= 0: it is never reinforced, and never becomes the best placement (its penalised score
is ``OOM_PENALTY`` behind every placement that fits).

Memory: ``oom="bound"`` uses the simulator's cheap upper bound of peak memory (a
placement whose bound exceeds a capacity counts as OOM: conservative, never lets an OOM
placement through); ``oom="exact"`` screens with the bound and runs the simulator's
exact peak-memory pass (its final event sweep on the host, several times slower) on the
fastest few placements the bound flags; the others are rewarded by their step time but
never kept (``Trainer._simulate``); ``"auto"`` picks exact
only when the bound flags at least 10% of K uniformly random placements (what an
untrained policy draws).

Optimizer: ``clip_by_global_norm`` then Adam, with the learning rate (warm-up, then
cosine decay to ``lr_end``) and the entropy weight (geometric from ``entropy`` to
``entropy_end``) scheduled by the run's progress, which the host passes in: the fraction
of episodes done, or of the time budget, whichever is further.

Determinism: every random choice comes from ``jax.random.key(seed)``; with
``episodes`` (and no time budget) a run is a fixed function of the seed, and a run
resumed from a checkpoint continues exactly as the uninterrupted run would.

The clock, stop reason, best placement, kept candidates, history, progress line and
validation hook are the run's ``simplace.search.SearchSession`` (shared with local
search). Resuming a finished run's checkpoint trains a new leg (``_leg``): the budget or
episodes given, counted from this call, never the earlier run's time.

Restarts: a warm-started policy converges within a few hundred updates (its samples
concentrate around one placement) and then rarely improves, while where it converges
depends on where it started far more than on the start's own step time (a slower
start can end well ahead). So training runs in *stints*: the first from the best warm
start; once a stint's best has not improved for ``RLConfig.patience`` updates, the
policy is put on the next of the ``RLConfig.portfolio`` best distinct warm starts
(``portfolio_starts``), fresh Adam state, that start as the self-imitation target; after
the last, on the run's best placement (exploring around the incumbent again). The
stints' count is ``info["restarts"]``; without a time budget restarts depend on update
counts only, so a run with ``episodes`` stays a fixed function of the seed (under a
budget a portfolio stint also ends after its share of the time).

Polish: at the end of the run (under a time budget, in the last ``polish_share`` of the
time after the first update) each stint's best placement, best first, is refined at the
level of ops by greedy block moves and moves across transfers
(``simplace.rl.refine.polish``), which the policy's units cannot make; the result is the
best of them. ``info["polish_gain"]`` is its share of the result.

The engine's parts: ``simplace.rl.config`` (``RLConfig``, the schedules),
``simplace.rl.trainer`` (``Trainer``: the update, memory checks, imitation),
``simplace.rl.legs`` (legs and checkpoints) and ``simplace.rl.stints`` (restarts and
polish); this module runs them (``train``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from simplace.errors import SimplaceError
from simplace.rl.config import BASELINES, OOM_MODES, REWARDS, SIMULATORS, RLConfig, _schedule
from simplace.rl.legs import (
    DEFAULT_EPISODES,
    Run,
    _fingerprint,
    _leg,
    _resume,
    _save,
    json_round,
)
from simplace.rl.stints import STINT_MIN_GAIN, _polish, _stint_step, portfolio_starts
from simplace.rl.trainer import EXACT_CHECKS, Trainer
from simplace.search import OOM_PENALTY, SearchSession, penalised

# Defined in the modules of the engine's parts, and imported from here.
__all__ = ["BASELINES", "DEFAULT_EPISODES", "EXACT_CHECKS", "OOM_MODES", "REWARDS",
           "SIMULATORS", "STINT_MIN_GAIN", "RLConfig", "TrainResult", "Trainer",
           "json_round", "portfolio_starts", "train"]


@dataclasses.dataclass
class TrainResult:
    """best_placement int32[M], best_score (step time, + OOM_PENALTY if OOM), history
    rows (one per update), info (counters, modes, timings)."""

    best_placement: np.ndarray
    best_score: float
    history: list[dict]
    info: dict[str, Any]


def train(trainer: Trainer, *, episodes: int | None = None, budget_s: float | None = None,
          session: SearchSession | None = None,
          warm_starts: list[tuple[str, np.ndarray]] | None = None,
          warm_scores: list[float] | None = None, checkpoint: str | None = None,
          checkpoint_every: int = 50, checkpoint_every_s: float = 30.0,
          stop_after_updates: int | None = None,
          progress: Callable[[str], None] | None = None, progress_bar: bool = False,
          policy_kw: dict | None = None, label: str = "rl") -> TrainResult:
    """Train ``trainer``'s policy and return the best placement seen.

    Args:
      episodes: sampled placements in this leg (updates = ceil(episodes / K)).
      budget_s: wall-time budget when no ``session`` is given (with neither episodes nor
        a budget: DEFAULT_EPISODES episodes).
      session: the ``simplace.search.SearchSession`` that owns the clock (its budget runs
        from when the work began: warm starts and compilation count), the best
        placement, the validation hook (called every ``validate_every`` updates and at
        the end; a returned cost model is trained against from then on, and
        ``session.cost_model`` is the one the result's score belongs to), history and
        progress. Default: a new one with ``budget_s``, ``progress``, ``progress_bar``.
      warm_starts: [(label, op placement int32[M])]: the best seeds the best-so-far, and
        the policy first imitates its unit placement (``RLConfig.imitation_*``);
        ``warm_scores`` their penalised step times (from the batched simulator).
      checkpoint: a ``.npz`` path: resumed from when it exists (same problem, policy,
        config and seed, else ``SimplaceError``; see ``_leg`` for what a resumed run
        trains), written every ``checkpoint_every`` updates, every
        ``checkpoint_every_s`` seconds and at the end (an interrupted run included).
      stop_after_updates: stop this call after that many updates (a run that a
        checkpoint resumes later; tests use it to interrupt).
    """
    cfg, k = trainer.cfg, trainer.k
    if episodes is not None and int(episodes) < 1:
        raise SimplaceError(f"episodes must be >= 1, got {episodes}.")
    if session is None:
        session = SearchSession(label, None, budget_s=budget_s, progress=progress,
                                bar=progress_bar, unit="episodes")
    budget_s = session.budget_s
    fp = _fingerprint(trainer.graph, trainer, policy_kw or {})
    state = trainer.init_state()
    meta = None
    if checkpoint and os.path.exists(checkpoint):
        run, meta = _resume(checkpoint, fp, state, session)
    else:
        run = _start(trainer, session, state, warm_starts, warm_scores)
    run.leg_start, run.leg_end, continued = _leg(meta, run.update, k, episodes, budget_s)
    if meta is not None and not continued:
        run.info["legs"] = run.info.get("legs", 1) + 1
    session.line.total = None if run.leg_end is None else run.leg_end * k

    def save(finished: bool) -> None:
        _save(checkpoint, fp, run, session, finished)

    rescore = _rescorer(trainer)
    stop, n_this, rate, steady_s, stint_bests = _updates(
        trainer, session, run, save if checkpoint else None, rescore, stop_after_updates,
        checkpoint_every, checkpoint_every_s)
    info = run.info
    if cfg.polish_batches and stop not in ("interrupted", "stopped") and \
            session.best is not None and session.best_score < OOM_PENALTY:
        _polish(trainer, run.mode, session, info, stint_bests)
    if session.hook is not None and stop != "interrupted" and \
            session.validate(-1, rescore) is not None:
        info["cost_model_switches"] = info.get("cost_model_switches", 0) + 1
    info.update(stop=stop, updates=run.update, episodes=run.episodes, samples=k,
                units=trainer.policy.num_units, trained_updates=n_this,
                wall_s=run.elapsed0 + session.elapsed(), t_ref_s=run.t_ref,
                # Steady state: from the end of the first update (its compilation) on.
                episodes_per_s=rate if steady_s > 0 else None)
    if checkpoint:
        save(stop not in ("stopped", "interrupted"))
    best, best_score = session.best, session.best_score
    if best is None:  # no update ran (interrupted at once): the best random placement
        p, times, _ = trainer.probe()
        j = int(np.argmin(times))
        best, best_score = p[j].astype(np.int32), float(times[j])
    # Where an update's time went (policy, simulator, learning step, refinement).
    info["update_timing"] = {k: float(v) for k, v in trainer.timing.items()}
    return TrainResult(best, best_score, session.history, info)


def _start(trainer: Trainer, session: SearchSession, state, warm_starts,
           warm_scores) -> Run:
    """A new run: the warm starts offered to ``session`` and the best imitated, the
    memory mode chosen, the stints' starts ranked."""
    cfg = trainer.cfg
    info: dict[str, Any] = {}
    best_warm = None
    for (name, p), s in zip(warm_starts or [], warm_scores or [], strict=True):
        if session.offer(np.asarray(p, np.int32), float(s)):
            best_warm = name
    if best_warm is not None:
        info["warm_start"] = best_warm
        target = trainer.units.unit_placement(session.best)
        state, n, lik = trainer.imitate(state, target, cfg.lr)
        info.update(imitation_steps=n, imitation_likelihood=lik)
    mode = cfg.oom
    info["simulator"] = trainer.backend
    if trainer.backend == "numba":
        mode = "exact"  # the native simulator's OOM flags are exact, at no extra cost
    elif mode == "auto":
        _, _, suspect = trainer.probe()
        mode = "exact" if suspect.mean() >= 0.1 else "bound"
        info["probe_suspect_fraction"] = float(suspect.mean())
    # The stints (module docstring, "Restarts"): the first trains from the best warm
    # start (imitated above); the others' starts as unit placements. Several starts,
    # because where a run ends depends on its start more than on the start's score:
    # rnnlm on cpu_h100x4_nvlink from m_sct, 38.2 ms, ended near 36 ms; from the
    # expert placement, 45.1 ms, near 29.6 ms.
    starts = portfolio_starts(warm_starts, warm_scores, cfg.stint_starts)
    stints = {"next": 1, "at": 0, "stall": 0,
              "best": session.best_score if session.best is not None else math.inf,
              "starts": [[n, trainer.units.unit_placement(p).tolist()]
                         for n, p in starts]}
    if len(starts) > 1:
        info["portfolio"] = [n for n, _ in starts]
    # The warm start's step time, or (NaN) the first batch's mean, set in the jit.
    t_ref = session.best_score if session.best is not None and \
        session.best_score < OOM_PENALTY else math.nan
    info["oom_mode"] = mode
    return Run(state, 0, 0, mode, t_ref, info, stints, 0.0)


def _rescorer(trainer: Trainer):
    """``rescore(model, placements)`` for the session's validation hook."""
    def rescore(model, placements):
        """Point the trainer at ``model``; the penalised scores of ``placements``."""
        from simplace.sim import sim_inputs

        trainer.use_inputs(sim_inputs(trainer.graph, model))
        res = trainer.simulator(True)(placements)
        return penalised(res.step_time_s, res.oom)

    return rescore


def _updates(trainer: Trainer, session: SearchSession, run: Run, save, rescore,
             stop_after_updates: int | None, checkpoint_every: int,
             checkpoint_every_s: float) -> tuple[str, int, float, float, list]:
    """Train this leg, update by update, until it ends, the session stops or the
    polish's time comes; ``save(finished)`` writes the checkpoint (None: none). Returns
    the stop reason, this call's updates, the steady rate (episodes/s) and the seconds
    it is measured over, and each stint's best."""
    cfg, k = trainer.cfg, trainer.k
    info, stints = run.info, run.stints
    step = trainer.update_fn(run.mode)
    t_run = time.perf_counter()
    t_polish = math.inf  # when training stops for the polish (set after the first update)
    stint_bests: list = []  # each stint's best (score, op placement), for the polish
    n_this = 0
    mean_s = math.nan
    t_steady = t_run
    stop = "episodes"
    while True:
        if run.leg_end is not None and run.update >= run.leg_end:
            stop = "episodes"
            break
        if stop_after_updates is not None and n_this >= stop_after_updates:
            stop = "stopped"
            break
        if session.should_stop():
            stop = session.stop
            break
        now = time.perf_counter()
        if n_this and now >= t_polish:
            stop = "time budget"  # the rest is the polish's (RLConfig.polish_share)
            break
        session.step_started()
        frac = 0.0
        if run.leg_end is not None:
            frac = (run.update - run.leg_start) / max(1, run.leg_end - run.leg_start)
        if math.isfinite(session.deadline) and session.deadline > t_run:
            # Of the time left for training when the loop began (compilation excluded).
            frac = max(frac, (now - t_run) / (session.deadline - t_run))
        # The learning rate warms up again after a restart; entropy follows the run.
        lr, beta = _schedule(cfg, run.update - max(run.leg_start, stints["at"]), frac)
        with jax.enable_x64(True):
            run.state, p_best, s_best, stats = step(
                run.state, jnp.float32(lr), jnp.float32(beta), jnp.float64(run.t_ref))
            p_best, s_best, stats = jax.device_get((p_best, s_best, stats))
        run.update += 1
        n_this += 1
        run.episodes += k
        if n_this == 1:
            t_steady = time.perf_counter()  # after the first update's compilation
            if cfg.polish_batches and math.isfinite(session.deadline):
                t_polish = t_steady + (1 - cfg.polish_share) * (session.deadline - t_steady)
            info.setdefault("first_update_at_s", run.elapsed0 + session.elapsed())
        if math.isnan(run.t_ref):
            run.t_ref = float(stats["t_ref_s"])
        s_best = _verified(trainer, session, run, p_best, float(s_best))
        session.offer(np.asarray(p_best, np.int32), s_best)
        mean_s = float(stats["mean_step_time_s"])
        session.record({"update": run.update, "episodes": run.episodes,
                        "best_step_time_s": session.best_score, "lr": lr,
                        "entropy_weight": beta, **{n: float(v) for n, v in stats.items()}},
                       wall_offset_s=run.elapsed0)
        if cfg.patience:
            t_end = min(t_polish, session.deadline)  # when training ends
            run.state = _stint_step(trainer, run.state, stints, s_best, session,
                                    run.update, lr, info, t_end, p_best, stint_bests)
        session.step_done()  # before validating: a new model's compilation is expected next
        if session.validation_due(run.update) and \
                session.validate(run.update, rescore) is not None:
            # Train on against the corrected model (the next update recompiles).
            step = trainer.update_fn(run.mode)
            if session.best_score < OOM_PENALTY:
                run.t_ref = session.best_score
            info["cost_model_switches"] = info.get("cost_model_switches", 0) + 1
        if save is not None and (run.update % max(1, checkpoint_every) == 0
                                 or session.due("checkpoint", checkpoint_every_s)):
            save(False)
        now = time.perf_counter()
        rate = (n_this - 1) * k / max(now - t_steady, 1e-9) if n_this > 1 else 0.0
        session.show(run.episodes, rate, mean_s, "mean")
    steady_s = time.perf_counter() - t_steady if n_this > 1 else 0.0
    rate = (n_this - 1) * k / steady_s if steady_s > 0 else 0.0
    session.show(run.episodes, rate, mean_s, "mean", force=True)
    session.line.close()
    return stop, n_this, rate, steady_s, stint_bests


def _verified(trainer: Trainer, session: SearchSession, run: Run, p_best,
              s_best: float) -> float:
    """The batch's best score, checked on the host where it would be kept (``exact``
    mode): the event sweep inside the jit can break ties between a free and an
    allocation at equal times differently (XLA fuses the time arithmetic differently),
    so a rare sample near the memory limit can be misjudged there."""
    kept = session.top.ranked()
    if run.mode == "exact" and s_best < (kept[-1][0] if len(kept) >= session.top.k
                                         else math.inf):
        ver = trainer.simulator(True)(np.asarray(p_best)[None])
        s_best = float(ver.step_time_s[0]) + (OOM_PENALTY if ver.oom[0] else 0.0)
        run.info["verified"] = run.info.get("verified", 0) + 1
    return s_best

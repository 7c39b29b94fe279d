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
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from simplace.errors import SimplaceError
from simplace.rl import checkpoint as ckpt
from simplace.rl.features import Units
from simplace.rl.policies import Policy
from simplace.search import OOM_PENALTY, SearchSession, penalised

REWARDS = ("neg", "sqrt", "log")
BASELINES = ("mean", "ema")
OOM_MODES = ("auto", "bound", "exact")
SIMULATORS = ("auto", "numba", "jax")
# With oom="exact": placements flagged by the memory bound that are checked exactly per
# batch at most (see ``Trainer._simulate``), one at a time: the batch size ``train``
# verifies a kept placement with, so the exact simulator compiles once.
EXACT_CHECKS = 4
# Neither episodes nor a time budget given: this many episodes, so that the default run
# is a fixed function of the seed (as ``optimize`` promises).
DEFAULT_EPISODES = 2048
# A stint's best must improve by this fraction to count as progress (module docstring,
# "Restarts"): a converged policy still finds 0.01% gains now and then.
STINT_MIN_GAIN = 1e-3


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Hyperparameters of a REINFORCE run (defaults after Mirhoseini et al., tuned for
    the simulator's cheap rewards: smaller learning rate, batch-mean baseline).

    samples: placements per update (K). reward: "neg" | "sqrt" | "log".
    baseline: "mean" (leave-one-out batch mean) or "ema" (moving average, decay
      ``baseline_decay``). normalize: divide advantages by the batch's reward std.
    lr, lr_end, warmup_updates: Adam's learning-rate schedule. clip_norm: gradient
      clipping by global norm. entropy, entropy_end: entropy weight schedule.
    oom_factor: an OOM placement counts as this many reference step times (at least).
    oom: memory check in the jit, "auto" | "bound" | "exact" (module docstring).
    imitation_steps, imitation_target: warm start by imitation, at most this many Adam
      steps, stopping once the mean per-unit likelihood of the warm start's placement
      reaches ``imitation_target`` (leaving room to explore). A policy with its own
      ``warm_start`` (gnn, seq2seq) is set on the warm start directly instead.
    self_imitation: weight of self-imitation (Oh et al. 2018): every update also raises
      the likelihood of the best placement the run has sampled (or its warm start),
      this weight times its log-likelihood summed over units; 0 turns it off.
    refine_every, refine_batches: every ``refine_every`` updates (0: never) that best
      placement is refined by greedy block moves (``simplace.rl.refine``), at most
      ``refine_batches`` batches of K placements scored; the refined placement becomes
      the target of self-imitation.
    portfolio, patience: restarts (module docstring, "Restarts"): the ``portfolio``
      best distinct warm starts are each trained from in turn, the next once the
      current leg's best has not improved for ``patience`` updates; after them, each
      stalled leg restarts the policy on the run's best placement. ``patience`` 0: one
      leg, no restarts.
    polish_batches, polish_share: at the end of a run each stint's best placement is
      polished by op-level moves (module docstring, "Polish"), at most
      ``polish_batches`` batches of K in all (0: no polish); under a time budget,
      training stops when ``polish_share`` of the time left after the first update
      remains, for the polish.
    simulator: "auto" (the native simulator where numba is installed, else JAX),
      "numba" or "jax" (``simplace.sim.batched_simulator``'s backends). The native one
      scores each batch between the jitted policy and learning steps with exact OOM
      flags (``oom`` then does not matter) and compiles nothing per problem; the JAX
      one compiles the simulator once per problem.
    """

    samples: int = 64
    reward: str = "sqrt"
    baseline: str = "mean"
    baseline_decay: float = 0.9
    normalize: bool = True
    lr: float = 3e-3
    lr_end: float = 3e-4
    warmup_updates: int = 10
    clip_norm: float = 1.0
    entropy: float = 0.3
    entropy_end: float = 1e-2
    oom_factor: float = 10.0
    oom: str = "auto"
    imitation_steps: int = 100
    imitation_target: float = 0.8
    self_imitation: float = 0.5
    refine_every: int = 10
    refine_batches: int = 4
    portfolio: int = 3
    patience: int = 100
    polish_batches: int = 1000
    polish_share: float = 0.2
    simulator: str = "auto"

    def __post_init__(self):
        from simplace._argtypes import check_float, check_int

        for f in dataclasses.fields(self):  # types first: no NaN, no True for a count
            v = getattr(self, f.name)
            if f.type == "int":
                check_int(v, f.name, 1 if f.name == "samples" else 0)
            elif f.type == "float":
                check_float(v, f.name, 0.0)
            elif f.type == "bool" and not isinstance(v, bool | np.bool_):
                raise SimplaceError(f"{f.name} must be True or False, got {v!r}.")
        if int(self.samples) < 1:
            raise SimplaceError(f"samples must be >= 1 (placements per update), got "
                                f"{self.samples}.")
        for name, val, allowed in (("reward", self.reward, REWARDS),
                                   ("baseline", self.baseline, BASELINES),
                                   ("oom", self.oom, OOM_MODES)):
            if val not in allowed:
                raise SimplaceError(f"{name} must be one of {', '.join(allowed)}, got "
                                    f"{val!r}.")
        if not (self.lr > 0 and self.lr_end > 0 and self.clip_norm > 0):
            raise SimplaceError("lr, lr_end and clip_norm must be > 0.")
        if self.entropy < 0 or self.entropy_end < 0 or self.oom_factor < 1:
            raise SimplaceError("entropy weights must be >= 0 and oom_factor >= 1.")
        if int(self.polish_batches) < 0 or not 0 <= float(self.polish_share) < 1:
            raise SimplaceError(f"polish_batches must be >= 0 (0: no polish) and "
                                f"polish_share in [0, 1), got {self.polish_batches} and "
                                f"{self.polish_share}.")
        if int(self.portfolio) < 1 or int(self.patience) < 0:
            raise SimplaceError(f"portfolio must be >= 1 and patience >= 0 (0: no "
                                f"restarts), got {self.portfolio} and {self.patience}.")
        if int(self.refine_every) < 0 or int(self.refine_batches) < 0:
            raise SimplaceError("refine_every and refine_batches must be >= 0 (0: no "
                                "refinement).")
        if self.simulator not in SIMULATORS:
            raise SimplaceError(f"simulator must be one of {', '.join(SIMULATORS)}, got "
                                f"{self.simulator!r}.")
        if not self.self_imitation >= 0:
            raise SimplaceError(f"self_imitation must be >= 0 (0: off), got "
                                f"{self.self_imitation}.")

    @property
    def stint_starts(self) -> int:
        """How many distinct warm starts a run trains from (``portfolio_starts``):
        ``portfolio``, or 1 without restarts (``patience`` 0)."""
        return int(self.portfolio) if self.patience else 1

    @classmethod
    def from_options(cls, options: dict) -> RLConfig:
        """The fields of ``options`` that name config fields (others are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in options.items() if k in names})
        except SimplaceError:
            raise
        except (TypeError, ValueError) as err:  # e.g. samples="abc"
            raise SimplaceError(f"Bad REINFORCE option ({err}): samples and the update "
                                "counts are integers, lr, entropy and the like numbers."
                                ) from None


@dataclasses.dataclass
class TrainResult:
    """best_placement int32[M], best_score (step time, + OOM_PENALTY if OOM), history
    rows (one per update), info (counters, modes, timings)."""

    best_placement: np.ndarray
    best_score: float
    history: list[dict]
    info: dict[str, Any]


class _State(NamedTuple):
    params: Any
    opt_state: Any
    key: Any
    baseline: Any  # float32 scalar; NaN until the first update ("ema")


def _resolve_backend(simulator: str) -> str:
    """``RLConfig.simulator`` resolved: "numba" where it imports (for "auto"), else "jax"."""
    if simulator != "auto":
        return simulator
    try:
        import simplace.sim.native  # noqa: F401
    except ImportError:
        return "jax"
    return "numba"


def _schedule(cfg: RLConfig, update: int, frac: float) -> tuple[float, float]:
    warm = min(1.0, (update + 1) / max(1, cfg.warmup_updates))
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
    lr = warm * (cfg.lr_end + (cfg.lr - cfg.lr_end) * cos)
    beta = cfg.entropy * (cfg.entropy_end / cfg.entropy) ** min(1.0, frac) \
        if cfg.entropy > 0 and cfg.entropy_end > 0 else cfg.entropy * (1 - min(1.0, frac))
    return lr, beta


class Trainer:
    """One policy on one problem: builds the jitted update and runs training loops.

    Args:
      graph: the OpGraph; inputs: its ``SimInputs``; units: ``features.Units``;
      policy: a ``Policy`` over those units; config: ``RLConfig``; seed: int.
    """

    def __init__(self, graph, inputs, units: Units, policy: Policy, config: RLConfig,
                 seed: int = 0):
        self.graph, self.inputs, self.units, self.policy = graph, inputs, units, policy
        self.cfg = config
        self.seed = int(seed)
        self.k = int(config.samples)
        self.unit_of_op = jnp.asarray(units.unit_of_op, jnp.int32)
        self.capacity = np.asarray(inputs.memory_bytes, np.float64)
        self.tx = optax.chain(optax.clip_by_global_norm(config.clip_norm),
                              optax.scale_by_adam())
        # The simulator backend in use, "numba" or "jax" (RLConfig.simulator).
        self.backend = _resolve_backend(config.simulator)
        if inputs.objective != "latency":
            # The throughput objective and rulers score on the host (no traceable JAX
            # function): the native path, which takes exact OOM flags from the call.
            self.backend = "numba"
        self._sims: dict = {}
        self._sims_jit: dict = {}
        self._steps: dict = {}
        self._imitate = None
        # Wall seconds spent in each part of the updates run so far (see update_fn).
        self.timing = {"policy_s": 0.0, "simulator_s": 0.0, "learn_s": 0.0,
                       "refine_s": 0.0, "updates": 0}

    def use_inputs(self, inputs) -> None:
        """Go on against new simulator inputs (a drift-corrected cost model of the same
        machine); the next ``update_fn`` call recompiles."""
        self.inputs = inputs
        self.capacity = np.asarray(inputs.memory_bytes, np.float64)
        self._sims.clear()
        self._sims_jit.clear()
        self._steps.clear()

    # ------------------------------------------------------------------ simulation
    def simulator(self, memory):
        """The batched simulator of this graph and inputs with ``memory`` (as
        ``batched_simulator``), built once per value."""
        from simplace.sim.batched import batched_simulator

        if memory not in self._sims:
            self._sims[memory] = batched_simulator(self.graph, self.inputs, memory=memory,
                                                   backend=self.backend)
        return self._sims[memory]

    def _bound_sim(self):
        """The jitted ``(consts, placements) -> (step_time float64[K], oom bool[K])`` of
        the cheap memory bound (a placement whose bound exceeds a capacity counts as OOM;
        the same margin as the simulator's own screen). Compiled once, shared by
        ``probe`` and every update (one compilation of the simulator per problem)."""
        if "bound" not in self._sims_jit and self.backend == "numba":
            # Exact OOM flags at the bound's cost: the native "oom" mode sweeps only the
            # placements its bound flags.
            native = self.simulator("oom")

            def run_native(p):
                res = native(np.asarray(p))
                return jnp.asarray(res.step_time_s), jnp.asarray(res.oom)

            self._sims_jit["bound"] = run_native
        if "bound" not in self._sims_jit:
            fn, consts = self.simulator("oom").traceable()
            cap = jnp.asarray(self.capacity)

            def run(c, p):
                step, _, _, mem = fn(c, p)
                return step, jnp.any(mem * (1 + 1e-9) > cap[None, :], axis=1)

            jitted = jax.jit(run)
            self._sims_jit["bound"] = lambda p: jitted(consts, p)
        return self._sims_jit["bound"]

    def _simulate(self, mode: str, placements):
        """(step_time float64[K], oom bool[K], unverified bool[K]) of op placements
        int32[K, M], from the jitted memory bound. ``"bound"``: a flagged placement is
        OOM. ``"exact"``: the bound screens, as in ``local``: flagged placements are
        checked with exact peak memory (whose event sweep runs on the host, several
        times slower than the whole bound pass) one at a time, fastest first, until one
        fits, at most ``EXACT_CHECKS``, and only while faster than every unflagged one;
        the rest are ``unverified``: rewarded by their step time, never kept as a best
        placement."""
        step_t, suspect = self._bound_sim()(placements)
        none = jnp.zeros(suspect.shape, bool)
        if mode == "bound" or self.backend == "numba":  # native flags are exact
            return step_t, suspect, none
        step_np, sus = np.asarray(step_t), np.asarray(suspect)
        idx = np.flatnonzero(sus)
        if not len(idx):
            return step_t, none, none
        clear = step_np[~sus].min() if (~sus).any() else np.inf
        oom, unverified = np.zeros_like(sus), sus.copy()
        for i in idx[np.argsort(step_np[idx], kind="stable")][:EXACT_CHECKS]:
            if step_np[i] >= clear:
                break
            res = self.simulator(True)(np.asarray(placements)[i][None])
            unverified[i], oom[i] = False, bool(res.oom[0])
            if not res.oom[0]:
                break
        return step_t, jnp.asarray(oom), jnp.asarray(unverified)

    # ------------------------------------------------------------------ the update
    def _policy_impl(self, params, key, elite):
        """Sample K unit placements; (key, (logp, entropy, the mean log-likelihood of
        ``elite`` per unit), the vjp of those three, unit placements, op placements)."""
        key, k_s = jax.random.split(key)
        sil = self.cfg.self_imitation > 0

        def sampled(p):
            s = self.policy.sample(p, k_s, self.k)
            ll = self.policy.imitation_logp(p, elite) if sil else jnp.float32(0.0)
            return (s.logp, s.entropy, ll), s.unit_devices

        out, vjp_fn, unit_dev = jax.vjp(sampled, params, has_aux=True)
        return key, out, vjp_fn, unit_dev, unit_dev[:, self.unit_of_op]  # [K, M]

    def _learn_impl(self, state: _State, key, out, vjp_fn, unit_dev, placements,
                    step_t, oom, unverified, lr, beta, t_ref):
        cfg, k = self.cfg, self.k
        logp, ent, elite_ll = out
        # t_ref NaN: the first update sets it to this batch's mean step time (of those
        # that fit; of all when none fits).
        fit_t = jnp.where(oom, 0.0, step_t)
        n_fit0 = jnp.sum(~oom)
        first_t = jnp.where(n_fit0 > 0, fit_t.sum() / jnp.maximum(n_fit0, 1), step_t.mean())
        t_ref = jnp.where(jnp.isnan(t_ref), jnp.maximum(first_t, 1e-12), t_ref)
        rel = step_t / t_ref
        slow = jnp.maximum(cfg.oom_factor, jnp.max(jnp.where(oom, 0.0, rel)))
        rel_r = jnp.where(oom, slow, rel)
        if cfg.reward == "neg":
            reward = -rel_r
        elif cfg.reward == "sqrt":
            reward = -jnp.sqrt(rel_r)
        else:
            reward = -jnp.log(jnp.maximum(rel_r, 1e-30))
        reward = reward.astype(jnp.float32)
        mean_r = reward.mean()
        if cfg.baseline == "mean":
            base = (reward.sum() - reward) / (k - 1) if k > 1 else jnp.zeros_like(reward)
            new_baseline = mean_r
        else:
            prev = jnp.where(jnp.isnan(state.baseline), mean_r, state.baseline)
            base = jnp.broadcast_to(prev, reward.shape)
            new_baseline = cfg.baseline_decay * prev + (1 - cfg.baseline_decay) * mean_r
        adv = reward - base
        if cfg.normalize and k > 1:
            adv = adv / (reward.std() + 1e-6)
        adv = jnp.where(oom, jnp.minimum(adv, 0.0), adv)  # OOM is never reinforced
        u = max(1, self.policy.num_units)
        ct_logp = (-adv / k).astype(logp.dtype)
        ct_ent = jnp.full_like(ent, -beta / k)
        mem = state.opt_state
        # Self-imitation: the run's best unit placement before this batch (kept in the
        # optimizer state, so checkpoints carry it; none before the first batch unless
        # warm-started) is made more likely: the loss gets -w x its log-likelihood
        # summed over units.
        w = cfg.self_imitation * self.policy.num_units
        ct_sil = jnp.where(jnp.isfinite(mem["elite_score"]), -w, 0.0).astype(
            elite_ll.dtype)
        (grads,) = vjp_fn((ct_logp, ct_ent, ct_sil))
        # Unverified placements (see _simulate) are never the batch's best.
        score = jnp.where(oom | unverified, step_t + OOM_PENALTY, step_t)
        j = jnp.argmin(score)
        better = score[j].astype(jnp.float32) < mem["elite_score"]
        elite = jnp.where(better, unit_dev[j], mem["elite"])
        elite_score = jnp.where(better, score[j].astype(jnp.float32), mem["elite_score"])
        updates, adam = self.tx.update(grads, mem["adam"], state.params)
        params = jax.tree.map(lambda p, g: p - lr * g, state.params, updates)
        opt_state = {"adam": adam, "elite": elite, "elite_score": elite_score,
                     "updates": mem["updates"] + 1}
        fit = ~oom
        n_fit = jnp.sum(fit)
        stats = {
            "mean_step_time_s": jnp.where(n_fit > 0, jnp.sum(jnp.where(fit, step_t, 0.0))
                                          / jnp.maximum(n_fit, 1), jnp.nan),
            "min_step_time_s": jnp.min(score), "oom_fraction": 1.0 - n_fit / k,
            "reward_mean": mean_r, "entropy": ent.mean() / u,
            "loss": -jnp.mean(adv * logp) - beta * ent.mean(),
            "grad_norm": optax.tree.norm(grads), "t_ref_s": t_ref,
        }
        new = _State(params, opt_state, key, jnp.asarray(new_baseline, jnp.float32))
        return new, placements[j], score[j], stats

    def update_fn(self, mode: str):
        """The update ``(state, lr, beta, t_ref) -> (state, best placement of the batch
        int32[M], its score, stats)``; run it under ``jax.enable_x64(True)``.

        Three calls: the jitted policy step (sampling and the forward half of its
        gradient), the simulator (``_simulate``; compiled once per problem, shared with
        ``probe``) and the jitted learning step (rewards, the backward half, Adam). The
        simulator is kept out of the policy's programs so that it is compiled once,
        not once more inside every program that uses it. The wall time of each part is
        added to ``timing`` (``policy_s``, ``simulator_s``, ``learn_s``, ``updates``)."""
        if mode not in self._steps:
            policy_step = jax.jit(self._policy_impl)
            learn = jax.jit(self._learn_impl)
            timing = self.timing

            def step(state: _State, lr, beta, t_ref):
                t0 = time.perf_counter()
                key, outs, vjp_fn, unit_dev, placements = policy_step(
                    state.params, state.key, state.opt_state["elite"])
                placements.block_until_ready()
                t1 = time.perf_counter()
                step_t, oom, unver = self._simulate(mode, placements)
                jax.block_until_ready(step_t)
                t2 = time.perf_counter()
                out = learn(state, key, outs, vjp_fn, unit_dev, placements, step_t,
                            oom, unver, lr, beta, t_ref)
                jax.block_until_ready(out)
                t3 = time.perf_counter()
                state, p_best, s_best, stats = self._refine(mode, *out)
                t4 = time.perf_counter()
                parts = {"policy_s": t1 - t0, "simulator_s": t2 - t1, "learn_s": t3 - t2,
                         "refine_s": t4 - t3}
                for name, v in parts.items():
                    timing[name] += v
                timing["updates"] += 1
                # In the history too (one row per update): where an update's time goes.
                stats = {**stats, **{f"time_{n}": v for n, v in parts.items()}}
                return state, p_best, s_best, stats

            self._steps[mode] = step
        return self._steps[mode]

    def _score_units(self, mode: str, units) -> np.ndarray:
        """Penalised scores float64[K] of K unit placements int32[K, U]."""
        with jax.enable_x64(True):
            step_t, oom, unver = self._simulate(mode, jnp.asarray(units)[:, self.unit_of_op])
            step_t, oom = jax.device_get((step_t, oom | unver))
        return np.where(oom, step_t + OOM_PENALTY, step_t)

    def _refine(self, mode: str, state: _State, p_best, s_best, stats):
        """Every ``refine_every`` updates: greedy block moves from the elite
        (``simplace.rl.refine``); a better placement becomes the elite and, when it
        beats the batch's best, the update's best placement."""
        from simplace.rl.refine import refine

        cfg = self.cfg
        mem = state.opt_state
        n = int(mem["updates"])
        if not cfg.refine_every or not cfg.refine_batches or n % cfg.refine_every:
            return state, p_best, s_best, {**stats, "refine_gain": 0.0}
        elite, e_score = np.asarray(mem["elite"]), float(mem["elite_score"])
        if not e_score < OOM_PENALTY:  # only placements that fit are refined
            return state, p_best, s_best, {**stats, "refine_gain": 0.0}
        # Each refinement starts where the last one's candidates ended (two boundary
        # shifts per boundary), so a big elite is visited all along, not at its start.
        offset = (n // cfg.refine_every) * (self.k * int(cfg.refine_batches) // 2)
        units, score, _ = refine(lambda c: self._score_units(mode, c), elite, e_score,
                                 self.inputs.num_devices, self.k, int(cfg.refine_batches),
                                 offset=offset)
        gain = (e_score - score) / e_score
        if score < e_score:
            state = state._replace(opt_state={**mem, "elite": jnp.asarray(units, jnp.int32),
                                              "elite_score": jnp.float32(score)})
            if score < float(s_best):
                p_best = jnp.asarray(units[self.units.unit_of_op], jnp.int32)
                s_best = jnp.float64(score)
        return state, p_best, s_best, {**stats, "refine_gain": jnp.float32(max(gain, 0.0))}

    def init_state(self) -> _State:
        """The initial training state: fresh policy parameters, optimizer state, no elite yet, no
        baseline."""
        with jax.enable_x64(True):
            key = jax.random.key(self.seed)
            key, k_init = jax.random.split(key)
            params = self.policy.init(k_init)
            # The optimizer's state, and the best unit placement sampled so far (for
            # self-imitation; none yet: score +inf).
            opt = {"adam": jax.jit(self.tx.init)(params),
                   "elite": jnp.zeros(self.policy.num_units, jnp.int32),
                   "elite_score": jnp.float32(jnp.inf), "updates": jnp.int32(0)}
            return _State(params, opt, key, jnp.float32(jnp.nan))

    # ------------------------------------------------------------------ warm start
    def imitate(self, state: _State, unit_devices, lr: float):
        """Adam steps on the log-likelihood of ``unit_devices`` int32[U]; returns
        (state, steps taken, final mean likelihood per unit)."""
        if self._imitate is None:
            def step(s, target, lr):
                ll, g = jax.value_and_grad(
                    lambda p: self.policy.imitation_logp(p, target))(s.params)
                g = jax.tree.map(lambda x: -x, g)
                upd, adam = self.tx.update(g, s.opt_state["adam"], s.params)
                params = jax.tree.map(lambda p, d: p - lr * d, s.params, upd)
                return s._replace(params=params, opt_state={**s.opt_state, "adam": adam}), ll
            self._imitate = jax.jit(step)
        target_np = np.asarray(unit_devices, np.int32)
        target = jnp.asarray(target_np)
        ll, n = -np.inf, 0
        # The warm start is the first elite of self-imitation, scored as its units
        # expand (K copies: the updates' compiled simulator). Indexing and the score
        # are numpy's: eager JAX ops would each compile a small program.
        p = np.broadcast_to(target_np[self.units.unit_of_op],
                            (self.k, self.graph.num_ops))
        with jax.enable_x64(True):
            step_t, oom = (np.asarray(x) for x in self._bound_sim()(p))
        if oom[0] and self.backend == "jax":  # the bound flagged it: check
            oom = self.simulator(True)(p[:1]).oom
        score = step_t[0] + OOM_PENALTY if oom[0] else step_t[0]
        state = state._replace(opt_state={**state.opt_state, "elite": target,
                                          "elite_score": jnp.float32(score)})
        if hasattr(self.policy, "warm_start"):
            # The policy can put itself on the warm start directly (a bias with a
            # temperature around it): one exact step instead of Adam steps,
            with jax.enable_x64(True):
                params = self.policy.warm_start(state.params, np.asarray(unit_devices))
                # and says how likely the target is on the host (nothing to compile)
                ll = self.policy.host_imitation_logp(params, target_np)
            return state._replace(params=params), 1, math.exp(ll)
        with jax.enable_x64(True):
            for n in range(1, self.cfg.imitation_steps + 1):  # noqa: B007
                state, ll = self._imitate(state, target, lr)
                if math.exp(float(ll)) >= self.cfg.imitation_target:
                    break
        return state, n, math.exp(float(ll)) if np.isfinite(float(ll)) else 0.0

    def restart(self, state: _State, unit_devices, lr: float):
        """The policy put on ``unit_devices`` int32[U] afresh (a restart, module
        docstring): new Adam state and baseline, then ``imitate`` (the target becomes the
        self-imitation elite). The key and the update counter go on."""
        if "adam_init" not in self._steps:
            self._steps["adam_init"] = jax.jit(self.tx.init)
        with jax.enable_x64(True):
            adam = self._steps["adam_init"](state.params)
        state = state._replace(opt_state={**state.opt_state, "adam": adam},
                               baseline=jnp.float32(jnp.nan))
        return self.imitate(state, unit_devices, lr)

    def probe(self, extra=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(placements, penalised step times, bound-suspect flags) of K uniformly random
        unit placements (what an untrained policy draws; from the seed) and ``extra``
        op placements, simulated outside the jit: decides the memory mode."""
        rng = np.random.default_rng([self.seed, 1])
        units = rng.integers(0, self.inputs.num_devices, (self.k, self.policy.num_units))
        p = units[:, self.units.unit_of_op].astype(np.int32)
        if extra is not None and len(extra):
            p = np.concatenate([p, np.asarray(extra, np.int32)])
        if len(p) != self.k:  # another batch size than the updates': the plain simulator
            res = self.simulator("oom")(p)
            suspect = ~np.all(np.isnan(res.peak_memory_bytes), axis=1)
            return p, np.where(res.oom, res.step_time_s + OOM_PENALTY, res.step_time_s), \
                suspect
        # The updates' own jitted simulator (one compilation for both): flags are the
        # bound's, so suspects are scored as OOM (conservative).
        with jax.enable_x64(True):
            step_t, suspect = jax.device_get(self._bound_sim()(jnp.asarray(p)))
        return p, np.where(suspect, step_t + OOM_PENALTY, step_t), np.asarray(suspect)


# ---------------------------------------------------------------------- the run
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


def _fingerprint(graph, trainer: Trainer, policy_kw: dict) -> dict:
    # The simulator's inputs too: a checkpoint scored under another cost model (another
    # machine, or one rewritten by `simplace validate --update`) must not be resumed.
    digest = hashlib.sha256()
    for arr in (trainer.inputs.op_time_s, trainer.inputs.latency_s,
                trainer.inputs.bandwidth_bytes_per_s, trainer.inputs.memory_bytes):
        digest.update(np.ascontiguousarray(arr, dtype=np.float64).tobytes())
    return {"graph": graph.hash, "cost": digest.hexdigest()[:16],
            "policy": trainer.policy.name,
            "units": trainer.policy.num_units, "devices": trainer.inputs.num_devices,
            "seed": trainer.seed, "config": dataclasses.asdict(trainer.cfg),
            "policy_options": {k: (v if isinstance(v, int | float | str) else str(v))
                               for k, v in sorted(policy_kw.items())}}


def _leg(meta: dict | None, update: int, k: int, episodes: int | None,
         budget_s: float | None) -> tuple[int, int | None, bool]:
    """(first update of this leg, its last update or None for a time budget, whether an
    unfinished leg is continued).

    A run is a sequence of legs, one per ``train`` call that trains. A checkpoint of an
    unfinished leg (stopped, interrupted) with an episode target is continued to the same
    target when the call asks for the same episodes: the resumed run then equals the
    uninterrupted one. Anything else (a finished run, another target, a time budget)
    starts a new leg at the checkpoint's update: ``episodes`` more, or ``budget_s`` more
    seconds, with the learning-rate and entropy schedules started afresh."""
    if episodes is None and budget_s is None:
        episodes = DEFAULT_EPISODES
    leg_updates = None if episodes is None else -(-int(episodes) // k)
    if meta is not None:
        leg = meta.get("leg") or {}
        if not meta.get("finished", True) and leg.get("updates") is not None and \
                leg["updates"] == leg_updates and budget_s is None:
            return int(leg["start"]), int(leg["start"]) + leg_updates, True
    return update, None if leg_updates is None else update + leg_updates, False


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
    info: dict[str, Any] = {}
    resumed = bool(checkpoint) and os.path.exists(checkpoint)
    meta = None
    if resumed:
        trees, meta = ckpt.load(checkpoint, {"params": state.params,
                                             "opt_state": state.opt_state})
        if meta["fingerprint"] != json_round(fp):
            raise SimplaceError(f"Checkpoint {checkpoint} was written by another run "
                                "(graph, policy, options or seed differ): delete it or pass "
                                "another checkpoint path.")
        with jax.enable_x64(True):
            key = jax.random.wrap_key_data(jnp.asarray(np.asarray(meta["key"], np.uint32)))
            state = _State(jax.tree.map(jnp.asarray, trees["params"]),
                           jax.tree.map(jnp.asarray, trees["opt_state"]), key,
                           jnp.float32(meta["baseline"] if meta["baseline"] is not None
                                       else np.nan))
        update, done_episodes = meta["update"], meta["episodes"]
        mode, t_ref = meta["mode"], meta["t_ref"]
        for s, p in meta["candidates"]:
            session.offer(np.asarray(p, np.int32), s)
        if meta["best_placement"] is not None:
            session.offer(np.asarray(meta["best_placement"], np.int32), meta["best_score"])
        session.history.extend(meta["history"])
        info = meta["info"]
        stints = meta.get("stints") or {"next": 0, "at": update, "best": math.inf,
                                        "stall": 0, "starts": []}
        stints.pop("t0", None)  # the earlier run's clock
        # This run's clock starts now; history rows go on from the earlier runs' time.
        elapsed0 = meta["wall_s"]
        info["resumed_at_update"] = update
        best = session.best_score
        session.note(f"resuming from checkpoint {checkpoint}: update {update}, "
                     f"{done_episodes} episodes, {elapsed0:.1f} s of training before"
                     + (f", best {best * 1e3:.4g} ms" if math.isfinite(best) and
                        best < OOM_PENALTY else "")
                     + " (delete the file to start afresh)")
    else:
        update = done_episodes = 0
        elapsed0 = 0.0
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
    leg_start, leg_end, continued = _leg(meta, update, k, episodes, budget_s)
    if resumed and not continued:
        info["legs"] = info.get("legs", 1) + 1
    session.line.total = None if leg_end is None else leg_end * k
    step = trainer.update_fn(mode)
    t_run = time.perf_counter()
    t_polish = math.inf  # when training stops for the polish (set after the first update)
    stint_bests: list = []  # each stint's best (score, op placement), for the polish
    n_this = 0
    mean_s = math.nan
    t_steady = t_run

    def save_ckpt(finished: bool):
        if not checkpoint:
            return
        with jax.enable_x64(True):
            key_data = np.asarray(jax.random.key_data(state.key)).tolist()
        bl = float(state.baseline)
        best = session.best
        ckpt.save(checkpoint, {"params": state.params, "opt_state": state.opt_state}, {
            "fingerprint": json_round(fp), "update": update, "episodes": done_episodes,
            "key": key_data, "baseline": None if math.isnan(bl) else bl, "mode": mode,
            "t_ref": t_ref, "best_score": session.best_score,
            "best_placement": None if best is None else best.tolist(),
            "candidates": [(s, c.tolist()) for s, c in session.top.ranked()],
            "history": session.history, "info": info,
            "leg": {"start": leg_start, "updates": None if leg_end is None
                    else leg_end - leg_start},
            "finished": finished, "wall_s": elapsed0 + session.elapsed(),
            "stints": stints})

    def rescore(model, placements):
        """Point the trainer at ``model``; the penalised scores of ``placements``."""
        from simplace.sim import sim_inputs

        trainer.use_inputs(sim_inputs(trainer.graph, model))
        res = trainer.simulator(True)(placements)
        return penalised(res.step_time_s, res.oom)

    stop = "episodes"
    while True:
        if leg_end is not None and update >= leg_end:
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
        if leg_end is not None:
            frac = (update - leg_start) / max(1, leg_end - leg_start)
        if math.isfinite(session.deadline) and session.deadline > t_run:
            # Of the time left for training when the loop began (compilation excluded).
            frac = max(frac, (now - t_run) / (session.deadline - t_run))
        # The learning rate warms up again after a restart; entropy follows the run.
        lr, beta = _schedule(cfg, update - max(leg_start, stints["at"]), frac)
        with jax.enable_x64(True):
            state, p_best, s_best, stats = step(state, jnp.float32(lr), jnp.float32(beta),
                                                jnp.float64(t_ref))
            p_best, s_best, stats = jax.device_get((p_best, s_best, stats))
        update += 1
        n_this += 1
        done_episodes += k
        if n_this == 1:
            t_steady = time.perf_counter()  # after the first update's compilation
            if cfg.polish_batches and math.isfinite(session.deadline):
                t_polish = t_steady + (1 - cfg.polish_share) * (session.deadline - t_steady)
            info.setdefault("first_update_at_s", elapsed0 + session.elapsed())
        if math.isnan(t_ref):
            t_ref = float(stats["t_ref_s"])
        s_best = float(s_best)
        kept = session.top.ranked()
        if mode == "exact" and s_best < (kept[-1][0] if len(kept) >= session.top.k
                                         else math.inf):
            # The host's verdict on a placement that would be kept: the event sweep inside
            # this jit can break ties between a free and an allocation at equal times
            # differently (XLA fuses the time arithmetic differently), so a rare sample
            # near the memory limit can be misjudged there.
            ver = trainer.simulator(True)(np.asarray(p_best)[None])
            s_best = float(ver.step_time_s[0]) + (OOM_PENALTY if ver.oom[0] else 0.0)
            info["verified"] = info.get("verified", 0) + 1
        session.offer(np.asarray(p_best, np.int32), s_best)
        mean_s = float(stats["mean_step_time_s"])
        session.record({"update": update, "episodes": done_episodes,
                        "best_step_time_s": session.best_score, "lr": lr,
                        "entropy_weight": beta, **{n: float(v) for n, v in stats.items()}},
                       wall_offset_s=elapsed0)
        if cfg.patience:
            t_end = min(t_polish, session.deadline)  # when training ends
            state = _stint_step(trainer, state, stints, s_best, session, update, lr, info,
                                t_end, p_best, stint_bests)
        session.step_done()  # before validating: a new model's compilation is expected next
        if session.validation_due(update) and \
                session.validate(update, rescore) is not None:
            # Train on against the corrected model (the next update recompiles).
            step = trainer.update_fn(mode)
            if session.best_score < OOM_PENALTY:
                t_ref = session.best_score
            info["cost_model_switches"] = info.get("cost_model_switches", 0) + 1
        if checkpoint and (update % max(1, checkpoint_every) == 0
                           or session.due("checkpoint", checkpoint_every_s)):
            save_ckpt(False)
        now = time.perf_counter()
        rate = (n_this - 1) * k / max(now - t_steady, 1e-9) if n_this > 1 else 0.0
        session.show(done_episodes, rate, mean_s, "mean")
    steady_s = time.perf_counter() - t_steady if n_this > 1 else 0.0
    rate = (n_this - 1) * k / steady_s if steady_s > 0 else 0.0
    session.show(done_episodes, rate, mean_s, "mean", force=True)
    session.line.close()
    if cfg.polish_batches and stop not in ("interrupted", "stopped") and \
            session.best is not None and session.best_score < OOM_PENALTY:
        _polish(trainer, mode, session, info, stint_bests)
    if session.hook is not None and stop != "interrupted" and \
            session.validate(-1, rescore) is not None:
        info["cost_model_switches"] = info.get("cost_model_switches", 0) + 1
    info.update(stop=stop, updates=update, episodes=done_episodes, samples=k,
                units=trainer.policy.num_units, trained_updates=n_this,
                wall_s=elapsed0 + session.elapsed(), t_ref_s=t_ref,
                # Steady state: from the end of the first update (its compilation) on.
                episodes_per_s=rate if steady_s > 0 else None)
    if checkpoint:
        save_ckpt(stop not in ("stopped", "interrupted"))
    best, best_score = session.best, session.best_score
    if best is None:  # no update ran (interrupted at once): the best random placement
        p, times, _ = trainer.probe()
        j = int(np.argmin(times))
        best, best_score = p[j].astype(np.int32), float(times[j])
    # Where an update's time went (policy, simulator, learning step, refinement).
    info["update_timing"] = {k: float(v) for k, v in trainer.timing.items()}
    return TrainResult(best, best_score, session.history, info)


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


def _stint_step(trainer: Trainer, state: _State, stints: dict, s_best: float,
                session: SearchSession, update: int, lr: float, info: dict,
                t_end: float, p_best, stint_bests: list) -> _State:
    """Count an update against the current stint (``stints``, updated in place) and
    restart the policy once it has stalled ``patience`` updates: on the next portfolio
    start, else on the run's best placement (module docstring, "Restarts")."""
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


def json_round(obj):
    """``obj`` as it reads back from JSON (tuples become lists), for comparisons."""
    import json

    return json.loads(json.dumps(obj))

"""The REINFORCE ``Trainer``: one policy on one problem, its jitted update (sample,
simulate, score, step), the memory checks of its samples, and its warm start by
imitation."""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from simplace.rl.config import RLConfig
from simplace.rl.features import Units
from simplace.rl.policies import Policy
from simplace.search import OOM_PENALTY

# With oom="exact": placements flagged by the memory bound that are checked exactly per
# batch at most (see ``Trainer._simulate``), one at a time: the batch size ``train``
# verifies a kept placement with, so the exact simulator compiles once.
EXACT_CHECKS = 4


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
        """The policy put on ``unit_devices`` int32[U] afresh (a restart:
        ``simplace.rl.reinforce``, "Restarts"): new Adam state and baseline, then
        ``imitate`` (the target becomes the self-imitation elite). The key and the update
        counter go on."""
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

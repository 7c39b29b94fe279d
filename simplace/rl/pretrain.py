"""Training the universal policy over a distribution of graphs and machines.

``train_universal(problems, ...)`` runs REINFORCE over many ``TrainingProblem``s (a
graph, a priced machine, its ``PolicyProblem`` and a native simulator) with one set of
weights: each update takes the next problem of a seeded shuffle, samples ``samples``
unit placements, scores them with the batched simulator (an OOM placement counts
``OOM_FACTOR`` times its step time) and moves the weights by

* the policy gradient with rewards ``-log(step time / best known)``, standardised
  within the batch (problems of very different step times weigh alike), and
* imitation of the best placement known for the problem (a ``local`` search's, given
  as ``target``, replaced whenever a sample beats it), which is what a policy trained
  from scratch on many graphs learns fastest from;

plus an entropy bonus. Updates run in one compiled program per problem bucket
(``PolicyProblem.shape_key``). Training is seeded (the same seed, problems and number
of updates give the same weights), resumable from its checkpoint (``.npz``: weights,
optimizer state, counters and the best placements found) and reports progress.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable

import numpy as np

from simplace.errors import SimplaceError
from simplace.rl.problem import canonical

OOM_FACTOR = 10.0
SAMPLES = 64


@dataclasses.dataclass
class TrainingProblem:
    """One graph on one machine to train on: ``name``, the ``graph``, its ``inputs``
    (``SimInputs``), ``problem`` (``PolicyProblem``), ``simulator`` (native, exact OOM
    flags), and the best unit placement known (``best_units`` int32[U], its penalised
    step time ``best_s``)."""

    name: str
    graph: object
    inputs: object
    problem: object
    simulator: object
    best_units: np.ndarray
    best_s: float

    def score(self, unit_devices) -> np.ndarray:
        """float64[K]: penalised step times of unit placements int[K, U]."""
        res = self.simulator(self.problem.expand(unit_devices))
        t = np.asarray(res.step_time_s, np.float64)
        return np.where(np.asarray(res.oom), t * OOM_FACTOR, t)


def make_training_problem(name: str, graph, inputs, target=None,
                          simulator=None) -> TrainingProblem:
    """A ``TrainingProblem``; ``target`` (an op placement int[M], e.g. ``local``'s) is the
    first imitation target, by a time-weighted majority per unit (default: the fastest
    device for every unit); ``simulator``: the batched simulator to score with (default:
    a native one with exact OOM flags, under the inputs' objective)."""
    from simplace.rl.problem import policy_problem
    from simplace.sim.native import NativeSimulator

    prob = policy_problem(graph, inputs)
    sim = NativeSimulator(graph, inputs, memory="oom") if simulator is None else simulator
    if target is None:
        units = np.full(prob.num_units, int(np.argmin(prob.unit_time_s.sum(0))), np.int32)
    else:
        p = np.asarray(target, np.int64)
        votes = np.zeros((prob.num_units, prob.num_devices))
        np.add.at(votes, (prob.unit_of_op, p), np.asarray(inputs.op_time_s).mean(1) + 1e-12)
        units = votes.argmax(1).astype(np.int32)
    units = canonical(units, prob.device_class)
    tp = TrainingProblem(name, graph, inputs, prob, sim, units, math.inf)
    tp.best_s = float(tp.score(units[None])[0])
    return tp


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    """Settings of ``train_universal``: Adam's ``lr``, the imitation weight
    ``imitation`` and entropy bonus ``entropy`` (both decayed linearly to a tenth over
    the run), ``samples`` per update, ``clip_norm``."""

    lr: float = 1e-3
    imitation: float = 1.0
    entropy: float = 0.01
    samples: int = SAMPLES
    clip_norm: float = 1.0


@functools.lru_cache(maxsize=4)
def programs(cfg: PretrainConfig):
    """(optimizer, sample, update) for ``cfg``: optax's Adam with clipping, and the jitted
    sampling and update functions (each compiled once per problem bucket, kept for the
    process)."""
    import jax
    import optax

    from simplace.rl.policies import universal as net
    from simplace.rl.pretrained import sample_program

    opt = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), optax.adam(cfg.lr))

    def loss(params, a, dev, adv, target, w_il, w_ent):
        # One pass over the samples and the imitation target together.
        lp, ent = net.chain_logp(params, a, jax.numpy.concatenate([dev, target[None]], 0))
        n_u = a["unit_mask"].sum()
        pg = -(adv * lp[:-1]).mean() / n_u
        il = -lp[-1] / n_u
        return pg + w_il * il - w_ent * ent

    def update(params, opt_state, a, dev, adv, target, w_il, w_ent):
        grads = jax.grad(loss)(params, a, dev, adv, target, w_il, w_ent)
        upd, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, upd), opt_state

    return opt, sample_program(int(cfg.samples)), jax.jit(update)


def _pad_units(units: np.ndarray, pad: int) -> np.ndarray:
    out = np.zeros(pad, np.int32)
    out[:len(units)] = units
    return out


def train_universal(problems: list[TrainingProblem], *, updates: int | None = None,
                    budget_s: float | None = None, seed: int = 0,
                    config: PretrainConfig | None = None, params=None,
                    checkpoint: str | None = None, checkpoint_every_s: float = 60.0,
                    progress: Callable[[str], None] | None = None,
                    progress_every_s: float = 30.0,
                    stop_after: int | None = None) -> tuple[dict, dict]:
    """Train the universal policy on ``problems``; returns ``(params, info)``.

    Stops after ``updates`` updates or ``budget_s`` seconds (at least one is needed),
    whichever comes first; the imitation and entropy weights decay over ``updates``
    (else over the budget). ``params``: weights to start from (default: fresh ones from
    ``seed``). ``checkpoint``: a ``.npz`` path resumed from when it exists and written
    every ``checkpoint_every_s`` seconds and at the end; ``stop_after``: stop after that
    many updates in all (to resume later: a run of ``updates`` stopped and resumed gives
    the weights of one that was not). ``info``: updates, wall time,
    per-problem best step times and the learning curve (mean gap of the samples to the
    best known, per 100 updates)."""
    import jax

    from simplace.rl import checkpoint as ckpt
    from simplace.rl.policies import universal as net

    if updates is None and budget_s is None:
        raise SimplaceError("train_universal needs updates or budget_s (or both).")
    if not problems:
        raise SimplaceError("train_universal needs at least one training problem.")
    cfg = config or PretrainConfig()
    opt, sample_fn, update_fn = programs(cfg)
    params = jax.tree.map(jax.numpy.asarray, params if params is not None
                          else net.init_params(seed))
    opt_state = opt.init(params)
    step, curve = 0, []
    names = [p.name for p in problems]
    if checkpoint is not None:
        ckpt.check(checkpoint)
    if checkpoint is not None and os.path.isfile(checkpoint):
        trees, meta = ckpt.load(checkpoint, {"params": params, "opt": opt_state})
        if meta.get("problems") != names:
            raise SimplaceError(f"Checkpoint {checkpoint} was trained on other problems; "
                                "delete it or use another path to start afresh.")
        params, opt_state = trees["params"], trees["opt"]
        step, curve = int(meta["step"]), list(meta["curve"])
        for p, units, s in zip(problems, meta["best_units"], meta["best_s"], strict=True):
            if s < p.best_s:
                p.best_units, p.best_s = np.asarray(units, np.int32), float(s)
    arrays = [{k: jax.numpy.asarray(v) for k, v in p.problem.padded().items()}
              for p in problems]
    total = updates if updates is not None else math.inf
    t0 = time.perf_counter()
    last_ckpt = last_report = t0
    gaps: list[float] = []

    def save():
        if checkpoint is None:
            return
        ckpt.save(checkpoint, {"params": params, "opt": opt_state},
                  {"step": step, "curve": curve, "problems": names,
                   "best_units": [p.best_units.tolist() for p in problems],
                   "best_s": [p.best_s for p in problems], "seed": seed,
                   "config": dataclasses.asdict(cfg)})

    key = jax.random.key(seed)
    while step < total and (stop_after is None or step < stop_after):
        now = time.perf_counter()
        if budget_s is not None and now - t0 >= budget_s:
            break
        # The order of problems is a seeded shuffle per pass (a resumed run continues it).
        n = len(problems)
        order = np.random.default_rng([seed, step // n]).permutation(n)
        i = int(order[step % n])
        prob, a = problems[i], arrays[i]
        frac = min(1.0, step / total) if math.isfinite(total) else min(1.0, (now - t0)
                                                                       / budget_s)
        w_il = cfg.imitation * (1.0 - 0.9 * frac)
        w_ent = cfg.entropy * (1.0 - 0.9 * frac)
        k_step = jax.random.fold_in(key, step)
        dev = np.asarray(sample_fn(params, a, k_step))
        s = prob.score(dev[:, :prob.problem.num_units])
        j = int(np.argmin(s))
        if s[j] < prob.best_s:
            prob.best_s = float(s[j])
            prob.best_units = canonical(dev[j, :prob.problem.num_units],
                                        prob.problem.device_class)
        r = -np.log(s / prob.best_s)
        adv = (r - r.mean()) / (r.std() + 1e-6)
        target = _pad_units(prob.best_units, dev.shape[1])
        params, opt_state = update_fn(params, opt_state, a, dev, adv.astype(np.float32),
                                      target, np.float32(w_il), np.float32(w_ent))
        gaps.append(float(np.exp(-r).mean()))
        step += 1
        if step % 100 == 0:
            curve.append(round(float(np.mean(gaps[-100:])), 4))
        now = time.perf_counter()
        if progress is not None and now - last_report >= progress_every_s:
            last_report = now
            progress(f"update {step}{'' if updates is None else f'/{updates}'}  "
                     f"{now - t0:.0f} s  samples/best {np.mean(gaps[-100:]):.3f}")
        if now - last_ckpt >= checkpoint_every_s:
            save()
            last_ckpt = now
    save()
    info = {"updates": step, "wall_s": round(time.perf_counter() - t0, 1), "curve": curve,
            "best_s": {p.name: p.best_s for p in problems}}
    return jax.tree.map(np.asarray, params), info


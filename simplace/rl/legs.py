"""The legs of a REINFORCE run and their checkpoints: what a run carries from update to
update (``Run``), which problem and options a checkpoint belongs to, how many updates a
call trains, and resuming from and saving to a checkpoint."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from simplace.errors import SimplaceError
from simplace.rl import checkpoint as ckpt
from simplace.rl.trainer import Trainer, _State
from simplace.search import OOM_PENALTY, SearchSession

# Neither episodes nor a time budget given: this many episodes, so that the default run
# is a fixed function of the seed (as ``optimize`` promises).
DEFAULT_EPISODES = 2048


@dataclasses.dataclass
class Run:
    """What a run carries from update to update, and its checkpoint stores.

    state: the trainer's ``_State``. update, episodes: updates and episodes so far (all
    legs). mode: the memory mode of the updates ("bound" or "exact"). t_ref: the
    reward's reference step time (NaN until the first update sets it). info: the
    result's counters and modes. stints: the restarts' bookkeeping
    (``simplace.rl.stints``). elapsed0: seconds of training before this call (a resumed
    run). leg_start, leg_end: this leg's first update and its last (None: a time
    budget), see ``_leg``.
    """

    state: Any
    update: int = 0
    episodes: int = 0
    mode: str = "bound"
    t_ref: float = math.nan
    info: dict = dataclasses.field(default_factory=dict)
    stints: dict = dataclasses.field(default_factory=dict)
    elapsed0: float = 0.0
    leg_start: int = 0
    leg_end: int | None = None


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


def json_round(obj):
    """``obj`` as it reads back from JSON (tuples become lists), for comparisons."""
    import json

    return json.loads(json.dumps(obj))


def _resume(checkpoint: str, fp: dict, state: _State, session: SearchSession
            ) -> tuple[Run, dict]:
    """The run a checkpoint holds, and its metadata; its best placement, kept
    candidates and history go to ``session``. ``state``: a fresh state of the same
    shapes. Raises SimplaceError when another run (``fp``) wrote it."""
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
    return Run(state, update, done_episodes, meta["mode"], meta["t_ref"], info, stints,
               elapsed0), meta


def _save(checkpoint: str, fp: dict, run: Run, session: SearchSession,
          finished: bool) -> None:
    """Write ``run`` and the session's best, candidates and history to ``checkpoint``."""
    state = run.state
    with jax.enable_x64(True):
        key_data = np.asarray(jax.random.key_data(state.key)).tolist()
    bl = float(state.baseline)
    best = session.best
    ckpt.save(checkpoint, {"params": state.params, "opt_state": state.opt_state}, {
        "fingerprint": json_round(fp), "update": run.update, "episodes": run.episodes,
        "key": key_data, "baseline": None if math.isnan(bl) else bl, "mode": run.mode,
        "t_ref": run.t_ref, "best_score": session.best_score,
        "best_placement": None if best is None else best.tolist(),
        "candidates": [(s, c.tolist()) for s, c in session.top.ranked()],
        "history": session.history, "info": run.info,
        "leg": {"start": run.leg_start, "updates": None if run.leg_end is None
                else run.leg_end - run.leg_start},
        "finished": finished, "wall_s": run.elapsed0 + session.elapsed(),
        "stints": run.stints})

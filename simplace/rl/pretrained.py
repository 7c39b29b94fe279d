"""The shipped weights of the universal policy: reading, writing and zero-shot placement.

The weights are one ``.npz`` file (no pickle): the parameter tree flattened as
``simplace.rl.checkpoint`` does, and a JSON ``meta`` entry naming the format version,
the feature widths and op-class vocabulary they were trained with, and the card (what
they were trained on, how long, with which seed, how they score). A file of another
version, of other feature widths, or one that numpy cannot read is refused with a
message that says how to mend it (``load_weights``).

``zero_shot(graph, inputs)`` places a graph with no training: the policy's greedy unit
placement (``universal.greedy``) and ``samples`` sampled ones, of the graph's ops and of
the graph coarsened to ``COARSE_UNITS`` groups (HSDAG's coarsening), and every single
device, scored in one batch by the native simulator, the best kept; optionally improved
by a search whose moves the policy proposes (``simplace.rl.guided``).
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import numpy as np

from simplace.errors import SimplaceError

FORMAT = "simplace.rl.universal-weights"
FORMAT_VERSION = 3  # 2: units are ops, following parents; 3: device ranks
SHIPPED = Path(__file__).parent / "weights" / "universal.npz"
# The policy also places the graph coarsened to these many groups (``target_count`` of
# its chains): whole blocks on one device, which is what a machine whose devices share
# hardware, or a layer graph that wants contiguous stages, needs and what the op-level
# policy finds least (held-out rows: bench/results/pretrained_2026-11-27_vm_coarse.txt).
# Each costs one forward pass and ``samples`` more placements scored.
COARSE_UNITS = (128, 32)


def _spec() -> dict:
    from simplace.rl.problem import (
        CLASS_NAMES,
        DEVICE_FEATURES,
        PAIR_FEATURES,
        UNIT_FEATURES,
    )

    return {"unit_features": UNIT_FEATURES, "device_features": DEVICE_FEATURES,
            "pair_features": PAIR_FEATURES, "op_classes": list(CLASS_NAMES)}


def save_weights(path, params: dict, card: dict) -> None:
    """Write ``params`` and ``card`` (JSON-able: training set, seed, time, scores) to
    ``path`` (``.npz``) atomically."""
    from simplace.rl.checkpoint import _flatten

    flat: dict = {}
    _flatten({k: {kk: np.asarray(vv) for kk, vv in v.items()} for k, v in params.items()},
             "params", flat)
    flat["meta"] = np.array(json.dumps({"format": FORMAT, "version": FORMAT_VERSION,
                                        **_spec(), "card": card}))
    path = os.fspath(path)
    tmp = path + ".tmp.npz"
    np.savez_compressed(tmp, **flat)
    os.replace(tmp, path)


def load_weights(path=None) -> tuple[dict, dict]:
    """``(params, meta)`` of a weights file (default: the shipped one); SimplaceError
    saying what is wrong and how to mend it for a missing, corrupted or incompatible
    file."""
    from simplace.rl.checkpoint import _unflatten

    path = SHIPPED if path is None else Path(path)
    mend = ("Reinstall simplace for the shipped weights, or train new ones with "
            "`simplace train-policy --out FILE` and pass them with weights=FILE.")
    if not path.is_file():
        raise SimplaceError(f"No policy weights at {path}. {mend}")
    try:
        with np.load(path, allow_pickle=False) as f:
            flat = {k: f[k] for k in f.files}
        meta = json.loads(str(flat.pop("meta")))
    except Exception as err:  # noqa: BLE001 - zipfile, numpy and JSON errors alike
        raise SimplaceError(f"Cannot read the policy weights {path} "
                            f"({type(err).__name__}): the file is damaged or not a weights "
                            f"file. {mend}") from None
    if meta.get("format") != FORMAT or meta.get("version") != FORMAT_VERSION:
        raise SimplaceError(f"{path} holds weights of format {meta.get('format')!r} "
                            f"version {meta.get('version')!r}; this simplace reads "
                            f"{FORMAT!r} version {FORMAT_VERSION}. {mend}")
    spec = _spec()
    wrong = [k for k, v in spec.items() if meta.get(k) != v]
    if wrong:
        raise SimplaceError(f"{path} was trained on other policy inputs ({', '.join(wrong)} "
                            f"differ from this simplace's). {mend}")
    params = _unflatten(flat, "params")
    try:
        _check_params(params)
    except (KeyError, ValueError, TypeError) as err:
        raise SimplaceError(f"{path} does not hold a complete set of policy weights "
                            f"({err}). {mend}") from None
    return params, meta


def _check_params(params: dict) -> None:
    from simplace.rl.policies import universal as net

    fresh = net.init_params(0, hidden=params["unit_in"]["kernel"].shape[1],
                            layers=net.num_layers(params))
    for k, v in fresh.items():
        for kk, arr in v.items():
            got = params[k][kk]
            if got.shape != arr.shape or not np.all(np.isfinite(got)):
                raise ValueError(f"{k}/{kk} has shape {got.shape} or non-finite values")


@functools.lru_cache(maxsize=4)
def cached_weights(path: str):
    """``load_weights(path)`` with the parameters as JAX arrays, read once per process."""
    import jax

    params, meta = load_weights(path)
    return jax.tree.map(jax.numpy.asarray, params), meta


@functools.lru_cache(maxsize=8)
def sample_program(num_samples: int):
    """``f(params, a, key) -> int32[K, U]`` (numpy): ``num_samples`` unit placements of
    the padded problem ``a``, drawn by a jitted ``universal.draw`` (kept per process)
    and resolved on the host."""
    import jax

    from simplace.rl.policies import universal as net

    drawn = jax.jit(lambda params, a, key: net.draw(params, a, key, num_samples))

    def sample(params, a, key):
        fresh, follow = drawn(params, a, key)
        return net.resolve(np.asarray(fresh), np.asarray(follow), np.asarray(a["parent"]))

    return sample


@functools.lru_cache(maxsize=1)
def _logits_program():
    import jax

    from simplace.rl.policies import universal as net

    return jax.jit(net.logits)


def _problems(graph, inputs, coarse=COARSE_UNITS):
    """``(problems, free)``: the policy's problems of the graph's ops and of the graph
    coarsened to each of ``coarse`` group counts below its unit count, and
    ``colocate_free_ops(graph)`` where it was needed (else None)."""
    from simplace.rl.problem import policy_problem

    problems = [policy_problem(graph, inputs)]
    coarse = [k for k in coarse if k < problems[0].num_units]
    free = None
    if coarse:
        from simplace.groups import colocate_free_ops, target_count

        free = colocate_free_ops(graph)
        problems += [policy_problem(graph, inputs, grouping=target_count(graph, k, free))
                     for k in coarse]
    return problems, free


def _device_arrays(prob, shape) -> dict:
    """The problem's arrays padded to ``shape`` (the op problem's, so that its compiled
    programs serve every problem of the graph), as JAX arrays."""
    import jax

    return {k: jax.numpy.asarray(v) for k, v in prob.padded(at_least=shape).items()}


def _levels(graph, logits: list, free=None) -> list:
    """The guided search's levels (``simplace.rl.guided.Level``) of ``logits``, one
    ``(logits[U_pad, D_pad], problem)`` per problem, the first of the graph's ops, and
    the graph's group levels (``guided.group_levels``) with the first's probabilities."""
    from scipy.special import softmax

    from simplace.rl.guided import Level, group_levels

    lv = [Level(softmax(np.asarray(lg[:prob.num_units, :prob.num_devices], np.float64),
                        axis=1), prob.unit_of_op)
          for lg, prob in logits]
    return lv + group_levels(graph, lv[0].probs[lv[0].unit_of_op], free)


def policy_levels(graph, inputs, params, coarse=COARSE_UNITS) -> list:
    """The levels of the guided search (``simplace.rl.guided.refine``) that the policy
    ``params`` proposes on this graph and machine: its device probabilities for the
    graph's ops, for its coarse blocks, and for its module subtrees and chain ranges."""
    problems, free = _problems(graph, inputs, coarse)
    shape = problems[0].shape_key()
    logits = []
    for prob in problems:
        a = _device_arrays(prob, shape)
        logits.append((np.asarray(_logits_program()(params, a)[0]), prob))
    return _levels(graph, logits, free)


def zero_shot(graph, inputs, *, samples: int = 64, seed: int = 0, weights=None,
              simulator=None, screen=None, coarse=COARSE_UNITS,
              refine_until: float | None = None, refine_rounds: int | None = None,
              rivals=()) -> tuple[np.ndarray, dict]:
    """``(placement int32[M], info)``: the best of the policy's greedy placement and
    ``samples`` sampled ones, of the ops and of the graph coarsened to each of ``coarse``
    group counts (those below its op count), and every single device, no training.
    ``weights``: a weights file (default: the shipped ones); ``simulator``: a batched
    simulator of ``graph`` on ``inputs`` to score with (default: a native one with exact
    OOM flags); ``screen``: one without memory (``memory=False``) that the resampling
    ranks its neighbours with, checking only the fastest with ``simulator`` (default:
    a native one when ``simulator`` is the default, else none). With ``refine_rounds``,
    the best is then improved by that many rounds of policy-guided resampling
    (``simplace.rl.guided``; fewer if it converges, or if a round would end after
    ``refine_until``, a ``time.perf_counter()`` deadline; ``info["refine"]``).
    ``rivals``: ``(label, placement int[M])`` pairs, such as cheap heuristics', scored in
    the batch too; under a deadline the resampling races the best of the policy's and
    single-device rows with the fastest distinct rivals that beat it
    (``simplace.rl.guided.race``, ``race_lanes``). ``info``: the step time, units, how
    many placements were scored, which kind won (``picked``, ``picked_units``; a rival's
    label; ``"refined"`` when the resampling improved it), the batch's best (``batch_s``)
    and the seconds spent."""
    import jax

    from simplace.rl.policies import universal as net

    t0 = time.perf_counter()
    path = os.fspath(SHIPPED if weights is None else weights)
    params, meta = cached_weights(path)
    problems, free = _problems(graph, inputs, coarse)
    # The coarse problems are padded as the first is: its compiled programs serve them
    # (a bucket of their own would compile two more on a process's first call).
    shape = problems[0].shape_key()
    key = jax.random.key(seed)
    cands, kinds = [], []  # op placements, and (kind, units) per row
    levels = []  # the policy's device probabilities per level, for the resampling
    for prob in problems:
        a = _device_arrays(prob, shape)
        lg, f = _logits_program()(params, a)
        levels.append((np.asarray(lg), prob))
        greedy = net.greedy(np.asarray(lg)[:, :prob.num_devices], np.asarray(f), a["parent"],
                            prob.num_units)
        units = [greedy[None]]
        if samples > 0:
            units.append(np.asarray(sample_program(int(samples))(params, a, key)
                                    )[:, :prob.num_units])
        units = np.concatenate(units, 0)
        cands.append(prob.expand(units))
        kinds += [("greedy" if r == 0 else "sample", prob.num_units) for r in range(len(units))]
    # Every single device too (D cheap rows of the batch): a placement that loses to one
    # device is never the answer.
    d, m = int(inputs.num_devices), graph.num_ops
    cands.append(np.repeat(np.arange(d, dtype=np.int32)[:, None], m, 1))
    kinds += [("single device", m)] * d
    own = len(kinds)  # the rows before the rivals'
    for label, p in rivals:
        cands.append(np.asarray(p, np.int32).reshape(1, m))
        kinds.append((str(label), m))
    placements = np.concatenate(cands, 0).astype(np.int32)
    if simulator is None:
        from simplace.sim.native import NativeSimulator

        simulator = NativeSimulator(graph, inputs, memory="oom")
        if screen is None:
            screen = NativeSimulator(graph, inputs, memory=False)

    def scores(batch):
        res = simulator(batch)
        t = np.asarray(res.step_time_s, np.float64)
        # A placement that does not fit ranks behind every one that does.
        return t, np.where(np.asarray(res.oom), np.inf, t)

    t, score = scores(placements)
    j = int(np.argmin(score)) if np.isfinite(score).any() else int(np.argmin(t))
    best, best_t = placements[j], float(t[j])
    info = {"units": problems[0].num_units, "scored": len(placements), "greedy_s": float(t[0]),
            "batch_s": best_t, "picked": kinds[j][0], "picked_units": kinds[j][1]}
    if np.isfinite(score[j]) and refine_rounds:
        from simplace.rl.guided import race, race_lanes, refine

        lv = _levels(graph, levels, free)
        exact = lambda b: scores(b)[1]  # noqa: E731
        fast = None if screen is None else (lambda b: screen(b).step_time_s)
        # the race's first lane: the best of the policy's rows and the single devices
        k = int(np.argmin(score[:own]))
        lanes = [] if refine_until is None or not np.isfinite(score[k]) else race_lanes(
            (kinds[k][0], placements[k], float(score[k])),
            [(kinds[r][0], placements[r], float(score[r])) for r in range(own, len(kinds))])
        if len(lanes) > 1:
            out, out_s, info["refine"] = race(lv, lanes, exact, src=graph.src, dst=graph.dst,
                                              until=refine_until, seed=seed, screen=fast)
        else:
            out, out_s, info["refine"] = refine(
                lv, best, float(score[j]), exact, src=graph.src, dst=graph.dst, seed=seed,
                until=refine_until, rounds=refine_rounds, screen=fast)
        if out_s < score[j]:
            best, best_t = out, float(out_s)
            info["picked"] = "refined"
    # (a refined placement fits: only one that fits is refined, and only by ones that fit)
    info.update(step_time_s=best_t, oom=not np.isfinite(score[j]),
                wall_s=time.perf_counter() - t0, weights=path,
                trained=meta.get("card", {}).get("summary", ""))
    return best, info


"""Fitting the cost model to whole placed steps measured in context.

Segments timed alone and calls timed one by one miss what a real step adds: on a small
host the devices' work competes with the host thread for the same cores, a call's host
time depends on what ran just before it, and XLA:CPU runs a whole-graph computation
faster than the sum of its pieces. ``calibrate`` therefore also times whole steps of
placements of its models (``host`` records: scattered windows of ops, random runs, the
whole graph on one device), and ``fit_steps`` fits one scale of each kind of
``simplace.scales.KINDS`` (``SCALES``) to them, with the simulator itself as the model
of a step:

* ``compute``: every in-segment op cost (rates, per-op and unfused costs),
* ``launch``: each segment's launch (``launch_s`` and ``parallel_launch_s``),
* ``link``: each copy's duration (latency and bytes over bandwidth): the links are
  timed blocking, one copy at a time, which on CPU devices includes waking the
  receiving side; in a pipelined step copies overlap and cost less,
* ``host``: the host time of each segment call and ``jax.device_put`` call
  (``Device.dispatch_s``, ``CostModel.put_s``; their ratio is what the calls timed in
  context say: in steps they are nearly collinear, one call of each per scattered op),
* ``argument``: the host time of each parameter and graph output a call passes
  (``Device.argument_s``).

The fit is ``simplace.scales.fit_scales``, the one fitter that validation's drift fit
calls too: robust least squares (soft-L1 on log step-time ratios) with a weak pull of
each log scale towards 0 (the pieces' own figures) so that a scale the steps cannot see
stays where the pieces put it. A scale no measured step is sensitive to is reported as
not pinned (with the measurement that would pin it), and a fitted scale beyond
``MAX_SCALE`` either way is refused. Scales that predict the held-out steps no better
than the pieces alone are rejected (every scale stays 1): the fit is kept only where it
is seen to help. The scales kept are baked into the model's figures
(``scaled_model``).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from simplace.calibrate.fit import rel_errors
from simplace.errors import CalibrationError
from simplace.scales import (
    KINDS,
    SHAPES,
    Scales,
    Step,
    bake_scales,
    fit_scales,
    predict_steps,
    scale_sensitivity,
)

SCALES = KINDS  # the kinds of simplace.scales, in the order the report lists them
# A fitted scale beyond this factor either way means the pieces and the steps disagree
# about the machine: the fit is refused rather than written.
MAX_SCALE = 10.0
# A scale is pinned when, on at least one measured step, the simulated step time
# moves by this fraction of the scale's own change (d log step / d log scale).
MIN_SENSITIVITY = 0.15
# Weight of the pull of each log scale towards 0 (the pieces' own figures), against
# the soft-L1 cost of the log residuals: a factor 2 costs about what one step 20% off
# does, so a few noisy steps cannot drag a scale far from what the pieces measured.
PRIOR_WEIGHT = 0.02
# Scale of the robust loss on log ratios: beyond ~10% residuals count linearly.
F_SCALE = 0.1

# What to measure again when a scale is not pinned.
_REMEDY = {
    "host": "no measured step spends its time dispatching segments and device_puts: "
            "time host steps of placements that scatter ops over two devices or more "
            "(calibrate --models with a model of 100+ ops)",
    "compute": "no measured step spends its time in op costs: time host steps that put "
               "a whole model on one device (calibrate --models with a larger model)",
    "launch": "no measured step spends its time in segment launches",
    "link": "no measured step waits for copies between devices: time host steps of "
            "placements that cut a model into runs on two devices or more",
    "argument": "no measured step passes many parameters to one call: time host steps "
                "that put a whole model on one device",
}


def scaled_model(model, scales: Scales | Mapping[str, float]):
    """``model`` (a ``CostModel``) with ``scales`` baked into its figures
    (``simplace.scales.bake_scales``): a ``Scales``, or one factor per kind of
    ``SCALES`` for every device and link (missing: 1)."""
    if not isinstance(scales, Scales):
        scales = Scales.uniform(model.num_devices, **scales)
    return bake_scales(model, scales)


def _per_kind(scales: Scales) -> dict[str, float]:
    """The one value of each kind of a fit that shares every kind."""
    eye = np.eye(scales.num_devices, dtype=bool)
    one = {"one": lambda v: v, "device": lambda v: v[0],
           "link": lambda v: v[~eye][0] if eye.size > 1 else 1.0}
    return {k: float(one[SHAPES[k]](scales.factor(k))) for k in SCALES}


def step_graphs(records: Sequence[Mapping]) -> tuple[dict[str, Any], list[str]]:
    """``({graph hash: OpGraph}, notes)``: the graphs of the models whose whole steps
    ``records`` hold, traced again (zoo names and ``file.py:factory`` specs, small,
    training, as ``calibrate`` runs them). A model that cannot be traced here, or that
    traces to another graph than the one measured, is left out with a note."""
    from simplace.models import load_function
    from simplace.trace import trace

    wanted: dict[str, set[str]] = {}
    for r in records:
        if r.get("kind") == "host" and "graph_hash" in r:
            wanted.setdefault(r["model"], set()).add(r["graph_hash"])
    graphs, notes = {}, []
    for m, hashes in sorted(wanted.items()):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # trace notes do not matter here
                fn, args = load_function(m, small=True, abstract=True, training=True)
                g = trace(fn, *args, name=m)
        except Exception as err:  # noqa: BLE001 - a model that cannot be traced is noted
            notes.append(f"{m}: not traced here ({type(err).__name__}: {str(err)[:120]}); "
                         "its steps are left out of the step fit")
            continue
        if g.hash not in hashes:
            notes.append(f"{m}: traces to graph {g.hash[:12]}..., not the one measured "
                         f"({sorted(hashes)[0][:12]}...): another simplace or JAX version; "
                         "its steps are left out of the step fit")
            continue
        graphs[g.hash] = g
    return graphs, notes


@dataclasses.dataclass(frozen=True)
class StepFit:
    """The result of ``fit_steps``.

    scales: ``{host, argument, compute, launch, link}``, each a factor on the
      model's figures, for every device and link (``scaled_model`` bakes them in).
    pinned: the scales some measured step is sensitive to (the others stay at 1);
      empty when the fit was rejected.
    report: ``{"fitted", "held_out", "before", "held_out_before"}`` errors (``n``,
      median and p90 of ``|predicted / measured - 1|``; ``held_out_before``: the
      held-out steps with every scale at 1), ``sensitivity`` (largest d log step / d
      log scale per scale), ``not_pinned`` (scale -> what to measure), ``steps`` and
      ``graphs``; ``rejected`` (why) and ``rejected_scales`` when the fitted scales
      predicted the held-out steps no better than scales of 1 (then every scale is 1).
    """

    scales: dict[str, float]
    pinned: tuple[str, ...]
    report: dict[str, Any]


def fit_steps(model, steps: Sequence[Mapping], graphs: Mapping[str, Any], *,
              held_out_fraction: float = 0.25, seed: int = 0) -> StepFit:
    """Fit one scale of each kind of ``SCALES`` so that the simulator (``simplace.sim``)
    on ``scaled_model(model, scales)`` predicts the measured whole steps.

    Args:
      model: the ``CostModel`` built from the pieces (segments, calls, links).
      steps: ``host`` records with ``graph_hash``, ``assignment`` and ``timing``.
      graphs: ``{hash: OpGraph}`` of those records (``step_graphs``).
      held_out_fraction: a random part of the steps (seeded) left out of the fit and
        reported (``report["held_out"]``).

    Raises CalibrationError when fewer than 4 steps can be simulated, or when a fitted
    scale is beyond ``MAX_SCALE`` either way (the message names what to measure again).
    """
    from simplace.hardware.timing import Timing

    items = _measured_steps(model, steps, graphs, Timing)
    if len(items) < 4:
        raise CalibrationError(
            f"Only {len(items)} whole steps can be simulated (4 needed) to fit host and "
            "compute costs in context: calibrate again (without a tight --budget-s) so "
            "that each model's host steps are measured.")
    meas = np.array([st.measured_s for st in items])
    rng = np.random.default_rng(seed)
    held = rng.random(len(items)) < held_out_fraction
    if held.all() or (~held).sum() < 4:
        held[:] = False
    fitted_on = [st for st, h in zip(items, held, strict=True) if not h]
    # One value per kind: the steps of a few small models cannot tell devices apart.
    opts = dict(share={k: "all" for k in SCALES}, loss="soft_l1",
                f_scale=F_SCALE, prior_weight=PRIOR_WEIGHT, limit=MAX_SCALE ** 1.5,
                max_nfev=60)
    fit = fit_scales(fitted_on, **opts)
    # Which scales the steps can pin at all, at the fit: a scale no step sees is not the
    # steps' to set: back to the pieces' figure, and the others fitted again without it.
    sens = scale_sensitivity(items, fit.scales)
    loose = [k for k in SCALES if sens[k] < MIN_SENSITIVITY]
    if loose:
        start = Scales.uniform(model.num_devices, **{
            k: v for k, v in _per_kind(fit.scales).items() if k not in loose})
        fit = fit_scales(fitted_on, kinds=[k for k in SCALES if k not in loose],
                         start=start, **opts)
    scales = _per_kind(fit.scales)
    bad = {k: v for k, v in scales.items() if not 1 / MAX_SCALE <= v <= MAX_SCALE}
    if bad:
        k, v = next(iter(bad.items()))
        raise CalibrationError(
            f"The whole steps measured in context need the {k} costs scaled by {v:.3g}, "
            f"beyond {MAX_SCALE:g}x either way: the pieces (segments and calls timed one by "
            "one) and the steps disagree about this machine. Calibrate again on an idle "
            "machine (--overwrite); if it persists, the simulator misses what these steps "
            "do.")
    pred_before = predict_steps(items, Scales.identity(model.num_devices))
    pred_after = predict_steps(items, fit.scales)
    pinned = tuple(k for k in SCALES if k not in loose)
    # The scales must predict steps they were not fitted to better than the pieces
    # alone do; on a noisy host a few steps slowed by something else can pull them the
    # wrong way (on the 2-core VM the fit raised host costs 16% and made held-out steps
    # worse). Then the pieces' own figures stand, and the report says so.
    held_before = rel_errors(pred_before[held], meas[held])
    held_after = rel_errors(pred_after[held], meas[held])
    rejected = None
    if held.any() and held_after["median_rel_error"] >= held_before["median_rel_error"]:
        rejected = (f"the fitted scales predict the {int(held.sum())} held-out steps "
                    f"{100 * held_after['median_rel_error']:.1f}% off (median), no better "
                    f"than the pieces alone ({100 * held_before['median_rel_error']:.1f}%): "
                    "left at 1")
        fitted_scales = scales
        scales = {k: 1.0 for k in SCALES}
        pinned = ()
    report = {
        "steps": len(items), "graphs": len({id(st.inputs) for st in items}),
        "scales": scales,
        "before": rel_errors(pred_before, meas),
        "fitted": rel_errors(pred_after[~held], meas[~held]),
        "held_out": held_after,
        "held_out_before": held_before,
        **({"rejected": rejected, "rejected_scales": fitted_scales} if rejected else {}),
        "sensitivity": sens,
        "not_pinned": {k: _REMEDY.get(k, f"no measured step spends its time in {k} costs")
                       for k in loose},
        "solver": fit.solver,
    }
    return StepFit(scales, pinned, report)


def _measured_steps(model, steps: Sequence[Mapping], graphs: Mapping[str, Any],
                    timing) -> list[Step]:
    """The records of ``steps`` that can be simulated on ``model``, as measured steps
    (each graph priced once)."""
    from simplace.sim.inputs import sim_inputs

    priced, items = {}, []
    for r in steps:
        g = graphs.get(r.get("graph_hash"))
        if g is None or "assignment" not in r:
            continue
        a = np.asarray(r["assignment"], dtype=np.int32)
        if a.shape != (g.num_ops,) or a.min(initial=0) < 0 or \
                a.max(initial=0) >= model.num_devices:
            continue
        if g.hash not in priced:
            priced[g.hash] = sim_inputs(g, model)
        items.append(Step(g, priced[g.hash], a, timing.from_dict(r["timing"]).median_s))
    return items

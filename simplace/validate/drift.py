"""Drift corrections: fit the cost model's corrections to measured step times.

``fit_drift(records, graphs, cost_model, held_out=...)`` fits the model's drift
corrections, a ``simplace.scales.Scales`` (per-device compute and launch scales,
per-link copy scales, the host's call and call-argument scales), to validation records
with the one fitter of scales, ``simplace.scales.fit_scales``: least squares on the log
ratio of simulated to measured step time, re-simulating every record, with exact
subgradients from each record's critical path. Calibration's step fit calls the same
fitter, so a scale means the same thing in both. Corrections are fitted on the
*uncorrected* model, so they never compound, and appended to the corrections' history
with what they were fitted on. The error of the raw (uncorrected) and the corrected
model is reported side by side on the records fitted and on held-out ones, so a
correction that does not generalise shows.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import weakref
from collections.abc import Mapping, Sequence

import numpy as np

from simplace.cost_model import CostModel
from simplace.errors import SimplaceError
from simplace.graph import OpGraph
from simplace.placement import check_placement
from simplace.scales import (
    COVERS,
    KINDS,
    SHAPES,
    Scales,
    Step,
    apply_scales,
    fit_scales,
    predict_steps,
)
from simplace.sim.inputs import SimInputs
from simplace.validate.metrics import fmt_pct, fmt_tau, kendall_tau, mape

__all__ = ["FIT_PARAMS", "DriftFit", "fit_drift", "priced_with_raw", "raw_model"]

FIT_PARAMS = KINDS
# The kinds' names before one Scales served calibration and validation alike.
_RENAMED = {"compute_scale": "compute", "extra_overhead_s": "launch",
            "link_scale": "link", "host_scale": "host"}


def _steps(records: Sequence[dict], graphs: Mapping[str, OpGraph], base: CostModel
           ) -> list[Step]:
    """The records as measured steps of ``base``, each graph priced once."""
    out = []
    for k, r in enumerate(records):
        h = r["graph_hash"]
        if h not in graphs:
            raise SimplaceError(
                f"fit_drift: record {k} ({r.get('graph_name', '?')}) is for graph "
                f"{h[:12]}..., which was not given: pass graphs={{hash: OpGraph}} for "
                "every graph the records name (trace the same models and sizes).")
        if list(r["device_names"]) != list(base.device_names):
            raise SimplaceError(
                f"fit_drift: record {k} was measured on devices {r['device_names']}, "
                f"but cost model '{base.name}' has {base.device_names}.")
        g = graphs[h]
        a = check_placement(r["assignment"], g.num_ops, base.num_devices)
        out.append(Step(g, base.price(g), a, float(r["measured_step_time_s"])))
    return out


def _kinds(params: Sequence[str], what: str) -> tuple[str, ...]:
    renamed = [p for p in params if p in _RENAMED]
    if renamed:
        raise SimplaceError(f"fit_drift: {what} {renamed[0]!r} is now called "
                            f"{_RENAMED[renamed[0]]!r} (the kinds are {', '.join(KINDS)}).")
    unknown = [p for p in params if p not in KINDS]
    if unknown:
        raise SimplaceError(f"fit_drift: unknown parameter kind(s) {unknown} in {what}; "
                            f"choose from {', '.join(KINDS)}.")
    return tuple(params)


@dataclasses.dataclass(frozen=True, eq=False)
class DriftFit:
    """The result of ``fit_drift``.

    cost_model: the given model with the fitted corrections (history extended).
    corrections: those corrections.
    fit: error of the records fitted on: ``{"n", "mape_raw", "tau_raw", "mape_previous",
      "tau_previous", "mape_corrected", "tau_corrected"}``: the uncorrected model (raw),
      the model as given (its previous corrections; the same as raw when it had none)
      and the fitted corrections. held_out: the same on held-out records (None if none).
    entry: the history entry appended to the corrections (what was fitted, on what).
    """

    cost_model: CostModel
    corrections: Scales
    fit: dict
    held_out: dict | None
    entry: dict

    def summary(self) -> str:
        """Lines for people: the fitted and held-out scores and every correction."""
        c = self.corrections
        lines = [_score_line("fitted", self.fit)]
        if self.held_out is not None:
            lines.append(_score_line("held-out", self.held_out))
        for k in KINDS:
            v, what = c.factor(k), COVERS[k]
            if SHAPES[k] == "device":
                lines.append(f"{k}_scale ({what}) " + " ".join(f"{x:.3f}" for x in v))
            elif SHAPES[k] == "link":
                off = v[~np.eye(c.num_devices, dtype=bool)]
                lines.append(f"{k}_scale ({what}) min {off.min():.3f} median "
                             f"{np.median(off):.3f} max {off.max():.3f}" if off.size
                             else f"{k}_scale (one device)")
            elif k == "host" and c.argument_scale == v:  # tied, as fit_drift fits them
                lines.append(f"{k}_scale ({what}, {COVERS['argument']}) {v:.3f}")
            elif k != "argument" or v != c.host_scale:
                lines.append(f"{k}_scale ({what}) {v:.3f}")
        return "\n".join(lines)


def _score_line(name: str, s: dict) -> str:
    """``name n=.. MAPE raw x% -> corrected y%   Kendall tau raw a -> corrected b``, and
    the previous corrections' figures when they differ from raw."""
    line = (f"{name:<9} n={s['n']:<3} MAPE raw {fmt_pct(s['mape_raw']):>6} -> corrected "
            f"{fmt_pct(s['mape_corrected']):>6}   Kendall tau raw {fmt_tau(s['tau_raw'])} "
            f"-> corrected {fmt_tau(s['tau_corrected'])}")
    if s.get("mape_previous") is not None and s["mape_previous"] != s["mape_raw"]:
        line += (f"   (previous corrections: MAPE {fmt_pct(s['mape_previous'])}, tau "
                 f"{fmt_tau(s['tau_previous'])})")
    return line


def _scores(pred_raw, pred_previous, pred_corrected, meas) -> dict:
    return {"n": int(len(meas)),
            "mape_raw": mape(pred_raw, meas), "tau_raw": kendall_tau(pred_raw, meas),
            "mape_previous": mape(pred_previous, meas),
            "tau_previous": kendall_tau(pred_previous, meas),
            "mape_corrected": mape(pred_corrected, meas),
            "tau_corrected": kendall_tau(pred_corrected, meas)}


# The raw model of each corrected model alive: one object per corrected model, so that
# a validation and its drift fits price the raw problem once (``CostModel.price`` caches
# per model object). Keyed by id, with a weak reference that drops the entry with it.
_RAW: dict[int, tuple[weakref.ref, CostModel]] = {}


def raw_model(cost_model: CostModel) -> CostModel:
    """``cost_model`` without drift corrections (itself when it has none); the same object
    for the same ``cost_model``, so its priced problems are shared."""
    if cost_model.corrections.is_identity:
        return cost_model
    hit = _RAW.get(id(cost_model))
    if hit is not None and hit[0]() is cost_model:
        return hit[1]
    return _remember_raw(cost_model,
                         cost_model.with_corrections(Scales.identity(cost_model.num_devices)))


def _remember_raw(corrected: CostModel, raw: CostModel) -> CostModel:
    """Note ``raw`` (``corrected`` with identity corrections) as ``corrected``'s raw model."""
    key = id(corrected)
    _RAW[key] = (weakref.ref(corrected, lambda _, key=key: _RAW.pop(key, None)), raw)
    return raw


def priced_with_raw(graph: OpGraph, cost_model: CostModel) -> tuple[SimInputs, SimInputs]:
    """``(cost_model.price(graph), raw_model(cost_model).price(graph))`` from one pricing:
    the raw problem, with the corrections applied to it as ``CostModel.price`` applies
    them last (``simplace.scales.apply_scales``); both the same object when the model
    carries no corrections."""
    raw = raw_model(cost_model).price(graph)
    return apply_scales(raw, cost_model.corrections), raw


def fit_drift(records: Sequence[dict], graphs: Mapping[str, OpGraph] | Sequence[OpGraph],
              cost_model: CostModel, *, held_out: Sequence[dict] | None = None,
              params: Sequence[str] = FIT_PARAMS, tie: Sequence[str] | str = "auto",
              regularization: float = 1e-3, loss: str = "linear", max_nfev: int = 50,
              note: str = "") -> DriftFit:
    """Fit drift corrections so that simulated step times match measured ones.

    Minimises ``sum_r log(sim_r / measured_r)^2 + regularization * |z|^2`` over the log
    scales ``z`` of ``params`` (``simplace.scales.fit_scales``: trust region, exact
    subgradients from each record's critical path, several starts; the step time is
    piecewise linear in the scales, so the fit has local minima). The regulariser pulls
    corrections that the records cannot see (a link no record uses) to identity.
    Corrections are fitted on the uncorrected model (``cost_model`` with identity
    corrections), starting from its current corrections.

    Args:
      records: validation records (``validate(...).records`` or ``read_records``).
      graphs: the OpGraphs the records are for, as ``{hash: graph}`` or a list.
      cost_model: the machine's model; its ``name``/devices must match the records'.
      held_out: records NOT fitted on; the raw and corrected errors are reported on them.
      params: which kinds of ``simplace.scales.KINDS`` to fit (others keep their
        current values).
      tie: kinds fitted as shared values: ``compute``/``launch`` one per exclusive group,
        ``link`` one for every link, ``argument`` the host scale's value. ``"auto"``:
        compute and launch tied within exclusive groups (devices sharing compute drift
        together), the argument scale tied to the host's (one host thread makes every
        call: a busier host slows them all), link scales tied unless there are 5
        records per ordered link (fewer cannot pin them one by one, and would overfit).
      regularization: weight of the pull towards identity.
      loss: scipy's ``least_squares`` loss on the log ratios (``"soft_l1"`` lets a few
        noisy measurements pull less).
      max_nfev: most evaluations of the least-squares solver per start.
      note: free text kept in the history entry.

    Returns:
      A ``DriftFit``: the corrected model, the corrections and the errors (raw,
      previous corrections, fitted corrections).
    """
    if not records:
        raise SimplaceError("fit_drift needs at least one validation record.")
    if not isinstance(graphs, Mapping):
        graphs = {g.hash: g for g in graphs}
    params = _kinds(params, "params")
    d = cost_model.num_devices
    if tie == "auto":
        tie = ("compute", "launch", "argument")
        if len(records) < 5 * d * (d - 1):
            tie += ("link",)
    tie = _kinds(tuple(tie), "tie")
    share = {k: "group" for k in ("compute", "launch", "link") if k in tie} | (
        {"argument": "host"} if "argument" in tie else {})
    base = raw_model(cost_model)
    steps = _steps(records, graphs, base)
    current = dataclasses.replace(cost_model.corrections, history=())
    fit = fit_scales(steps, kinds=params, share=share, start=current, loss=loss,
                     prior_weight=regularization, max_nfev=max_nfev)
    dates = [r["date"] for r in records if r.get("date")]
    entry = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "method": "fit_drift (simplace.scales.fit_scales: scipy least_squares on log "
                  "step-time ratios, segment critical-path subgradients)",
        "params": list(params), "tied": list(tie), "regularization": regularization,
        "loss": loss,
        "fitted_on": {"records": len(records),
                      "graphs": sorted({r.get("graph_name", "") or r["graph_hash"][:12]
                                        for r in records}),
                      "graph_hashes": sorted({r["graph_hash"] for r in records}),
                      "first_date": min(dates, default=""),
                      "last_date": max(dates, default="")},
        "solver": fit.solver, "note": note,
    }
    fit_s = _scores_of(steps, cost_model.corrections, fit.scales)
    held = _scores_of(_steps(held_out, graphs, base), cost_model.corrections,
                      fit.scales) if held_out else None
    entry["fit"] = _jsonable(fit_s)
    entry["held_out"] = _jsonable(held)
    corr = dataclasses.replace(fit.scales, history=cost_model.corrections.history + (entry,))
    corrected = cost_model.with_corrections(corr)
    if not corr.is_identity:  # its raw model is the one fitted on, already priced
        _remember_raw(corrected, base)
    return DriftFit(corrected, corr, fit_s, held, entry)


def _scores_of(steps: Sequence[Step], previous: Scales, fitted: Scales) -> dict:
    """The errors of the raw model, the ``previous`` and the ``fitted`` corrections on
    ``steps`` (of the raw model)."""
    meas = np.array([st.measured_s for st in steps])
    raw = predict_steps(steps, Scales.identity(previous.num_devices))
    prev = raw if previous.is_identity else predict_steps(steps, previous)
    return _scores(raw, prev, predict_steps(steps, fitted), meas)


def _jsonable(d: dict | None) -> dict | None:
    if d is None:
        return None
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in d.items()}

"""Drift corrections: fit the cost model's corrections to measured step times.

``fit_drift(records, graphs, cost_model, held_out=...)`` fits drift ``Corrections``
(per-device compute scale of fused op times, per-device extra overhead of each segment
launch, per-link scale of copy times, one scale of the host's calls) by least squares
on the log ratio of simulated to measured step time, re-simulating every record (the
step time is a max-plus function of
the corrections; its exact subgradient comes from the critical path of each simulated
segment schedule, ``simplace.sim.critical``). Corrections are fitted on the
*uncorrected* model, so they never compound, and appended to the corrections' history
with what they were fitted on. The error of the raw (uncorrected) and the corrected
model is reported side by side on the records fitted and on held-out ones, so a
correction that does not generalise shows.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from simplace.cost_model import Corrections, CostModel, call_arguments
from simplace.errors import SimplaceError
from simplace.graph import OpGraph
from simplace.placement import check_placement
from simplace.sim.critical import schedule_critical_path
from simplace.sim.inputs import frozen_inputs
from simplace.validate.metrics import fmt_pct, fmt_tau, kendall_tau, mape

__all__ = ["FIT_PARAMS", "DriftFit", "fit_drift", "raw_model"]

# Extra overheads are fitted in units of this many seconds, so that every fitted
# variable is of order one (scales are fitted as logs).
_OVERHEAD_UNIT_S = 1e-5
FIT_PARAMS = ("compute_scale", "extra_overhead_s", "link_scale", "host_scale")


class _DriftProblem:
    """The step times of records as functions of the corrections, with their gradient.

    The variables ``z``: log compute scale [D], extra launch overhead in units of
    ``_OVERHEAD_UNIT_S`` [D], log link scale on the D*(D-1) ordered links, log host
    scale [1]. Under them (as ``CostModel`` applies corrections) op times are
    ``compute_scale[d] * t0 + host_scale * a0`` (``a0``: the call-argument part,
    ``Device.argument_s``), each segment's launch ``max(launch_s[d] +
    extra_overhead_s[d], 0)``, each copy ``link_scale * (latency + bytes / bandwidth)``
    and each dispatch and put call ``host_scale`` times its host time. A step time is a
    max-plus function of these, so its derivative is that of its critical path
    (``simplace.sim.critical.schedule_critical_path``): d step / d log compute_scale[d]
    is the fused op time of the path's segments on d, d step / d extra_overhead[d] the
    number of those segments (where the launch is not clipped at 0), d step / d log
    link_scale[i, j] the duration of the path's copies over that link, and d step / d
    log host_scale the host time on the path (the host call that let its first event
    start, every host call before it scaling, and the host calls after each wait for a
    copy the path goes through) plus the argument part of its segments; a step that
    ends with a host call and no wait has the whole step.
    """

    def __init__(self, base: CostModel, records: Sequence[dict], graphs: Mapping[str, OpGraph],
                 params: Sequence[str], tie: Sequence[str] = ()):
        from simplace.sim.inputs import sim_inputs

        d = base.num_devices
        self.d = d
        self.base = base
        unknown = [p for p in params if p not in FIT_PARAMS]
        if unknown:
            raise SimplaceError(f"fit_drift: unknown parameter kind(s) {unknown}; choose from "
                                f"{', '.join(FIT_PARAMS)}.")
        if not base.corrections.is_identity:
            raise SimplaceError("fit_drift: the drift problem is posed on the uncorrected "
                                "model.")
        self.per_graph: dict[str, tuple] = {}
        self.items = []
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
            if h not in self.per_graph:
                # Uncorrected inputs: op times scale linearly with compute_scale (ops that
                # do no work cost 0 either way), so t0 is all a correction needs, apart
                # from the call-argument part, which host_scale scales.
                arg = np.outer(call_arguments(g), [dev.argument_s for dev in base.devices])
                self.per_graph[h] = (g, sim_inputs(g, base), arg)
            a = check_placement(r["assignment"], g.num_ops, d)
            self.items.append((h, a, float(r["measured_step_time_s"])))
        self.off = np.argwhere(~np.eye(d, dtype=bool))
        self.link_index = np.full((d, d), -1, dtype=np.int64)
        self.link_index[self.off[:, 0], self.off[:, 1]] = np.arange(len(self.off))
        free = []
        if "compute_scale" in params:
            free += list(range(d))
        if "extra_overhead_s" in params:
            free += list(range(d, 2 * d))
        if "link_scale" in params:
            free += list(range(2 * d, 2 * d + len(self.off)))
        self.host_index = 2 * d + len(self.off)
        if "host_scale" in params:
            free.append(self.host_index)
        self.free = np.asarray(free, dtype=np.int64)
        self.tie_map, self.num_vars = self.variables(tie)
        self._cache: tuple | None = None

    def variables(self, tie: Sequence[str] = (), *, coarse: bool = False
                  ) -> tuple[np.ndarray, int]:
        """(tie_map, number of variables): the fitted vector x maps to the free entries
        of z as ``z[free] = x[tie_map]``. Tied kinds share one value per exclusive group
        (device kinds) or one for all links; ``coarse``: one value per kind."""
        d = self.d
        groups: dict[Any, int] = {}
        tie_map = []
        for f in self.free.tolist():
            kind = "compute_scale" if f < d else "extra_overhead_s" if f < 2 * d \
                else "link_scale" if f < self.host_index else "host_scale"
            if coarse or kind == "host_scale":
                key: tuple = (kind,)
            elif kind in tie:
                key = (kind, None if kind == "link_scale" else
                       int(self.base.exclusive_group_ids[f % d]))
            else:
                key = (kind, f)
            tie_map.append(groups.setdefault(key, len(groups)))
        return np.asarray(tie_map, dtype=np.int64), len(groups)

    def full(self, corr: Corrections) -> np.ndarray:
        return np.concatenate([np.log(corr.compute_scale),
                               corr.extra_overhead_s / _OVERHEAD_UNIT_S,
                               np.log(corr.link_scale[self.off[:, 0], self.off[:, 1]]),
                               [math.log(corr.host_scale)]])

    def corrections(self, z: np.ndarray, history=()) -> Corrections:
        d = self.d
        ls = np.ones((d, d))
        ls[self.off[:, 0], self.off[:, 1]] = np.exp(z[2 * d:self.host_index])
        return Corrections(np.exp(z[:d]), z[d:2 * d] * _OVERHEAD_UNIT_S, ls, tuple(history),
                           float(np.exp(z[self.host_index])))

    def inputs(self, h: str, z: np.ndarray):
        """(SimInputs of graph ``h`` under ``z``, bool[D]: launch not clipped at 0).
        Only what corrections scale changes; every other input (host costs...) is the
        uncorrected model's."""
        d = self.d
        _g, inp, arg = self.per_graph[h]
        cs, eo = np.exp(z[:d]), z[d:2 * d] * _OVERHEAD_UNIT_S
        hs = float(np.exp(z[self.host_index]))
        ls = self.corrections(z).link_scale
        launch = inp.launch_s + eo
        # Scaled copies of priced, checked arrays (positive scales): no new pricing.
        return frozen_inputs(inp, op_time_s=(inp.op_time_s - arg) * cs[None, :] + arg * hs,
                             latency_s=inp.latency_s * ls,
                             bandwidth_bytes_per_s=inp.bandwidth_bytes_per_s / ls,
                             dispatch_s=inp.dispatch_s * hs, put_s=inp.put_s * hs,
                             launch_s=np.maximum(launch, 0.0)), launch >= 0

    def evaluate(self, z: np.ndarray, *, grad: bool = True):
        """(step_s[R], d step / d z [R, Z]) under the full variable vector ``z``."""
        from simplace.sim import simulate

        if self._cache is not None and np.array_equal(self._cache[0], z):
            return self._cache[1], self._cache[2]
        d = self.d
        steps = np.empty(len(self.items))
        jac = np.zeros((len(self.items), len(z)))
        inputs = {h: self.inputs(h, z) for h in self.per_graph}
        hs, hi_ = float(np.exp(z[self.host_index])), self.host_index
        for r, (h, a, _) in enumerate(self.items):
            g, _, arg = self.per_graph[h]
            inp, live = inputs[h]
            res = simulate(g, inp, a, schedule=grad)
            steps[r] = res.step_time_s
            if not grad:
                continue
            sch = res.schedule
            segs, trs, host_s = schedule_critical_path(
                g, inp.exclusive_group, a, sch, res.step_time_s, inp.latency_s,
                inp.put_waits)
            # The host calls on the path (the one it starts from and those after each
            # wait for a copy it goes through) scale with host_scale.
            jac[r, hi_] += host_s
            for s in segs:
                k = int(sch.segment_device[s])
                lo, hi = int(sch.segment_first[s]), int(sch.segment_stop[s])
                a_part = hs * float(arg[lo:hi, k].sum())
                jac[r, k] += float(inp.op_time_s[lo:hi, k].sum()) - a_part
                jac[r, hi_] += a_part
                if live[k]:
                    jac[r, d + k] += _OVERHEAD_UNIT_S
            for t, whole in trs:
                i, j = int(sch.transfer_from[t]), int(sch.transfer_to[t])
                dur = float(sch.transfer_end_s[t] - sch.transfer_start_s[t])
                jac[r, 2 * d + self.link_index[i, j]] += (
                    dur if whole else dur - float(inp.latency_s[i, j]))
        if grad:
            self._cache = (z.copy(), steps, jac)
        return steps, jac

    def measured(self) -> np.ndarray:
        return np.array([m for _, _, m in self.items])


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
    corrections: Corrections
    fit: dict
    held_out: dict | None
    entry: dict

    def summary(self) -> str:
        """Lines for people: the fitted and held-out scores and every correction."""
        c = self.corrections
        lines = [_score_line("fitted", self.fit)]
        if self.held_out is not None:
            lines.append(_score_line("held-out", self.held_out))
        lines.append("compute_scale " + " ".join(f"{x:.3f}" for x in c.compute_scale))
        lines.append("extra_overhead_us (per segment launch) "
                     + " ".join(f"{x * 1e6:.2f}" for x in c.extra_overhead_s))
        off = c.link_scale[~np.eye(c.num_devices, dtype=bool)]
        lines.append(f"link_scale min {off.min():.3f} median {np.median(off):.3f} "
                     f"max {off.max():.3f}" if off.size else "link_scale (one device)")
        lines.append(f"host_scale (dispatch, device_put, call arguments) {c.host_scale:.3f}")
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


def _predict(cost_model: CostModel, records: Sequence[dict], graphs) -> np.ndarray:
    from simplace.sim import simulate

    return np.array([simulate(graphs[r["graph_hash"]], cost_model,
                              np.asarray(r["assignment"])).step_time_s for r in records])


def raw_model(cost_model: CostModel) -> CostModel:
    """``cost_model`` without drift corrections (itself when it has none)."""
    if cost_model.corrections.is_identity:
        return cost_model
    return cost_model.with_corrections(Corrections.identity(cost_model.num_devices))


def fit_drift(records: Sequence[dict], graphs: Mapping[str, OpGraph] | Sequence[OpGraph],
              cost_model: CostModel, *, held_out: Sequence[dict] | None = None,
              params: Sequence[str] = FIT_PARAMS, tie: Sequence[str] | str = "auto",
              regularization: float = 1e-3, loss: str = "linear", max_nfev: int = 50,
              note: str = "") -> DriftFit:
    """Fit drift corrections so that simulated step times match measured ones.

    Minimises ``sum_r log(sim_r / measured_r)^2 + regularization * |z|^2`` over
    ``z`` = (log compute_scale per device, extra_overhead_s (added to each segment's
    launch) per device in units of 10 us, log link_scale per ordered link, log
    host_scale of every host call) with
    ``scipy.optimize.least_squares`` (trust region, exact subgradients from each
    record's critical path through its segment schedule). The step time is piecewise
    linear in the corrections, so the fit has local minima: it is solved from the
    current corrections, from identity and from a coarse fit (one value per kind), and
    again with runaway scales reset, and the best solution is kept. Host time (dispatch,
    put calls and call arguments) is corrected by one ``host_scale``: one host thread
    makes every call, and a host-bound step moves with nothing else. The
    regulariser pulls
    corrections that the records cannot see (a link no record uses) to identity.
    Corrections are fitted on the uncorrected model (``cost_model`` with identity
    corrections), starting from its current corrections.

    Args:
      records: validation records (``validate(...).records`` or ``read_records``).
      graphs: the OpGraphs the records are for, as ``{hash: graph}`` or a list.
      cost_model: the machine's model; its ``name``/devices must match the records'.
      held_out: records NOT fitted on; the raw and corrected errors are reported on them.
      params: which kinds of correction to fit (others keep their current values).
      tie: kinds fitted as one shared value: ``link_scale`` (one scale for every link),
        ``compute_scale``/``extra_overhead_s`` (one per exclusive group); ``host_scale``
        is always one value. ``"auto"``:
        compute scale and overhead tied within exclusive groups (devices sharing compute
        drift together), link scales tied unless there are 5 records per ordered link
        (fewer cannot pin them one by one, and would overfit).
      regularization: weight of the pull towards identity.
      loss: scipy's ``least_squares`` loss on the log ratios (``"soft_l1"`` lets a few
        noisy measurements pull less).
      max_nfev: most evaluations of the least-squares solver.
      note: free text kept in the history entry.

    Returns:
      A ``DriftFit``: the corrected model, the corrections and the errors (raw,
      previous corrections, fitted corrections).
    """
    from scipy.optimize import least_squares

    if not records:
        raise SimplaceError("fit_drift needs at least one validation record.")
    if not isinstance(graphs, Mapping):
        graphs = {g.hash: g for g in graphs}
    d = cost_model.num_devices
    if tie == "auto":
        # Devices of one exclusive group share their compute (virtual devices of one
        # CPU): they drift together. Links get one shared scale unless there are at
        # least 5 records per ordered link to fit each one on.
        tie = ("compute_scale", "extra_overhead_s")
        if len(records) < 5 * d * (d - 1):
            tie += ("link_scale",)
    tie = tuple(tie)
    base = cost_model.with_corrections(Corrections.identity(d))
    problem = _DriftProblem(base, records, graphs, params, tie)
    meas = problem.measured()
    z0 = problem.full(cost_model.corrections)
    free = problem.free
    lam = math.sqrt(max(regularization, 0.0))

    def solve(z_start: np.ndarray, tmap: np.ndarray, nv: int):
        """least_squares over the variables of ``tmap``, from ``z_start``'s values (the
        mean of tied entries); entries not fitted keep ``z0``'s."""
        onehot = np.zeros((len(free), nv))  # dz[free] / dx
        onehot[np.arange(len(free)), tmap] = 1.0

        def expand(x):
            z = z0.copy()
            z[free] = x[tmap]
            return z

        def fun(x):
            steps, _ = problem.evaluate(expand(x))
            r = np.log(np.maximum(steps, 1e-15) / meas)
            return np.concatenate([r, lam * x])

        def jac(x):
            steps, j = problem.evaluate(expand(x))
            jr = (j[:, free] @ onehot) / np.maximum(steps, 1e-15)[:, None]
            return np.vstack([jr, lam * np.eye(nv)])

        x0 = (z_start[free] @ onehot) / np.maximum(onehot.sum(axis=0), 1)
        is_log = ((free < d) | (free >= 2 * d)) @ onehot > 0
        lower = np.where(is_log, math.log(1e-3), -np.inf)
        upper = np.where(is_log, math.log(1e3), np.inf)
        x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)
        sol = least_squares(fun, x0, jac=jac, method="trf", bounds=(lower, upper),
                            loss=loss, f_scale=0.1, max_nfev=max_nfev, x_scale="jac")
        return expand(sol.x), sol

    tmap, nv = problem.tie_map, problem.num_vars
    if nv:
        # The step time is piecewise linear in the corrections (max-plus), so the fit has
        # local minima: solve from the current corrections, from identity, and from a
        # coarse fit (one value per kind) refined to the ties asked for; keep the best.
        starts = {"current": z0}
        if not cost_model.corrections.is_identity:
            starts["identity"] = problem.full(Corrections.identity(d))
        ctmap, cnv = problem.variables(coarse=True)
        if cnv < nv:
            starts["coarse"] = solve(z0, ctmap, cnv)[0]
        best = None
        for how, zs in starts.items():
            z_try, sol = solve(zs, tmap, nv)
            if best is None or sol.cost < best[2].cost:
                best = (how, z_try, sol)
        # A scale pushed towards 0 takes its copies or ops off every critical path, or
        # nearly (the gradient of a log scale is the time it scales): nothing pulls it
        # back. Reset such dead or extreme (beyond 10x) variables to identity and solve
        # again from there.
        _, jz = problem.evaluate(best[1])
        zf = best[1][free]
        is_log_entry = (free < d) | (free >= 2 * d)
        dead = free[(~np.any(jz[:, free] != 0, axis=0) | (is_log_entry
                                                           & (np.abs(zf) > math.log(10))))
                    & (zf != 0)]
        if dead.size:
            zs = best[1].copy()
            zs[dead] = 0.0
            starts["revived"] = zs
            z_try, sol = solve(zs, tmap, nv)
            if sol.cost < best[2].cost:
                best = ("revived", z_try, sol)
        how, z, sol = best
        status = {"cost": float(sol.cost), "nfev": int(sol.nfev), "status": int(sol.status),
                  "variables": int(nv), "start": how, "starts": list(starts)}
    else:
        z, status = z0, {"note": "nothing to fit"}
    pred_raw = _predict(base, records, graphs)
    pred_prev = (pred_raw if cost_model.corrections.is_identity
                 else _predict(cost_model, records, graphs))
    dates = [r["date"] for r in records if r.get("date")]
    entry = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "method": "fit_drift (scipy least_squares on log step-time ratios, segment "
                  "critical-path subgradients)",
        "params": list(params), "tied": list(tie), "regularization": regularization,
        "loss": loss,
        "fitted_on": {"records": len(records),
                      "graphs": sorted({r.get("graph_name", "") or r["graph_hash"][:12]
                                        for r in records}),
                      "graph_hashes": sorted({r["graph_hash"] for r in records}),
                      "first_date": min(dates, default=""),
                      "last_date": max(dates, default="")},
        "solver": status, "note": note,
    }
    new_corr = problem.corrections(z)
    corrected = cost_model.with_corrections(new_corr)
    pred_after = _predict(corrected, records, graphs)
    fit_s = _scores(pred_raw, pred_prev, pred_after, meas)
    held = None
    if held_out:
        hm = np.array([r["measured_step_time_s"] for r in held_out], dtype=float)
        h_raw = _predict(base, held_out, graphs)
        h_prev = (h_raw if cost_model.corrections.is_identity
                  else _predict(cost_model, held_out, graphs))
        held = _scores(h_raw, h_prev, _predict(corrected, held_out, graphs), hm)
    entry["fit"] = _jsonable(fit_s)
    entry["held_out"] = _jsonable(held)
    corr = problem.corrections(z, history=tuple(cost_model.corrections.history) + (entry,))
    return DriftFit(cost_model.with_corrections(corr), corr, fit_s, held, entry)


def _jsonable(d: dict | None) -> dict | None:
    if d is None:
        return None
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in d.items()}


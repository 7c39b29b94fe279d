"""Validate placements on hardware and correct the cost model where it drifted.

* ``validate(graph, cost_model, placements, fn=..., args=...)`` runs each placement for
  real (``simplace.execute``), times its step with the calibration harness and compares
  it with the simulator's prediction: a ``ValidationReport`` with one row per candidate,
  the mean absolute percentage error (``mape``) and the rank agreement of predicted and
  measured times (``kendall_tau``). Its ``records`` go to
  ``calibration/NAME/validation.jsonl`` (``append_records``).
* ``fit_drift(records, graphs, cost_model, held_out=...)`` fits drift ``Corrections``
  (per-device compute scale, per-op extra overhead per device, per-link scale) by least
  squares on the log ratio of simulated to measured step time, re-simulating every
  record (the step time is a max-plus function of the corrections; its exact
  subgradient comes from the critical path of each simulated schedule). Corrections are
  fitted on the *uncorrected* model, so they never compound, and appended to the
  corrections' history with what they were fitted on. The error before and after is
  reported on the records fitted and on held-out ones, so a correction that does not
  generalise shows.
* ``make_validation_callback(...)``: the hook a search calls every N updates (RL) or
  rounds (local search) with its best candidates; it validates them, refits the drift
  on every record so far and returns the corrected cost model.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simplace.cost_model import Corrections, CostModel
from simplace.errors import PlacementError, SimplaceError
from simplace.graph import OpGraph
from simplace.placement import Placement, check_placement

__all__ = ["DriftFit", "ValidationReport", "ValidationRow", "append_records", "rl_status_callback",
           "calibration_dir", "fit_drift", "kendall_tau", "make_validation_callback",
           "mape", "read_records", "split_records", "validate", "validation_path"]

RECORD_SCHEMA = "simplace.validation_record"
RECORD_SCHEMA_VERSION = 1
# Extra overheads are fitted in units of this many seconds, so that every fitted
# variable is of order one (scales are fitted as logs).
_OVERHEAD_UNIT_S = 1e-5
FIT_PARAMS = ("compute_scale", "extra_overhead_s", "link_scale")


# --------------------------------------------------------------------------- metrics
def mape(predicted_s, measured_s) -> float:
    """Mean absolute percentage error of predictions, as a fraction (0.1 = 10%)."""
    p, m = np.asarray(predicted_s, float), np.asarray(measured_s, float)
    if p.size == 0:
        return math.nan
    return float(np.mean(np.abs(p - m) / m))


def kendall_tau(predicted_s, measured_s) -> float:
    """Kendall's tau-b between predicted and measured times: 1 when the simulator ranks
    the candidates as the hardware does; NaN for fewer than two candidates or ties only."""
    from scipy.stats import kendalltau

    p, m = np.asarray(predicted_s, float), np.asarray(measured_s, float)
    if p.size < 2 or np.all(p == p[0]) or np.all(m == m[0]):
        return math.nan
    return float(kendalltau(p, m).statistic)


# --------------------------------------------------------------------------- records
def calibration_dir() -> Path:
    """``calibration/`` next to ``cost_models/`` (``$SIMPLACE_CALIBRATION`` overrides)."""
    env = os.environ.get("SIMPLACE_CALIBRATION")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "calibration"


def validation_path(cost_model_name: str, records_dir: str | os.PathLike | None = None
                    ) -> Path:
    """``<records_dir or calibration_dir()>/NAME/validation.jsonl``."""
    base = Path(records_dir) if records_dir is not None else calibration_dir()
    return base / cost_model_name / "validation.jsonl"


_RECORD_FIELDS = {"cost_model": str, "graph_hash": str, "graph_name": str,
                  "device_names": list, "assignment": list, "predicted_step_time_s": float,
                  "measured_step_time_s": float, "method": str}


def _check_record(rec: Any, where: str) -> dict:
    if not isinstance(rec, dict) or rec.get("schema") != RECORD_SCHEMA:
        raise SimplaceError(f"{where}: not a simplace validation record (its 'schema' is not "
                            f"'{RECORD_SCHEMA}').")
    if rec.get("schema_version") != RECORD_SCHEMA_VERSION:
        raise SimplaceError(f"{where}: validation record schema_version "
                            f"{rec.get('schema_version')!r}; this simplace reads "
                            f"{RECORD_SCHEMA_VERSION}.")
    for f, t in _RECORD_FIELDS.items():
        v = rec.get(f)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) if t is float \
            else isinstance(v, t)
        if not ok:
            raise SimplaceError(f"{where}: field '{f}' must be a {t.__name__}, got {v!r}.")
    if not rec["measured_step_time_s"] > 0:
        raise SimplaceError(f"{where}: measured_step_time_s must be > 0.")
    return rec


def _truncate_after_last_newline(f, chunk_bytes: int = 1 << 16) -> None:
    """Cut the binary file ``f`` just after its last newline (to empty if it has none)."""
    end = f.seek(0, os.SEEK_END)
    pos = end
    while pos > 0:
        start = max(0, pos - chunk_bytes)
        f.seek(start)
        k = f.read(pos - start).rfind(b"\n")
        if k >= 0:
            f.truncate(start + k + 1)
            return
        pos = start
    f.truncate(0)


def append_records(path: str | os.PathLike, records: Sequence[Mapping]) -> None:
    """Append validation records to a JSON Lines file (one flushed line each)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Check and encode everything first, so a bad record appends nothing.
    lines = []
    for k, r in enumerate(records):
        _check_record(dict(r), f"record {k}")
        lines.append(json.dumps(r, separators=(",", ":"), allow_nan=False) + "\n")
    if path.is_file() and path.stat().st_size > 0:
        with open(path, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                # A line cut short by an interrupted append is an incomplete record: drop
                # it, so that it does not swallow the next one. Only the tail is read.
                _truncate_after_last_newline(f)
    with open(path, "a") as f:
        for line in lines:
            f.write(line)
            f.flush()


def read_records(path: str | os.PathLike) -> list[dict]:
    """The validation records of a JSON Lines file; an error names a bad line."""
    path = Path(path)
    if not path.is_file():
        raise SimplaceError(f"No validation records at {path}: run `simplace validate` on "
                            "this machine first.")
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                if not line.endswith("\n"):  # the last line, cut by an interrupted append
                    warnings.warn(f"{path}:{n}: skipping a line cut short by an "
                                  "interrupted write.", stacklevel=2)
                    continue
                raise SimplaceError(f"{path}:{n}: not JSON ({err.msg}).") from None
            out.append(_check_record(rec, f"{path}:{n}"))
    return out


def split_records(records: Sequence[dict], fraction: float = 0.5, *, seed: int = 0
                  ) -> tuple[list[dict], list[dict]]:
    """``(fit, held_out)``: a seeded random split, stratified by graph so that every
    graph has records on both sides (when it has two or more)."""
    rng = np.random.default_rng(seed)
    by_graph: dict[str, list[int]] = {}
    for k, r in enumerate(records):
        by_graph.setdefault(r["graph_hash"], []).append(k)
    fit, held = [], []
    for g in sorted(by_graph):
        idx = rng.permutation(by_graph[g]).tolist()
        n_fit = int(round(len(idx) * fraction)) if len(idx) > 1 else len(idx)
        n_fit = min(max(n_fit, 1), len(idx) - 1) if len(idx) > 1 else n_fit
        fit += [records[i] for i in idx[:n_fit]]
        held += [records[i] for i in idx[n_fit:]]
    return fit, held


# --------------------------------------------------------------------------- validation
@dataclasses.dataclass(frozen=True)
class ValidationRow:
    """One candidate: predicted and measured step time (s), relative error
    ``(predicted - measured) / measured``, and the placed step's shape."""

    label: str
    method: str
    predicted_s: float
    measured_s: float
    measured_mad_s: float
    num_segments: int
    num_transfers: int

    @property
    def rel_error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


@dataclasses.dataclass(frozen=True, eq=False)
class ValidationReport:
    """Predicted vs measured step times of several placements on one machine.

    rows: one ``ValidationRow`` per candidate, in the order given.
    mape: mean |relative error| (fraction). kendall_tau: rank agreement (NaN below 2).
    records: the JSON records (``append_records``), one per row.
    """

    cost_model: str
    graph_name: str
    rows: tuple[ValidationRow, ...]
    records: tuple[dict, ...]

    @property
    def predicted_s(self) -> np.ndarray:
        return np.array([r.predicted_s for r in self.rows])

    @property
    def measured_s(self) -> np.ndarray:
        return np.array([r.measured_s for r in self.rows])

    @property
    def mape(self) -> float:
        return mape(self.predicted_s, self.measured_s)

    @property
    def kendall_tau(self) -> float:
        return kendall_tau(self.predicted_s, self.measured_s)

    def table(self) -> str:
        """A text table: one line per candidate, then MAPE and Kendall tau."""
        head = (f"{'candidate':<22} {'method':<12} {'predicted ms':>12} {'measured ms':>12} "
                f"{'+-mad ms':>9} {'error':>8} {'segments':>8} {'moves':>6}")
        lines = [f"validation of {self.graph_name} on {self.cost_model}", head,
                 "-" * len(head)]
        for r in self.rows:
            lines.append(f"{r.label[:22]:<22} {r.method[:12]:<12} {r.predicted_s * 1e3:>12.3f} "
                         f"{r.measured_s * 1e3:>12.3f} {r.measured_mad_s * 1e3:>9.3f} "
                         f"{100 * r.rel_error:>+7.1f}% {r.num_segments:>8} "
                         f"{r.num_transfers:>6}")
        tau = self.kendall_tau
        lines.append(f"MAPE {100 * self.mape:.1f}%   Kendall tau "
                     f"{'n/a' if math.isnan(tau) else f'{tau:.2f}'}   ({len(self.rows)} "
                     "candidates)")
        return "\n".join(lines)


def _as_assignments(graph: OpGraph, cost_model: CostModel, placements) -> list[tuple]:
    """[(assignment, method, label)] from Placements, int[M] arrays or an int[B, M]."""
    if isinstance(placements, np.ndarray) and placements.ndim == 2:
        placements = list(placements)
    out = []
    for k, p in enumerate(placements):
        if isinstance(p, Placement):
            a = p.check(graph, cost_model)
            out.append((a, p.method or "file", str(p.meta.get("label", f"#{k}"))))
        else:
            out.append((check_placement(p, graph.num_ops, cost_model.num_devices), "given",
                        f"#{k}"))
    return out


def validate(graph: OpGraph, cost_model: CostModel, placements, *, fn=None, args=None,
             program=None, labels: Sequence[str] | None = None,
             methods: Sequence[str] | None = None, devices: Sequence | None = None,
             timing: Mapping | None = None, records_path: str | os.PathLike | None = None,
             transfers: str = "producer", rounds: int = 3,
             progress: Callable[[str], None] | None = None) -> ValidationReport:
    """Run each placement on hardware; compare measured and predicted step times.

    Args:
      graph: the OpGraph the placements place (``fn`` must trace to it: same hash).
      cost_model: the machine model whose predictions are checked (corrections applied).
      placements: ``Placement`` objects, int[M] arrays, or an int[B, M] array.
      fn, args: the model function and real example arguments (``zoo.get(...,
        abstract=False)``); or ``program``: a ``simplace.execute.Program`` of them
        (reuse it across calls: compiled segments are cached there).
      labels, methods: names of the candidates for the report (default ``#k`` / the
        placement's method).
      devices: the JAX device of each index (default: by the cost model's device names).
      timing: options of the harness (``warmup``, ``min_repeats``, ``budget_s``...).
      records_path: also append the records to this JSON Lines file.
      transfers: how the executor moves tensors (``Program.place``): ``"producer"``
        (default, as ``apply`` does and the simulator models it) or ``"segment"``.
      rounds: the candidates are timed in this many interleaved rounds, each with
        ``1/rounds`` of the timing budget, and each one's samples pooled (robust median).
      progress: called with a line per candidate.

    Returns:
      A ``ValidationReport`` (rows, ``mape``, ``kendall_tau``, ``records``).
    """
    from simplace.calibrate.harness import robust_stats
    from simplace.execute import measure, prepare, resolve_devices
    from simplace.sim import simulate

    if program is None:
        if fn is None or args is None:
            raise SimplaceError("validate needs the model to run: pass fn= and args= (real "
                                "arrays, e.g. zoo.get(name, abstract=False)) or program=.")
        program = prepare(fn, args)
        run_args = tuple(args)
    else:
        run_args = tuple(args) if args is not None else None
        if run_args is None:
            raise SimplaceError("validate(program=...) also needs args= (real arrays).")
    if program.graph.hash != graph.hash:
        raise PlacementError(
            f"The function traces to graph {program.graph.hash[:12]}... "
            f"({program.graph.num_ops} ops) but the placements are for graph "
            f"{graph.hash[:12]}... ({graph.num_ops} ops, {graph.name or 'unnamed'}): pass the "
            "model function and sizes the placements were optimised for.")
    items = _as_assignments(graph, cost_model, placements)
    if devices is None:
        devices = resolve_devices(cost_model.device_names)
    timing = dict(timing or {})
    if int(rounds) < 1:
        raise SimplaceError(f"validate: rounds must be >= 1, got {rounds}.")
    rows, records = [], []
    host = platform.node()
    jobs = []
    for k, (a, method, label) in enumerate(items):
        if labels is not None:
            label = labels[k]
        if methods is not None:
            method = methods[k]
        pred = float(simulate(graph, cost_model, a).step_time_s)
        placed = program.place(a, devices=devices, transfers=transfers)
        jobs.append((a, method, label, pred, placed))
    # Time in rounds over all candidates (each round a share of the timing budget) and
    # pool the samples: a change of machine load during the validation then hits every
    # candidate alike instead of the few timed while it lasted.
    per_round = dict(timing, budget_s=float(timing.get("budget_s", 1.0)) / int(rounds),
                     min_repeats=max(1, -(-int(timing.get("min_repeats", 5)) // int(rounds))))
    samples: list[list[float]] = [[] for _ in jobs]
    meas_first: list = [None] * len(jobs)
    for _ in range(int(rounds)):
        for k, (*_, placed) in enumerate(jobs):
            m = measure(placed, run_args, **per_round)
            samples[k] += list(m.step.samples_s)
            if meas_first[k] is None:
                meas_first[k] = m
    for k, (a, method, label, pred, _) in enumerate(jobs):
        step = robust_stats(samples[k])
        meas = meas_first[k]
        row = ValidationRow(label, method, pred, float(step.median_s), float(step.mad_s),
                            meas.num_segments, meas.num_transfers)
        rows.append(row)
        records.append({
            "schema": RECORD_SCHEMA, "schema_version": RECORD_SCHEMA_VERSION,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": host, "cost_model": cost_model.name,
            "corrected": not cost_model.corrections.is_identity,
            "graph_hash": graph.hash, "graph_name": graph.name,
            "device_names": list(cost_model.device_names), "label": label, "method": method,
            "assignment": a.tolist(), "predicted_step_time_s": pred,
            "measured_step_time_s": float(step.median_s), "timing": step.to_dict(),
            "rounds": int(rounds),
            "num_segments": meas.num_segments, "num_transfers": meas.num_transfers,
            "bytes_transferred": meas.bytes_transferred, "transfers": transfers,
        })
        if progress:
            progress(f"{label}: predicted {pred * 1e3:.3f} ms, measured "
                     f"{step.median_s * 1e3:.3f} ms ({100 * row.rel_error:+.1f}%)")
    if records_path is not None:
        append_records(records_path, records)
    return ValidationReport(cost_model.name, graph.name, tuple(rows), tuple(records))


# --------------------------------------------------------------------------- drift fit
def _critical_path(graph: OpGraph, group: np.ndarray, p: np.ndarray, sched
                   ) -> tuple[list[int], list[int]]:
    """(ops, transfers) on one critical path of a simulated schedule: walking back from
    the last event, each op's start came from its group's previous op or an input's
    arrival, each transfer's from its producer's end or the link's previous transfer."""
    m = graph.num_ops
    end = sched.op_end_s
    t_op, t_to = sched.transfer_op.tolist(), sched.transfer_to.tolist()
    t_from = sched.transfer_from.tolist()
    t_start, t_end = sched.transfer_start_s, sched.transfer_end_s
    grp = group[p]
    prev_in_group = np.full(m, -1, dtype=np.int64)
    last: dict[int, int] = {}
    for i, g in enumerate(grp.tolist()):
        prev_in_group[i] = last.get(g, -1)
        last[g] = i
    tr_of: dict[tuple[int, int], int] = {}
    link_prev: list[int] = []
    last_link: dict[tuple[int, int], int] = {}
    for t, (o, a, b) in enumerate(zip(t_op, t_from, t_to, strict=True)):
        tr_of[(o, b)] = t
        link_prev.append(last_link.get((a, b), -1))
        last_link[(a, b)] = t
    in_ptr, in_order = graph.in_edges
    src = graph.src
    ops: list[int] = []
    trs: list[int] = []
    if m == 0:
        return ops, trs
    i_last = int(np.argmax(end))
    if len(t_end) and t_end.max() > end[i_last]:
        cur: tuple | None = ("tr", int(np.argmax(t_end)))
    else:
        cur = ("op", i_last)
    while cur is not None:
        kind, k = cur
        if kind == "op":
            ops.append(k)
            best, cur = 0.0, None
            j = int(prev_in_group[k])
            if j >= 0 and end[j] > best:
                best, cur = end[j], ("op", j)
            for e in in_order[in_ptr[k]:in_ptr[k + 1]].tolist():
                s = int(src[e])
                if p[s] == p[k]:
                    if end[s] > best:
                        best, cur = end[s], ("op", s)
                else:
                    t = tr_of[(s, int(p[k]))]
                    if t_end[t] > best:
                        best, cur = t_end[t], ("tr", t)
            if best <= 0.0:
                cur = None
        else:
            trs.append(k)
            o, j = t_op[k], link_prev[k]
            if j >= 0 and t_end[j] > end[o] and t_end[j] >= t_start[k]:
                cur = ("tr", j)
            else:
                cur = ("op", o)
    return ops, trs


class _DriftProblem:
    """The step times of records as functions of the corrections, with their gradient."""

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
        self.per_graph: dict[str, tuple] = {}
        self.items = []
        ones = Corrections(np.ones(d), np.ones(d), np.ones((d, d)))
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
                inp = sim_inputs(g, base)
                t0 = inp.op_time_s
                works = base.with_corrections(ones).op_times(g) != t0
                self.per_graph[h] = (g, inp, t0, works)
            a = check_placement(r["assignment"], g.num_ops, d)
            self.items.append((h, a, float(r["measured_step_time_s"])))
        # Free variables: log compute scale [D], extra overhead in _OVERHEAD_UNIT_S [D],
        # log link scale on the D*(D-1) ordered links.
        self.off = np.argwhere(~np.eye(d, dtype=bool))
        free = []
        if "compute_scale" in params:
            free += list(range(d))
        if "extra_overhead_s" in params:
            free += list(range(d, 2 * d))
        if "link_scale" in params:
            free += list(range(2 * d, 2 * d + len(self.off)))
        self.free = np.asarray(free, dtype=np.int64)
        # Tied kinds share one value: the fitted vector x maps to the free entries of z
        # through ``tie_map`` (z[free] = x[tie_map]).
        groups: dict[Any, int] = {}
        tie_map = []
        for f in self.free.tolist():
            kind = "compute_scale" if f < d else "extra_overhead_s" if f < 2 * d \
                else "link_scale"
            if kind in tie:
                # within an exclusive group for device kinds, across all links for links
                key = (kind, None if kind == "link_scale" else
                       int(base.exclusive_group_ids[f % d]))
            else:
                key = (kind, f)
            tie_map.append(groups.setdefault(key, len(groups)))
        self.tie_map = np.asarray(tie_map, dtype=np.int64)
        self.num_vars = len(groups)
        self._cache: tuple | None = None

    def full(self, corr: Corrections) -> np.ndarray:
        return np.concatenate([np.log(corr.compute_scale),
                               corr.extra_overhead_s / _OVERHEAD_UNIT_S,
                               np.log(corr.link_scale[self.off[:, 0], self.off[:, 1]])])

    def corrections(self, z: np.ndarray, history=()) -> Corrections:
        d = self.d
        ls = np.ones((d, d))
        ls[self.off[:, 0], self.off[:, 1]] = np.exp(z[2 * d:])
        return Corrections(np.exp(z[:d]), z[d:2 * d] * _OVERHEAD_UNIT_S, ls, tuple(history))

    def evaluate(self, z: np.ndarray, *, grad: bool = True):
        """(step_s[R], d step / d z [R, Z]) under full variable vector ``z``."""
        from simplace.sim import simulate
        from simplace.sim.inputs import make_sim_inputs

        if self._cache is not None and np.array_equal(self._cache[0], z):
            return self._cache[1], self._cache[2]
        d = self.d
        cs, eo = np.exp(z[:d]), z[d:2 * d] * _OVERHEAD_UNIT_S
        corr = self.corrections(z)
        ls = corr.link_scale
        steps = np.empty(len(self.items))
        jac = np.zeros((len(self.items), len(z)))
        inputs = {}
        for h, (_g, inp, t0, works) in self.per_graph.items():
            raw = cs[None, :] * t0 + eo[None, :]
            t = np.where(works, np.maximum(raw, 0.0), t0)
            live = works & (raw > 0)
            inputs[h] = (make_sim_inputs(t, inp.latency_s * ls, inp.bandwidth_bytes_per_s / ls,
                                         inp.memory_bytes, inp.exclusive_group), live)
        for r, (h, a, _) in enumerate(self.items):
            g, inp0, t0, _works = self.per_graph[h]
            inp, live = inputs[h]
            res = simulate(g, inp, a, schedule=grad)
            steps[r] = res.step_time_s
            if not grad:
                continue
            ops, trs = _critical_path(g, inp.exclusive_group, a, res.schedule)
            ops = np.asarray(ops, dtype=np.int64)
            if len(ops):
                dev = a[ops]
                on = live[ops, dev]
                np.add.at(jac[r], dev[on], cs[dev[on]] * t0[ops[on], dev[on]])
                np.add.at(jac[r], d + dev[on], _OVERHEAD_UNIT_S)
            sch = res.schedule
            for t in trs:
                i, j = int(sch.transfer_from[t]), int(sch.transfer_to[t])
                link = 2 * d + int(np.flatnonzero((self.off[:, 0] == i)
                                                  & (self.off[:, 1] == j))[0])
                jac[r, link] += float(sch.transfer_end_s[t] - sch.transfer_start_s[t])
        self._cache = (z.copy(), steps, jac)
        return steps, jac

    def measured(self) -> np.ndarray:
        return np.array([m for _, _, m in self.items])


@dataclasses.dataclass(frozen=True, eq=False)
class DriftFit:
    """The result of ``fit_drift``.

    cost_model: the given model with the fitted corrections (history extended).
    corrections: those corrections.
    fit: error of the records fitted on, ``{"n", "mape_before", "mape_after",
      "tau_before", "tau_after"}``; held_out: the same on held-out records (None if none).
    entry: the history entry appended to the corrections (what was fitted, on what).
    """

    cost_model: CostModel
    corrections: Corrections
    fit: dict
    held_out: dict | None
    entry: dict

    def summary(self) -> str:
        def line(name, s):
            return (f"{name:<9} n={s['n']:<3} MAPE {100 * s['mape_before']:6.1f}% -> "
                    f"{100 * s['mape_after']:6.1f}%   Kendall tau {_fmt_tau(s['tau_before'])}"
                    f" -> {_fmt_tau(s['tau_after'])}")

        c = self.corrections
        lines = [line("fitted", self.fit)]
        if self.held_out is not None:
            lines.append(line("held-out", self.held_out))
        lines.append("compute_scale " + " ".join(f"{x:.3f}" for x in c.compute_scale))
        lines.append("extra_overhead_us " + " ".join(f"{x * 1e6:.2f}"
                                                      for x in c.extra_overhead_s))
        off = c.link_scale[~np.eye(c.num_devices, dtype=bool)]
        lines.append(f"link_scale min {off.min():.3f} median {np.median(off):.3f} "
                     f"max {off.max():.3f}" if off.size else "link_scale (one device)")
        return "\n".join(lines)


def _fmt_tau(t: float) -> str:
    return "n/a" if t is None or math.isnan(t) else f"{t:.2f}"


def _scores(pred_before, pred_after, meas) -> dict:
    return {"n": int(len(meas)), "mape_before": mape(pred_before, meas),
            "mape_after": mape(pred_after, meas), "tau_before": kendall_tau(pred_before, meas),
            "tau_after": kendall_tau(pred_after, meas)}


def _predict(cost_model: CostModel, records: Sequence[dict], graphs) -> np.ndarray:
    from simplace.sim import simulate

    return np.array([simulate(graphs[r["graph_hash"]], cost_model,
                              np.asarray(r["assignment"])).step_time_s for r in records])


def fit_drift(records: Sequence[dict], graphs: Mapping[str, OpGraph] | Sequence[OpGraph],
              cost_model: CostModel, *, held_out: Sequence[dict] | None = None,
              params: Sequence[str] = FIT_PARAMS, tie: Sequence[str] | str = "auto",
              regularization: float = 1e-3, loss: str = "linear", max_nfev: int = 50,
              note: str = "") -> DriftFit:
    """Fit drift corrections so that simulated step times match measured ones.

    Minimises ``sum_r log(sim_r / measured_r)^2 + regularization * |z|^2`` over
    ``z`` = (log compute_scale per device, extra_overhead_s per device in units of 10 us,
    log link_scale per ordered link) with ``scipy.optimize.least_squares`` (trust region,
    exact subgradients from each record's critical path). The regulariser pulls
    corrections that the records cannot see (a link no record uses) to identity.
    Corrections are fitted on the uncorrected model (``cost_model`` with identity
    corrections), starting from its current corrections.

    Args:
      records: validation records (``validate(...).records`` or ``read_records``).
      graphs: the OpGraphs the records are for, as ``{hash: graph}`` or a list.
      cost_model: the machine's model; its ``name``/devices must match the records'.
      held_out: records NOT fitted on; the error before and after is reported on them.
      params: which kinds of correction to fit (others keep their current values).
      tie: kinds fitted as one shared value: ``link_scale`` (one scale for every link),
        ``compute_scale``/``extra_overhead_s`` (one per exclusive group). ``"auto"``:
        compute scale and overhead tied within exclusive groups (devices sharing compute
        drift together), link scales tied unless there are 5 records per ordered link
        (fewer cannot pin them one by one, and would overfit).
      regularization: weight of the pull towards identity.
      loss: scipy's ``least_squares`` loss on the log ratios (``"soft_l1"`` lets a few
        noisy measurements pull less).
      max_nfev: most evaluations of the least-squares solver.
      note: free text kept in the history entry.

    Returns:
      A ``DriftFit``: the corrected model, the corrections and the errors.
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
    free, tmap, nv = problem.free, problem.tie_map, problem.num_vars
    lam = math.sqrt(max(regularization, 0.0))
    # one-hot [free entries, variables]: dz[free]/dx
    onehot = np.zeros((len(free), nv))
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

    if nv:
        # start from the current corrections (the mean of tied entries)
        x0 = (z0[free] @ onehot) / np.maximum(onehot.sum(axis=0), 1)
        is_log = ((free < d) | (free >= 2 * d)) @ onehot > 0
        lower = np.where(is_log, math.log(1e-3), -np.inf)
        upper = np.where(is_log, math.log(1e3), np.inf)
        x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)
        sol = least_squares(fun, x0, jac=jac, method="trf", bounds=(lower, upper),
                            loss=loss, f_scale=0.1, max_nfev=max_nfev)
        z = expand(sol.x)
        status = {"cost": float(sol.cost), "nfev": int(sol.nfev), "status": int(sol.status),
                  "variables": int(nv)}
    else:
        z, status = z0, {"note": "nothing to fit"}
    pred_before = _predict(cost_model, records, graphs)
    dates = [r["date"] for r in records if r.get("date")]
    entry = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "method": "fit_drift (scipy least_squares on log step-time ratios)",
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
    fit_s = _scores(pred_before, pred_after, meas)
    held = None
    if held_out:
        hm = np.array([r["measured_step_time_s"] for r in held_out], dtype=float)
        held = _scores(_predict(cost_model, held_out, graphs),
                       _predict(corrected, held_out, graphs), hm)
    entry["fit"] = _jsonable(fit_s)
    entry["held_out"] = _jsonable(held)
    corr = problem.corrections(z, history=tuple(cost_model.corrections.history) + (entry,))
    return DriftFit(cost_model.with_corrections(corr), corr, fit_s, held, entry)


def _jsonable(d: dict | None) -> dict | None:
    if d is None:
        return None
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in d.items()}


# --------------------------------------------------------------------------- search hook
ValidationCallback = Callable[[int, Sequence[np.ndarray], CostModel], "CostModel | None"]


def make_validation_callback(graph: OpGraph, fn, args, cost_model: CostModel, top_k: int = 3,
                             every: int = 1, *, program=None, held_out_fraction: float = 0.0,
                             records_path: str | os.PathLike | None = None,
                             timing: Mapping | None = None, min_records: int = 2,
                             params: Sequence[str] = FIT_PARAMS,
                             regularization: float = 1e-3,
                             progress: Callable[[str], None] | None = None):
    """A hook for searches that validates their best candidates and corrects drift.

    The returned callable has the signature
    ``callback(update_index: int, candidates: Sequence[int32[M]], cost_model: CostModel)
    -> CostModel | None``:

    * it acts when ``update_index % every == 0`` (and always when ``update_index < 0``,
      which a search passes at its end), else returns None at once;
    * ``candidates`` are placements of ``graph``, best first; the first ``top_k``
      distinct ones are run on hardware (``validate``) against ``cost_model`` (the model
      the search uses now), and their records are added to all records so far;
    * with at least ``min_records`` records, drift corrections are fitted on them all
      (``fit_drift``; with ``held_out_fraction`` > 0 that share is held out and
      reported) and the corrected model is returned: the search should continue
      against it. Otherwise None.

    Attributes of the callable: ``records`` (every record so far), ``reports`` (one
    ``ValidationReport`` per call that validated), ``fits`` (one ``DriftFit`` per fit),
    ``measured`` (``{placement bytes: measured step time s}``).
    """
    from simplace.execute import prepare

    if int(top_k) < 1 or int(every) < 1:
        raise SimplaceError(f"validation callback: top_k and every must be >= 1, got "
                            f"top_k={top_k}, every={every}.")
    if program is None:
        program = prepare(fn, args)
    run_args = tuple(args)
    if program.graph.hash != graph.hash:
        raise PlacementError("validation callback: the function does not trace to the graph "
                             "being searched; pass the model function and sizes it came from.")
    state: dict[str, Any] = {"records": [], "reports": [], "fits": [], "measured": {}}

    def callback(update_index: int, candidates, current: CostModel):
        if update_index >= 0 and update_index % int(every):
            return None
        chosen, seen = [], set()
        for c in candidates:
            a = check_placement(c, graph.num_ops, current.num_devices)
            key = a.tobytes()
            if key in seen:
                continue
            seen.add(key)
            chosen.append(a)
            if len(chosen) >= int(top_k):
                break
        if not chosen:
            return None
        rep = validate(graph, current, chosen, program=program, args=run_args,
                       labels=[f"u{update_index}#{k}" for k in range(len(chosen))],
                       methods=["search"] * len(chosen), timing=timing,
                       records_path=records_path, progress=progress)
        state["reports"].append(rep)
        state["records"].extend(rep.records)
        for a, r in zip(chosen, rep.rows, strict=True):
            state["measured"][a.tobytes()] = r.measured_s
        if progress:
            progress(f"validation at update {update_index}: MAPE {100 * rep.mape:.1f}% on "
                     f"{len(chosen)} candidates")
        recs = state["records"]
        if len(recs) < int(min_records):
            return None
        fit, held = (split_records(recs, 1 - held_out_fraction, seed=len(recs))
                     if held_out_fraction > 0 else (recs, None))
        res = fit_drift(fit, {graph.hash: graph}, current, held_out=held, params=params,
                        regularization=regularization,
                        note=f"validation callback, update {update_index}")
        state["fits"].append(res)
        if progress:
            progress("drift fit: " + res.summary().splitlines()[0])
        return res.cost_model

    callback.records = state["records"]
    callback.reports = state["reports"]
    callback.fits = state["fits"]
    callback.measured = state["measured"]
    callback.program = program
    callback.run_args = run_args
    callback.timing = dict(timing or {})
    return callback


def rl_status_callback(callback, cost_model: CostModel):
    """Adapt a validation ``callback`` to the RL trainer's hook,
    ``f(RLStatus) -> CostModel | None``.

    Each status's ``candidates`` (best first) are validated; a corrected cost model is
    returned to the trainer, which trains on against it, and kept in
    ``f.state["cost_model"]``; ``f.validation`` is the wrapped callback. Pass ``every=1``
    to ``make_validation_callback``: the trainer's ``callback_every`` already spaces calls.
    """
    state = {"cost_model": cost_model}

    def on_status(status):
        cands = [np.asarray(c[0] if isinstance(c, tuple) else c) for c in status.candidates]
        if not cands:
            cands = [np.asarray(status.best_placement)]
        new = callback(-1 if status.done else int(status.update), cands, state["cost_model"])
        if new is not None:
            state["cost_model"] = new
        return new  # the trainer goes on against a corrected model

    on_status.state = state
    on_status.validation = callback
    return on_status

"""Validate placements on hardware and correct the cost model where it drifted.

* ``validate(graph, cost_model, placements, fn=..., args=...)`` runs each placement for
  real (``simplace.execute``), times its step with the calibration harness and compares
  it with the simulator's prediction: a ``ValidationReport`` with one row per candidate,
  the mean absolute percentage error (``mape``) and the rank agreement of predicted and
  measured times (``kendall_tau``). Its ``records`` go to
  ``calibration/NAME/validation.jsonl`` (``append_records``).
* ``fit_drift(records, graphs, cost_model, held_out=...)`` fits drift ``Corrections``
  (per-device compute scale of fused op times, per-device extra overhead of each
  segment launch, per-link scale of copy times) by least squares on the log ratio of
  simulated to measured step time, re-simulating every record (the step time is a
  max-plus function of the corrections; its exact subgradient comes from the critical
  path of each simulated segment schedule). Corrections are fitted on the *uncorrected*
  model, so they never compound, and appended to the corrections' history with what
  they were fitted on. The error of the raw (uncorrected) and the corrected model is
  reported side by side on the records fitted and on held-out ones, so a correction
  that does not generalise shows.
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

__all__ = ["DriftFit", "ValidationReport", "ValidationRow", "append_records", "SearchValidation",
           "calibration_dir", "fit_drift", "kendall_tau", "make_validation_callback",
           "mape", "raw_model", "read_records", "split_records", "validate",
           "validation_path"]

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
    """Where validation records go by default: the user directory's ``calibration/``
    (``$SIMPLACE_HOME``; see ``simplace.paths``)."""
    from simplace import paths

    return paths.user_records_dir()


def validation_path(cost_model_name: str, records_dir: str | os.PathLike | None = None
                    ) -> Path:
    """``<records_dir or calibration_dir()>/NAME/validation.jsonl``."""
    from simplace import paths

    return paths.records_path(cost_model_name, "validation.jsonl", records_dir)


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
    """One candidate: the step time (s) predicted by the cost model as given
    (``predicted_s``, its drift corrections applied) and by the raw, uncorrected model
    (``raw_predicted_s``; the same when the model carries no corrections), the measured
    time, relative errors ``(predicted - measured) / measured``, and the placed step's
    shape as the executor ran it (``num_segments``, ``num_transfers``) and as the
    simulator counted it (``sim_num_segments``, ``sim_num_transfers``; -1: unknown)."""

    label: str
    method: str
    predicted_s: float
    measured_s: float
    measured_mad_s: float
    num_segments: int
    num_transfers: int
    raw_predicted_s: float | None = None
    sim_num_segments: int = -1
    sim_num_transfers: int = -1

    def __post_init__(self):
        if self.raw_predicted_s is None:
            object.__setattr__(self, "raw_predicted_s", self.predicted_s)

    @property
    def rel_error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def raw_rel_error(self) -> float:
        return (self.raw_predicted_s - self.measured_s) / self.measured_s


@dataclasses.dataclass(frozen=True, eq=False)
class ValidationReport:
    """Predicted vs measured step times of several placements on one machine.

    rows: one ``ValidationRow`` per candidate, in the order given.
    mape, kendall_tau: mean |relative error| (fraction) and rank agreement (NaN below
      2) of the model as given (``corrected``: whether it carries drift corrections);
      raw_mape, raw_kendall_tau: the same for the uncorrected model.
    records: the JSON records (``append_records``), one per row.
    """

    cost_model: str
    graph_name: str
    rows: tuple[ValidationRow, ...]
    records: tuple[dict, ...]
    corrected: bool = False

    @property
    def predicted_s(self) -> np.ndarray:
        return np.array([r.predicted_s for r in self.rows])

    @property
    def raw_predicted_s(self) -> np.ndarray:
        return np.array([r.raw_predicted_s for r in self.rows])

    @property
    def measured_s(self) -> np.ndarray:
        return np.array([r.measured_s for r in self.rows])

    @property
    def mape(self) -> float:
        return mape(self.predicted_s, self.measured_s)

    @property
    def kendall_tau(self) -> float:
        return kendall_tau(self.predicted_s, self.measured_s)

    @property
    def raw_mape(self) -> float:
        return mape(self.raw_predicted_s, self.measured_s)

    @property
    def raw_kendall_tau(self) -> float:
        return kendall_tau(self.raw_predicted_s, self.measured_s)

    def summary(self) -> str:
        """MAPE and Kendall tau of the raw and the corrected model, one line each."""
        n = f"({len(self.rows)} candidates)"
        raw = f"MAPE {_fmt_pct(self.raw_mape):>6}   Kendall tau {_fmt_tau(self.raw_kendall_tau)}"
        if not self.corrected:
            return (f"raw model:       {raw}   {n}\n"
                    "corrected model: the same (the cost model carries no drift corrections)")
        return (f"raw model:       {raw}   {n}\n"
                f"corrected model: MAPE {_fmt_pct(self.mape):>6}   Kendall tau "
                f"{_fmt_tau(self.kendall_tau)}")

    def table(self) -> str:
        """A text table: one line per candidate (raw and corrected prediction, measured
        time, both errors, segments and transfers), then ``summary()``. A segment or
        transfer count the simulator does not share with the executor shows as
        ``executor/simulator``."""
        head = (f"{'candidate':<22} {'method':<12} {'raw ms':>10} {'corr. ms':>10} "
                f"{'measured ms':>11} {'+-mad ms':>9} {'raw err':>8} {'corr err':>8} "
                f"{'segments':>8} {'moves':>7}")
        lines = [f"validation of {self.graph_name} on {self.cost_model} "
                 f"({'drift-corrected' if self.corrected else 'no drift corrections'})",
                 head, "-" * len(head)]

        def count(run, sim):
            return str(run) if sim < 0 or sim == run else f"{run}/{sim}"

        for r in self.rows:
            lines.append(
                f"{r.label[:22]:<22} {r.method[:12]:<12} {r.raw_predicted_s * 1e3:>10.3f} "
                f"{r.predicted_s * 1e3:>10.3f} {r.measured_s * 1e3:>11.3f} "
                f"{r.measured_mad_s * 1e3:>9.3f} {100 * r.raw_rel_error:>+7.1f}% "
                f"{100 * r.rel_error:>+7.1f}% "
                f"{count(r.num_segments, r.sim_num_segments):>8} "
                f"{count(r.num_transfers, r.sim_num_transfers):>7}")
        lines.append(self.summary())
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
      A ``ValidationReport`` (rows, ``mape``/``kendall_tau`` of the model as given,
      ``raw_mape``/``raw_kendall_tau`` of the uncorrected model, ``records``).
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
    raw_cm = raw_model(cost_model)
    host = platform.node()
    jobs = []
    for k, (a, method, label) in enumerate(items):
        if labels is not None:
            label = labels[k]
        if methods is not None:
            method = methods[k]
        sim = simulate(graph, cost_model, a)
        pred = float(sim.step_time_s)
        raw = pred if raw_cm is cost_model else float(simulate(graph, raw_cm, a).step_time_s)
        placed = program.place(a, devices=devices, transfers=transfers)
        jobs.append((a, method, label, (pred, raw, sim), placed))
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
    for k, (a, method, label, (pred, raw, sim), _) in enumerate(jobs):
        step = robust_stats(samples[k])
        meas = meas_first[k]
        row = ValidationRow(label, method, pred, float(step.median_s), float(step.mad_s),
                            meas.num_segments, meas.num_transfers, raw_predicted_s=raw,
                            sim_num_segments=sim.num_segments,
                            sim_num_transfers=sim.num_transfers)
        rows.append(row)
        records.append({
            "schema": RECORD_SCHEMA, "schema_version": RECORD_SCHEMA_VERSION,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": host, "cost_model": cost_model.name,
            "corrected": not cost_model.corrections.is_identity,
            "graph_hash": graph.hash, "graph_name": graph.name,
            "device_names": list(cost_model.device_names), "label": label, "method": method,
            "assignment": a.tolist(), "predicted_step_time_s": pred,
            "raw_predicted_step_time_s": raw,
            "measured_step_time_s": float(step.median_s), "timing": step.to_dict(),
            "rounds": int(rounds),
            "num_segments": meas.num_segments, "num_transfers": meas.num_transfers,
            "bytes_transferred": meas.bytes_transferred, "transfers": transfers,
            "sim_num_segments": sim.num_segments, "sim_num_transfers": sim.num_transfers,
            "sim_bytes_moved": sim.bytes_moved, "sim_host_s": sim.host_s,
        })
        if progress:
            corr = "" if raw_cm is cost_model else f", corrected {pred * 1e3:.3f} ms " \
                f"({100 * row.rel_error:+.1f}%)"
            progress(f"{label}: measured {step.median_s * 1e3:.3f} ms, predicted raw "
                     f"{raw * 1e3:.3f} ms ({100 * row.raw_rel_error:+.1f}%){corr}")
    if records_path is not None:
        append_records(records_path, records)
    return ValidationReport(cost_model.name, graph.name, tuple(rows), tuple(records),
                            corrected=raw_cm is not cost_model)


# --------------------------------------------------------------------------- drift fit
def _critical_path(graph: OpGraph, group: np.ndarray, placement: np.ndarray, sched,
                   step_time_s: float | None = None, latency_s: np.ndarray | None = None
                   ) -> tuple[list[int], list[tuple[int, bool]]]:
    """(segments, transfers) on one critical path of a simulated schedule; each
    transfer comes with whether its whole duration is on the path (True) or only the
    time it kept its link busy, its bytes (False: a later copy on the link waited).

    Walking back from the last event (``simplace.sim.reference``'s semantics): a segment
    started when its exclusive group's previous segment ended, when one of its input
    copies arrived, or when the host dispatched it; a copy started when its
    ``device_put`` call was made, when its producer's segment ended, or when the previous
    copy on its link freed the link (its arrival minus the link's ``latency_s``). Host
    calls cost fixed host time (``dispatch_s``, ``put_s``: no correction scales them),
    so a path that reaches one ends there, and a step that ends with a host call
    (host-bound) has an empty path. At ties a device event wins
    over a host call (the right derivative). Each step goes to an earlier segment, or to
    a copy issued no later, so the walk ends.
    """
    first = sched.segment_first.tolist()
    stop = sched.segment_stop.tolist()
    dev = sched.segment_device.tolist()
    s_disp, s_end = sched.segment_dispatch_s.tolist(), sched.segment_end_s.tolist()
    t_op, t_to = sched.transfer_op.tolist(), sched.transfer_to.tolist()
    t_from = sched.transfer_from.tolist()
    t_issue, t_end = sched.transfer_issue_s.tolist(), sched.transfer_end_s.tolist()
    lat = np.zeros((1, 1)) if latency_s is None else np.asarray(latency_s)
    t_free = [e - (float(lat[a, b]) if latency_s is not None else 0.0)
              for e, a, b in zip(t_end, t_from, t_to, strict=True)]
    n_seg = len(first)
    if n_seg == 0:
        return [], []
    p = np.asarray(placement).tolist()
    grp = np.asarray(group)[sched.segment_device].tolist()
    seg_of = sched.op_segment.tolist()
    prev_in_group, last = [-1] * n_seg, {}
    for s, g in enumerate(grp):
        prev_in_group[s] = last.get(g, -1)
        last[g] = s
    tr_of: dict[tuple[int, int], int] = {}
    link_prev, last_link = [], {}
    for t, (o, a, b) in enumerate(zip(t_op, t_from, t_to, strict=True)):
        tr_of[(o, b)] = t
        link_prev.append(last_link.get((a, b), -1))
        last_link[(a, b)] = t
    in_ptr, in_order = (a.tolist() for a in graph.in_edges)
    src = graph.src.tolist()

    def copies_into(s: int) -> set[int]:
        a, d = first[s], dev[s]
        out = set()
        for i in range(a, stop[s]):
            for e in in_order[in_ptr[i]:in_ptr[i + 1]]:
                j = src[e]
                if j < a and p[j] != d:
                    out.add(tr_of[(j, d)])
        return out

    s_last = max(range(n_seg), key=s_end.__getitem__)
    t_last = max(range(len(t_end)), key=t_end.__getitem__) if t_end else -1
    if t_last >= 0 and t_end[t_last] > s_end[s_last]:
        cur, top = ("tr", t_last), t_end[t_last]
    else:
        cur, top = ("seg", s_last), s_end[s_last]
    if step_time_s is not None and step_time_s > top:
        return [], []  # the host's last call ends the step: nothing corrected moves it
    segs: list[int] = []
    trs: list[tuple[int, bool]] = []
    whole = True  # the copy reached was waited for in full (not only its link time)
    while cur is not None:
        kind, k = cur
        if kind == "seg":
            segs.append(k)
            best, nxt = s_disp[k], None  # dispatched: the host chain, fixed time
            j = prev_in_group[k]
            if j >= 0 and s_end[j] >= best:
                best, nxt = s_end[j], ("seg", j)
            for t in sorted(copies_into(k)):
                if t_end[t] > best or (t_end[t] == best and nxt is None):
                    best, nxt = t_end[t], ("tr", t)
            whole = True
        else:
            trs.append((k, whole))
            best, nxt = t_issue[k], None  # the put call: the host chain, fixed time
            s = seg_of[t_op[k]]
            if s_end[s] >= best:
                best, nxt = s_end[s], ("seg", s)
            j = link_prev[k]
            if j >= 0 and (t_free[j] > best or (t_free[j] == best and nxt is None)):
                best, nxt = t_free[j], ("tr", j)
            whole = False
        cur = nxt
    return segs, trs


class _DriftProblem:
    """The step times of records as functions of the corrections, with their gradient.

    The variables ``z``: log compute scale [D], extra launch overhead in units of
    ``_OVERHEAD_UNIT_S`` [D], log link scale on the D*(D-1) ordered links. Under them
    (as ``CostModel`` applies corrections) op times are ``compute_scale[d] * t0``, each
    segment's launch ``max(launch_s[d] + extra_overhead_s[d], 0)`` and each copy
    ``link_scale * (latency + bytes / bandwidth)``; dispatch and put calls (host time)
    are not corrected. A step time is a max-plus function of these, so its derivative is
    that of its critical path (``_critical_path``): d step / d log compute_scale[d] is
    the fused op time of the path's segments on d, d step / d extra_overhead[d] the
    number of those segments (where the launch is not clipped at 0), d step / d log
    link_scale[i, j] the duration of the path's copies over that link.
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
                # do no work cost 0 either way), so t0 is all a correction needs.
                self.per_graph[h] = (g, sim_inputs(g, base))
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
                else "link_scale"
            if coarse:
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
                               np.log(corr.link_scale[self.off[:, 0], self.off[:, 1]])])

    def corrections(self, z: np.ndarray, history=()) -> Corrections:
        d = self.d
        ls = np.ones((d, d))
        ls[self.off[:, 0], self.off[:, 1]] = np.exp(z[2 * d:])
        return Corrections(np.exp(z[:d]), z[d:2 * d] * _OVERHEAD_UNIT_S, ls, tuple(history))

    def inputs(self, h: str, z: np.ndarray):
        """(SimInputs of graph ``h`` under ``z``, bool[D]: launch not clipped at 0).
        Only what corrections scale changes; every other input (host costs...) is the
        uncorrected model's."""
        d = self.d
        _g, inp = self.per_graph[h]
        cs, eo = np.exp(z[:d]), z[d:2 * d] * _OVERHEAD_UNIT_S
        ls = self.corrections(z).link_scale
        launch = inp.launch_s + eo
        return inp._replace(op_time_s=inp.op_time_s * cs[None, :],
                            latency_s=inp.latency_s * ls,
                            bandwidth_bytes_per_s=inp.bandwidth_bytes_per_s / ls,
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
        for r, (h, a, _) in enumerate(self.items):
            g = self.per_graph[h][0]
            inp, live = inputs[h]
            res = simulate(g, inp, a, schedule=grad)
            steps[r] = res.step_time_s
            if not grad:
                continue
            sch = res.schedule
            segs, trs = _critical_path(g, inp.exclusive_group, a, sch, res.step_time_s,
                                       inp.latency_s)
            for s in segs:
                k = int(sch.segment_device[s])
                lo, hi = int(sch.segment_first[s]), int(sch.segment_stop[s])
                jac[r, k] += float(inp.op_time_s[lo:hi, k].sum())
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
        return "\n".join(lines)


def _fmt_tau(t: float | None) -> str:
    return "n/a" if t is None or math.isnan(t) else f"{t:.2f}"


def _fmt_pct(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def _score_line(name: str, s: dict) -> str:
    """``name n=.. MAPE raw x% -> corrected y%   Kendall tau raw a -> corrected b``, and
    the previous corrections' figures when they differ from raw."""
    line = (f"{name:<9} n={s['n']:<3} MAPE raw {_fmt_pct(s['mape_raw']):>6} -> corrected "
            f"{_fmt_pct(s['mape_corrected']):>6}   Kendall tau raw {_fmt_tau(s['tau_raw'])} "
            f"-> corrected {_fmt_tau(s['tau_corrected'])}")
    if s.get("mape_previous") is not None and s["mape_previous"] != s["mape_raw"]:
        line += (f"   (previous corrections: MAPE {_fmt_pct(s['mape_previous'])}, tau "
                 f"{_fmt_tau(s['tau_previous'])})")
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
    launch) per device in units of 10 us, log link_scale per ordered link) with
    ``scipy.optimize.least_squares`` (trust region, exact subgradients from each
    record's critical path through its segment schedule). The step time is piecewise
    linear in the corrections, so the fit has local minima: it is solved from the
    current corrections, from identity and from a coarse fit (one value per kind), and
    again with runaway scales reset, and the best solution is kept. Host time (dispatch
    and put calls) is not corrected: the path of a step stops at a host call. The
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

    It is the validation hook of ``simplace.search`` (option ``validate`` of ``local``
    and the ``rl-*`` methods). Returns a ``SearchValidation``: the callable, with what it
    did as fields.
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
    return SearchValidation(graph=graph, program=program, run_args=run_args,
                            timing=dict(timing or {}), top_k=int(top_k), every=int(every),
                            records_path=records_path, min_records=int(min_records),
                            held_out_fraction=float(held_out_fraction),
                            params=tuple(params), regularization=float(regularization),
                            progress=progress)


@dataclasses.dataclass(eq=False)
class SearchValidation:
    """The validation hook ``make_validation_callback`` makes (see there), with what it
    did: ``records`` (every record so far), ``reports`` (one ``ValidationReport`` per
    call that validated), ``fits`` (one ``DriftFit`` per fit), ``measured`` (``{placement
    bytes: measured step time s}``); ``program``, ``run_args`` and ``timing`` run more."""

    graph: OpGraph
    program: Any
    run_args: tuple
    timing: dict
    top_k: int = 3
    every: int = 1
    records_path: Any = None
    min_records: int = 2
    held_out_fraction: float = 0.0
    params: tuple = FIT_PARAMS
    regularization: float = 1e-3
    progress: Callable[[str], None] | None = None
    records: list = dataclasses.field(default_factory=list)
    reports: list = dataclasses.field(default_factory=list)
    fits: list = dataclasses.field(default_factory=list)
    measured: dict = dataclasses.field(default_factory=dict)

    def __call__(self, update_index: int, candidates, current: CostModel):
        """Validate the best ``top_k`` of ``candidates`` under ``current``; a corrected
        model once there are ``min_records`` records, else None."""
        graph, progress = self.graph, self.progress
        if update_index >= 0 and update_index % int(self.every):
            return None
        chosen, seen = [], set()
        for c in candidates:
            a = check_placement(c, graph.num_ops, current.num_devices)
            key = a.tobytes()
            if key in seen:
                continue
            seen.add(key)
            chosen.append(a)
            if len(chosen) >= self.top_k:
                break
        if not chosen:
            return None
        rep = validate(graph, current, chosen, program=self.program, args=self.run_args,
                       labels=[f"u{update_index}#{k}" for k in range(len(chosen))],
                       methods=["search"] * len(chosen), timing=self.timing,
                       records_path=self.records_path, progress=progress)
        self.reports.append(rep)
        self.records.extend(rep.records)
        for a, r in zip(chosen, rep.rows, strict=True):
            self.measured[a.tobytes()] = r.measured_s
        if progress:
            progress(f"validation at update {update_index} on {len(chosen)} candidates: "
                     f"MAPE raw {_fmt_pct(rep.raw_mape)}"
                     + (f", corrected {_fmt_pct(rep.mape)}" if rep.corrected else ""))
        recs = self.records
        if len(recs) < self.min_records:
            return None
        fit, held = (split_records(recs, 1 - self.held_out_fraction, seed=len(recs))
                     if self.held_out_fraction > 0 else (recs, None))
        res = fit_drift(fit, {graph.hash: graph}, current, held_out=held, params=self.params,
                        regularization=self.regularization,
                        note=f"validation callback, update {update_index}")
        self.fits.append(res)
        if progress:
            progress("drift fit: " + res.summary().splitlines()[0])
        return res.cost_model

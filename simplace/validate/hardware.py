"""Validation on hardware: run placements for real and compare with the simulator.

``validate(graph, cost_model, placements, fn=..., args=...)`` runs each placement
(``simplace.hardware.executor``), times its step with the timing harness and
compares it with the simulator's prediction: a ``ValidationReport`` with one row per
candidate, the mean absolute percentage error (``mape``) and the rank agreement of
predicted and measured times (``kendall_tau``), for the cost model as given and for its
raw (uncorrected) self. Its ``records`` go to ``calibration/NAME/validation.jsonl``
(``simplace.validate.records``).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from simplace.cost_model import CostModel
from simplace.errors import PlacementError, SimplaceError
from simplace.graph import OpGraph
from simplace.hardware.records import ValidationRecord
from simplace.placement import Placement, check_placement
from simplace.validate.drift import priced_with_raw
from simplace.validate.metrics import fmt_pct, fmt_tau, kendall_tau, mape
from simplace.validate.records import append_records

# Untimed runs of every candidate, after its compilation and before any is timed.
WARM_RUNS = 3

__all__ = ["ValidationReport", "ValidationRow", "validate"]


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
        """(predicted - measured) / measured, with the corrections applied."""
        return (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def raw_rel_error(self) -> float:
        """(raw prediction - measured) / measured, before any correction."""
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
        """float64[N]: each row's prediction with corrections, seconds."""
        return np.array([r.predicted_s for r in self.rows])

    @property
    def raw_predicted_s(self) -> np.ndarray:
        """float64[N]: each row's raw prediction, seconds."""
        return np.array([r.raw_predicted_s for r in self.rows])

    @property
    def measured_s(self) -> np.ndarray:
        """float64[N]: each row's measured step time, seconds."""
        return np.array([r.measured_s for r in self.rows])

    @property
    def mape(self) -> float:
        """Mean absolute percentage error of the corrected predictions."""
        return mape(self.predicted_s, self.measured_s)

    @property
    def kendall_tau(self) -> float:
        """Kendall tau between corrected predictions and measurements."""
        return kendall_tau(self.predicted_s, self.measured_s)

    @property
    def raw_mape(self) -> float:
        """Mean absolute percentage error of the raw predictions."""
        return mape(self.raw_predicted_s, self.measured_s)

    @property
    def raw_kendall_tau(self) -> float:
        """Kendall tau between raw predictions and measurements."""
        return kendall_tau(self.raw_predicted_s, self.measured_s)

    def summary(self) -> str:
        """MAPE and Kendall tau of the raw and the corrected model, one line each."""
        n = f"({len(self.rows)} candidates)"
        raw = f"MAPE {fmt_pct(self.raw_mape):>6}   Kendall tau {fmt_tau(self.raw_kendall_tau)}"
        if not self.corrected:
            return (f"raw model:       {raw}   {n}\n"
                    "corrected model: the same (the cost model carries no drift corrections)")
        return (f"raw model:       {raw}   {n}\n"
                f"corrected model: MAPE {fmt_pct(self.mape):>6}   Kendall tau "
                f"{fmt_tau(self.kendall_tau)}")

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


def _time_in_rounds(placed_fns: list, run_args: tuple, timing: dict, rounds: int
                    ) -> tuple[list[list[float]], list]:
    """Every sample of each placed function's step, and its first ``Measurement``."""
    import jax

    from simplace.hardware.executor import measure

    # Time in rounds over all candidates (each round a share of the timing budget) and
    # pool the samples: a change of machine load during the validation then hits every
    # candidate alike instead of the few timed while it lasted.
    per_round = dict(timing, budget_s=float(timing.get("budget_s", 1.0)) / int(rounds),
                     min_repeats=max(1, -(-int(timing.get("min_repeats", 5)) // int(rounds))))
    samples: list[list[float]] = [[] for _ in placed_fns]
    meas_first: list = [None] * len(placed_fns)
    # Every candidate compiled and run a few times before any is timed: the first runs
    # after a compilation are slow (on the 2-core VM the first round's median was 6-13%
    # above the others', up to 2x), and in rounds interleaved with compilations of the
    # other candidates that slowness would land in the first round's samples only.
    # The runs after the first (which compiles) stop once they have taken a round's
    # timing budget, so that slow steps do not stretch a validation's time.
    for placed in placed_fns:
        placed_args = placed.place_args(*run_args)
        jax.block_until_ready(placed.run(placed_args))
        start = time.perf_counter()
        for _ in range(WARM_RUNS - 1):
            jax.block_until_ready(placed.run(placed_args))
            if time.perf_counter() - start > per_round["budget_s"]:
                break
    for _ in range(int(rounds)):
        for k, placed in enumerate(placed_fns):
            m = measure(placed, run_args, **per_round)
            samples[k] += list(m.step.samples_s)
            if meas_first[k] is None:
                meas_first[k] = m
    return samples, meas_first


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
        abstract=False)``); or ``program``: a ``simplace.hardware.executor.Program`` of them
        (reuse it across calls: compiled segments are cached there).
      labels, methods: names of the candidates for the report (default ``#k`` / the
        placement's method).
      devices: the JAX device of each index (default: by the cost model's device names).
      timing: options of the harness (``warmup``, ``min_repeats``, ``budget_s``...).
      records_path: also append the records to this JSON Lines file.
      transfers: how the executor moves tensors (``Program.place``): ``"producer"``
        (default, as ``apply`` does and the simulator models it) or ``"segment"``.
      rounds: the candidates are timed in this many interleaved rounds, each with
        ``1/rounds`` of the timing budget, and each one's samples pooled (robust median);
        before the first, every candidate is compiled and run up to ``WARM_RUNS`` times
        (no longer than a round's budget after the first run).
      progress: called with a line per candidate.

    Returns:
      A ``ValidationReport`` (rows, ``mape``/``kendall_tau`` of the model as given,
      ``raw_mape``/``raw_kendall_tau`` of the uncorrected model, ``records``).
    """
    from simplace._argtypes import check_int
    from simplace.hardware.executor import prepare, resolve_devices
    from simplace.hardware.timing import robust_stats
    from simplace.sim import simulate

    try:
        empty = placements is None or len(placements) == 0
    except TypeError:  # a single object without a length: _as_assignments says what
        empty = False
    if empty:
        raise PlacementError("validate needs at least one placement to run (Placement "
                             "objects, int[M] arrays or an int[B, M] array); got none.")
    check_int(rounds, "rounds", 1)
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
    rows, records = [], []
    priced, raw_priced = priced_with_raw(graph, cost_model)
    host = platform.node()
    jobs = []
    for k, (a, method, label) in enumerate(items):
        if labels is not None:
            label = labels[k]
        if methods is not None:
            method = methods[k]
        sim = simulate(graph, priced, a)
        pred = float(sim.step_time_s)
        raw = pred if raw_priced is priced else float(
            simulate(graph, raw_priced, a).step_time_s)
        placed = program.place(a, devices=devices, transfers=transfers)
        jobs.append((a, method, label, (pred, raw, sim), placed))
    samples, meas_first = _time_in_rounds([j[-1] for j in jobs], run_args, timing, rounds)
    for k, (a, method, label, (pred, raw, sim), _) in enumerate(jobs):
        step = robust_stats(samples[k])
        meas = meas_first[k]
        row = ValidationRow(label, method, pred, float(step.median_s), float(step.mad_s),
                            meas.num_segments, meas.num_transfers, raw_predicted_s=raw,
                            sim_num_segments=sim.num_segments,
                            sim_num_transfers=sim.num_transfers)
        rows.append(row)
        records.append(ValidationRecord(
            date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            host=host, cost_model=cost_model.name,
            corrected=not cost_model.corrections.is_identity, graph_hash=graph.hash,
            graph_name=graph.name, device_names=list(cost_model.device_names), label=label,
            method=method, assignment=a.tolist(), predicted_step_time_s=pred,
            raw_predicted_step_time_s=raw, measured_step_time_s=float(step.median_s),
            timing=step, rounds=int(rounds), num_segments=meas.num_segments,
            num_transfers=meas.num_transfers, bytes_transferred=meas.bytes_transferred,
            transfers=transfers, sim_num_segments=sim.num_segments,
            sim_num_transfers=sim.num_transfers, sim_bytes_moved=sim.bytes_moved,
            sim_host_s=sim.host_s).to_dict())
        if progress:
            corr = "" if raw_priced is priced else f", corrected {pred * 1e3:.3f} ms " \
                f"({100 * row.rel_error:+.1f}%)"
            progress(f"{label}: measured {step.median_s * 1e3:.3f} ms, predicted raw "
                     f"{raw * 1e3:.3f} ms ({100 * row.raw_rel_error:+.1f}%){corr}")
    if records_path is not None:
        append_records(records_path, records)
    return ValidationReport(cost_model.name, graph.name, tuple(rows), tuple(records),
                            corrected=not cost_model.corrections.is_identity)


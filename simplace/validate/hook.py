"""The validation hook of a search: validate its best candidates, correct the drift.

``make_validation_callback(...)`` makes the hook a search session calls every N updates
(RL) or rounds (local search), and at its end, with its best candidates
(``simplace.search``: ``(step, candidates, cost_model) -> CostModel | None``); it
validates them on hardware (``simplace.validate.hardware``), refits the drift on every
record so far (``simplace.validate.drift``) and returns the corrected cost model.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from simplace.cost_model import CostModel
from simplace.errors import PlacementError, SimplaceError
from simplace.graph import OpGraph
from simplace.placement import check_placement
from simplace.validate.drift import FIT_PARAMS, fit_drift
from simplace.validate.hardware import validate
from simplace.validate.metrics import fmt_pct
from simplace.validate.records import split_records

__all__ = ["SearchValidation", "ValidationCallback", "make_validation_callback"]


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
    from simplace.hardware.executor import prepare

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
                     f"MAPE raw {fmt_pct(rep.raw_mape)}"
                     + (f", corrected {fmt_pct(rep.mape)}" if rep.corrected else ""))
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

"""Validation records: one JSON object per validated placement, appended to
``calibration/NAME/validation.jsonl`` (JSON Lines), and read back for drift fits.

A record holds the machine (``cost_model``, ``device_names``), the graph
(``graph_hash``, ``graph_name``), the placement (``assignment``, ``method``), the
predicted (``predicted_step_time_s``, raw and corrected) and the measured step time
(``measured_step_time_s`` and its ``timing``), and the placed step's shape as run and as
simulated. ``split_records`` splits records into a fitted and a held-out share.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simplace import _jsonl
from simplace.errors import SimplaceError
from simplace.hardware.records import (
    RECORD_SCHEMA,
    RECORD_SCHEMA_VERSION,
    Record,
    validation_record,
)

__all__ = ["RECORD_SCHEMA", "RECORD_SCHEMA_VERSION", "append_records", "calibration_dir",
           "check_record", "read_records", "split_records", "validation_path"]

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


def check_record(rec: Any, where: str) -> dict:
    """``rec`` checked as a validation record (``simplace.hardware.records.
    ValidationRecord``); ``SimplaceError`` naming ``where`` and what is wrong otherwise."""
    validation_record(rec, where)
    return rec


def append_records(path: str | os.PathLike, records: Sequence[Mapping | Record]) -> None:
    """Append validation records to a JSON Lines file, one flushed line each (see
    ``simplace._jsonl`` for what happens to a line cut short by an interrupted write).
    Every record is checked first, so a bad one appends nothing."""
    records = [check_record(r.to_dict() if isinstance(r, Record) else dict(r), f"record {k}")
               for k, r in enumerate(records)]
    _jsonl.append(path, records)


def read_records(path: str | os.PathLike) -> list[dict]:
    """The validation records of a JSON Lines file, checked; an error names the file and
    line of a bad one. A last line cut short by an interrupted write is skipped with a
    warning."""
    lines = _jsonl.read(path, SimplaceError,
                        missing=f"No validation records at {path}: run `simplace validate` "
                                "on this machine first.",
                        mend="the placement it measured can be validated again")
    return [check_record(rec, f"{path}, line {n}") for n, rec in lines]


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


"""Validation records: one JSON object per validated placement, appended to
``calibration/NAME/validation.jsonl`` (JSON Lines), and read back for drift fits.

A record holds the machine (``cost_model``, ``device_names``), the graph
(``graph_hash``, ``graph_name``), the placement (``assignment``, ``method``), the
predicted (``predicted_step_time_s``, raw and corrected) and the measured step time
(``measured_step_time_s`` and its ``timing``), and the placed step's shape as run and as
simulated. ``split_records`` splits records into a fitted and a held-out share.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simplace.errors import SimplaceError

__all__ = ["RECORD_SCHEMA", "RECORD_SCHEMA_VERSION", "append_records", "calibration_dir",
           "read_records", "split_records", "validation_path"]

RECORD_SCHEMA = "simplace.validation_record"
RECORD_SCHEMA_VERSION = 1


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


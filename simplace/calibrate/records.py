"""Calibration records: every raw measurement, one JSON object per line (JSON Lines).

``calibration/NAME/records.jsonl`` holds, in order taken:

* one ``header`` (first line): schema, name, host, date, JAX versions, the devices seen
  (name, kind, JAX id, memory_bytes) and the settings of the run;
* ``runtime`` records: per device, a tiny jitted call's blocking time (``block``) and
  host time when only dispatched (``host``);
* ``segment`` records: a run of ops ``first..stop-1`` of a zoo graph (``model``) timed
  alone as one jitted computation on ``device``, with its ops' ``primitive``, ``flops``
  and ``bytes_accessed``; ``segment_error``: a model whose segments could not be run;
* ``host`` records: the host time of one step of a placement of a ``model`` (calls
  only, not waiting), with the segments it dispatched per device and the puts per
  link (``puts[from][to]``);
* ``put_host`` records: the host time of one ``jax.device_put`` call from ``src`` to
  ``dst``;
* ``put_wait`` records: whether a put from ``src`` to ``dst`` holds the host until its
  copy is in (``waits``: true, false, or null when the probe cannot tell), from a put of
  an array still being computed (``call_s``: the put call's host time; ``dispatch_s``
  and ``compute_s``: the computation's call and blocking time);
* ``op`` records: one op signature of a ``--models`` graph timed alone on one device
  of each kind of hardware (which ops the runtime runs on a thread pool) (``device``,
  ``signature``,
  ``primitive``, ``op_class``, ``flops``, ``bytes_accessed``, ``set`` = ``micro`` for
  the fit's microbenchmarks or ``model`` for signatures of the graphs named with
  ``--models``, and ``timing``: every sample and the robust statistics);
* ``op_error`` records: a signature that could not be run alone on a device (why);
* ``link`` records: ``nbytes`` sent from ``src`` to ``dst`` with ``jax.device_put``
  (``timing``: blocking, from the call to the arrival; ``after_call``, optional: from
  the call's return to the arrival);
* ``link_chain`` records: copies between ``a`` and ``b`` timed in context: a chain of
  ``hops + 1`` segments alternating between the two devices, each fed by a
  ``jax.device_put`` of ``nbytes`` (``chain``, and ``chain_host``: the host time of
  dispatching it), against the same segments chained on ``a`` alone and on ``b`` alone
  (``alone_a``, ``alone_b``); ``loop``: each device's segment length (absent in older
  records);
* ``exclusive`` records: the same work timed on devices ``a`` and ``b`` alone and
  together (``alone_a``, ``alone_b``, ``together`` timings);
* ``rate`` records: one op class's saturating microbenchmark on ``device``
  (``simplace.calibrate.rates``): ``op_class``, ``unit`` (flop or byte), the ``rate``
  kept, whether the series ``saturated`` (and ``why`` not), and its ``points`` (size,
  work, median time, rate);
* ``phase`` records: a phase (``runtime``, ``segments``, ``model:NAME``, ``links``,
  ``link_chains``, ``exclusive``) finished, so that
  ``--resume`` knows what is left.

A run appends and flushes one line per measurement, so an interrupted run keeps all it
measured. Reading validates every line and names the line of a bad one; a last line cut
short by an interrupted write is skipped with a warning (the policy of every records
file: ``simplace._jsonl``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from simplace import _jsonl
from simplace.errors import CalibrationError
from simplace.hardware.records import (
    DEVICE_FIELDS,
    SCHEMA,
    SCHEMA_VERSION,
    Record,
    calibration_record,
)

__all__ = ["DEVICE_FIELDS", "SCHEMA", "SCHEMA_VERSION", "RecordWriter",
           "check_record", "load_records", "read_records", "write_records"]

def check_record(rec: Any, where: str) -> dict[str, Any]:
    """``rec`` validated as a record (see the module docstring and
    ``simplace.hardware.records``); CalibrationError naming ``where`` and the bad field
    otherwise. Timings are checked by parsing them."""
    calibration_record(rec, where)
    return rec


def read_records(path: str | os.PathLike) -> list[dict]:
    """Every record of a records file, validated; the first must be the header.

    A bad line raises CalibrationError naming the file and line number. A last line cut
    short by an interrupted write is skipped with a warning (``simplace._jsonl``):
    ``simplace calibrate --resume`` measures what it held again.
    """
    return [d for d, _ in _read(path)]


def load_records(path: str | os.PathLike) -> list[Record]:
    """``read_records(path)`` as typed records (``simplace.hardware.records``): one
    object per line, the header first."""
    return [r for _, r in _read(path)]


def _read(path: str | os.PathLike) -> list[tuple[dict, Record]]:
    """``(JSON object, record)`` per line of a records file; see ``read_records``."""
    path = Path(path)
    lines = _jsonl.read(path, CalibrationError,
                        missing=f"Records file {path} does not exist; run `simplace "
                                "calibrate` first (or give the right --name).",
                        mend="`simplace calibrate --name NAME --resume` measures what the "
                             "unfinished phases lack again")
    out: list[tuple[dict, Record]] = []
    for n, d in lines:
        where = f"{path}, line {n}"
        rec = calibration_record(d, where)
        if (not out) != (rec.kind == "header"):
            raise CalibrationError(f"{where}: " + (
                "the first record must be the header." if not out
                else "a second header; a records file has one, on line 1."))
        out.append((d, rec))
    if not out:
        raise CalibrationError(f"Records file {path} is empty: it needs a header line.")
    return out


class RecordWriter(_jsonl.Appender):
    """Appends records to a JSON Lines file, one flushed line per record, so that an
    interrupted run loses at most the record being written (``simplace._jsonl``: a line
    an earlier run left cut short is dropped first). Each record is checked first."""

    def write(self, rec: Record | Mapping[str, Any]) -> None:
        """Validate and append one record (a typed record, or a JSON object written as
        given)."""
        if isinstance(rec, Record):
            rec = rec.to_dict()
        super().write(check_record(dict(rec), f"record for {self.path}"))

    def write_all(self, recs: Iterable[Record | Mapping[str, Any]]) -> None:
        """Validate and append each record in turn."""
        for r in recs:
            self.write(r)


def write_records(path: str | os.PathLike,
                  records: Iterable[Record | Mapping[str, Any]]) -> None:
    """Write ``records`` as a new file, header first, atomically (a temporary file then a
    rename: an interrupted write leaves the old file whole)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)
        with RecordWriter(tmp) as w:
            w.write_all(records)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

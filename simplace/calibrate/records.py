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
  (``alone_a``, ``alone_b``); ``loop``: each device's segment length (recorded since
  2026-11-24);
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
from simplace._jsonfile import check_fields, check_schema
from simplace.errors import CalibrationError
from simplace.hardware.timing import Timing

SCHEMA = "simplace.calibration_records"
SCHEMA_VERSION = 2  # 1: single-op timings (dispatch and launch in every op)
_VERSION_1 = ("version 1 timed single ops, which this simplace no longer fits: measure the "
              "machine again with `simplace calibrate --name NAME --overwrite`.")

# Fields every record of a kind must carry (besides "kind"), and their JSON types.
_NUM = (float,)  # any JSON number (check_fields: true/false never count)
FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "header": {"schema": (str,), "schema_version": (int,), "name": (str,), "host": (str,),
               "date": (str,), "jax_version": (str,), "jaxlib_version": (str,),
               "devices": (list,), "settings": (dict,)},
    "op": {"device": (str,), "signature": (str,), "primitive": (str,), "op_class": (str,),
           "flops": _NUM, "bytes_accessed": _NUM, "set": (str,), "timing": (dict,)},
    "op_error": {"device": (str,), "signature": (str,), "error": (str,)},
    "runtime": {"device": (str,), "block": (dict,), "host": (dict,)},
    "put_host": {"src": (str,), "dst": (str,), "timing": (dict,)},
    "put_wait": {"src": (str,), "dst": (str,), "call_s": _NUM, "dispatch_s": _NUM,
                 "compute_s": _NUM},
    "segment": {"device": (str,), "model": (str,), "first": (int,), "stop": (int,),
                "primitive": (list,), "flops": (list,), "bytes_accessed": (list,),
                "timing": (dict,)},
    "segment_error": {"model": (str,), "error": (str,)},
    "host": {"model": (str,), "segments": (list,), "puts": (list,), "timing": (dict,)},
    "link": {"src": (str,), "dst": (str,), "nbytes": _NUM, "timing": (dict,)},
    "exclusive": {"a": (str,), "b": (str,), "alone_a": (dict,), "alone_b": (dict,),
                  "together": (dict,)},
    "link_chain": {"a": (str,), "b": (str,), "nbytes": _NUM, "hops": (int,),
                   "alone_a": (dict,), "alone_b": (dict,), "chain": (dict,),
                   "chain_host": (dict,)},
    "rate": {"device": (str,), "op_class": (str,), "unit": (str,), "rate": _NUM,
             "saturated": (bool,), "points": (list,)},
    "phase": {"phase": (str,)},
}
_TIMING_FIELDS = {"op": ("timing",), "link": ("timing",), "runtime": ("block", "host"),
                  "put_host": ("timing",), "segment": ("timing",), "host": ("timing",),
                  "exclusive": ("alone_a", "alone_b", "together"),
                  "link_chain": ("alone_a", "alone_b", "chain", "chain_host")}
# Timings a record may hold besides its required ones (``after_call``: a link's copy
# time from the put call's return, recorded since 2026-11-23).
_OPTIONAL_TIMING_FIELDS = {"link": ("after_call",)}
DEVICE_FIELDS = ("name", "kind", "id", "memory_bytes")


def check_record(rec: Any, where: str) -> dict[str, Any]:
    """``rec`` validated as a record (see the module docstring); CalibrationError naming
    ``where`` and the bad field otherwise. Timings are checked by parsing them."""
    if not isinstance(rec, dict):
        raise CalibrationError(f"{where}: a record must be a JSON object, got "
                               f"{type(rec).__name__}.")
    kind = rec.get("kind")
    if kind not in FIELDS:
        raise CalibrationError(f"{where}: 'kind' must be one of {', '.join(FIELDS)}, got "
                               f"{kind!r}.")
    check_fields(rec, FIELDS[kind], CalibrationError, where,
                 what=f"{'an' if kind[0] in 'aeio' else 'a'} {kind} record")
    for field in _TIMING_FIELDS.get(kind, ()) + tuple(
            f for f in _OPTIONAL_TIMING_FIELDS.get(kind, ()) if f in rec):
        try:
            Timing.from_dict(rec[field])
        except CalibrationError as err:
            raise CalibrationError(f"{where}: field {field!r}: {err}") from None
    if kind == "put_wait" and "waits" not in rec:
        raise CalibrationError(f"{where}: field 'waits' is missing (a put_wait record needs "
                               "it: true, false or null).")
    if kind == "put_wait" and not (rec["waits"] is None or isinstance(rec["waits"], bool)):
        raise CalibrationError(f"{where}: field 'waits' of a put_wait record must be true, "
                               f"false or null, got {rec['waits']!r}.")
    if kind == "rate" and not rec["rate"] > 0:
        raise CalibrationError(f"{where}: field 'rate' of a rate record must be > 0, got "
                               f"{rec['rate']!r}.")
    if kind == "link_chain" and rec["hops"] < 1:
        raise CalibrationError(f"{where}: field 'hops' of a link_chain record must be 1 or "
                               f"more, got {rec['hops']!r}.")
    if kind == "header":
        check_schema(rec, SCHEMA, SCHEMA_VERSION, CalibrationError, where,
                     "calibration records file", older={1: _VERSION_1})
        for k, dev in enumerate(rec["devices"]):
            if not isinstance(dev, dict) or any(f not in dev for f in DEVICE_FIELDS):
                raise CalibrationError(f"{where}: devices[{k}] must be an object with "
                                       f"{', '.join(DEVICE_FIELDS)}, got {dev!r}.")
    return rec


def read_records(path: str | os.PathLike) -> list[dict]:
    """Every record of a records file, validated; the first must be the header.

    A bad line raises CalibrationError naming the file and line number. A last line cut
    short by an interrupted write is skipped with a warning (``simplace._jsonl``):
    ``simplace calibrate --resume`` measures what it held again.
    """
    path = Path(path)
    lines = _jsonl.read(path, CalibrationError,
                        missing=f"Records file {path} does not exist; run `simplace "
                                "calibrate` first (or give the right --name).",
                        mend="`simplace calibrate --name NAME --resume` measures what the "
                             "unfinished phases lack again")
    out: list[dict] = []
    for n, rec in lines:
        where = f"{path}, line {n}"
        check_record(rec, where)
        if (not out) != (rec["kind"] == "header"):
            raise CalibrationError(f"{where}: " + (
                "the first record must be the header." if not out
                else "a second header; a records file has one, on line 1."))
        out.append(rec)
    if not out:
        raise CalibrationError(f"Records file {path} is empty: it needs a header line.")
    return out


class RecordWriter(_jsonl.Appender):
    """Appends records to a JSON Lines file, one flushed line per record, so that an
    interrupted run loses at most the record being written (``simplace._jsonl``: a line
    an earlier run left cut short is dropped first). Each record is checked first."""

    def write(self, rec: Mapping[str, Any]) -> None:
        """Validate and append one record."""
        super().write(check_record(dict(rec), f"record for {self.path}"))

    def write_all(self, recs: Iterable[Mapping[str, Any]]) -> None:
        """Validate and append each record in turn."""
        for r in recs:
            self.write(r)


def write_records(path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> None:
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

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
* ``op`` records: one op signature of a ``--models`` graph timed alone on one device
  of each kind of hardware (which ops the runtime runs on a thread pool) (``device``,
  ``signature``,
  ``primitive``, ``op_class``, ``flops``, ``bytes_accessed``, ``set`` = ``micro`` for
  the fit's microbenchmarks or ``model`` for signatures of the graphs named with
  ``--models``, and ``timing``: every sample and the robust statistics);
* ``op_error`` records: a signature that could not be run alone on a device (why);
* ``link`` records: ``nbytes`` sent from ``src`` to ``dst`` with ``jax.device_put``;
* ``exclusive`` records: the same work timed on devices ``a`` and ``b`` alone and
  together (``alone_a``, ``alone_b``, ``together`` timings);
* ``phase`` records: a phase (``runtime``, ``segments``, ``model:NAME``, ``links``,
  ``exclusive``) finished, so that
  ``--resume`` knows what is left.

A run appends and flushes one line per measurement, so an interrupted run keeps all it
measured. Reading validates every line and names the line of a bad one.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from simplace.calibrate.harness import Timing
from simplace.errors import CalibrationError

SCHEMA = "simplace.calibration_records"
SCHEMA_VERSION = 2  # 1: single-op timings (dispatch and launch in every op)

# Fields every record of a kind must carry (besides "kind"), and their JSON types.
_NUM = (int, float)
FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "header": {"schema": (str,), "schema_version": (int,), "name": (str,), "host": (str,),
               "date": (str,), "jax_version": (str,), "jaxlib_version": (str,),
               "devices": (list,), "settings": (dict,)},
    "op": {"device": (str,), "signature": (str,), "primitive": (str,), "op_class": (str,),
           "flops": _NUM, "bytes_accessed": _NUM, "set": (str,), "timing": (dict,)},
    "op_error": {"device": (str,), "signature": (str,), "error": (str,)},
    "runtime": {"device": (str,), "block": (dict,), "host": (dict,)},
    "put_host": {"src": (str,), "dst": (str,), "timing": (dict,)},
    "segment": {"device": (str,), "model": (str,), "first": (int,), "stop": (int,),
                "primitive": (list,), "flops": (list,), "bytes_accessed": (list,),
                "timing": (dict,)},
    "segment_error": {"model": (str,), "error": (str,)},
    "host": {"model": (str,), "segments": (list,), "puts": (list,), "timing": (dict,)},
    "link": {"src": (str,), "dst": (str,), "nbytes": _NUM, "timing": (dict,)},
    "exclusive": {"a": (str,), "b": (str,), "alone_a": (dict,), "alone_b": (dict,),
                  "together": (dict,)},
    "phase": {"phase": (str,)},
}
_TIMING_FIELDS = {"op": ("timing",), "link": ("timing",), "runtime": ("block", "host"),
                  "put_host": ("timing",), "segment": ("timing",), "host": ("timing",),
                  "exclusive": ("alone_a", "alone_b", "together")}
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
    for field, types_ in FIELDS[kind].items():
        if field not in rec:
            raise CalibrationError(f"{where}: {kind} record is missing field {field!r} (it "
                                   f"needs {', '.join(FIELDS[kind])}).")
        v = rec[field]
        if isinstance(v, bool) or not isinstance(v, types_):
            raise CalibrationError(f"{where}: field {field!r} of a {kind} record must be "
                                   f"{' or '.join(t.__name__ for t in types_)}, got {v!r}.")
    for field in _TIMING_FIELDS.get(kind, ()):
        try:
            Timing.from_dict(rec[field])
        except CalibrationError as err:
            raise CalibrationError(f"{where}: field {field!r}: {err}") from None
    if kind == "header":
        if rec["schema"] != SCHEMA:
            raise CalibrationError(f"{where}: schema must be {SCHEMA!r}, got "
                                   f"{rec['schema']!r}: not a simplace records file.")
        if rec["schema_version"] != SCHEMA_VERSION:
            raise CalibrationError(
                f"{where}: schema_version {rec['schema_version']} is not supported; this "
                f"simplace reads {SCHEMA_VERSION}" + (
                    " (version 1 timed single ops, which this simplace no longer fits): "
                    "measure the machine again with `simplace calibrate --name NAME "
                    "--overwrite`." if rec["schema_version"] == 1 else "."))
        for k, dev in enumerate(rec["devices"]):
            if not isinstance(dev, dict) or any(f not in dev for f in DEVICE_FIELDS):
                raise CalibrationError(f"{where}: devices[{k}] must be an object with "
                                       f"{', '.join(DEVICE_FIELDS)}, got {dev!r}.")
    return rec


def read_records(path: str | os.PathLike, *, repair_tail: bool = False) -> list[dict]:
    """Every record of a records file, validated; the first must be the header.

    A bad line raises CalibrationError naming the file and line number. With
    ``repair_tail`` (used by ``--resume``) an unparseable *last* line without a final
    newline, which an interrupted write leaves, is dropped with a warning instead.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CalibrationError(f"Records file {path} does not exist; run `simplace "
                               "calibrate` first (or give the right --name).") from None
    except UnicodeDecodeError as err:
        raise CalibrationError(f"Records file {path} is not a text file ({err}).") from None
    lines = text.split("\n")
    unterminated = lines[-1] != ""
    if not unterminated:
        lines = lines[:-1]
    out: list[dict] = []
    for k, line in enumerate(lines, start=1):
        where = f"{path}, line {k}"
        if not line.strip():
            raise CalibrationError(f"{where} is empty; every line must be one JSON record. "
                                   "Delete the line.")
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            if repair_tail and unterminated and k == len(lines):
                warnings.warn(f"{where}: dropped a truncated last record (an interrupted "
                              "write); it will be measured again.", stacklevel=2)
                break
            hint = (" It looks truncated (an interrupted write): delete it and rerun with "
                    "--resume to measure it again." if k == len(lines) else "")
            raise CalibrationError(f"{where} is not valid JSON ({err.msg} at column "
                                   f"{err.colno}).{hint}") from None
        check_record(rec, where)
        if (k == 1) != (rec["kind"] == "header"):
            raise CalibrationError(f"{where}: " + (
                "the first record must be the header." if k == 1
                else "a second header; a records file has one, on line 1."))
        out.append(rec)
    if not out:
        raise CalibrationError(f"Records file {path} is empty: it needs a header line.")
    return out


class RecordWriter:
    """Appends records to a JSON Lines file, one flushed line per record, so that an
    interrupted run loses at most the record being written."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A file cut just before its last newline must not get the next record glued on.
        needs_newline = False
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                needs_newline = f.read(1) != b"\n"
        self._f = open(self.path, "a")  # noqa: SIM115 - closed in close()
        if needs_newline:
            self._f.write("\n")

    def write(self, rec: Mapping[str, Any]) -> None:
        """Validate and append one record."""
        rec = check_record(dict(rec), f"record for {self.path}")
        self._f.write(json.dumps(rec, separators=(",", ":"), allow_nan=False) + "\n")
        self._f.flush()

    def write_all(self, recs: Iterable[Mapping[str, Any]]) -> None:
        for r in recs:
            self.write(r)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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

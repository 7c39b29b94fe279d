"""Typed records of measurements: one frozen dataclass per kind, one codec for all.

Calibration writes one JSON object per measurement to ``calibration/NAME/records.jsonl``
(``simplace.calibrate.records`` says what each kind holds); validation writes one per
validated placement to ``calibration/NAME/validation.jsonl``. Each kind is a class
here: its fields, in the order they are written, say which JSON type each holds;
``to_dict`` gives the JSON object and ``from_dict`` checks one and builds the record.
Timings are ``Timing`` objects (checked by parsing their samples); fields a kind does
not know are kept in ``extra`` so that a record read and written again is unchanged,
and an optional field left ``None`` is not written.

``calibration_record(d, where)`` reads a calibration record of any kind (the ``kind``
field says which class); ``validation_record(d, where)`` reads a validation record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from simplace._jsonfile import check_fields, check_schema
from simplace.errors import CalibrationError, SimplaceError
from simplace.hardware.timing import Timing

__all__ = ["CALIBRATION_RECORDS", "DEVICE_FIELDS", "RECORD_SCHEMA", "RECORD_SCHEMA_VERSION",
           "SCHEMA", "SCHEMA_VERSION", "ExclusiveRecord", "HeaderRecord", "HostRecord",
           "LinkChainRecord", "LinkRecord", "OpErrorRecord", "OpRecord", "PhaseRecord",
           "PutHostRecord", "PutWaitRecord", "RateRecord", "Record", "RuntimeRecord",
           "SegmentErrorRecord", "SegmentRecord", "ValidationRecord", "calibration_record",
           "validation_record"]

SCHEMA = "simplace.calibration_records"
SCHEMA_VERSION = 2  # 1: single-op timings (dispatch and launch in every op)
_VERSION_1 = ("version 1 timed single ops, which this simplace no longer fits: measure the "
              "machine again with `simplace calibrate --name NAME --overwrite`.")
RECORD_SCHEMA = "simplace.validation_record"
RECORD_SCHEMA_VERSION = 1
DEVICE_FIELDS = ("name", "kind", "id", "memory_bytes")

_NUM = (float,)  # any JSON number (check_fields: true/false never count)


def _req(*types: type, default: Any = dataclasses.MISSING):
    """A field every record of the kind carries, of these JSON types (none given: the
    kind's ``_check`` checks it)."""
    return dataclasses.field(default=default, metadata={"json": types})


def _opt(*types: type):
    """A field a record may lack (older files, or not measured); ``None`` when absent."""
    return dataclasses.field(default=None, metadata={"json": types, "optional": True})


def _timing(*, optional: bool = False):
    """A ``Timing`` field, written as ``Timing.to_dict()``."""
    return dataclasses.field(default=None if optional else dataclasses.MISSING,
                             metadata={"json": (dict,), "timing": True, "optional": optional})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Record:
    """The base of every record: ``to_dict``/``from_dict`` from the fields' types.

    Attributes:
      extra: fields of the JSON object that the kind does not declare, kept as read.
    """

    kind: ClassVar[str] = ""  # the "kind" field written first ("" for none)
    _error: ClassVar[type[SimplaceError]] = CalibrationError
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def _fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if f.name != "extra"]

    @classmethod
    def _what(cls) -> str:
        return f"{'an' if cls.kind[0] in 'aeio' else 'a'} {cls.kind} record"

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this record (the layout the records files have)."""
        d: dict[str, Any] = {"kind": self.kind} if self.kind else {}
        for f in self._fields():
            v = getattr(self, f.name)
            if v is None and f.metadata.get("optional"):
                continue
            d[f.name] = v.to_dict() if isinstance(v, Timing) else v
        d.update(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "record") -> Record:
        """The record of JSON object ``d``; ``cls._error`` naming ``where`` and the bad
        field when ``d`` lacks a field, has one of the wrong type, or a bad timing."""
        fields = cls._fields()
        check_fields(d, {f.name: f.metadata["json"] for f in fields
                         if f.metadata["json"] and not f.metadata.get("optional")}, cls._error,
                     where,
                     what=cls._what(), optional={f.name: f.metadata["json"] for f in fields
                                                 if f.metadata.get("optional")})
        cls._check(d, where)
        kw: dict[str, Any] = {}
        for f in fields:
            if f.name not in d:
                continue
            v = d[f.name]
            if f.metadata.get("timing"):
                try:
                    v = Timing.from_dict(v)
                except CalibrationError as err:
                    raise cls._error(f"{where}: field {f.name!r}: {err}") from None
            kw[f.name] = v
        names = {f.name for f in fields} | ({"kind"} if cls.kind else set())
        return cls(**kw, extra={k: v for k, v in d.items() if k not in names})

    @classmethod
    def _check(cls, d: Mapping[str, Any], where: str) -> None:
        """What a kind requires beyond its fields' types (``d`` has those)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class HeaderRecord(Record):
    """The first line of a calibration records file: the run, its machine and settings
    (``devices``: name, kind, JAX id and memory_bytes of each device measured)."""

    kind: ClassVar[str] = "header"
    schema: str = _req(str, default=SCHEMA)
    schema_version: int = _req(int, default=SCHEMA_VERSION)
    name: str = _req(str)
    host: str = _req(str)
    date: str = _req(str)
    jax_version: str = _req(str)
    jaxlib_version: str = _req(str)
    python: str | None = _opt(str)
    machine: str | None = _opt(str)
    cpu_count: int | None = _opt(int)
    load_average: list | None = _opt(list)
    devices: list = _req(list)
    settings: dict = _req(dict)

    @classmethod
    def _check(cls, d, where):
        check_schema(d, SCHEMA, SCHEMA_VERSION, CalibrationError, where,
                     "calibration records file", older={1: _VERSION_1})
        for k, dev in enumerate(d["devices"]):
            if not isinstance(dev, dict) or any(f not in dev for f in DEVICE_FIELDS):
                raise CalibrationError(f"{where}: devices[{k}] must be an object with "
                                       f"{', '.join(DEVICE_FIELDS)}, got {dev!r}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeRecord(Record):
    """A tiny jitted call on ``device``: blocking (``block``) and dispatched only
    (``host``, the host time per call)."""

    kind: ClassVar[str] = "runtime"
    device: str = _req(str)
    block: Timing = _timing()
    host: Timing = _timing()


@dataclasses.dataclass(frozen=True, kw_only=True)
class PutHostRecord(Record):
    """The host time of one ``jax.device_put`` call from ``src`` to ``dst``."""

    kind: ClassVar[str] = "put_host"
    src: str = _req(str)
    dst: str = _req(str)
    timing: Timing = _timing()


@dataclasses.dataclass(frozen=True, kw_only=True)
class PutWaitRecord(Record):
    """Whether a put from ``src`` to ``dst`` holds the host until its copy is in
    (``waits``: True, False, or None when the probe cannot tell)."""

    kind: ClassVar[str] = "put_wait"
    src: str = _req(str)
    dst: str = _req(str)
    call_s: float = _req(*_NUM)
    dispatch_s: float = _req(*_NUM)
    compute_s: float = _req(*_NUM)
    waits: bool | None = _req()

    @classmethod
    def _check(cls, d, where):
        if "waits" not in d:
            raise CalibrationError(f"{where}: field 'waits' is missing (a put_wait record "
                                   "needs it: true, false or null).")
        if not (d["waits"] is None or isinstance(d["waits"], bool)):
            raise CalibrationError(f"{where}: field 'waits' of a put_wait record must be "
                                   f"true, false or null, got {d['waits']!r}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RateRecord(Record):
    """One op class's saturating microbenchmark on ``device`` (``rate`` in ``unit``/s,
    > 0; ``points``: size, work, median time and rate of each size tried)."""

    kind: ClassVar[str] = "rate"
    device: str = _req(str)
    op_class: str = _req(str)
    unit: str = _req(str)
    rate: float = _req(*_NUM)
    saturated: bool = _req(bool)
    why: str | None = _opt(str)
    points: list = _req(list)

    @classmethod
    def _check(cls, d, where):
        if not d["rate"] > 0:
            raise CalibrationError(f"{where}: field 'rate' of a rate record must be > 0, got "
                                   f"{d['rate']!r}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostRecord(Record):
    """One whole step of a placement (``assignment``) of ``model``: its ``timing``, the
    segments per device and puts per link it dispatched, and each call's host time."""

    kind: ClassVar[str] = "host"
    model: str = _req(str)
    graph_hash: str | None = _opt(str)
    assignment: list | None = _opt(list)
    segments: list = _req(list)
    puts: list = _req(list)
    segment_calls: list | None = _opt(list)
    put_links: list | None = _opt(list)
    call_host_s: list | None = _opt(list)
    put_host_s: list | None = _opt(list)
    loop_s: float | None = _opt(*_NUM)
    timing: Timing = _timing()


@dataclasses.dataclass(frozen=True, kw_only=True)
class SegmentRecord(Record):
    """Ops ``first..stop-1`` of ``model`` timed alone as one jitted computation on
    ``device``, with their ``primitive``, ``flops`` and ``bytes_accessed``."""

    kind: ClassVar[str] = "segment"
    device: str = _req(str)
    model: str = _req(str)
    first: int = _req(int)
    stop: int = _req(int)
    primitive: list = _req(list)
    flops: list = _req(list)
    bytes_accessed: list = _req(list)
    local_input: list | None = _opt(list)
    call_host_s: float | None = _opt(*_NUM)
    inputs: int | None = _opt(int)
    outputs: int | None = _opt(int)
    timing: Timing = _timing()


@dataclasses.dataclass(frozen=True, kw_only=True)
class SegmentErrorRecord(Record):
    """A model whose segments could not be run (``error``: why)."""

    kind: ClassVar[str] = "segment_error"
    model: str = _req(str)
    error: str = _req(str)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpRecord(Record):
    """One op signature timed alone on ``device`` (``set``: ``micro`` or ``model``)."""

    kind: ClassVar[str] = "op"
    device: str = _req(str)
    signature: str = _req(str)
    primitive: str = _req(str)
    op_class: str = _req(str)
    flops: float = _req(*_NUM)
    bytes_accessed: float = _req(*_NUM)
    set: str = _req(str)
    timing: Timing = _timing()


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpErrorRecord(Record):
    """A signature that could not be run alone on ``device`` (``error``: why)."""

    kind: ClassVar[str] = "op_error"
    device: str = _req(str)
    signature: str = _req(str)
    error: str = _req(str)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinkRecord(Record):
    """``nbytes`` sent from ``src`` to ``dst`` with ``jax.device_put`` (``timing``: from
    the call to the arrival; ``after_call``: from the call's return to the arrival)."""

    kind: ClassVar[str] = "link"
    src: str = _req(str)
    dst: str = _req(str)
    nbytes: float = _req(*_NUM)
    timing: Timing = _timing()
    after_call: Timing | None = _timing(optional=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinkChainRecord(Record):
    """Copies between ``a`` and ``b`` in context: ``hops + 1`` segments alternating
    between them (``chain``, ``chain_host``) against the same on each alone."""

    kind: ClassVar[str] = "link_chain"
    a: str = _req(str)
    b: str = _req(str)
    nbytes: float = _req(*_NUM)
    hops: int = _req(int)
    loop: dict | None = _opt(dict)
    alone_a: Timing = _timing()
    alone_b: Timing = _timing()
    chain: Timing = _timing()
    chain_host: Timing = _timing()

    @classmethod
    def _check(cls, d, where):
        if d["hops"] < 1:
            raise CalibrationError(f"{where}: field 'hops' of a link_chain record must be 1 "
                                   f"or more, got {d['hops']!r}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExclusiveRecord(Record):
    """The same work timed on devices ``a`` and ``b`` alone and together."""

    kind: ClassVar[str] = "exclusive"
    a: str = _req(str)
    b: str = _req(str)
    alone_a: Timing = _timing()
    alone_b: Timing = _timing()
    together: Timing = _timing()


@dataclasses.dataclass(frozen=True, kw_only=True)
class PhaseRecord(Record):
    """A phase of a calibration finished (what ``--resume`` skips)."""

    kind: ClassVar[str] = "phase"
    phase: str = _req(str)
    wall_s: float | None = _opt(*_NUM)
    measured: int | None = _opt(int)
    skipped_for_budget: int | None = _opt(int)


CALIBRATION_RECORDS: dict[str, type[Record]] = {cls.kind: cls for cls in (
    HeaderRecord, OpRecord, OpErrorRecord, RuntimeRecord, PutHostRecord, PutWaitRecord,
    SegmentRecord, SegmentErrorRecord, HostRecord, LinkRecord, ExclusiveRecord,
    LinkChainRecord, RateRecord, PhaseRecord)}


def calibration_record(d: Any, where: str) -> Record:
    """The calibration record of JSON object ``d`` (its ``kind`` picks the class);
    ``CalibrationError`` naming ``where`` and what is wrong otherwise."""
    if isinstance(d, Record):
        d = d.to_dict()
    if not isinstance(d, dict):
        raise CalibrationError(f"{where}: a record must be a JSON object, got "
                               f"{type(d).__name__}.")
    cls = CALIBRATION_RECORDS.get(d.get("kind"))
    if cls is None:
        raise CalibrationError(f"{where}: 'kind' must be one of "
                               f"{', '.join(CALIBRATION_RECORDS)}, got {d.get('kind')!r}.")
    return cls.from_dict(d, where)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ValidationRecord(Record):
    """One placement run on hardware: the machine, the graph, the placement, the step
    time predicted (raw and corrected) and measured, and the step's shape as run and as
    simulated (``measured_step_time_s`` > 0)."""

    _error: ClassVar[type[SimplaceError]] = SimplaceError
    schema: str = _req(str, default=RECORD_SCHEMA)
    schema_version: int = _req(int, default=RECORD_SCHEMA_VERSION)
    date: str | None = _opt(str)
    host: str | None = _opt(str)
    cost_model: str = _req(str)
    corrected: bool | None = _opt(bool)
    graph_hash: str = _req(str)
    graph_name: str = _req(str)
    device_names: list = _req(list)
    label: str | None = _opt(str)
    method: str = _req(str)
    assignment: list = _req(list)
    predicted_step_time_s: float = _req(*_NUM)
    raw_predicted_step_time_s: float | None = _opt(*_NUM)
    measured_step_time_s: float = _req(*_NUM)
    timing: Timing | None = _timing(optional=True)
    rounds: int | None = _opt(int)
    num_segments: int | None = _opt(int)
    num_transfers: int | None = _opt(int)
    bytes_transferred: float | None = _opt(*_NUM)
    transfers: str | None = _opt(str)
    sim_num_segments: int | None = _opt(int)
    sim_num_transfers: int | None = _opt(int)
    sim_bytes_moved: float | None = _opt(*_NUM)
    sim_host_s: float | None = _opt(*_NUM)

    @classmethod
    def _what(cls) -> str:
        return "a validation record"

    @classmethod
    def from_dict(cls, d: Any, where: str = "record") -> Record:
        """The record of JSON object ``d`` (schema checked first); ``SimplaceError``
        naming ``where`` and what is wrong otherwise."""
        check_schema(d, RECORD_SCHEMA, RECORD_SCHEMA_VERSION, SimplaceError, where,
                     "validation record")
        return super().from_dict(d, where)

    @classmethod
    def _check(cls, d, where):
        if not d["measured_step_time_s"] > 0:
            raise SimplaceError(f"{where}: measured_step_time_s must be > 0.")


def validation_record(d: Any, where: str) -> ValidationRecord:
    """The validation record of JSON object ``d``; ``SimplaceError`` naming ``where``
    and what is wrong otherwise."""
    return ValidationRecord.from_dict(d.to_dict() if isinstance(d, Record) else d, where)

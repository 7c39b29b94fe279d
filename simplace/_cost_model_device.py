"""Device and Provenance: one device of a machine, and where a model's numbers come from.

Part of ``simplace.cost_model`` (which re-exports these names): the dataclasses with
their validation (``CostModelError`` naming the field), their dict form as in a
cost-model file, and a device's roofline.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from simplace._cost_model_fields import _check_keys, _number, _string, _where
from simplace._cost_model_ops import (
    _CLASS_INDEX,
    _FREE,
    DEFAULT_EFFICIENCY,
    OP_CLASSES,
    WORK_CLASSES,
)
from simplace.errors import CostModelError

# The rates a calibration may fit (flop/s, bytes/s): between a slow embedded core and a
# whole GPU. A fitted rate at one of these is a fit the timings did not pin.
PEAK_FLOPS_BOUNDS = (1e8, 1e16)
BANDWIDTH_BOUNDS = (1e8, 1e14)

DEVICE_KINDS = ("cpu", "gpu", "tpu")
SOURCES = ("measured", "datasheet", "synthetic", "imported")


# --------------------------------------------------------------------------- Device
_DEVICE_REQUIRED = ("name", "kind", "memory_bytes", "peak_flops_per_s",
                    "memory_bandwidth_bytes_per_s", "overhead_s", "launch_s", "dispatch_s")
_DEVICE_OPTIONAL = ("efficiency", "exclusive_group", "op_times_s", "class_overhead_s",
                    "fused_bytes_fraction", "parallel_launch_s", "parallel_min_bytes",
                    "parallel_min_segment_flops", "unfused_overhead_s", "argument_s")
# Classes whose ops XLA fuses into a neighbour's loop inside a segment: their
# intermediate tensors mostly stay in registers/cache, so only ``fused_bytes_fraction``
# of their bytes are charged.
FUSED_CLASSES = ("elementwise", "free")


def _normalise_device(fields: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Validated, normalised Device fields; errors name ``where.field``."""
    out: dict[str, Any] = {}
    out["name"] = _string(fields["name"], _where(where, "name"))
    out["kind"] = _string(fields["kind"], _where(where, "kind"), choices=DEVICE_KINDS)
    for f in ("memory_bytes", "peak_flops_per_s", "memory_bandwidth_bytes_per_s"):
        out[f] = _number(fields[f], _where(where, f), min_value=0, strict=True)
    for f in ("overhead_s", "launch_s", "dispatch_s"):
        out[f] = _number(fields[f], _where(where, f), min_value=0)
    out["fused_bytes_fraction"] = _number(
        fields.get("fused_bytes_fraction", 1.0), _where(where, "fused_bytes_fraction"),
        min_value=0, max_value=1)

    eff_in = fields.get("efficiency")
    eff_in = {} if eff_in is None else eff_in
    if not isinstance(eff_in, Mapping):
        raise CostModelError(f"{_where(where, 'efficiency')} must be an object mapping op "
                             f"classes to fractions, got {type(eff_in).__name__}.")
    eff: dict[str, float] = {}
    for c, v in eff_in.items():
        if c not in _CLASS_INDEX:
            raise CostModelError(
                f"{_where(where, 'efficiency')} has unknown op class {c!r}; the classes are "
                f"{', '.join(WORK_CLASSES)}.")
        eff[c] = _number(v, _where(where, f"efficiency.{c}"), min_value=0, strict=True,
                         max_value=1)
    full = {c: eff.get(c, DEFAULT_EFFICIENCY[c]) for c in WORK_CLASSES}
    if "free" in eff and eff["free"] != full["data_movement"]:
        raise CostModelError(
            f"{_where(where, 'efficiency.free')} is {eff['free']!r} but free ops that do work "
            f"are charged like data_movement ({full['data_movement']!r}); drop the entry.")
    full["free"] = full["data_movement"]
    out["efficiency"] = types.MappingProxyType(full)

    group = fields.get("exclusive_group")
    out["exclusive_group"] = out["name"] if group in (None, "") else _string(
        group, _where(where, "exclusive_group"))

    table = fields.get("op_times_s")
    table = {} if table is None else table
    if not isinstance(table, Mapping):
        raise CostModelError(f"{_where(where, 'op_times_s')} must be an object mapping op "
                             f"signatures to seconds, got {type(table).__name__}.")
    clean = {}
    for sig, t in table.items():
        if not isinstance(sig, str):
            raise CostModelError(f"{_where(where, 'op_times_s')} keys must be signature "
                                 f"strings, got {sig!r}.")
        clean[sig] = _number(t, f"{_where(where, 'op_times_s')}[{sig!r}]", min_value=0)
    out["op_times_s"] = types.MappingProxyType(clean)

    out["unfused_overhead_s"] = _number(fields.get("unfused_overhead_s", 0.0),
                                        _where(where, "unfused_overhead_s"), min_value=0)
    out["argument_s"] = _number(fields.get("argument_s", 0.0), _where(where, "argument_s"),
                                min_value=0)
    out["parallel_launch_s"] = _number(fields.get("parallel_launch_s", 0.0),
                                       _where(where, "parallel_launch_s"), min_value=0)
    pm = fields.get("parallel_min_bytes")
    pm = {} if pm is None else pm
    if not isinstance(pm, Mapping) or not all(isinstance(k, str) for k in pm):
        raise CostModelError(f"{_where(where, 'parallel_min_bytes')} must be an object mapping "
                             f"primitive names to byte counts, got {type(pm).__name__}.")
    out["parallel_min_bytes"] = types.MappingProxyType(
        {k: _number(v, f"{_where(where, 'parallel_min_bytes')}[{k!r}]", min_value=0)
         for k, v in sorted(pm.items())})
    psf = fields.get("parallel_min_segment_flops")
    out["parallel_min_segment_flops"] = None if psf is None else _number(
        psf, _where(where, "parallel_min_segment_flops"), min_value=0, strict=True)

    # Per-class launch costs where they differ from overhead_s (measured CPU models: a
    # small matmul calls into a BLAS thread pool and costs ~5x an elementwise loop).
    cov = fields.get("class_overhead_s")
    cov = {} if cov is None else cov
    if not isinstance(cov, Mapping):
        raise CostModelError(f"{_where(where, 'class_overhead_s')} must be an object mapping "
                             f"op classes to seconds, got {type(cov).__name__}.")
    for c in cov:
        if c not in WORK_CLASSES:
            raise CostModelError(
                f"{_where(where, 'class_overhead_s')} has unknown op class {c!r}; the classes "
                f"are {', '.join(WORK_CLASSES)}.")
    out["class_overhead_s"] = types.MappingProxyType(
        {c: _number(cov[c], _where(where, f"class_overhead_s.{c}"), min_value=0)
         for c in WORK_CLASSES if c in cov})
    return out


@dataclasses.dataclass(frozen=True)
class Device:
    """One device of a machine.

    Attributes:
      name: unique within its cost model (``"cpu:0"``, ``"gpu:1"``).
      kind: ``"cpu"``, ``"gpu"`` or ``"tpu"``.
      memory_bytes: memory available to ops and tensors.
      peak_flops_per_s: peak floating-point rate of the roofline.
      memory_bandwidth_bytes_per_s: peak memory bandwidth of the roofline.
      overhead_s: fixed cost of each op that does work inside a segment (its kernel or
        loop inside the fused computation; added to the roofline time).
      launch_s: device time of each segment besides its ops (starting the executable).
      dispatch_s: host time of the jitted call that dispatches one segment.
      fused_bytes_fraction: the part of ``bytes_accessed`` charged to elementwise (and
        working ``free``) ops, which XLA fuses with their neighbours; in [0, 1].
      parallel_launch_s: extra launch time, paid once, of a segment the runtime runs on
        a worker thread rather than inline in the calling thread (XLA:CPU does so with
        a computation of enough flops; the thread wakes up for it).
      parallel_min_segment_flops: the flops as XLA counts them (the traced FLOPs less
        transcendentals), summed over a segment's ops, from which a segment is run that
        way (measured; None: no rule).
      parallel_min_bytes: primitive -> the ``bytes_accessed`` from which a segment
        holding one of its ops is run that way, whatever the segment's flops (older
        models: the rule fitted per op); primitives not listed never are.
      unfused_overhead_s: extra cost of an elementwise (or working ``free``) op none of
        whose inputs comes from its own segment: it cannot fuse into an in-segment
        producer's loop and runs a loop of its own.
      efficiency: per op class (all of ``OP_CLASSES``), the fraction of the roofline in
        (0, 1] the device reaches; missing classes take ``DEFAULT_EFFICIENCY``; ``free``
        always equals ``data_movement``.
      op_times_s: measured seconds per op signature; overrides the roofline.
      exclusive_group: devices with the same group share compute and run one op at a
        time between them (virtual CPU devices of one socket); defaults to ``name``.
      class_overhead_s: optional per op class (of ``WORK_CLASSES``) in-segment cost that
        replaces ``overhead_s`` for that class; ``free`` ops use data_movement's.
      argument_s: what each parameter a segment's call takes, and each output of the
        graph it returns, adds to the call (host time handling the argument): charged
        to the ops that read the parameter (shared among its readers) and that return
        the output, so that a segment holding a whole training step (hundreds of
        parameters and gradients) pays for them while a one-op segment does not
        (``CostModel.op_times``).
    """

    name: str
    kind: str
    memory_bytes: float
    peak_flops_per_s: float
    memory_bandwidth_bytes_per_s: float
    overhead_s: float = 0.0
    efficiency: Mapping[str, float] = dataclasses.field(default_factory=dict)
    op_times_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    exclusive_group: str = ""
    class_overhead_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    launch_s: float = 0.0
    dispatch_s: float = 0.0
    fused_bytes_fraction: float = 1.0
    # The worker thread's wake-up measured 25-55 us on a small VM.
    parallel_launch_s: float = 0.0
    parallel_min_bytes: Mapping[str, float] = dataclasses.field(default_factory=dict)
    parallel_min_segment_flops: float | None = None
    unfused_overhead_s: float = 0.0
    # Host time per argument measured ~2 us on a 2-core VM.
    argument_s: float = 0.0

    def __post_init__(self):
        where = f"Device({self.name!r})" if isinstance(self.name, str) else "Device"
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for f, v in _normalise_device(fields, where).items():
            object.__setattr__(self, f, v)

    __hash__ = None  # mappings inside; compare with ==

    @functools.cached_property
    def _overhead_by_class(self) -> np.ndarray:
        cov = self.class_overhead_s
        dm = cov.get("data_movement", self.overhead_s)
        return np.array([dm if c == "free" else cov.get(c, self.overhead_s)
                         for c in OP_CLASSES], dtype=np.float64)

    @functools.cached_property
    def _efficiency_by_class(self) -> np.ndarray:
        return np.array([self.efficiency[c] for c in OP_CLASSES], dtype=np.float64)

    def roofline_s(self, op_class_index: np.ndarray, flops: np.ndarray,
                   bytes_accessed: np.ndarray) -> np.ndarray:
        """float64[N]: in-segment roofline time of N ops (class indices into
        ``OP_CLASSES``), as ``CostModel.op_times`` charges ops with no measured time."""
        cls = np.asarray(op_class_index, dtype=np.int64)
        flops = np.asarray(flops, dtype=np.float64)
        nbytes = np.asarray(bytes_accessed, dtype=np.float64)
        fused = np.isin(cls, [_CLASS_INDEX[c] for c in FUSED_CLASSES])
        charged = np.where(fused, self.fused_bytes_fraction * nbytes, nbytes)
        t = self._overhead_by_class[cls] + np.maximum(
            flops / self.peak_flops_per_s,
            charged / self.memory_bandwidth_bytes_per_s) / self._efficiency_by_class[cls]
        return np.where((cls == _FREE) & (flops == 0) & (nbytes == 0), 0.0, t)

    def to_dict(self) -> dict:
        """The device as a JSON-able dict, as in a cost-model file (optional fields only
        where set)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "memory_bytes": self.memory_bytes,
            "peak_flops_per_s": self.peak_flops_per_s,
            "memory_bandwidth_bytes_per_s": self.memory_bandwidth_bytes_per_s,
            "overhead_s": self.overhead_s,
            "launch_s": self.launch_s,
            "dispatch_s": self.dispatch_s,
            "fused_bytes_fraction": self.fused_bytes_fraction,
            "unfused_overhead_s": self.unfused_overhead_s,
            "efficiency": {c: self.efficiency[c] for c in WORK_CLASSES},
            "exclusive_group": self.exclusive_group,
            "op_times_s": dict(self.op_times_s),
        } | ({"class_overhead_s": dict(self.class_overhead_s)} if self.class_overhead_s
             else {}) | ({"parallel_launch_s": self.parallel_launch_s}
                         if self.parallel_min_bytes or self.parallel_min_segment_flops
                         else {}) | ({"parallel_min_bytes": dict(self.parallel_min_bytes)}
                                     if self.parallel_min_bytes else {}) | (
            {"parallel_min_segment_flops": self.parallel_min_segment_flops}
            if self.parallel_min_segment_flops else {}) | (
            {"argument_s": self.argument_s} if self.argument_s else {})

    @classmethod
    def from_dict(cls, d: Mapping, *, where: str = "device") -> Device:
        """A Device read from its dict; ``where`` names it in error messages
        (``CostModelError``)."""
        _check_keys(d, where, _DEVICE_REQUIRED, _DEVICE_OPTIONAL)
        return cls(**_normalise_device(d, where))


# --------------------------------------------------------------------------- Provenance
@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where a cost model's numbers come from.

    Attributes:
      source: ``"measured"`` (``simplace calibrate`` on that machine), ``"datasheet"``
        (published specs; ``notes`` cite them), ``"synthetic"`` (made up in code for
        tests, benchmarks and examples) or ``"imported"`` (the machine an instance of
        another placement system implies: ``simplace.external``; ``notes`` name the file).
      host, date, jax_version, jaxlib_version: where and when it was measured or written.
      notes: free text; datasheet models cite their figures and assumptions here.
      meta: anything else JSON-able (calibration settings...).
    """

    source: str
    host: str = ""
    date: str = ""
    jax_version: str = ""
    jaxlib_version: str = ""
    notes: tuple[str, ...] = ()
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        _string(self.source, "provenance.source", choices=SOURCES)
        for f in ("host", "date", "jax_version", "jaxlib_version"):
            _string(getattr(self, f), f"provenance.{f}", nonempty=False)
        notes = self.notes
        if isinstance(notes, str) or not isinstance(notes, (list, tuple)):
            raise CostModelError("provenance.notes must be a list of strings.")
        for k, n in enumerate(notes):
            _string(n, f"provenance.notes[{k}]")
        if self.source == "datasheet" and not notes:
            raise CostModelError("provenance.notes must not be empty for a datasheet model: "
                                 "cite where each figure comes from.")
        object.__setattr__(self, "notes", tuple(notes))
        if not isinstance(self.meta, Mapping):
            raise CostModelError("provenance.meta must be an object.")
        try:
            json.dumps(dict(self.meta), allow_nan=False)
        except (TypeError, ValueError) as err:
            raise CostModelError(f"provenance.meta must be JSON-able ({err}).") from None
        object.__setattr__(self, "meta", dict(self.meta))

    __hash__ = None

    def to_dict(self) -> dict:
        """The provenance as a JSON-able dict."""
        return {"source": self.source, "host": self.host, "date": self.date,
                "jax_version": self.jax_version, "jaxlib_version": self.jaxlib_version,
                "notes": list(self.notes), "meta": dict(self.meta)}

    @classmethod
    def from_dict(cls, d: Mapping, *, where: str = "provenance") -> Provenance:
        """A Provenance read from its dict; ``where`` names it in error messages
        (``CostModelError``)."""
        _check_keys(d, where, ("source",), ("host", "date", "jax_version", "jaxlib_version",
                                            "notes", "meta"))
        kw = dict(d)
        if "notes" in kw and not isinstance(kw["notes"], list):
            raise CostModelError(f"{where}.notes must be a list of strings.")
        kw["notes"] = tuple(kw.get("notes", ()))
        return cls(**kw)

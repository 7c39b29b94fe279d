"""CostModel: one machine's devices, links and drift corrections; op and transfer times.

A cost model gives the simulators what a placed JAX program costs on one machine
(``simplace.sim.reference`` says how they combine):

* how long op ``i`` of a graph takes on device ``d`` *inside a segment*, i.e. as part of
  one fused XLA computation (``op_times(graph) -> float64[M, D]``): the measured in-segment
  time when the op's signature is in the device's table, else a roofline estimate from
  the op's flops and bytes. No launch and no dispatch are in it;
* per device, what each segment costs besides its ops: ``launch_s`` (device time) and
  ``dispatch_s`` (host time of the jitted call);
* how long a tensor of ``n`` bytes takes from device ``i`` to device ``j``
  (``transfer_time_s``): ``latency_s[i, j] + n / bandwidth_bytes_per_s[i, j]``, and the
  host time of the ``jax.device_put`` call that moves it (``put_s[i, j]``).

Op, launch, transfer and host times are multiplied by the drift corrections fitted from
hardware runs (a ``simplace.scales.Scales``; identity by default), applied where the
model is priced (``price``, through ``simplace.scales.apply_scales``) and to the figures
below. Models are stored as schema-versioned JSON files
(see ``cost_models/README.md``) and loaded by name (``CostModel.load("haswell_k40x4")``);
``simplace.paths`` says where names are looked up.

The op classes (``simplace._cost_model_ops``), field checks (``_cost_model_fields``),
``Device`` and ``Provenance`` (``_cost_model_device``) and the synthetic machines
(``_cost_model_synthetic``) live in modules of their own; import them from here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Re-exported: the op classes, field checks and Device/Provenance live in their own
# modules and are used (and imported by callers) from here.
from simplace._cost_model_device import (  # noqa: F401
    _DEVICE_OPTIONAL,
    _DEVICE_REQUIRED,
    BANDWIDTH_BOUNDS,
    DEVICE_KINDS,
    FUSED_CLASSES,
    PEAK_FLOPS_BOUNDS,
    SOURCES,
    Device,
    Provenance,
    _normalise_device,
)
from simplace._cost_model_fields import (  # noqa: F401
    _check_keys,
    _frozen,
    _json_float,
    _matrix,
    _number,
    _string,
    _vector,
    _where,
)
from simplace._cost_model_ops import (  # noqa: F401
    _CLASS_INDEX,
    _CONTROL_OPS,
    _CONV_OPS,
    _DATA_MOVEMENT,
    _DATA_MOVEMENT_OPS,
    _FREE,
    _FREE_OPS,
    _GRAPH_CACHE,
    _MATMUL_OPS,
    _REDUCTION_OPS,
    DEFAULT_EFFICIENCY,
    OP_CLASSES,
    WORK_CLASSES,
    _graph_arrays,
    call_arguments,
    op_class,
    op_classes,
)
from simplace._jsonfile import read_json, write_json
from simplace._primitive_costs import xla_flops
from simplace.errors import CostModelError
from simplace.scales import Scales

# The name of the corrections' type before it became ``Scales`` (``Corrections.identity``).
Corrections = Scales

SCHEMA = "simplace.cost_model"
SCHEMA_VERSION = 2
# Version 1 files summed one-op-per-jit times (launch and dispatch included in every op):
# their numbers mean something else, so they are refused rather than reinterpreted.


# --------------------------------------------------------------------------- CostModel
_TOP_REQUIRED = ("schema", "schema_version", "name", "provenance", "devices", "links")
_TOP_OPTIONAL = ("corrections",)


def default_put_waits(kinds: Sequence[str]) -> np.ndarray:
    """bool[D, D]: the links between devices of different kinds (two PjRt clients), the
    default of ``CostModel.put_waits`` for devices of these ``kinds``."""
    k = np.asarray(kinds)
    return k[:, None] != k[None, :]


def _put_waits(value, devices) -> np.ndarray:
    """``CostModel.put_waits`` checked (None: the default), read-only."""
    d = len(devices)
    if value is None:
        out = default_put_waits([dev.kind for dev in devices])
    else:
        try:
            out = np.array(value)
        except ValueError:  # rows of different lengths
            out = np.zeros(0)
        if out.shape != (d, d):
            raise CostModelError(f"links.put_waits must be a {d}x{d} matrix of true/false, "
                                 f"got shape {out.shape}.")
        if out.dtype.kind != "b":
            raise CostModelError("links.put_waits must hold true or false (whether a "
                                 "device_put on the link holds the host until its copy "
                                 "arrives).")
        if out.diagonal().any():
            i = int(np.flatnonzero(out.diagonal())[0])
            raise CostModelError(f"links.put_waits[{i}][{i}] must be false (no device_put to "
                                 "the same device).")
    out = np.array(out, dtype=bool)
    out.flags.writeable = False
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class CostModel:
    """One machine: D devices, the links between every ordered pair, drift corrections.

    Attributes:
      name: the model's name (its file is ``<name>.json``).
      devices: tuple of D ``Device``.
      latency_s: float64[D, D], latency of the ordered link (i, j); diagonal 0.
      bandwidth_bytes_per_s: float64[D, D], bandwidth of link (i, j); diagonal inf (a
        tensor already on its device moves for free).
      put_s: float64[D, D], host time of one ``jax.device_put`` call over link (i, j);
        diagonal 0. Defaults to zeros.
      put_waits: bool[D, D], the links whose ``device_put`` holds the host thread until
        the copy has arrived (diagonal False). Defaults to the links between devices of
        different kinds: JAX has one PjRt client per platform and cannot copy between
        clients directly; it fetches the value to the host (waiting for the computation
        that makes it) and uploads it again. ``simplace calibrate`` measures it (a put
        of an array still being computed: does the call return before it is?). Written
        to the file only where it differs from that default.
      corrections: the drift corrections, a ``Scales`` (``simplace.scales``) applied by
        ``price`` and by the figures (``op_times``, ``launch_s``, ``dispatch_s``, the
        corrected links and transfer times).
      provenance: ``Provenance`` (source, host, date, versions, notes).
      profile: a ``simplace.profile.Profile`` attached by ``with_profile`` (None: none):
        ``price`` uses its measured op times for the graph it was made for. Never
        written to the model's file.
      objective: what placements are judged by on this machine, set by
        ``with_objective``: ``"latency"`` (the step time, the default), ``"throughput"``
        or a ``Ruler`` (``simplace.sim.objective``). Never written to the model's file.

    Two models are equal when their ``to_dict()`` are: the attached profile is not
    part of the comparison.
    """

    name: str
    devices: tuple[Device, ...]
    latency_s: np.ndarray
    bandwidth_bytes_per_s: np.ndarray
    corrections: Scales | None = None
    provenance: Provenance | None = None
    put_s: np.ndarray | None = None
    put_waits: np.ndarray | None = None
    profile: Any = None
    objective: Any = "latency"

    def __post_init__(self):
        set_ = functools.partial(object.__setattr__, self)
        from simplace.sim.objective import check_objective

        check_objective(self.objective)
        _string(self.name, "name")
        devices = tuple(self.devices)
        if not devices:
            raise CostModelError("devices must list at least one device.")
        for k, dev in enumerate(devices):
            if not isinstance(dev, Device):
                raise CostModelError(f"devices[{k}] must be a Device, got {type(dev).__name__}.")
        seen: dict[str, int] = {}
        for k, dev in enumerate(devices):
            if dev.name in seen:
                raise CostModelError(f"devices[{k}].name {dev.name!r} repeats "
                                     f"devices[{seen[dev.name]}].name; names must be unique.")
            seen[dev.name] = k
        set_("devices", devices)
        d = len(devices)
        lat = _matrix(self.latency_s, "links.latency_s", d)
        bw = _matrix(self.bandwidth_bytes_per_s, "links.bandwidth_bytes_per_s", d,
                     inf_on_diagonal=True)
        for i in range(d):
            if lat[i, i] != 0:
                raise CostModelError(f"links.latency_s[{i}][{i}] must be 0 (a device to "
                                     f"itself), got {lat[i, i]!r}.")
            if not math.isinf(bw[i, i]) or bw[i, i] < 0:
                raise CostModelError(
                    f"links.bandwidth_bytes_per_s[{i}][{i}] must be infinite (null or \"inf\" "
                    f"in JSON: a tensor on its own device moves for free), got {bw[i, i]!r}.")
        off = ~np.eye(d, dtype=bool)
        for f, arr, strict in (("latency_s", lat, False), ("bandwidth_bytes_per_s", bw, True)):
            bad = np.argwhere(off & ~((arr > 0) if strict else (arr >= 0)))
            if bad.size:
                i, j = (int(x) for x in bad[0])
                raise CostModelError(f"links.{f}[{i}][{j}] must be {'>' if strict else '>='} 0, "
                                     f"got {arr[i, j]!r}.")
        put = np.zeros((d, d)) if self.put_s is None else _matrix(self.put_s, "links.put_s", d)
        bad = np.argwhere(~(put >= 0))
        if bad.size:
            i, j = (int(x) for x in bad[0])
            raise CostModelError(f"links.put_s[{i}][{j}] must be >= 0, got "
                                 f"{float(put[i, j])!r}.")
        for i in range(d):
            if put[i, i] != 0:
                raise CostModelError(f"links.put_s[{i}][{i}] must be 0 (no device_put to "
                                     f"the same device), got {float(put[i, i])!r}.")
        set_("latency_s", _frozen(lat))
        set_("bandwidth_bytes_per_s", _frozen(bw))
        set_("put_s", _frozen(put))
        set_("put_waits", _put_waits(self.put_waits, devices))
        corr = Scales.identity(d) if self.corrections is None else self.corrections
        if not isinstance(corr, Scales):
            raise CostModelError(f"corrections must be a Scales, got {type(corr).__name__}.")
        if corr.num_devices != d:
            raise CostModelError(f"corrections are for {corr.num_devices} devices but the model "
                                 f"has {d}.")
        set_("corrections", corr)
        prov = Provenance(source="synthetic") if self.provenance is None else self.provenance
        if not isinstance(prov, Provenance):
            raise CostModelError(f"provenance must be a Provenance, got {type(prov).__name__}.")
        set_("provenance", prov)

    # ------------------------------------------------------------------ sizes and arrays
    @property
    def num_devices(self) -> int:
        """Number of devices (D)."""
        return len(self.devices)

    @property
    def device_names(self) -> list[str]:
        """The devices' names, in device order."""
        return [dev.name for dev in self.devices]

    @functools.cached_property
    def memory_bytes(self) -> np.ndarray:
        """float64[D]: memory of each device."""
        return _frozen(np.array([dev.memory_bytes for dev in self.devices]))

    @functools.cached_property
    def exclusive_group_ids(self) -> np.ndarray:
        """int32[D]: dense id of each device's exclusive group, in first-seen order."""
        ids: dict[str, int] = {}
        out = np.array([ids.setdefault(dev.exclusive_group, len(ids)) for dev in self.devices],
                       dtype=np.int32)
        out.flags.writeable = False
        return out

    @functools.cached_property
    def _corrected(self) -> dict[str, np.ndarray]:
        return {k: _frozen(v) for k, v in self.corrections.scaled(
            latency_s=self.latency_s, bandwidth_bytes_per_s=self.bandwidth_bytes_per_s,
            launch_s=[dev.launch_s for dev in self.devices],
            dispatch_s=[dev.dispatch_s for dev in self.devices]).items()}

    @property
    def corrected_latency_s(self) -> np.ndarray:
        """float64[D, D]: link latency with the link corrections applied (diagonal 0)."""
        return self._corrected["latency_s"]

    @property
    def corrected_bandwidth_bytes_per_s(self) -> np.ndarray:
        """float64[D, D]: link bandwidth with the link corrections applied (diagonal inf),
        so that ``transfer = corrected_latency_s + bytes / corrected_bandwidth``."""
        return self._corrected["bandwidth_bytes_per_s"]

    @property
    def launch_s(self) -> np.ndarray:
        """float64[D]: device time of each segment besides its ops, drift correction
        (``launch_scale``) included."""
        return self._corrected["launch_s"]

    @property
    def dispatch_s(self) -> np.ndarray:
        """float64[D]: host time of the call that dispatches one segment on each device,
        drift correction (``host_scale``) included."""
        return self._corrected["dispatch_s"]

    def index(self, device_name: str) -> int:
        """Index of the device called ``device_name``."""
        try:
            return self.device_names.index(device_name)
        except ValueError:
            raise CostModelError(f"Cost model {self.name!r} has no device {device_name!r}; its "
                                 f"devices are {', '.join(self.device_names)}.") from None

    # ------------------------------------------------------------------ op times
    def op_times(self, graph) -> np.ndarray:
        """float64[M, D]: seconds op i of ``graph`` adds to a segment on device d.

        A measured in-segment time when the op's signature is in the device's
        ``op_times_s``; else the roofline ``overhead_s + max(flops / peak_flops_per_s,
        f * bytes_accessed / memory_bandwidth_bytes_per_s) / efficiency[class]``
        (``class_overhead_s[class]`` in place of ``overhead_s`` where the device gives
        one; ``f`` is ``fused_bytes_fraction`` for the classes XLA fuses, elementwise and
        working ``free`` ops, else 1). Ops of class ``free`` with no flops and no bytes
        cost 0: XLA turns them into views. ``free`` ops that do touch bytes are charged
        like data_movement. Segment launches and host dispatch are not in these times
        (``launch_s``, ``dispatch_s``); a device's ``argument_s`` is, per parameter an op
        reads (shared among the parameter's readers) and per output of the graph it
        returns. Then the drift corrections: ``compute_scale[d]`` on the op's own part,
        ``argument_scale`` on the argument part (``simplace.scales``).
        """
        arg = self._argument_times(graph)
        return self.corrections.scaled(op_time_s=self._op_times(graph) + arg,
                                       op_argument_s=arg)["op_time_s"]

    def _op_times(self, graph) -> np.ndarray:
        """float64[M, D]: ``op_times`` without the call arguments and corrections."""
        cls, sigs = _graph_arrays(graph)
        flops, nbytes = graph.flops, graph.bytes_accessed
        m, d = len(cls), self.num_devices
        out = np.empty((m, d), dtype=np.float64)
        for k, dev in enumerate(self.devices):
            t = dev.roofline_s(cls, flops, nbytes)
            if dev.op_times_s:
                table = dev.op_times_s
                measured = np.fromiter((table.get(s, math.nan) for s in sigs), dtype=np.float64,
                                       count=m)
                hit = ~np.isnan(measured)
                t[hit] = measured[hit]
            out[:, k] = t
        return out

    def _argument_times(self, graph) -> np.ndarray:
        """float64[M, D]: the host time of call arguments in each op's time."""
        return np.outer(call_arguments(graph), [dev.argument_s for dev in self.devices])

    def pool_rule(self, graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Which segments run on a worker thread, as the simulators take it:
        ``(op_pool_work float64[M, D], pool_min_work float64[D], pool_launch_s
        float64[D])``; a segment on device d whose ops' pool work adds up to
        ``pool_min_work[d]`` pays ``pool_launch_s[d]`` (``parallel_launch_s``) once.

        The work is each op's flops as XLA counts them (its traced FLOPs less
        transcendentals), the minimum ``parallel_min_segment_flops``; an op
        at or above its primitive's ``parallel_min_bytes`` counts the whole minimum by
        itself. With only ``parallel_min_bytes``, an op counts 1 or 0 and the minimum
        is 1; with neither rule (or no launch), the minimum is inf."""
        ops = graph.op.tolist()
        nbytes = graph.bytes_accessed
        flops = None  # XLA's count, computed for the first device with the rule
        work = np.zeros((len(ops), self.num_devices), dtype=np.float64)
        min_work = np.full(self.num_devices, np.inf)
        launch = np.zeros(self.num_devices)
        for k, dev in enumerate(self.devices):
            seg_flops = dev.parallel_min_segment_flops
            if not dev.parallel_launch_s or not (dev.parallel_min_bytes or seg_flops):
                continue
            launch[k] = dev.parallel_launch_s
            min_work[k] = seg_flops or 1.0
            if seg_flops:
                if flops is None:
                    flops = xla_flops(ops, graph.flops)
                work[:, k] = flops
            if dev.parallel_min_bytes:
                table = dev.parallel_min_bytes
                thr = np.fromiter((table.get(p, math.inf) for p in ops), dtype=np.float64,
                                  count=len(ops))
                work[:, k] += np.where(nbytes >= thr, min_work[k], 0.0)
        return work, min_work, launch

    def op_unfused_times(self, graph) -> np.ndarray:
        """float64[M, D]: what op i adds on device d when none of its inputs comes from
        its own segment (``Device.unfused_overhead_s`` for elementwise and working
        ``free`` ops, else 0)."""
        cls = _graph_arrays(graph)[0]
        fusible = np.isin(cls, [_CLASS_INDEX[c] for c in FUSED_CLASSES]) & ~(
            (cls == _FREE) & (graph.flops == 0) & (graph.bytes_accessed == 0))
        return np.outer(fusible, [dev.unfused_overhead_s for dev in self.devices])

    # ------------------------------------------------------------------ transfers
    def transfer_time_s(self, nbytes: float, i: int, j: int) -> float:
        """Seconds to send ``nbytes`` from device ``i`` to device ``j``:
        ``(latency_s + nbytes / bandwidth_bytes_per_s) * link_scale``; 0 when ``i == j``."""
        if i == j:
            return 0.0
        return float(self.corrected_latency_s[i, j]
                     + nbytes / self.corrected_bandwidth_bytes_per_s[i, j])

    def transfer_times_s(self, nbytes) -> np.ndarray:
        """float64[..., D, D]: transfer time of each size in ``nbytes`` over every ordered
        link (zero on the diagonal)."""
        b = np.asarray(nbytes, dtype=np.float64)[..., None, None]
        return self.corrected_latency_s + b / self.corrected_bandwidth_bytes_per_s

    # ------------------------------------------------------------------ derived models
    def subset(self, device_indices: Sequence[int]) -> CostModel:
        """The machine with only ``device_indices`` (in that order); links and corrections
        sliced; the name gets a ``[i,j,...]`` suffix."""
        idx = [int(i) for i in np.asarray(device_indices, dtype=np.int64).reshape(-1)]
        d = self.num_devices
        if not idx:
            raise CostModelError("subset needs at least one device index.")
        bad = [i for i in idx if not 0 <= i < d]
        if bad:
            raise CostModelError(f"subset: device index {bad[0]} is out of range for "
                                 f"{self.name!r}, which has {d} devices (0..{d - 1}).")
        if len(set(idx)) != len(idx):
            raise CostModelError(f"subset: device indices {idx} repeat a device.")
        ix = np.asarray(idx)
        prov = dataclasses.replace(self.provenance, notes=self.provenance.notes + (
            f"Subset of devices {idx} ({', '.join(self.device_names[i] for i in idx)}) of "
            f"cost model {self.name!r}.",))
        return CostModel(
            name=f"{self.name}[{','.join(map(str, idx))}]",
            devices=tuple(self.devices[i] for i in idx),
            latency_s=self.latency_s[np.ix_(ix, ix)],
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s[np.ix_(ix, ix)],
            corrections=self.corrections.subset(ix),
            provenance=prov,
            put_s=self.put_s[np.ix_(ix, ix)],
            put_waits=self.put_waits[np.ix_(ix, ix)],
            profile=self.profile,
            # A ruler scores the whole machine it was made for: a subset is simulated.
            objective=self.objective if isinstance(self.objective, str) else "latency",
        )

    def with_corrections(self, corrections: Scales) -> CostModel:
        """The same machine with other drift corrections (and the same profile)."""
        return dataclasses.replace(self, corrections=corrections)

    # ------------------------------------------------------------------ pricing
    def with_profile(self, profile) -> CostModel:
        """A copy of this machine carrying ``profile`` (a ``simplace.profile.Profile`` made
        on it; None: none): ``price`` (and so every simulator, bound and placer) uses it
        for the graph it was made for, and the plain costs for other graphs. Raises
        CostModelError for a profile of another machine or of device kinds it lacks."""
        if profile is not None:
            self._check_profile(profile)
        return dataclasses.replace(self, profile=profile)

    def with_objective(self, objective) -> CostModel:
        """A copy of this machine judging placements by ``objective``: ``"latency"``,
        ``"throughput"`` or a ``Ruler`` (``simplace.sim.objective``). Every simulator,
        bound and placer given the copy reports and minimises that objective."""
        return dataclasses.replace(self, objective=objective)

    def _check_profile(self, profile) -> None:
        base = self.name.split("[", 1)[0]  # a subset keeps its machine's profile
        if profile.cost_model != base:
            raise CostModelError(
                f"The profile was made on machine {profile.cost_model!r}, not "
                f"{self.name!r}: profile this machine (`simplace profile MODEL "
                f"--cost-model {base}`).")
        if not profile.complete:
            raise CostModelError(
                f"The profile is incomplete ({profile.summary()}): finish it with "
                f"`simplace profile MODEL --cost-model {base} --resume`.")
        kinds = {dev.kind for dev in self.devices}
        extra = sorted(set(profile.op_time_s) - kinds)
        if extra:
            raise CostModelError(
                f"The profile measured device kind(s) {', '.join(extra)}, which machine "
                f"{self.name!r} does not have ({', '.join(sorted(kinds))}).")

    @functools.cached_property
    def _priced(self) -> weakref.WeakKeyDictionary:
        return weakref.WeakKeyDictionary()

    def price(self, graph, profile=None):
        """``SimInputs`` of ``graph`` on this machine: the one place where a graph, a
        machine and an optional profile become per-op and per-link costs. Priced once
        per graph and model (without an explicit ``profile``): pricing the same graph on
        the same model again returns the same read-only ``SimInputs``.

        profile: a ``simplace.profile.Profile`` of this graph on this machine (its graph
          hash must match: CostModelError otherwise); None: the profile attached by
          ``with_profile`` when it was made for ``graph``, else none.

        Without a profile the op times are those of ``op_times``. With one, the column
        of every device whose kind the profile measured is the profile's in-segment op
        time, and its launch gains what a segment costs that graph there
        (``Profile.segment_s``); devices of other kinds keep the model's. Links,
        dispatch, pool and fusion costs always come from the model. The drift
        corrections are applied last, to the whole problem
        (``simplace.scales.apply_scales``).
        """
        if profile is None:
            with contextlib.suppress(KeyError, TypeError):  # TypeError: no weak reference
                return self._priced[graph]
            inp = self._price(graph, None)
            with contextlib.suppress(TypeError):
                self._priced[graph] = inp
            return inp
        return self._price(graph, profile)

    def _price(self, graph, profile):
        from simplace.scales import apply_scales
        from simplace.sim.inputs import make_sim_inputs

        if profile is None:
            attached = self.profile
            if attached is not None and attached.graph_hash == graph.hash:
                profile = attached
        else:
            if profile.graph_hash != graph.hash:
                raise CostModelError(
                    f"The profile was made for graph {profile.graph_hash[:12]}... "
                    f"({profile.graph_name or 'unnamed'}, {profile.num_ops} ops), not for "
                    f"this graph {graph.hash[:12]}... ({graph.name or 'unnamed'}, "
                    f"{graph.num_ops} ops): profile this model at these sizes.")
            self._check_profile(profile)
        arg = self._argument_times(graph)
        t = self._op_times(graph) + arg
        launch = np.array([dev.launch_s for dev in self.devices])
        if profile is not None:
            if profile.num_ops != graph.num_ops:
                raise CostModelError(f"The profile has {profile.num_ops} ops but the graph "
                                     f"has {graph.num_ops}.")
            for k, dev in enumerate(self.devices):
                prof = profile.op_time_s.get(dev.kind)
                if prof is not None:
                    t[:, k] = prof
                    launch[k] += profile.segment_s(dev.kind)
            # A profiled time holds its ops' call arguments (simplace.profile), whose
            # share a hand-made profile may not reach.
            arg = np.minimum(arg, t)
        raw = make_sim_inputs(t, self.latency_s, self.bandwidth_bytes_per_s, self.memory_bytes,
                              self.exclusive_group_ids, launch,
                              [dev.dispatch_s for dev in self.devices], self.put_s,
                              *self.pool_rule(graph), self.op_unfused_times(graph),
                              self.put_waits, self.objective, arg)
        return apply_scales(raw, self.corrections)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_devices(cls, name: str, devices: Sequence[Device], latency_s, bandwidth_bytes_per_s,
                     *, corrections: Scales | None = None,
                     provenance: Provenance | None = None, put_s=0.0) -> CostModel:
        """A model from devices and links given as a scalar (every link) or a DxD matrix
        (``put_s`` too). The diagonal is set for you (latency 0, bandwidth inf)."""
        d = len(devices)
        lat = np.array(np.broadcast_to(np.asarray(latency_s, dtype=np.float64), (d, d)))
        bw = np.array(np.broadcast_to(np.asarray(bandwidth_bytes_per_s, dtype=np.float64),
                                      (d, d)))
        np.fill_diagonal(lat, 0.0)
        np.fill_diagonal(bw, math.inf)
        put = np.array(np.broadcast_to(np.asarray(put_s, dtype=np.float64), (d, d)))
        np.fill_diagonal(put, 0.0)
        return cls(name=name, devices=tuple(devices), latency_s=lat, bandwidth_bytes_per_s=bw,
                   corrections=corrections, provenance=provenance, put_s=put)

    @classmethod
    def synthetic(cls, num_devices: int, *, seed: int = 0, exclusive_pair: bool = False,
                  name: str | None = None) -> CostModel:
        """A random but valid machine for tests and benchmarks, the same for the same seed.

        Device 0 is a CPU, the others GPUs of different speeds (peak 2-60 TFLOP/s,
        200-3000 GB/s, 8-80 GiB); links 2-30 us and 5-100 GB/s, the same both ways. With
        ``exclusive_pair`` devices 0 and 1 are two virtual CPU devices of one socket (one
        exclusive group, like JAX's fake host devices).
        """
        from simplace._cost_model_synthetic import synthetic_machine

        name, devices, lat, bw, put, provenance = synthetic_machine(
            num_devices, seed=seed, exclusive_pair=exclusive_pair, name=name)
        return cls.from_devices(name, devices, lat, bw, put_s=put, provenance=provenance)

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict:
        """The cost model as a JSON-able dict with its schema and version, as ``save`` writes it."""
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "name": self.name,
            "provenance": self.provenance.to_dict(),
            "devices": [dev.to_dict() for dev in self.devices],
            "links": {
                "latency_s": self.latency_s.tolist(),
                "bandwidth_bytes_per_s": [[_json_float(x) for x in row]
                                          for row in self.bandwidth_bytes_per_s.tolist()],
                "put_s": self.put_s.tolist(),
                **({"put_waits": self.put_waits.tolist()}
                   if not np.array_equal(self.put_waits,
                                         default_put_waits([d.kind for d in self.devices]))
                   else {}),
            },
            "corrections": self.corrections.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Any, *, source: str = "<dict>") -> CostModel:
        """A model from ``to_dict``'s structure; CostModelError naming the bad field."""
        try:
            return cls._from_dict(d)
        except CostModelError as err:
            raise CostModelError(f"{source}: {err}") from None

    @classmethod
    def _from_dict(cls, d: Any) -> CostModel:
        if not isinstance(d, Mapping):
            raise CostModelError(f"a cost model must be a JSON object, got {type(d).__name__}.")
        if d.get("schema") != SCHEMA:
            raise CostModelError(f"schema must be {SCHEMA!r}, got {d.get('schema')!r}: this is "
                                 "not a simplace cost model.")
        if d.get("schema_version") != SCHEMA_VERSION:
            old = d.get("schema_version") == 1
            raise CostModelError(
                f"schema_version {d.get('schema_version')!r} is not supported; this simplace "
                f"reads version {SCHEMA_VERSION}. "
                + ("Version 1 models costed every op as its own jit call; re-measure the "
                   "machine with `simplace calibrate --name NAME` (a datasheet model: "
                   "`python cost_models/make_datasheets.py`)." if old else
                   "Regenerate the file with this version."))
        _check_keys(d, "", _TOP_REQUIRED, _TOP_OPTIONAL)
        name = _string(d["name"], "name")
        prov = Provenance.from_dict(d["provenance"])
        devs = d["devices"]
        if not isinstance(devs, list) or not devs:
            raise CostModelError("devices must be a non-empty list of device objects.")
        devices = tuple(Device.from_dict(x, where=f"devices[{k}]") for k, x in enumerate(devs))
        n = len(devices)
        links = d["links"]
        _check_keys(links, "links", ("latency_s", "bandwidth_bytes_per_s", "put_s"),
                    ("put_waits",))
        lat = _matrix(links["latency_s"], "links.latency_s", n)
        bw = _matrix(links["bandwidth_bytes_per_s"], "links.bandwidth_bytes_per_s", n,
                     inf_on_diagonal=True)
        put = _matrix(links["put_s"], "links.put_s", n)
        corr = d.get("corrections")
        corr = None if corr is None else Scales.from_dict(
            corr, n, launch_s=[dev.launch_s for dev in devices])
        return cls(name=name, devices=devices, latency_s=lat, bandwidth_bytes_per_s=bw,
                   corrections=corr, provenance=prov, put_s=put,
                   put_waits=links.get("put_waits"))

    def save(self, path: str | os.PathLike) -> None:
        """Write the model as JSON, atomically (a temporary file, then a rename)."""
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, name_or_path: str | os.PathLike,
             cost_model_dir: str | os.PathLike | None = None) -> CostModel:
        """A model by file path, or by name: ``<name>.json`` in the first folder that has
        it of ``cost_model_dir``, ``$SIMPLACE_COST_MODELS``, the user directory
        (``$SIMPLACE_HOME``), a source checkout's ``cost_models/``, and the machines shipped
        with simplace (``simplace.paths.cost_model_search_dirs``)."""
        from simplace import paths

        if not isinstance(name_or_path, str | os.PathLike):
            raise CostModelError(
                f"CostModel.load takes a cost-model name or the path of a cost-model JSON "
                f"file (a string or path), got {name_or_path!r}; "
                "simplace.paths.available_cost_models() lists the names.")
        if cost_model_dir is not None and not isinstance(cost_model_dir, str | os.PathLike):
            raise CostModelError(f"CostModel.load: cost_model_dir must be a folder (a string "
                                 f"or path) or None, got {cost_model_dir!r}.")
        path = paths.find_cost_model(name_or_path, cost_model_dir)
        d = read_json(path, CostModelError, "Cost-model file")
        return cls.from_dict(d, source=str(path))

    # ------------------------------------------------------------------ reporting
    def __eq__(self, other):
        if not isinstance(other, CostModel):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None

    def summary(self) -> str:
        """One line per device. In a measured model, figures the calibration fitted
        rather than measured are marked ``*``, and a rate the fit ran to its bound is
        shown as ``bound`` (the timings did not pin it)."""
        measured = self.provenance.source == "measured"
        lo_hi = {}
        if measured:
            lo_hi = {"flops": PEAK_FLOPS_BOUNDS, "bytes": BANDWIDTH_BOUNDS}
        reports = (self.provenance.meta.get("fit_report") or {}).get("devices") or {}
        marks = set()

        def rate(value: float, unit: str, scale: float, width: int, fmt: str,
                 recorded) -> str:
            if not measured:
                return f"{value / scale:{width}{fmt}}"
            lo, hi = lo_hi[unit]
            if value >= 0.99 * hi or value <= 1.01 * lo:
                marks.add("bound")
                return f"{'bound':>{width}}"
            if any(math.isclose(value, r, rel_tol=1e-9) for r in recorded):
                return f"{value / scale:{width}{fmt}}"  # a rate benchmark's figure
            marks.add("*")
            return f"{value / scale:{width - 1}{fmt}}*"

        def us(value: float) -> str:
            if value == 0:
                return "0"
            return f"{value * 1e6:.1f}" if value >= 1e-7 else f"{value * 1e6:.2g}"

        lines = [f"CostModel {self.name}  ({self.provenance.source}, {self.num_devices} devices"
                 f"{', corrected' if not self.corrections.is_identity else ''})"]
        for dev in self.devices:
            recs = (reports.get(dev.name) or {}).get("rates")
            recs = recs if isinstance(recs, Mapping) else {}  # a string: none recorded
            recorded = [float(r["rate"]) for r in recs.values()
                        if isinstance(r, Mapping) and isinstance(r.get("rate"), int | float)]
            op = f"op {us(dev.overhead_s)} us" + ("*" if measured else "")
            if measured:  # per-op costs come from the segment fit
                marks.add("*")
            lines.append(
                f"  {dev.name:<10} {dev.kind:<4} "
                f"{rate(dev.peak_flops_per_s, 'flops', 1e12, 8, '.2f', recorded)} TFLOP/s "
                f"{rate(dev.memory_bandwidth_bytes_per_s, 'bytes', 1e9, 8, '.1f', recorded)} "
                f"GB/s {dev.memory_bytes / 2 ** 30:7.1f} GiB  launch {us(dev.launch_s)} us  "
                f"dispatch {us(dev.dispatch_s)} us  {op}"
                + (f"  {len(dev.op_times_s)} measured ops" if dev.op_times_s else ""))
        if "*" in marks:
            lines.append("  *: fitted to timed segments, not measured directly")
        if "bound" in marks:
            lines.append("  bound: the fit ran this rate to its limit; the timings do not "
                         "pin it")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"CostModel(name={self.name!r}, devices={self.device_names}, "
                f"source={self.provenance.source!r}"
                + (", profiled" if self.profile is not None else "") + ")")


# --------------------------------------------------------------------------- lookup
def available_cost_models(cost_model_dir: str | os.PathLike | None = None
                          ) -> dict[str, Path]:
    """Name -> file of every model ``CostModel.load`` finds by name (first one wins, in
    the lookup order of ``simplace.paths.cost_model_search_dirs``)."""
    from simplace import paths

    return paths.available_cost_models(cost_model_dir)

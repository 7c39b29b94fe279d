"""Scales: factors on the kinds of cost of a priced problem, applied in one place.

A ``Scales`` multiplies each kind of cost that the simulators charge (``KINDS``):

* ``compute`` (float64[D]): the device work of each op inside a segment: its fused cost
  less its call-argument part, and the loop of its own that an unfused op runs
  (``SimInputs.op_unfused_s``). Calibration fits both from the same timed segments
  (``simplace.calibrate.fit``): a device that runs one faster or slower runs both so.
* ``launch`` (float64[D]): what each segment costs the device besides its ops: its
  launch (``launch_s``) and, for a segment the runtime hands to a worker thread, the
  thread's wake-up (``pool_launch_s``). Both are fixed costs of the runtime per segment,
  fitted together with the segments; on a CPU the wake-up is most of it.
* ``link`` (float64[D, D]): each copy over an ordered link, latency and bytes alike.
* ``host`` (one value): the host's time per segment call and ``device_put`` call
  (``dispatch_s``, ``put_s``): one host thread makes them all.
* ``argument`` (one value): the host's time per call argument, the part of the op times
  that ``Device.argument_s`` charges (``SimInputs.op_argument_s``). Timed apart from the
  calls themselves, it can be off apart from them.

``apply_scales`` is the one function that applies scales to a priced problem
(``SimInputs``); ``CostModel`` applies its drift corrections (a ``Scales``) through it,
and calibration bakes the scales it fits into a model's own figures with
``bake_scales``, which prices the same. ``fit_scales`` is the one fitter of scales to
measured steps: calibration's step fit and validation's drift fit both call it, so a
scale means the same thing in both.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from simplace.errors import CostModelError, SimplaceError
from simplace.sim.inputs import SimInputs, argument_part, frozen_inputs

__all__ = ["KINDS", "Scales", "ScalesFit", "Step", "apply_scales", "bake_scales", "fit_scales",
           "predict_steps", "scale_sensitivity"]

KINDS = ("host", "argument", "compute", "launch", "link")
# The shape of each kind's factor: one value, one per device or one per ordered link.
SHAPES = {"host": "one", "argument": "one", "compute": "device", "launch": "device",
          "link": "link"}
# What each kind scales, in words (for reports).
COVERS = {"host": "dispatch, device_put", "argument": "call arguments",
          "compute": "op work, unfused loops", "launch": "segment launch, wake-up",
          "link": "copies"}
# The kind of scale each SimInputs field is multiplied by (bandwidth: divided, so that a
# copy's latency + bytes / bandwidth scales whole; op_time_s: its part less
# op_argument_s, which the argument scale takes).
FIELD_KINDS = {
    "op_time_s": "compute", "op_unfused_s": "compute", "op_argument_s": "argument",
    "launch_s": "launch", "pool_launch_s": "launch", "latency_s": "link",
    "bandwidth_bytes_per_s": "link", "dispatch_s": "host", "put_s": "host"}
# The same for a CostModel's own figures (bake_scales): Device fields, then the model's
# link matrices; "/": divided by the factor (a rate).
DEVICE_FIGURES = {
    "dispatch_s": "host", "argument_s": "argument", "overhead_s": "compute",
    "class_overhead_s": "compute", "op_times_s": "compute", "unfused_overhead_s": "compute",
    "peak_flops_per_s": "/compute", "memory_bandwidth_bytes_per_s": "/compute",
    "launch_s": "launch", "parallel_launch_s": "launch"}
MODEL_FIGURES = {"latency_s": "link", "bandwidth_bytes_per_s": "/link", "put_s": "host"}
# A kind a file may leave out, and whose value it then takes: files written before the
# argument scale had one host scale for call arguments too.
_DEFAULT_TO = {"argument": "host"}
_JSON_KEYS = tuple(f"{k}_scale" for k in KINDS) + ("history",)


def _positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise CostModelError(f"{name} must be a number, got {value!r}.")
    x = float(value)
    if not (math.isfinite(x) and x > 0):
        raise CostModelError(f"{name} must be > 0 and finite, got {value!r}.")
    return x


def _array(value: Any, name: str, d: int, ndim: int) -> np.ndarray:
    """A float64 vector [d] or matrix [d, d] of finite numbers > 0 (CostModelError
    naming ``name`` and the first bad entry otherwise), from an array or nested lists."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "fiu":
        arr = value.astype(np.float64)
    else:
        rows = value.tolist() if isinstance(value, np.ndarray) else value
        if ndim == 1 and not isinstance(rows, list | tuple):
            raise CostModelError(f"{name} must be a list of {d} numbers, got "
                                 f"{type(value).__name__}.")
        if ndim == 2 and not (isinstance(rows, list | tuple)
                              and all(isinstance(r, list | tuple) for r in rows)):
            raise CostModelError(f"{name} must be a {d}x{d} matrix (a list of {d} lists), "
                                 f"got {type(value).__name__}.")
        if ndim == 1:
            arr = np.array([_positive(v, f"{name}[{i}]") for i, v in enumerate(rows)]
                           if len(rows) == d else [np.nan] * len(rows))
        elif len(rows) == d and all(len(r) == d for r in rows):
            arr = np.array([[_positive(v, f"{name}[{i}][{j}]") for j, v in enumerate(r)]
                            for i, r in enumerate(rows)]).reshape(d, d)
        else:
            arr = np.zeros((len(rows), len(rows[0]) if rows else 0))
    if ndim == 1 and arr.shape != (d,):
        raise CostModelError(f"{name} must have {d} entries for {d} devices, got "
                             f"{arr.size}.")
    if ndim == 2 and arr.shape != (d, d):
        shape = "x".join(map(str, arr.shape))
        raise CostModelError(f"{name} must be {d}x{d} for {d} devices, got {shape}.")
    bad = np.argwhere(~(np.isfinite(arr) & (arr > 0)))
    if bad.size:
        idx = "".join(f"[{int(k)}]" for k in bad[0])
        raise CostModelError(f"{name}{idx} must be > 0 and finite, got "
                             f"{float(arr[tuple(bad[0])])!r}.")
    return arr


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr = np.array(arr, dtype=np.float64, copy=True)
    arr.flags.writeable = False
    return arr


@dataclasses.dataclass(frozen=True, eq=False)
class Scales:
    """Factors on each kind of cost of a machine of D devices (``Scales.identity(D)``:
    all 1, nothing changes; ``Scales.uniform(D, compute=...)``: one value per kind).

    Attributes (the module docstring says what each kind covers; a factor left None
    is all 1):
      compute_scale: float64[D] > 0, device work of the ops on each device.
      launch_scale: float64[D] > 0, segment launch and worker-thread wake-up per device.
      link_scale: float64[D, D] > 0, copy time per ordered link (diagonal unused, 1).
      host_scale: > 0, host time of every segment call and ``device_put`` call.
      argument_scale: > 0, host time of every call argument.
      history: what was fitted when, on what (JSON-able dicts, oldest first).

    Raises CostModelError naming the bad field and entry.
    """

    compute_scale: np.ndarray
    launch_scale: np.ndarray | None = None
    link_scale: np.ndarray | None = None
    host_scale: float = 1.0
    argument_scale: float = 1.0
    history: tuple[dict, ...] = ()

    def __post_init__(self):
        d = np.size(self.compute_scale)
        for k in KINDS:
            name, value = f"scales.{k}_scale", self.factor(k)
            if SHAPES[k] == "one":
                value = _positive(value, name)
            else:
                ndim = 2 if SHAPES[k] == "link" else 1
                value = _array(np.ones((d,) * ndim) if value is None else value, name, d, ndim)
                if SHAPES[k] == "link":
                    # No copy to oneself: pinned, so that equal means equal.
                    np.fill_diagonal(value, 1.0)
                value = _frozen(value)
            object.__setattr__(self, f"{k}_scale", value)
        history = self.history
        if isinstance(history, Mapping) or not all(isinstance(h, Mapping) for h in history):
            raise CostModelError("scales.history must be a list of objects.")
        object.__setattr__(self, "history", tuple(dict(h) for h in history))
        for k, h in enumerate(self.history):
            try:
                json.dumps(h, allow_nan=False)
            except (TypeError, ValueError) as err:
                raise CostModelError(f"scales.history[{k}] must be JSON-able ({err}).") \
                    from None

    @classmethod
    def identity(cls, num_devices: int) -> Scales:
        """Scales that change nothing, for ``num_devices`` devices."""
        return cls.uniform(num_devices)

    @classmethod
    def uniform(cls, num_devices: int, **values: float) -> Scales:
        """One value per kind for every device and link: ``values`` maps kinds of
        ``KINDS`` to their factor (missing: 1)."""
        unknown = sorted(set(values) - set(KINDS))
        if unknown:
            raise CostModelError(f"Scales.uniform: unknown kind(s) {unknown}; the kinds are "
                                 f"{', '.join(KINDS)}.")
        d = int(num_devices)
        v = {k: _positive(values.get(k, 1.0), f"scales.{k}") for k in KINDS}
        return cls(**{f"{k}_scale": v[k] if SHAPES[k] == "one" else
                      np.full((d, d) if SHAPES[k] == "link" else d, v[k]) for k in KINDS})

    @property
    def num_devices(self) -> int:
        """Number of devices (D)."""
        return self.compute_scale.size

    @property
    def is_identity(self) -> bool:
        """Whether these scales change nothing."""
        return all(bool(np.all(self.factor(k) == 1)) for k in KINDS)

    def factor(self, kind: str):
        """The factor of ``kind`` (one of ``KINDS``): float64[D], [D, D] or a float."""
        return getattr(self, f"{kind}_scale")

    def subset(self, idx) -> Scales:
        """The scales of the devices ``idx`` (int[D']), in that order."""
        idx = np.asarray(idx, dtype=np.int64)
        pick = {"one": lambda v: v, "device": lambda v: v[idx],
                "link": lambda v: v[np.ix_(idx, idx)]}
        return dataclasses.replace(self, **{f"{k}_scale": pick[SHAPES[k]](self.factor(k))
                                            for k in KINDS})

    def compose(self, then: Scales) -> Scales:
        """The scales that ``self`` followed by ``then`` amount to (entrywise products;
        the histories one after the other): applying one after the other and applying
        the composition price alike."""
        if then.num_devices != self.num_devices:
            raise CostModelError(f"Scales.compose: scales of {self.num_devices} and "
                                 f"{then.num_devices} devices.")
        return Scales(**{f"{k}_scale": self.factor(k) * then.factor(k) for k in KINDS},
                      history=self.history + then.history)

    def scaled(self, **figures) -> dict[str, np.ndarray]:
        """The ``SimInputs`` fields ``figures`` (by field name, see ``FIELD_KINDS``) under
        these scales; ``op_time_s`` takes ``op_argument_s`` from ``figures`` (missing:
        none of it is argument time). The arithmetic of ``apply_scales``, for callers
        holding figures rather than a priced problem (``CostModel.launch_s``...)."""
        out = {}
        arg = figures.get("op_argument_s")
        for name, value in figures.items():
            if name not in FIELD_KINDS:
                raise CostModelError(f"No scale applies to {name!r}; scaled fields: "
                                     f"{', '.join(FIELD_KINDS)}.")
            v = np.asarray(value, dtype=np.float64)
            f = self.factor(FIELD_KINDS[name])
            if np.all(f == 1) and (name != "op_time_s" or self.argument_scale == 1):
                out[name] = v
            elif name == "op_time_s":
                a = np.zeros_like(v) if arg is None else np.asarray(arg, dtype=np.float64)
                out[name] = np.maximum(v - a, 0.0) * f + a * self.argument_scale
            elif name == "bandwidth_bytes_per_s":
                out[name] = v / f
            else:
                out[name] = v * f
        return out

    def __eq__(self, other):
        if not isinstance(other, Scales):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None

    def to_dict(self) -> dict:
        """The scales as a JSON-able dict (the cost model's ``corrections``); a
        one-valued scale only where it is not its default (``host_scale``: 1,
        ``argument_scale``: ``host_scale``)."""
        out = {}
        for k in KINDS:
            v = self.factor(k)
            if SHAPES[k] != "one":
                out[f"{k}_scale"] = v.tolist()
            elif v != (self.factor(_DEFAULT_TO[k]) if k in _DEFAULT_TO else 1.0):
                out[f"{k}_scale"] = v
        return out | {"history": [dict(h) for h in self.history]}

    @classmethod
    def from_dict(cls, d: Mapping, num_devices: int, *, launch_s: Sequence[float] | None = None,
                  where: str = "corrections") -> Scales:
        """Scales of ``num_devices`` devices read from their dict (absent fields: 1);
        ``where`` names it in error messages (CostModelError).

        Older files: a missing ``argument_scale`` is ``host_scale`` (one host scale
        covered call arguments too), and ``extra_overhead_s`` (seconds added to each
        segment's launch) becomes the launch scale that gives the same launch,
        ``(launch_s + extra) / launch_s`` with the devices' ``launch_s`` (the worker
        thread's wake-up, which the older correction left alone, now takes it too); one
        that no scale gives (a launch of 0, or cut to 0) is refused with how to refit.
        The conversion is noted in the history.
        """
        if not isinstance(d, Mapping):
            raise CostModelError(f"{where} must be an object, got {type(d).__name__}.")
        unknown = sorted(set(d) - set(_JSON_KEYS) - {"extra_overhead_s"})
        if unknown:
            raise CostModelError(f"{where}.{unknown[0]} is not a known field; {where} takes "
                                 f"{', '.join(_JSON_KEYS)}.")
        n, vals = int(num_devices), {}
        for k in sorted(KINDS, key=lambda k: k in _DEFAULT_TO):  # defaults read first
            name = f"{where}.{k}_scale"
            if SHAPES[k] == "one":
                vals[k] = _positive(d.get(f"{k}_scale", vals.get(_DEFAULT_TO.get(k), 1.0)),
                                    name)
            else:
                ndim = 2 if SHAPES[k] == "link" else 1
                vals[k] = _array(d.get(f"{k}_scale", np.ones((n,) * ndim)), name, n, ndim)
        hist = d.get("history", [])
        if not isinstance(hist, list) or not all(isinstance(h, Mapping) for h in hist):
            raise CostModelError(f"{where}.history must be a list of objects.")
        hist = list(hist)
        if "extra_overhead_s" in d:
            if "launch_scale" in d:
                raise CostModelError(f"{where} has both launch_scale and the older "
                                     "extra_overhead_s: keep launch_scale.")
            vals["launch"], note = _launch_from_overhead(d["extra_overhead_s"], launch_s,
                                                         n, where)
            hist += [note] if note else []
        return cls(**{f"{k}_scale": vals[k] for k in KINDS}, history=tuple(hist))


def _launch_from_overhead(extra, launch_s, n: int, where: str):
    """(launch scale [n], history note or None) of an older file's ``extra_overhead_s``."""
    name = f"{where}.extra_overhead_s"
    if not isinstance(extra, list | tuple) or len(extra) != n:
        raise CostModelError(f"{name} must be a list of {n} numbers.")
    for i, v in enumerate(extra):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise CostModelError(f"{name}[{i}] must be a number, got {v!r}.")
    scale = np.ones(n)
    for i, v in enumerate(extra):
        if v == 0:
            continue
        base = None if launch_s is None else float(launch_s[i])
        if base is None or base <= 0 or base + v <= 0:
            raise CostModelError(
                f"{name}[{i}] = {v!r} (the launch correction of an older simplace) has "
                f"no launch scale that gives it (launch_s {base!r}): delete the "
                "corrections from the file and fit them again (`simplace validate "
                "--update`).")
        scale[i] = (base + v) / base
    if np.all(scale == 1):
        return scale, None
    return scale, {"converted": "extra_overhead_s read as launch_scale",
                   "extra_overhead_s": [float(v) for v in extra]}


def apply_scales(inputs: SimInputs, scales: Scales) -> SimInputs:
    """``inputs`` (a priced problem) with ``scales`` applied: the one place scales
    touch a priced problem. Each field is multiplied by the factor of its kind
    (``FIELD_KINDS``): ``op_time_s`` as ``(op_time_s - op_argument_s) * compute +
    op_argument_s * argument``, bandwidth divided by the link scale. Applying ``a`` then
    ``b`` equals applying ``a.compose(b)``; identity scales return ``inputs`` itself.

    Raises CostModelError when the scales are for another number of devices.
    """
    if not isinstance(scales, Scales):
        raise CostModelError(f"apply_scales takes a Scales, got {type(scales).__name__}.")
    if scales.num_devices != inputs.num_devices:
        raise CostModelError(f"The scales are for {scales.num_devices} devices but the "
                             f"problem has {inputs.num_devices}.")
    if scales.is_identity:
        return inputs
    figures = {f: getattr(inputs, f) for f in FIELD_KINDS}
    figures["op_argument_s"] = argument_part(inputs)
    # Positive factors of checked arrays keep every invariant: no new pricing.
    return frozen_inputs(inputs, **scales.scaled(**figures))


def bake_scales(model, scales: Scales):
    """``model`` (a ``CostModel``) with ``scales`` multiplied into its own figures
    (``DEVICE_FIGURES``, ``MODEL_FIGURES``): each device's roofline rates, per-op costs,
    measured op times and unfused cost (compute), launch and worker wake-up (launch),
    dispatch (host) and argument cost (argument); the links' latency and bandwidth
    (link) and put calls (host). Pricing the result gives ``apply_scales(model.price(
    graph), scales)`` (without a profile). Calibration keeps the scales it fits this
    way: they are part of the model, not drift corrections."""
    def times(value, kind: str, f):
        f = 1.0 / f if kind.startswith("/") else f
        if isinstance(value, Mapping):  # a table of seconds (per op class, per signature)
            return {n: v * f for n, v in value.items()}
        return value * f

    def factor(kind: str, k: int | None = None):
        f = scales.factor(kind.lstrip("/"))
        return f if k is None or SHAPES[kind.lstrip("/")] == "one" else float(f[k])

    devs = tuple(dataclasses.replace(dev, **{
        name: times(getattr(dev, name), kind, factor(kind, k))
        for name, kind in DEVICE_FIGURES.items()}) for k, dev in enumerate(model.devices))
    return dataclasses.replace(model, devices=devs, **{
        name: times(getattr(model, name), kind, factor(kind))
        for name, kind in MODEL_FIGURES.items()})


# --------------------------------------------------------------------------- fitting
class Step(NamedTuple):
    """One measured step: ``graph`` (OpGraph), its priced problem ``inputs`` without the
    scales being fitted (``SimInputs``), the ``placement`` (int[M]) that ran and the
    step time ``measured_s`` (seconds)."""

    graph: Any
    inputs: SimInputs
    placement: np.ndarray
    measured_s: float


@dataclasses.dataclass(frozen=True)
class ScalesFit:
    """The result of ``fit_scales``: the fitted ``scales`` and what the solver did
    (``solver``: its final ``cost``, ``nfev``, ``status``, the number of ``variables``,
    the ``start`` it came from and every start tried, ``starts``)."""

    scales: Scales
    solver: dict


# Sharing of a kind's entries in a fit: one value per entry (device or link), per
# exclusive group of devices (links: one value) or one for all; or the name of another
# one-valued kind, whose value it takes (the argument scale the host's).
SHARING = ("each", "group", "all")


class _Problem:
    """Step times of ``steps`` as functions of the log scales ``z`` (each kind of
    ``KINDS`` in turn: one value, one per device, or one per ordered link off the
    diagonal), with their gradient.

    A step time is a max-plus function of the costs, so its derivative is that of its
    critical path (``simplace.sim.critical.schedule_critical_path``): d step / d log
    scale of a kind is the time of the path's costs of that kind (``FIELD_KINDS``), on
    the device or link of that entry: the work, unfused loops, call arguments, launch
    and wake-up of the path's segments, its copies, and the host calls it waits for.
    """

    def __init__(self, steps: Sequence[Step], d: int):
        self.steps, self.d = list(steps), d
        self.off = np.argwhere(~np.eye(d, dtype=bool))
        self.link_index = np.full((d, d), -1, dtype=np.int64)
        self.link_index[self.off[:, 0], self.off[:, 1]] = np.arange(len(self.off))
        sizes = {"one": 1, "device": d, "link": len(self.off)}
        ends = np.cumsum([sizes[SHAPES[k]] for k in KINDS])
        self.slices = {k: slice(int(e - sizes[SHAPES[k]]), int(e))
                       for k, e in zip(KINDS, ends, strict=True)}
        self.size = int(ends[-1])
        self.group = np.asarray(self.steps[0].inputs.exclusive_group)
        self._cache: tuple | None = None

    def z_of(self, s: Scales) -> np.ndarray:
        parts = {"one": lambda v: [v], "device": lambda v: v,
                 "link": lambda v: v[self.off[:, 0], self.off[:, 1]]}
        return np.log(np.concatenate([parts[SHAPES[k]](s.factor(k)) for k in KINDS]))

    def scales_of(self, z: np.ndarray) -> Scales:
        out = {}
        for k, sl in self.slices.items():
            e = np.exp(z[sl])
            if SHAPES[k] == "link":
                out[k] = np.ones((self.d, self.d))
                out[k][self.off[:, 0], self.off[:, 1]] = e
            else:
                out[k] = float(e[0]) if SHAPES[k] == "one" else e
        return Scales(**{f"{k}_scale": v for k, v in out.items()})

    def index(self, kind: str, device: int = 0, link: tuple[int, int] = (0, 1)) -> int:
        """The entry of z of ``kind`` for a cost on ``device`` or ``link``."""
        shape = SHAPES[kind]
        at = 0 if shape == "one" else device if shape == "device" else self.link_index[link]
        return self.slices[kind].start + int(at)

    def variables(self, kinds: Sequence[str], share: Mapping[str, str]):
        """(free entries of z, tie map, number of variables): a fitted vector x sets
        ``z[free] = x[tie_map]``."""
        free, keys = [], []
        for kind in KINDS:
            mode = share.get(kind, "each")
            owner = mode if mode in KINDS else kind  # a kind tied to another's value
            if owner not in kinds:
                continue
            sl = self.slices[kind]
            for e in range(sl.start, sl.stop):
                if owner != kind or SHAPES[kind] == "one" or mode == "all" or (
                        SHAPES[kind] == "link" and mode == "group"):
                    key: tuple = (owner,)
                elif mode == "group":
                    key = (kind, int(self.group[e - sl.start]))
                else:
                    key = (kind, e)
                free.append(e)
                keys.append(key)
        ids: dict[tuple, int] = {}
        tie_map = [ids.setdefault(k, len(ids)) for k in keys]
        return np.asarray(free, dtype=np.int64), np.asarray(tie_map, dtype=np.int64), len(ids)

    def evaluate(self, z: np.ndarray, *, grad: bool = True):
        """(step_s[R], d step / d z [R, Z]; None without ``grad``) under ``z``."""
        from simplace.sim.reference import simulate

        if self._cache is not None and np.array_equal(self._cache[0], z):
            return self._cache[1], self._cache[2]
        scales = self.scales_of(z)
        scaled: dict[int, SimInputs] = {}
        steps = np.empty(len(self.steps))
        jac = np.zeros((len(self.steps), self.size)) if grad else None
        for r, st in enumerate(self.steps):
            inp = scaled.get(id(st.inputs))
            if inp is None:
                inp = scaled[id(st.inputs)] = apply_scales(st.inputs, scales)
            res = simulate(st.graph, inp, st.placement, schedule=grad)
            steps[r] = res.step_time_s
            if grad:
                for field, at, t in self._path_costs(st, inp, res):
                    jac[r, self.index(FIELD_KINDS[field], *at)] += t
        if grad:
            self._cache = (z.copy(), steps, jac)
        return steps, jac

    def _path_costs(self, st: Step, inp: SimInputs, res):
        """(SimInputs field, (device, link), seconds) of each cost on the step's critical
        path: what a log scale of that field's kind moves the step by."""
        from simplace.sim.critical import schedule_critical_path
        from simplace.sim.reference import segment_pool_launch

        sch = res.schedule
        segs, trs, host_s = schedule_critical_path(
            st.graph, inp.exclusive_group, st.placement, sch, res.step_time_s,
            inp.latency_s, inp.put_waits)
        # The path's host time sums its dispatch and put calls: one kind scales both
        # (FIELD_KINDS); a kind of its own for either would need the path to tell them
        # apart (simplace.sim.critical).
        yield "dispatch_s", (), host_s
        arg = argument_part(inp)
        for s in segs:
            k = int(sch.segment_device[s])
            lo, hi = int(sch.segment_first[s]), int(sch.segment_stop[s])
            pool = segment_pool_launch(inp, lo, hi, k)
            ops, a = float(inp.op_time_s[lo:hi, k].sum()), float(arg[lo:hi, k].sum())
            dur = float(sch.segment_end_s[s] - sch.segment_start_s[s])
            yield "op_time_s", (k,), ops - a
            yield "op_argument_s", (k,), a
            yield "launch_s", (k,), float(inp.launch_s[k])
            yield "pool_launch_s", (k,), pool
            # what the segment lasts beyond its launch and ops: its unfused loops
            yield "op_unfused_s", (k,), dur - float(inp.launch_s[k]) - pool - ops
        for t, whole in trs:
            i, j = int(sch.transfer_from[t]), int(sch.transfer_to[t])
            lat = float(inp.latency_s[i, j])
            # a copy waited for in full takes its latency; one the path only followed for
            # its link time, its bytes
            yield "latency_s", (0, (i, j)), lat if whole else 0.0
            yield "bandwidth_bytes_per_s", (0, (i, j)), float(
                sch.transfer_end_s[t] - sch.transfer_start_s[t]) - lat


def _problem(steps: Sequence[Step], scales: Scales | None, who: str) -> _Problem:
    steps = list(steps)
    if not steps:
        raise SimplaceError(f"{who} needs at least one measured step.")
    d = steps[0].inputs.num_devices
    if any(st.inputs.num_devices != d for st in steps) or (
            scales is not None and scales.num_devices != d):
        raise SimplaceError(f"{who}: every step and the scales must be of one machine "
                            f"({d} devices).")
    return _Problem(steps, d)


def predict_steps(steps: Sequence[Step], scales: Scales) -> np.ndarray:
    """float64[R]: the simulated time of each of ``steps`` under ``scales``."""
    prob = _problem(steps, scales, "predict_steps")
    return prob.evaluate(prob.z_of(scales), grad=False)[0]


def scale_sensitivity(steps: Sequence[Step], scales: Scales) -> dict[str, float]:
    """Kind -> the largest ``|d log step / d log scale|`` over ``steps`` at ``scales``,
    every entry of the kind moving together: how much a measured step can say about
    each kind (0: nothing)."""
    prob = _problem(steps, scales, "scale_sensitivity")
    t, jac = prob.evaluate(prob.z_of(scales))
    return {k: float(np.max(np.abs(jac[:, sl].sum(axis=1)) / np.maximum(t, 1e-300)))
            for k, sl in prob.slices.items()}


def fit_scales(steps: Sequence[Step], *, kinds: Sequence[str] = KINDS,
               share: Mapping[str, str] | None = None, start: Scales | None = None,
               loss: str = "linear", f_scale: float = 0.1, prior_weight: float = 1e-3,
               limit: float = 1e3, max_nfev: int = 50) -> ScalesFit:
    """Fit scales so that the simulated ``steps`` take their measured times.

    Minimises ``sum_r rho(log(sim_r / measured_r)^2) + prior_weight * |x|^2`` over the
    log scales ``x`` of ``kinds`` (the others keep ``start``'s values) with
    ``scipy.optimize.least_squares`` (trust region, exact subgradients from each step's
    critical path, bounds ``1/limit .. limit``). The step time is piecewise linear in
    the scales (max-plus), so the fit has local minima: it is solved from ``start``,
    from identity, from a coarse fit (one value per kind) refined to ``share``, and
    again with runaway values reset; the best solution is kept. The prior pulls a scale
    that no step sees to 1.

    Args:
      steps: the measured steps (``Step``), all of one machine.
      kinds: which kinds of ``KINDS`` to fit.
      share: kind -> ``"each"`` (default: one value per device or ordered link),
        ``"group"`` (per-device kinds: one per exclusive group; links: one),
        ``"all"`` (one value for the kind) or another one-valued kind (``argument``:
        ``"host"``), whose value it takes, fitted exactly when that kind is.
      start: where the fit starts, and the values of kinds not fitted (default
        identity); its history is not kept.
      loss, f_scale: scipy's robust loss on the log ratios and its scale.
      prior_weight: weight of the pull of every log scale towards 0.
      limit: the largest factor either way.
      max_nfev: most evaluations per solve.

    Raises SimplaceError for no steps, steps of several machines, a measured time that
    is not > 0, an unknown kind or sharing.
    """
    from scipy.optimize import least_squares

    share = dict(share or {})
    bad = [k for k in kinds if k not in KINDS] + [
        f"{k}={v}" for k, v in share.items()
        if k not in KINDS or v not in SHARING + KINDS or v == k
        or (v in KINDS and not SHAPES[k] == SHAPES[v] == "one")]
    if bad:
        raise SimplaceError(f"fit_scales: unknown kind or sharing {bad}; kinds are "
                            f"{', '.join(KINDS)}, sharings {', '.join(SHARING)} or another "
                            "one-valued kind (argument: 'host').")
    prob = _problem(steps, start, "fit_scales")
    meas = np.array([float(st.measured_s) for st in prob.steps])
    if not np.all(np.isfinite(meas) & (meas > 0)):
        raise SimplaceError("fit_scales: every measured step time must be > 0 seconds.")
    start = Scales.identity(prob.d) if start is None else start
    z0 = prob.z_of(start)
    free, tmap, nv = prob.variables(kinds, share)
    lam, bound = math.sqrt(max(prior_weight, 0.0)), math.log(limit)

    def solve(z_start: np.ndarray, tmap: np.ndarray, nv: int):
        """least_squares over the variables of ``tmap`` from ``z_start`` (tied entries:
        their mean); entries not fitted keep ``z0``'s."""
        onehot = np.zeros((len(free), nv))  # dz[free] / dx
        onehot[np.arange(len(free)), tmap] = 1.0

        def expand(x):
            z = z0.copy()
            z[free] = x[tmap]
            return z

        def fun(x):
            t, _ = prob.evaluate(expand(x))
            return np.concatenate([np.log(np.maximum(t, 1e-15) / meas), lam * x])

        def jac(x):
            t, j = prob.evaluate(expand(x))
            return np.vstack([(j[:, free] @ onehot) / np.maximum(t, 1e-15)[:, None],
                              lam * np.eye(nv)])

        x0 = (z_start[free] @ onehot) / np.maximum(onehot.sum(axis=0), 1)
        x0 = np.clip(x0, -bound + 1e-9, bound - 1e-9)
        sol = least_squares(fun, x0, jac=jac, method="trf", bounds=(-bound, bound),
                            loss=loss, f_scale=f_scale, max_nfev=max_nfev, x_scale="jac")
        return expand(sol.x), sol

    if not nv:
        return ScalesFit(dataclasses.replace(start, history=()), {"note": "nothing to fit"})
    starts = {"current": z0}
    if not start.is_identity:
        starts["identity"] = np.zeros_like(z0)
    coarse = {k: share[k] if share.get(k) in KINDS else "all" for k in KINDS}
    _, ctmap, cnv = prob.variables(kinds, coarse)
    if cnv < nv:
        starts["coarse"] = solve(z0, ctmap, cnv)[0]
    best = None
    for how, zs in starts.items():
        z_try, sol = solve(zs, tmap, nv)
        if best is None or sol.cost < best[2].cost:
            best = (how, z_try, sol)
    # A scale pushed towards 0 takes its ops or copies off every critical path, or
    # nearly (the gradient of a log scale is the time it scales): nothing pulls it back.
    # Reset such dead or runaway (beyond 10x) values to 1 and solve again from there.
    _, jz = prob.evaluate(best[1])
    zf = best[1][free]
    dead = free[(~np.any(jz[:, free] != 0, axis=0) | (np.abs(zf) > math.log(10)))
                & (zf != 0)]
    if dead.size:
        zs = best[1].copy()
        zs[dead] = 0.0
        starts["revived"] = zs
        z_try, sol = solve(zs, tmap, nv)
        if sol.cost < best[2].cost:
            best = ("revived", z_try, sol)
    how, z, sol = best
    return ScalesFit(prob.scales_of(z), {
        "cost": float(sol.cost), "nfev": int(sol.nfev), "status": int(sol.status),
        "variables": int(nv), "start": how, "starts": list(starts)})

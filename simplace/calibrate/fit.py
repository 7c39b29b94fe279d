"""Fits: in-segment op costs from timed segments, latency and bandwidth per link.

Both fits minimise log-space residuals (``log predicted - log measured``: a relative
error, so a 10 us segment counts as much as a 10 ms one) with a robust loss (``soft_l1``),
so that a few bad timings cannot pull the fit (``scipy.optimize.least_squares``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from simplace.cost_model import BANDWIDTH_BOUNDS, PEAK_FLOPS_BOUNDS
from simplace.errors import CalibrationError

# Scale of the robust loss in log space: residuals beyond ~10% count linearly, not
# quadratically, so outliers weigh less.
LOG_F_SCALE = 0.1


def _least_squares(residuals, x0, lower, upper):
    from scipy.optimize import least_squares

    x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)
    return least_squares(residuals, x0, bounds=(lower, upper), loss="soft_l1",
                         f_scale=LOG_F_SCALE, method="trf", x_scale=1.0, max_nfev=2000)


def rel_errors(pred: np.ndarray, meas: np.ndarray) -> dict:
    """``{"n", "median_rel_error", "p90_rel_error"}`` of ``|pred / meas - 1|`` (None for
    no points): how the calibration reports every fit's errors."""
    if len(meas) == 0:
        return {"n": 0, "median_rel_error": None, "p90_rel_error": None}
    err = np.abs(pred / meas - 1.0)
    return {"n": int(len(meas)), "median_rel_error": float(np.median(err)),
            "p90_rel_error": float(np.percentile(err, 90))}


@dataclasses.dataclass(frozen=True)
class LinkFit:
    """A fitted link: ``t = latency_s + nbytes / bandwidth_bytes_per_s``.

    Attributes:
      latency_s, bandwidth_bytes_per_s: the fitted figures.
      nbytes, time_s: float64[N], the points fitted (median time per size).
      rel_residuals: float64[N], ``predicted / measured - 1`` per point.
    """

    latency_s: float
    bandwidth_bytes_per_s: float
    nbytes: np.ndarray
    time_s: np.ndarray
    rel_residuals: np.ndarray

    @property
    def median_abs_rel_error(self) -> float:
        """Median absolute relative residual of the fit."""
        return float(np.median(np.abs(self.rel_residuals)))

    def predict(self, nbytes) -> np.ndarray:
        """Seconds to copy ``nbytes`` over the link: latency plus bytes over bandwidth."""
        return self.latency_s + np.asarray(nbytes, dtype=np.float64) / self.bandwidth_bytes_per_s


# No copy between devices runs faster than this (NVLink 5 is ~1e12 B/s per direction).
LINK_BANDWIDTH_MAX_BYTES_PER_S = 1e13


def fit_link(nbytes: Sequence[float], time_s: Sequence[float]) -> LinkFit:
    """Fit latency and bandwidth to transfer times (seconds) of sizes ``nbytes``.

    Needs at least 2 distinct sizes; raises CalibrationError otherwise.
    """
    n = np.asarray(nbytes, dtype=np.float64)
    t = np.asarray(time_s, dtype=np.float64)
    if n.shape != t.shape or n.ndim != 1:
        raise CalibrationError(f"fit_link needs equal-length 1-D sizes and times, got "
                               f"{n.shape} and {t.shape}.")
    if len(np.unique(n)) < 2:
        raise CalibrationError(f"fit_link needs at least 2 distinct sizes, got "
                               f"{np.unique(n).tolist()}.")
    if not np.all(np.isfinite(t) & (t > 0)) or np.any(n < 0):
        raise CalibrationError("fit_link: times must be finite and > 0, sizes >= 0.")
    log_t = np.log(t)

    def residuals(x):
        return np.log(np.exp(x[0]) + n / np.exp(x[1])) - log_t

    small, large = np.argmin(n), np.argmax(n)
    lat0 = max(t[small] * 0.9, 1e-9)
    bw0 = max(n[large] / max(t[large] - lat0, t[large] * 0.1), 1.0)
    x0 = np.array([math.log(lat0), math.log(bw0)])
    lo = np.array([math.log(1e-10), math.log(1.0)])
    hi = np.array([math.log(max(t.max(), 1e-9) * 10), math.log(1e15)])
    res = _least_squares(residuals, x0, lo, hi)
    lat, bw = float(np.exp(res.x[0])), float(np.exp(res.x[1]))
    pred = lat + n / bw
    # Refuse what no link does: a bandwidth pinned at the bound (the times did not grow
    # with size) would make every copy free.
    if bw > LINK_BANDWIDTH_MAX_BYTES_PER_S or t[large] < 1.2 * t[small]:
        raise CalibrationError(
            f"the transfer times do not grow with size ({n[small]:.0f} B: "
            f"{t[small] * 1e6:.1f} us, {n[large]:.0f} B: {t[large] * 1e6:.1f} us; fitted "
            f"{bw:.3g} B/s): the link cannot be fitted. Measure it again on an idle "
            "machine, with larger sizes (a calibration without --quick).")
    return LinkFit(lat, bw, n, t, pred / t - 1.0)


# --------------------------------------------------------------------------- segments
# Bounds that keep a segment fit physical: the cost model's rate bounds, per-op costs
# inside a fused computation below 1 ms.
_PEAK_FLOPS_BOUNDS = PEAK_FLOPS_BOUNDS
_BANDWIDTH_BOUNDS = BANDWIDTH_BOUNDS
_OP_OVERHEAD_MAX_S = 1e-3
# An efficiency below this is a rate folded into an efficiency, not a measurement.
EFFICIENCY_MIN = 1e-3


@dataclasses.dataclass(frozen=True)
class SegmentFit:
    """In-segment op costs fitted to timed segments of one device.

    A segment timed alone (blocking) costs ``base_s`` (dispatch + launch + wait, from a
    tiny call) plus the sum of its ops' roofline times (``Device.roofline_s``) under
    ``peak_flops_per_s``, ``memory_bandwidth_bytes_per_s``, ``efficiency`` and
    ``class_overhead_s`` per class and ``fused_bytes_fraction``. ``unpinned`` names the
    rates (``"peak compute rate"``, ``"memory bandwidth"``) that ran to their bounds:
    the segments' times do not depend on them, and neither figure is to be trusted.
    """

    peak_flops_per_s: float
    memory_bandwidth_bytes_per_s: float
    efficiency: Mapping[str, float]
    class_overhead_s: Mapping[str, float]
    fused_bytes_fraction: float
    classes_fitted: tuple[str, ...]
    parallel_launch_s: float = 0.0
    unfused_overhead_s: float = 0.0
    unpinned: tuple[str, ...] = ()

    def device(self, **fields):
        """A ``Device`` with these costs (``fields``: name, kind, memory_bytes...)."""
        from simplace.cost_model import Device

        return Device(peak_flops_per_s=self.peak_flops_per_s,
                      memory_bandwidth_bytes_per_s=self.memory_bandwidth_bytes_per_s,
                      efficiency=dict(self.efficiency),
                      class_overhead_s=dict(self.class_overhead_s),
                      overhead_s=float(np.median(list(self.class_overhead_s.values()))),
                      fused_bytes_fraction=self.fused_bytes_fraction,
                      parallel_launch_s=self.parallel_launch_s,
                      unfused_overhead_s=self.unfused_overhead_s, **fields)


def _segment_arrays(segments: Sequence[Mapping]):
    """Flat op arrays of segments: class index, flops, bytes, segment id."""
    from simplace.cost_model import OP_CLASSES, op_class

    idx = {c: k for k, c in enumerate(OP_CLASSES)}
    cls, fl, by, seg, loc = [], [], [], [], []
    for k, s in enumerate(segments):
        cls += [idx[op_class(p)] for p in s["primitive"]]
        fl += list(s["flops"])
        by += list(s["bytes_accessed"])
        seg += [k] * len(s["primitive"])
        loc += list(s.get("local_input", [True] * len(s["primitive"])))
    return (np.asarray(cls, np.int64), np.asarray(fl, np.float64), np.asarray(by, np.float64),
            np.asarray(seg, np.int64), np.asarray(loc, bool))


def _checked_times(segments: Sequence[Mapping], time_s: Sequence[float], base_s
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``(time_s, base_s)`` as float64[S] arrays, or CalibrationError where the segments
    cannot pin op costs (a length mismatch, too few, bad times, or hardly slower than an
    empty call)."""
    t = np.asarray(time_s, dtype=np.float64)
    if len(t) != len(segments):
        raise CalibrationError(f"fit_segments: {len(segments)} segments but {len(t)} times.")
    if len(t) < 8:
        raise CalibrationError(
            f"Only {len(t)} timed segments to fit op costs on (8 needed): calibrate again "
            "with more --models or without a tight --budget-s.")
    if not np.all(np.isfinite(t) & (t > 0)):
        raise CalibrationError("fit_segments: segment times must be finite and > 0.")
    base_s = np.broadcast_to(np.asarray(base_s, dtype=np.float64), t.shape)
    if np.median(t / base_s) < 1.05:
        raise CalibrationError(
            f"The timed segments (median {np.median(t) * 1e6:.1f} us) are hardly slower than "
            f"an empty call ({np.median(base_s) * 1e6:.1f} us): their op costs cannot be "
            "told apart from noise. Calibrate with larger --models.")
    return t, base_s


def _unpinned(x: np.ndarray, pinned: bool, kpos: Mapping[int, int], n_rate: int
              ) -> tuple[str, ...]:
    """The parameters of ``fit_segments``' solution ``x`` that ran to their bounds: ones
    the segments cannot see (a rate: their times are per-op and launch costs; an
    efficiency at its floor: a rate folded into it). The calibration refuses them
    (``build_cost_model``)."""
    from simplace.cost_model import OP_CLASSES

    us = 1e-6
    out = () if pinned else tuple(what for k, what, bounds in (
        (0, "peak compute rate", _PEAK_FLOPS_BOUNDS),
        (1, "memory bandwidth", _BANDWIDTH_BOUNDS))
        if x[k] >= math.log(bounds[1]) - 0.01)
    if not pinned:
        out += tuple(f"{OP_CLASSES[k]} efficiency" for k, n in kpos.items()
                     if x[2 + n] <= math.log(EFFICIENCY_MIN) + 0.01)
    out += tuple(f"{OP_CLASSES[k]} per-op cost" for k, n in kpos.items()
                 if x[n_rate + n] >= _OP_OVERHEAD_MAX_S / us * 0.99)
    return out


def fit_segments(segments: Sequence[Mapping], time_s: Sequence[float], base_s,
                 parallel=None, rates: Mapping[str, float] | None = None) -> SegmentFit:
    """Fit in-segment op costs to segments timed alone.

    Args:
      segments: per segment its ops' ``primitive``, ``flops``, ``bytes_accessed`` lists
        (``simplace.calibrate.segments.segment_features``).
      time_s: each segment's measured (blocking) time.
      base_s: what each segment costs besides its ops when timed alone (a tiny call's
        blocking time: dispatch + launch + wait, plus its largest primitive launch);
        a number, or one per segment.
      parallel: bool per segment: it holds an op the runtime runs on a thread pool, and
        pays ``parallel_launch_s`` (fitted) once; None: no segment does.
      rates: the device's per-class rates from saturating microbenchmarks
        (``simplace.calibrate.rates``): they fix the peaks and efficiencies, and the fit
        only finds what small segments show (per-op costs, fusion, the worker-thread
        wake-up). None: the rates are fitted too (older records; see ``unpinned``).

    Robust (soft-L1) least squares on log segment times. A class no segment has enough
    work of keeps the default efficiency and a zero per-op cost. Raises
    CalibrationError when the segments cannot pin the costs (too few, or every one
    about as fast as an empty call).
    """
    from simplace.cost_model import DEFAULT_EFFICIENCY, OP_CLASSES, WORK_CLASSES

    t, base_s = _checked_times(segments, time_s, base_s)
    par = np.zeros(len(t), bool) if parallel is None else np.asarray(parallel, dtype=bool)
    cls, fl, by, seg, loc = _segment_arrays(segments)
    n_seg = len(t)
    work_cls = [OP_CLASSES.index(c) for c in WORK_CLASSES]
    free_k, dm_k = OP_CLASSES.index("free"), OP_CLASSES.index("data_movement")
    # free ops that do work are charged like data_movement (cost_model.op_times)
    eff_cls = np.where(cls == free_k, dm_k, cls)
    no_work = (cls == free_k) & (fl == 0) & (by == 0)
    fused = np.isin(cls, [OP_CLASSES.index("elementwise"), free_k])
    unfused = fused & ~no_work & ~loc
    present = [k for k in work_cls if np.any((eff_cls == k) & ~no_work)]
    if not present:
        raise CalibrationError("No op in the timed segments does any work (all are views "
                               "such as reshape): nothing to fit op costs on. Calibrate "
                               "with real --models.")
    kpos = {k: n for n, k in enumerate(present)}
    pos = np.array([kpos.get(int(k), -1) for k in eff_cls])
    npres = len(present)
    log_t = np.log(t)
    us = 1e-6

    pinned = None
    if rates is not None:
        from simplace.calibrate.rates import device_rates

        peak_p, bw_p, eff_p = device_rates(rates)
        eff_pinned = np.array([eff_p.get(OP_CLASSES[k], DEFAULT_EFFICIENCY[OP_CLASSES[k]])
                               for k in present])
        pinned = (peak_p, bw_p, eff_pinned)
    n_rate = 0 if pinned else 2 + npres  # leading parameters: log rates, log efficiencies

    def unpack(x):
        if pinned:
            peak, bw, eff = pinned
        else:
            peak, bw = math.exp(x[0]), math.exp(x[1])
            eff = np.exp(x[2:2 + npres])
        ovh = x[n_rate:n_rate + npres] * us
        frac = x[-3]
        return peak, bw, eff, ovh, frac

    def op_costs(x):
        peak, bw, eff, ovh, frac = unpack(x)
        p = np.maximum(pos, 0)
        charged = np.where(fused, frac * by, by)
        c = ovh[p] + np.maximum(fl / peak, charged / bw) / eff[p] + unfused * x[-2] * us
        return np.where(no_work | (pos < 0), 0.0, c)

    def residuals(x):
        per_seg = np.bincount(seg, weights=op_costs(x), minlength=n_seg)
        return np.log(base_s + par * x[-1] * us + per_seg) - log_t

    x0 = np.concatenate([[math.log(1e11), math.log(2e10)], np.log(np.full(npres, 0.5)),
                         np.full(npres, 1.0), [0.5], [1.0], [10.0 if par.any() else 0.0]])
    lo = np.concatenate([[math.log(_PEAK_FLOPS_BOUNDS[0]), math.log(_BANDWIDTH_BOUNDS[0])],
                         np.full(npres, math.log(EFFICIENCY_MIN)), np.zeros(npres), [0.0],
                         [0.0], [0.0]])
    hi = np.concatenate([[math.log(_PEAK_FLOPS_BOUNDS[1]), math.log(_BANDWIDTH_BOUNDS[1])],
                         np.zeros(npres), np.full(npres, _OP_OVERHEAD_MAX_S / us), [1.0],
                         [_OP_OVERHEAD_MAX_S / us],
                         [_OP_OVERHEAD_MAX_S / us if par.any() else 1.0]])
    res = None
    if pinned:
        x0, lo, hi = x0[2 + npres:], lo[2 + npres:], hi[2 + npres:]
        res = _least_squares(residuals, x0, lo, hi)
    else:
        # The max() of the roofline makes the loss non-convex in the rates: start from
        # a CPU, a GPU and an accelerator and keep the best.
        for peak0, bw0 in ((1e11, 2e10), (1e13, 5e11), (3e14, 3e12)):
            x0[0], x0[1] = math.log(peak0), math.log(bw0)
            r = _least_squares(residuals, x0, lo, hi)
            if res is None or r.cost < res.cost:
                res = r
    # Parameters at their bounds are named: the calibration refuses them.
    unpinned = _unpinned(res.x, bool(pinned), kpos, n_rate)
    peak, bw, eff, ovh, frac = unpack(res.x)
    # The efficiency of the best class is 1 by convention: fold it into the peaks
    # (pinned rates: the best class of each unit is 1 already).
    top = 1.0 if pinned or not npres else float(eff.max())
    eff_out = {c: (eff_p.get(c, DEFAULT_EFFICIENCY[c]) if pinned else DEFAULT_EFFICIENCY[c])
               for c in WORK_CLASSES}
    ovh_out = {c: 0.0 for c in WORK_CLASSES}
    for k, n in kpos.items():
        eff_out[OP_CLASSES[k]] = float(min(eff[n] / top, 1.0))
        ovh_out[OP_CLASSES[k]] = float(ovh[n])
    return SegmentFit(peak_flops_per_s=peak * top, memory_bandwidth_bytes_per_s=bw * top,
                      efficiency=eff_out, class_overhead_s=ovh_out,
                      fused_bytes_fraction=float(frac),
                      classes_fitted=tuple(OP_CLASSES[k] for k in present), unpinned=unpinned,
                      parallel_launch_s=float(res.x[-1] * us) if par.any() else 0.0,
                      unfused_overhead_s=float(res.x[-2] * us) if unfused.any() else 0.0)


def predict_segments(device, segments: Sequence[Mapping], base_s) -> np.ndarray:
    """float64[S]: ``base_s`` plus the sum of ``device.roofline_s`` over each segment's
    ops: the time of each segment timed alone under a fitted device (``base_s``: a
    number, or one per segment)."""
    from simplace.cost_model import OP_CLASSES

    cls, fl, by, seg, loc = _segment_arrays(segments)
    costs = device.roofline_s(cls, fl, by)
    free_k = OP_CLASSES.index("free")
    fusible = np.isin(cls, [OP_CLASSES.index("elementwise"), free_k]) & ~(
        (cls == free_k) & (fl == 0) & (by == 0))
    costs = costs + np.where(fusible & ~loc, device.unfused_overhead_s, 0.0)
    return base_s + np.bincount(seg, weights=costs, minlength=len(segments))

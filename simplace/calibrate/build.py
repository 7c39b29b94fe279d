"""From calibration records to a cost model: the fits, the held-out errors, the file.

Everything here reads records only, so ``simplace calibrate --refit`` rebuilds exactly
the model a calibration wrote, without the hardware.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.optimize import least_squares, nnls

from simplace._primitive_costs import xla_flops
from simplace.calibrate.exclusive import EXCLUSIVE_BELOW, exclusive_groups, overlap
from simplace.calibrate.fit import fit_link, fit_segments, predict_segments, rel_errors
from simplace.calibrate.rates import RATE_UNITS, rates_of
from simplace.cost_model import CostModel, Provenance, default_put_waits
from simplace.errors import CalibrationError
from simplace.hardware.timing import Timing


def _last_by(records: Sequence[dict], kind: str, key) -> dict:
    """The last record of ``kind`` per key (a resumed run may repeat a measurement)."""
    out = {}
    for r in records:
        if r["kind"] == kind:
            out[key(r)] = r
    return out


def _device_key(info: Mapping) -> tuple:
    """Devices with the same key are the same hardware (virtual CPU devices of one host,
    identical GPUs) and share one segment fit."""
    return (info["kind"], info.get("device_kind", info["kind"]))


# An op alone that costs this much over an empty call is run on a worker thread (or
# does real work, which on a CPU means the same): the jitter of a tiny call is ~1-2 us,
# the thread's wake-up ~20-55 us on a small VM.
PARALLEL_MIN_EXTRA_S = 10e-6


# An op's time for the rule: this percentile of all its samples, outliers included.
# ``time_fn`` takes samples in rounds of back-to-back runs; the worker thread sleeps
# between rounds and spins within one, so the op pays the wake-up at the start of a
# round only, and its median can miss it: on the 2-core VM (2026-11-23) add
# f32[2,15,15,4] took 26-71 us in 22 of its 50 samples and 5-6 us in the others (median
# 5.5 us), while alone in a segment, timed the same way, it cost 56-60 us every time. A
# run in four paying the wake-up is enough to show here.
PARALLEL_PERCENTILE = 75

# The rule must explain this share of the timed ops, and hold for this share of the
# ops at or above its flops, to be kept (else no segment pays a wake-up).
PARALLEL_MIN_AGREEMENT = 0.8


def _pays_wake_up(rec: Mapping, base_s: float) -> bool:
    samples = Timing.from_dict(rec["timing"]).samples_s
    return float(np.percentile(samples, PARALLEL_PERCENTILE)) - base_s > PARALLEL_MIN_EXTRA_S


# On the 2-core development VM the ops' flops decide whatever their primitive: a
# threshold of 1,008 explains all 578 ops timed alone (bench/cpu_inline_rule.py
# --single-ops).
def parallel_min_flops(op_records: Sequence[dict], base_s: float
                       ) -> tuple[float | None, float]:
    """``(flops, agreement)``: the flops from which a computation runs on a worker thread
    (and pays its wake-up), as the ops timed alone show, and the share of those ops the
    rule explains. Flops as XLA counts them: the traced FLOPs less transcendentals
    (``xla_flops``). XLA:CPU runs a small computation inline in the calling thread and
    hands a larger one to a worker thread (PjRt's CPU client decides by XLA's flop
    count, ``cheap_computation_``: under 1000 runs inline), whatever the op's
    primitive. An op pays when the
    ``PARALLEL_PERCENTILE`` of its samples is ``PARALLEL_MIN_EXTRA_S`` over an empty
    call; the threshold is the split of the ops' flops that agrees with the most of
    them, at the geometric mean of the two flops values around it. None when the split
    explains under ``PARALLEL_MIN_AGREEMENT`` of the ops, or of the ops above it (a
    noisy host), or no op pays."""
    flops = xla_flops([r["primitive"] for r in op_records], [r["flops"] for r in op_records])
    pts = sorted(zip(flops.tolist(), (_pays_wake_up(r, base_s) for r in op_records),
                     strict=True))
    n = len(pts)
    paying = sum(f for _, f in pts)
    if not paying:
        return None, 0.0
    best, best_k = -1, None
    below_free, above_paying = 0, paying
    for k in range(1, n):  # split between pts[k - 1] and pts[k]
        below_free += not pts[k - 1][1]
        above_paying -= pts[k - 1][1]
        if pts[k][0] != pts[k - 1][0] and below_free + above_paying > best:
            best, best_k = below_free + above_paying, k
    if best_k is None:
        return None, 0.0
    agreement = best / n
    above = [f for _, f in pts[best_k:]]
    if agreement < PARALLEL_MIN_AGREEMENT or np.mean(above) < PARALLEL_MIN_AGREEMENT:
        return None, agreement
    lo, hi = pts[best_k - 1][0], pts[best_k][0]
    return (math.sqrt(lo * hi) if lo > 0 else hi), agreement


# Segments whose ops take less than this (beyond an empty call) are left out of the
# op-part error: their op time is within a tiny call's jitter.
OP_PART_MIN_S = 10e-6


def _has_parallel(rec: Mapping, min_flops: float | None) -> bool:
    """Whether a timed segment runs on a worker thread: its ops' flops add up to
    ``min_flops`` (XLA's flops, as the simulators sum them, in op order)."""
    if min_flops is None:
        return False
    return sum(xla_flops(rec["primitive"], rec["flops"]).tolist()) >= min_flops


def fit_device(seg_records: Sequence[dict], base_s,
               parallel_min_flops: float | None = None, *,
               held_out_fraction: float = 0.25, seed: int = 0,
               rates: Mapping[str, float] | None = None):
    """Segment fit and error report for the segments timed on one kind of device.

    ``base_s``: what each segment costs besides its ops (a number, or one per record).
    Segments whose ops' flops add up to ``parallel_min_flops`` (None: none) pay a fitted
    ``parallel_launch_s`` once. A random ``held_out_fraction`` of the segments
    (seeded) is left out of the fit and reports how well it predicts segments it has
    not seen. ``rates``: the device's rates from saturating microbenchmarks, which the
    fit takes as they are (``fit_segments``).
    """
    recs = list(seg_records)
    t = np.array([Timing.from_dict(r["timing"]).median_s for r in recs])
    base_s = np.array(np.broadcast_to(np.asarray(base_s, dtype=np.float64), t.shape))
    par = np.array([_has_parallel(r, parallel_min_flops) for r in recs], dtype=bool)
    rng = np.random.default_rng(seed)
    held = rng.random(len(recs)) < held_out_fraction
    fit_recs = [r for r, h in zip(recs, held, strict=True) if not h]
    fit = fit_segments(fit_recs, t[~held], base_s[~held], parallel=par[~held], rates=rates)
    dev = fit.device(name="probe", kind="cpu", memory_bytes=1.0)
    base = base_s + np.where(par, fit.parallel_launch_s, 0.0)
    pred = predict_segments(dev, recs, base)
    # The op part alone is only a figure where it stands out of the timing noise.
    op_part = t - base
    big = op_part >= OP_PART_MIN_S
    report = {
        "held_out": rel_errors(pred[held], t[held]),
        "held_out_op_part": rel_errors(pred[held & big] - base[held & big],
                                        op_part[held & big]),
        "fitted": rel_errors(pred[~held], t[~held]),
        "classes_fitted": list(fit.classes_fitted),
        "segments_measured": int(len(recs)),
        "ops_in_segments": int(sum(len(r["primitive"]) for r in recs)),
    }
    return fit, report


def build_cost_model(records: Sequence[dict], name: str | None = None, *,
                     step_graphs_of: Mapping[str, Any] | None = None
                     ) -> tuple[CostModel, dict[str, Any]]:
    """The cost model that ``records`` (see ``simplace.calibrate.records``) support, and
    a report of the fits (per device: held-out segment errors; per link: fit error).

    Devices get launch and dispatch costs from their runtime records and in-segment op
    costs fitted to timed segments (shared by devices of the same hardware); links the
    fitted latency and bandwidth (``device_put`` times from the call's return to the
    copy's arrival; older records: blocking times minus the host time of the call) and
    the call's host time; exclusive groups come from the pair overlaps. Where the
    records hold whole steps with their placements (``host`` records of a schema-2
    calibration since issue 13), dispatch and put costs are the calls' host times in
    context and five scales (host, argument, compute, launch, link) are then fitted to
    the steps with the simulator (``simplace.calibrate.steps``), and kept where they
    predict held-out steps better; the steps' graphs
    are traced again from their model names unless ``step_graphs_of`` (``{hash:
    OpGraph}``) gives them. Deterministic: the same records give the same model.
    """
    if not records or records[0]["kind"] != "header":
        raise CalibrationError("Records must start with a header record.")
    head = records[0]
    dev_info = head["devices"]
    names = [d["name"] for d in dev_info]
    if not names:
        raise CalibrationError("The records' header lists no devices.")
    runtime = _last_by(records, "runtime", lambda r: r["device"])
    puts = _last_by(records, "put_host", lambda r: (r["src"], r["dst"]))
    put_waits_recs = _last_by(records, "put_wait", lambda r: (r["src"], r["dst"]))
    segs = [r for r in records if r["kind"] == "segment"]
    links = _last_by(records, "link", lambda r: (r["src"], r["dst"], r["nbytes"]))
    excl = _last_by(records, "exclusive", lambda r: (r["a"], r["b"]))
    chains = _last_by(records, "link_chain", lambda r: (r["a"], r["b"], r["nbytes"]))
    unknown = sorted({r["device"] for r in segs} - set(names))
    if unknown:
        raise CalibrationError(f"Segment records name device {unknown[0]!r}, which is not in "
                               f"the header's devices ({', '.join(names)}).")
    report: dict[str, Any] = {"devices": {}, "links": {}, "exclusive": {}}
    for n in names:
        if n not in runtime:
            raise CalibrationError(f"No launch/dispatch timing for device {n!r}; calibrate "
                                   "it again (or leave it out with --devices).")
    block = {n: Timing.from_dict(runtime[n]["block"]).median_s for n in names}
    host = {n: Timing.from_dict(runtime[n]["host"]).median_s for n in names}

    hosts = [r for r in records if r["kind"] == "host"]
    profiled = [r for r in hosts if "call_host_s" in r and "segment_calls" in r]
    arity_early = _arity_fit(profiled) if profiled else {}
    fits, thresholds = _fit_device_kinds(records, segs, block, host, arity_early, report)

    keys = sorted({_device_key(i) for i in dev_info})
    info_by_name = {i["name"]: i for i in dev_info}
    key_of = [keys.index(_device_key(info_by_name[n])) for n in names]
    dispatch, argument, put_ctx = _host_costs(hosts, profiled, names, keys, key_of, host,
                                              arity_early, report)
    lat, bw, put, missing = _fit_links(links, puts, put_ctx, names, key_of, report)
    if chains:
        lat = context_latency(chains, names, [":".join(keys[k]) for k in key_of], lat, bw,
                              report)
    put_waits = measured_put_waits(put_waits_recs, names, key_of, dev_info, report)
    groups = _exclusive_groups(excl, names, report)

    devices = []
    for n in names:
        info = info_by_name[n]
        devices.append(fits[n].device(
            name=n, kind=info["kind"], memory_bytes=float(info["memory_bytes"]),
            exclusive_group=groups[n], launch_s=max(block[n] - host[n], 0.0),
            dispatch_s=dispatch[n],
            parallel_min_segment_flops=thresholds[_device_key(info)],
            argument_s=argument))

    # Whole steps measured in context: the scales of host, argument, compute and launch
    # costs that make the simulator predict them (``steps.fit_steps``).
    step_recs = [r for r in hosts if "assignment" in r and "graph_hash" in r]
    scales = None
    if step_recs:
        unscaled = CostModel(name=name or head["name"], devices=tuple(devices),
                             latency_s=lat, bandwidth_bytes_per_s=bw, put_s=put,
                             put_waits=put_waits)
        scaled, scales = _fit_whole_steps(unscaled, step_recs, step_graphs_of, head, report)
        devices, put = list(scaled.devices), scaled.put_s
        lat, bw = scaled.latency_s, scaled.bandwidth_bytes_per_s
    report["load_average"] = head.get("load_average")
    report["cpu_count"] = head.get("cpu_count")
    phases = [r for r in records if r["kind"] == "phase"]
    report["wall_s"] = float(sum(r.get("wall_s", 0.0) for r in phases))
    report["links_missing"] = [f"{names[i]}->{names[j]}" for i, j in missing]
    prov = Provenance(source="measured", host=head["host"], date=head["date"],
                      jax_version=head["jax_version"], jaxlib_version=head["jaxlib_version"],
                      notes=_provenance_notes(head, names, bool(profiled), scales, report),
                      meta={"device_kinds": {i["name"]: i.get("device_kind", i["kind"])
                                             for i in dev_info},
                            "settings": head["settings"],
                            "fit_report": _strip_residuals(report)})
    model = CostModel(name=name or head["name"], devices=tuple(devices), latency_s=lat,
                      bandwidth_bytes_per_s=bw, provenance=prov, put_s=put,
                      put_waits=put_waits)
    return model, report


def _fit_device_kinds(records: Sequence[dict], segs: Sequence[dict],
                      block: Mapping[str, float], host: Mapping[str, float],
                      arity_early: Mapping[str, Any], report: dict[str, Any]
                      ) -> tuple[dict[str, Any], dict[tuple, float | None]]:
    """One segment fit per kind of hardware, on every segment timed on such a device:
    ``({device name: SegmentFit}, {device key: parallel_min_segment_flops})``; fills
    ``report["devices"]``. Raises CalibrationError where a kind has no timed segments
    or its fit cannot be written (``rate_problems``)."""
    head = records[0]
    dev_info = head["devices"]
    fits, thresholds = {}, {}
    op_recs = [r for r in records if r["kind"] == "op"]
    for key in sorted({_device_key(i) for i in dev_info}):
        members = [i["name"] for i in dev_info if _device_key(i) == key]
        recs = [r for r in segs if r["device"] in members]
        if not recs:
            raise CalibrationError(f"No timed segments for device(s) {', '.join(members)}; "
                                   "calibrate again without a tight --budget-s.")
        base = float(np.median([block[m] for m in members]))
        # Rates from saturating microbenchmarks, where the records hold them (since
        # issue 32): they pin the peaks that small segments cannot.
        rates = rates_of(records, members) or None
        # Only XLA:CPU runs computations inline or on a worker thread; on an
        # accelerator, ops alone that cost 10 us more than an empty call do real work.
        alone = [r for r in op_recs if r["device"] in members] if key[0] == "cpu" else []
        thresholds[key], agreement = parallel_min_flops(alone, base)
        launch = float(np.median([max(block[m] - host[m], 0.0) for m in members]))
        bases = _segment_bases(recs, launch, base, arity_early)
        tried = []
        for how, seg_base in bases:
            try:
                fit, rep = fit_device(recs, seg_base, thresholds[key],
                                      seed=int(head["settings"].get("seed", 0)),
                                      rates=rates)
                break
            except CalibrationError as err:
                if how == bases[-1][0]:
                    raise
                tried.append(f"{how}: {err}")
        problems = rate_problems(fit, key, int(head.get("cpu_count") or 0))
        if problems:
            raise CalibrationError(f"The calibration of {', '.join(members)} is refused: "
                                   + " ".join(problems))
        rep["rates"] = ({c: {"rate": rates[c], "unit": RATE_UNITS[c]} for c in rates}
                        if rates else "fitted to the segments (no microbenchmarks recorded)")
        rep["segment_base"] = how
        rep["segment_base_refused"] = tried
        rep["parallel_launch_s"] = fit.parallel_launch_s
        rep["parallel_min_segment_flops"] = thresholds[key]
        rep["parallel_rule_agreement"] = agreement
        rep["parallel_rule_ops"] = len(alone)
        for m in members:
            fits[m] = fit
            report["devices"][m] = dict(rep, shared_with=members, base_s=base,
                                        launch_s=max(block[m] - host[m], 0.0),
                                        dispatch_s=host[m])
    return fits, thresholds


def _segment_bases(recs: Sequence[dict], launch: float, base: float,
                   arity_early: Mapping[str, Any]) -> list[tuple[str, np.ndarray]]:
    """What a segment timed alone costs besides its ops, best first, as ``(how, float64[S])``:
    the launch plus its own call's host time (timed), else a tiny call plus the host
    time of its other arguments (the calls' arity fit), else a tiny call."""
    # The call's host time grows with its arguments: not taken out, it is spread over
    # the ops as op costs. A base the segments are hardly slower than (op costs lost in
    # the noise: small models on a busy host) gives way to the next, and says so.
    bases = []
    if all("call_host_s" in r for r in recs):
        bases.append(("own call", np.array([launch + float(r["call_host_s"])
                                            for r in recs])))
    if all("inputs" in r for r in recs) and "per_input_s" in arity_early:
        bases.append(("tiny call + arguments", np.array([
            base + arity_early["per_input_s"] * max(int(r["inputs"]) - 1, 0)
            + arity_early["per_output_s"] * max(int(r["outputs"]) - 1, 0)
            for r in recs])))
    bases.append(("tiny call", np.full(len(recs), base)))
    return bases


def _host_costs(hosts: Sequence[dict], profiled: Sequence[dict], names: Sequence[str],
                keys: Sequence[tuple], key_of: Sequence[int], host: Mapping[str, float],
                arity: Mapping[str, Any], report: dict[str, Any]
                ) -> tuple[dict[str, float], float, dict[tuple[int, int], float]]:
    """Host costs in context: ``({device: dispatch_s}, argument_s, {(kind, kind):
    put_s})``, from the calls timed inside real steps where the records hold them
    (``profiled``), else by splitting the host time of whole steps; a device or pair
    with neither keeps its timing alone (``host``, the ``put_host`` records). Fills
    ``report["host_calls"]`` or ``report["host"]``."""
    dispatch = dict(host)
    argument = 0.0
    put_ctx: dict[tuple[int, int], float] = {}
    if profiled:
        # Each call's host time was taken inside real steps: the mean over every call
        # of a kind is its cost in context (no split of step times needed).
        disp_by, put_by = _calls_in_context(profiled, names, key_of)
        # A call's host time grows with its arguments: the parameters and graph outputs
        # it passes are charged to the ops that read or return them (argument_s), and
        # the typical call (the median: most calls of fragmented steps pass a few
        # activations) is the dispatch cost.
        if "per_input_s" in arity:
            argument = 0.5 * (arity["per_input_s"] + arity["per_output_s"])
        for n, k in zip(names, key_of, strict=True):
            if disp_by.get(k):
                dispatch[n] = float(np.median(disp_by[k]))
        put_ctx = {kk: float(np.mean(v)) for kk, v in put_by.items() if v}
        report["host_calls"] = {
            "segment_calls": int(sum(len(v) for v in disp_by.values())),
            "puts": int(sum(len(v) for v in put_by.values())),
            "dispatch_s": {keys[k][0] + ":" + keys[k][1]: float(np.median(v))
                           for k, v in disp_by.items() if v},
            "put_s": {f"{keys[a][1]}->{keys[b][1]}": float(np.mean(v))
                      for (a, b), v in put_by.items() if v},
            "arity": arity}
    elif len(hosts) >= 2:
        # The host time of whole steps, split over segment calls per kind of device and
        # puts per pair of kinds by robust (soft-L1) non-negative least squares on
        # relative errors: a few steps of one model whose calls cost more (large
        # arguments) must not set the figure for all.
        nk = len(keys)
        rows, y = [], []
        for r in hosts:
            row = np.zeros(nk + nk * nk)
            for i, c in enumerate(r["segments"]):
                row[key_of[i]] += c
            for i, line in enumerate(r["puts"]):
                for j, c in enumerate(line):
                    row[nk + key_of[i] * nk + key_of[j]] += c
            rows.append(row)
            y.append(Timing.from_dict(r["timing"]).median_s)
        a, y = np.array(rows), np.array(y)
        used = np.flatnonzero(a.sum(axis=0) > 0)
        coef = np.zeros(a.shape[1])
        x0 = nnls(a[:, used], y)[0]
        sol = least_squares(lambda c: (a[:, used] @ c) / y - 1.0, np.maximum(x0, 1e-9),
                            bounds=(0.0, np.inf), loss="soft_l1", f_scale=0.1)
        coef[used] = sol.x
        pred = a @ coef
        report["host"] = dict(rel_errors(pred, y), steps=len(y))
        for n, k in zip(names, key_of, strict=True):
            if coef[k] > 0:
                dispatch[n] = float(coef[k])
        for ki in range(nk):
            for kj in range(nk):
                c = coef[nk + ki * nk + kj]
                if c > 0:
                    put_ctx[(ki, kj)] = float(c)
    return dispatch, argument, put_ctx


def _fit_links(links: Mapping[tuple, dict], puts: Mapping[tuple, dict],
               put_ctx: Mapping[tuple[int, int], float], names: Sequence[str],
               key_of: Sequence[int], report: dict[str, Any]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """Links: one robust fit per ordered pair, on the median time of each size:
    ``(latency_s, bandwidth_bytes_per_s, put_s, pairs not fitted)``, each matrix
    float64[D, D]. A pair not fitted takes the median of the fitted ones; none fitted
    raises CalibrationError. Fills ``report["links"]``."""
    d = len(names)
    lat = np.zeros((d, d))
    bw = np.full((d, d), math.inf)
    put = np.zeros((d, d))
    missing = []
    for i, j in itertools.permutations(range(d), 2):
        recs_ij = [(k[2], r) for k, r in links.items() if k[:2] == (names[i], names[j])]
        # Records with the copy's time after the call returned (calibrations since
        # 2026-11-23): that is the latency a step waits for beyond the call's host time
        # (put_s, from context). Older records hold blocking times only: the host time
        # of a ready put, timed early in the run, is taken out of their latency.
        split = bool(recs_ij) and all("after_call" in r for _, r in recs_ij)
        pts = sorted((n, Timing.from_dict(r["after_call" if split else "timing"]).median_s)
                     for n, r in recs_ij)
        key = f"{names[i]}->{names[j]}"
        ph = puts.get((names[i], names[j]))
        put[i, j] = put_ctx.get((key_of[i], key_of[j]),
                                Timing.from_dict(ph["timing"]).median_s if ph else 0.0)
        if len({p[0] for p in pts}) < 3:
            missing.append((i, j))
            report["links"][key] = {"measured": False}
            continue
        try:
            try:
                lf = fit_link([p[0] for p in pts], [p[1] for p in pts])
            except CalibrationError:
                if not split:
                    raise
                # After the call the copies of small sizes (a quick calibration's) may
                # all take the same few microseconds: the blocking times still grow with
                # size, the copy being inside them.
                split = False
                pts = sorted((n, Timing.from_dict(r["timing"]).median_s)
                             for n, r in recs_ij)
                lf = fit_link([p[0] for p in pts], [p[1] for p in pts])
        except CalibrationError as err:
            # Never an absurd figure: this link takes the median of the fitted ones, and
            # the report says which measurement to repeat.
            missing.append((i, j))
            report["links"][key] = {"measured": True, "fitted": False, "error": str(err)}
            continue
        # A blocking device_put from idle costs the call's host time, then the copy.
        ready_put = Timing.from_dict(ph["timing"]).median_s if ph and not split else 0.0
        lat[i, j], bw[i, j] = max(lf.latency_s - ready_put, 0.0), lf.bandwidth_bytes_per_s
        report["links"][key] = {
            "measured": True, "latency_s": lat[i, j], "put_s": put[i, j],
            "timed": "after the call" if split else "blocking, ready put taken out" + (
                " (after the call: not growing with size)" if recs_ij and all(
                    "after_call" in r for _, r in recs_ij) else ""),
            "bandwidth_bytes_per_s": lf.bandwidth_bytes_per_s,
            "median_rel_error": lf.median_abs_rel_error,
            "max_rel_error": float(np.max(np.abs(lf.rel_residuals))),
            "sizes": len(pts),
            "rel_residuals": [float(x) for x in lf.rel_residuals]}
    if missing:
        have = [(i, j) for i, j in itertools.permutations(range(d), 2) if (i, j) not in missing]
        if not have:
            why = "; ".join(f"{k}: {r['error']}" for k, r in report["links"].items()
                            if "error" in r)
            raise CalibrationError("No link could be fitted (each needs 3 sizes or more "
                                   "whose times grow with size); calibrate again on an idle "
                                   "machine, without a tight --budget-s." + (
                                       f" {why}" if why else ""))
        for i, j in missing:
            lat[i, j] = float(np.median([lat[a, b] for a, b in have]))
            bw[i, j] = float(np.median([bw[a, b] for a, b in have]))
            if put[i, j] == 0.0:
                put[i, j] = float(np.median([put[a, b] for a, b in have]))
    return lat, bw, put, missing


def _exclusive_groups(excl: Mapping[tuple, dict], names: Sequence[str],
                      report: dict[str, Any]) -> dict[str, int]:
    """Each device's exclusive group, from the overlaps of its pairs run together
    (``exclusive`` records); fills ``report["exclusive"]``."""
    pairs = {}
    for (a, b), r in sorted(excl.items()):
        ov = overlap(*(Timing.from_dict(r[k]).median_s for k in ("alone_a", "alone_b",
                                                                  "together")))
        pairs[(a, b)] = ov
        report["exclusive"][f"{a}+{b}"] = {"overlap": ov, "exclusive": ov < EXCLUSIVE_BELOW}
    return exclusive_groups(names, pairs)


def _fit_whole_steps(unscaled: CostModel, step_recs: Sequence[dict],
                     step_graphs_of: Mapping[str, Any] | None, head: Mapping,
                     report: dict[str, Any]) -> tuple[CostModel, Any]:
    """``(model with the fitted scales applied, the scales)`` from whole steps measured
    in context (``steps.fit_steps``); fills ``report["steps"]``."""
    from simplace.calibrate.steps import fit_steps, scaled_model, step_graphs

    graphs, graph_notes = step_graphs(step_recs) if step_graphs_of is None else (
        step_graphs_of, [])
    sf = fit_steps(unscaled, step_recs, graphs, seed=int(head["settings"].get("seed", 0)))
    report["steps"] = dict(sf.report, notes=graph_notes)
    return scaled_model(unscaled, sf.scales), sf.scales


def _provenance_notes(head: Mapping, names: Sequence[str], profiled: bool, scales,
                      report: Mapping[str, Any]) -> tuple[str, ...]:
    """The notes of a measured model's provenance: how each figure was measured and
    fitted, and the fit's warnings."""
    dev_info = head["devices"]
    return (
        f"Measured by `simplace calibrate` on {head['host']} ({', '.join(names)}); raw "
        f"records in calibration/{head['name']}/records.jsonl.",
        "launch_s: blocking time of a tiny jitted call minus its host time (dispatch_s, "
        "the host time of a call when calls are only dispatched). "
        "parallel_min_segment_flops: the flops as XLA counts them (transcendentals "
        "apart), summed over a segment's ops, from which ops alone cost over "
        f"{PARALLEL_MIN_EXTRA_S * 1e6:g} us more than a tiny call (XLA:CPU runs them on a "
        "worker thread, which wakes up for them; others inline); "
        "parallel_launch_s: that wake-up, fitted with the segments.",
        "In-segment op costs (peak flops, bandwidth, efficiency and per-op cost per class, "
        "fused_bytes_fraction) fitted by robust least squares on log times of real "
        "segments cut from zoo graphs, each timed alone; devices of the same hardware "
        "share one fit; a random quarter of the segments is held out "
        "(meta.fit_report).",
        "Links: jax.device_put times over sizes from the call's return to the copy's "
        "arrival (latency, bandwidth; older records: blocking times less a ready put's host "
        "time); put_s: host time of one device_put call.",
    ) + ((
        "dispatch_s, put_s: median host time of a segment call, mean of a device_put call, "
        "timed inside real steps of placed zoo graphs (in context); argument_s: host time "
        "per parameter or graph output a call passes (robust fit of call times to their "
        "arity), charged to the ops that read or return them; a segment's base when "
        "timed alone: a tiny call's blocking time plus the host time of its other "
        "arguments.",) if profiled else ()) + ((
        "Then host (dispatch and put), argument, compute (every in-segment op cost), "
        "launch and link (copy latency and bytes over bandwidth) scaled by "
        + ", ".join(f"{k} {v:.3g}" for k, v in scales.items())
        + ", fitted (robust least squares, the simulator as the model) to whole steps of "
        "placements measured in context (meta.fit_report.steps).",)
        if scales and "rejected" not in report["steps"] else ()) + ((
        "Whole steps measured in context were fitted but the fit was not kept: "
        + report["steps"]["rejected"] + " (meta.fit_report.steps).",)
        if scales and "rejected" in report["steps"] else ()) + ((
        "Memory of each CPU device: the host's memory divided by its CPU devices "
        "(virtual devices share it).",) if any(i["kind"] == "cpu" for i in dev_info)
         else ()) + tuple(f"Warning: {w}" for w in report.get("warnings", []))


# No CPU core computes faster than this (fp32; a 2026 server core with two 512-bit FMA
# units at 4 GHz does ~0.26 TFLOP/s): a fit beyond it has not pinned the compute rate.
CPU_CORE_FLOPS_MAX = 1e12


# A chain is device-bound (its copies on the devices' path, not hidden behind the
# host's calls) when it takes at least this many times the host's time to dispatch it.
CHAIN_MIN_HOST_RATIO = 1.5
# A factor beyond this (chained copies many times slower than copies from idle) is
# refused as a measurement gone wrong.
CHAIN_MAX_FACTOR = 10.0


def measured_put_waits(recs: Mapping[tuple, dict], names: Sequence[str],
                       key_of: Sequence[int], dev_info: Sequence[Mapping],
                       report: dict) -> np.ndarray:
    """``CostModel.put_waits`` from ``put_wait`` records (``links.probe_put_wait``): each
    probed pair sets every link between devices of the same two kinds of hardware; the
    others, and pairs the probe could not tell, keep the default (links between devices
    of different kinds). ``report["put_waits"]`` says what each probe found (when one
    ran)."""
    idx = {n: i for i, n in enumerate(names)}
    out = default_put_waits([i["kind"] for i in dev_info])
    found: dict[tuple[int, int], bool] = {}
    probes = {}
    for (a, b), r in sorted(recs.items()):
        if a not in idx or b not in idx:
            continue
        probes[f"{a}->{b}"] = {k: r.get(k) for k in ("waits", "call_s", "dispatch_s",
                                                    "compute_s")}
        if r.get("waits") is not None:
            found[(key_of[idx[a]], key_of[idx[b]])] = bool(r["waits"])
    for i, j in itertools.permutations(range(len(names)), 2):
        out[i, j] = found.get((key_of[i], key_of[j]), out[i, j])
    if probes:  # (records from before the probe: nothing measured, nothing said)
        report["put_waits"] = {"probes": probes, "waiting_links": [
            f"{names[i]}->{names[j]}" for i, j in zip(*np.nonzero(out), strict=True)]}
    return out


# On the 2-core development VM a chained copy of 256 bytes cost 0-3 us per hop, against
# 30-79 us timed alone.
def context_latency(chains: Mapping[tuple, dict], names: Sequence[str],
                    kind_of: Sequence[str], lat: np.ndarray, bw: np.ndarray,
                    report: dict) -> np.ndarray:
    """Link latencies as a running step sees them, from ``link_chain`` records.

    A copy timed alone (``link`` records) waits for the receiving side to wake up; in a
    chain of segments that alternate between two devices it costs
    ``(chain - (alone_a + alone_b) / 2) / hops`` per hop, which can be far less than a
    copy timed alone. Each device-bound pair gives the factor
    that makes the model's mean copy of its smallest chained size (latency plus bytes
    over bandwidth, both directions) cost what the chain measured; the latencies of
    every pair of the same kinds of device are scaled by the median factor of those
    pairs (at least 0), as devices of the same hardware share their segment fit: one
    pair's difference of two totals is noisy, the median of several is not. The
    asymmetry of copies timed alone is kept, and so are their bandwidths; the report
    checks the model against the larger chained sizes. A factor above
    ``CHAIN_MAX_FACTOR`` is refused with a warning (latencies as timed alone). Returns
    the new latency matrix; ``report["link_context"]`` says what was done."""
    idx = {n: i for i, n in enumerate(names)}
    by_pair: dict[tuple[str, str], list[dict]] = {}
    for (a, b, _), r in sorted(chains.items()):
        if a in idx and b in idx and a != b:
            by_pair.setdefault((a, b), []).append(r)
    pairs: dict[str, Any] = {}
    factors: dict[tuple, list[float]] = {}
    used_rows: dict[tuple[str, str], list] = {}
    for (a, b), recs in by_pair.items():
        i, j = idx[a], idx[b]
        rows = []
        for r in recs:
            t = {k: Timing.from_dict(r[k]).median_s
                 for k in ("alone_a", "alone_b", "chain", "chain_host")}
            per_hop = (t["chain"] - 0.5 * (t["alone_a"] + t["alone_b"])) / int(r["hops"])
            rows.append((float(r["nbytes"]), per_hop,
                         t["chain"] >= CHAIN_MIN_HOST_RATIO * t["chain_host"]))
        entry: dict[str, Any] = {"per_hop_s": {str(int(n)): h for n, h, _ in rows}}
        used = [row for row in rows if row[2]]
        pairs[f"{a}<->{b}"] = entry
        mean_lat = 0.5 * (lat[i, j] + lat[j, i])
        if not used or mean_lat <= 0:
            entry["used"] = False
            entry["why"] = ("no latency to scale" if used else
                            "host-bound: the chain took less than "
                            f"{CHAIN_MIN_HOST_RATIO}x the host's time to dispatch it")
            continue
        n0, h0, _ = min(used)
        f = (h0 - 0.5 * (n0 / bw[i, j] + n0 / bw[j, i])) / mean_lat
        entry.update(used=True, factor=f)
        factors.setdefault(tuple(sorted((kind_of[i], kind_of[j]))), []).append(f)
        used_rows[(a, b)] = used
    median = {k: max(float(np.median(v)), 0.0) for k, v in factors.items()}
    refused = {}
    for k, f in list(median.items()):
        if f > CHAIN_MAX_FACTOR:
            # Copies in a chain costing many times a copy from idle means the chains
            # measured something else (a device that was not idle between segments?):
            # never written silently; the copies timed alone stay.
            refused["+".join(k)] = (
                f"chained copies cost {f:.1f}x the latency of copies timed alone (more than "
                f"{CHAIN_MAX_FACTOR:g}x): not used; calibrate again on an idle machine "
                "(--overwrite) to time the chains again")
            del median[k]
    if refused:
        report.setdefault("warnings", []).extend(refused.values())
    new = lat.copy()
    scaled = []
    for i, j in itertools.permutations(range(len(names)), 2):
        k = tuple(sorted((kind_of[i], kind_of[j])))
        if k in median:
            new[i, j] = lat[i, j] * median[k]
            scaled.append(f"{names[i]}->{names[j]}")
    for (a, b), used in used_rows.items():
        i, j = idx[a], idx[b]
        # How the model (context latency, bandwidth of copies alone) predicts each
        # chained size of the pair: relative error against the per-hop time measured.
        pairs[f"{a}<->{b}"]["model_rel_error"] = {
            str(int(n)): (0.5 * (new[i, j] + new[j, i] + n / bw[i, j] + n / bw[j, i]) - h)
            / abs(h) if h else None for n, h, _ in used}
    report["link_context"] = {
        "pairs": pairs, "scaled": scaled, "refused": refused,
        "factor": {"+".join(k): v for k, v in median.items()},
        "latency_alone_s": float(np.median(lat[lat > 0])) if (lat > 0).any() else 0.0,
        "latency_in_context_s": float(np.median(new[lat > 0])) if (lat > 0).any() else 0.0}
    return new


def rate_problems(fit, key: tuple[str, str], cpu_count: int) -> list[str]:
    """Why a segment fit cannot be written, with what to measure again: a parameter the
    segments could not pin (it ran to its bound: a rate, an efficiency at its floor, a
    per-op cost at its ceiling), and a CPU compute rate no CPU of ``cpu_count`` cores
    has. Empty when nothing is wrong."""
    out = []
    what = f"{key[0]} devices ({key[1]})"
    remedy = ("measure the device's rates with saturating microbenchmarks (`simplace "
              "calibrate --resume --name NAME` adds them to a calibration that has none; "
              "then it refits), on an idle machine")
    for rate in fit.unpinned:
        if rate.endswith("per-op cost"):  # rates pinned, the segments still off
            out.append(f"the segment fit ran the {what}' {rate} to its 1 ms ceiling: the "
                       "segments were timed under load or do not match their ops; "
                       "calibrate again on an idle machine (--overwrite).")
            continue
        out.append(f"the timed segments do not pin the {what}' {rate} (the fit ran to its "
                   "bound: their times are per-op and launch costs, and ops of real size "
                   f"would be mispredicted by orders of magnitude); {remedy}.")
    if key[0] == "cpu" and cpu_count >= 1 and "peak compute rate" not in fit.unpinned:
        best = fit.peak_flops_per_s * max(fit.efficiency.values(), default=1.0)
        most = CPU_CORE_FLOPS_MAX * cpu_count
        if best > most:
            out.append(f"the segment fit gives the {what} {best / 1e12:.3g} TFLOP/s, beyond "
                       f"what {cpu_count} CPU core(s) can do ({most / 1e12:g} TFLOP/s at "
                       f"most): the timed segments do not pin the compute rate; {remedy}.")
    return out


def _strip_residuals(report: dict) -> dict:
    """The report without per-point residuals (they stay in the records)."""
    out = dict(report)
    out["links"] = {k: {f: v for f, v in r.items() if f != "rel_residuals"}
                    for k, r in report["links"].items()}
    return out


def _calls_in_context(profiled: Sequence[dict], names: Sequence[str], key_of: Sequence[int]):
    """``({device kind: [host s per segment call]}, {(kind, kind): [host s per put]})``
    over every call of ``profiled`` host records (each call's median over its steps)."""
    disp: dict[int, list[float]] = {}
    puts: dict[tuple[int, int], list[float]] = {}
    for r in profiled:
        for call, t in zip(r["segment_calls"], r["call_host_s"], strict=True):
            disp.setdefault(key_of[int(call[0])], []).append(float(t))
        for (a, b), t in zip(r.get("put_links", []), r.get("put_host_s", []), strict=True):
            if a < 0:  # a batched put from several devices: no single link
                continue
            puts.setdefault((key_of[int(a)], key_of[int(b)]), []).append(float(t))
    return disp, puts


def _arity_fit(profiled: Sequence[dict]) -> dict[str, Any]:
    """How a segment call's host time grows with its arguments: ``host_s ~ base_s +
    per_input_s * inputs + per_output_s * outputs`` by robust least squares over every
    profiled call (the simulator charges one ``dispatch_s`` per segment whatever its
    arity: this says how much that costs)."""
    rows, y = [], []
    for r in profiled:
        for call, t in zip(r["segment_calls"], r["call_host_s"], strict=True):
            rows.append([1.0, float(call[3]), float(call[4])])
            y.append(float(t))
    if len(y) < 8:
        return {"calls": len(y)}
    a, y = np.array(rows), np.array(y)
    x0 = np.linalg.lstsq(a, y, rcond=None)[0]
    sol = least_squares(lambda c: (a @ c) / y - 1.0, np.maximum(x0, 1e-9),
                        bounds=(0.0, np.inf), loss="soft_l1", f_scale=0.1)
    return {"calls": len(y), "base_s": float(sol.x[0]), "per_input_s": float(sol.x[1]),
            "per_output_s": float(sol.x[2]),
            "inputs_max": int(a[:, 1].max()), "outputs_max": int(a[:, 2].max())}

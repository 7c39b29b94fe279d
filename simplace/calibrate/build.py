"""From calibration records to a cost model: the fits, the held-out errors, the file.

Everything here reads records only, so ``simplace calibrate --refit`` rebuilds exactly
the model a calibration wrote, without the hardware.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from simplace.calibrate.exclusive import EXCLUSIVE_BELOW, exclusive_groups, overlap
from simplace.calibrate.fit import fit_link, fit_roofline
from simplace.calibrate.harness import Timing
from simplace.cost_model import CostModel, Device, Provenance
from simplace.errors import CalibrationError


def _rel_errors(pred: np.ndarray, meas: np.ndarray) -> dict[str, Any]:
    if len(meas) == 0:
        return {"n": 0, "median_rel_error": None, "p90_rel_error": None}
    err = np.abs(pred / meas - 1.0)
    return {"n": int(len(meas)), "median_rel_error": float(np.median(err)),
            "p90_rel_error": float(np.percentile(err, 90))}


def _last_by(records: Sequence[dict], kind: str, key) -> dict:
    """The last record of ``kind`` per key (a resumed run may repeat a measurement)."""
    out = {}
    for r in records:
        if r["kind"] == kind:
            out[key(r)] = r
    return out


def fit_device(op_records: Sequence[dict]):
    """Roofline fit and error report for one device's op records.

    The roofline is fitted on the microbenchmarks only: a designed sweep of sizes per
    class. The model signatures are all held out (the fit never sees them) and report
    how well it predicts ops it has not timed. Fitting on them too was tried: hundreds of
    tiny ops outvote a dozen large ones and, since XLA:CPU switches to a thread pool above
    a size threshold (a ~30 us step no roofline has), bend the rates the roofline exists
    to predict for large, unmeasured ops.
    """
    recs = list(op_records)
    med = np.array([Timing.from_dict(r["timing"]).median_s for r in recs])
    f = np.array([r["flops"] for r in recs], dtype=np.float64)
    b = np.array([r["bytes_accessed"] for r in recs], dtype=np.float64)
    cls = [r["op_class"] for r in recs]
    ok = med > 0
    micro = np.array([r["set"] == "micro" for r in recs], dtype=bool) & ok
    held = np.array([r["set"] == "model" for r in recs], dtype=bool) & ok
    if micro.sum() < 4:
        raise CalibrationError(f"Device {recs[0]['device'] if recs else '?'} has only "
                               f"{int(micro.sum())} timed microbenchmarks to fit a roofline "
                               "on (4 needed); calibrate again without a tight --budget-s.")
    fit = fit_roofline(f[micro], b[micro], [c for c, k in zip(cls, micro, strict=True) if k],
                       med[micro])
    pred = fit.predict(f, b, cls)
    report = {
        "held_out": _rel_errors(pred[held], med[held]),
        "micro": _rel_errors(pred[micro], med[micro]),
        "classes_fitted": list(fit.classes_fitted),
        "ops_measured": int(len(recs)),
    }
    return fit, report


def build_cost_model(records: Sequence[dict], name: str | None = None
                     ) -> tuple[CostModel, dict[str, Any]]:
    """The cost model that ``records`` (see ``simplace.calibrate.records``) support, and
    a report of the fits (per device: held-out op errors; per link: fit error).

    Devices get the fitted roofline and every measured op time; links the fitted
    latency and bandwidth (a link with no records takes the median of the others);
    exclusive groups come from the pair overlaps. Deterministic: the same records give
    the same model.
    """
    if not records or records[0]["kind"] != "header":
        raise CalibrationError("Records must start with a header record.")
    head = records[0]
    dev_info = head["devices"]
    names = [d["name"] for d in dev_info]
    if not names:
        raise CalibrationError("The records' header lists no devices.")
    ops = _last_by(records, "op", lambda r: (r["device"], r["signature"]))
    links = _last_by(records, "link", lambda r: (r["src"], r["dst"], r["nbytes"]))
    excl = _last_by(records, "exclusive", lambda r: (r["a"], r["b"]))
    unknown = sorted({k[0] for k in ops} - set(names))
    if unknown:
        raise CalibrationError(f"Op records name device {unknown[0]!r}, which is not in the "
                               f"header's devices ({', '.join(names)}).")

    report: dict[str, Any] = {"devices": {}, "links": {}, "exclusive": {}}
    fits = {}
    for n in names:
        recs = [r for (dev, _), r in sorted(ops.items()) if dev == n]
        if not recs:
            raise CalibrationError(f"No op timings for device {n!r}; calibrate it (or "
                                   "leave it out with --devices).")
        fits[n], report["devices"][n] = fit_device(recs)

    # Links: one robust fit per ordered pair, on the median time of each size.
    d = len(names)
    lat = np.zeros((d, d))
    bw = np.full((d, d), math.inf)
    missing = []
    for i, j in itertools.permutations(range(d), 2):
        pts = sorted((k[2], Timing.from_dict(r["timing"]).median_s)
                     for k, r in links.items() if k[:2] == (names[i], names[j]))
        key = f"{names[i]}->{names[j]}"
        if len({p[0] for p in pts}) < 2:
            missing.append((i, j))
            report["links"][key] = {"measured": False}
            continue
        lf = fit_link([p[0] for p in pts], [p[1] for p in pts])
        lat[i, j], bw[i, j] = lf.latency_s, lf.bandwidth_bytes_per_s
        report["links"][key] = {
            "measured": True, "latency_s": lf.latency_s,
            "bandwidth_bytes_per_s": lf.bandwidth_bytes_per_s,
            "median_rel_error": lf.median_abs_rel_error,
            "max_rel_error": float(np.max(np.abs(lf.rel_residuals))),
            "sizes": len(pts),
            "rel_residuals": [float(x) for x in lf.rel_residuals]}
    if missing:
        have = [(i, j) for i, j in itertools.permutations(range(d), 2) if (i, j) not in missing]
        if not have:
            raise CalibrationError("No link was timed at 2 sizes or more, so no link can be "
                                   "fitted; calibrate links (a larger --budget-s).")
        for i, j in missing:
            lat[i, j] = float(np.median([lat[a, b] for a, b in have]))
            bw[i, j] = float(np.median([bw[a, b] for a, b in have]))

    pairs = {}
    for (a, b), r in sorted(excl.items()):
        ov = overlap(*(Timing.from_dict(r[k]).median_s for k in ("alone_a", "alone_b",
                                                                  "together")))
        pairs[(a, b)] = ov
        report["exclusive"][f"{a}+{b}"] = {"overlap": ov, "exclusive": ov < EXCLUSIVE_BELOW}
    groups = exclusive_groups(names, pairs)

    devices = []
    for info in dev_info:
        n = info["name"]
        fit = fits[n]
        table = {sig: Timing.from_dict(r["timing"]).median_s
                 for (dev, sig), r in sorted(ops.items()) if dev == n}
        devices.append(Device(
            name=n, kind=info["kind"], memory_bytes=float(info["memory_bytes"]),
            peak_flops_per_s=fit.peak_flops_per_s,
            memory_bandwidth_bytes_per_s=fit.memory_bandwidth_bytes_per_s,
            overhead_s=fit.overhead_s, efficiency=dict(fit.efficiency),
            class_overhead_s=dict(fit.class_overhead_s),
            exclusive_group=groups[n], op_times_s=table))

    phases = [r for r in records if r["kind"] == "phase"]
    report["wall_s"] = float(sum(r.get("wall_s", 0.0) for r in phases))
    report["links_missing"] = [f"{names[i]}->{names[j]}" for i, j in missing]
    notes = (
        f"Measured by `simplace calibrate` on {head['host']} ({', '.join(names)}); raw "
        f"records in calibration/{head['name']}/records.jsonl.",
        "Roofline (launch overhead and efficiency per op class, peak flops, bandwidth) "
        "fitted by robust least squares on log times of microbenchmarks; peaks are the "
        "best rates seen (the most efficient class has efficiency 1). Model signatures are "
        "held out of the fit; its error on them is in meta.fit_report.",
        "op_times_s: median single-op times (a jitted op alone, inputs on the device), "
        "dispatch included.",
    ) + (("Memory of each CPU device: the host's memory divided by its CPU devices "
          "(virtual devices share it).",) if any(i["kind"] == "cpu" for i in dev_info)
         else ())
    prov = Provenance(source="measured", host=head["host"], date=head["date"],
                      jax_version=head["jax_version"], jaxlib_version=head["jaxlib_version"],
                      notes=notes,
                      meta={"device_kinds": {i["name"]: i.get("device_kind", i["kind"])
                                             for i in dev_info},
                            "settings": head["settings"],
                            "fit_report": _strip_residuals(report)})
    model = CostModel(name=name or head["name"], devices=tuple(devices), latency_s=lat,
                      bandwidth_bytes_per_s=bw, provenance=prov)
    return model, report


def _strip_residuals(report: dict) -> dict:
    """The report without per-point residuals (they stay in the records)."""
    out = dict(report)
    out["links"] = {k: {f: v for f, v in r.items() if f != "rel_residuals"}
                    for k, r in report["links"].items()}
    return out

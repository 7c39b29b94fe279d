"""What the calibration alone predicts for the H200 host's real-size steps, offline.

    PYTHONPATH=. python bench/h200_offline.py [--measurements DIR] [--vm-records FILE]
        [--out bench/results/h200_offline_DATE.txt]

The H200 records of 2026-11-27 hold small segments, launches, dispatch and links, and
no saturating microbenchmark (they predate them). Its physical limits stand in for
them: every GPU compute class at TF32's dense peak (JAX's default f32 matmul precision
on Hopper; 495 TFLOP/s), every GPU memory class at HBM3e's 4.8 TB/s. The host's CPU
has no published figure here: its rates are this machine's microbenchmarks scaled per
core to the host's 16 cores (the committed ``cpu_vm2core_x4`` calibration's rate records,
a 2-core VM; a stand-in, labelled as such). The records are refitted
with those rates pinned (``simplace.calibrate.build``: the segment fit then finds only
per-op costs, fusion and the wake-up) and the 8 validated real-size steps are
predicted, raw. The fit without rates is shown as the old code saw it.

The steps were traced there with JAX 0.11.2; here JAX traces the same models into a
few more ops (resnet50 3,889 against 3,783), so a placement is mapped by relative
position in graph order: a single device is exact; metis's runs keep their relative
boundaries; m_etf's two CPU ops are placed as the pair near their position whose copies
move the recorded bytes. The simulated copies are printed beside the recorded ones.
"""

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

import numpy as np  # noqa: E402

import simplace  # noqa: E402
from simplace import zoo  # noqa: E402
from simplace.calibrate.build import build_cost_model  # noqa: E402
from simplace.calibrate.rates import RATE_CLASSES, RATE_UNITS, rate_record  # noqa: E402
from simplace.calibrate.records import read_records  # noqa: E402
from simplace.errors import CalibrationError  # noqa: E402

H200_TF32_FLOPS = 495e12
H200_HBM_BYTES_PER_S = 4.8e12
HOST_CORES = 16


def gpu_rates() -> dict[str, float]:
    """The H200's datasheet limits as per-class rates."""
    return {c: H200_TF32_FLOPS if RATE_UNITS[c] == "flop" else H200_HBM_BYTES_PER_S
            for c in RATE_CLASSES}


def vm_cpu_rates(records_path: Path) -> tuple[dict[str, float], int]:
    """The committed VM calibration's CPU rates (its rate records) and its core count."""
    from simplace.calibrate.rates import rates_of

    records = read_records(records_path)
    head = records[0]
    rates = rates_of(records, [d["name"] for d in head["devices"]])
    if set(rates) != set(RATE_CLASSES):
        raise SystemExit(f"{records_path} has no rate record for "
                         f"{sorted(set(RATE_CLASSES) - set(rates))}: calibrate it again.")
    return rates, int(head.get("cpu_count") or 1)


def with_rates(records: list[dict], rates_by_device: dict[str, dict[str, float]],
               why: str) -> list[dict]:
    """``records`` plus one stand-in rate record per device and class."""
    out = list(records)
    for dev, rates in rates_by_device.items():
        for c, r in rates.items():
            out.append(rate_record(dev, c, {"rate": r, "saturated": False, "why": why,
                                            "points": []}))
    return out


def mapped_assignment(graph, rec: dict, inputs) -> np.ndarray:
    """The recorded placement on this machine's trace of the same model (see the
    module docstring)."""
    from simplace.sim.reference import simulate

    rec_a = np.asarray(rec["assignment"])
    m, m_rec = graph.num_ops, len(rec_a)
    if m == m_rec:
        return rec_a
    if len(np.unique(rec_a)) == 1:
        return np.full(m, rec_a[0])
    pos = np.minimum((np.arange(m) * m_rec) // m, m_rec - 1)
    a = rec_a[pos]
    minority = np.flatnonzero(rec_a != np.bincount(rec_a).argmax())
    if len(minority) <= 4:  # a few ops moved: find where they move the recorded bytes
        major = int(np.bincount(rec_a).argmax())
        centre = int(minority[0]) * m // m_rec
        best = None
        for shift in range(0, 200):
            for i in (centre + shift, centre - shift):
                if i < 0 or i + len(minority) > m:
                    continue
                b = np.full(m, major)
                b[i:i + len(minority)] = rec_a[minority]
                moved = simulate(graph, inputs, b).bytes_moved
                if abs(moved - rec["sim_bytes_moved"]) <= 0.01 * rec["sim_bytes_moved"]:
                    best = b
                    break
            if best is not None:
                break
        if best is not None:
            return best
    return _fit_boundaries(graph, a, rec["sim_bytes_moved"], inputs)


def _fit_boundaries(graph, a: np.ndarray, target_bytes: float, inputs,
                    window: int = 80, passes: int = 2) -> np.ndarray:
    """Shift each run boundary of ``a`` within ``window`` ops (keeping the runs in
    order) so that the placement's copies move about ``target_bytes``: the recorded
    placement's cuts, found again in a trace a few ops longer."""
    from simplace.sim.reference import simulate

    cuts = list(np.flatnonzero(np.diff(a)) + 1)
    devs = [int(a[0])] + [int(a[c]) for c in cuts]

    def build(cs):
        b = np.empty(len(a), dtype=a.dtype)
        edges = [0, *cs, len(a)]
        for k, d in enumerate(devs):
            b[edges[k]:edges[k + 1]] = d
        return b

    def miss(cs):
        return abs(simulate(graph, inputs, build(cs)).bytes_moved - target_bytes)

    best = miss(cuts)
    for _ in range(passes):
        for k in range(len(cuts)):
            lo = (cuts[k - 1] + 1) if k else 1
            hi = (cuts[k + 1] - 1) if k + 1 < len(cuts) else len(a) - 1
            for c in range(max(lo, cuts[k] - window), min(hi, cuts[k] + window) + 1):
                trial = cuts[:k] + [c] + cuts[k + 1:]
                e = miss(trial)
                if e < best:
                    best, cuts = e, trial
    return build(cuts)


def predict(records_path: Path, validation_path: Path, cpu_rates: dict[str, float],
            log) -> list[dict]:
    """Refit, predict every validation step; one row per step."""
    from simplace.sim.reference import simulate

    records = read_records(records_path)
    head = records[0]
    names = {d["name"]: d for d in head["devices"]}
    why = "stand-in: datasheet limits (GPU), this VM's rates per core x 16 (CPU)"
    models = {}
    try:
        build_cost_model(records, "h200_x1_old_fit")
        models["without rates"] = None
    except CalibrationError as err:
        log(f"refit without rates (the records as they are): refused: {str(err)[:300]}...")
    pinned = with_rates(records, {"gpu:0": gpu_rates(), "cpu:0": cpu_rates}, why)
    cm, report = build_cost_model(pinned, "h200_x1_rates")
    models["rates pinned"] = cm
    log("refit with rates pinned:")
    log(cm.summary())
    for dev, rep in report["devices"].items():
        ho = rep["held_out"]
        log(f"  {dev}: held-out small segments median error {ho['median_rel_error']:.1%} "
            f"(p90 {ho['p90_rel_error']:.1%}, n={ho['n']})")
    assert set(names) == set(cm.device_names)
    rows = []
    graphs = {}
    for line in validation_path.read_text().splitlines():
        rec = json.loads(line)
        spec = rec["model_spec"]
        key = (spec["model"], spec["training"], spec["batch"])
        if key not in graphs:
            fn, args = zoo.get(spec["model"], training=spec["training"], batch=spec["batch"])
            graphs[key] = simplace.trace(fn, *args, name=f"{spec['model']}/train")
        g = graphs[key]
        inp = cm.subset([cm.index(n) for n in rec["device_names"]])
        a = mapped_assignment(g, rec, inp)
        res = simulate(g, inp, a)
        row = {"label": rec["label"], "method": rec["method"], "ops_there": len(rec["assignment"]),
               "ops_here": g.num_ops, "measured_s": rec["measured_step_time_s"],
               "old_predicted_s": rec["raw_predicted_step_time_s"],
               "predicted_s": res.step_time_s, "bytes_moved_there": rec["sim_bytes_moved"],
               "bytes_moved_here": res.bytes_moved}
        row["ratio"] = row["predicted_s"] / row["measured_s"]
        row["old_ratio"] = row["old_predicted_s"] / row["measured_s"]
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measurements", default=str(
        Path(__file__).resolve().parents[2] / "shared" / "measurements" / "h200_2026-11-27"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--vm-records", default=str(
        Path(__file__).resolve().parents[1] / "calibration" / "cpu_vm2core_x4" / "records.jsonl"),
                    help="the calibration whose CPU rates, per core, stand in for the host's")
    args = ap.parse_args(argv)
    meas = Path(args.measurements)
    lines: list[str] = []

    def log(s=""):
        print(s, flush=True)
        lines.append(s)

    load = os.getloadavg()
    log(f"# bench/h200_offline.py, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{platform.node()}, {os.cpu_count()} cores, load {load[0]:.2f}")
    here, cores = vm_cpu_rates(Path(args.vm_records))
    per_core = {c: r / cores for c, r in here.items()}
    host = {c: r * HOST_CORES if RATE_UNITS[c] == "flop" else r * HOST_CORES / 2
            for c, r in per_core.items()}
    log(f"the VM calibration's CPU rates ({args.vm_records}, {cores} cores): " + ", ".join(
        f"{c} {r:.3g} {RATE_UNITS[c]}/s" for c, r in here.items()))
    log("H200 host CPU stand-in (compute x16 cores, memory x8: half the cores' share of "
        "a socket's channels): " + ", ".join(f"{c} {r:.3g}" for c, r in host.items()))
    rows = predict(meas / "h200_x1_records.jsonl", meas / "h200_x1_validation.jsonl", host, log)
    log()
    log(f"{'step':<20} {'method':<12} {'ops there/here':>15} {'measured':>10} "
        f"{'old pred':>10} {'old x':>7} {'new pred':>10} {'new x':>7} "
        f"{'copies there/here (MB)':>24}")
    for r in rows:
        log(f"{r['label']:<20} {r['method']:<12} {r['ops_there']:>7}/{r['ops_here']:<7} "
            f"{r['measured_s'] * 1e3:>8.2f}ms {r['old_predicted_s'] * 1e3:>8.1f}ms "
            f"{r['old_ratio']:>6.1f}x {r['predicted_s'] * 1e3:>8.2f}ms {r['ratio']:>6.2f}x "
            f"{r['bytes_moved_there'] / 1e6:>11.2f}/{r['bytes_moved_here'] / 1e6:<11.2f}")
    within = sum(0.5 <= r["ratio"] <= 2.0 for r in rows)
    log(f"\nwithin 2x of the measured step: {within} of {len(rows)} (old fit: "
        f"{sum(0.5 <= r['old_ratio'] <= 2.0 for r in rows)} of {len(rows)}); "
        f"ratios {min(r['ratio'] for r in rows):.2f}x-{max(r['ratio'] for r in rows):.2f}x")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

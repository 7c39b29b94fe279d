"""How well a calibration fits: error of the in-segment op costs on held-out segments
(whole segment times, and their op part), link fit error, the host-step split and
calibration wall time, per device.

    python bench/calibration.py [--name cpu_vm2core_x4]          # from committed records
    python bench/calibration.py --run [--quick] [--cpu-devices 4] [--models a,b]

Without ``--run`` the fits are redone from ``calibration/NAME/records.jsonl`` (no
hardware touched). With ``--run`` a fresh calibration is measured first, into a
temporary directory (the committed files are not touched). Prints a table and writes it
as JSON and text to ``bench/results/calibration_DATE_NAME.{json,txt}`` (``--no-save``:
don't). Targets (issues 4 and 13): held-out median <= 10%, p90 <= 25%; link fit error
<= 5%.
Quote figures with the machine they ran on and whether other work shared its cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

OP_TARGET = 0.10
OP_P90_TARGET = 0.25
LINK_TARGET = 0.05
RESULTS = Path(__file__).resolve().parent / "results"


def _pct(x):
    return "     -" if x is None else f"{100 * x:5.1f}%"


def table(report: dict) -> tuple[str, dict]:
    rows = [f"{'device':<8} {'segments':>8} {'held-out':>8} {'median':>7} {'p90':>7} "
            f"{'op part med':>11} {'p90':>7} {'links out: median fit err (max)':>32}"]
    summary = {"devices": {}}
    for name, r in report["devices"].items():
        h, o = r["held_out"], r["held_out_op_part"]
        outs = [v for k, v in report["links"].items()
                if k.startswith(name + "->") and v.get("measured") and not v.get("error")]
        link_med = float(np.median([v["median_rel_error"] for v in outs])) if outs else None
        link_max = max(v["max_rel_error"] for v in outs) if outs else None
        rows.append(f"{name:<8} {r['segments_measured']:>8} {h['n']:>8} "
                    f"{_pct(h['median_rel_error']):>7} {_pct(h['p90_rel_error']):>7} "
                    f"{_pct(o['median_rel_error']):>11} {_pct(o['p90_rel_error']):>7} "
                    f"{_pct(link_med):>24} ({_pct(link_max)})")
        summary["devices"][name] = {"segments_measured": r["segments_measured"],
                                    "held_out": h, "held_out_op_part": o,
                                    "link_median_rel_error": link_med,
                                    "link_max_rel_error": link_max}
    def med(key, field):
        xs = [r[key][field] for r in report["devices"].values()
              if r[key][field] is not None]
        return float(np.median(xs)) if xs else None
    op_err, op_p90 = med("held_out", "median_rel_error"), med("held_out", "p90_rel_error")
    med_links = [v["median_rel_error"] for v in report["links"].values()
                 if v.get("measured") and not v.get("error")]
    link_err = float(np.median(med_links)) if med_links else None
    host = report.get("host")
    rows.append("")
    def verdict(x, target):
        return "ok" if x is not None and x <= target else "MISSED"
    rows.append(f"held-out segment error, median over devices: {_pct(op_err)} "
                f"(target <= {100 * OP_TARGET:.0f}%: {verdict(op_err, OP_TARGET)}), p90 "
                f"{_pct(op_p90)} (target <= {100 * OP_P90_TARGET:.0f}%: "
                f"{verdict(op_p90, OP_P90_TARGET)})")
    rows.append(f"link fit error, median over links:           {_pct(link_err)} "
                f"(target <= {100 * LINK_TARGET:.0f}%: {verdict(link_err, LINK_TARGET)})")
    if host:
        rows.append(f"host steps (dispatch and put split), error:  median "
                    f"{_pct(host['median_rel_error'])}, p90 {_pct(host['p90_rel_error'])} "
                    f"over {host['steps']} steps")
    calls = report.get("host_calls")
    if calls:
        ar = calls["arity"]
        rows.append(f"host calls in context: {calls['segment_calls']} segment calls, "
                    f"{calls['puts']} device_puts; dispatch "
                    + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in calls["dispatch_s"].items())
                    + "; put " + ", ".join(f"{k} {v * 1e6:.1f} us"
                                          for k, v in calls["put_s"].items())
                    + (f"; a call: {ar['base_s'] * 1e6:.1f} us + {ar['per_input_s'] * 1e6:.2f} "
                       f"us/input + {ar['per_output_s'] * 1e6:.2f} us/output"
                       if "base_s" in ar else ""))
    steps = report.get("steps")
    if steps:
        rows.append(f"whole steps in context ({steps['steps']} steps, {steps['graphs']} "
                    "graphs), step-time error: before the step fit median "
                    f"{_pct(steps['before']['median_rel_error'])}, p90 "
                    f"{_pct(steps['before']['p90_rel_error'])}; fitted median "
                    f"{_pct(steps['fitted']['median_rel_error'])}, p90 "
                    f"{_pct(steps['fitted']['p90_rel_error'])}; held out "
                    f"(n={steps['held_out']['n']}) median "
                    f"{_pct(steps['held_out']['median_rel_error'])}, p90 "
                    f"{_pct(steps['held_out']['p90_rel_error'])}")
        rows.append("  scales: " + ", ".join(f"{k} {v:.3g}" for k, v in steps["scales"].items())
                    + "".join(f"; {k} not pinned" for k in steps.get("not_pinned", {})))
    rows.append(f"calibration wall time: {report['wall_s']:.1f} s")
    summary.update(op_median_rel_error=op_err, op_p90_rel_error=op_p90,
                   link_median_rel_error=link_err, host=host, wall_s=report["wall_s"],
                   host_calls=calls, steps=steps)
    return "\n".join(rows), summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", default="cpu_vm2core_x4")
    p.add_argument("--run", action="store_true", help="measure a fresh calibration first")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--cpu-devices", type=int, default=4)
    p.add_argument("--models", default=None)
    p.add_argument("--budget-s", type=float, default=None)
    p.add_argument("--records-dir", default=None,
                   help="refit the records of this calibration/ folder (default: the user "
                        "directory's, else the checkout's)")
    p.add_argument("--tag", default="",
                   help="appended to the date in the results' file names (2026-11-23c)")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)

    if args.run:
        from simplace.calibrate.cli import _set_cpu_devices

        _set_cpu_devices(args.cpu_devices)
    from simplace.calibrate import calibrate, refit
    from simplace.paths import find_records

    if args.run:
        tmp = Path(tempfile.mkdtemp(prefix="simplace_bench_cal_"))
        models = args.models.split(",") if args.models else None
        model, report = calibrate(args.name, models=models, quick=args.quick,
                                  budget_s=args.budget_s, records_dir=tmp,
                                  cost_model_dir=tmp)
        source = f"fresh calibration ({'quick' if args.quick else 'full'}) in {tmp}"
    else:
        tmp = Path(tempfile.mkdtemp(prefix="simplace_bench_refit_"))
        # The records are found as `calibrate --refit` finds them (user dir, checkout).
        model, report = refit(args.name, records_dir=args.records_dir, cost_model_dir=tmp)
        source = f"refit of {find_records(args.name, 'records.jsonl', args.records_dir)}"
    text, summary = table(report)
    head = (f"calibration bench: {args.name} ({source})\n"
            f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.2f} at the end; devices "
            f"{', '.join(model.device_names)}; measured {model.provenance.date}\n")
    print(head + text)
    if not args.no_save:
        RESULTS.mkdir(exist_ok=True)
        stem = f"calibration_{datetime.date.today().isoformat()}{args.tag}_{args.name}"
        summary.update(name=args.name, source=source, host=platform.node(),
                       cpu_count=os.cpu_count(), load_average_end=os.getloadavg()[0],
                       measured=model.provenance.date, python=sys.version.split()[0])
        (RESULTS / f"{stem}.json").write_text(json.dumps(summary, indent=1) + "\n")
        (RESULTS / f"{stem}.txt").write_text(head + text + "\n")
        print(f"wrote {RESULTS / stem}.json and .txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())

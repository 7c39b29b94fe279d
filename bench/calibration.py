"""How well a calibration fits: op-time error of the roofline on held-out signatures,
link fit error and calibration wall time, per device.

    python bench/calibration.py [--name cpu_vm2core_x4]          # from committed records
    python bench/calibration.py --run [--quick] [--cpu-devices 4] [--models a,b]

Without ``--run`` the fits are redone from ``calibration/NAME/records.jsonl`` (no
hardware touched). With ``--run`` a fresh calibration is measured first, into a
temporary directory (the committed files are not touched). Prints a table and writes it
as JSON and text to ``bench/results/calibration_DATE_NAME.{json,txt}`` (``--no-save``:
don't). Targets (issue 4): median held-out op error <= 10%, link fit error <= 5%.
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
LINK_TARGET = 0.05
RESULTS = Path(__file__).resolve().parent / "results"


def _pct(x):
    return "     -" if x is None else f"{100 * x:5.1f}%"


def table(report: dict) -> tuple[str, dict]:
    rows = [f"{'device':<8} {'ops':>5} {'held-out':>8} {'median':>7} {'p90':>7} "
            f"{'micro med':>9} {'links out: median fit err (max)':>32}"]
    summary = {"devices": {}}
    for name, r in report["devices"].items():
        h = r["held_out"]
        outs = [v for k, v in report["links"].items()
                if k.startswith(name + "->") and v.get("measured")]
        link_med = float(np.median([v["median_rel_error"] for v in outs])) if outs else None
        link_max = max(v["max_rel_error"] for v in outs) if outs else None
        rows.append(f"{name:<8} {r['ops_measured']:>5} {h['n']:>8} "
                    f"{_pct(h['median_rel_error']):>7} {_pct(h['p90_rel_error']):>7} "
                    f"{_pct(r['micro']['median_rel_error']):>9} "
                    f"{_pct(link_med):>24} ({_pct(link_max)})")
        summary["devices"][name] = {"ops_measured": r["ops_measured"], "held_out": h,
                                    "micro": r["micro"],
                                    "link_median_rel_error": link_med,
                                    "link_max_rel_error": link_max}
    med_ops = [r["held_out"]["median_rel_error"] for r in report["devices"].values()
               if r["held_out"]["median_rel_error"] is not None]
    med_links = [v["median_rel_error"] for v in report["links"].values() if v.get("measured")]
    op_err = float(np.median(med_ops)) if med_ops else None
    link_err = float(np.median(med_links)) if med_links else None
    rows.append("")
    def verdict(x, target):
        return "ok" if x is not None and x <= target else "MISSED"
    rows.append(f"held-out op error, median over devices: {_pct(op_err)} "
                f"(target <= {100 * OP_TARGET:.0f}%: {verdict(op_err, OP_TARGET)})")
    rows.append(f"link fit error, median over links:      {_pct(link_err)} "
                f"(target <= {100 * LINK_TARGET:.0f}%: {verdict(link_err, LINK_TARGET)})")
    rows.append(f"calibration wall time: {report['wall_s']:.1f} s")
    summary.update(op_median_rel_error=op_err, link_median_rel_error=link_err,
                   wall_s=report["wall_s"])
    return "\n".join(rows), summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", default="cpu_vm2core_x4")
    p.add_argument("--run", action="store_true", help="measure a fresh calibration first")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--cpu-devices", type=int, default=4)
    p.add_argument("--models", default=None)
    p.add_argument("--budget-s", type=float, default=None)
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)

    if args.run:
        from simplace.calibrate.cli import _set_cpu_devices

        _set_cpu_devices(args.cpu_devices)
    from simplace.calibrate import calibrate, refit
    from simplace.calibrate.core import paths

    if args.run:
        tmp = Path(tempfile.mkdtemp(prefix="simplace_bench_cal_"))
        models = args.models.split(",") if args.models else None
        model, report = calibrate(args.name, models=models, quick=args.quick,
                                  budget_s=args.budget_s, records_dir=tmp,
                                  cost_model_dir=tmp)
        source = f"fresh calibration ({'quick' if args.quick else 'full'}) in {tmp}"
    else:
        tmp = Path(tempfile.mkdtemp(prefix="simplace_bench_refit_"))
        model, report = refit(args.name, records_dir=paths(args.name)[0].parents[1],
                              cost_model_dir=tmp)
        source = f"refit of {paths(args.name)[0]}"
    text, summary = table(report)
    head = (f"calibration bench: {args.name} ({source})\n"
            f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.2f} at the end; devices "
            f"{', '.join(model.device_names)}; measured {model.provenance.date}\n")
    print(head + text)
    if not args.no_save:
        RESULTS.mkdir(exist_ok=True)
        stem = f"calibration_{datetime.date.today().isoformat()}_{args.name}"
        summary.update(name=args.name, source=source, host=platform.node(),
                       cpu_count=os.cpu_count(), load_average_end=os.getloadavg()[0],
                       measured=model.provenance.date, python=sys.version.split()[0])
        (RESULTS / f"{stem}.json").write_text(json.dumps(summary, indent=1) + "\n")
        (RESULTS / f"{stem}.txt").write_text(head + text + "\n")
        print(f"wrote {RESULTS / stem}.json and .txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Re-predict the placements of saved fidelity runs with a cost model, without hardware.

    python bench/fidelity_rescore.py --cost-model cpu_vm2core_x4 \
        bench/results/fidelity_2026-11-23c_vm.json bench/results/fidelity_2026-11-23d_vm.json

Each file is a ``bench/fidelity.py`` result: its records hold every placement it ran and
what it measured. The placements are simulated again with the cost model's raw figures
(no drift corrections) and scored against those measurements: MAPE and Kendall tau per
model and over all records of each file. It says how a change to the cost model or to
calibration would have predicted measurements already taken, on the same placements
(a fresh ``bench/fidelity.py`` run measures the machine as it is now, and this VM's
host costs move by 2x within an hour). The graphs are traced again here: a file whose
graphs trace differently (another simplace or JAX) is refused.
"""

import argparse
import datetime
import json
import os
import sys
import warnings

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import numpy as np  # noqa: E402

import simplace  # noqa: E402
from simplace import zoo  # noqa: E402
from simplace.sim import simulate  # noqa: E402
from simplace.validate import kendall_tau, mape, raw_model  # noqa: E402


def _graphs(records) -> dict:
    """``{hash: OpGraph}`` of the records' graphs, traced as bench/fidelity.py traces them
    (zoo name before the first '/', small, training)."""
    out = {}
    for name in sorted({r["graph_name"].split("/")[0] for r in records}):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # trace notes do not matter here
            fn, args = zoo.get(name, small=True, abstract=True, training=True)
            g = simplace.trace(fn, *args, name=f"{name}/train/small")
        out[g.hash] = g
    return out


def _drift_lines(recs, graphs, cm, name: str, lines: list) -> dict:
    """Held-out MAPE raw, corrected on all models, corrected per model (bench/fidelity.py's
    split and fits); appends one line to ``lines``."""
    from fidelity import per_model_correction, per_model_line

    from simplace.validate import fit_drift, split_records

    fit, held = split_records(recs, 0.5, seed=0)
    pooled = fit_drift(fit, graphs, cm, held_out=held, note="bench/fidelity_rescore.py")
    pm = per_model_correction(fit, held, graphs, cm)
    out = {"held_out_raw": pooled.held_out["mape_raw"],
           "held_out_corrected": pooled.held_out["mape_corrected"],
           "held_out_corrected_per_model": pm}
    lines.append(f"{name:<34} held out: raw {100 * out['held_out_raw']:.1f}%, corrected on "
                 f"all models {100 * out['held_out_corrected']:.1f}%; " + per_model_line(pm))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="bench/fidelity.py JSON files")
    ap.add_argument("--cost-model", default="cpu_vm2core_x4")
    ap.add_argument("--drift", action="store_true",
                    help="also the held-out MAPE after drift correction, as bench/fidelity.py "
                         "splits the records (seed 0): fitted on all models together, and "
                         "per model (as `simplace validate` corrects the model it optimizes)")
    ap.add_argument("--note", default="", help="a remark for the table")
    ap.add_argument("--out", help="write the table to this .txt (and .json beside it)")
    args = ap.parse_args()
    cm = raw_model(simplace.CostModel.load(args.cost_model))
    lines = [f"cost model {args.cost_model} (raw, {cm.provenance.date or 'undated'}) on the "
             "placements and measurements of saved bench/fidelity.py runs"
             + (f"; {args.note}" if args.note else ""),
             f"{'file':<34} {'model':<10} {'n':>3} {'MAPE':>7} {'tau':>6}   "
             f"{'MAPE then':>9} (the model the run used)"]
    out = {"cost_model": args.cost_model, "files": {}}
    for path in args.results:
        with open(path) as f:
            recs = json.load(f)["records"]
        graphs = _graphs(recs)
        missing = {r["graph_hash"] for r in recs} - set(graphs)
        if missing:
            sys.exit(f"{path}: {len(missing)} graph(s) trace differently here (another "
                     "simplace or JAX version): its placements cannot be simulated again.")
        pred = np.array([simulate(graphs[r["graph_hash"]], cm,
                                  np.asarray(r["assignment"])).step_time_s for r in recs])
        meas = np.array([r["measured_step_time_s"] for r in recs])
        then = np.array([r["raw_predicted_step_time_s"] for r in recs])
        model_of = np.array([r["graph_name"].split("/")[0] for r in recs])
        rows = {}
        for name in [*sorted(set(model_of)), "all"]:
            k = np.ones(len(recs), bool) if name == "all" else model_of == name
            rows[name] = {"n": int(k.sum()), "mape": float(mape(pred[k], meas[k])),
                          "tau": float(kendall_tau(pred[k], meas[k])),
                          "mape_then": float(mape(then[k], meas[k]))}
            lines.append(f"{os.path.basename(path):<34} {name:<10} {k.sum():>3} "
                         f"{100 * rows[name]['mape']:>6.1f}% {rows[name]['tau']:>6.2f}   "
                         f"{100 * rows[name]['mape_then']:>8.1f}%")
        out["files"][path] = rows
        if args.drift:
            rows["drift"] = _drift_lines(recs, graphs, cm, os.path.basename(path), lines)
    lines.append(f"command: python bench/fidelity_rescore.py --cost-model {args.cost_model} "
                 + ("--drift " if args.drift else "")
                 + " ".join(args.results) + f"  ({datetime.date.today()})")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

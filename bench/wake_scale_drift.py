"""Would a drift correction of the worker-thread wake-up help? An offline what-if.

On this VM a segment that the pool rule charges pays the wake-up in one hour and mostly
not in another (``bench/pool_wake_segments.py``). This scales the committed model's
``parallel_launch_s`` by s in {1, 0.75, 0.5, 0.25, 0}, fits the usual drift corrections on
top (``bench/fidelity.py``'s split: half the records fitted, half held out; all models
at once, and per model), and picks s by the fitted half's error, as a drift parameter
would be fitted.

    python bench/wake_scale_drift.py [--out bench/results/wake_scale_drift_DATE_vm.txt]
        RESULTS.json...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import warnings

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

from fidelity import per_model_correction  # noqa: E402
from fidelity_rescore import _graphs  # noqa: E402
from report import Transcript, machine_line  # noqa: E402

from simplace.cost_model import CostModel  # noqa: E402
from simplace.validate import fit_drift, raw_model, split_records  # noqa: E402

SCALES = (1.0, 0.75, 0.5, 0.25, 0.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="bench/fidelity.py JSON files")
    ap.add_argument("--cost-model", default="cpu_vm2core_x4")
    ap.add_argument("--out", help="write the table here (.txt)")
    args = ap.parse_args(argv)
    base = raw_model(CostModel.load(args.cost_model))
    out = Transcript()
    out.say(f"wake-up scale what-if; {machine_line()}; cost model {args.cost_model}")
    out.say("per run and scale s: held-out MAPE raw, corrected on all models (fitted half "
            "in brackets), corrected per model")
    for path in args.results:
        with open(path) as f:
            recs = json.load(f)["records"]
        graphs = _graphs(recs)
        fit, held = split_records(recs, 0.5, seed=0)
        best = at_one = None
        cells = []
        for s in SCALES:
            cm = dataclasses.replace(base, devices=tuple(
                dataclasses.replace(d, parallel_launch_s=d.parallel_launch_s * s)
                for d in base.devices))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = fit_drift(fit, graphs, cm, held_out=held, note="bench/wake_scale_drift.py")
                pm = per_model_correction(fit, held, graphs, cm)
            cells.append(f"s {s:g}: {100 * res.held_out['mape_raw']:.1f} / "
                         f"{100 * res.held_out['mape_corrected']:.1f} "
                         f"({100 * res.fit['mape_corrected']:.1f}) / {100 * pm['mape']:.1f}")
            row = (res.fit["mape_corrected"], s, res.held_out["mape_corrected"], pm["mape"])
            at_one = at_one or row  # s = 1, the model as calibrated
            if best is None or row[0] < best[0]:
                best = row
        out.say(f"{os.path.basename(path)}: " + "; ".join(cells))
        out.say(f"  s chosen on the fitted half: {best[1]:g}: corrected on all models "
                f"{100 * best[2]:.1f}%, per model {100 * best[3]:.1f}% (at s 1: "
                f"{100 * at_one[2]:.1f}%, {100 * at_one[3]:.1f}%)")
    out.finish(__file__, argv, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a placed step costs the host beyond its calls: freeing the arrays it created.

``PlacedFunction.run`` (what ``simplace.apply`` runs) keeps every segment output and
every copy of a step in a list, and drops them when the step returns: each is a JAX
array, and freeing it costs host time that the simulator does not charge. This replays
the step loop of saved ``bench/fidelity.py`` placements by hand and times its three
parts: dispatching the calls and ``device_put``s (the loop), waiting for the results,
and dropping the arrays, next to the step time the fidelity run measured.

    python bench/step_free_cost.py [--results bench/results/fidelity_2026-11-24d_vm.json]
        [--models mlp,tiny_cnn,rnnlm] [--labels random-ops#4,random-runs#5,single:0]
        [--out bench/results/step_free_cost_DATE_vm.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import numpy as np  # noqa: E402
from report import Transcript, machine_line  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def time_parts(placed, placed_args, steps: int = 15) -> dict:
    """Median seconds of the step's dispatch (``PlacedFunction.run``, keeping the
    values), the wait after it and the drop of the step's arrays, and how many arrays
    were dropped (every value the step made: segment outputs and copies)."""
    import jax

    clock = time.perf_counter
    given = sum(v is not None for v in placed_args.slots)
    parts = []
    for _ in range(steps):
        t0 = clock()
        out, vals = placed.run(placed_args, keep_values=True)
        t1 = clock()
        jax.block_until_ready([v for v in vals if v is not None])
        t2 = clock()
        n_vals = sum(v is not None for v in vals) - given
        del out, vals
        t3 = clock()
        parts.append((t1 - t0, t2 - t1, t3 - t2))
    loop, wait, drop = np.median(np.array(parts), axis=0)
    return {"loop_s": float(loop), "wait_s": float(wait), "drop_s": float(drop),
            "arrays": int(n_vals)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(REPO / "bench" / "results"
                                             / "fidelity_2026-11-24d_vm.json"))
    ap.add_argument("--models", default="mlp,tiny_cnn,rnnlm")
    ap.add_argument("--labels", default="random-ops#4,random-runs#5,single:0")
    ap.add_argument("--out", help="write the table here (.txt)")
    args = ap.parse_args(argv)
    import jax

    import simplace
    from simplace import zoo
    from simplace.validate.executor import prepare, resolve_devices

    with open(args.results) as f:
        recs = [r for r in json.load(f)["records"] if not r["corrected"]]
    cm = simplace.CostModel.load(recs[0]["cost_model"])
    devs = resolve_devices(cm.device_names)
    out = Transcript()
    out.say(machine_line() + f"; placements of {Path(args.results).name}")
    out.say(f"{'model':<9} {'placement':<14} {'arrays':>6} {'loop us':>9} {'wait us':>8} "
            f"{'drop us':>8} {'us/array':>8} {'measured us':>11}")
    for model in args.models.split(","):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # trace notes do not matter here
            fn, fargs = zoo.get(model, small=True, abstract=False, training=True)
            prog = prepare(fn, fargs)
        for label in args.labels.split(","):
            rec = next((r for r in recs if r["graph_name"].startswith(model + "/")
                        and r["label"] == label), None)
            if rec is None:
                continue
            placed = prog.place(np.asarray(rec["assignment"]), devices=devs)
            pa = placed.place_args(*fargs)
            for _ in range(5):
                jax.block_until_ready(placed.run(pa))
            p = time_parts(placed, pa)
            per = p["drop_s"] / p["arrays"] if p["arrays"] else float("nan")
            out.say(f"{model:<9} {label:<14} {p['arrays']:>6} {1e6 * p['loop_s']:>9.1f} "
                    f"{1e6 * p['wait_s']:>8.1f} {1e6 * p['drop_s']:>8.1f} "
                    f"{1e6 * per:>8.2f} {1e6 * rec['measured_step_time_s']:>11.1f}")
    out.finish(__file__, argv, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

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
import datetime
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def time_parts(placed, placed_args, steps: int = 15) -> dict:
    """Median seconds of the step loop's dispatch, the wait after it and the drop of
    the step's arrays, and how many arrays were dropped."""
    import jax

    clock = time.perf_counter
    parts = []
    n_vals = 0
    for _ in range(steps):
        t0 = clock()
        vals = list(placed_args.slots)
        for st in placed.steps:
            if st[0] == "call":
                _, fn, ins, outs = st
                res = fn(*[vals[i] for i in ins])
                for k, v in zip(outs, res, strict=True):
                    vals[k] = v
            else:
                _, src, dst, dev = st
                moved = jax.device_put([vals[i] for i in src], dev)
                for k, v in zip(dst, moved, strict=True):
                    vals[k] = v
        t1 = clock()
        jax.block_until_ready([v for v in vals if v is not None])
        t2 = clock()
        n_vals = sum(v is not None for v in vals) - sum(
            v is not None for v in placed_args.slots)
        del vals
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
    lines = [f"step parts on {platform.node()} ({os.cpu_count()} cores), "
             f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, load "
             f"{os.getloadavg()[0]:.2f}; placements of {Path(args.results).name}",
             f"{'model':<9} {'placement':<14} {'arrays':>6} {'loop us':>9} {'wait us':>8} "
             f"{'drop us':>8} {'us/array':>8} {'measured us':>11}"]
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
            lines.append(f"{model:<9} {label:<14} {p['arrays']:>6} {1e6 * p['loop_s']:>9.1f} "
                         f"{1e6 * p['wait_s']:>8.1f} {1e6 * p['drop_s']:>8.1f} "
                         f"{1e6 * per:>8.2f} {1e6 * rec['measured_step_time_s']:>11.1f}")
    lines.append("command: python bench/step_free_cost.py "
                 + " ".join(argv if argv is not None else sys.argv[1:]))
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

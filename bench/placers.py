"""Placement quality and speed: every method on zoo models and datasheet machines.

    python bench/placers.py [--models nmt_2layer,rnnlm,...] [--machines haswell_k40x2,...]
                            [--budget-s 30] [--small] [--out placers.json]

For each (model, machine) it prints the table of `simplace optimize --method all`: step
time, speedup over `single`, gap to the lower bound, peak memory / OOM, wall time of the
method. Wall times are for the machine it runs on: quote it with the figures.
"""

import argparse
import json
import platform
import time

import simplace
from simplace import zoo
from simplace.cli import results_table
from simplace.placers import compare
from simplace.sim import lower_bound

DEFAULT_MODELS = "nmt_2layer,nmt_4layer,rnnlm,resnet50,inception_v3,transformer"
DEFAULT_MACHINES = "haswell_k40x2,haswell_k40x4,cpu_h100x4_nvlink"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--machines", default=DEFAULT_MACHINES)
    ap.add_argument("--methods", default=None, help="comma-separated (default: all)")
    ap.add_argument("--budget-s", type=float, default=30.0, help="budget of `local`")
    ap.add_argument("--small", action="store_true", help="tiny model sizes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write all rows as JSON")
    args = ap.parse_args()

    print(f"machine: {platform.node()} {platform.machine()}, {time.strftime('%Y-%m-%d')}")
    rows = []
    for model in args.models.split(","):
        fn, ex = zoo.get(model, training=True, small=args.small)
        graph = simplace.trace(fn, *ex, name=model)
        for machine in args.machines.split(","):
            cm = simplace.CostModel.load(machine)
            bound_s = lower_bound(graph, cm)
            methods = args.methods.split(",") if args.methods else None
            results = compare(graph, cm, methods, seed=args.seed, budget_s=args.budget_s)
            print(f"\n{model} (train, {graph.num_ops:,} ops) on {machine}:")
            print(results_table(results, bound_s))
            for r in results:
                rows.append({"model": model, "ops": graph.num_ops, "machine": machine,
                             "method": r.method, "step_time_s": r.step_time_s,
                             "oom": r.oom, "wall_s": r.wall_s,
                             "lower_bound_s": bound_s})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

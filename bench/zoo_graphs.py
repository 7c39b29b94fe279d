"""Op graphs of the model zoo at default sizes: ops, edges, GFLOPs, parameters, trace time.

    python bench/zoo_graphs.py [--small] [--models a,b] [--out zoo_graphs.json]

Tracing is abstract (jax.ShapeDtypeStruct arguments), so default sizes need no memory.
Each trace runs in a fresh JAX cache-free state only once per model and mode; times are
wall-clock seconds on the machine it runs on (quote it with the figures).
"""

import argparse
import json
import platform
import time

import simplace
from simplace import zoo


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="the tiny test sizes")
    ap.add_argument("--models", default=",".join(zoo.names()))
    ap.add_argument("--out", help="write the rows as JSON")
    args = ap.parse_args()

    rows = []
    header = (f"{'model':<14} {'mode':<9} {'ops':>7} {'edges':>7} {'GFLOP':>9} "
              f"{'params MiB':>10} {'trace s':>8}")
    print(f"machine: {platform.node()} {platform.processor() or platform.machine()}")
    print(header)
    print("-" * len(header))
    for name in args.models.split(","):
        for training in (True, False):
            fn, ex = zoo.get(name, training=training, small=args.small)
            t0 = time.perf_counter()
            g = simplace.trace(fn, *ex, name=name)
            trace_s = time.perf_counter() - t0
            row = {"model": name, "mode": "train" if training else "inference",
                   "ops": g.num_ops, "edges": g.num_edges, "gflops": g.flops.sum() / 1e9,
                   "param_bytes": float(g.param_sizes.sum()), "trace_s": trace_s}
            rows.append(row)
            print(f"{name:<14} {row['mode']:<9} {g.num_ops:>7,} {g.num_edges:>7,} "
                  f"{row['gflops']:>9.1f} {row['param_bytes'] / 2**20:>10.1f} "
                  f"{trace_s:>8.2f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

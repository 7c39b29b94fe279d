"""Where simulated annealing (``local``) ends, by the starts it is given.

    python bench/local_starts.py [--model rnnlm] [--machine cpu_h100x4_nvlink]
        [--evaluations 30000] [--seeds 4] [--out bench/results/local_starts.txt]

``local`` anneals from the best of its starts. This runs it with a fixed number of
evaluations (deterministic for a seed, whatever the machine's load) from several sets of
starts, for several seeds, and prints the step time it ends at: ``single`` and
``expert`` (what ``compare`` gave it before the list schedulers were passed on), every
fast heuristic (what it gets now), and each start alone (with ``single``, which
``local`` always adds).
"""

import argparse
import os
import platform
import time

import numpy as np
from report import FAST_HEURISTICS

import simplace
from simplace.models import load_graph
from simplace.placers import optimize


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="rnnlm")
    ap.add_argument("--machine", default="cpu_h100x4_nvlink")
    ap.add_argument("--evaluations", type=int, default=30_000)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()

    graph = load_graph(args.model)
    cm = simplace.CostModel.load(args.machine)
    found = {m: optimize(graph, cm, m) for m in FAST_HEURISTICS}
    lines = [f"machine: {platform.node()}, {os.cpu_count()} cores, "
             f"{time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}",
             f"{args.model} x {args.machine}: local with {args.evaluations:,} evaluations, "
             f"seeds 0-{args.seeds - 1}",
             "starts: " + ", ".join(f"{m} {found[m].step_time_s * 1e3:.2f} ms"
                                   for m in FAST_HEURISTICS)]
    sets = [("single+expert", ("single", "expert")), ("all fast heuristics", FAST_HEURISTICS)]
    sets += [(f"{m} (+single)", (m,)) for m in FAST_HEURISTICS if m != "single"]
    for name, starts in sets:
        times = [optimize(graph, cm, "local", seed=seed, max_evaluations=args.evaluations,
                          starts=[found[m].placement for m in starts]).step_time_s * 1e3
                 for seed in range(args.seeds)]
        lines.append(f"  {name:<22} mean {np.mean(times):9.3f} ms   " +
                     " ".join(f"{t:.2f}" for t in times))
        print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    print("\n".join(lines[:3]))


if __name__ == "__main__":
    main()

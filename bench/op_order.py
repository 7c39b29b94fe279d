"""Would running a placement's ops in another order pay? Segments against step time.

    python bench/op_order.py [--models rnnlm,nmt_2layer] [--machine cpu_h100x4_nvlink]
        [--evaluations 30000] [--out bench/results/op_order.txt]

``simplace.apply`` runs a placement's ops in graph order, so a device's run of ops is
cut wherever the trace interleaves another device's ops (the H100 rows of
``bench/placers.py`` pay hundreds of segment calls on the host). This takes the
placement ``local`` finds (a fixed number of evaluations: deterministic) and re-orders
its ops topologically, staying on the current device while it has a ready op whose
graph index is at most ``W`` past the lowest ready op anywhere (``W = 0``: graph
order; ``W`` unbounded: drain each device before switching), then simulates the
re-ordered graph with the reference simulator: segments, host time and step time.
Nothing here changes what the executor or the simulators do.
"""

import argparse
import heapq
import os
import platform
import time

import numpy as np

from simplace.cost_model import CostModel
from simplace.graph import OpGraph
from simplace.models import load_graph
from simplace.placers import optimize
from simplace.sim import simulate

WINDOWS = (0, 8, 32, 128, 512, 2048, None)


def windowed_order(graph: OpGraph, placement: np.ndarray, window: int | None) -> np.ndarray:
    """int[M]: a topological order that stays on one device while it has a ready op
    within ``window`` graph positions of the lowest ready op (None: no limit)."""
    m = graph.num_ops
    indeg = np.bincount(graph.dst, minlength=m)
    succ = [[] for _ in range(m)]
    for s, d in zip(graph.src.tolist(), graph.dst.tolist(), strict=True):
        succ[s].append(d)
    ready = [[] for _ in range(int(placement.max()) + 1)]
    for i in np.flatnonzero(indeg == 0).tolist():
        heapq.heappush(ready[placement[i]], i)
    order, cur = [], None
    while len(order) < m:
        lowest = min((r[0], d) for d, r in enumerate(ready) if r)
        if cur is None or not ready[cur] or (
                window is not None and ready[cur][0] - lowest[0] > window):
            cur = lowest[1]
        i = heapq.heappop(ready[cur])
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready[placement[j]], j)
    return np.asarray(order)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="rnnlm,nmt_2layer")
    ap.add_argument("--machine", default="cpu_h100x4_nvlink")
    ap.add_argument("--evaluations", type=int, default=30_000)
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    cm = CostModel.load(args.machine)
    lines = [f"machine: {platform.node()}, {os.cpu_count()} cores, "
             f"{time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}; "
             f"placements: local, {args.evaluations:,} evaluations, seed 0, on {args.machine}",
             f"{'model':<12} {'order':<12} {'step ms':>9} {'segments':>9} {'host ms':>8}"]
    for model in args.models.split(","):
        graph = load_graph(model)
        p = optimize(graph, cm, "local", seed=0, max_evaluations=args.evaluations).placement
        for w in WINDOWS:
            order = windowed_order(graph, p, w)
            r = simulate(graph.reordered(order), cm, p[order])
            name = "graph" if w == 0 else ("drain" if w is None else f"W={w}")
            lines.append(f"{model:<12} {name:<12} {r.step_time_s * 1e3:9.3f} "
                         f"{r.num_segments:9d} {r.host_s * 1e3:8.3f}")
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

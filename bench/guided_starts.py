"""Which start leads the guided search to the better basin: the policy's or a heuristic's.

    python bench/guided_starts.py --baselines B.JSON [--rows SUBSTR,...] [--seeds 0,1]
                                  [--heuristics m_etf,m_sct] [--search-s 5.7]

Per row (``bench/pretrained.py``'s held-out rows; ``--rows``: those whose label contains
one of the given strings) and seed: the guided search (``simplace.rl.guided.refine``,
the shipped policy's levels, the batched simulator with its memory screen, as
``rl-pretrained`` and ``rl-universal`` run it) for ``--search-s`` seconds from each
start, one at a time: the zero-shot batch's best placement (``rl-pretrained`` without
the resampling) and each heuristic's (run once per row, without a budget, outside the
search's time); then ``guided.race`` over all of them for the same time. Each cell is
the start's step time and where the search ended, over the row's ``local`` step time
from ``--baselines`` (a file ``bench/pretrained.py --baselines`` wrote); the heuristics'
own wall times are printed once per row. A start's step time does not tell its basin:
this measures it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baselines", required=True, metavar="B.JSON")
    ap.add_argument("--rows", default="", help="comma-separated substrings of row labels")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--heuristics", default="m_etf,m_sct")
    ap.add_argument("--search-s", type=float, default=5.7,
                    help="seconds of guided search from each start (and for the race)")
    args = ap.parse_args()
    if args.search_s <= 0:
        ap.error(f"--search-s takes a positive number of seconds, got {args.search_s}")

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pretrained as bench

    from simplace.compile_cache import enable
    from simplace.cost_model import CostModel
    from simplace.placers import optimize
    from simplace.rl import distribution as dist
    from simplace.rl import guided
    from simplace.rl.pretrained import SHIPPED, cached_weights, policy_levels
    from simplace.sim import batched_simulator

    heuristics = bench.method_names(ap, args.heuristics)
    enable()
    with open(args.baselines) as f:
        base = json.load(f)
    for m in (200, 3000):  # the policy's programs compiled before any timing
        g0 = dist.random_dag(m, 0)
        optimize(g0, CostModel.load("haswell_k40x4").price(g0), "rl-pretrained")
    params = cached_weights(os.fspath(SHIPPED))[0]
    want = [w for w in args.rows.split(",") if w]
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"guided search {args.search_s} s from each start; cells: start -> end, over "
          f"local-60; load {os.getloadavg()[0]:.2f}")
    for label, model, mach in bench._rows("all"):
        if want and not any(w in label for w in want):
            continue
        if label not in base:
            print(f"{label}: no baseline in {args.baselines}, skipped")
            continue
        g, inp = bench._problem(model, mach)
        priced = inp.price(g) if hasattr(inp, "price") else inp
        exact = batched_simulator(g, priced, memory="oom")
        fast = batched_simulator(g, priced, memory=False)
        local_s = base[label]["local_s"]

        def scores(batch, exact=exact):
            res = exact(batch)
            return np.where(np.asarray(res.oom), np.inf,
                            np.asarray(res.step_time_s, np.float64))

        def screen(batch, fast=fast):
            return fast(batch).step_time_s

        levels = policy_levels(g, priced, params)
        found, walls = {}, []
        for h in heuristics:
            t0 = time.perf_counter()
            found[h] = np.asarray(optimize(g, inp, h).placement, np.int32)
            walls.append(f"{h} {time.perf_counter() - t0:.2f} s")
        print(f"{label}: heuristics' walls {', '.join(walls)}", flush=True)
        for seed in seeds:
            z = np.asarray(optimize(g, inp, "rl-pretrained", seed=seed,
                                    refine_rounds=0).placement, np.int32)
            starts = [("zero-shot", z)] + list(found.items())
            starts = [(n, p, float(scores(p[None])[0])) for n, p in starts]
            cells = []
            for name, p, s in starts:
                if not np.isfinite(s):
                    cells.append(f"{name} OOM")
                    continue
                gc.collect()
                _, end, _ = guided.refine(levels, p, s, scores, src=g.src, dst=g.dst,
                                          rounds=10**9, seed=seed, screen=screen,
                                          until=time.perf_counter() + args.search_s)
                cells.append(f"{name} {s / local_s:.3f}->{end / local_s:.4f}")
            fit = [st for st in starts if np.isfinite(st[2])]
            gc.collect()
            _, end, info = guided.race(levels, fit, scores, src=g.src, dst=g.dst,
                                       seed=seed, screen=screen,
                                       until=time.perf_counter() + args.search_s)
            cells.append(f"race {end / local_s:.4f} ({info['start']})")
            print(f"  seed {seed}: " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()

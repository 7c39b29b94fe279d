"""Which unit families win the list schedulers' runs, and how late in their order.

    python bench/list_families.py [--methods m_etf,m_sct] [--rows SUBSTR,...]

``m_etf``, ``m_sct`` and ``heft`` run one schedule per unit family (op units, block
counts, module depths, each with and without lookahead, then re-runs over the best
placement's segments) in a fixed order, and with a budget stop at its end, so a family
that wins late is lost to a short budget. Per row (``bench/pretrained.py``'s held-out
rows and ``bench/zero_shot_seeds.py``'s training rows; ``--rows``: those whose label
contains one of the given strings) and method, run without a budget: the wall time, the
number of runs, the winning run's family and its position (1-based) in the order, and
the earliest run whose estimate is within 1% of the winner's, with the wall time spent
up to it (the runs' times are taken as equal: the method reports no per-run time).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="m_etf,m_sct")
    ap.add_argument("--rows", default="", help="comma-separated substrings of row labels")
    args = ap.parse_args()

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pretrained as bench
    import zero_shot_seeds

    from simplace.compile_cache import enable
    from simplace.placers import optimize

    names = bench.method_names(ap, args.methods)
    enable()
    want = [w for w in args.rows.split(",") if w]
    rows = list(bench._rows("all")) + list(zero_shot_seeds.TRAINING_ROWS)
    print(f"load {os.getloadavg()[0]:.2f}")
    for label, model, mach in rows:
        if want and not any(w in label for w in want):
            continue
        g, inp = bench._problem(model, mach)
        for name in names:
            t0 = time.perf_counter()
            r = optimize(g, inp, name)
            wall = time.perf_counter() - t0
            runs = r.info.get("runs", [])
            if not runs:
                print(f"{label[-40:]:40s} {name:6s} {wall:6.2f} s  (no runs reported)")
                continue
            est = [run["estimated_step_s"] for run in runs]
            win = min(range(len(runs)), key=lambda k: (est[k], k))
            near = next(k for k in range(len(runs)) if est[k] <= est[win] * 1.01)
            print(f"{label[-40:]:40s} {name:6s} {wall:6.2f} s  {len(runs):2d} runs  "
                  f"won by #{win + 1} {runs[win]['unit']!r}; within 1% at "
                  f"#{near + 1} {runs[near]['unit']!r} (~{wall * (near + 1) / len(runs):.2f} s)",
                  flush=True)


if __name__ == "__main__":
    main()

"""Which unit families win the list schedulers' runs, and how late in their order.

    python bench/list_families.py [--methods m_etf,m_sct] [--rows SUBSTR,...]
                                  [--budgets 1,2,4] [--dump FILE]

``m_etf``, ``m_sct`` and ``heft`` run one schedule per unit family (op units, block
counts, module depths, each with and without lookahead, and re-runs over the best
placement's segments) in a fixed order (``simplace.placers.list_schedulers``), and with
a budget stop at its end, so a family that wins late is lost to a short budget. Per row
(``bench/pretrained.py``'s held-out rows and ``bench/zero_shot_seeds.py``'s training
rows; ``--rows``: those whose label contains one of the given strings) and method, run
without a budget: the wall time, the number of runs, the winning run's family and its
position (1-based) in the order, and the earliest run whose estimate is within 1% of the
winner's, with the wall time its runs took up to it (``info["runs"]``' ``wall_s``).
``--dump FILE``: every case's runs as JSON (label, method, wall time, and per run its
family, memory model, estimate and time), to
weigh other orders of the families without running them again. ``--budgets``: each
method also runs with these time budgets (seconds), and its step time is printed as a
ratio to the unbudgeted run's, with its wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="m_etf,m_sct")
    ap.add_argument("--rows", default="", help="comma-separated substrings of row labels")
    ap.add_argument("--dump", default=None, help="write every case's runs here (JSON)")
    ap.add_argument("--budgets", default="", help="comma-separated time budgets (s) to run "
                    "each method with as well")
    args = ap.parse_args()

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pretrained as bench
    import zero_shot_seeds

    from simplace.compile_cache import enable
    from simplace.placers import optimize

    names = bench.method_names(ap, args.methods)
    try:
        budgets = [float(b) for b in args.budgets.split(",") if b]
    except ValueError:
        ap.error(f"--budgets takes comma-separated seconds, got {args.budgets!r}")
    enable()
    want = [w for w in args.rows.split(",") if w]
    rows = list(bench._rows("all")) + list(zero_shot_seeds.TRAINING_ROWS)
    print(f"load {os.getloadavg()[0]:.2f}")
    cases = []
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
            spent = sum(run["wall_s"] for run in runs[:near + 1])
            print(f"{label[-40:]:40s} {name:6s} {wall:6.2f} s  {len(runs):2d} runs  "
                  f"won by #{win + 1} {runs[win]['unit']!r}; within 1% at "
                  f"#{near + 1} {runs[near]['unit']!r} ({spent:.2f} s of runs)", flush=True)
            case = {"row": label, "method": name, "wall_s": wall, "runs": runs}
            for b in budgets:
                t0 = time.perf_counter()
                rb = optimize(g, inp, name, budget_s=b)
                case[f"budget {b:g} s"] = [rb.step_time_s / r.step_time_s,
                                           time.perf_counter() - t0]
                print(f"{'':40s} {name:6s} budget {b:g} s: {rb.step_time_s / r.step_time_s:.3f}"
                      f" of the unbudgeted run's step time, {time.perf_counter() - t0:.2f} s",
                      flush=True)
            cases.append(case)
    if args.dump:
        with open(args.dump, "w") as f:
            json.dump({"load": os.getloadavg()[0], "cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()

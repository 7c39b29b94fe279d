"""What ``simplace optimize MODEL --method all --budget-s S`` returns: ``compare`` with
every method but ``exact`` sharing the whole budget (heuristics, list schedulers and
partitioners included), as a user runs it, at a few budgets.

    python bench/compare_budget.py [--rows resnet50:cpu_h100x4_nvlink,...]
                                   [--budgets 10,30] [--seed 0] [--out FILE]

Per row and budget: the best step time and the method that found it, the wall time of
the whole comparison against the budget, and each search's part (``local`` and the
``rl-*`` methods that ran). Run it with ``PYTHONPATH`` set to another checkout to compare
two versions of ``compare``; wall times are this machine's, so quote the load.
"""

import argparse
import time

from report import Transcript, load_average, machine_line, problems

from simplace.placers import best_of, compare, is_search

DEFAULT_ROWS = ("resnet50:cpu_h100x4_nvlink,bert_base:haswell_k40x4,"
                "rnnlm:haswell_k40x4,nmt_2layer:cpu_h100x4_nvlink")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=DEFAULT_ROWS, help="model:machine,...")
    ap.add_argument("--budgets", default="10,30", help="comma-separated seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    out = Transcript()
    out.say(machine_line())
    out.say(f"{'model':12s} {'machine':18s} {'budget':>6s} {'best ms':>10s} "
            f"{'winner':>15s} {'wall s':>7s}  searches (wall s)")
    for model, machine, graph, cost_model in problems(args.rows):
        for budget in (float(b) for b in args.budgets.split(",")):
            t0 = time.perf_counter()
            results = compare(graph, cost_model, seed=args.seed, budget_s=budget)
            wall = time.perf_counter() - t0
            best = best_of(results)
            searches = ", ".join(f"{r.method} {r.wall_s:.1f}" for r in results
                                 if is_search(r.method))
            out.say(f"{model:12s} {machine:18s} {budget:6g} {best.step_time_s * 1e3:10.3f} "
                    f"{best.method:>15s} {wall:7.1f}  {searches}  (load {load_average()})")
    out.finish(__file__, None, args.out)


if __name__ == "__main__":
    main()

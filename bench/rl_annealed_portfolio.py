"""What-if: does the policy gain more when its portfolio starts are annealed first?

    python bench/rl_annealed_portfolio.py ROWS [BUDGET_S]
    (ROWS: model:machine,...; BUDGET_S default 60, the issue's time per search)

Per row, ``local`` for BUDGET_S from every fast heuristic, then two ways of spending
another BUDGET_S on rl-gnn:
  A: rl-gnn warm-started from every placement found (``compare``'s way: its portfolio
     restarts go to the next best ones, polished by op-level moves first);
  B: the 3 best distinct placements each annealed by ``local`` (another seed) for a
     third of 20% of the budget, then rl-gnn for the rest, warm-started from all.
``local/A`` and ``local/B`` are the policy's gain over ``local``'s result. Time budgets:
the figures depend on the machine's load (printed per row).
"""

import os
import sys
import time

import numpy as np
from report import FAST_HEURISTICS, problems, starts_then_local

from simplace.placers import optimize


def main():
    rows = sys.argv[1]
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    for model, machine, g, cm in problems(rows):
        found, loc = starts_then_local(g, cm, FAST_HEURISTICS, seed=0, budget_s=budget)
        ranked = sorted([r for r in found + [loc] if not r.oom], key=lambda r: r.step_time_s)
        t = time.perf_counter()
        a = optimize(g, cm, "rl-gnn", seed=0, budget_s=budget,
                     warm_start=np.stack([r.placement for r in ranked]))
        ta = time.perf_counter() - t
        t = time.perf_counter()
        distinct = []
        for r in ranked:
            if not any(np.array_equal(r.placement, d.placement) for d in distinct):
                distinct.append(r)
        share = 0.2 * budget / 3
        annealed = [optimize(g, cm, "local", seed=1 + i, budget_s=share, starts=[r.placement])
                    for i, r in enumerate(distinct[:3])]
        left = budget - (time.perf_counter() - t)
        pool = sorted([r for r in annealed + ranked if not r.oom], key=lambda r: r.step_time_s)
        b = optimize(g, cm, "rl-gnn", seed=0, budget_s=left,
                     warm_start=np.stack([r.placement for r in pool]))
        tb = time.perf_counter() - t
        print(f"{model} x {machine}: local {loc.step_time_s * 1e3:.3f}  A rl "
              f"{a.step_time_s * 1e3:.3f} (local/A {loc.step_time_s / a.step_time_s:.3f}, "
              f"{ta:.0f} s)  annealed {[round(r.step_time_s * 1e3, 2) for r in annealed]}  "
              f"B rl {b.step_time_s * 1e3:.3f} (local/B {loc.step_time_s / b.step_time_s:.3f}, "
              f"{tb:.0f} s) load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()

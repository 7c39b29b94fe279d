"""What REINFORCE adds after ``local`` search, as ``compare`` runs them: the policy is
warm-started from every placement found so far (local's best first) and searches for
the same time again. One row per (model, machine) and setting of the gnn policy's
``explore`` (fresh deviations per sample around a warm start).

    python bench/rl_from_local.py [--rows rnnlm:cpu_h100x4_nvlink,...] [--budget-s 30]
                                  [--explore 2,6,16] [--seed 0] [--out rl_from_local.txt]

``local/RL`` above 1 is the policy's gain over local's result (it is never below 1: the
policy keeps its warm start). The issue asks for 1.05 on half the rows. Wall times are
this machine's: quote its load (printed per row) with the figures.
"""

import argparse

import numpy as np
from report import Transcript, load_average, machine_line, problems, starts_then_local

from simplace.placers import optimize

STARTS = ("single", "expert", "heft", "m_topo", "m_etf", "m_sct")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="rnnlm:cpu_h100x4_nvlink,nmt_2layer:haswell_k40x4",
                    help="model:machine,...")
    ap.add_argument("--budget-s", type=float, default=30.0,
                    help="local's budget, and again each policy run's")
    ap.add_argument("--explore", default="2,6,16", help="gnn explore settings to run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    out = Transcript()
    say = out.say
    say(machine_line())
    for model, machine, g, cm in problems(args.rows):
        found, loc = starts_then_local(g, cm, STARTS, seed=args.seed, budget_s=args.budget_s)
        found = sorted((r for r in found + [loc] if not r.oom), key=lambda r: r.step_time_s)
        say(f"\n{model} x {machine}: local {loc.step_time_s * 1e3:.3f} ms in "
            f"{loc.wall_s:.1f} s (load {load_average()})")
        for ex in args.explore.split(","):
            r = optimize(g, cm, "rl-gnn", seed=args.seed, budget_s=args.budget_s,
                         warm_start=np.stack([x.placement for x in found]),
                         explore=float(ex))
            say(f"  explore {float(ex):>4g}: {r.step_time_s * 1e3:.3f} ms, local/RL "
                f"{loc.step_time_s / r.step_time_s:.3f}, {r.info.get('updates')} updates, "
                f"{r.info.get('restarts')} restarts, first batch "
                f"{r.info.get('first_batch_s', 0):.1f} s, wall {r.wall_s:.1f} s "
                f"(load {load_average()})")
    out.save(args.out)


if __name__ == "__main__":
    main()

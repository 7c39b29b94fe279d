"""REINFORCE policies against the heuristics, on the seed papers' 1 CPU + 4 K40 machine.

    python bench/rl.py [--models nmt_4layer,rnnlm,inception_v3,bert_base]
                       [--policies seq2seq,hierarchical,gnn] [--budget-s 60]
                       [--warm-start best|none] [--samples 64] [--seed 0] [--out rl.json]

For each model (training graph) it runs the fast heuristics (every registered method but
``local``, ``exact`` and ``rl-*``), then each policy for ``--budget-s`` seconds (JIT
compilation and the warm start included) and prints: episodes (sampled placements) per
second of training, the wall time to come within 1% of the run's final best, and the
final step time against ``single``, ``expert`` and the best heuristic. With
``--warm-start best`` the policy starts from the best heuristic (so it cannot end worse);
``none`` trains from scratch. Wall times are this machine's: quote it with the figures.
"""

import argparse
import json
import os
import platform
import time

import simplace
from simplace import zoo
from simplace.placers import compare, optimize
from simplace.placers.rl import fast_heuristics

DEFAULT_MODELS = "nmt_4layer,rnnlm,inception_v3,bert_base"


def time_to_within(history, final: float, rel: float = 0.01) -> float | None:
    """Wall seconds until the best-so-far came within ``rel`` of ``final``."""
    for row in history:
        if row["best_step_time_s"] <= final * (1 + rel):
            return row["wall_s"]
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--machine", default="haswell_k40x4")
    ap.add_argument("--policies", default="seq2seq,hierarchical,gnn")
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--warm-start", default="best")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--history-dir", default=None, help="write each run's history + plot")
    ap.add_argument("--out", help="write all rows as JSON")
    args = ap.parse_args()

    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; simulated machine {args.machine}")
    cm = simplace.CostModel.load(args.machine)
    rows = []
    for model in args.models.split(","):
        fn, ex = zoo.get(model, training=True)
        graph = simplace.trace(fn, *ex, name=model)
        heur = {r.method: r for r in compare(graph, cm, fast_heuristics(), seed=args.seed)}
        fit = [r for r in heur.values() if not r.oom]
        best_h = min(fit, key=lambda r: r.step_time_s)
        single, expert = heur["single"].step_time_s, heur["expert"].step_time_s
        print(f"\n{model} (train, {graph.num_ops:,} ops): single {single * 1e3:.1f} ms, "
              f"expert {expert * 1e3:.1f} ms, best heuristic {best_h.method} "
              f"{best_h.step_time_s * 1e3:.1f} ms")
        print(f"{'policy':<14}{'step ms':>10}{'vs single':>10}{'vs expert':>10}"
              f"{'vs best h':>10}{'episodes':>10}{'eps/s':>8}{'to 1% s':>9}{'wall s':>8}"
              f"  improved on warm start")
        for pol in args.policies.split(","):
            kw = {}
            if args.history_dir:
                os.makedirs(args.history_dir, exist_ok=True)
                kw["history"] = os.path.join(args.history_dir, f"{model}_{pol}.json")
            res = optimize(graph, cm, f"rl-{pol}", seed=args.seed, budget_s=args.budget_s,
                           samples=args.samples, warm_start=args.warm_start, **kw)
            t = res.step_time_s
            reach = time_to_within(res.history, t)
            ws = res.info.get("warm_starts") or {}
            improved = (min(ws.values()) - t) / min(ws.values()) if ws else None
            row = {"model": model, "ops": graph.num_ops, "machine": args.machine,
                   "policy": pol, "step_time_s": t, "oom": res.oom,
                   "single_s": single, "expert_s": expert,
                   "best_heuristic": best_h.method, "best_heuristic_s": best_h.step_time_s,
                   "episodes": res.info.get("episodes"),
                   "episodes_per_s": res.info.get("episodes_per_s"),
                   "time_to_1pct_s": reach, "wall_s": res.wall_s,
                   "units": res.info.get("units"), "oom_mode": res.info.get("oom_mode"),
                   "warm_start": args.warm_start, "improvement_over_warm_start": improved,
                   "budget_s": args.budget_s, "samples": args.samples}
            rows.append(row)
            eps = res.info.get("episodes_per_s") or 0.0
            print(f"{pol:<14}{t * 1e3:>10.1f}{single / t:>9.2f}x{expert / t:>9.2f}x"
                  f"{best_h.step_time_s / t:>9.2f}x{res.info.get('episodes', 0):>10}"
                  f"{eps:>8.0f}{(reach or float('nan')):>9.1f}{res.wall_s:>8.1f}  "
                  + ("-" if improved is None else f"{100 * improved:.1f}%"), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

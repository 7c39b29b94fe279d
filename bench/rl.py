"""REINFORCE policies against every non-RL method (heuristics and ``local`` search).

    python bench/rl.py [--models rnnlm,nmt_2layer,...] [--machines haswell_k40x4,...]
                       [--policies gnn] [--budget-s 60] [--local-budget-s 60]
                       [--warm-start best|none] [--samples 64] [--seed 0]
                       [--refine-every N] [--ablation] [--out rl.json]

For each model (training graph) and machine it runs the fast heuristics (every
registered method but ``local``, ``exact`` and ``rl-*``) and ``local`` (simulated
annealing from the best of them) for ``--local-budget-s``; the best of those is the
**best non-RL** placement. Then each policy trains for ``--budget-s`` seconds (warm
starts, JIT compilation and training all count) from the best heuristic (``--warm-start
best``) and the table shows, per row:

* the policy's step time against the best non-RL method (``vs best``: > 1 is faster);
* its improvement over its warm start (what training found; the warm start is kept as
  the best-so-far, so it is never negative);
* ``from samples``: the part of that improvement found by the policy's own samples
  before any refinement by block moves (the rest came from refining the best samples,
  ``RLConfig.refine_every``); rows with ``--refine-every 0`` have no refinement;
* ``pre``: the best warm start after the polish that runs before training (the
  portfolio's starts polished by op-level moves, ``simplace.placers.rl``); the policy
  trains from those, so ``samples`` below that is what the policy found beyond it;
* ``polish``: the part of the improvement the final op-level polish of the best
  placement made (``RLConfig.polish_*``), and ``restarts``: how many times training
  restarted the policy (on the portfolio's next warm start, then on the best placement);
* with ``--ablation``, ``no RL``: the same op-level polish run from each of the same
  portfolio warm starts, with no policy at all, within ``--budget-s`` (the warm starts'
  time not counted), the best of them: what the policy adds beyond the polish is the gap
  between that and ``RL ms``;
* episodes (sampled placements) per minute of training (steady state: after the first
  update, whose programs compile) and the split of an update's wall time between the
  policy (sampling, gradient, Adam), the simulator and the refinement.

Wall times are this machine's: quote its load (printed) with the figures.
"""

import argparse
import json
import os
import platform
import time

import numpy as np

import simplace
from simplace import zoo
from simplace.placers import compare, optimize
from simplace.placers.rl import fast_heuristics
from simplace.rl import RLConfig

DEFAULT_MODELS = ("rnnlm,nmt_2layer,nmt_4layer,inception_v3,bert_base,resnet50,"
                  "transformer")
DEFAULT_MACHINES = "haswell_k40x4,cpu_h100x4_nvlink,hsdag_cpu_gpu"


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def update_split(history: list[dict]) -> dict:
    """Mean seconds per update of each part, and the shares, over the updates after the
    first (whose programs compile)."""
    rows = history[1:]  # none after the first: no steady-state figure (NaN shares)
    parts = ("policy_s", "simulator_s", "learn_s", "refine_s")
    mean = {p: float(np.mean([r.get(f"time_{p}", 0.0) for r in rows])) if rows else 0.0
            for p in parts}
    total = sum(mean.values()) or float("nan")
    return {"update_s": total, "policy_share": (mean["policy_s"] + mean["learn_s"]) / total,
            "simulator_share": mean["simulator_s"] / total,
            "refine_share": mean["refine_s"] / total, **mean}


def from_samples(history: list[dict], warm: float) -> float:
    """Improvement over ``warm`` of the best placement sampled by the policy itself
    (each row's batch minimum), before refinement."""
    best = min([r["min_step_time_s"] for r in history] + [warm])
    return (warm - best) / warm


def polish_only(graph, cm, warm: dict, portfolio: int, samples: int,
                budget_s: float) -> tuple[float, float]:
    """(best step time, wall s): the op-level polish of RL's final phase
    (``simplace.rl.refine.polish``) from each of the ``portfolio`` best warm starts
    ``{name: placement}``, no policy, each until it converges or has used its share of
    ``budget_s`` (the time left split evenly among the starts not yet polished; the
    warm starts' own time is not counted, unlike RL's)."""
    from simplace.rl.refine import polish
    from simplace.rl.reinforce import portfolio_starts
    from simplace.search import OOM_PENALTY
    from simplace.sim import batched_simulator, sim_inputs

    t0 = time.perf_counter()
    inp = sim_inputs(graph, cm)
    sim = batched_simulator(graph, inp, memory="oom")

    def score(p):
        r = sim(np.asarray(p))
        return np.where(r.oom, r.step_time_s + OOM_PENALTY, r.step_time_s)

    names = list(warm)
    scores = [float(score(np.repeat(np.asarray(warm[n])[None], samples, 0))[0])
              for n in names]
    best = min(scores)
    starts = portfolio_starts([(n, warm[n]) for n in names], scores, portfolio)
    end = t0 + budget_s
    for i, (_, p) in enumerate(starts):
        now = time.perf_counter()
        s0 = float(score(np.repeat(p[None], samples, 0))[0])
        _, s, _ = polish(score, p, s0, inp.num_devices, samples, 10**9,
                         deadline=now + (end - now) / (len(starts) - i),
                         edges=(np.asarray(graph.src), np.asarray(graph.dst)))
        best = min(best, s)
    return best, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--machines", default=DEFAULT_MACHINES)
    ap.add_argument("--policies", default="gnn")
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--local-budget-s", type=float, default=None,
                    help="local search's budget (default: --budget-s; 0: no local)")
    ap.add_argument("--warm-start", default="best")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--refine-every", type=int, default=None,
                    help="RLConfig.refine_every (default: the config's; 0: no refinement)")
    ap.add_argument("--ablation", action="store_true",
                    help="also polish the portfolio's warm starts without a policy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write all rows as JSON")
    args = ap.parse_args()
    local_budget = args.budget_s if args.local_budget_s is None else args.local_budget_s

    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, load {load()}")
    rows = []
    header = (f"{'model':<13}{'machine':<19}{'policy':<8}{'RL ms':>10}{'best non-RL':>18}"
              f"{'vs best':>9}{'vs warm':>9}{'pre':>8}{'samples':>9}{'polish':>8}{'rst':>5}"
              f"{'no RL':>8}{'eps/min':>10}{'policy':>8}"
              f"{'sim':>6}{'refine':>7}{'wall s':>8}{'load':>6}")
    print(header)
    for machine in args.machines.split(","):
        cm = simplace.CostModel.load(machine)
        for model in args.models.split(","):
            fn, ex = zoo.get(model, training=True)
            graph = simplace.trace(fn, *ex, name=model)
            found = {r.method: r for r in compare(graph, cm, fast_heuristics(),
                                                  seed=args.seed)}
            if local_budget > 0:
                found["local"] = optimize(graph, cm, "local", seed=args.seed,
                                          budget_s=local_budget)
            fit = [r for r in found.values() if not r.oom]
            best = min(fit, key=lambda r: r.step_time_s)
            for pol in args.policies.split(","):
                kw = {} if args.refine_every is None else {"refine_every": args.refine_every}
                res = optimize(graph, cm, f"rl-{pol}", seed=args.seed,
                               budget_s=args.budget_s, samples=args.samples,
                               warm_start=args.warm_start, **kw)
                t = res.step_time_s
                ws = res.info.get("warm_starts") or {}
                warm = min(ws.values()) if ws else None
                improved = (warm - t) / warm if warm else None
                sampled = from_samples(res.history, warm) if warm else None
                # The polish's time (added to the last row) is not an update's.
                split = update_split([r for r in res.history if not r.get("polish")])
                polish_gain = res.info.get("polish_gain")
                pre = min((res.info.get("prepolished") or {}).values(), default=None)
                ablation = ablation_s = None
                if args.ablation:
                    ws_names = ws if args.warm_start == "best" else {}
                    heur = {m: r.placement for m, r in found.items()
                            if m != "local" and m in ws_names}
                    if heur:
                        ablation, ablation_s = polish_only(
                            graph, cm, heur, RLConfig().portfolio,
                            args.samples, args.budget_s)
                eps = res.info.get("episodes_per_s") or 0.0
                row = {"model": model, "ops": graph.num_ops, "machine": machine,
                       "policy": pol, "step_time_s": t, "oom": res.oom,
                       "best_non_rl": best.method, "best_non_rl_s": best.step_time_s,
                       "non_rl": {m: r.step_time_s for m, r in found.items()},
                       "speedup_vs_best_non_rl": best.step_time_s / t,
                       "warm_start_s": warm, "improvement_over_warm_start": improved,
                       "improvement_from_samples": sampled,
                       "prepolished_s": pre, "prepolish_wall_s": res.info.get("prepolish_s"),
                       "polish_gain": polish_gain, "restarts": res.info.get("restarts", 0),
                       "stints_from": res.info.get("stints_from"),
                       "polish_only_s": ablation, "polish_only_wall_s": ablation_s,
                       "episodes": res.info.get("episodes"),
                       "episodes_per_min": 60 * eps, "update_split": split,
                       "first_update_at_s": res.info.get("first_update_at_s"),
                       "wall_s": res.wall_s, "units": res.info.get("units"),
                       "oom_mode": res.info.get("oom_mode"), "budget_s": args.budget_s,
                       "local_budget_s": local_budget, "samples": args.samples,
                       "refine_every": args.refine_every, "load": load()}
                rows.append(row)

                def pct(x):
                    return "-" if x is None else f"{100 * x:.1f}%"

                print(f"{model:<13}{machine:<19}{pol:<8}{t * 1e3:>10.2f}"
                      f"{best.method + ' ' + format(best.step_time_s * 1e3, '.2f'):>18}"
                      f"{best.step_time_s / t:>8.3f}x{pct(improved):>9}"
                      f"{'-' if pre is None else format(pre * 1e3, '.2f'):>8}{pct(sampled):>9}"
                      f"{pct(polish_gain):>8}{res.info.get('restarts', 0):>5}"
                      f"{'-' if ablation is None else format(ablation * 1e3, '.2f'):>8}"
                      f"{60 * eps:>10,.0f}{100 * split['policy_share']:>7.0f}%"
                      f"{100 * split['simulator_share']:>5.0f}%"
                      f"{100 * split['refine_share']:>6.0f}%{res.wall_s:>8.1f}"
                      f"{load().split()[0]:>6}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    wins = [r for r in rows if r["speedup_vs_best_non_rl"] >= 1 - 1e-9]
    fast = [r for r in rows if r["speedup_vs_best_non_rl"] >= 1.05]
    print(f"\nRL <= best non-RL on {len(wins)}/{len(rows)} rows; >= 5% faster on "
          f"{len(fast)}/{len(rows)}; load {load()}")


if __name__ == "__main__":
    main()

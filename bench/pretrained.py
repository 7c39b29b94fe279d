"""The pretrained policy on graphs and machines it never saw (issue 36's held-out table).

    python bench/pretrained.py [--rows all|zoo|imported] [--local-budget-s 60]
                               [--finetune-budget-s 20] [--weights W.NPZ] [--seed 0]
                               [--samples 64] [--zero-shot-budget-s 1.8]
                               [--baselines B.JSON [--baselines-only]]
                               [--out bench/results/pretrained_<date>_<host>.json]

Rows: the held-out zoo models (``simplace.rl.distribution.HELD_OUT_MODELS``) on the
held-out machines and on two training machines, and the held-out imported graphs on the
machines their files imply. Per row, all under one cost model:

* ``single`` and the lower bound;
* the best fast heuristic (every registered heuristic but ``rl-pretrained``) and its name;
* ``local`` with ``--local-budget-s`` (it starts from the heuristics, ``rl-pretrained``
  left out, so it is the search a user had before);
* ``rl-pretrained`` zero-shot with ``--zero-shot-budget-s`` (default 1.8: its batch, then
  policy-guided resampling until the budget): its step time and wall time (the process
  has placed two random graphs first, one per unit bucket of the policy, so its programs
  are compiled: "after the first call in a process"; a machine in another device bucket
  pays its compile); and its batch alone (``refine_rounds=0``: the policy's samples, no
  search), ``zero_shot_batch_s``;
* ``rl-universal --warm-start pretrained`` fine-tuned for ``--finetune-budget-s``;
* at equal wall time: ``local`` with 2 s (the zero-shot's allowance) and with
  ``--finetune-budget-s`` (the fine-tune's), from the same heuristic starts;
* ``local`` with 2 s as a user runs it (``simplace optimize --method local --budget-s 2``):
  its default starts, ``rl-pretrained`` among them (shipped weights only; with
  ``--weights`` its place is left out), and from the heuristic starts alone, run one
  after the other at the same load. This is what the policy is worth inside the
  product: the same 2 s with and without it.

The targets it checks (printed at the end): zero-shot within 10% of ``local`` on at least
80% of rows in at most 2 s, never more than 5% worse than the best heuristic; fine-tuned
no slower than ``local`` on every row. Wall times are this machine's: quote its load.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import time

import numpy as np


def _rows(which: str):
    from simplace.rl import distribution as dist

    rows = []
    if which in ("all", "zoo"):
        for model in dist.HELD_OUT_MODELS:
            for mach in (*dist.HELD_OUT_MACHINES, "haswell_k40x4", "cpu_h100x4_nvlink"):
                rows.append((f"{model}@{mach}", model, mach))
    if which in ("all", "imported"):
        rows += [(path, path, None) for path in dist.HELD_OUT_IMPORTED]
    return rows


def method_names(ap, text: str) -> list[str]:
    """The comma-separated method names in ``text``; ``ap.error`` naming any unknown."""
    from simplace.placers import methods

    names = [m for m in text.split(",") if m]
    unknown = [m for m in names if m not in methods()]
    if unknown:
        ap.error(f"unknown method(s) {', '.join(unknown)}; one of {', '.join(methods())}")
    return names


def _problem(model, mach):
    """(graph, cost model): a zoo model on a datasheet machine, or an imported instance."""
    from simplace.cost_model import CostModel
    from simplace.rl import distribution as dist

    if mach is None:
        return dist.imported_model(model)
    return dist.zoo_graph(model, {}), CostModel.load(mach)


def _best_heuristic(g, inp, seed):
    from simplace.placers import methods_of_kind, optimize

    best = None
    for name in methods_of_kind("heuristic", learned=False):
        try:
            r = optimize(g, inp, name, seed=seed)
        except Exception as err:  # noqa: BLE001 - a failing heuristic is reported, not fatal
            print(f"  {name} failed: {err}")
            continue
        t = float(np.inf) if r.oom else r.step_time_s
        if best is None or t < best[1]:
            best = (name, t)
    return best


def _baselines(g, model, args, starts) -> dict:
    """single, the lower bound, the best heuristic and local's step times on one row."""
    from simplace.placers import optimize
    from simplace.sim import lower_bound

    row = {"lower_bound_s": float(lower_bound(g, model)),
           "single_s": optimize(g, model, "single").step_time_s,
           "local_budget_s": args.local_budget_s}
    row["heuristic"], row["heuristic_s"] = _best_heuristic(g, model, args.seed)
    loc = optimize(g, model, "local", seed=args.seed, budget_s=args.local_budget_s,
                   starts=starts)
    row["local_s"] = float(np.inf) if loc.oom else loc.step_time_s
    row["local_wall_s"] = loc.wall_s
    return row


def _equal_keys(args) -> dict[str, float]:
    """The equal-time baselines' row keys and their budgets."""
    return {"local_2s": 2.0, f"local_{args.finetune_budget_s:g}s": args.finetune_budget_s}


def _equal_time(g, model, args, starts, row) -> None:
    """``local`` at the zero-shot's and the fine-tune's wall times (2 s and
    ``--finetune-budget-s``): what a user gets from the same seconds without the policy
    (kept in ``row``, computed once)."""
    from simplace.placers import optimize

    for key, budget in _equal_keys(args).items():
        if key not in row:
            r = optimize(g, model, "local", seed=args.seed, budget_s=budget, starts=starts)
            row[key] = float(np.inf) if r.oom else r.step_time_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="all", choices=("all", "zoo", "imported"))
    ap.add_argument("--local-budget-s", type=float, default=60.0)
    ap.add_argument("--finetune-budget-s", type=float, default=20.0)
    ap.add_argument("--weights", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=64, help="rl-pretrained's samples")
    ap.add_argument("--zero-shot-budget-s", type=float, default=1.8,
                    help="rl-pretrained's time budget (its batch, then the resampling; "
                         "default 1.8: optimize's final simulation included, the answer "
                         "comes in about that, a margin below the target's 2 s)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--baselines", default=None, metavar="B.JSON",
                    help="keep the rows' baselines (single, heuristics, local: none of them "
                         "uses the policy) in this file, and reuse those found there")
    ap.add_argument("--baselines-only", action="store_true",
                    help="compute (and keep) the baselines only")
    args = ap.parse_args()

    from simplace.compile_cache import enable as enable_cache
    from simplace.cost_model import CostModel
    from simplace.placers import methods_of_kind, optimize
    from simplace.rl import distribution as dist

    enable_cache()
    from simplace.rl.pretrained import SHIPPED, load_weights

    wpath = args.weights or SHIPPED
    t0 = time.perf_counter()
    _, meta = load_weights(wpath)
    weights = {"path": str(wpath), "bytes": os.path.getsize(wpath),
               "load_s": round(time.perf_counter() - t0, 3),
               "card": meta.get("card", {}).get("summary", "")}
    print(f"weights {wpath}: {weights['bytes'] / 1e6:.2f} MB, read in {weights['load_s']} s "
          f"({weights['card']})")
    host = platform.node()
    out = args.out or (f"bench/results/pretrained_{datetime.date.today()}_"
                       f"{host.split('.')[0]}.json")
    wopt = {"samples": args.samples}
    if args.weights is not None:
        wopt["weights"] = args.weights
    # One small and one large random graph: the policy's two unit buckets.
    for m in (200, 3000):
        g0 = dist.random_dag(m, 0)
        optimize(g0, CostModel.load("haswell_k40x4").price(g0), "rl-pretrained", **wopt)
    starts = methods_of_kind("heuristic", learned=False)
    results = []
    kept = {}
    if args.baselines and os.path.isfile(args.baselines):
        with open(args.baselines) as f:
            kept = json.load(f)
    for label, model, mach in _rows(args.rows):
        g, inp = _problem(model, mach)
        row = kept.get(label)
        if row is None or row.get("local_budget_s") != args.local_budget_s:
            row = _baselines(g, inp, args, starts)
            row.update(row=label, ops=g.num_ops, devices=inp.num_devices,
                       load=" ".join(f"{x:.2f}" for x in os.getloadavg()))
            kept[label] = row
        if not all(k in row for k in _equal_keys(args)):
            _equal_time(g, inp, args, starts, row)
            row["equal_time_load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        if args.baselines:
            with open(args.baselines, "w") as f:
                json.dump(kept, f, indent=1)
        row = dict(row)
        name, t = row["heuristic"], row["heuristic_s"]
        print(f"{label:58s} baselines: single {row['single_s']:.4g}  {name} {t:.4g}  local "
              f"{row['local_s']:.4g}", flush=True)
        if args.baselines_only:
            continue
        # zero-shot as a user asks for it in 2 s (its batch, then policy-guided
        # resampling until the budget), and its batch alone (no resampling)
        # A full collection first, as timeit does: in this long process (some 315k live
        # objects) a generation-2 collection pauses 0.3-0.4 s, and one falling in the
        # timed call overran 2 s (a user's process, fresh, holds far fewer).
        gc.collect()
        t0 = time.perf_counter()
        zs = optimize(g, inp, "rl-pretrained", seed=args.seed, budget_s=args.zero_shot_budget_s,
                      **wopt)
        row["zero_shot_wall_s"] = time.perf_counter() - t0
        row["zero_shot_s"] = float(np.inf) if zs.oom else zs.step_time_s
        row["zero_shot_refine"] = zs.info.get("refine")
        t0 = time.perf_counter()
        zb = optimize(g, inp, "rl-pretrained", seed=args.seed, refine_rounds=0, **wopt)
        row["zero_shot_batch_wall_s"] = time.perf_counter() - t0
        row["zero_shot_batch_s"] = float(np.inf) if zb.oom else zb.step_time_s
        t0 = time.perf_counter()
        ft = optimize(g, inp, "rl-universal", seed=args.seed,
                      budget_s=args.finetune_budget_s, warm_start="pretrained",
                      **{k: v for k, v in wopt.items() if k == "weights"})
        row["finetune_wall_s"] = time.perf_counter() - t0
        row["finetune_s"] = float(np.inf) if ft.oom else ft.step_time_s
        if args.weights is None:
            # local as a user runs it (the policy is one of its starts) and, at the same
            # moment and load, without the policy
            for key, kw in (("local_2s_without_policy", {"starts": starts}),
                            ("local_2s_with_policy", {})):
                lp = optimize(g, inp, "local", seed=args.seed, budget_s=2.0, **kw)
                row[key] = float(np.inf) if lp.oom else lp.step_time_s
            row["local_2s_with_policy_vs_local"] = row["local_2s_with_policy"] / row["local_s"]
            row["local_2s_with_policy_vs_without"] = (row["local_2s_with_policy"]
                                                      / row["local_2s_without_policy"])
        row["zero_vs_local"] = row["zero_shot_s"] / row["local_s"]
        row["zero_vs_heuristic"] = row["zero_shot_s"] / row["heuristic_s"]
        row["batch_vs_local"] = row["zero_shot_batch_s"] / row["local_s"]
        row["batch_vs_heuristic"] = row["zero_shot_batch_s"] / row["heuristic_s"]
        row["finetune_vs_local"] = row["finetune_s"] / row["local_s"]
        # At equal wall time: local with the zero-shot's 2 s and the fine-tune's seconds.
        row["zero_vs_local_2s"] = row["zero_shot_s"] / row["local_2s"]
        row["finetune_vs_local_equal"] = (row["finetune_s"]
                                          / row[f"local_{args.finetune_budget_s:g}s"])
        results.append(row)
        print(f"{label:58s} {g.num_ops:5d} ops  single {row['single_s']:.4g}  "
              f"{name} {t:.4g}  local {row['local_s']:.4g}  zero-shot {row['zero_shot_s']:.4g}"
              f" ({row['zero_vs_local']:.3f}x local, {row['zero_shot_wall_s']:.2f} s)  "
              f"fine-tuned {row['finetune_s']:.4g} ({row['finetune_vs_local']:.3f}x)  "
              f"equal time: zero-shot {row['zero_vs_local_2s']:.3f}x local-2s, fine-tuned "
              f"{row['finetune_vs_local_equal']:.3f}x local-{args.finetune_budget_s:g}s"
              + ("" if args.weights else f"; local-2s with the policy "
                 f"{row['local_2s_with_policy_vs_without']:.3f}x without it, "
                 f"{row['local_2s_with_policy_vs_local']:.3f}x local"), flush=True)
    if args.baselines_only:
        return
    n = len(results)
    within = sum(r["zero_vs_local"] <= 1.10 and r["zero_shot_wall_s"] <= 2.0 for r in results)
    summary = {
        "zero_shot_within_10pct_of_local_in_2s": f"{within}/{n}",
        "zero_shot_worst_vs_heuristic": max(r["zero_vs_heuristic"] for r in results),
        "finetune_worst_vs_local": max(r["finetune_vs_local"] for r in results),
        "zero_shot_max_wall_s": max(r["zero_shot_wall_s"] for r in results),
        "zero_shot_within_5pct_of_heuristic": sum(r["zero_vs_heuristic"] <= 1.05
                                                  for r in results),
        "finetune_no_slower_than_local": sum(r["finetune_vs_local"] <= 1.0 for r in results),
        "batch_alone_within_10pct_of_local": sum(r["batch_vs_local"] <= 1.10 for r in results),
        "batch_alone_within_5pct_of_heuristic": sum(r["batch_vs_heuristic"] <= 1.05
                                                    for r in results),
        "equal_time_zero_shot_no_slower_than_local_2s": sum(r["zero_vs_local_2s"] <= 1.0
                                                             for r in results),
        "equal_time_finetune_no_slower_than_local": sum(r["finetune_vs_local_equal"] <= 1.0
                                                        for r in results),
        "rows": n}
    if args.weights is None:
        summary["local_2s_with_policy_within_10pct_of_local"] = sum(
            r["local_2s_with_policy_vs_local"] <= 1.10 for r in results)
        summary["local_2s_with_policy_better_than_without"] = sum(
            r["local_2s_with_policy_vs_without"] < 1.0 for r in results)
    print(json.dumps(summary, indent=1))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with open(out, "w") as f:
        json.dump({"host": host, "cpus": os.cpu_count(), "load_end": load,
                   "args": vars(args), "weights": weights, "summary": summary,
                   "rows": results}, f, indent=1)
    print(f"wrote {out} (load {load})")


if __name__ == "__main__":
    main()

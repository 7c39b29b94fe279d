"""Placement quality and speed: every method on zoo models and datasheet machines.

    python bench/placers.py [--models nmt_2layer,rnnlm,...] [--machines haswell_k40x2,...]
                            [--budget-s 30] [--list-in-budget] [--small] [--out placers.json]
    python bench/placers.py --summary-of a.json b.json   # the summary of saved rows

For each (model, machine) it prints the table of `simplace optimize --method all`: step
time, speedup over `single`, gap to the lower bound, peak memory / OOM, wall time of the
method, and the row's wall time against the budget: ``compare``'s (every method in the
budget, the re-simulation of their results included) and, apart, the list schedulers run
before it without one (``--list-in-budget``: inside the budget, as ``simplace optimize
--method all`` runs them). At the end, a summary: each method's speedup over `single`
per row (a list scheduler below 1.00x breaks its promise), what each list scheduler
returned (its own schedule or the single device it fell back to), and Baechi's claim
"m-SCT within 6% of expert" row by row. Wall times are for the machine it runs on, and
the load average (printed at the start, per row and at the end) says how busy it was:
quote both with the figures.
"""

import argparse
import json
import time

from report import load_average, machine_line

import simplace
from simplace import zoo
from simplace.cli import results_table
from simplace.placers import compare, optimize
from simplace.placers import methods as all_methods
from simplace.sim import lower_bound

DEFAULT_MODELS = "nmt_2layer,nmt_4layer,rnnlm,resnet50,inception_v3,transformer"
DEFAULT_MACHINES = "haswell_k40x2,haswell_k40x4,cpu_h100x4_nvlink"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--machines", default=DEFAULT_MACHINES)
    ap.add_argument("--methods", default=None, help="comma-separated (default: all)")
    ap.add_argument("--budget-s", type=float, default=30.0,
                    help="budget of the search methods (`local`, rl-*); list schedulers "
                         "named in --methods run without one")
    ap.add_argument("--list-in-budget", action="store_true",
                    help="run the list schedulers inside compare's budget, as `simplace "
                         "optimize --method all` does (default: before it, without one)")
    ap.add_argument("--small", action="store_true", help="tiny model sizes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write all rows as JSON")
    ap.add_argument("--summary-of", nargs="+", metavar="ROWS.json",
                    help="run nothing: print the summary of rows saved by earlier runs "
                         "(--out), several files together")
    args = ap.parse_args()
    if args.summary_of:
        rows = []
        for path in args.summary_of:
            with open(path) as f:
                rows += json.load(f)
        print(summary(rows))
        return

    # As the CLI does: the methods' compiled programs come from JAX's persistent cache
    # (rl-pretrained's first call in a process otherwise compiles for about 2 s of a
    # short budget, which a user's second run does not pay).
    from simplace.compile_cache import enable

    enable()
    print(machine_line())
    rows = []
    for model in args.models.split(","):
        fn, ex = zoo.get(model, training=True, small=args.small)
        graph = simplace.trace(fn, *ex, name=model)
        for machine in args.machines.split(","):
            cm = simplace.CostModel.load(machine)
            bound_s = lower_bound(graph, cm)
            methods = args.methods.split(",") if args.methods else None
            results, walls = _run(graph, cm, methods, args)
            print(f"\n{model} (train, {graph.num_ops:,} ops) on {machine}:")
            print(results_table(results, bound_s))
            print(f"  wall: compare {walls['compare_wall_s']:.2f} s of its "
                  f"{args.budget_s:g} s budget"
                  + (f", list schedulers before it (no budget) "
                     f"{walls['prior_wall_s']:.2f} s" if walls["prior_wall_s"] else "")
                  + f"; best {min(r.step_time_s for r in results) * 1e3:.3f} ms"
                  f" ({min(results, key=lambda r: r.step_time_s).method}); "
                  f"load average {load_average()}")
            for r in results:
                rows.append({"model": model, "ops": graph.num_ops, "machine": machine,
                             "method": r.method, "step_time_s": r.step_time_s,
                             "oom": r.oom, "wall_s": r.wall_s,
                             "lower_bound_s": bound_s,
                             "returned": r.info.get("returned"),
                             "unit": r.info.get("unit"),
                             "segments": r.num_segments, "budget_s": args.budget_s,
                             **walls})
    print(summary(rows))
    print(f"\nload average at the end: {load_average()}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


def _run(graph, cm, methods, args) -> tuple[list, dict]:
    """``compare``'s results, except that list schedulers run first, without a time
    budget (``--budget-s`` is the search methods'; given one, a list scheduler stops
    starting runs when it is spent, and its result would depend on the machine's load).
    Their results go to ``compare`` as ``prior``: the searches start from them, as they
    would from any method run before them. With ``--list-in-budget`` they run inside
    ``compare`` like the others. Also the wall times (seconds) of the list schedulers
    run before and of ``compare``."""
    if methods is None:
        methods = [m for m in all_methods() if m != "exact"]
    t0 = time.perf_counter()
    prior = [] if args.list_in_budget else [
        optimize(graph, cm, m, seed=args.seed) for m in methods if m in LIST_SCHEDULERS]
    t1 = time.perf_counter()
    done = {r.method: r for r in compare(graph, cm, methods, seed=args.seed,
                                         budget_s=args.budget_s, prior=prior)}
    walls = {"prior_wall_s": t1 - t0, "compare_wall_s": time.perf_counter() - t1}
    return [done[m] for m in methods if m in done], walls



LIST_SCHEDULERS = ("heft", "m_topo", "m_etf", "m_sct")


def summary(rows: list[dict]) -> str:
    """Speedup over ``single`` per (model, machine) and method; list schedulers' fallbacks;
    m-SCT against expert."""
    keys = list(dict.fromkeys((r["model"], r["machine"]) for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    at = {(r["model"], r["machine"], r["method"]): r for r in rows}
    lines = ["", "speedup over single (single / method; OOM marked !; a list scheduler "
             "that returned the single device marked =):"]
    head = f"{'model':<14} {'machine':<18} " + " ".join(f"{m:>8}" for m in methods)
    lines += [head, "-" * len(head)]
    worse: dict[str, int] = {}
    within = []
    for model, machine in keys:
        single = at.get((model, machine, "single"))
        cells = []
        for m in methods:
            r = at.get((model, machine, m))
            if r is None or single is None or r["step_time_s"] <= 0:
                cells.append(f"{'-':>8}")
                continue
            x = single["step_time_s"] / r["step_time_s"]
            mark = "!" if r["oom"] else ("=" if r.get("returned") == "single" else "")
            cells.append(f"{x:7.2f}{mark or ' '}")
            if m in LIST_SCHEDULERS and r["step_time_s"] > single["step_time_s"] and \
                    not single["oom"]:
                worse[m] = worse.get(m, 0) + 1
        lines.append(f"{model:<14} {machine:<18} " + " ".join(cells))
        sct, expert = at.get((model, machine, "m_sct")), at.get((model, machine, "expert"))
        if sct is not None and expert is not None:
            within.append((model, machine, sct["step_time_s"] / expert["step_time_s"],
                           sct["oom"], expert["oom"]))
    for m in LIST_SCHEDULERS:
        if m in methods:
            lines.append(f"{m}: slower than single (that fits) on {worse.get(m, 0)} of "
                         f"{len(keys)} rows")
    if within:
        ok = [w for w in within if w[2] <= 1.06 and not w[3]]
        lines.append(f"\nm-SCT within 6% of expert (m_sct / expert step time <= 1.06): "
                     f"{len(ok)} of {len(within)} rows")
        for model, machine, ratio, s_oom, e_oom in within:
            note = " (m_sct OOM)" if s_oom else (" (expert OOM)" if e_oom else "")
            lines.append(f"  {model:<14} {machine:<18} m_sct/expert {ratio:5.2f}"
                         f"{'  ok' if ratio <= 1.06 and not s_oom else '  no'}{note}")
    lines += _target_lines(rows)
    return "\n".join(lines)


def _target_lines(rows: list[dict]) -> list[str]:
    """Issue 15's targets row by row: the best RL placer against the best other method
    (faster by that factor: > 1 means RL wins), and the best of all methods over the
    lower bound. OOM results count only where nothing fits."""
    lines = []
    keys = list(dict.fromkeys((r["model"], r["machine"]) for r in rows))
    rl_rows, bound_rows = [], []
    for key in keys:
        mine = [r for r in rows if (r["model"], r["machine"]) == key]
        fits = [r for r in mine if not r["oom"]] or mine

        def best(rs):
            return min((r["step_time_s"] for r in rs), default=None)

        rl = best([r for r in fits if r["method"].startswith("rl-")])
        other = best([r for r in fits if not r["method"].startswith("rl-")])
        if rl is not None and other is not None:
            rl_rows.append((key, other / rl))
        if mine and mine[0]["lower_bound_s"] > 0:
            bound_rows.append((key, best(fits) / mine[0]["lower_bound_s"]))
    if rl_rows:
        wins = sum(x >= 1.05 for _, x in rl_rows)
        never_worse = sum(x >= 1 - 1e-9 for _, x in rl_rows)
        lines.append(f"\nbest RL vs best other method (other / RL step time): RL no slower on "
                     f"{never_worse} of {len(rl_rows)} rows, >= 5% faster on {wins}")
        lines += [f"  {m:<14} {mc:<18} {x:6.3f}" for (m, mc), x in rl_rows]
    if bound_rows:
        ok = sum(x <= 1.5 for _, x in bound_rows)
        lines.append(f"\nbest of all methods / lower bound: within 1.5x on {ok} of "
                     f"{len(bound_rows)} rows")
        lines += [f"  {m:<14} {mc:<18} {x:6.2f}" for (m, mc), x in bound_rows]
    return lines


if __name__ == "__main__":
    main()

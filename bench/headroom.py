"""How much faster than ``local`` can any placement be? The best placement a long,
many-start search finds, row by row, against the methods of a ``placers.py`` run.

    python bench/headroom.py [--models rnnlm,...] [--machines haswell_k40x4,...]
        [--evaluations 200000] [--seeds 2] [--episodes 20000]
        [--against bench/results/placers_A.json ...] [--out headroom.txt]
    python bench/headroom.py --known bench/results/headroom_B.txt --against ...

Issue 15 asks the best RL policy to be at least 5% faster than the best other method on
half the rows. That is only possible where a placement 5% faster than the others' best
exists. For each row this searches far longer than a ``placers.py`` run does, and from
more places: ``local`` (simulated annealing, ``--evaluations`` placements scored: the
same result on any machine for a seed) from each fast heuristic alone (with ``single``,
which ``local`` always adds), for ``--seeds`` seeds; then rl-gnn, warm-started from all
of those results, for ``--episodes`` sampled placements. The best step time of all of
them is the row's *best known*. With ``--against`` (rows saved by ``placers.py --out``),
each row also shows, from that run, the best non-RL method's step time and the best RL
method's, and ``other / best known``: the most any method could gain on the run's best
non-RL method if it found the best known placement (1.05 and above: the target is
reachable on that row as far as this search can tell). The best known is the best of
this search and of the run's own methods (a run's RL can beat the search).

``--known`` searches nothing: it reads each row's best known step time (and bound
ratio) from the table of an earlier run's transcript, to set another ``placers.py`` run
against it.

This is a search, not a bound: a longer one may find more. ``lower_bound`` gives the
other side.
"""

import argparse
import json
import time

import numpy as np
from report import FAST_HEURISTICS, Transcript, load_average, machine_line

import simplace
from simplace.models import load_graph
from simplace.placers import optimize

MODELS = "rnnlm,nmt_2layer,bert_base,transformer,nmt_4layer,inception_v3,resnet50"
MACHINES = "haswell_k40x4,cpu_h100x4_nvlink,hsdag_cpu_gpu"


def run_rows(paths) -> dict:
    """{(model, machine): (best non-RL step, its method, best RL step, lower bound)}
    from ``placers.py --out`` files (a later file's row replaces an earlier one's)."""
    rows = {}
    for path in paths:
        by_row = {}
        with open(path) as f:
            for r in json.load(f):
                if not r.get("oom"):
                    by_row.setdefault((r["model"], r["machine"]), []).append(r)
        for key, rs in by_row.items():
            other = [r for r in rs if not r["method"].startswith("rl-")]
            rl = [r["step_time_s"] for r in rs if r["method"].startswith("rl-")]
            if other:
                best = min(other, key=lambda r: r["step_time_s"])
                rows[key] = (best["step_time_s"], best["method"], min(rl) if rl else None,
                             best["lower_bound_s"])
    return rows


def known_rows(path) -> dict:
    """{(model, machine): (best known step s, lower bound s)} from the table of a saved
    transcript of this script (the bound from its rounded ratio: ``main`` takes the
    compared run's exact one where it has it)."""
    rows, in_table = {}, False
    with open(path) as f:
        for line in f:
            if line.startswith("row "):
                in_table = True
                continue
            parts = line.split()
            if not in_table or len(parts) < 4 or line.startswith(("rows ", "command")):
                continue
            best_s = float(parts[2]) / 1e3
            rows[(parts[0], parts[1])] = (best_s, best_s / float(parts[3]))
    if not rows:
        raise SystemExit(f"{path}: no table of best known placements in it")
    return rows


def best_known(graph, cm, *, evaluations: int, seeds: int, episodes: int, say):
    """(the best result that fits or None, the label of the run that found it) for one
    row, saying each run's result as it comes."""
    found = {m: optimize(graph, cm, m) for m in FAST_HEURISTICS}
    say("  starts: " + ", ".join(f"{m} {r.step_time_s * 1e3:.3f}{'!' if r.oom else ''}"
                                 for m, r in found.items()))
    results = [(f"{m} (heuristic)", r) for m, r in found.items()]
    for m in FAST_HEURISTICS:
        for seed in range(seeds):
            t0 = time.perf_counter()
            r = optimize(graph, cm, "local", seed=seed, max_evaluations=evaluations,
                         starts=[found[m].placement])
            results.append((f"local from {m}, seed {seed}", r))
            say(f"  local from {m:<7} seed {seed}: {r.step_time_s * 1e3:10.3f} ms"
                f"{' OOM' if r.oom else ''}  ({time.perf_counter() - t0:.1f} s)")
    fits = sorted((r for _, r in results if not r.oom), key=lambda r: r.step_time_s)
    if fits and episodes:
        warm = np.stack([r.placement for r in fits[:8]])
        t0 = time.perf_counter()
        r = optimize(graph, cm, "rl-gnn", seed=0, episodes=episodes, warm_start=warm)
        results.append(("rl-gnn from the best 8 of those", r))
        say(f"  rl-gnn from the best 8 of those: {r.step_time_s * 1e3:10.3f} ms"
            f"  ({time.perf_counter() - t0:.1f} s)")
    label, best = min(((lab, r) for lab, r in results if not r.oom),
                      key=lambda x: x[1].step_time_s, default=(None, None))
    return best, label


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--machines", default=MACHINES)
    ap.add_argument("--evaluations", type=int, default=200_000,
                    help="placements each local run scores")
    ap.add_argument("--seeds", type=int, default=2, help="local runs per start")
    ap.add_argument("--episodes", type=int, default=20_000,
                    help="rl-gnn's sampled placements (0: no RL run)")
    ap.add_argument("--against", nargs="*", default=[],
                    help="placers.py --out files to compare with")
    ap.add_argument("--known", help="a transcript of an earlier run: its best known "
                    "placements, instead of searching")
    ap.add_argument("--out", help="also write the transcript to this file")
    args = ap.parse_args()
    out = Transcript()
    say = out.say
    say(machine_line())
    run = run_rows(args.against)
    table = []
    if args.known:
        known = known_rows(args.known)
        keys = [k for k in run if k in known] if run else list(known)
        table = [(*k, known[k][0], run[k][3] if k in run else known[k][1], run.get(k))
                 for k in keys]
        say(f"best known placements from {args.known}")
    for model in [] if args.known else args.models.split(","):
        graph = load_graph(model)
        for machine in args.machines.split(","):
            cm = simplace.CostModel.load(machine)
            say(f"\n{model} x {machine} (load {load_average()})")
            best, label = best_known(graph, cm, evaluations=args.evaluations,
                                     seeds=args.seeds, episodes=args.episodes, say=say)
            if best is None:
                say("  nothing found fits")
                continue
            bound = simplace.lower_bound(graph, cm)
            say(f"  best known {best.step_time_s * 1e3:.3f} ms ({label}), "
                f"{best.step_time_s / bound:.2f}x the lower bound")
            table.append((model, machine, best.step_time_s, bound, run.get((model, machine))))
    say("\nrow                              best known ms  / bound   run's other ms"
        "  (method)   run's RL ms   other / best known   RL / best known")
    reachable = 0
    compared = 0
    for model, machine, best, bound, r in table:
        if r is not None:
            best = min([best, r[0]] + ([r[2]] if r[2] is not None else []))
        line = f"{model:<13} {machine:<18} {best * 1e3:12.3f} {best / bound:8.2f}"
        if r is not None:
            other, method, rl, _ = r
            compared += 1
            reachable += other / best >= 1.05
            rl_s = f"{rl * 1e3:13.3f}" if rl is not None else f"{'-':>13}"
            rl_r = f"{rl / best:17.3f}" if rl is not None else f"{'-':>17}"
            line += (f" {other * 1e3:15.3f}  ({method:<7}) {rl_s} {other / best:20.3f}"
                     f"{rl_r}")
        say(line)
    if compared:
        say(f"\nrows where a placement >= 5% faster than the run's best non-RL method is "
            f"known: {reachable} of {compared}")
    out.finish(__file__, None, args.out)


if __name__ == "__main__":
    main()

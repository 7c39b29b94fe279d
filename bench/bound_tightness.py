"""How tight the lower bound is: the old bound (free-copy critical path, total work), the
new one (critical path with communication, total work, busy windows) and the best step
time found.

    python bench/bound_tightness.py [--models rnnlm,nmt_2layer,...]
                                    [--machines haswell_k40x4,...]
                                    [--placers bench/results/placers_2026-11-23d_vm-2core.json]
                                    [--out bench/results/bound_tightness_<date>_vm.txt]

For each (model, machine), with the training graph traced as ``bench/placers.py`` traces
it: the old bound (``max(free-copy chain, work)``), the new one (``lower_bound``: ``max(
chain with communication, work, busy windows)``), which term binds, and each term; the
best single-device step time on a device whose memory holds the model, simulated now
(``single``: an upper bound on the optimum where one fits); the best step time over the
methods of the ``--placers`` results where that file has the row; and best/old and
best/new, ``best`` the lesser of the two. No placer runs here (``bench/placers.py`` is
the heavy benchmark); the time ``lower_bound`` takes is reported (quote it with the load
average, printed at the start and the end).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time

import numpy as np
from report import load_average

import simplace
from simplace import zoo
from simplace.sim import critical_path_s, lower_bound, sim_inputs, simulate
from simplace.sim.bounds import chain_bound_s, window_bound_s, work_bound_s

MODELS = "rnnlm,nmt_2layer,nmt_4layer,inception_v3,bert_base,resnet50,transformer"
MACHINES = "haswell_k40x4,cpu_h100x4_nvlink,hsdag_cpu_gpu"
PLACERS = "bench/results/placers_2026-11-23d_vm-2core.json"


def old_chain_s(graph, inp) -> float:
    """The chain term ``lower_bound`` had before: each op at its fastest device, free
    copies, plus the least first dispatch and launch."""
    no_inputs = np.diff(graph.in_edges[0]) == 0
    t = inp.op_time_s + inp.op_unfused_s * no_inputs[:, None]
    return critical_path_s(graph, t.min(axis=1)) + float((inp.dispatch_s + inp.launch_s).min())


def best_found(path: str) -> dict:
    """(model, machine) -> (step time, method, the file's lower bound): the fastest
    placement that fits memory."""
    best = {}
    if not path or not os.path.exists(path):
        return best
    with open(path) as f:
        for r in json.load(f):
            key = (r["model"], r["machine"])
            if r.get("oom") or not r.get("step_time_s"):
                continue
            if key not in best or r["step_time_s"] < best[key][0]:
                best[key] = (r["step_time_s"], r["method"], r.get("lower_bound_s"))
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--machines", default=MACHINES)
    ap.add_argument("--placers", default=PLACERS,
                    help="bench/placers.py JSON whose best step time per row is compared")
    ap.add_argument("--out", default=None, help="text file for the table (default: "
                    "bench/results/bound_tightness_<date>_vm.txt)")
    args = ap.parse_args()
    out = args.out or f"bench/results/bound_tightness_{datetime.date.today()}_vm.txt"
    found = best_found(args.placers)
    lines = [f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
             f"{time.strftime('%Y-%m-%d %H:%M')}, load average {load_average()}",
             f"best found: {args.placers}", ""]
    head = (f"{'model':12s} {'machine':18s} {'ops':>6s} {'old ms':>9s} {'new ms':>9s} "
            f"{'binds':>6s} {'chain0':>9s} {'chain':>9s} {'work':>9s} {'window':>9s} "
            f"{'single':>9s} "
            f"{'found ms':>9s} {'by':>10s} {'best/old':>8s} {'best/new':>8s} {'lb s':>5s}")
    lines += [head, "-" * len(head)]
    print("\n".join(lines), flush=True)
    for model in args.models.split(","):
        fn, ex = zoo.get(model, training=True, small=False)
        graph = simplace.trace(fn, *ex, name=model)
        for machine in args.machines.split(","):
            cm = simplace.CostModel.load(machine)
            inp = sim_inputs(graph, cm)
            t0 = time.perf_counter()
            new = lower_bound(graph, inp)
            took = time.perf_counter() - t0
            chain, work = chain_bound_s(graph, inp), work_bound_s(graph, inp)
            window = window_bound_s(graph, inp)
            top = max(chain, work, window)  # the first term within rounding of it binds
            binds = next(name for v, name in ((chain, "chain"), (work, "work"),
                                              (window, "window")) if v >= top * (1 - 1e-6))
            chain0 = old_chain_s(graph, inp)
            old = max(chain0, work)
            alone = [simulate(graph, inp, np.full(graph.num_ops, d, np.int32))
                     for d in range(inp.num_devices)]
            single = min((r.step_time_s for r in alone if not r.oom), default=np.inf)
            step, method, file_bound = found.get((model, machine), (np.inf, "-", None))
            if file_bound is not None and not np.isclose(file_bound, old, rtol=1e-9):
                # The file's bound (the old one, then) differs from the old bound now: the
                # graph or the cost model changed since; its step time is not comparable.
                method = f"{method}*"
                best = single
            else:
                best = min(step, single)
            ms = 1e3
            line = (f"{model:12s} {machine:18s} {graph.num_ops:6d} {old * ms:9.2f} "
                    f"{new * ms:9.2f} {binds:>6s} "
                    f"{chain0 * ms:9.2f} {chain * ms:9.2f} {work * ms:9.2f} {window * ms:9.2f} "
                    f"{single * ms:9.2f} {step * ms:9.2f} {method:>10s} "
                    f"{_ratio(best, old)} {_ratio(best, new)} {took:5.2f}")
            print(line, flush=True)
            lines.append(line)
    tail = ["",
            "old = max(chain0, work), the bound before: chain0 is the free-copy critical",
            "  path (each op at its fastest device) plus the least dispatch and launch.",
            "chain: the critical path with communication (sim.bounds.chain_tables);",
            "  window: the busy-window bound (window_bound_s); new = max(chain, work,",
            "  window) = lower_bound; binds: the term that gives it.",
            "single: the best one-device placement that fits memory, simulated now (inf: the",
            "  model fits on no single device); found: the best over the",
            "  methods of the placers file (inf where it has no row; * where the file's",
            "  bound is not the old bound recomputed now: the cost model or graph changed",
            "  since, so that step time is left out of best); best = min(single, found).",
            "lb s: seconds lower_bound took (the first call imports scipy).",
            f"load average at the end: {load_average()}"]
    print("\n".join(tail))
    with open(out, "w") as f:
        f.write("\n".join(lines + tail) + "\n")
    print(f"wrote {out}")


def _ratio(best: float, bound: float) -> str:
    """``best / bound`` as ``1.52x``, or ``-`` where no placement that fits is known."""
    return f"{best / bound:7.2f}x" if np.isfinite(best) else f"{'-':>8s}"



if __name__ == "__main__":
    main()

"""Fidelity of the simulator on this machine: predicted vs measured step times.

    PYTHONPATH=. python bench/fidelity.py [--cost-model cpu_vm2core_x4]
        [--models mlp,tiny_cnn,rnnlm] [--per-model 24] [--out-dir bench/results]

For each model (zoo, small sizes, training step) it gathers at least ``--per-model``
distinct placements on the cost model's devices (single device, every heuristic and
partitioner, RL and local search when they run, random runs of ops and fully random
placements), runs each for real (``simplace.execute``, timing harness) and compares
with the simulator. Records are split in half per model (seeded); drift corrections
are fitted on one half of all models together and MAPE and Kendall tau are reported on
the other half, before and after the correction. Fake CPU devices share the host's
cores, and other jobs on the machine add noise: quote the machine and its load.
"""

import argparse
import datetime
import json
import os
import platform
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import numpy as np  # noqa: E402

import simplace  # noqa: E402
from simplace import zoo  # noqa: E402
from simplace.execute import prepare  # noqa: E402
from simplace.validate import (  # noqa: E402
    fit_drift,
    kendall_tau,
    mape,
    split_records,
    validate,
)

HEURISTICS = ("single", "expert", "heft", "m_etf", "m_sct", "m_topo", "metis", "scotch")
SEARCH = ("rl-gnn", "local")


def candidates(graph, cost_model, n: int, seed: int, search_budget_s: float, log):
    """[(label, method, assignment)]: distinct placements, at least ``n`` of them."""
    m, d = graph.num_ops, cost_model.num_devices
    out, seen = [], set()

    def add(label, method, p):
        p = np.asarray(p, dtype=np.int32)
        if p.tobytes() not in seen:
            seen.add(p.tobytes())
            out.append((label, method, p))

    for k in range(d):
        add(f"single:{k}", "single", np.full(m, k))
    for meth in HEURISTICS + SEARCH:
        t = time.perf_counter()
        try:
            res = simplace.optimize(graph, cost_model, meth, seed=seed,
                                    budget_s=search_budget_s if meth in SEARCH else None)
        except Exception as err:  # a method that fails here is reported, not fatal
            log(f"    {meth}: failed ({type(err).__name__}: {str(err)[:80]})")
            continue
        add(meth, meth, res.placement)
        log(f"    {meth}: {res.step_time_s * 1e3:.3f} ms predicted "
            f"({time.perf_counter() - t:.1f} s)")
    rng = np.random.default_rng(seed)
    k = 0
    while len(out) < n:
        k += 1
        if k % 4 == 0:  # every op on a random device: one segment per op or so
            p = rng.integers(0, d, m)
            add(f"random-ops#{k}", "random", p)
        else:  # a few random runs of ops, like a coarse manual split
            runs = int(rng.integers(2, 12))
            cuts = np.sort(rng.choice(np.arange(1, m), min(m - 1, runs), replace=False))
            p = np.full(m, rng.integers(d))
            for c in cuts:
                p[c:] = rng.integers(d)
            add(f"random-runs#{k}", "random", p)
    return out


def summarize(records, graphs, cm_before, cm_after):
    from simplace.sim import simulate

    meas = np.array([r["measured_step_time_s"] for r in records])
    pb = np.array([simulate(graphs[r["graph_hash"]], cm_before, np.asarray(r["assignment"]))
                   .step_time_s for r in records])
    pa = np.array([simulate(graphs[r["graph_hash"]], cm_after, np.asarray(r["assignment"]))
                   .step_time_s for r in records])
    return {"n": len(records), "mape_before": mape(pb, meas), "mape_after": mape(pa, meas),
            "tau_before": kendall_tau(pb, meas), "tau_after": kendall_tau(pa, meas)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cost-model", default="cpu_vm2core_x4")
    ap.add_argument("--models", default="mlp,tiny_cnn,rnnlm")
    ap.add_argument("--per-model", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--search-budget-s", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--timing-budget-s", type=float, default=1.0)
    ap.add_argument("--transfers", default="producer", choices=("segment", "producer"),
                    help="how the executor moves tensors (see Program.place)")
    ap.add_argument("--note", default="", help="a remark for the table (machine load...)")
    ap.add_argument("--out-dir", default="bench/results")
    args = ap.parse_args()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    t_start = time.perf_counter()
    cm = simplace.CostModel.load(args.cost_model)
    if not cm.corrections.is_identity:
        log(f"note: {cm.name} carries drift corrections; fidelity is measured against the "
            "uncorrected model")
        cm = cm.with_corrections(simplace.Corrections.identity(cm.num_devices))
    timing = {"warmup": 2, "min_repeats": args.repeats, "max_repeats": 50,
              "budget_s": args.timing_budget_s}
    records, graphs, per_model_rows = [], {}, {}
    for name in args.models.split(","):
        log(f"== {name}")
        fn, fargs = zoo.get(name, small=True, abstract=False, training=True)
        program = prepare(fn, fargs, name=f"{name}/train/small")
        g = program.graph
        graphs[g.hash] = g
        cands = candidates(g, cm, args.per_model, args.seed, args.search_budget_s, log)
        rep = validate(g, cm, [c[2] for c in cands], program=program, args=fargs,
                       labels=[c[0] for c in cands], methods=[c[1] for c in cands],
                       timing=timing, transfers=args.transfers,
                       progress=lambda s: log("    " + s))
        print(rep.table(), flush=True)
        records += rep.records
        per_model_rows[name] = rep
    fit, held = split_records(records, 0.5, seed=args.seed)
    t = time.perf_counter()
    res = fit_drift(fit, graphs, cm, held_out=held, note="bench/fidelity.py")
    fit_s = time.perf_counter() - t
    cm_after = res.cost_model
    rows = {}
    for name, rep in per_model_rows.items():
        h = rep.records[0]["graph_hash"]
        rows[name] = {"all": summarize(rep.records, graphs, cm, cm_after),
                      "held_out": summarize([r for r in held if r["graph_hash"] == h],
                                            graphs, cm, cm_after)}
    overall = {"fitted": res.fit, "held_out": res.held_out}

    host = platform.node()
    import jax

    lines = [f"fidelity on {host} ({platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores), cost model {args.cost_model}, JAX {jax.__version__}, "
             f"{args.per_model}+ placements per model, transfers={args.transfers}"
             + (f"; {args.note}" if args.note else ""),
             "drift corrections fitted on half of the records (all models), errors on the "
             "held-out half:",
             f"{'model':<12} {'n held':>6} {'MAPE before':>11} {'MAPE after':>10} "
             f"{'tau before':>10} {'tau after':>9}   (all records: MAPE before, tau before)"]
    for name, r in rows.items():
        h, a = r["held_out"], r["all"]
        lines.append(f"{name:<12} {h['n']:>6} {100 * h['mape_before']:>10.1f}% "
                     f"{100 * h['mape_after']:>9.1f}% {h['tau_before']:>10.2f} "
                     f"{h['tau_after']:>9.2f}   ({100 * a['mape_before']:.1f}%, "
                     f"{a['tau_before']:.2f})")
    ho = res.held_out
    lines.append(f"{'all models':<12} {ho['n']:>6} {100 * ho['mape_before']:>10.1f}% "
                 f"{100 * ho['mape_after']:>9.1f}% {ho['tau_before']:>10.2f} "
                 f"{ho['tau_after']:>9.2f}   (tau pooled over models)")
    lines.append("fit: " + res.summary().replace("\n", "\n     "))
    lines.append(f"drift fit {fit_s:.1f} s; whole benchmark {time.perf_counter() - t_start:.0f} s")
    text = "\n".join(lines)
    print(text)
    os.makedirs(args.out_dir, exist_ok=True)
    stem = os.path.join(args.out_dir, f"fidelity_{datetime.date.today()}_{host}"
                                      f"{'' if args.transfers == 'producer' else '_segment'}")
    with open(stem + ".json", "w") as f:
        json.dump({"host": host, "cost_model": args.cost_model, "args": vars(args),
                   "per_model": rows, "overall": overall,
                   "corrections": res.corrections.to_dict(), "records": records},
                  f, indent=1, default=float)
    with open(stem + ".txt", "w") as f:
        f.write(text + "\n")
    print(f"written {stem}.json and .txt")


if __name__ == "__main__":
    main()

"""Fidelity of the simulator on this machine: predicted vs measured step times.

    PYTHONPATH=. python bench/fidelity.py [--cost-model cpu_vm2core_x4]
        [--models mlp,tiny_cnn,rnnlm] [--per-model 24] [--out-dir bench/results]

For each model (zoo, small sizes, training step) it gathers at least ``--per-model``
(>= 20) distinct placements on the cost model's devices: every single device, every
heuristic and partitioner, local search and an RL placer (rl-gnn, a few seconds; a
method that fails is logged), random runs of ops (a coarse manual split) and fully
random placements (about one segment per op). Each runs for real
(``simplace.validate.executor``, timing harness) and is compared with the simulator. Records are
split in half per model (seeded); drift corrections are fitted on one half of all
models together and MAPE and Kendall tau are reported on the other half for the
**raw** model (the loaded model without any drift corrections, whatever corrections
its file carries) and the **corrected** one (the fit), per model and overall; the
loaded model's own corrections, if any, get a line too. The JSON records carry, per
placement, the executor's and the simulator's segment and transfer counts. Fake CPU
devices share the host's cores, and other jobs on the machine add noise: quote the
machine and its load.
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
from simplace.placers import methods  # noqa: E402
from simplace.validate import (  # noqa: E402
    fit_drift,
    kendall_tau,
    mape,
    raw_model,
    split_records,
    validate,
)
from simplace.validate.executor import prepare  # noqa: E402

# Searches get --search-budget-s each; 'exact' (brute force) does not scale to these
# graphs; the other RL placers train the same way as rl-gnn.
SEARCH = ("local", "rl-gnn")
SKIP = ("exact", "rl-seq2seq", "rl-hierarchical")
MIN_PER_MODEL = 20
MIN_RANDOM = 2  # at least this many random-runs and random-ops placements per model


def heuristics() -> list[str]:
    """Every registered method but the searches and the ones skipped."""
    return [m for m in methods() if m not in SEARCH and m not in SKIP]


def candidates(graph, cost_model, n: int, seed: int, search_budget_s: float, log,
               random_ops: bool = True, methods_: list[str] | None = None):
    """``([(label, method, assignment)], {method: label})``: distinct placements, at
    least ``n`` of them (when the graph has that many), including at least
    ``MIN_RANDOM`` of each random kind; and, for each method whose placement was
    already listed, the label of that placement (it is measured once)."""
    m, d = graph.num_ops, cost_model.num_devices
    out, seen, same_as = [], {}, {}

    def add(label, method, p):
        p = np.asarray(p, dtype=np.int32)
        if p.tobytes() in seen:
            same_as[method] = seen[p.tobytes()]
            return False
        seen[p.tobytes()] = label
        out.append((label, method, p))
        return True

    for k in range(d):
        add(f"single:{k}", "single", np.full(m, k))
    for meth in methods_ if methods_ is not None else heuristics() + list(SEARCH):
        t = time.perf_counter()
        try:
            res = simplace.optimize(graph, cost_model, meth, seed=seed,
                                    budget_s=search_budget_s if meth in SEARCH else None)
        except Exception as err:  # a method that fails here is reported, not fatal
            log(f"    {meth}: failed ({type(err).__name__}: {str(err)[:120]})")
            continue
        new = add(meth, meth, res.placement)
        log(f"    {meth}: {res.step_time_s * 1e3:.3f} ms predicted "
            f"({time.perf_counter() - t:.1f} s)"
            + ("" if new else f", the placement of {same_as[meth]}"))
    rng = np.random.default_rng(seed)
    count = {"random-ops": 0, "random-runs": 0} if random_ops else {"random-runs": 0}
    k = 0
    while (len(out) < n or min(count.values()) < MIN_RANDOM) and k < 100 * max(n, 1):
        k += 1
        if random_ops and k % 4 == 0:  # every op on a random device: ~one segment per op
            kind, p = "random-ops", rng.integers(0, d, m)
        else:  # a few random runs of ops, like a coarse manual split
            kind = "random-runs"
            runs = int(rng.integers(2, 12))
            cuts = np.sort(rng.choice(np.arange(1, m), min(m - 1, runs), replace=False))
            p = np.full(m, rng.integers(d))
            for c in cuts:
                p[c:] = rng.integers(d)
        if add(f"{kind}#{k}", kind, p):
            count[kind] += 1
    same_as = {k: v for k, v in same_as.items() if not k.startswith("random")}
    if len(out) < n:
        log(f"    only {len(out)} distinct placements found (asked for {n})")
    return out, same_as


def predictions(records, graphs, cost_model) -> np.ndarray:
    from simplace.sim import simulate

    return np.array([simulate(graphs[r["graph_hash"]], cost_model,
                              np.asarray(r["assignment"])).step_time_s for r in records])


def scores(records, graphs, models: dict) -> dict:
    """``{"n", "mape_<kind>", "tau_<kind>"}`` for each named model (raw, corrected...)."""
    meas = np.array([r["measured_step_time_s"] for r in records])
    out = {"n": len(records)}
    for kind, cm in models.items():
        pred = predictions(records, graphs, cm) if len(records) else np.zeros(0)
        out[f"mape_{kind}"] = mape(pred, meas)
        out[f"tau_{kind}"] = kendall_tau(pred, meas)
    return out


def per_model_correction(fit, held, graphs, cost_model) -> dict:
    """Drift corrected as ``simplace validate`` corrects it in use: for each model (graph)
    alone, fitted on its own records of ``fit`` and scored on its records of ``held``.
    ``{"by_model": {graph name: {"n", "mape", "tau"}}, "n", "mape", "tau"}``, the last
    three over every held-out record (tau pooled over models)."""
    preds, meas, out = [], [], {}
    for h in dict.fromkeys(r["graph_hash"] for r in held):
        fh = [r for r in fit if r["graph_hash"] == h]
        hh = [r for r in held if r["graph_hash"] == h]
        res = fit_drift(fh, graphs, cost_model, held_out=hh, note="per model")
        p = predictions(hh, graphs, res.cost_model)
        m = np.array([r["measured_step_time_s"] for r in hh])
        out[hh[0]["graph_name"].split("/")[0]] = {"n": len(hh), "mape": mape(p, m),
                                                  "tau": kendall_tau(p, m)}
        preds.append(p)
        meas.append(m)
    p, m = np.concatenate(preds), np.concatenate(meas)
    return {"by_model": out, "n": len(m), "mape": mape(p, m), "tau": kendall_tau(p, m)}


def noise_floor(validations, graphs, cost_model) -> dict:
    """How far validations of the same placements differ: the mean over ordered pairs of
    validations of their MAPE (one taken as the truth, the other as the prediction),
    the per-placement spread (max / min measured), the raw model's MAPE against each,
    and the spread of other estimators of a step time from the same samples (25th
    percentile, minimum)."""
    meas = np.array([[r["measured_step_time_s"] for r in v] for v in validations])
    k = len(meas)
    pairs = [mape(meas[i], meas[j]) for i in range(k) for j in range(k) if i != j]
    pred = predictions(validations[0], graphs, cost_model)

    def spread(x):
        return x.max(axis=0) / x.min(axis=0)

    q25 = np.array([[np.percentile(r["timing"]["samples_s"], 25) for r in v]
                    for v in validations])
    mins = np.array([[min(r["timing"]["samples_s"]) for r in v] for v in validations])
    return {"placements": int(meas.shape[1]), "validations": k,
            "mape_between": float(np.mean(pairs)), "mape_between_max": float(np.max(pairs)),
            "spread_median": float(np.median(spread(meas))),
            "spread_max": float(np.max(spread(meas))),
            "spread_median_q25": float(np.median(spread(q25))),
            "spread_median_min": float(np.median(spread(mins))),
            "mape_raw_each": [float(mape(pred, m)) for m in meas]}


def per_model_line(pm: dict) -> str:
    """The per-model correction (``per_model_correction``) as one line."""
    each = ", ".join(f"{k} {_pct(v['mape'])}" for k, v in pm["by_model"].items())
    return (f"corrected per model (as `simplace validate` corrects the model it optimizes: "
            f"drift fitted on that model's records of the fitted half): {each}; all models "
            f"{_pct(pm['mape'])}, tau {_tau(pm['tau'])} (n {pm['n']} held out)")


def _pct(x) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{100 * x:.1f}%"


def _tau(x) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cost-model", default="cpu_vm2core_x4")
    ap.add_argument("--models", default="mlp,tiny_cnn,rnnlm")
    ap.add_argument("--per-model", type=int, default=24,
                    help=f"placements per model, at least {MIN_PER_MODEL} (default 24)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--search-budget-s", type=float, default=5.0,
                    help="budget of local search and of rl-gnn (default 5 s)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--timing-budget-s", type=float, default=1.0)
    ap.add_argument("--transfers", default="producer", choices=("segment", "producer"),
                    help="how the executor moves tensors (see Program.place)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved timing rounds over a model's placements (default 3)")
    ap.add_argument("--noise-repeats", type=int, default=0,
                    help="validate each model's placements this many more times and report "
                         "how far the measurements of the same placements differ (the MAPE "
                         "that noise alone makes; default 0: off)")
    ap.add_argument("--note", default="", help="a remark for the table (machine load...)")
    ap.add_argument("--out-dir", default="bench/results")
    args = ap.parse_args()
    if args.per_model < MIN_PER_MODEL:
        ap.error(f"--per-model must be at least {MIN_PER_MODEL}, got {args.per_model}.")

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    t_start = time.perf_counter()
    cm = simplace.CostModel.load(args.cost_model)
    cm_raw = raw_model(cm)
    loaded_corrected = cm_raw is not cm
    if loaded_corrected:
        log(f"note: {cm.name} carries drift corrections ({len(cm.corrections.history)} in "
            "its history): 'raw' below is the model without them, 'loaded' with them")
    timing = {"warmup": 2, "min_repeats": args.repeats, "max_repeats": 50,
              "budget_s": args.timing_budget_s}
    records, graphs, per_model_reps = [], {}, {}
    repeats: dict[str, list[list[dict]]] = {}  # model -> validations of the same placements
    load_start = os.getloadavg()
    for name in args.models.split(","):
        log(f"== {name}")
        fn, fargs = zoo.get(name, small=True, abstract=False, training=True)
        program = prepare(fn, fargs, name=f"{name}/train/small")
        g = program.graph
        graphs[g.hash] = g
        cands, same_as = candidates(g, cm, args.per_model, args.seed, args.search_budget_s,
                                    log)
        # validated against the loaded model: the table shows raw and its corrections
        rep = validate(g, cm, [c[2] for c in cands], program=program, args=fargs,
                       labels=[c[0] for c in cands], methods=[c[1] for c in cands],
                       timing=timing, transfers=args.transfers, rounds=args.rounds,
                       progress=lambda s: log("    " + s))
        print(rep.table(), flush=True)
        records += rep.records
        per_model_reps[name] = (rep, same_as)
        for k in range(args.noise_repeats):
            log(f"    noise: validating the same placements again ({k + 1}/"
                f"{args.noise_repeats})")
            again = validate(g, cm, [c[2] for c in cands], program=program, args=fargs,
                             labels=[c[0] for c in cands], methods=[c[1] for c in cands],
                             timing=timing, transfers=args.transfers, rounds=args.rounds)
            repeats.setdefault(name, [rep.records]).append(again.records)
    fit, held = split_records(records, 0.5, seed=args.seed)
    t = time.perf_counter()
    # fitted on the raw model, from identity: the loaded corrections play no part
    res = fit_drift(fit, graphs, cm_raw, held_out=held, note="bench/fidelity.py")
    fit_s = time.perf_counter() - t
    models = {"raw": cm_raw, "corrected": res.cost_model}
    if loaded_corrected:
        models["loaded"] = cm
    rows = {}
    for name, (rep, same_as) in per_model_reps.items():
        h = rep.records[0]["graph_hash"]
        segs = [r["num_segments"] for r in rep.records]
        moves = [r["num_transfers"] for r in rep.records]
        rows[name] = {"all": scores(rep.records, graphs, models),
                      "held_out": scores([r for r in held if r["graph_hash"] == h], graphs,
                                         models),
                      "placements": len(rep.records),
                      "methods": sorted({r["method"] for r in rep.records}),
                      "same_placement_as": same_as,
                      "segments": [min(segs), max(segs)], "transfers": [min(moves), max(moves)],
                      "sim_matches_executor": all(
                          (r["num_segments"], r["num_transfers"])
                          == (r["sim_num_segments"], r["sim_num_transfers"])
                          for r in rep.records)}
    overall = {"fitted": res.fit, "held_out": res.held_out,
               "held_out_all_models": scores(held, graphs, models),
               "corrected_per_model": per_model_correction(fit, held, graphs, cm_raw)}
    noise = {name: noise_floor(reps, graphs, cm_raw) for name, reps in repeats.items()}
    load_end = os.getloadavg()

    host = platform.node()
    import jax

    lines = [f"fidelity on {host} ({platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores), cost model {args.cost_model}, JAX {jax.__version__}, "
             f"{args.per_model}+ placements per model, transfers={args.transfers}, "
             f"{args.rounds} timing rounds; load average (1, 5, 15 min) at the start "
             + " ".join(f"{x:.2f}" for x in load_start) + ", at the end "
             + " ".join(f"{x:.2f}" for x in load_end)
             + (f"; {args.note}" if args.note else ""),
             "raw: the cost model without drift corrections; corrected: drift corrections "
             "fitted on half of the records (all models); errors on the held-out half"
             + ("; loaded: the corrections the model file carries" if loaded_corrected
                else ""),
             f"{'model':<12} {'model as':<10} {'n held':>6} {'MAPE':>8} {'tau':>6}   "
             f"(all records: MAPE, tau)"]
    kinds = list(models)
    for name, r in rows.items():
        h, a = r["held_out"], r["all"]
        for kind in kinds:
            lines.append(f"{name:<12} {kind:<10} {h['n']:>6} {_pct(h[f'mape_{kind}']):>8} "
                         f"{_tau(h[f'tau_{kind}']):>6}   ({_pct(a[f'mape_{kind}'])}, "
                         f"{_tau(a[f'tau_{kind}'])})")
    ho = overall["held_out_all_models"]
    for kind in kinds:
        lines.append(f"{'all models':<12} {kind:<10} {ho['n']:>6} "
                     f"{_pct(ho[f'mape_{kind}']):>8} {_tau(ho[f'tau_{kind}']):>6}   "
                     "(tau pooled over models)")
    lines.append(per_model_line(overall["corrected_per_model"]))
    for name, r in rows.items():
        dup = ", ".join(f"{k} = {v}" for k, v in r["same_placement_as"].items())
        lines.append(f"{name}: {r['placements']} placements ({', '.join(r['methods'])}"
                     f"{'; ' + dup if dup else ''}); "
                     f"segments {r['segments'][0]}-{r['segments'][1]}, transfers "
                     f"{r['transfers'][0]}-{r['transfers'][1]}"
                     + ("" if r["sim_matches_executor"] else
                        "; the simulator's segment/transfer counts differ from the executor's"
                        " on some placements"))
    lines.append("fit: " + res.summary().replace("\n", "\n     "))
    for name, nz in noise.items():
        lines.append(
            f"noise, {name}: the same {nz['placements']} placements validated "
            f"{nz['validations']} times: MAPE between validations {_pct(nz['mape_between'])} "
            f"(max {_pct(nz['mape_between_max'])}), median spread (max/min) "
            f"{nz['spread_median']:.2f}, max {nz['spread_max']:.2f}; raw MAPE against each "
            "validation " + ", ".join(_pct(x) for x in nz["mape_raw_each"])
            + "; spread of other estimators: q25 "
            f"{nz['spread_median_q25']:.2f}, min {nz['spread_median_min']:.2f}")
    lines.append(f"drift fit {fit_s:.1f} s; whole benchmark {time.perf_counter() - t_start:.0f} s")
    text = "\n".join(lines)
    print(text)
    os.makedirs(args.out_dir, exist_ok=True)
    # A new name per run (fidelity_DATE_HOST, then DATEb, DATEc...): a run must not
    # write over the results an earlier one left (the README quotes them).
    for suffix in ["", *"bcdefghijklmnopqrstuvwxyz"]:
        stem = os.path.join(args.out_dir, f"fidelity_{datetime.date.today()}{suffix}_{host}"
                                          f"{'' if args.transfers == 'producer' else '_segment'}")
        if not os.path.exists(stem + ".json") and not os.path.exists(stem + ".txt"):
            break
    with open(stem + ".json", "w") as f:
        json.dump({"host": host, "cost_model": args.cost_model, "args": vars(args),
                   "loaded_corrections": cm.corrections.to_dict() if loaded_corrected
                   else None,
                   "per_model": rows, "overall": overall, "noise": noise,
                   "load_average_start": load_start, "load_average_end": load_end,
                   "noise_records": repeats,
                   "corrections": res.corrections.to_dict(), "records": records},
                  f, indent=1, default=float)
    with open(stem + ".txt", "w") as f:
        f.write(text + "\n")
    print(f"written {stem}.json and .txt")


if __name__ == "__main__":
    main()

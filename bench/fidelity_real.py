"""Fidelity at real sizes: predicted vs measured step times, with and without profiles.

    PYTHONPATH=. python bench/fidelity_real.py [--cost-model cpu_vm2core_x4]
        [--models resnet50:2,bert_base:1,transformer:2,rnnlm:4] [--placements 8]
        [--search-budget-s 10] [--out-dir bench/results] [--tag vm]

Each model (``NAME:BATCH``: the zoo model's training step at that batch, or a
``file.py:factory:BATCH`` such as ``bench/data/unseen_models.py:mixer:16``, models the
calibration never saw; ``:0`` or no batch: the default batch, the size on a GPU host;
on a 2-core VM pick batches where one step on one device takes 0.2-3 s) is traced,
**profiled** on this machine (``simplace.profile``: its own ops at their real shapes,
timed in chunks), and at least ``--placements`` distinct placements are gathered: one
single device per kind (devices of one kind run the same code), every heuristic
and partitioner, ``local`` and ``rl-gnn`` (planned against the profiled model, as
``optimize`` plans once a profile exists), and random runs of ops. Each runs for real
(``simplace.validate``) and is compared, raw (no drift corrections), with the
calibration alone and with the profile.

Reported per model and overall: MAPE and Kendall tau of both predictions, the time the
profile took beside the time of one step, and the pick: the placement the optimizer
would choose (best predicted with the profile) against the best measured one.
"""

import argparse
import datetime
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from fidelity import SEARCH, candidates, heuristics  # noqa: E402

import simplace  # noqa: E402
from simplace.models import load_function  # noqa: E402
from simplace.sim import simulate  # noqa: E402
from simplace.validate import kendall_tau, mape, raw_model, validate  # noqa: E402
from simplace.validate.executor import prepare  # noqa: E402

VM_MODELS = "resnet50:2,bert_base:1,transformer:2,rnnlm:4"


def _spec(s: str) -> tuple[str, int | None]:
    """``NAME[:BATCH]`` (a zoo name, or ``file.py:factory``) -> (model, batch or None)."""
    head, _, tail = s.rpartition(":")
    if head and tail.isdigit():
        return head, int(tail) or None
    return s, None


def run_model(name, batch, cm_raw, args, log) -> dict:
    """Profile, plan, validate one model; its row of the table."""
    log(f"== {name} (batch {batch or 'default'})")
    spec = name
    fn, fargs = load_function(name, batch=batch, abstract=False, training=True)
    name = name.rsplit(":", 1)[-1]  # a factory's name
    t0 = time.perf_counter()
    program = prepare(fn, fargs, name=f"{name}/train")
    g = program.graph
    log(f"    traced {g.num_ops} ops, {g.flops.sum() / 1e9:.1f} GFLOP in "
        f"{time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    prof = simplace.profile(None, fargs, cm_raw, program=program, chunks=args.chunks,
                            progress=sys.stderr)
    profile_s = time.perf_counter() - t0
    cm_prof = cm_raw.with_profile(prof)
    log(f"    profiled in {profile_s:.1f} s ({prof.num_estimated} chunks estimated)")
    methods = [m for m in heuristics() if m != "single"] + list(SEARCH)
    # candidates() lists every single device first: ask for the ones dropped below too
    cands, same_as = candidates(g, cm_prof, args.placements + cm_raw.num_devices - 1,
                                args.seed, args.search_budget_s, log, random_ops=False,
                                methods_=methods)
    # one single device per kind (cpu, gpu): devices of one kind run the same code
    first_of_kind = {}
    for k, dev in enumerate(cm_raw.devices):
        first_of_kind.setdefault(dev.kind, k)
    keep = [f"single:{k}" for k in first_of_kind.values()]
    cands = [c for c in cands if not c[0].startswith("single:")]
    cands[:0] = [(lab, "single", np.full(g.num_ops, int(lab[7:]), np.int32)) for lab in keep]
    seen, uniq = set(), []
    for c in cands:
        if c[2].tobytes() not in seen:
            seen.add(c[2].tobytes())
            uniq.append(c)
    timing = {"warmup": 1, "min_repeats": args.repeats, "max_repeats": args.repeats,
              "budget_s": args.timing_budget_s}
    t0 = time.perf_counter()
    rep = validate(g, cm_raw, [c[2] for c in uniq], program=program, args=fargs,
                   labels=[c[0] for c in uniq], methods=[c[1] for c in uniq], timing=timing,
                   rounds=args.rounds, progress=lambda s: log("    " + s))
    validate_s = time.perf_counter() - t0
    meas = np.array([r["measured_step_time_s"] for r in rep.records])
    pred = {kind: np.array([simulate(g, m, np.asarray(r["assignment"])).step_time_s
                            for r in rep.records])
            for kind, m in (("calibration", cm_raw), ("profile", cm_prof))}
    pick = int(np.argmin(pred["profile"]))
    best = int(np.argmin(meas))
    # one step: the fastest single device measured
    one_step = float(min(meas[k] for k, r in enumerate(rep.records) if r["method"] == "single"))
    # For rescoring; named by the run's tag, so that a later run does not overwrite the
    # profiles an earlier run's rows name.
    prof_file = f"profile_{args.tag}_{name}_{g.hash[:12]}.json"
    prof.save(Path(args.out_dir) / prof_file)
    rows = [{"label": r["label"], "method": r["method"], "measured_s": float(meas[k]),
             "assignment": np.asarray(r["assignment"]).tolist(),
             "calibration_s": float(pred["calibration"][k]),
             "profile_s": float(pred["profile"][k]), "segments": r["num_segments"],
             "transfers": r["num_transfers"]} for k, r in enumerate(rep.records)]
    return {"model": name, "spec": spec, "batch": batch, "ops": g.num_ops, "graph_hash": g.hash,
            "profile_wall_s": profile_s, "one_step_s": one_step, "validate_wall_s": validate_s,
            "estimated_chunks": prof.num_estimated, "chunks": len(prof.bounds),
            "segment_s": prof.segment_s("cpu"),
            "profile_file": prof_file,
            "same_placement_as": same_as, "placements": rows,
            **{f"mape_{k}": mape(p, meas) for k, p in pred.items()},
            **{f"tau_{k}": kendall_tau(p, meas) for k, p in pred.items()},
            "pick": rows[pick]["label"], "pick_measured_s": float(meas[pick]),
            "best": rows[best]["label"], "best_measured_s": float(meas[best])}


def rescore(path: Path, cm_raw, log, *, reprofile: bool = False,
            chunks: int = 24) -> list[dict]:
    """The rows of a saved run (``--rescore FILE.json``) predicted again with this cost
    model and the run's own profiles (kept beside it): no hardware. ``reprofile``: each
    model is profiled again here with this checkout (the machine must be the run's),
    written beside the output (``profile_reprofiled_*``), and used instead."""
    from simplace.profile import Profile

    out = []
    for r in json.loads(path.read_text()):
        spec = r.get("spec") or (r["model"] if ":" not in r["model"] and r["model"] in
                                 zoo_names() else f"bench/data/unseen_models.py:{r['model']}")
        fn, fargs = load_function(spec, batch=r["batch"], abstract=not reprofile,
                                  training=True)
        if reprofile:
            program = prepare(fn, fargs, name=f"{r['model']}/train")
            g = program.graph
        else:
            g = simplace.trace(fn, *fargs, name=f"{r['model']}/train")
        if g.hash != r["graph_hash"]:
            log(f"    {r['model']}: traces to another graph here; skipped")
            continue
        if reprofile:
            t0 = time.perf_counter()
            prof = simplace.profile(None, fargs, cm_raw, program=program, chunks=chunks,
                                    progress=sys.stderr)
            r["profile_wall_s"] = time.perf_counter() - t0
            r["profile_file"] = f"profile_reprofiled_{r['model']}_{g.hash[:12]}.json"
            prof.save(path.parent / r["profile_file"])
            log(f"    {r['model']}: profiled again in {r['profile_wall_s']:.1f} s")
            del program
            gc.collect()
        else:
            prof = Profile.load(path.parent / r["profile_file"])
        cm_prof = cm_raw.with_profile(prof)
        meas = np.array([p["measured_s"] for p in r["placements"]])
        for kind, m in (("calibration", cm_raw), ("profile", cm_prof)):
            pred = np.array([simulate(g, m, np.asarray(p["assignment"])).step_time_s
                             for p in r["placements"]])
            for p, v in zip(r["placements"], pred, strict=True):
                p[f"{kind}_s"] = float(v)
            r[f"mape_{kind}"], r[f"tau_{kind}"] = mape(pred, meas), kendall_tau(pred, meas)
        pick = int(np.argmin([p["profile_s"] for p in r["placements"]]))
        r["pick"], r["pick_measured_s"] = r["placements"][pick]["label"], float(meas[pick])
        out.append(r)
    return out


def zoo_names() -> list[str]:
    from simplace import zoo

    return zoo.names()


def _pct(x) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{100 * x:.1f}%"


def table(res: list[dict], head: str) -> list[str]:
    lines = [head, f"{'model':<14} {'n':>3} {'MAPE calib':>10} {'tau':>5} {'MAPE prof':>10} "
             f"{'tau':>5} {'profile':>8} {'1 step':>8} {'pick / best measured':>28}"]
    for r in res:
        lines.append(
            f"{r['model'] + ':' + str(r['batch'] or 'dflt'):<14} {len(r['placements']):>3} "
            f"{_pct(r['mape_calibration']):>10} {r['tau_calibration']:>5.2f} "
            f"{_pct(r['mape_profile']):>10} {r['tau_profile']:>5.2f} "
            f"{r['profile_wall_s']:>7.1f}s {r['one_step_s']:>7.3f}s "
            f"{r['pick']:>12} {r['pick_measured_s'] / r['best_measured_s']:.3f}x of {r['best']}")
    if res:
        meas = np.concatenate([[p["measured_s"] for p in r["placements"]] for r in res])
        for kind in ("calibration", "profile"):
            pred = np.concatenate([[p[f"{kind}_s"] for p in r["placements"]] for r in res])
            taus = [r[f"tau_{kind}"] for r in res]
            lines.append(f"all models, {kind:<11}: MAPE {_pct(mape(pred, meas))}, tau per "
                         f"model {min(taus):.2f}-{max(taus):.2f} (n {len(meas)})")
    for r in res:
        lines.append(f"  {r['model']}: " + ", ".join(
            f"{p['label']} {p['measured_s'] * 1e3:.0f}/{p['calibration_s'] * 1e3:.0f}/"
            f"{p['profile_s'] * 1e3:.0f}" for p in r["placements"])
            + " ms (measured/calibration/profile)")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cost-model", default="cpu_vm2core_x4")
    ap.add_argument("--models", default=VM_MODELS,
                    help=f"NAME:BATCH,... (default {VM_MODELS}; batch 0: the zoo's default)")
    ap.add_argument("--placements", type=int, default=8)
    ap.add_argument("--chunks", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--search-budget-s", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timing-budget-s", type=float, default=5.0)
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--tag", default="vm")
    ap.add_argument("--rescore", default=None, metavar="FILE.json",
                    help="predict a saved run's placements again with --cost-model and its "
                         "profiles (no hardware); writes FILE_rescored_COSTMODEL.txt/.json")
    ap.add_argument("--reprofile", action="store_true",
                    help="with --rescore: profile each model again here with this checkout "
                         "and rescore with those profiles (FILE_reprofiled_COSTMODEL.*)")
    args = ap.parse_args(argv)
    if args.placements < 8:
        ap.error("--placements must be at least 8")

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    cm_raw = raw_model(simplace.CostModel.load(args.cost_model))
    if args.rescore:
        src = Path(args.rescore)
        rows = rescore(src, cm_raw, log, reprofile=args.reprofile, chunks=args.chunks)
        which = ("profiles made again here (load "
                 f"{os.getloadavg()[0]:.2f} at the end): bench/fidelity_real.py --rescore "
                 "--reprofile" if args.reprofile
                 else "profiles: bench/fidelity_real.py --rescore")
        lines = table(rows, f"# {src.name} rescored with {args.cost_model} (raw) and its "
                            + which)
        kind = "reprofiled" if args.reprofile else "rescored"
        stem = src.with_name(f"{src.stem}_{kind}_{args.cost_model}")
        stem.with_suffix(".txt").write_text("\n".join(lines) + "\n")
        stem.with_suffix(".json").write_text(json.dumps(rows, indent=1))
        print("\n".join(lines))
        return 0
    load0 = os.getloadavg()
    t_start = time.perf_counter()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"fidelity_real_{datetime.date.today():%Y-%m-%d}_{args.tag}"
    import jax

    results = []
    for spec in args.models.split(","):
        name, batch = _spec(spec)
        try:
            results.append(run_model(name, batch, cm_raw, args, log))
        except Exception as err:  # noqa: BLE001 - one model failing does not end the run
            log(f"    {name}: failed: {type(err).__name__}: {str(err)[:300]}")
        jax.clear_caches()  # each model's executables: rnnlm's alone filled 24 GB
        gc.collect()
        # written after each model: a long run cut short keeps what it measured
        head = (f"# bench/fidelity_real.py {' '.join(argv or sys.argv[1:])}\n"
                f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
                f"{platform.node()}, {os.cpu_count()} cores, JAX {jax.__version__}, devices "
                f"{', '.join(str(d) for d in jax.devices()[:4])}; cost model "
                f"{args.cost_model} (raw); load {load0[0]:.2f} at the start, "
                f"{os.getloadavg()[0]:.2f} now; {time.perf_counter() - t_start:.0f} s")
        lines = table(results, head)
        (out / f"{stem}.txt").write_text("\n".join(lines) + "\n")
        (out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines), flush=True)
    log(f"wrote {out / stem}.txt and .json")
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())

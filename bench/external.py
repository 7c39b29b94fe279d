"""simplace against other placement systems, on their instances, scored by their rules.

    python bench/external.py [--formats doppler,msr] [--only SUBSTR,...] [--budget-s 60]
                             [--rl] [--seed 0] [--tag vm]
    python bench/external.py --table-of ROWS.json ... [--only ...]   # saved rows' table

For every instance of Doppler (``bench/data/external/doppler``) and of Tarnawski et al.
(``bench/data/external/msr``): every fast method (heuristics, list schedulers,
partitioners; no budget), then ``local`` for ``--budget-s`` seconds starting from all of
them (and, with ``--rl``, ``rl-gnn`` for as long, warm-started), all judged by the
instance's own rules (``simplace.external``: Doppler's event loop; msr's max-load or
latency). Beside them: the other system's baselines as its own code computed them here
(``baselines.json`` in each data folder, written by ``bench/external_*_baselines.py``),
the lower bound, and the issue's verdict per instance:

* Doppler: simplace's best at most HEFT followed by 3,000 steps of simulated annealing,
  and at most the critical-path baseline;
* msr throughput: at most the best of their DP, local search and PipeDream (their local
  search alone where the DP timed out), and strictly below every human-expert split;
* msr latency: at most their greedy heuristic.

Every final placement is checked: it fits the memory caps and keeps the colocation
classes. Writes ``bench/results/external_<date>_<tag>.txt`` and ``.json``; figures are
for the machine it runs on (the load average is printed at the start and the end).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np
from report import load_average, machine_line

from simplace.external import load_instance
from simplace.placers import is_search, methods, optimize
from simplace.sim import lower_bound

DATA = Path(__file__).parent / "data" / "external"
RESULTS = Path(__file__).parent / "results"
# Methods left out: ``exact`` enumerates every placement (D^M).
SKIP = ("exact",)


def instances(formats: list[str], only: list[str]) -> list[tuple[str, Path]]:
    """(format, path) of every instance file in the data folders, in a fixed order."""
    found = []
    if "doppler" in formats:
        found += [("doppler", p) for p in sorted((DATA / "doppler").glob("*.txt"))]
    if "msr" in formats:
        for sub in ("throughput-inputs", "latency-inputs"):
            found += [("msr", p) for p in sorted((DATA / "msr" / sub).rglob("*.json"))]
    if only:
        found = [(f, p) for f, p in found if any(s in str(p) for s in only)]
    return found


def baselines(fmt: str, path: Path) -> dict[str, dict]:
    """{name: {"time_s": seconds or None, "note": str, "target": kind}} of the other
    system's baselines on this instance, from its ``baselines.json``."""
    folder = DATA / fmt
    try:
        with open(folder / "baselines.json") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    from external_baselines import read  # the per-format readers, beside this script

    return read(fmt, data, path, folder)


def run_instance(fmt: str, path: Path, budget_s: float, seed: int, rl: bool) -> dict:
    inst = load_instance(path, fmt)
    graph, cm = inst.graph, inst.cost_model
    ruler = inst.ruler()
    t0 = time.perf_counter()
    rows = []
    fast = [m for m in methods() if not is_search(m) and m not in SKIP]
    for m in fast:
        try:
            rows.append(optimize(graph, cm, m, seed=seed))
        except Exception as err:  # noqa: BLE001 (one failing method must not hide the rest)
            print(f"  {m} failed: {err}", file=sys.stderr)
    starts = [r.placement for r in rows]
    rows.append(optimize(graph, cm, "local", seed=seed, budget_s=budget_s, starts=starts))
    if rl:
        ranked = sorted(rows, key=lambda r: (r.oom, r.step_time_s))
        rows.append(optimize(graph, cm, "rl-gnn", seed=seed, budget_s=budget_s,
                             warm_start=np.stack([r.placement for r in ranked])))
    fitting = [r for r in rows if not r.oom] or rows
    best = min(fitting, key=lambda r: r.step_time_s)
    check = ruler(best.placement[None])
    kept = bool((ruler.project(best.placement) == best.placement).all())
    return {
        "format": fmt, "instance": str(path.relative_to(DATA)), "ops": graph.num_ops,
        "devices": cm.num_devices, "objective": ruler.objective, "ruler": ruler.describe(),
        "lower_bound_s": lower_bound(graph, cm),
        "methods": {r.method: {"time_s": r.step_time_s, "oom": r.oom, "wall_s": r.wall_s}
                    for r in rows},
        "best": {"method": best.method, "time_s": best.step_time_s,
                 "fits": not bool(check.oom[0]), "colocation_kept": kept,
                 "placement": best.placement.tolist()},
        "baselines": baselines(fmt, path), "wall_s": time.perf_counter() - t0,
    }


def rescore(row: dict) -> None:
    """Score the row's best placement again with the ruler as it is now (the rules'
    code may have changed since the run): its time, fit and classes, said if changed."""
    inst = load_instance(DATA / row["instance"], row["format"])
    ruler = inst.ruler(row["objective"])
    p = np.asarray(row["best"]["placement"], dtype=np.int32)
    res = ruler(p[None])
    now = {"time_s": float(res.step_time_s[0]), "fits": not bool(res.oom[0]),
           "colocation_kept": bool((ruler.project(p) == p).all())}
    changed = {k: (row["best"][k], v) for k, v in now.items() if row["best"][k] != v}
    row["best"].update(now)
    if changed:
        row["best"]["rescored"] = {k: list(v) for k, v in changed.items()}


def verdict(row: dict) -> tuple[str, str]:
    """(target, "met" / "MISSED" / "n/a" with the figures) of one row."""
    ours = row["best"]["time_s"]
    # Baselines that ran to the end and whose split keeps the caps (where it can be
    # checked) are targets.
    base = {k: v["time_s"] for k, v in row["baselines"].items()
            if v.get("time_s") and v.get("feasible") is not False}
    if row["format"] == "doppler":
        need = [k for k in base if k.startswith(("heft+sa", "critical_path"))]
        target = "<= HEFT+SA(3000) and <= critical path"
    elif row["objective"] == "throughput":
        best_of = [k for k in ("dp", "local_search", "pipedream") if k in base]
        need = [min(best_of, key=base.get)] if best_of else []
        target = "<= best of DP, local search, PipeDream; < expert"
    else:
        need = [k for k in ("greedy",) if k in base]
        target = "<= greedy"
    if not need:
        return target, "n/a (no baseline recorded)"
    ratios = ", ".join(f"{ours / base[k]:.3f}x {k}" for k in need)
    ok = (all(ours <= base[k] * (1 + 1e-9) for k in need) and row["best"]["fits"]
          and row["best"]["colocation_kept"])
    experts = [k for k in base if k.startswith("expert")]
    if row["objective"] == "throughput" and row["format"] == "msr" and experts:
        ok = ok and all(ours < base[k] for k in experts)
    if experts and row["objective"] == "throughput" and row["format"] == "msr":
        ratios += ", " + ", ".join(f"{ours / base[k]:.3f}x {k}" for k in experts)
    return target, f"{'met' if ok else 'MISSED'} ({ratios})"


def table(rows: list[dict]) -> str:
    out = []
    for row in rows:
        # msr times are milliseconds in the files (seconds in simplace); Doppler's are
        # in its own unit (file units / 1e10), which its ruler reports as seconds.
        unit, name_ = (1e3, "ms") if row["format"] == "msr" else (1.0, "Doppler units")
        target, said = verdict(row)
        out.append(f"\n{row['instance']}  ({row['ops']} ops, {row['devices']} devices, "
                   f"{row['ruler']}; lower bound {row['lower_bound_s'] * unit:.3f}; "
                   f"times in {name_})")
        for name, r in sorted(row["methods"].items(), key=lambda kv: kv[1]["time_s"]):
            mark = "*" if name == row["best"]["method"] else " "
            out.append(f"  {mark} {name:<14} {r['time_s'] * unit:12.4f}"
                       f"{'  OOM' if r['oom'] else ''}   wall {r['wall_s']:6.1f} s")
        for name, b in row["baselines"].items():
            t = b.get("time_s")
            shown = f"{t * unit:12.4f}" if t else "           -"
            out.append(f"    [{name}] {shown}   {b.get('note', '')}")
        out.append(f"  target {target}: {said}; best fits {row['best']['fits']}, "
                   f"classes kept {row['best']['colocation_kept']}"
                   + (f"; rescored by today's ruler: {row['best']['rescored']}"
                      if row["best"].get("rescored") else ""))
    return "\n".join(out)


def markdown(rows: list[dict]) -> str:
    """One line per instance: ours against the targets, for the README."""
    out = ["| instance | ops | devices | simplace (method) | target | ratio | met |",
           "|---|---|---|---|---|---|---|"]
    for row in rows:
        unit = 1e3 if row["format"] == "msr" else 1.0
        target, said = verdict(row)
        ok = said.startswith("met")
        ratios = said[said.find("(") + 1:said.rfind(")")] if "(" in said else said
        out.append(f"| {row['instance'].removesuffix('.json').removesuffix('.txt')} | "
                   f"{row['ops']} | {row['devices']} | {row['best']['time_s'] * unit:.2f} "
                   f"({row['best']['method']}) | {target} | {ratios} | "
                   f"{'yes' if ok else '**no**'} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="doppler,msr")
    ap.add_argument("--only", default="", help="comma-separated substrings of file paths")
    ap.add_argument("--budget-s", type=float, default=60.0, help="per search (local, rl)")
    ap.add_argument("--rl", action="store_true", help="also rl-gnn, warm-started")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="vm")
    ap.add_argument("--table-of", nargs="+", metavar="ROWS.json",
                    help="run nothing: print the table of rows saved by earlier runs")
    ap.add_argument("--markdown", action="store_true",
                    help="with --table-of: one markdown line per instance")
    args = ap.parse_args()
    if args.table_of:
        only = [s for s in args.only.split(",") if s]
        rows = [r for path in args.table_of for r in json.loads(Path(path).read_text())
                if r["format"] in args.formats.split(",")
                and (not only or any(s in r["instance"] for s in only))]
        for r in rows:  # the baselines as the data folders hold them now
            r["baselines"] = baselines(r["format"], DATA / r["instance"])
            rescore(r)
        print(markdown(rows) if args.markdown else table(rows))
        met = sum(verdict(r)[1].startswith("met") for r in rows)
        print(f"targets met on {met} of {len(rows)} instances")
        return
    head = [machine_line(), f"load average at start: {load_average()}",
            f"python bench/external.py {' '.join(sys.argv[1:])}"]
    print("\n".join(head))
    rows = []
    for fmt, path in instances(args.formats.split(","), [s for s in args.only.split(",") if s]):
        print(f"{fmt}: {path.relative_to(DATA)}...", file=sys.stderr, flush=True)
        rows.append(run_instance(fmt, path, args.budget_s, args.seed, args.rl))
        print(table(rows[-1:]), flush=True)
    tail = f"load average at end: {load_average()}"
    print(tail)
    met = sum(verdict(r)[1].startswith("met") for r in rows)
    summary = f"targets met on {met} of {len(rows)} instances"
    print(summary)
    stem = RESULTS / f"external_{datetime.date.today().isoformat()}_{args.tag}"
    stem.with_suffix(".txt").write_text("\n".join(head + [table(rows), tail, summary]) + "\n")
    stem.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {stem}.txt and .json")


if __name__ == "__main__":
    main()

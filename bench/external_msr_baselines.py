"""Reference results of the msr programs (Tarnawski et al., NeurIPS 2020) on their instances.

    python bench/external_msr_baselines.py CHECKOUT [--out PATH] [--timeout-s 300]
                                           [--work DIR] [--only NAME]

CHECKOUT is an extracted copy of github.com/msr-fiddle/dnn-partitioning (e.g.
``git --git-dir=MIRROR archive HEAD | tar -x -C /tmp/msr``). The script compiles
``throughput-dp/dp.cpp`` and ``latency-greedy/greedy.cpp`` with ``g++ -O3`` into
``--work`` and runs, one at a time, each under ``timeout``:

* every throughput instance: ``dp`` (the DP over contiguous splits), ``dp -localSearch
  10``, ``dp -pipeDream``, ``dp -oneFpga`` and, where a human-expert split exists,
  ``dp -expert SPLIT`` (training instances without their own split take the inference
  split: ``dp`` infers the backward nodes from the colour classes, as their README says);
* every latency instance: ``greedy``, ``greedy -computeLatency`` of ``dp``'s split of
  the same file, and of the human-expert split where one exists.

Not run: ``dp -scotch`` (needs the Scotch partitioner) and the integer programs
``throughput-ip/ip.py`` and ``latency-ip/lip.py`` (need Gurobi and a licence).

Each run's record: instance (path under CHECKOUT), program, option, the objective as
the program printed it (``printed``, and ``value`` as a float; ``dp`` prints its
JSON's ``maxLoad`` in full precision, the other modes 6 significant digits, and
``-computeLatency`` 3 decimals), wall seconds, whether it timed out, the exit status,
a ``FAIL:`` line if the program printed one, and the split it produced as a placement
in simplace's op order (``simplace.external.msr.from_split``; device 0 the CPU, device
i the i-th accelerator; ``accelerators``: how many the placement is for, more than the
file's ``maxFPGAs`` where a split uses more), or null where the program prints none
(``-localSearch`` keeps no split; ``-oneFpga`` is every op on accelerator 1 by
construction, recorded so). ``cpu_pieces``: how many CPU pieces a DP split has (with
``maxCPUs > 1`` the DP loads each alone, where their scorer sums them).
Raw outputs are kept in ``--work``, and a rerun reuses them (delete them to run again).
Times are in the files' unit (milliseconds). Wall seconds are for the machine named in
the output (quote them with it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

UPSTREAM = "github.com/msr-fiddle/dnn-partitioning"
OUT_DEFAULT = HERE / "data" / "external" / "msr" / "baselines.json"
LOCAL_SEARCH_RESTARTS = 10  # as in the paper's experiments (their README)


def expert_for(instance: Path, experts: Path) -> Path | None:
    """The human-expert split for an instance (LayerGraphs only): its own, else the
    inference split of the same network (training instances, as their README says)."""
    if instance.parent.name != "LayerGraphs":
        return None
    own = experts / f"{instance.stem}_expert.json"
    if own.exists():
        return own
    inference = experts / f"{instance.stem.replace('_training', '_inference')}_expert.json"
    return inference if inference.exists() else None


def parse_value(program: str, option: str, stdout: str, stderr: str) -> str | None:
    """The objective as printed by the program in this mode (a string), or None."""
    if program == "dp" and option in ("", "-pipeDream"):
        split = leading_json(stdout)
        return None if split is None else repr(float(split["maxLoad"]))
    keys = {("dp", "-localSearch"): "local search done. maxLoad = ",
            ("dp", "-oneFpga"): "single FPGA. computed load: ",
            ("dp", "-expert"): "max-load of the split: ",
            ("greedy", ""): "finished successfully. objective = ",
            ("greedy", "-computeLatency"): "the latency of given split is: "}
    key = keys[(program, option)]
    for line in (stdout + "\n" + stderr).splitlines():
        if line.startswith(key):
            return line[len(key):].strip()
    return None


def leading_json(stdout: str) -> dict | None:
    """The JSON object a program printed first (a ``FAIL:`` line may follow it), or
    None."""
    try:
        obj, _ = json.JSONDecoder().raw_decode(stdout.lstrip())
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def run_one(work: Path, exe: Path, args: list[str], stdin: Path, tag: str,
            timeout_s: float) -> dict:
    """Run (or reuse the cached raw output of) one program invocation."""
    raw = work / "raw" / f"{tag}.json"
    if raw.exists():
        return json.loads(raw.read_text())
    t0 = time.perf_counter()
    with open(stdin, "rb") as f:
        proc = subprocess.run(["timeout", str(int(timeout_s)), str(exe), *args], stdin=f,
                              capture_output=True, cwd=work)
    wall = time.perf_counter() - t0
    rec = {"rc": proc.returncode, "wall_s": round(wall, 4),
           "timed_out": proc.returncode == 124,
           "stdout": proc.stdout.decode(errors="replace"),
           "stderr_tail": proc.stderr.decode(errors="replace")[-4000:]}
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps(rec))
    return rec


def compile_programs(checkout: Path, work: Path) -> dict[str, Path]:
    """g++ -O3 of dp.cpp and greedy.cpp into work (skipped where already built)."""
    exes = {}
    for name, src in (("dp", "throughput-dp/dp.cpp"), ("greedy", "latency-greedy/greedy.cpp")):
        exe = work / f"{name}.exe"
        if not exe.exists():
            subprocess.run(["g++", "-O3", str(checkout / src), "-o", str(exe)], check=True)
        exes[name] = exe
    return exes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", type=Path)
    ap.add_argument("--out", type=Path, default=OUT_DEFAULT)
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/msr_baselines"))
    ap.add_argument("--only", default=None, help="run instances whose path contains this")
    ap.add_argument("--commit", default=None, help="upstream commit of CHECKOUT (recorded)")
    a = ap.parse_args()
    checkout = a.checkout.resolve()
    work = a.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    exes = compile_programs(checkout, work)
    experts = checkout / "human-experts"

    plan = []  # (instance, program, option, args, stdin file, split file for placement)
    for inst in sorted((checkout / "throughput-inputs").glob("*/*.json")):
        plan.append((inst, "dp", "", [], None))
        plan.append((inst, "dp", "-localSearch", ["-localSearch", str(LOCAL_SEARCH_RESTARTS)],
                     None))
        plan.append((inst, "dp", "-pipeDream", ["-pipeDream"], None))
        plan.append((inst, "dp", "-oneFpga", ["-oneFpga"], None))
        ex = expert_for(inst, experts)
        if ex is not None:
            plan.append((inst, "dp", "-expert", ["-expert", str(ex)], ex))
    for inst in sorted((checkout / "latency-inputs").glob("*/*.json")):
        plan.append((inst, "greedy", "", [], None))
        plan.append((inst, "dp", "", [], None))
        plan.append((inst, "greedy", "-computeLatency", ["-computeLatency", "DP_SPLIT"], "dp"))
        ex = expert_for(inst, experts)
        if ex is not None:
            plan.append((inst, "greedy", "-computeLatency", ["-computeLatency", str(ex)], ex))

    runs = []
    dp_split: dict[Path, Path] = {}
    for inst, program, option, args, split_src in plan:
        rel = inst.relative_to(checkout).as_posix()
        if a.only and a.only not in rel:
            continue
        if split_src == "dp":
            if inst not in dp_split:
                continue
            split_src = dp_split[inst]
            args = [args[0], str(split_src)]
        tag = "__".join([rel.replace("/", "_"), program, option.lstrip("-") or "default",
                         Path(split_src).stem if isinstance(split_src, Path) else ""])
        print(f"{rel:55s} {program} {' '.join(args)}", flush=True)
        rec = run_one(work, exes[program], args, inst, tag, a.timeout_s)
        printed = parse_value(program, option, rec["stdout"], rec["stderr_tail"])
        fail = next((ln for ln in rec["stdout"].splitlines() if ln.startswith("FAIL:")), None)
        split = None
        split_note = None
        if program in ("dp", "greedy") and option == "" and printed is not None:
            split = leading_json(rec["stdout"])
            if program == "dp":
                path = work / "splits" / f"{tag}.json"
                path.parent.mkdir(exist_ok=True)
                path.write_text(json.dumps(split))
                dp_split[inst] = path
        elif option == "-pipeDream" and printed is not None:
            split = leading_json(rec["stdout"])
        elif option in ("-expert", "-computeLatency"):
            split = json.loads(Path(split_src).read_text())
            split_note = f"the split scored: {Path(split_src).name}"
        elif option == "-oneFpga":
            split = {"cpus": [], "fpgas": [{"nodes": [n["id"] for n in
                                                    json.loads(inst.read_text())["nodes"]]}]}
            split_note = "every op on accelerator 1 (dp's allOnOneFpga)"
        row = {"instance": rel, "program": program, "option": option,
               "args": [Path(x).name if "/" in x else x for x in args],
               "printed": printed, "value": None if printed is None else float(printed),
               "wall_s": rec["wall_s"], "timed_out": rec["timed_out"], "rc": rec["rc"],
               "fail": fail, "placement": split}
        if program == "dp" and option in ("", "-pipeDream") and split is not None:
            # The DP may give up to maxCPUs CPU pieces a load each; the scorer sums them.
            row["cpu_pieces"] = sum(1 for g in split["cpus"] if g["nodes"])
        if split_note:
            row["split_note"] = split_note
        runs.append(row)
        print(f"    -> {printed}  ({rec['wall_s']:.2f} s{', TIMEOUT' if rec['timed_out'] else ''}"
              f"{', ' + fail if fail else ''})", flush=True)

    # Splits become placements once every program has run (their raw outputs are cached).
    from simplace.external import msr

    for row in runs:
        split = row["placement"]
        if split is not None:
            instance = msr.load(checkout / row["instance"])
            # greedy -computeLatency takes splits with more accelerators than maxFPGAs
            # (their BERT-24 expert split uses 6 on a 5-accelerator latency instance).
            k = instance.info["accelerators"]
            if len(split["fpgas"]) > k:
                k = len(split["fpgas"])
                instance = msr.load(checkout / row["instance"], devices=k)
            row["accelerators"] = k
            row["placement"] = msr.from_split(instance, split).tolist()
    gxx = subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout
    out = {"schema": 1, "source": UPSTREAM, "commit": a.commit,
           "compiler": f"{gxx.splitlines()[0]} -O3", "timeout_s": a.timeout_s,
           "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
           "time_unit": "milliseconds (the files' unit)",
           "not_run": ["dp -scotch (needs Scotch)",
                       "throughput-ip/ip.py, latency-ip/lip.py (need Gurobi)"],
           "runs": runs}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out} ({len(runs)} runs)")


if __name__ == "__main__":
    main()

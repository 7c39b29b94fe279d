"""How long each RL method takes to build its first batch (compilation included), per
model: the part of a ``--budget-s`` that goes before the policy learns anything.

    python bench/rl_first_batch.py [--models rnnlm,nmt_2layer,bert_base,resnet50]
                                   [--machine cpu_h100x4_nvlink] [--small]
                                   [--methods rl-gnn,rl-seq2seq,rl-hierarchical]
                                   [--out first_batch.json]

Each (model, method) runs in a fresh Python process with JAX's compilation cache off, so
that nothing compiled by an earlier run is reused: what a first ``simplace optimize``
on a new problem pays. The run is ``optimize(graph, cost_model, method, budget_s=1,
warm_start=m_etf's placement)``; a search always builds its first batch (its budget
excludes it, ``simplace.search``), and the table gives ``first_batch_s`` (from the call
to the first scored batch) and the run's wall time. Wall times are this machine's:
quote its load (printed) with the figures.
"""

import argparse
import json
import subprocess
import sys

from report import load_average, machine_line

_CHILD = r"""
import json, os, sys, time
os.environ["SIMPLACE_COMPILE_CACHE"] = "off"
import simplace
from simplace.models import load_graph
from simplace.placers import optimize
model, machine, method, small = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
g = load_graph(model, small=small)
cm = simplace.CostModel.load(machine)
warm = optimize(g, cm, "m_etf").placement
t = time.perf_counter()
r = optimize(g, cm, method, budget_s=1.0, warm_start=warm)
print(json.dumps({"ops": g.num_ops, "units": r.info.get("units"),
                  "first_batch_s": r.info.get("first_batch_s"),
                  "wall_s": time.perf_counter() - t,
                  "imitation_steps": r.info.get("imitation_steps")}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="rnnlm,nmt_2layer,bert_base,resnet50")
    ap.add_argument("--machine", default="cpu_h100x4_nvlink")
    ap.add_argument("--methods", default="rl-gnn,rl-seq2seq,rl-hierarchical")
    ap.add_argument("--small", action="store_true", help="tiny model sizes")
    ap.add_argument("--out", help="write the rows as JSON")
    args = ap.parse_args()
    print(machine_line())
    print(f"{'model':<12} {'ops':>6} {'method':<16} {'units':>6} {'imit':>5} "
          f"{'first batch s':>14} {'wall s':>8}")
    rows = []
    for model in args.models.split(","):
        for method in args.methods.split(","):
            out = subprocess.run([sys.executable, "-c", _CHILD, model, args.machine,
                                  method, "1" if args.small else "0"],
                                 capture_output=True, text=True, check=False)
            if out.returncode:
                print(f"{model:<12} {'':>6} {method:<16} failed: "
                      f"{out.stderr.strip().splitlines()[-1:]}")
                continue
            row = {"model": model, "machine": args.machine, "method": method,
                   "small": args.small, **json.loads(out.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(f"{model:<12} {row['ops']:>6} {method:<16} {row['units'] or 0:>6} "
                  f"{row['imitation_steps'] or 0:>5} {row['first_batch_s']:>14.2f} "
                  f"{row['wall_s']:>8.2f}", flush=True)
    print(f"load average at the end: {load_average()}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)



if __name__ == "__main__":
    main()

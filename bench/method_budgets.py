"""Whether single methods keep a time budget on big graphs: the wall time of
``optimize(graph, machine, method, budget_s=S)`` against ``S``, as the Python API runs it
(the model traced beforehand; on the command line tracing adds its own seconds), with
JAX's persistent compilation cache on, as the command line has it.

    python bench/method_budgets.py [--rows nmt_4layer:haswell_k40x4,...]
                                   [--methods m_etf,m_sct,heft,m_topo,local]
                                   [--budgets 1,3] [--seed 0] [--out FILE]

Per row, method and budget: the wall time, its ratio to the budget, and the step time
found (``!``: out of memory; ``=``: the method returned the single device, faster than
its own answer; a method that refuses the graph says so).
The first method of a process also pays the simulator's load from numba's cache;
wall times are this machine's, so quote the load. Run it with ``PYTHONPATH`` set to
another checkout to compare two versions.
"""

import argparse
import time

from report import Transcript, load_average, machine_line, problems

from simplace.compile_cache import enable as enable_compile_cache
from simplace.errors import SimplaceError
from simplace.placers import optimize

DEFAULT_ROWS = "nmt_4layer:haswell_k40x4,inception_v3:haswell_k40x4"
DEFAULT_METHODS = "m_etf,m_sct,heft,m_topo,local,rl-pretrained"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=DEFAULT_ROWS, help="model:machine,...")
    ap.add_argument("--methods", default=DEFAULT_METHODS, help="comma-separated")
    ap.add_argument("--budgets", default="1,3", help="comma-separated seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    enable_compile_cache()
    out = Transcript()
    out.say(machine_line())
    out.say(f"{'model':12s} {'machine':16s} {'method':14s} {'budget':>6s} {'wall s':>7s} "
            f"{'wall/budget':>11s} {'step ms':>10s}")
    for model, machine, graph, cost_model in problems(args.rows):
        for method in args.methods.split(","):
            for budget in (float(b) for b in args.budgets.split(",")):
                t0 = time.perf_counter()
                try:
                    res = optimize(graph, cost_model, method, seed=args.seed,
                                   budget_s=budget)
                except SimplaceError as err:  # a method that refuses the graph (exact)
                    out.say(f"{model:12s} {machine:16s} {method:14s} {budget:6g} refused: "
                            f"{str(err)[:80]}")
                    continue
                wall = time.perf_counter() - t0
                flag = "!" if res.oom else ("=" if res.info.get("returned") == "single"
                                            else " ")
                out.say(f"{model:12s} {machine:16s} {method:14s} {budget:6g} {wall:7.2f} "
                        f"{wall / budget:11.2f} {res.step_time_s * 1e3:10.2f}{flag} "
                        f"(load {load_average()})")
    out.finish(__file__, None, args.out)


if __name__ == "__main__":
    main()

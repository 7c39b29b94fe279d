"""Whether the fast methods keep the floors every method is held to: an answer no slower
than ``single``'s, one that fits where some method's answer fits, and the time budget.

    python bench/floors.py [--models rnnlm,nmt_2layer,...] [--machines haswell_k40x4,...]
                           [--methods single,expert,heft,...] [--budget-s 3] [--out FILE]

Per model and machine (every pair of ``--models`` and ``--machines``), each method's
step time in ms under ``--budget-s``, marked ``!`` when out of memory and, after it,
``<OOM`` when another method's answer fits, ``<SINGLE`` when slower than ``single``'s
answer that fits, ``>BUDGET(w s)`` when it took more than 1.15x the budget, and
``ERR`` with the error of a method that failed. ``single`` itself is never marked: its
answer is one device by definition. The last line counts the marks. Run it with
``PYTHONPATH`` set to another checkout to compare two versions (give that checkout's
numba cache a ``simplace warmup`` first, or its first calls pay compilation).
"""

import argparse
import time

from report import Transcript, load_average, machine_line, problems

from simplace.compile_cache import enable as enable_compile_cache
from simplace.placers import optimize

DEFAULT_MODELS = "rnnlm,nmt_2layer,resnet50,inception_v3,transformer,bert_base"
DEFAULT_MACHINES = "haswell_k40x4,cpu_h100x4_nvlink,hsdag_cpu_gpu,cpu_vm2core_x4,placeto_k80x2"
DEFAULT_METHODS = "single,expert,heft,m_etf,m_sct,m_topo,metis,scotch,pipeline,ideals"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--machines", default=DEFAULT_MACHINES)
    ap.add_argument("--methods", default=DEFAULT_METHODS)
    ap.add_argument("--budget-s", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    enable_compile_cache()
    out = Transcript()
    out.say(machine_line())
    methods = args.methods.split(",")
    rows = ",".join(f"{m}:{k}" for m in args.models.split(",")
                    for k in args.machines.split(","))
    counts = {"<OOM": 0, "<SINGLE": 0, ">BUDGET": 0, "ERR": 0}
    for model, machine, graph, cost_model in problems(rows):
        found = {}
        for method in methods:
            t0 = time.perf_counter()
            try:
                res = optimize(graph, cost_model, method, seed=args.seed,
                               budget_s=args.budget_s)
                found[method] = (res.step_time_s, res.oom, time.perf_counter() - t0, None)
            except Exception as err:  # noqa: BLE001 - a failing method is what is counted
                found[method] = (float("nan"), None, time.perf_counter() - t0,
                                 f"{type(err).__name__}: {str(err)[:60]}")
        one = found.get("single")
        some_fit = any(oom is False for _, oom, _, _ in found.values())
        cells = []
        for method, (step, oom, wall, error) in found.items():
            marks = {}  # kind: text
            if method != "single":
                if oom and some_fit:
                    marks["<OOM"] = "<OOM"
                if one is not None and one[1] is False and oom is False and \
                        step > one[0] * (1 + 1e-9):
                    marks["<SINGLE"] = "<SINGLE"
                if wall > 1.15 * args.budget_s:
                    marks[">BUDGET"] = f">BUDGET({wall:.1f}s)"
                if error:
                    marks["ERR"] = f"ERR {error}"
            for kind in marks:
                counts[kind] += 1
            cells.append(f"{method}={step * 1e3:.1f}{'!' if oom else ''}{''.join(marks.values())}")
        out.say(f"{model} {machine} " + " ".join(cells) + f"  (load {load_average()})")
    out.say("marks: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    out.finish(__file__, None, args.out)


if __name__ == "__main__":
    main()

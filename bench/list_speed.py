"""Wall time of the list schedulers without a budget, on a few real-size rows.

    python bench/list_speed.py [--rows transformer@haswell_k40x8,...]
                               [--methods heft,m_etf,m_sct,m_topo] [--repeats 1]

Per row (MODEL@MACHINE, the zoo model at its default size) and method: the wall time
of ``optimize`` with no budget (the fastest of ``--repeats`` calls, after one ``single``
call has loaded the simulators) and the step time it answers, printed in full so that
two checkouts' answers can be compared exactly (run it with each on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

ROWS = "transformer@haswell_k40x8,inception_v3@haswell_k40x4,nmt_4layer@haswell_k40x4," \
       "rnnlm@cpu_vm2core_x4"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=ROWS)
    ap.add_argument("--methods", default="heft,m_etf,m_sct,m_topo")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pretrained as bench

    import simplace
    from simplace.compile_cache import enable
    from simplace.placers import optimize

    enable()
    print(f"# {simplace.__file__}; {platform.node()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    for row in args.rows.split(","):
        model, mach = row.split("@")
        g, cm = bench._problem(model, mach)
        optimize(g, cm, "single")
        for method in args.methods.split(","):
            walls = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                r = optimize(g, cm, method)
                walls.append(time.perf_counter() - t0)
            print(f"{row:28s} {method:7s} {min(walls):7.2f} s  {r.step_time_s!r}", flush=True)
    print(f"# load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()

"""Wall time of whole ``simplace`` commands, each a new process, as a user runs them.

    python bench/command_time.py [--repeats 3] [--commands FILE]

Per command (the defaults below, or one per line of ``--commands``): one run first
(it traces the model once into the trace cache, and loads what it compiles), then
``--repeats`` timed runs; prints the fastest and the median, and the load. The
``simplace`` imported is the one on ``PYTHONPATH``: run it with each of two checkouts to
compare them (each keeps its own trace cache entries: the key has a digest of the
sources).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

COMMANDS = (
    "methods",
    "simulate transformer --cost-model haswell_k40x8 --single fastest",
    "simulate nmt_4layer --cost-model haswell_k40x4 --single fastest",
    "optimize transformer --cost-model haswell_k40x8 --method m_topo",
    "optimize rnnlm --cost-model cpu_h100x4_nvlink --method local --budget-s 3",
)


def _run(cmd: str) -> float:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "simplace", *cmd.split()],
                         capture_output=True, text=True, cwd="/tmp")
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"`simplace {cmd}` failed:\n{out.stderr[-2000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--commands", default=None, metavar="FILE")
    args = ap.parse_args()
    cmds = COMMANDS
    if args.commands:
        with open(args.commands) as f:
            cmds = tuple(line.strip() for line in f if line.strip())
    where = subprocess.run([sys.executable, "-c", "import simplace; print(simplace.__file__)"],
                           capture_output=True, text=True, cwd="/tmp").stdout.strip()
    print(f"# {where}; {platform.node()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    for cmd in cmds:
        _run(cmd)
        walls = [_run(cmd) for _ in range(args.repeats)]
        print(f"{min(walls):6.2f} s (median {statistics.median(walls):5.2f})  simplace {cmd}",
              flush=True)
    print(f"# load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()

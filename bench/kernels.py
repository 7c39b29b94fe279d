"""What a fresh install's numba compilation costs, and what ``simplace warmup`` saves.

    python bench/kernels.py [--budget-s 5] [--out bench/results/kernels_<date>_<host>.txt]

Each step runs in a new process with ``NUMBA_CACHE_DIR`` set to a new empty folder (a
fresh install's cache) and JAX's compilation cache off:

1. ``simplace warmup`` there: each kernel's compile seconds (``simplace.kernels``'
   ``compile_s`` are these, rounded), then again: the seconds to load them;
2. ``simplace optimize resnet50 --cost-model haswell_k40x4 --method local --budget-s B``
   in another empty cache (the first search of a fresh install), then after ``simplace
   warmup`` in that cache: the wall time of each against ``B``;
3. ``--method all --budget-s 4B`` from a third empty cache: ``compare``'s wall time when
   its fast methods' estimates carry the compilation (``simplace.kernels``).

Wall times are this machine's: quote its cores and load.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile
import time


def _run(argv: list[str], cache: str) -> tuple[float, str]:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache, "SIMPLACE_COMPILE_CACHE": "off"}
    t = time.perf_counter()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return wall, out.stdout + out.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget-s", type=float, default=5.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    simplace = [sys.executable, "-m", "simplace"]
    lines = [f"# bench/kernels.py on {platform.node()}, {os.cpu_count()} cores, "
             f"{datetime.datetime.now():%Y-%m-%d %H:%M}, load at start "
             f"{os.getloadavg()[0]:.2f}"]
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, \
            tempfile.TemporaryDirectory() as c:
        for label, cache in (("empty cache", a), ("after the first", a)):
            wall, text = _run(simplace + ["warmup"], cache)
            lines.append(f"simplace warmup, {label}: {wall:.1f} s wall")
            lines += ["  " + row for row in text.splitlines()
                      if re.match(r"^\w+\s+(compiled|loaded)\s", row)]
        search = simplace + ["optimize", "resnet50", "--cost-model", "haswell_k40x4",
                             "--method", "local", "--budget-s", f"{args.budget_s:g}"]
        for label in ("empty cache", "after simplace warmup"):
            if label != "empty cache":
                _run(simplace + ["warmup"], b)
            wall, text = _run(search, b)
            said = [ln.strip() for ln in text.splitlines() if "search time" in ln]
            lines.append(f"optimize --method local --budget-s {args.budget_s:g}, {label}: "
                         f"{wall:.1f} s wall; {said[0] if said else ''}")
        every = search[:-4] + ["--method", "all", "--budget-s", f"{4 * args.budget_s:g}"]
        wall, text = _run(every, c)
        said = [ln.strip() for ln in text.splitlines() if "search time" in ln]
        lines.append(f"optimize --method all --budget-s {4 * args.budget_s:g}, empty cache: "
                     f"{wall:.1f} s wall; {said[0] if said else ''}")
    lines.append(f"# load at end {os.getloadavg()[0]:.2f}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

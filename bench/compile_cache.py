"""What the persistent compilation cache saves: one ``simplace optimize`` command run
three times in fresh processes, with the cache off, then cold (an empty cache folder),
then warm (the folder the cold run filled).

    python bench/compile_cache.py [--model rnnlm] [--cost-model cpu_h100x4_nvlink]
                                  [--method rl-gnn] [--episodes 64] [--out results.json]

Each run is a whole command (tracing, warm starts, compilation, search), timed from
outside; with ``--episodes`` (RL) the work is fixed, so the differences are compilation
(and loading it). Quote the load printed beside the times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run(cmd: list[str], cache: str) -> float:
    env = {**os.environ, "SIMPLACE_COMPILE_CACHE": cache}
    t = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="rnnlm")
    ap.add_argument("--cost-model", default="cpu_h100x4_nvlink")
    ap.add_argument("--method", default="rl-gnn")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--out", help="write the figures as JSON")
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "simplace", "optimize", args.model, "--cost-model",
           args.cost_model, "--method", args.method, "--seed", "0"]
    if args.method.startswith("rl-"):
        cmd += ["--episodes", str(args.episodes), "--warm-start", "expert"]
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; command: {' '.join(cmd[1:])}")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, cache in (("off", "off"), ("cold", tmp), ("warm", tmp)):
            rows[label] = {"wall_s": run(cmd, cache), "load": load()}
            print(f"cache {label:<5} {rows[label]['wall_s']:7.1f} s   load {rows[label]['load']}",
                  flush=True)
    print(f"warm / cold: {rows['warm']['wall_s'] / rows['cold']['wall_s']:.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": cmd[1:], "host": platform.node(), "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()

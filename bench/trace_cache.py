"""What keeping traced zoo graphs (``simplace.trace_cache``) saves a command: the whole
wall time of ``simplace simulate MODEL --cost-model haswell_k40x4 --single fastest``, run
as a user runs it (a new process), first in an empty user directory (it traces) and
then again (it reads the kept trace), and with ``SIMPLACE_TRACE_CACHE=0``.

    python bench/trace_cache.py [--models nmt_2layer,nmt_4layer,inception_v3,resnet50]
                                [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from report import Transcript, load_average, machine_line


def _wall(model: str, env: dict) -> float:
    cmd = [sys.executable, "-m", "simplace", "simulate", model, "--cost-model",
           "haswell_k40x4", "--single", "fastest"]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="nmt_2layer,nmt_4layer,inception_v3,resnet50")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    out = Transcript()
    out.say(machine_line())
    out.say(f"{'model':14s} {'traces s':>9s} {'reads s':>8s} {'cache off s':>11s}")
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, SIMPLACE_HOME=home)
        for model in args.models.split(","):
            cold = _wall(model, env)
            warm = _wall(model, env)
            off = _wall(model, dict(env, SIMPLACE_TRACE_CACHE="0"))
            out.say(f"{model:14s} {cold:9.2f} {warm:8.2f} {off:11.2f}  "
                    f"(load {load_average()})")
    out.finish(__file__, argv, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

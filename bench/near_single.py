"""The best "all on one device but one op" placements of a row, by exhaustive scan.

    python bench/near_single.py --row transformer@cpu_vm2core_x4 [--out FILE]

Where every op on one device does not fit, the fastest placements known can be every op
on device A but one on device B (on the VM's CPU devices a segment's outputs live as long
as the segment, and the one op splits it). For each A, every op moved to every other
device is simulated (the batched simulator, D x (D-1) x M placements), and the best that
fits is printed with the op and device, then the scan's wall time. Rows are those of
``bench/pretrained.py`` (a zoo model at its default size on a machine, or an imported
instance).
"""

import argparse
import time

import numpy as np
from report import Transcript, load_average, machine_line


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--row", required=True, help="MODEL@MACHINE, or an imported instance")
    ap.add_argument("--chunk", type=int, default=2048, help="placements per simulator call")
    ap.add_argument("--out", help="also write the lines to this file")
    args = ap.parse_args()
    import pretrained as bench

    from simplace.sim.batched import batched_simulator

    model, _, mach = args.row.partition("@")
    graph, inputs = bench._problem(model, mach or None)
    sim = batched_simulator(graph, inputs)
    m, d = graph.num_ops, inputs.num_devices
    sim(np.zeros((1, m), np.int32))  # the kernels loaded before the clock starts
    out = Transcript()
    out.say(machine_line())
    t0 = time.perf_counter()
    for main_dev in range(d):
        best = (np.inf, None, None)
        for other in range(d):
            if other == main_dev:
                continue
            for lo in range(0, m, args.chunk):
                hi = min(m, lo + args.chunk)
                cands = np.full((hi - lo, m), main_dev, np.int32)
                cands[np.arange(hi - lo), np.arange(lo, hi)] = other
                res = sim(cands)
                s = np.where(res.oom, np.inf, res.step_time_s)
                j = int(np.argmin(s))
                if s[j] < best[0]:
                    best = (float(s[j]), lo + j, other)
        step, op, dev = best
        out.say(f"{args.row} all on device {main_dev} but op {op} on device {dev}: "
                 + ("none fits" if op is None else f"{step!r} s"))
    out.say(f"{d * (d - 1) * m} placements in {time.perf_counter() - t0:.2f} s; "
             f"load {load_average()}")
    out.finish(__file__, None, args.out)


if __name__ == "__main__":
    main()

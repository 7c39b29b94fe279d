"""How much two independent computations on two virtual CPU devices overlap on this host.

    python bench/cpu_overlap.py [--models resnet50:2,bert_base:1,transformer:2,inception_v3:2]
                                [--repeats 5] [--out FILE]

The VM's cost model (``cpu_vm2core_x4``) splits the host's cores into 4 virtual CPU
devices in one exclusive group: the simulators never run two segments of those devices
at once. Per ``model:batch`` (the zoo's training step), one step is jitted and run on
``cpu:0`` alone (``one``), then one step on ``cpu:0`` and one on ``cpu:1`` one after the
other (``seq``: what the exclusive group predicts for them) and both dispatched before
either is waited for (``conc``): ``seq / conc`` is what running them at once gains here
(1.0: nothing, as the exclusive group assumes; 2.0: two cores fully used by each alone
would be impossible). Medians of ``--repeats`` runs, twice per model.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import numpy as np  # noqa: E402
from report import Transcript, load_average, machine_line  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50:2,bert_base:1,transformer:2,inception_v3:2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    import jax

    from simplace.models import load_function

    out = Transcript()
    out.say(machine_line())
    out.say(f"{'model':16s} {'one s':>7s} {'seq s':>7s} {'conc s':>7s} {'seq/conc':>8s}")
    d0, d1 = jax.devices()[:2]
    for spec in args.models.split(","):
        name, _, batch = spec.partition(":")
        fn, fargs = load_function(name, batch=int(batch) if batch else None, abstract=False,
                                  training=True)
        step = jax.jit(fn)
        a0, a1 = jax.device_put(fargs, d0), jax.device_put(fargs, d1)
        jax.block_until_ready((step(*a0), step(*a1)))  # compiles for both devices

        def one(step=step, a0=a0):
            jax.block_until_ready(step(*a0))

        def seq(step=step, a0=a0, a1=a1):
            jax.block_until_ready(step(*a0))
            jax.block_until_ready(step(*a1))

        def conc(step=step, a0=a0, a1=a1):
            jax.block_until_ready((step(*a0), step(*a1)))

        for _ in range(2):
            med = {}
            for label, run in (("one", one), ("seq", seq), ("conc", conc)):
                times = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    run()
                    times.append(time.perf_counter() - t0)
                med[label] = float(np.median(times))
            out.say(f"{spec:16s} {med['one']:7.3f} {med['seq']:7.3f} {med['conc']:7.3f} "
                    f"{med['seq'] / med['conc']:8.2f}  (load {load_average()})")
        del a0, a1, step
        jax.clear_caches()
    out.finish(__file__, argv, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

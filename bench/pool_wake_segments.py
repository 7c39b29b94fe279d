"""Does a segment timed alone pay the worker thread's wake-up? Segments of a model,
timed as ``simplace calibrate`` times them, against the committed cost model.

``calibrate`` cuts each model into random runs of ops and times every segment alone
(blocking); the op fit charges ``parallel_launch_s`` (the wake-up) to each segment whose
ops' flops reach ``parallel_min_segment_flops``. This prints, per segment: whether the
rule charges it, the measured time, the base (launch plus the call's own host time),
the fitted op costs, and what is left over the base and the ops (the wake-up, where it
was paid), so that one can see whether the rule's segments pay it every time.

    python bench/pool_wake_segments.py [--model mlp] [--placements 6] [--seed 1]
        [--cost-model cpu_vm2core_x4] [--out bench/results/pool_wake_segments_DATE_vm.txt]
"""

from __future__ import annotations

import argparse
import os
import warnings

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import numpy as np  # noqa: E402
from report import Transcript, machine_line  # noqa: E402

from simplace.calibrate import segments as seg_mod  # noqa: E402
from simplace.calibrate.build import _has_parallel  # noqa: E402
from simplace.calibrate.fit import predict_segments  # noqa: E402
from simplace.cost_model import CostModel  # noqa: E402
from simplace.models import load_function  # noqa: E402
from simplace.validate.executor import prepare  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--placements", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cost-model", default="cpu_vm2core_x4")
    ap.add_argument("--out", help="write the table here (.txt)")
    args = ap.parse_args(argv)
    import jax

    cm = CostModel.load(args.cost_model)
    dev = cm.devices[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn, fargs = load_function(args.model, small=True, abstract=False, training=True)
        program = prepare(fn, fargs, name=args.model)
    g = program.graph
    out = Transcript()
    out.say(f"segments of {args.model} timed alone; {machine_line()}; cost model "
            f"{args.cost_model}: wake-up {dev.parallel_launch_s * 1e6:.1f} us from "
            f"{dev.parallel_min_segment_flops:.4g} flops")
    out.say(f"{'placement':>9} {'ops':>9} {'rule':>4} {'measured':>9} {'base':>7} {'ops us':>7} "
            f"{'left':>7} {'outputs':>7}   (us; left = measured - base - ops)")
    rng = np.random.default_rng(args.seed)
    left_by_rule: dict[bool, list[float]] = {True: [], False: []}
    for k, p in enumerate(seg_mod.cut_placements(g.num_ops, len(jax.devices()), rng,
                                                 count=args.placements)):
        for _, a, b, tm, call in seg_mod.time_segments(program, fargs, p, jax.devices()):
            feats = seg_mod.segment_features(g, a, b)
            ops = float(predict_segments(dev, [feats], 0.0)[0])
            rule = _has_parallel(feats, dev.parallel_min_segment_flops)
            base = dev.launch_s + call["host_s"]
            left = tm.median_s - base - ops
            left_by_rule[rule].append(left)
            out.say(f"{k:>9} {a:>4}-{b:<4} {'yes' if rule else 'no':>4} "
                    f"{tm.median_s * 1e6:9.1f} {base * 1e6:7.1f} {ops * 1e6:7.1f} "
                    f"{left * 1e6:7.1f} {call['outputs']:>7}")
    for rule, vals in left_by_rule.items():
        if vals:
            v = np.array(vals) * 1e6
            out.say(f"segments the rule {'charges' if rule else 'does not charge'}: {len(v)}, "
                    f"left over base and ops: median {np.median(v):.1f} us, "
                    f"{np.sum(v > 15)} of them over 15 us")
    out.finish(__file__, argv, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

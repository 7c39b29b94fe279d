"""How long profiling a model takes on this host, next to the time of one step.

    python bench/profile_time.py [--models resnet50:2,transformer:2,...]
                                 [--cost-model cpu_vm2core_x4] [--chunks 24]
                                 [--dump FILE.json] [--against FILE.json] [--out FILE]

Per ``model:batch`` (the zoo's training step at that batch): the wall time of
``simplace.profile.profile`` (tracing and placing the program not included), the floor
``simplace.profile.time_floor_s`` puts under it, the whole step measured on one device,
and the chunks' measured times and call host times summed. ``--dump``: every chunk's
figures as JSON; ``--against`` an earlier dump (another checkout on ``PYTHONPATH``):
the ratio of each summed figure to the earlier one, so that a change to how profiles are
timed shows what it does to what they measure. Nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from report import Transcript, load_average, machine_line

DEFAULT_MODELS = "resnet50:2,transformer:2,bert_base:1,inception_v3:2"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=DEFAULT_MODELS, help="model:batch,...")
    ap.add_argument("--cost-model", default="cpu_vm2core_x4")
    ap.add_argument("--chunks", type=int, default=24)
    ap.add_argument("--dump", help="write every chunk's figures to this JSON file")
    ap.add_argument("--against", help="a --dump of an earlier run to compare with")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args(argv)

    from simplace.cost_model import CostModel
    cm = CostModel.load(args.cost_model)
    n_cpu = sum(d.kind == "cpu" for d in cm.devices)
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={n_cpu}")

    from simplace.hardware.executor import prepare
    from simplace.models import load_function
    from simplace.profile import profile, time_floor_s

    earlier = {}
    if args.against:
        with open(args.against) as f:
            earlier = json.load(f)
    out = Transcript()
    out.say(machine_line())
    out.say(f"{'model':16s} {'ops':>6s} {'profile s':>9s} {'floor s':>7s} {'step s':>7s} "
            f"{'chunks s':>8s} {'host ms':>8s}" + ("  vs earlier: profile, chunks, host, step"
                                                    if earlier else ""))
    dump = {}
    for spec in args.models.split(","):
        name, _, batch = spec.partition(":")
        fn, run_args = load_function(name, training=True, batch=int(batch) if batch else None,
                                     small=False, abstract=False)
        program = prepare(fn, run_args, name=spec)
        t0 = time.perf_counter()
        prof = profile(None, run_args, cm, chunks=args.chunks, program=program, progress=False)
        wall = time.perf_counter() - t0
        rows = {kind: [c.to_dict() for c in chunks] for kind, chunks in prof.chunks.items()}
        kind = sorted(rows)[0]
        chunks = rows[kind]
        whole = prof.whole[kind]
        host = sum(c["fixed_s"] for c in chunks)  # the model's fixed part plus the calls
        summed = sum(c["measured_s"] or 0.0 for c in chunks)
        step = whole.measured_s or float("nan")
        dump[spec] = {"profile_s": wall, "chunks": chunks, "whole": whole.to_dict(),
                      "chunks_s": summed, "fixed_s": host, "step_s": step}
        line = (f"{spec:16s} {program.graph.num_ops:6d} {wall:9.1f} "
                f"{time_floor_s(cm, program.graph):7.1f} {step:7.3f} {summed:8.3f} "
                f"{host * 1e3:8.2f}")
        if spec in earlier:
            e = earlier[spec]
            line += (f"  {wall / e['profile_s']:.2f}x {summed / e['chunks_s']:.3f}x "
                     f"{host / e['fixed_s']:.3f}x {step / e['step_s']:.3f}x")
        out.say(line + f"  (load {load_average()})")
    if args.dump:
        with open(args.dump, "w") as f:
            json.dump(dump, f, indent=1)
    out.finish(__file__, argv, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Would charging the wake-up to small segments that wait make the simulator closer? An
offline what-if.

XLA:CPU (PjRt's CPU client) runs a computation inline on the calling thread only when
it is cheap (XLA's flop count under 1000: the simulators' pool rule) *and* nothing it
depends on is pending: its inputs are ready and no earlier computation of its device
is still queued. Otherwise it is scheduled on a worker thread, which wakes up for it.
The simulators charge the wake-up by the flops alone. This what-if also charges it to
a cheap segment whose inputs (an earlier segment of its device, or a copy) are not
ready when its call is made (``segment_start_s > segment_dispatch_s`` in the
reference schedule), refits the calibration's records with that semantics (the
whole-step fit's scales), and scores saved ``bench/fidelity.py`` runs with each refit
model, raw, on all their records. The simulators are not changed: the reference
simulator is wrapped for the run (the extra wake-ups are charged to the first op of
each such segment, and the schedule is simulated again until the set of segments that
wait stops changing: a segment's choice depends on earlier segments only, so this is
the sequential semantics).

    python bench/wait_wakeup_rescore.py [--records calibration/cpu_vm2core_x4/records.jsonl]
        [--out bench/results/wait_wakeup_rescore_DATE_vm.txt] RESULTS.json...
"""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import numpy as np  # noqa: E402
from whatif import begin, parser, refit_and_score  # noqa: E402

from simplace.sim import reference  # noqa: E402


def waiting_segments_pay(plain):
    """``reference._simulate`` with the wake-up charged to cheap segments that wait."""

    def simulate(graph, inp, placement, *, schedule):
        if not np.any(inp.pool_launch_s > 0):
            return plain(graph, inp, placement, schedule=schedule)
        paying: set[int] = set()
        for _ in range(graph.num_ops + 1):
            extra = np.array(inp.op_unfused_s, dtype=np.float64, copy=True)
            for a in paying:
                d = int(placement[a])
                extra[a, d] += inp.pool_launch_s[d]
            res = plain(graph, inp._replace(op_unfused_s=extra), placement, schedule=True)
            s = res.schedule
            waits = set()
            for first, stop, d, disp, start in zip(
                    s.segment_first.tolist(), s.segment_stop.tolist(),
                    s.segment_device.tolist(), s.segment_dispatch_s.tolist(),
                    s.segment_start_s.tolist(), strict=True):
                cheap = reference.segment_pool_launch(inp, first, stop, d) == 0.0
                if cheap and inp.pool_launch_s[d] > 0 and start > disp:
                    waits.add(first)
            if waits == paying:
                return res if schedule else dataclasses.replace(res, schedule=None)
            paying = waits
        raise RuntimeError("the waiting segments did not settle")  # cannot happen

    return simulate


def main(argv=None) -> int:
    args = parser(__doc__).parse_args(argv)
    out, records, runs = begin(args, "wake-up of waiting segments what-if",
                               "steps: the whole-step fit's scales and its held-out median "
                               "error")
    plain = reference._simulate
    refit_and_score(out, "flops only (today)", records, runs, plain)
    refit_and_score(out, "flops, or waiting at the call", records, runs,
                    waiting_segments_pay(plain))
    out.finish(__file__, argv, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

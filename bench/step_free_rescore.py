"""Would charging the arrays a step frees make the simulator closer? An offline what-if.

A placed step frees every array it created (each segment call's outputs, each copy)
when it returns: host time the simulator does not charge (``bench/step_free_cost.py``
measured 0.5-5 us per array, more per array the more there are). This adds a cost
``a * n + b * n**2`` microseconds for a step's ``n`` arrays to the host's timeline after
its last call (the step ends no earlier), refits the calibration's records with it (the
whole-step fit's scales take up part of what the arrays cost), and scores saved
``bench/fidelity.py`` runs with each refit model, raw, on all their records. The
simulators themselves are not changed: the reference simulator is wrapped for the run.

    python bench/step_free_rescore.py [--costs 0:0,0.75:0,0.5:0.002,0.74:0.00325]
        [--records calibration/cpu_vm2core_x4/records.jsonl]
        [--out bench/results/step_free_rescore_DATE_vm.txt] RESULTS.json...
"""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import numpy as np  # noqa: E402
from whatif import begin, parser, refit_and_score  # noqa: E402

from simplace.sim import reference  # noqa: E402


def step_arrays(graph, placement) -> int:
    """Arrays one step of ``placement`` creates, as ``PlacedFunction`` runs it: each
    segment's outputs (tensors a later segment reads, and graph outputs) and each tensor
    copied to another device (once per destination)."""
    p = np.asarray(placement)
    seg = np.concatenate([[0], np.cumsum(np.diff(p) != 0)])
    src, dst, out = graph.src, graph.dst, graph.edge_output
    later = seg[dst] > seg[src]
    outs = set(zip(src[later].tolist(), out[later].tolist(), strict=True))
    outs |= {(int(i), 0) for i in np.flatnonzero(graph.is_output)}
    cross = p[dst] != p[src]
    moved = set(zip(src[cross].tolist(), out[cross].tolist(), p[dst][cross].tolist(),
                    strict=True))
    return len(outs) + len(moved)


def with_free_cost(a_us: float, b_us: float):
    """The reference simulator's ``_simulate``, with the arrays' cost after the host's
    last call."""
    plain = reference._simulate

    def simulate(graph, inp, placement, *, schedule):
        res = plain(graph, inp, placement, schedule=schedule)
        n = step_arrays(graph, placement)
        free_s = (a_us * n + b_us * n * n) * 1e-6
        return dataclasses.replace(res, step_time_s=max(res.step_time_s, res.host_s + free_s))

    return simulate


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--costs", default="0:0,0.75:0,0.5:0.002,0.74:0.00325",
                    help="a:b pairs, microseconds per array and per array squared")
    args = ap.parse_args(argv)
    out, records, runs = begin(args, "step free cost what-if",
                               "a, b: us per array, per array squared; steps: the whole-step "
                               "fit's scales and its held-out median error")
    plain = reference._simulate
    for pair in args.costs.split(","):
        a_us, b_us = (float(x) for x in pair.split(":"))
        refit_and_score(out, f"a {a_us:g} b {b_us:g}", records, runs,
                        with_free_cost(a_us, b_us) if a_us or b_us else plain)
    out.finish(__file__, argv, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

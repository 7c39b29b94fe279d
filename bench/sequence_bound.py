"""What-if: does counting the host's segment calls tighten the lower bound? A Lagrangian
bound over the op sequence, beside ``simplace.lower_bound``.

    python bench/sequence_bound.py [--rows rnnlm:cpu_h100x4_nvlink,...] [--out FILE]

The recurrent models on the H100s end 1.8-2.1x above ``lower_bound``, and their best
placements keep the host dispatching nearly all of the step (``bench/host_share.py``),
which the bound counts as one call. In any placement the host makes one call per
segment (maximal runs of one device in graph order) and one ``device_put`` per op and
remote device, and the step lasts at least the host's calls, and at least the first
dispatch plus any exclusive group's busy time. For weights ``lam`` over the groups and
the host (summing to 1) the step is at least the weighted sum of these, and the least
weighted sum over all placements is found exactly by a Viterbi pass over the ops in graph
order, with costs that depend on one op's device and the previous op's only:
  * an op continuing its segment adds ``op_time_s`` to its group (plus ``op_unfused_s``
    for an op with no in-edges);
  * an op opening a segment adds its launch, pool launch (``_pool_launch_lb``),
    ``op_time_s`` and ``op_unfused_s`` to its group, and ``dispatch_s`` to the host;
    where it reads the op just before it, which sits on another device, also that
    ``device_put`` (``put_s``, and on a ``put_waits`` link the copy's latency and bytes);
    other puts are left out, which only lowers the bound.
The best weights come from Kelley's cutting planes (each Viterbi answer is a cut, a
linear program picks the next weights) until the bound and the LP's ceiling agree to
1e-4. Not adopted in ``lower_bound``: see the results file.
"""

import argparse
import time

import numpy as np
from report import Transcript, machine_line, problems

from simplace.sim import lower_bound, sim_inputs, simulate
from simplace.sim.bounds import _pool_launch_lb, _producer_pairs
from simplace.sim.inputs import put_waits_of

DEFAULT_ROWS = ("rnnlm:cpu_h100x4_nvlink,nmt_2layer:cpu_h100x4_nvlink,"
                "nmt_4layer:cpu_h100x4_nvlink,rnnlm:haswell_k40x4,"
                "nmt_2layer:haswell_k40x4,nmt_4layer:haswell_k40x4,rnnlm:hsdag_cpu_gpu")


class SequenceCosts:
    """Per-op costs of the Viterbi pass (see the module docstring)."""

    def __init__(self, graph, inp):
        t = np.asarray(inp.op_time_s, dtype=np.float64)
        unfused = np.asarray(inp.op_unfused_s, dtype=np.float64)
        no_inputs = np.diff(graph.in_edges[0]) == 0
        self.cont = t + unfused * no_inputs[:, None]
        self.open = t + unfused + np.asarray(inp.launch_s)[None, :] + _pool_launch_lb(inp)
        src, dst, nbytes = _producer_pairs(graph)
        prev = dst == src + 1  # the op just before reads into this one
        self.reads_prev = np.zeros(graph.num_ops, dtype=bool)
        self.reads_prev[dst[prev]] = True
        self.prev_bytes = np.zeros(graph.num_ops)
        self.prev_bytes[dst[prev]] = nbytes[prev]
        d = inp.num_devices
        waits = put_waits_of(inp) & ~np.eye(d, dtype=bool)
        self.put = np.where(np.eye(d, dtype=bool), 0.0,
                            inp.put_s + np.where(waits, inp.latency_s, 0.0))
        self.put_per_byte = np.where(waits, 1.0 / inp.bandwidth_bytes_per_s, 0.0)
        self.dispatch = np.asarray(inp.dispatch_s, dtype=np.float64)
        self.group = np.asarray(inp.exclusive_group, dtype=np.int64)
        self.num_groups = inp.num_groups


def viterbi(c: SequenceCosts, lam: np.ndarray) -> np.ndarray:
    """The resource vector ``[group busy..., host]`` of the placement with the least
    ``lam``-weighted sum (first device on ties)."""
    m, d = c.cont.shape
    lg, lh = lam[c.group], lam[-1]
    off_diag = np.where(np.eye(d, dtype=bool), np.inf, 0.0)
    value = lg * c.open[0] + lh * c.dispatch
    back = np.zeros((m, d), dtype=np.int64)
    for i in range(1, m):
        stay = value + lg * c.cont[i]
        switch = value[:, None] + (lg * c.open[i] + lh * c.dispatch)[None, :] + off_diag
        if c.reads_prev[i]:
            switch = switch + lh * (c.put + c.prev_bytes[i] * c.put_per_byte)
        came = switch.argmin(axis=0)
        best_switch = switch[came, np.arange(d)]
        keep = stay <= best_switch
        back[i] = np.where(keep, np.arange(d), came)
        value = np.where(keep, stay, best_switch)
    p = np.zeros(m, dtype=np.int64)
    p[-1] = int(value.argmin())
    for i in range(m - 1, 0, -1):
        p[i - 1] = back[i, p[i]]
    opens = np.r_[True, p[1:] != p[:-1]]
    rows = np.arange(m)
    per_op = np.where(opens, c.open[rows, p], c.cont[rows, p])
    r = np.zeros(c.num_groups + 1)
    np.add.at(r, c.group[p], per_op)
    r[:-1] += c.dispatch.min()
    r[-1] = c.dispatch[p[opens]].sum()
    moved = opens & c.reads_prev  # a new segment whose op reads the previous op's
    moved[0] = False                # output, from another device (op 0 reads nothing)
    src_dev = np.r_[0, p[:-1]]
    r[-1] += (c.put[src_dev, p] + c.prev_bytes * c.put_per_byte[src_dev, p])[moved].sum()
    return r


def sequence_bound(c: SequenceCosts, iters: int = 80, tol: float = 1e-4):
    """``(bound, ceiling, lam, iterations)`` by Kelley's cutting planes."""
    from scipy.optimize import linprog

    n = c.num_groups + 1
    lam = np.full(n, 1.0 / n)
    cuts, best, ceiling = [], 0.0, np.inf
    while len(cuts) < iters:
        r = viterbi(c, lam)
        best = max(best, float(lam @ r))
        cuts.append(np.r_[-r, 1.0])  # z <= r . lam
        res = linprog(np.r_[np.zeros(n), -1.0], A_ub=np.asarray(cuts),
                      b_ub=np.zeros(len(cuts)), A_eq=np.r_[np.ones(n), 0.0][None],
                      b_eq=[1.0], bounds=[(0, None)] * n + [(None, None)], method="highs")
        lam, ceiling = res.x[:n], -res.fun
        if ceiling - best <= tol * ceiling:
            break
    return best, ceiling, lam, len(cuts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=DEFAULT_ROWS, help="model:machine,...")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    out = Transcript()
    out.say(machine_line())
    out.say(f"{'model':12s} {'machine':18s} {'ops':>6s} {'lower_bound':>12s} "
            f"{'sequence':>10s} {'seq/lb':>7s} {'host weight':>11s} {'cuts':>4s} {'s':>5s}")
    for model, machine, graph, cost_model in problems(args.rows):
        inp = sim_inputs(graph, cost_model)
        lb = lower_bound(graph, inp)
        t0 = time.perf_counter()
        seq, _, lam, its = sequence_bound(SequenceCosts(graph, inp))
        took = time.perf_counter() - t0
        # A bound no placement beats: check it against every one-device placement.
        single = min(simulate(graph, inp, np.full(graph.num_ops, d, dtype=np.int32))
                     .step_time_s for d in range(inp.num_devices))
        if seq > single * (1 + 1e-9):
            raise AssertionError(f"sequence bound {seq} above a placement's step {single}")
        out.say(f"{model:12s} {machine:18s} {graph.num_ops:6d} {lb * 1e3:12.3f} "
                f"{seq * 1e3:10.3f} {seq / lb:7.3f} {lam[-1]:11.3f} {its:4d} {took:5.1f}")
    out.say("lower_bound, sequence: ms; seq/lb > 1 where the sequence bound is tighter; "
            "host weight: the host's share of the best weights (0: the host's calls do "
            "not bind); s: seconds the sequence bound took.")
    out.say(f"end: {machine_line()}")
    out.finish(__file__, None, args.out)


if __name__ == "__main__":
    main()

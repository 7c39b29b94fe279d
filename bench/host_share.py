"""Where the step time of the best placements goes: the host's dispatching against the
devices' work, beside the lower bound. For the rows where the best placement found stays
far above ``simplace.sim.lower_bound`` (issue 15: recurrent models on K40s and H100s).

    python bench/host_share.py [--rows rnnlm:cpu_h100x4_nvlink,nmt_2layer:haswell_k40x4]
                               [--local-budget-s 20] [--seed 0] [--out host_share.txt]

Per row it places the training graph with ``single``, ``expert``, ``m_etf``, ``m_sct`` and
``local`` (from all of them, ``--local-budget-s``), and prints each placement's step time,
its ratio to the lower bound, the host's busy time (segment dispatches and
``device_put`` calls, one serial thread) and its share of the step, the segments and
transfers, and each device's busy time. A placement whose host is busy for most of its
step is bound by dispatching, which the lower bound does not count beyond one dispatch:
it takes no placement's segment count as given. Wall times are this machine's; the step
times are simulated (the cost model's), so the load does not change them, except
through how far ``local`` gets in its budget.
"""

import argparse

from report import Transcript, load_average, machine_line, problems, starts_then_local

from simplace.sim import lower_bound

DEFAULT_ROWS = ("rnnlm:cpu_h100x4_nvlink,nmt_2layer:cpu_h100x4_nvlink,"
                "nmt_4layer:cpu_h100x4_nvlink,rnnlm:haswell_k40x4,"
                "nmt_2layer:haswell_k40x4,nmt_4layer:haswell_k40x4")
STARTS = ("single", "expert", "m_etf", "m_sct")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=DEFAULT_ROWS, help="model:machine,...")
    ap.add_argument("--local-budget-s", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    out = Transcript()
    say = out.say
    say(machine_line())
    for model, machine, g, cm in problems(args.rows):
        bound = lower_bound(g, cm)
        found, loc = starts_then_local(g, cm, STARTS, seed=args.seed,
                                       budget_s=args.local_budget_s)
        found.append(loc)
        say(f"\n{model} (train, {g.num_ops:,} ops) on {machine}: lower bound "
            f"{bound * 1e3:.3f} ms")
        say(f"  {'method':<8} {'step ms':>9} {'/bound':>7} {'host ms':>9} {'host %':>7} "
            f"{'segments':>9} {'transfers':>10}  device busy ms")
        for r in found:
            flag = " OOM" if r.oom else ""
            say(f"  {r.method:<8} {r.step_time_s * 1e3:>9.3f} {r.step_time_s / bound:>7.2f} "
                f"{r.host_s * 1e3:>9.3f} {100 * r.host_s / r.step_time_s:>6.0f}% "
                f"{r.num_segments:>9,} {r.num_transfers:>10,}  "
                + " ".join(f"{b * 1e3:.2f}" for b in r.busy_s) + flag)
    say(f"\nload average at the end: {load_average()}")
    out.save(args.out)


if __name__ == "__main__":
    main()

"""Does racing several starts help ``local``? Each row annealed with ``race`` = 1, 3, 6.

    python bench/local_race.py [--rows rnnlm:haswell_k40x4,...] [--races 1,3,6]
        [--evaluations 400000] [--seeds 2] [--out bench/results/local_race.txt]

``local`` with ``race=1`` anneals from the best-scoring start only (its behaviour before
the race). With ``race=R`` it anneals from the R best distinct starts at once and halves
them in rungs of equal progress (``simplace/placers/local.py``). Each run gets the same
number of evaluations and the fast heuristics' placements as starts, so the figures are
deterministic for a seed whatever the machine's load. Printed per row: the step time each
race size ends at, by seed, and each lane's start and where it ended for the largest.
"""

import argparse
import time

import numpy as np
from report import FAST_HEURISTICS, Transcript, geometric_mean, machine_line, problems

from simplace.placers import optimize

DEFAULT_ROWS = ("rnnlm:haswell_k40x4,nmt_2layer:haswell_k40x4,nmt_4layer:haswell_k40x4,"
                "nmt_2layer:cpu_h100x4_nvlink,nmt_4layer:cpu_h100x4_nvlink,"
                "nmt_4layer:hsdag_cpu_gpu,resnet50:hsdag_cpu_gpu,"
                "bert_base:cpu_h100x4_nvlink,transformer:haswell_k40x4")


def _name(label: str) -> str:
    """``placement[i]`` (how ``local`` names a start given as a placement) -> the
    heuristic that gave it."""
    if label.startswith("placement["):
        return FAST_HEURISTICS[int(label[len("placement["):-1])]
    return label


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=DEFAULT_ROWS, help="comma-separated model:machine")
    ap.add_argument("--races", default="1,3,6")
    ap.add_argument("--evaluations", type=int, default=400_000)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--out", help="also write the transcript to this file")
    args = ap.parse_args()
    races = [int(r) for r in args.races.split(",")]
    out = Transcript()
    out.say(machine_line())
    out.say(f"local with {args.evaluations:,} evaluations per run, seeds 0..{args.seeds - 1}; "
            f"step times in ms")
    ratios = {r: [] for r in races}
    for model, machine, graph, cm in problems(args.rows):
        starts = [optimize(graph, cm, m).placement for m in FAST_HEURISTICS]
        out.say(f"\n{model} x {machine}")
        ends = {}
        for r in races:
            runs = []
            for seed in range(args.seeds):
                t = time.perf_counter()
                res = optimize(graph, cm, "local", seed=seed, starts=starts, race=r,
                               max_evaluations=args.evaluations)
                runs.append(res)
                ends.setdefault(r, []).append(res.step_time_s)
                if r == max(races) and seed == 0:
                    lanes = ", ".join(f"{_name(x['start'])} {1e3 * x['score']:.1f} "
                                      f"({x['end']})"
                                      for x in res.info["lanes"])
                    lane_line = f"    lanes (seed 0): {lanes}"
                wall = time.perf_counter() - t
            times = "  ".join(f"{1e3 * x.step_time_s:9.3f}" for x in runs)
            out.say(f"  race {r}: {times}   (last run {wall:.1f} s)")
        out.say(lane_line)
        base = np.mean(ends[races[0]])
        for r in races:
            ratios[r].append(np.mean(ends[r]) / base)
        out.say("  mean vs race " + str(races[0]) + ": " + ", ".join(
            f"race {r} {np.mean(ends[r]) / base:.3f}" for r in races))
    out.say(f"\ngeometric mean over rows, vs race {races[0]}: " + ", ".join(
        f"race {r} {geometric_mean(ratios[r]):.3f} "
        f"(best {min(ratios[r]):.3f}, worst {max(ratios[r]):.3f})" for r in races))
    out.say(f"at the end: {machine_line()}")
    out.finish(__file__, None, args.out)


if __name__ == "__main__":
    main()

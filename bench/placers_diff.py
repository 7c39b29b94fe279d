"""One method's step time in two `bench/placers.py` runs, row by row (after a change).

    python bench/placers_diff.py --old A.json [A2.json ...] --new B.json [B2.json ...]
        [--methods local,rl-gnn] [--out diff.txt]

Per (model, machine) in both runs and per method: the old and new step time and
new / old (below 1: the new run is faster), and each method's geometric mean, best and
worst ratio. Runs under a time budget vary with the machine's load: quote the load
lines of both runs' transcripts with the figures.
"""

import argparse
import json

from report import Transcript, geometric_mean


def _rows(paths):
    out = {}
    for path in paths:
        with open(path) as f:
            for r in json.load(f):
                out[(r["model"], r["machine"], r["method"])] = r["step_time_s"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", nargs="+", required=True, metavar="ROWS.json")
    ap.add_argument("--new", nargs="+", required=True, metavar="ROWS.json")
    ap.add_argument("--methods", default="local,rl-gnn")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    old, new = _rows(args.old), _rows(args.new)
    methods = args.methods.split(",")
    out = Transcript()
    out.say(f"{'row':38s}" + "".join(f"{m + ' old ms':>16s}{'new ms':>11s}{'new/old':>9s}"
                                      for m in methods))
    ratios = {m: [] for m in methods}
    for model, machine in sorted({k[:2] for k in new if k[:2] in {o[:2] for o in old}}):
        line = f"{model + ' x ' + machine:38s}"
        for m in methods:
            a, b = old.get((model, machine, m)), new.get((model, machine, m))
            if a is None or b is None:
                line += f"{'-':>16s}{'-':>11s}{'-':>9s}"
                continue
            ratios[m].append(b / a)
            line += f"{1e3 * a:16.3f}{1e3 * b:11.3f}{b / a:9.3f}"
        out.say(line)
    for m, r in ratios.items():
        if r:
            out.say(f"{m}: new/old geometric mean {geometric_mean(r):.3f}"
                    f" over {len(r)} rows (best {min(r):.3f}, worst {max(r):.3f}); "
                    f"<= 0.95 on {sum(x <= 0.95 for x in r)}, >= 1.05 on "
                    f"{sum(x >= 1.05 for x in r)}")
    out.finish(__file__, None, args.out)


if __name__ == "__main__":
    main()

"""rl-pretrained zero-shot on the held-out rows over several seeds, against kept baselines.

    python bench/zero_shot_seeds.py --baselines B.JSON [--rows SUBSTR,...] [--seeds 0,1,2]
                                    [--budget-s 1.8] [--set NAME=VALUE ...] [--training]
                                    [--finetune [--option NAME=VALUE ...]]
                                    [--method NAME]

Per row (``bench/pretrained.py``'s rows; ``--rows``: those whose label contains one of
the given strings) and seed: ``rl-pretrained`` with ``--budget-s`` (its batch, then the
guided search until the budget), its step time over the row's ``local`` step time from
``--baselines`` (a file ``bench/pretrained.py --baselines`` wrote), the call's wall time
and the guided search's rounds; then how many rows are within 10% of ``local`` in at most
2 s per seed.
The process places two random graphs first, as ``bench/pretrained.py`` does, so that the
policy's programs are compiled. ``--set NAME=VALUE`` overrides a constant of
``simplace.rl.guided`` (a Python literal), to compare variants of the search;
``--set MODULE.NAME=VALUE`` one of another module of the method (``pretrained``:
``simplace.placers.pretrained``, ``refine``: ``simplace.rl.refine``).
``--training``: rows of graphs and machines the policy was trained on instead
(``TRAINING_ROWS``), with no baselines: their step times, and the geometric mean over
rows and seeds, to compare variants of the search where they were not chosen.
``--finetune``: ``rl-universal --warm-start pretrained`` instead (give ``--budget-s 20``),
counting the rows no slower than ``local``; ``--option NAME=VALUE`` passes an option to
``rl-universal`` (such as ``polish_share=0.9``), to compare its variants.
``--method NAME``: another method instead, counted the same way (``--method local
--budget-s 60``: how far ``local``'s own runs spread around the kept baseline).
"""

from __future__ import annotations

import argparse
import ast
import gc
import json
import os
import sys
import time

import numpy as np

# Graphs and machines of the training distribution (simplace.rl.distribution), one each of
# its zoo models at real size and of its imported graphs.
TRAINING_ROWS = (("resnet50@haswell_k40x4", "resnet50", "haswell_k40x4"),
                 ("bert_base@cpu_h100x4_nvlink", "bert_base", "cpu_h100x4_nvlink"),
                 ("nmt_4layer@haswell_k40x2", "nmt_4layer", "haswell_k40x2"),
                 ("rnnlm@hsdag_cpu_gpu", "rnnlm", "hsdag_cpu_gpu"),
                 ("doppler/8gpu_transformer_block.txt", "doppler/8gpu_transformer_block.txt",
                  None),
                 ("msr/throughput-inputs/LayerGraphs/bert24_training.json",
                  "msr/throughput-inputs/LayerGraphs/bert24_training.json", None))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baselines", required=True, metavar="B.JSON")
    ap.add_argument("--rows", default="", help="comma-separated substrings of row labels")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--budget-s", type=float, default=1.8)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--training", action="store_true",
                    help="rows the policy was trained on, without baselines")
    ap.add_argument("--finetune", action="store_true",
                    help="rl-universal fine-tuned from the shipped weights instead")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="an rl-universal option, with --finetune")
    ap.add_argument("--method", default=None,
                    help="another method instead (such as local), counted as --finetune")
    args = ap.parse_args()
    if args.method and args.finetune:
        ap.error("give --finetune or --method, not both")

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pretrained as bench

    from simplace.compile_cache import enable
    from simplace.cost_model import CostModel
    from simplace.placers import optimize
    from simplace.placers import pretrained as placer
    from simplace.rl import distribution as dist
    from simplace.rl import guided, refine

    enable()
    modules = {"guided": guided, "pretrained": placer, "refine": refine}
    for item in args.set:
        name, _, value = item.partition("=")
        prefix, _, name = name.rpartition(".")
        module = modules.get(prefix or "guided")
        if module is None or not hasattr(module, name):
            ap.error(f"no constant {item.partition('=')[0]!r}: give NAME (of "
                     f"simplace.rl.guided) or MODULE.NAME, MODULE one of {sorted(modules)}")
        setattr(module, name, ast.literal_eval(value))
    if args.option and not args.finetune:
        ap.error("--option is for rl-universal: give --finetune too")
    options = {name: _literal(value)
               for name, _, value in (item.partition("=") for item in args.option)}
    with open(args.baselines) as f:
        base = json.load(f)
    for m in (200, 3000):
        g0 = dist.random_dag(m, 0)
        optimize(g0, CostModel.load("haswell_k40x4").price(g0), "rl-pretrained")
    want = [w for w in args.rows.split(",") if w]
    counted = args.finetune or bool(args.method)  # no slower than local, not within 2 s
    seeds = [int(s) for s in args.seeds.split(",")]
    ratios, raw = [], []
    for label, model, mach in TRAINING_ROWS if args.training else bench._rows("all"):
        if want and not any(w in label for w in want):
            continue
        if not args.training and label not in base:
            print(f"{label}: no baseline in {args.baselines}, skipped")
            continue
        g, inp = bench._problem(model, mach)
        cells, row = [], []
        for seed in seeds:
            gc.collect()
            t0 = time.perf_counter()
            if args.method:
                r = optimize(g, inp, args.method, seed=seed, budget_s=args.budget_s)
            elif args.finetune:
                r = optimize(g, inp, "rl-universal", seed=seed, budget_s=args.budget_s,
                             warm_start="pretrained", **options)
            else:
                r = optimize(g, inp, "rl-pretrained", seed=seed, budget_s=args.budget_s)
            wall = time.perf_counter() - t0
            rounds = (r.info.get("rounds") if args.method else
                      r.info.get("guided" if args.finetune else "refine", {}).get("rounds"))
            if args.training:
                raw.append(r.step_time_s)
                cells.append(f"{r.step_time_s:.5g} ({wall:.2f}s,{rounds}r)")
                continue
            ratio = r.step_time_s / base[label]["local_s"]
            # a zero-shot call past 2 s does not count, whatever its placement
            row.append(ratio if counted or wall <= 2.0 else np.inf)
            cells.append(f"{ratio:.3f} ({wall:.2f}s,{rounds}r)")
        ratios.append(row)
        print(f"{label[-45:]:45s} " + "  ".join(cells), flush=True)
    if args.training:
        print(f"geomean step time over rows and seeds: {np.exp(np.mean(np.log(raw))):.6g}; "
              f"load {os.getloadavg()[0]:.2f}")
        return
    if not ratios:
        return
    ratios = np.array(ratios)
    if counted:
        within = [int((ratios[:, i] <= 1.0).sum()) for i in range(len(seeds))]
        print(f"no slower than local, per seed: {within} of {len(ratios)}; "
              f"load {os.getloadavg()[0]:.2f}")
        return
    within = [int((ratios[:, i] <= 1.10).sum()) for i in range(len(seeds))]
    print(f"within 10% of local in at most 2 s, per seed: {within} of {len(ratios)}; "
          f"load {os.getloadavg()[0]:.2f}")


def _literal(text: str):
    """A Python literal (a number, a list), else the text itself (a method name)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


if __name__ == "__main__":
    main()

"""``simplace train-policy``: train the universal placement policy over many graphs and
machines (``simplace.rl.distribution``) and write its weights with their card."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``train-policy`` command to the CLI's subparsers."""
    from simplace._argtypes import budget_seconds, float_range, int_range, seed

    sp = subparsers.add_parser(
        "train-policy", help="train the pretrained placement policy over many graphs",
        description="Train the universal policy (rl-pretrained) by REINFORCE over the "
                    "training distribution: zoo graphs at several sizes, random DAGs and "
                    "imported graphs on the datasheet machines and random variants of "
                    "them. Held-out models and machines are never used. Seeded and "
                    "resumable (--checkpoint).")
    sp.add_argument("--out", required=True, help="weights file to write (.npz)")
    sp.add_argument("--checkpoint", help="checkpoint to resume from and save to (.npz); "
                    "the imitation targets are kept beside it (.targets.json)")
    sp.add_argument("--budget-s", type=budget_seconds, help="training time in seconds "
                    "(after the problems are built)")
    sp.add_argument("--updates", type=int_range(1, None, "a number of updates"),
                    help="updates in all (default: stop at --budget-s)")
    sp.add_argument("--seed", type=seed, default=0)
    sp.add_argument("--target-budget-s", type=float_range(0.0, 600.0), default=1.5,
                    help="seconds of local search per problem for its first imitation "
                    "target (0: none; default 1.5)")
    sp.add_argument("--init-weights", metavar="WEIGHTS.NPZ",
                    help="start from these weights (a file --out wrote, or 'shipped') "
                    "instead of fresh ones: more training on other targets or problems")
    sp.add_argument("--variants", type=int_range(0, 64, "a number of variants"), default=1,
                    help="random variants of each zoo graph's machine (default 1)")
    sp.add_argument("--shared-variants", type=int_range(0, 64, "a number of variants"),
                    default=0, help="more variants whose host is split into virtual "
                    "devices sharing its hardware (default 0)")
    sp.add_argument("--dags", type=int_range(0, 10_000, "a number of graphs"), default=24,
                    help="random layered DAGs (default 24)")
    sp.add_argument("--quick", action="store_true",
                    help="a handful of small problems (a smoke run)")
    sp.set_defaults(func=run)
    return sp


def run(args) -> int:
    """Build the problems, train, write the weights and their card."""
    from simplace.errors import SimplaceError
    from simplace.rl import distribution as dist
    from simplace.rl.pretrain import train_universal
    from simplace.rl.pretrained import load_weights, save_weights

    if args.budget_s is None and args.updates is None:
        raise SimplaceError("train-policy needs --budget-s or --updates (or both).")

    def say(msg):
        print(msg, file=sys.stderr, flush=True)

    # Read first: a wrong path fails before minutes of building problems.
    init, before = None, None
    if args.init_weights is not None:
        init, meta = load_weights(None if args.init_weights == "shipped" else args.init_weights)
        before = meta.get("card", {})
    targets_path = None if args.checkpoint is None else args.checkpoint + ".targets.json"
    targets = {}
    if targets_path and os.path.isfile(targets_path):
        with open(targets_path) as f:
            targets = json.load(f)
    t0 = time.perf_counter()
    problems = dist.training_problems(args.seed, quick=args.quick,
                                      target_budget_s=args.target_budget_s,
                                      targets=targets, progress=say,
                                      variants=args.variants, shared=args.shared_variants,
                                      dags=args.dags)
    if targets_path:
        with open(targets_path, "w") as f:
            json.dump(targets, f)
    build_s = time.perf_counter() - t0
    params, info = train_universal(problems, updates=args.updates, budget_s=args.budget_s,
                                   seed=args.seed, checkpoint=args.checkpoint, progress=say,
                                   params=init)
    gaps = [p.best_s for p in problems]
    card = {
        "summary": f"{info['updates']} updates over {len(problems)} problems, seed "
                   f"{args.seed}",
        "command": "simplace train-policy " + " ".join(sys.argv[2:]),
        "problems": [p.name for p in problems], "held_out_models": dist.HELD_OUT_MODELS,
        "held_out_machines": dist.HELD_OUT_MACHINES,
        "held_out_imported": dist.HELD_OUT_IMPORTED, "seed": args.seed,
        "updates": info["updates"], "train_wall_s": info["wall_s"],
        "build_wall_s": round(build_s, 1), "curve": info["curve"],
        "host": platform.node(), "cpus": os.cpu_count(),
        "date": datetime.date.today().isoformat(), "best_s": dict(zip(
            [p.name for p in problems], gaps, strict=True))}
    if before is not None:
        # What the starting weights had been trained on stays on the card.
        card["continued_from"] = {"weights": args.init_weights,
                                  **{k: before.get(k) for k in ("summary", "command", "updates",
                                                                "train_wall_s", "seed", "date",
                                                                "note")}}
    save_weights(args.out, params, card)
    say(f"wrote {args.out}: {card['summary']}, {info['wall_s']:.0f} s of training")
    return 0

"""The ``simplace optimize`` flags of the REINFORCE methods (``--method rl-*``).

``add_rl_args(parser)`` adds them to the optimize subcommand; ``rl_options(args)`` turns
the parsed flags into ``optimize(..., **options)`` keyword options (only those given, so
other methods see no unknown options).
"""

from __future__ import annotations

import argparse

from simplace._argtypes import int_range, positive_int, positive_seconds
from simplace.errors import SimplaceError

# Placements per update: each is simulated in one batch, memory grows with samples x ops.
MAX_SAMPLES = 8192


def add_rl_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--episodes --samples --warm-start --history --checkpoint`` (rl-* only)."""
    g = parser.add_argument_group("REINFORCE methods (rl-seq2seq, rl-hierarchical, rl-gnn, "
                                  "rl-universal)")
    g.add_argument("--episodes", type=positive_int, default=None,
                   help="sampled placements in all (deterministic for a seed), rounded up "
                        "to whole updates of --samples; default: until --budget-s, or 2048 "
                        "without it")
    g.add_argument("--samples", type=int_range(1, MAX_SAMPLES), default=None,
                   help=f"placements sampled and simulated per update, 1..{MAX_SAMPLES} "
                        "(default 64)")
    g.add_argument("--warm-start", default=None, metavar="METHOD",
                   help="start from a heuristic's placement: a method, comma-separated "
                        "methods, 'pretrained' (the pretrained policy's zero-shot "
                        "placement; rl-universal also starts from its weights) or 'best' "
                        "(every fast heuristic); the result is never worse than it")
    g.add_argument("--history", default=None, metavar="H.JSON",
                   help="write the reward curve (one row per update) and H.png, its plot")
    g.add_argument("--checkpoint", default=None, metavar="CK.NPZ",
                   help="save training state there; a stopped run resumes from it")
    g.add_argument("--checkpoint-every", type=positive_seconds, default=None, metavar="S",
                   dest="checkpoint_every_s",
                   help="with --checkpoint: also save it every S seconds of training "
                        "(default 30), so an interrupted run loses at most S seconds")


# The options these flags give, by name.
_FLAGS = ("episodes", "samples", "warm_start", "history", "checkpoint", "checkpoint_every_s")


def rl_options(args: argparse.Namespace) -> dict:
    """``optimize`` options from the parsed flags; a progress bar when a method is rl-*."""
    opts = {}
    for name in _FLAGS:
        val = getattr(args, name, None)
        if val is not None:
            opts[name] = val
    if opts.get("samples") is not None and opts["samples"] < 1:
        raise SimplaceError(f"--samples must be >= 1, got {opts['samples']}.")
    if opts.get("episodes") is not None and opts["episodes"] < 1:
        raise SimplaceError(f"--episodes must be >= 1, got {opts['episodes']}.")
    method = getattr(args, "method", "")
    if opts.get("checkpoint_every_s") is not None and "checkpoint" not in opts:
        raise SimplaceError("--checkpoint-every needs --checkpoint CK.NPZ (where to save).")
    from simplace.placers import method_kind, methods

    policy = method in methods() and method_kind(method) == "policy"
    if opts and not policy:
        flag = next(iter(opts)).removesuffix("_s").replace("_", "-")
        raise SimplaceError(f"--{flag} applies to the rl-* "
                            f"methods only, not --method {method}.")
    if policy:
        from simplace.placers import method_options

        # Each policy takes its own options: rl-universal has no episodes or history.
        declared = method_options(method)
        other = [k for k in opts if k not in declared]
        if other:
            flag = other[0].removesuffix("_s").replace("_", "-")
            takes = [f"--{k.removesuffix('_s').replace('_', '-')}" for k in _FLAGS
                     if k in declared]
            raise SimplaceError(f"--{flag} does not apply to --method {method}; of these "
                                f"flags it takes {', '.join(takes) or 'none'}.")
        if "progress_bar" in declared:
            opts["progress_bar"] = True
    return opts

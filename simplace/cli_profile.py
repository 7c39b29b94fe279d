"""``simplace profile``: a model's own ops timed on this host in chunks (the profile
that prices its placements), or the list of the profiles made."""

from __future__ import annotations

import time

from simplace import _argtypes
from simplace.cli_model import devices_of, load_program, make_profile
from simplace.cli_report import _table


def cmd_profile(args) -> int:
    """``simplace profile``: time a model's own ops on this host, or list profiles."""
    from simplace.cost_model import CostModel
    from simplace.errors import OptionError

    if args.list:
        return _list_profiles()
    if args.model is None or args.cost_model is None:
        raise OptionError("simplace profile needs MODEL and --cost-model NAME (or --list).")
    if args.chunks < 1:
        raise OptionError(f"--chunks must be >= 1, got {args.chunks}.")
    from simplace.models import is_graph_file

    if is_graph_file(args.model):
        raise OptionError(f"'{args.model}' is a saved graph: profiling runs the model, so "
                          "name the zoo model or file.py:factory it was traced from.")

    cost_model = CostModel.load(args.cost_model, args.cost_model_dir)
    from simplace._devices import match_cpu_cost_model

    match_cpu_cost_model(cost_model)  # before JAX starts: a model of N virtual CPUs
    devices_of(cost_model)  # this machine's devices, or a clear error now
    program, run_args, _ = load_program(args)
    t0 = time.perf_counter()
    budget_s = None
    if args.budget_s is not None:  # counted from the command's start, as everywhere
        budget_s = args.budget_s - (t0 - getattr(args, "started_s", t0))
    prof, path = make_profile(args, cost_model, program, run_args, resume=args.resume,
                              budget_s=budget_s)
    wall_s = time.perf_counter() - t0
    print(prof.summary())
    for kind, chunks in sorted(prof.chunks.items()):
        timed = [c for c in chunks if not c.estimated]
        step_s = sum(c.measured_s for c in timed)
        est = [c for c in chunks if c.estimated]
        print(f"  {kind} ({prof.devices[kind][1]}): {len(timed)} chunks timed, adding up to "
              f"{step_s * 1e3:.3f} ms (one step run chunk by chunk)"
              + (f"; {len(est)} estimated from the calibration (ops {est[0].first}.."
                 f"{est[0].stop}: {est[0].error})" if est else ""))
    if not prof.complete:
        done = sum(len(c) for c in prof.chunks.values())
        total = len(prof.bounds) * len(prof.chunks)
        print(f"stopped at the {args.budget_s:g} s budget: {done} of {total} chunks timed, "
              f"kept in {path} ({wall_s:.1f} s). An incomplete profile prices nothing: "
              f"`simplace profile {args.model} --cost-model {args.cost_model} --resume` "
              "(same sizes) goes on from them.")
        return 0
    print(f"profile written to {path} ({wall_s:.1f} s)")
    return 0


def _list_profiles() -> int:
    from simplace import paths
    from simplace.profile import list_profiles

    found = list_profiles()
    if not found:
        print(f"no profiles in {paths.profile_dir()}")
        return 0
    rows = []
    for path, prof in found:
        if isinstance(prof, str):
            rows.append([path.parent.name, "-", "-", "-", "-", "BAD: " + prof[-60:], str(path)])
            continue
        rows.append([prof.cost_model, prof.graph_name or prof.graph_hash[:12],
                     f"{prof.num_ops:,}", ",".join(sorted(prof.chunks)),
                     str(len(prof.bounds)),
                     ("complete" if prof.complete else "INCOMPLETE")
                     + (f", {prof.num_estimated} estimated" if prof.num_estimated else "")
                     + f", {prof.date}", str(path)])
    print(_table(rows, ["machine", "graph", "ops", "kinds", "chunks", "state", "file"]))
    return 0


def _add_profile_parser(sub) -> None:
    """``simplace profile``'s parser."""
    from simplace import paths

    sp = sub.add_parser(
        "profile", help="time a model's own ops on this machine, to price placements",
        description="Cut the model's graph into chunks of about equal estimated work, run "
                    "each as one jitted computation on one device of each kind of the "
                    "machine, and scale the cost model's op times to the measured times. "
                    "simulate, optimize and validate use the profile from then on (say so, "
                    "and skip it with --no-profile). Written to profiles/MACHINE/ in the "
                    "user directory ($SIMPLACE_HOME).")
    sp.add_argument("model", metavar="MODEL", nargs="?",
                    help="zoo name, path/file.py:factory or package.module:factory (the "
                         "model must run)")
    sp.add_argument("--batch", type=_argtypes.batch_size, default=None,
                    help="batch size (default: the model's)")
    sp.add_argument("--inference", action="store_true",
                    help="profile inference instead of a training step")
    sp.add_argument("--small", action="store_true", help="tiny sizes of a zoo model")
    sp.add_argument("--cost-model", default=None, metavar="NAME",
                    help=paths.CLI_COST_MODEL_HELP + " (the machine: this host)")
    sp.add_argument("--cost-model-dir", default=None, metavar="DIR",
                    help=paths.CLI_COST_MODEL_DIR_HELP)
    sp.add_argument("--chunks", type=_argtypes.positive_int, default=24, metavar="N",
                    help="chunks to cut the graph into (default 24)")
    sp.add_argument("--resume", action="store_true",
                    help="go on from an interrupted profile (its chunks are kept)")
    sp.add_argument("--repeats", dest="profile_repeats", type=_argtypes.positive_int,
                    default=None, metavar="N", help="timed runs of each chunk at least "
                                                   "(default 3)")
    sp.add_argument("--budget-s", type=_argtypes.nonnegative_seconds, default=None,
                    metavar="S", help="wall time of the whole command: no chunk is begun "
                    "that would end past it, and the chunks timed are kept (--resume goes "
                    "on from them; default: no limit)")
    sp.add_argument("--chunk-budget-s", type=_argtypes.nonnegative_seconds, default=None,
                    metavar="S", help="timing budget per chunk once --repeats are done "
                                      "(default 0.3 s)")
    sp.add_argument("--list", action="store_true", help="list the profiles made")
    sp.set_defaults(func=cmd_profile)

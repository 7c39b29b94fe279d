"""``simplace validate`` and the ``--validate-every``/``--top-k`` options of ``optimize``.

Wiring in ``simplace/cli.py`` (``build_parser`` and ``cmd_optimize``)::

    from simplace.validate import cli as validate_cli
    validate_cli.add_parser(sub)                    # the `validate` subcommand
    validate_cli.add_validate_args(optimize_parser) # --validate-every N --top-k K ...
    opts = validate_cli.validate_options(args, graph, cost_model, progress)
    best = optimize(graph, cost_model, args.method, ..., **opts)
    print(validate_cli.report_winner(best, graph, cost_model, opts))
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import numpy as np

from simplace import _argtypes, paths
from simplace.cli_model import devices_of, load_program
from simplace.errors import SimplaceError
from simplace.progress import note


def _model_args(sp) -> None:
    sp.add_argument("model", metavar="MODEL",
                    help="zoo name, path/file.py:factory or package.module:factory (the "
                         "model must run: a saved graph .json cannot be validated)")
    sp.add_argument("--batch", type=_argtypes.batch_size, default=None,
                    help="batch size (default: the model's)")
    sp.add_argument("--inference", action="store_true", help="inference instead of training")
    sp.add_argument("--small", action="store_true", help="tiny sizes of a zoo model")


def _timing_args(sp) -> None:
    sp.add_argument("--repeats", type=_argtypes.positive_int, default=5, metavar="N",
                    help="timed runs of each placement at least (default 5)")
    sp.add_argument("--budget-s", dest="timing_budget_s",
                    type=_argtypes.nonnegative_seconds, default=1.0,
                    metavar="S", help="timing budget per placement once --repeats are done "
                                      "(default 1 s)")
    sp.add_argument("--records-dir", default=None, metavar="DIR",
                    help=paths.CLI_RECORDS_DIR_HELP)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``simplace validate`` to ``subparsers``; returns its parser."""
    sp = subparsers.add_parser(
        "validate", help="run placements on this machine: predicted vs measured step time",
        description="Run each placement for real, compare the measured step time with the "
                    "cost model's predictions, raw (without drift corrections) and corrected "
                    "side by side (relative error, MAPE, Kendall tau), append the "
                    "records to calibration/NAME/validation.jsonl, and with --update fit drift "
                    "corrections into the cost model.")
    _model_args(sp)
    sp.add_argument("--cost-model", required=True, metavar="NAME",
                    help=paths.CLI_COST_MODEL_HELP)
    sp.add_argument("--cost-model-dir", default=None, metavar="DIR",
                    help=paths.CLI_COST_MODEL_DIR_HELP + "; --update writes the corrected "
                         "model there (default: back to a file of the user's, or to the "
                         "user directory for a machine of the project's)")
    sp.add_argument("placements", nargs="+", metavar="P.JSON", help="placement files")
    sp.add_argument("--top-k", type=_argtypes.positive_int, default=None, metavar="K",
                    help="validate only the K placements predicted fastest")
    sp.add_argument("--update", action="store_true",
                    help="fit drift corrections on this machine's validation records (of this "
                         "model) and write them into the cost model file")
    sp.add_argument("--held-out", type=_argtypes.float_range(0, 1, hi_open=True,
                                                             what="fraction"),
                    default=0.5, metavar="FRACTION",
                    help="with --update: share of records held out to report how the "
                         "correction generalises (default 0.5)")
    sp.add_argument("--force", action="store_true",
                    help="validate placements made for another machine of the same size "
                         "(device k of one becomes device k of the other)")
    sp.add_argument("--no-profile", action="store_true",
                    help="predict with the cost model alone, not with this model's profile "
                         "on the machine (`simplace profile`)")
    _timing_args(sp)
    sp.set_defaults(func=run)
    return sp


def add_validate_args(parser: argparse.ArgumentParser) -> None:
    """``--validate-every N``, ``--top-k K`` (and timing options) for ``optimize``."""
    g = parser.add_argument_group("validation during the search (local search, RL)")
    g.add_argument("--validate-every", type=_argtypes.nonnegative_int, default=None,
                   metavar="N",
                   help="run the K best candidates on this machine every N updates (RL) or "
                        "rounds (local search) and at the end, fit drift corrections and go "
                        "on against the corrected model (0: only at the end)")
    g.add_argument("--top-k", type=_argtypes.positive_int, default=3, metavar="K",
                   help="candidates validated each time (default 3)")
    g.add_argument("--validation-repeats", dest="repeats", type=_argtypes.positive_int,
                   default=5, metavar="N",
                   help="timed runs per validated candidate at least (default 5)")
    g.add_argument("--validation-budget-s", dest="timing_budget_s",
                   type=_argtypes.nonnegative_seconds, default=1.0,
                   metavar="S", help="timing budget per validated candidate (default 1 s)")
    g.add_argument("--records-dir", default=None, metavar="DIR",
                   help=paths.CLI_RECORDS_DIR_HELP)


def _timing(args) -> dict:
    if args.repeats < 1 or not args.timing_budget_s >= 0:
        raise SimplaceError("--repeats must be >= 1 and the timing budget >= 0 seconds.")
    return {"warmup": 2, "min_repeats": int(args.repeats), "max_repeats": max(
        int(args.repeats), 50), "budget_s": float(args.timing_budget_s)}


def run(args) -> int:
    """``simplace validate``: see ``add_parser``."""
    from simplace._devices import match_cpu_cost_model
    from simplace.cost_model import CostModel
    from simplace.placement import Placement
    from simplace.sim import simulate
    from simplace.validate import (
        append_records,
        fit_drift,
        read_records,
        split_records,
        validate,
        validation_path,
    )
    from simplace.validate.drift import priced_with_raw

    if not 0 <= args.held_out < 1:
        raise SimplaceError(f"--held-out must be in [0, 1) (0: no held-out check), got "
                            f"{args.held_out}.")
    cost_model_file = paths.find_cost_model(args.cost_model, args.cost_model_dir)
    cost_model = CostModel.load(cost_model_file)
    match_cpu_cost_model(cost_model)  # a model measured on N virtual CPU devices runs on N
    devices = devices_of(cost_model)
    # Placement files are read before the model is built and run, so a bad one fails at once.
    placements = [Placement.load(p) for p in args.placements]
    program, run_args, spec = load_program(args)
    graph = program.graph
    from simplace.cli_model import use_profile

    cost_model = use_profile(args, cost_model, graph)
    for k, (path, p) in enumerate(zip(args.placements, placements, strict=True)):
        try:
            p.check(graph, cost_model, force=args.force)
        except SimplaceError as err:
            raise type(err)(f"{path}: {err}") from None
        if args.force:  # from here on it is a placement of this machine
            placements[k] = p = dataclasses.replace(
                p, cost_model=cost_model.name, device_names=tuple(cost_model.device_names))
        p.meta.setdefault("label", Path(path).stem)
    if args.top_k is not None:
        if args.top_k < 1:
            raise SimplaceError(f"--top-k must be >= 1, got {args.top_k}.")
        priced, _ = priced_with_raw(graph, cost_model)  # validate reuses the raw problem
        pred = [simulate(graph, priced, p.assignment).step_time_s for p in placements]
        placements = [placements[k] for k in np.argsort(pred, kind="stable")[:args.top_k]]
    records_path = validation_path(cost_model.name, args.records_dir)

    report = validate(graph, cost_model, placements, program=program, args=run_args,
                      devices=devices, timing=_timing(args), progress=note)
    records = [dict(r, model_spec=spec) for r in report.records]
    append_records(records_path, records)
    print(report.table())
    print(f"{len(records)} records appended to {records_path}")
    if args.update:
        mine = [r for r in read_records(records_path)
                if r["graph_hash"] == graph.hash and r["cost_model"] == cost_model.name]
        if len(mine) < 2:
            raise SimplaceError(f"--update needs at least 2 validation records of this model "
                                f"on {cost_model.name}; {records_path} has {len(mine)}. "
                                "Validate more placements first.")
        if cost_model.profile is not None:
            # The corrections go into the machine's file and so price every model on
            # it: they are fitted to the cost model's own predictions, not this
            # model's profile.
            cost_model = cost_model.with_profile(None)
            print("(drift corrections are fitted without the profile: they are the "
                  "machine's, for every model)")
        if 0 < args.held_out < 1 and len(mine) >= 4:
            fit, held = split_records(mine, 1 - args.held_out)
            check = fit_drift(fit, [graph], cost_model, held_out=held,
                              note="held-out check of `simplace validate --update`")
            print("\ndrift correction, fitted on part of the records (how it generalises):")
            print(check.summary())
        res = fit_drift(mine, [graph], cost_model,
                        note=f"`simplace validate --update` on {len(mine)} records")
        print("\ndrift correction fitted on all records of this model:")
        print(res.summary())
        # Never over a shipped or committed machine: those go to the user directory.
        path = paths.cost_model_write_path(cost_model.name, args.cost_model_dir,
                                           read_from=cost_model_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        res.cost_model.save(path)
        print(f"corrected cost model written to {path} "
              f"({len(res.corrections.history)} corrections in its history)")
    return 0


def validate_options(args, graph, cost_model, progress=None) -> dict:
    """Options for ``optimize`` that validate during the search (``{}`` unless
    ``--validate-every`` was given): the search session's hook ``validate`` (a
    ``simplace.validate.SearchValidation``), ``validate_every`` (rounds of local search,
    updates of RL; 0: at the end only) and ``top_k``."""
    if getattr(args, "validate_every", None) is None:
        return {}
    if args.validate_every < 0 or args.top_k < 1:
        raise SimplaceError("--validate-every must be >= 0 and --top-k >= 1.")
    from simplace.placers import is_search, methods, methods_of_kind

    if args.method not in methods() or not is_search(args.method):
        searches = methods_of_kind("annealer", "policy")
        raise SimplaceError(f"--validate-every needs a search method that takes a validation "
                            f"callback ({', '.join(searches)}), not '{args.method}'.")
    from simplace._devices import match_cpu_cost_model
    from simplace.validate import make_validation_callback, validation_path

    match_cpu_cost_model(cost_model)
    # The search validates later, with the Python-facing hint: check the devices now.
    devices_of(cost_model)
    program, run_args, _ = load_program(args)
    if program.graph.hash != graph.hash:
        raise SimplaceError("The model does not trace to the same graph when run for real; "
                            "check --batch/--inference/--small.")
    # The session spaces the calls (every N steps, and at the end): the hook acts on each.
    hook = make_validation_callback(
        graph, None, run_args, cost_model, top_k=args.top_k, every=1, program=program,
        timing=_timing(args), records_path=validation_path(cost_model.name, args.records_dir),
        progress=progress)
    return {"validate": hook, "validate_every": int(args.validate_every),
            "top_k": max(int(args.top_k), 5)}


def report_winner(best, graph, cost_model, options: dict) -> str:
    """Predicted (by the raw, uncorrected model and by the last corrected one) and
    measured step time of the winner of a search run with ``validate_options``; '' when
    there was no validation."""
    cb = options.get("validate")
    if cb is None:
        return ""
    key = np.asarray(best.placement, dtype=np.int32).tobytes()
    measured = cb.measured.get(key)
    # The model the search judged its winner by (drift-corrected if validation fitted one).
    model = best.cost_model if best.cost_model is not None else cost_model
    if measured is None:  # the winner was never among the validated candidates
        from simplace.hardware.executor import measure

        placed = cb.program.place(best.placement, cost_model=model)
        measured = measure(placed, cb.run_args, **cb.timing).step_time_s
    from simplace.sim import simulate
    from simplace.validate.drift import priced_with_raw

    priced, raw_priced = priced_with_raw(graph, model)  # the search's raw problem, reused
    raw = float(simulate(graph, raw_priced, best.placement).step_time_s)
    pred = float(simulate(graph, priced, best.placement).step_time_s)

    def err(t):
        return f"{100 * (t - measured) / measured:+.1f}%"

    if model.corrections.is_identity:
        corr = "corrected: the same (no drift corrections)"
    else:
        whose = ("fitted during the search" if model is not cost_model
                 else "the cost model's own")
        corr = f"corrected {pred * 1e3:.3f} ms ({err(pred)}; corrections {whose})"
    lines = [f"validated winner: predicted raw {raw * 1e3:.3f} ms ({err(raw)}), {corr}; "
             f"measured {measured * 1e3:.3f} ms",
             f"validations: {len(cb.reports)}, drift fits: {len(cb.fits)}, records: "
             f"{len(cb.records)}"]
    if cb.fits:
        lines.append("last drift fit: " + cb.fits[-1].summary().splitlines()[0])
    if cb.reports and not math.isnan(cb.reports[-1].raw_mape):
        last = cb.reports[-1]
        lines.append(f"MAPE of the last validation: raw {100 * last.raw_mape:.1f}%"
                     + (f", corrected {100 * last.mape:.1f}%" if last.corrected else ""))
    return "\n".join(lines)

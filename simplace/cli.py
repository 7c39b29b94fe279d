"""The ``simplace`` command line: the parser, ``main`` (exit codes, signals, the checks of
output paths) and ``simplace optimize``. Each subcommand is one function
``cmd_<name>(args)``: the others live in ``cli_listing`` (models, graph, methods),
``cli_simulate`` and ``cli_profile``, or with their stage of the loop (``calibrate``,
``validate``, ``parallelize``, ``train-policy``); what they print is ``cli_report``'s."""

from __future__ import annotations

import argparse
import sys
import time

from simplace import _argtypes, cli_warmup
from simplace.cli_listing import cmd_graph, cmd_methods, cmd_models
from simplace.cli_model import _TERMINATED, problem_from_args, raise_if_terminated
from simplace.cli_outputs import OUTPUT_DIRS, OUTPUT_FILES, check_outputs
from simplace.cli_profile import _add_profile_parser, cmd_profile
from simplace.cli_report import _budget_line, _interrupted_line, report_result, results_table
from simplace.cli_simulate import cmd_simulate
from simplace.errors import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OOM,
    EXIT_USAGE,
    SimplaceError,
)
from simplace.progress import note

# Defined in the modules of the commands, and imported from here.
__all__ = ["OUTPUT_DIRS", "OUTPUT_FILES", "check_outputs", "cmd_graph", "cmd_methods",
           "cmd_models", "cmd_profile", "cmd_simulate", "console_main", "main",
           "report_result", "results_table"]

EXIT_CODES = f"""exit codes:
  0    success
  {EXIT_ERROR}    an unexpected error (a bug: please report it with its traceback), or a
       file that could not be read or written
  {EXIT_USAGE}    bad input: options, numbers, files, model names; the message says what
       to mend (nothing has been written)
  {EXIT_OOM}    the placement does not fit the machine's memory (OOM); it is still printed,
       and saved with "oom": true
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C or SIGTERM)"""


# ---------------------------------------------------------------------------- optimize
# The optimize command stays in this module with its stop watch: both read ``note`` and
# ``STOP_GRACE_S`` from here, where the interrupt tests replace them.
def cmd_optimize(args) -> int:
    """``simplace optimize``: search placements with one method or all of them."""
    from simplace.placers import best_of, compare, methods, optimize
    from simplace.sim import lower_bound
    from simplace.validate import cli as validate_cli

    if args.method != "all" and args.method not in methods():
        raise SimplaceError(f"Unknown --method {args.method!r}: use one of "
                            f"{', '.join(methods())} or 'all' (see `simplace methods`).")
    if getattr(args, "checkpoint", None):
        from simplace.rl import checkpoint

        checkpoint.check(args.checkpoint)  # a file that is no checkpoint: before tracing
    if args.no_profile:
        args.profile = "never"
    graph, cost_model = problem_from_args(args, match_devices=(
        args.validate_every is not None or args.profile != "never"))
    print(graph.summary(top=5))
    print(f"machine {cost_model.name} ({cost_model.provenance.source}, "
          f"{cost_model.num_devices} devices)")

    progress = note  # search, validation and signal messages, on stderr
    bound_s = lower_bound(graph, cost_model)
    from simplace.rl.cli_args import rl_options

    options = {**rl_options(args),
               **validate_cli.validate_options(args, graph, cost_model, progress)}
    if getattr(args, "start", None) is not None:
        options["starts"] = [_start_placement(args, graph, cost_model)]
    from simplace.search import stop_on_signals

    # A signal before the search (tracing, profiling, compiling the bound) ends the
    # command there, even one whose KeyboardInterrupt was lost in a callback: no result,
    # nothing written.
    raise_if_terminated()
    t_search = time.perf_counter()
    search_budget_s = _search_budget(args, t_search)
    # Ctrl-C or SIGTERM: the search stops at its next step and returns its best so far,
    # which is saved below before exiting 130 (a second signal stops at once).
    found: list = []  # --method all: each method's result as it comes
    watch = _StopWatch(args, graph, cost_model, found)

    def on_stop(message: str) -> None:
        progress(message)
        if args.method == "all":
            watch.arm(message.split(":", 1)[0])

    try:
        with stop_on_signals(message=on_stop) as interrupt:
            if args.method == "all":
                results = compare(graph, cost_model, seed=args.seed,
                                  budget_s=search_budget_s, progress=progress, found=found)
                watch.done()
                if interrupt["signal"] and not results:
                    print(f"interrupted ({interrupt['signal']}) before any method returned "
                          "a placement: nothing saved.", file=sys.stderr)
                    return EXIT_INTERRUPTED
                print()
                print(results_table(results, bound_s))
                best = best_of(results)
            else:
                best = optimize(graph, cost_model, args.method, seed=args.seed,
                                budget_s=search_budget_s, progress=progress, **options)
    finally:
        watch.done()  # also on a second signal's KeyboardInterrupt: no timer left behind
    search_s = time.perf_counter() - t_search
    raise_if_terminated()  # lost on the way in: the run is not complete, --out untouched
    interrupted = interrupt["signal"]
    print(f"\nbest: {best.method} ({best.wall_s:.2f} s of its own search)"
          if args.method == "all" else f"\nbest: {best.method}")
    # the wall time the user waited for the answer: start-up and tracing included, as
    # the budget counts them
    waited_s = max(time.perf_counter() - getattr(args, "started_s", t_search), search_s)
    print(_budget_line(best, args.budget_s, waited_s, args.method == "all"))
    # A method's notes (why it returned one device, repaired its memory, stopped early).
    for key in sorted(k for k in best.info if k == "note" or k.startswith("note_")):
        if isinstance(best.info[key], str) and best.info[key]:
            print(f"note: {best.info[key]}")
    judged = best.cost_model if best.cost_model is not None else cost_model
    if judged is not cost_model:
        # Like with like: the winner and the bound under the model the search judged by.
        bound_s = lower_bound(graph, judged)
        print("(simulated under the drift-corrected cost model fitted during the search)")
    print(report_result(best, cost_model, bound_s))
    if best.oom:
        print("No placement found fits the machine's memory (OOM): the model needs more "
              "memory than these devices have, or a method that splits it further.")
    validated = validate_cli.report_winner(best, graph, cost_model, options)
    if validated:
        print(validated)
    out = _save_best(args, graph, cost_model, best, interrupted)
    if interrupted:
        print(_interrupted_line(interrupted, best, out), file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OOM if best.oom else 0


def _save_best(args, graph, cost_model, best, interrupted) -> str | None:
    """Write ``best`` to ``--out`` (when interrupted without one, to a file in the
    working directory, so that nothing is lost); returns the path written."""
    from simplace.placement import Placement

    out = args.out
    if interrupted and not out:
        out = f"{args.method}-interrupted.json"
    if out:
        meta = {"seed": args.seed, "budget_s": args.budget_s, "wall_s": best.wall_s,
                "stop": "interrupted" if interrupted else best.info.get("stop")}
        Placement(assignment=best.placement, graph_hash=graph.hash,
                  cost_model=cost_model.name, device_names=tuple(cost_model.device_names),
                  method=best.method, predicted_step_time_s=best.step_time_s,
                  meta=meta, oom=best.oom).save(out)
        print(f"placement saved to {out}" + (" (marked oom)" if best.oom else ""))
    return out


# After the first signal, ``--method all`` waits this long for the method running to
# reach its next step; past it (a policy compiling for many seconds), the best placement
# found so far is saved and the command exits 130 (the promise: within 5 s).
STOP_GRACE_S = 4.0


class _StopWatch:
    """``--method all``'s promise on a signal: exit within ``STOP_GRACE_S`` with the best
    so far saved. Armed by the first signal (``arm``, from the signal handler); if the
    search has not returned by then (``done``), a timer thread saves the best of the
    results so far and ends the process (``os._exit``: the main thread may be inside a
    compilation, which cannot be interrupted)."""

    def __init__(self, args, graph, cost_model, found: list):
        import threading

        self.args, self.graph, self.cost_model, self.found = args, graph, cost_model, found
        self.lock = threading.Lock()
        self.finished = False
        self.timer = None

    def arm(self, signal_name: str) -> None:
        import threading

        if self.timer is None:
            self.timer = threading.Timer(STOP_GRACE_S, self._fire, (signal_name,))
            self.timer.daemon = True
            self.timer.start()

    def done(self) -> None:
        with self.lock:
            self.finished = True
        if self.timer is not None:
            self.timer.cancel()

    def _fire(self, signal_name: str) -> None:
        import os

        from simplace.placers import best_of

        with self.lock:
            if self.finished or not self.found:
                return  # returned in time, or nothing to keep yet: the search goes on
            best = best_of(list(self.found))
            note(f"the method running did not reach its next step within "
                 f"{STOP_GRACE_S:g} s (compiling): stopping now")
            out = _save_best(self.args, self.graph, self.cost_model, best, signal_name)
            print(_interrupted_line(signal_name, best, out), file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)


def _start_placement(args, graph, cost_model):
    """``--start P.JSON``: the placement to start local search from, checked."""
    from simplace.placement import Placement
    from simplace.placers import method_kind, methods_of_kind

    if args.method == "all" or method_kind(args.method) != "annealer":
        raise SimplaceError(f"--start applies to --method "
                            f"{' or '.join(methods_of_kind('annealer'))} only, not --method "
                            f"{args.method} (the policies take --warm-start).")
    return Placement.load(args.start).check(graph, cost_model)


# The search keeps at least this share of --budget-s whatever tracing took before it.
SEARCH_MIN_BUDGET_SHARE = 0.5


def _search_budget(args, now: float) -> float | None:
    """What of ``--budget-s`` is left for the search: the budget is the command's wall
    time, so starting up, tracing and profiling come out of it (the search keeps at
    least ``SEARCH_MIN_BUDGET_SHARE``; a note says so when that much is gone)."""
    if args.budget_s is None:
        return None
    spent = max(now - getattr(args, "started_s", now), 0.0)
    left = max(args.budget_s - spent, SEARCH_MIN_BUDGET_SHARE * args.budget_s)
    if spent > 0.05 * args.budget_s:
        note(f"starting up and tracing took {spent:.1f} s of the {args.budget_s:g} s "
             f"budget: the search gets {left:.1f} s")
    return left


# ---------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    """The ``simplace`` argument parser, every subcommand with its options."""
    from simplace import __version__, paths
    from simplace.external import cli_args as instance_args
    from simplace.rl.cli_args import add_rl_args
    from simplace.validate import cli as validate_cli

    p = argparse.ArgumentParser(
        prog="simplace",
        description="Simulator-first device placement for JAX computation graphs.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def model_args(sp):
        sp.add_argument("model", metavar="MODEL",
                        help="zoo name (see `simplace models`), path/file.py:factory, "
                             "package.module:factory, or a saved graph .json")
        sp.add_argument("--batch", type=_argtypes.batch_size, default=None,
                        help="batch size (default: the model's)")
        sp.add_argument("--inference", action="store_true",
                        help="trace inference instead of a training step")
        sp.add_argument("--small", action="store_true",
                        help="tiny sizes of a zoo model (for tests and small machines)")

    sp = sub.add_parser("models", help="list the model zoo")
    sp.add_argument("--count", action="store_true", help="trace each model to count its ops")
    sp.add_argument("--inference", action="store_true", help="count the inference graphs")
    sp.add_argument("--small", action="store_true", help="count the small-size graphs")
    sp.set_defaults(func=cmd_models)

    sp = sub.add_parser("graph", help="trace a model into an op graph and describe it")
    model_args(sp)
    instance_args.add_instance_args(sp)
    sp.add_argument("--out", help="save the graph as JSON")
    sp.add_argument("--top", type=_argtypes.nonnegative_int, default=8,
                    help="how many common primitives to list")
    sp.set_defaults(func=cmd_graph)

    sp = sub.add_parser("simulate", help="predict the step time and memory of a placement")
    model_args(sp)
    sp.add_argument("--cost-model", metavar="NAME", help=paths.CLI_COST_MODEL_HELP)
    instance_args.add_instance_args(sp)
    instance_args.add_objective_args(sp)
    sp.add_argument("--cost-model-dir", default=None, metavar="DIR",
                    help=paths.CLI_COST_MODEL_DIR_HELP)
    sp.add_argument("--placement", metavar="P.JSON", help="a placement file")
    sp.add_argument("--single", metavar="DEVICE",
                    help="put every op on one device: a name, an index, or 'fastest'")
    sp.add_argument("--gantt", metavar="OUT.PNG", help="draw the schedule (matplotlib)")
    sp.add_argument("--out", metavar="P.JSON", help="save the simulated placement")
    sp.add_argument("--force", action="store_true",
                    help="apply a --placement made for another machine of the same size "
                         "(device k of one becomes device k of the other)")
    sp.add_argument("--no-profile", action="store_true",
                    help="price ops with the cost model alone, not with this model's "
                         "profile on the machine (`simplace profile`)")
    sp.set_defaults(func=cmd_simulate)

    sp = sub.add_parser("optimize", help="search for a fast placement")
    model_args(sp)
    sp.add_argument("--cost-model", metavar="NAME", help=paths.CLI_COST_MODEL_HELP)
    instance_args.add_instance_args(sp)
    instance_args.add_objective_args(sp)
    sp.add_argument("--cost-model-dir", default=None, metavar="DIR",
                    help=paths.CLI_COST_MODEL_DIR_HELP)
    sp.add_argument("--method", default="all",
                    help="a placement method (see `simplace methods`) or 'all': every "
                         "method but exact, the searches (local, rl-*) starting from the "
                         "best found before them (default: all, with a comparison table)")
    sp.add_argument("--budget-s", type=_argtypes.budget_seconds, default=None,
                    help="wall-time budget, seconds (> 0, at most a week), compilation "
                         "included: of the "
                         "search method, or shared by all of them with --method all "
                         "(default: the method's own; 60 s for all)")
    sp.add_argument("--seed", type=_argtypes.seed, default=0,
                    help=f"random seed, 0..{_argtypes.MAX_SEED} (default 0)")
    sp.add_argument("--out", metavar="P.JSON", help="save the best placement (also when "
                    "interrupted by Ctrl-C or SIGTERM: the best so far)")
    sp.add_argument("--start", metavar="P.JSON", default=None,
                    help="--method local: start from this placement instead of the "
                         "heuristics (e.g. one an interrupted run saved: resume it)")
    sp.add_argument("--profile", choices=("auto", "always", "never"), default="auto",
                    help="price ops with this model's profile on the machine (`simplace "
                         "profile`): auto (default) uses one that exists and makes one when "
                         "the machine is this host; always makes it again; never uses none")
    sp.add_argument("--no-profile", action="store_true", help="the same as --profile never")
    add_rl_args(sp)
    validate_cli.add_validate_args(sp)
    sp.set_defaults(func=cmd_optimize)

    sp = sub.add_parser("methods", help="list the placement methods")
    sp.set_defaults(func=cmd_methods)

    _add_profile_parser(sub)

    # Subcommands that live with their stage of the loop; each module adds its own parser.
    from simplace.calibrate import cli as calibrate_cli
    from simplace.parallel import cli as parallel_cli
    from simplace.rl import cli_train as train_cli

    for stage in (calibrate_cli, validate_cli, parallel_cli, train_cli, cli_warmup):
        stage.add_parser(sub)
    return p


# Commands that compile XLA programs (simulators, policies, the executor): they use the
# persistent compilation cache (``simplace.compile_cache``; $SIMPLACE_COMPILE_CACHE=off).
_COMPILING_COMMANDS = ("simulate", "optimize", "calibrate", "validate", "parallelize",
                      "profile", "train-policy", "warmup")


def console_main() -> int:
    """The ``simplace`` command: ``main`` with its budget clock started when the process
    imported simplace (JAX's import is part of the wait)."""
    import simplace

    return main(started_s=simplace._IMPORTED_AT)


def main(argv: list[str] | None = None, *, started_s: float | None = None) -> int:
    """Run the command line; returns the exit status (see ``EXIT_CODES``).
    ``started_s``: the ``time.perf_counter()`` the command's wall-time budget counts
    from (default: now)."""
    started_s = time.perf_counter() if started_s is None else started_s
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # --help, --version, or a usage error argparse printed
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    args.started_s = started_s
    restore = _sigterm_as_interrupt()
    try:
        check_outputs(args)
        if args.command in _COMPILING_COMMANDS:
            from simplace import compile_cache

            compile_cache.enable()  # a second run loads what the first compiled
        code = args.func(args)
        raise_if_terminated()  # a SIGTERM whose interrupt was lost: still exit 130
        return code
    except SimplaceError as err:
        print(f"simplace {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into `head` and friends: not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:  # a file the command reads or writes, gone or unreadable
        where = f" ({err.filename})" if getattr(err, "filename", None) else ""
        print(f"simplace {args.command}: error: {err.strerror or err}{where}",
              file=sys.stderr)
        return EXIT_ERROR
    finally:
        restore()


def _sigterm_as_interrupt():
    """SIGTERM (``kill``, a job scheduler's time limit) ends a command as Ctrl-C does:
    exit 130, after what the command keeps on an interrupt. Both signals also set a flag
    (``raise_if_terminated``), so that one whose KeyboardInterrupt is lost in a callback
    (JAX's garbage-collection hook, a finalizer) still stops the command, and the
    "Exception ignored" report of such a loss is not printed. Searches install their own
    handlers over these. Returns a function that puts the previous handlers back (in
    process, e.g. in tests, main leaves no handler behind)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # Python allows signal handlers in the main thread only

    def interrupt(signum, frame):
        _TERMINATED[0] = True
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    from simplace.search import stop_requested

    hook = sys.unraisablehook

    def quiet_hook(unraisable):
        # The interrupt the flag (or a search's stop request) stands for: the command
        # stops at its next check.
        if not ((_TERMINATED[0] or stop_requested())
                and unraisable.exc_type is KeyboardInterrupt):
            hook(unraisable)

    _TERMINATED[0] = False
    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    sys.unraisablehook = quiet_hook

    def restore():
        _TERMINATED[0] = False
        sys.unraisablehook = hook
        for s, h in previous.items():
            # None: a handler not installed from Python, which cannot be put back.
            signal.signal(s, (signal.SIG_DFL if s == signal.SIGTERM else
                              signal.default_int_handler) if h is None else h)

    return restore


if __name__ == "__main__":
    sys.exit(main())

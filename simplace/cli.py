"""The ``simplace`` command line. Each subcommand is one function ``cmd_<name>(args)``."""

from __future__ import annotations

import argparse
import sys
import time

from simplace import _argtypes
from simplace.cli_model import (
    _TERMINATED,
    devices_of,
    graph_from_args,
    load_program,
    make_profile,
    problem_from_args,
    raise_if_terminated,
)
from simplace.errors import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OOM,
    EXIT_USAGE,
    SimplaceError,
)
from simplace.graph import format_bytes
from simplace.progress import note

EXIT_CODES = f"""exit codes:
  0    success
  {EXIT_ERROR}    an unexpected error (a bug: please report it with its traceback), or a
       file that could not be read or written
  {EXIT_USAGE}    bad input: options, numbers, files, model names; the message says what
       to mend (nothing has been written)
  {EXIT_OOM}    the placement does not fit the machine's memory (OOM); it is still printed,
       and saved with "oom": true
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C or SIGTERM)"""

# Options naming files a command writes, and folders it writes into: all are checked
# before the command starts its work (see main), so that no result is lost to a bad path.
OUTPUT_FILES = {"out": "--out", "gantt": "--gantt", "history": "--history",
                "checkpoint": "--checkpoint"}
OUTPUT_DIRS = {"records_dir": "--records-dir", "cost_model_dir": "--cost-model-dir"}


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(
            str(c).rjust(w) if _numeric(c) else str(c).ljust(w)
            for c, w in zip(r, widths, strict=True)))
    return "\n".join(out)


def _numeric(c) -> bool:
    s = str(c).replace(",", "").replace(".", "", 1).replace(" ", "")
    return s[:1].isdigit()


# ---------------------------------------------------------------------------- models
def cmd_models(args) -> int:
    """``simplace models``: the zoo, with op counts and GFLOPs when ``--count``."""
    from simplace import zoo

    rows = []
    names = zoo.names()
    for k, name in enumerate(names):
        raise_if_terminated()
        info = zoo.info(name)
        row = [name, info.family, info.description]
        if args.count:
            from simplace.models import load_graph

            # Tracing every model takes minutes at full size: say where it is.
            t0 = time.perf_counter()
            print(f"  [{k + 1}/{len(names)}] tracing {name}...", end="", file=sys.stderr,
                  flush=True)
            try:
                g = load_graph(name, training=not args.inference, small=args.small)
            except BaseException:
                print(file=sys.stderr)  # end the progress line before the error
                raise
            print(f" {g.num_ops:,} ops, {time.perf_counter() - t0:.1f} s", file=sys.stderr,
                  flush=True)
            row += [f"{g.num_ops:,}", f"{g.flops.sum() / 1e9:.1f}"]
        rows.append(row)
    header = ["model", "family", "description"] + (["ops", "GFLOP"] if args.count else [])
    print(_table(rows, header))
    if not args.count:
        print("\n(op counts: `simplace models --count`, which traces every model)")
    return 0


# ---------------------------------------------------------------------------- graph
def cmd_graph(args) -> int:
    """``simplace graph``: trace MODEL (or read an instance) and describe its graph."""
    if args.out and not args.out.endswith(".json"):
        # MODEL arguments ending in .json are read as saved graphs: another name could
        # never be loaded back.
        raise SimplaceError(f"--out {args.out}: a saved graph's name must end in .json, "
                            "so that simplace reads it back as a graph (MODEL g.json).")
    t0 = time.perf_counter()
    g = graph_from_args(args)
    elapsed_s = time.perf_counter() - t0
    print(g.summary(top=args.top))
    print(f"  loaded in {elapsed_s:.2f} s")
    if args.out:
        g.save(args.out)
        print(f"saved to {args.out}")
    return 0


# ---------------------------------------------------------------------------- simulate
def _single_device(spec: str, graph, cost_model) -> int:
    """Device index for ``--single``: a name, an index, or ``fastest``."""
    from simplace.errors import PlacementError

    names = list(cost_model.device_names)
    if spec == "fastest":
        # The `single` placer: the fastest device whose simulated peak memory fits.
        from simplace.placers import optimize

        return int(optimize(graph, cost_model, "single").placement[0]) if graph.num_ops else 0
    if spec in names:
        return names.index(spec)
    if spec.isdigit() and int(spec) < len(names):
        return int(spec)
    raise PlacementError(f"--single {spec!r} is not a device of cost model "
                         f"'{cost_model.name}': use one of {', '.join(names)}, an index "
                         f"0..{len(names) - 1}, or 'fastest'.")


def cmd_simulate(args) -> int:
    """``simplace simulate``: one placement's step time, busy time and memory."""
    import numpy as np

    from simplace.errors import PlacementError
    from simplace.placement import Placement
    from simplace.sim import lower_bound, simulate

    if (args.placement is None) == (args.single is None):
        raise PlacementError("Give exactly one of --placement p.json or --single DEVICE.")
    if args.force and args.placement is None:
        raise PlacementError("--force applies a --placement file to another machine; it "
                             "takes no --single.")
    # Read the placement before tracing, so that a bad file fails at once.
    placement = Placement.load(args.placement) if args.placement is not None else None
    graph, cost_model = problem_from_args(args)
    if placement is not None:
        assignment = placement.check(graph, cost_model, force=args.force)
        method = placement.method or "file"
    else:
        d = _single_device(args.single, graph, cost_model)
        assignment = np.full(graph.num_ops, d, dtype=np.int32)
        method = f"single:{cost_model.device_names[d]}"
    result = simulate(graph, cost_model, assignment, schedule=bool(args.gantt))
    bound_s = lower_bound(graph, cost_model)
    print(graph.summary(top=5))
    print(f"\nmachine {cost_model.name} ({cost_model.provenance.source}), placement {method}")
    print(report_result(result, cost_model, bound_s))
    if args.out:
        Placement(assignment=assignment, graph_hash=graph.hash, cost_model=cost_model.name,
                  device_names=tuple(cost_model.device_names), method=method,
                  predicted_step_time_s=float(result.step_time_s),
                  oom=bool(result.oom)).save(args.out)
        print(f"placement saved to {args.out}" + (" (marked oom)" if result.oom else ""))
    if args.gantt:
        from simplace.gantt import plot_gantt

        plot_gantt(result, cost_model, args.gantt, graph=graph,
                   title=f"{graph.name} on {cost_model.name} ({method})")
        print(f"Gantt chart written to {args.gantt}")
    if result.oom:
        print(f"error: the placement does not fit the machine's memory (OOM on "
              f"{_oom_devices(result, cost_model)}): split the model over more devices "
              f"(`simplace optimize`) or use a machine with more memory. Exit code "
              f"{EXIT_OOM}.", file=sys.stderr)
        return EXIT_OOM
    return 0


def _oom_devices(result, cost_model) -> str:
    names = cost_model.device_names
    return ", ".join(names[d] for d in range(len(names))
                     if float(result.peak_memory_bytes[d]) > float(cost_model.memory_bytes[d]))


def report_result(result, cost_model, bound_s: float) -> str:
    """Step time, gap to the lower bound, and where the time and memory go, per device."""
    from simplace.external._machine import NO_CAP_BYTES
    from simplace.sim.objective import Ruler, objective_name

    step_s = float(result.step_time_s)
    gap = f"{step_s / bound_s:.2f}x the lower bound" if bound_s > 0 else "lower bound 0"
    what = {"latency": "step time",
            "throughput": "time between pipelined steps"}[objective_name(cost_model.objective)]
    ruled = isinstance(cost_model.objective, Ruler)
    if ruled:
        what += f", by {cost_model.objective.describe()}"
    lines = [f"{what} {step_s * 1e3:.3f} ms   ({gap}: {bound_s * 1e3:.3f} ms)"]
    if not ruled:  # a ruler's rules have no segments, device_put calls or host thread
        lines += [f"bytes moved between devices {format_bytes(float(result.bytes_moved))} in "
                  f"{result.num_transfers} device_put calls"
                  + ("   OUT OF MEMORY" if result.oom else ""),
                  f"{result.num_segments} segment{'s' * (result.num_segments != 1)} (one "
                  f"jitted call each); the host thread's last call returns at "
                  f"{result.host_s * 1e3:.3f} ms"
                  + (" (its calls, and its waits for copies between the CPU and a GPU)"
                     if cost_model.put_waits.any() else "")]
    elif result.oom:
        lines.append("OUT OF MEMORY (or an op on a device that cannot run it)")
    rows = []
    for d, name in enumerate(cost_model.device_names):
        peak, cap = float(result.peak_memory_bytes[d]), float(cost_model.memory_bytes[d])
        busy = float(result.busy_s[d])
        capped = cap < NO_CAP_BYTES  # an imported device the file sets no cap for
        rows.append([name, f"{busy * 1e3:.3f}", f"{100 * busy / step_s:.0f}%" if step_s else "-",
                     format_bytes(peak), format_bytes(cap) if capped else "no cap",
                     "OOM" if peak > cap else f"{100 * peak / cap:.1f}%" if capped else "-"])
    lines.append(_table(rows, ["device", "busy ms", "busy", "peak memory", "capacity",
                               "used"]))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- methods
def cmd_methods(args) -> int:
    """``simplace methods``: every placement method, one line each."""
    from simplace.placers import method_docs

    docs = method_docs()
    width = max(map(len, docs), default=0)
    for name, doc in docs.items():
        print(f"{name:<{width}}  {doc}")
    return 0


# ---------------------------------------------------------------------------- optimize
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
    if best.info.get("note"):
        print(f"note: {best.info['note']}")
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


def _budget_line(best, budget_s, wall_s: float, compared: bool) -> str:
    """How the search used its time: the wall time the user waited for it (every method
    with --method all) against the budget, when the first batch was ready (the part of
    the time a budget cannot bound) and why it stopped."""
    from simplace.placers import COMPARE_DEFAULT_BUDGET_S

    info = best.info
    line = f"search time {wall_s:.2f} s"
    if budget_s is not None:
        line += f" of a {budget_s:g} s budget"
    elif compared:
        line += f" of the default {COMPARE_DEFAULT_BUDGET_S:g} s budget"
    if compared:
        line += " (every method)"
        if budget_s is not None and wall_s > 1.1 * budget_s + 1.0:
            line += (f"; {wall_s - budget_s:.1f} s over it: first batches (compilation) "
                     "come on top of the parts (see the messages above)")
        return line
    if info.get("first_batch_s") is not None:
        line += f"; first batch ready after {info['first_batch_s']:.2f} s"
        if info.get("first_batch_over_budget"):
            line += " (past the budget: compilation)"
    if info.get("stop"):
        line += f"; stopped: {info['stop']}"
    return line


def _annealer(method: str) -> bool:
    from simplace.placers import method_kind, methods

    return method in methods() and method_kind(method) == "annealer"


def _interrupted_line(signal_name: str, best, out: str | None) -> str:
    """What an interrupted optimize kept."""
    kept = [f"the best placement so far ({best.step_time_s * 1e3:.3f} ms) in {out}"
            + (f" (--start {out} resumes from it)" if _annealer(best.method) else "")]
    info = best.info
    if info.get("checkpoint_path"):
        kept.append(f"the checkpoint {info['checkpoint_path']} (update "
                    f"{info.get('updates')}; --checkpoint resumes it)")
    if info.get("history_path"):
        kept.append(f"the history {info['history_path']}")
    return f"interrupted ({signal_name}): kept " + ", ".join(kept) + "."


def results_table(results, bound_s: float) -> str:
    """The comparison table of ``optimize --method all``: the winner (the fastest that
    fits, as ``best_of`` picks it) marked ``*``, each method's speedup over ``single``
    and its gap to the lower bound."""
    from simplace.placers import best_of

    winner = best_of(results).method if results else None
    single = next((r for r in results if r.method == "single"), None)
    rows = []
    for r in results:
        speedup = (f"{single.step_time_s / r.step_time_s:.2f}x"
                   if single is not None and r.step_time_s > 0 else "-")
        gap = f"{r.step_time_s / bound_s:.2f}x" if bound_s > 0 else "-"
        rows.append([("* " if r.method == winner else "  ") + r.method,
                     f"{r.step_time_s * 1e3:.3f}", speedup, gap,
                     format_bytes(float(max(r.peak_memory_bytes, default=0.0))),
                     "OOM" if r.oom else "fits", f"{r.wall_s:.2f}"])
    return _table(rows, ["  method", "step ms", "vs single", "vs bound", "max peak mem",
                         "memory", "wall s"]) + "\n(* the winner; vs bound: step time over " \
        "the lower bound, 1.00x is optimal)"


# ---------------------------------------------------------------------------- profile
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
    prof, path = make_profile(args, cost_model, program, run_args, resume=args.resume)
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


# ---------------------------------------------------------------------------- main
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
    sp.add_argument("--budget-s", dest="profile_budget_s",
                    type=_argtypes.nonnegative_seconds, default=None, metavar="S",
                    help="timing budget per chunk once --repeats are done (default 0.3 s)")
    sp.add_argument("--list", action="store_true", help="list the profiles made")
    sp.set_defaults(func=cmd_profile)


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

    for stage in (calibrate_cli, validate_cli, parallel_cli, train_cli):
        stage.add_parser(sub)
    return p


def check_outputs(args) -> None:
    """Refuse, before any work, output paths that cannot be written (``OutputError``,
    exit 2): a missing folder, a directory, a read-only place."""
    from simplace._jsonfile import check_output_dir, check_output_path

    for dest, option in OUTPUT_FILES.items():
        if getattr(args, dest, None) is not None:
            check_output_path(getattr(args, dest), option)
    _check_inputs_are_not_outputs(args)
    if getattr(args, "gantt", None) is not None:
        _check_image_format(args.gantt, "--gantt")
    for dest, option in OUTPUT_DIRS.items():
        # calibrate --refit only reads its records.
        if dest == "records_dir" and getattr(args, "refit", False):
            continue
        # Only calibrate and validate --update write models; the other commands read
        # --cost-model-dir (simplace.paths checks that it is a folder).
        if dest == "cost_model_dir" and not (args.command == "calibrate"
                                             or getattr(args, "update", False)):
            continue
        if getattr(args, dest, None) is not None:
            check_output_dir(getattr(args, dest), option)


def _check_inputs_are_not_outputs(args) -> None:
    """An output written over an input file (``optimize g.json --out g.json``) would
    destroy it: refuse. Rewriting a placement file in place (``simulate --placement
    p.json --out p.json``) and re-saving a graph over itself stay allowed."""
    import os

    def same(a, b) -> bool:
        try:
            return os.path.samefile(a, b)
        except OSError:  # one of them does not exist (yet): not the same file
            return False

    inputs = [("MODEL", getattr(args, "model", None)),
              ("--cost-model", getattr(args, "cost_model", None)),
              ("--placement", getattr(args, "placement", None))]
    inputs += [("P.JSON", p) for p in getattr(args, "placements", None) or []]
    for dest, option in OUTPUT_FILES.items():
        out = getattr(args, dest, None)
        if out is None:
            continue
        for what, path in inputs:
            allowed = (dest == "out" and ((args.command == "simulate" and what == "--placement")
                                          or (args.command == "graph" and what == "MODEL")))
            if path is not None and not allowed and same(out, path):
                raise SimplaceError(f"{option} {out} is the {what} file this command reads: "
                                    "writing there would destroy it. Choose another path.")


def _check_image_format(path: str, option: str) -> None:
    """matplotlib picks the format from the file name: refuse one it cannot write now,
    not after the simulation."""
    from pathlib import Path

    from matplotlib.backend_bases import FigureCanvasBase

    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in formats:
        raise SimplaceError(f"{option} {path}: the file name must end in an image format "
                            f"matplotlib writes: .png, .svg, .pdf ... ({', '.join(formats)}).")


# Commands that compile XLA programs (simulators, policies, the executor): they use the
# persistent compilation cache (``simplace.compile_cache``; $SIMPLACE_COMPILE_CACHE=off).
_COMPILING_COMMANDS = ("simulate", "optimize", "calibrate", "validate", "parallelize",
                      "profile", "train-policy")


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

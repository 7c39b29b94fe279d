"""What the MODEL and machine options of the commands become: the graph, the machine
with its profile and objective, the program run for real on this host's devices.

Shared by the subcommands (``simplace.cli``, ``simplace.validate.cli``,
``simplace.parallel.cli``), beneath all of them.
"""

from __future__ import annotations

import contextlib
import sys
import time

from simplace.errors import ModelError, SimplaceError
from simplace.progress import note

# Set by the SIGTERM/SIGINT handler. The KeyboardInterrupt it raises is lost when the signal
# lands in a finalizer or a weakref callback (Python prints "Exception ignored" and goes
# on); long loops check this between steps so that the command still stops.
_TERMINATED = [False]


def raise_if_terminated() -> None:
    """Raise the KeyboardInterrupt of a SIGTERM or SIGINT received earlier and lost on
    the way."""
    if _TERMINATED[0]:
        raise KeyboardInterrupt("signal")


def graph_from_args(args):
    """The graph of the MODEL argument (``--batch``, ``--inference``, ``--small``); a
    model that is traced (seconds for large models) says so on stderr first, and how long
    it took."""
    from simplace import trace_cache
    from simplace.external import cli_args as instance_args
    from simplace.models import is_graph_file, load_graph

    if instance_args.imported(args):
        instance_args.check_instance_args(args)
        from simplace.external import load_instance

        return load_instance(args.model, args.from_format, devices=args.devices).graph
    sizes = {"training": not args.inference, "batch": args.batch, "small": args.small}
    if is_graph_file(args.model):
        return load_graph(args.model, **sizes)  # (refuses sizes: a saved graph has its own)
    what = f"{args.model} ({'training' if sizes['training'] else 'inference'} step)"
    t0 = time.perf_counter()
    kept = trace_cache.entry_path(args.model, **sizes)
    if kept is not None:
        g, why = trace_cache.cached_graph(kept)
        if g is not None:
            note(f"read the trace of {what} from {kept} in "
                 f"{time.perf_counter() - t0:.1f} s ({trace_cache.ENV_SWITCH}=0 traces anew)")
            return g
        if why:
            note(f"cannot read the kept trace {kept} ({why}): tracing again")
    note(f"tracing {what}...")
    g = load_graph(args.model, **sizes)
    where = ""
    if kept is not None:
        failed = trace_cache.keep(g, kept)
        where = f"; not kept ({failed})" if failed else "; kept for the next command"
    note(f"traced {g.num_ops:,} ops in {time.perf_counter() - t0:.1f} s{where}")
    return g


def problem_from_args(args, *, match_devices: bool = False):
    """``(graph, cost_model)`` of MODEL and ``--cost-model`` (with its profile where one
    is used, see ``use_profile``), or of an instance file (``--from``: its machine and
    ruler); judged by ``--objective``. ``match_devices``: the run may use this host's
    devices (validation, profiling), so JAX is given the model's devices before it
    starts."""
    from simplace.cost_model import CostModel
    from simplace.external import cli_args as instance_args

    instance_args.check_instance_args(args)
    if instance_args.imported(args):
        _, graph, cost_model = instance_args.load_problem(args)
        return graph, cost_model
    cost_model = CostModel.load(args.cost_model, args.cost_model_dir)
    if match_devices:
        from simplace._devices import match_cpu_cost_model

        # Runs on hardware (validation, profiling) need the model's devices, fixed when
        # JAX starts (tracing); a model of another host is left alone.
        with contextlib.suppress(SimplaceError):
            match_cpu_cost_model(cost_model)
    graph = graph_from_args(args)
    raise_if_terminated()  # a signal lost while tracing: stop before profiling
    cost_model = use_profile(args, cost_model, graph)
    if getattr(args, "objective", None):
        cost_model = cost_model.with_objective(args.objective)
    return graph, cost_model


def load_program(args):
    """(Program, real arguments, model description) for MODEL at the sizes given."""
    from simplace.hardware.executor import prepare
    from simplace.models import is_graph_file, load_function

    if is_graph_file(args.model):
        raise ModelError(f"'{args.model}' is a saved graph: validation runs the model, so "
                         "name the zoo model or file.py:factory it was traced from.")
    training = not args.inference
    fn, run_args = load_function(args.model, training=training, batch=args.batch,
                                 small=args.small, abstract=False)
    name = args.model.rpartition(":")[2] if ":" in args.model else args.model
    suffix = f"/b{args.batch}" if args.batch is not None else ""
    gname = f"{name}/{'train' if training else 'inference'}{'/small' if args.small else ''}" \
            f"{suffix}"
    program = prepare(fn, run_args, name=gname)
    spec = {"model": args.model, "training": training, "batch": args.batch,
            "small": bool(args.small)}
    return program, run_args, spec


def device_hint(cost_model) -> str:
    """What to type when this machine lacks devices of ``cost_model`` (the command-line
    counterpart of ``resolve_devices``'s Python-facing hint)."""
    hint = (f"Cost model '{cost_model.name}' describes another machine: run there, or give "
            "--cost-model a model of this machine (`simplace calibrate --name NAME` "
            "measures one here).")
    n_cpu = sum(d.kind == "cpu" for d in cost_model.devices)
    if n_cpu > 1:  # only a CPU-only model gets its CPU split by itself (match_cpu_cost_model)
        hint += (f" Its {n_cpu} CPU devices need XLA_FLAGS="
                 f"--xla_force_host_platform_device_count={n_cpu} set before simplace starts.")
    return hint


def devices_of(cost_model) -> list:
    """This machine's JAX devices for ``cost_model``'s device names; the error says which
    options to use. Called before the model loads, so a wrong machine fails at once."""
    from simplace.hardware.executor import resolve_devices

    return resolve_devices(cost_model.device_names, hint=device_hint(cost_model))


def _profile_timing(args) -> dict:
    from simplace.profile import DEFAULT_TIMING

    timing = dict(DEFAULT_TIMING)
    if getattr(args, "profile_repeats", None) is not None:
        timing["min_repeats"] = int(args.profile_repeats)
        timing["max_repeats"] = max(timing["max_repeats"], int(args.profile_repeats))
    if getattr(args, "chunk_budget_s", None) is not None:
        timing["budget_s"] = float(args.chunk_budget_s)
    return timing


def _profile_line(prof, path) -> str:
    """The one line simulate, optimize and validate print when they use a profile."""
    est = prof.num_estimated
    return (f"profile: {path} ({', '.join(sorted(prof.op_time_s))} measured in "
            f"{len(prof.bounds)} chunks" + (f", {est} estimated" if est else "")
            + f"; {prof.date}; --no-profile skips it)")


def make_profile(args, cost_model, program, run_args, *, resume: bool = False,
                 budget_s: float | None = None):
    """Profile ``program`` on this host (``simplace profile``, ``optimize --profile``):
    written to the user directory, with a progress line; an interrupt keeps the chunks
    timed and says how to go on. ``budget_s``: ``simplace.profile.profile``'s (the
    profile returned may then be incomplete)."""
    from simplace import paths
    from simplace.profile import Profile, ProfileError, ProfileInterrupted, profile, time_floor_s

    graph = program.graph
    machine = cost_model.name.split("[", 1)[0]
    path = paths.profile_path(machine, graph.hash)
    partial = None
    if resume and path.exists():
        try:
            partial = Profile.load(path)
        except ProfileError as err:
            raise ProfileError(f"{err} Cannot resume from it: profile again without "
                               "--resume.") from None
        if partial.complete:
            note(f"{path} is complete already: nothing to resume")
            return partial, path
        done = sum(len(c) for c in partial.chunks.values())
        note(f"resuming {path}: {done} chunks timed before")
    elif resume:
        note(f"no partial profile at {path}: profiling from the start")
    chunks = getattr(args, "chunks", None) or 24
    kinds = sorted({d.kind for d in cost_model.devices})
    note(f"profiling {graph.name or args.model} ({graph.num_ops:,} ops) on {machine}: "
         f"{len(partial.bounds) if partial else chunks} chunks on one "
         f"{'/'.join(kinds)} device each, at least about "
         f"{time_floor_s(cost_model, graph):.0f} s")
    t0 = time.perf_counter()
    try:
        prof = profile(None, run_args, cost_model, chunks=chunks, program=program,
                       resume=partial, path=path, timing=_profile_timing(args),
                       budget_s=budget_s)
    except ProfileInterrupted as stop:
        done = sum(len(c) for c in stop.profile.chunks.values())
        total = len(stop.profile.bounds) * len(stop.profile.chunks)
        print(f"interrupted: kept {done} of {total} chunks timed in {stop.path}; "
              f"`simplace profile {args.model} --cost-model {args.cost_model} --resume` "
              "(same sizes) goes on from them", file=sys.stderr)
        raise
    note(f"profiled in {time.perf_counter() - t0:.1f} s")
    return prof, path


# ``optimize --profile auto`` under --budget-s makes a profile only when its floor
# (``simplace.profile.time_floor_s``) is under this share of the budget.
AUTO_PROFILE_BUDGET_SHARE = 0.5


def use_profile(args, cost_model, graph, *, program=None, run_args=None):
    """``cost_model`` carrying the profile of ``graph`` where one is to be used (the
    ``--no-profile`` and ``--profile`` options), with one line saying so; makes one under
    ``optimize --profile auto|always`` (``auto`` under ``--budget-s``: only where its
    floor, ``simplace.profile.time_floor_s``, is under ``AUTO_PROFILE_BUDGET_SHARE`` of
    the budget; the note says how to make it otherwise). A bad, foreign or incomplete
    file is an error unless it is remade (or left unused under a budget it cannot fit)."""
    from simplace.profile import ProfileError, find_profile, time_floor_s

    mode = getattr(args, "profile", None) or "auto"
    if getattr(args, "no_profile", False):
        mode = "never"
    if mode == "never":
        return cost_model
    can_make = getattr(args, "profile", None) is not None  # optimize only
    prof, path, problem = None, None, None
    try:
        prof, path = find_profile(cost_model, graph)
    except ProfileError as err:
        problem = err
    if can_make and (mode == "always" or prof is None):
        why = ("--profile always" if mode == "always" else
               "its profile is refused" if problem is not None else "no profile yet")
        here = _host_is(cost_model)
        if here is not True:
            if mode == "always" or problem is not None:
                raise SimplaceError(f"Cannot profile {cost_model.name} ({why}): {here}") \
                    from None
            note(f"no profile of this model on {cost_model.name}, and not made: {here}")
            return cost_model
        budget = getattr(args, "budget_s", None)
        if mode == "auto" and budget is not None:
            # A profile made here comes out of --budget-s: one that cannot fit half of it
            # is left to `simplace profile` (nmt_2layer's training step on the VM took
            # more than 10 minutes to profile under --budget-s 3).
            floor = time_floor_s(cost_model, graph)
            if floor > AUTO_PROFILE_BUDGET_SHARE * budget:
                note(f"no profile of this model made ({why}): profiling it here takes at "
                     f"least about {floor:.0f} s, more than half the {budget:g} s budget; "
                     f"`simplace profile {args.model} --cost-model {args.cost_model}` makes "
                     "it once and later runs use it (or give --profile always)")
                return cost_model
        if program is None:
            from simplace.models import is_graph_file

            if is_graph_file(args.model):
                if problem is not None:
                    raise problem
                if mode == "always":
                    raise SimplaceError(f"--profile always: '{args.model}' is a saved graph, "
                                        "which cannot run; name the model it was traced "
                                        "from.")
                note("no profile of this graph, and none made: a saved graph cannot run "
                     "(name the model it was traced from)")
                return cost_model
            program, run_args, _ = load_program(args)
            if program.graph.hash != graph.hash:
                raise SimplaceError("The model does not trace to the same graph when run "
                                    "for real; check --batch/--inference/--small.")
        if problem is not None:
            note(f"remaking the profile: {problem}")
        incomplete = problem is not None and "incomplete" in str(problem)
        prof, path = make_profile(args, cost_model, program, run_args,
                                  resume=incomplete and mode == "auto")
    elif problem is not None:
        raise problem
    if prof is None:
        return cost_model
    print(_profile_line(prof, path))
    return cost_model.with_profile(prof)


def _host_is(cost_model) -> bool | str:
    """True when ``cost_model``'s devices are this host's, else why not (one line)."""
    from simplace._devices import match_cpu_cost_model
    from simplace.hardware.devices import accelerator_plugin_installed, resolve_devices

    if (any(dev.kind != "cpu" for dev in cost_model.devices)
            and not accelerator_plugin_installed()):
        # said without starting JAX (half a second): no plugin, no GPU
        return (f"its devices ({', '.join(cost_model.device_names)}) are not all on this "
                "host (JAX has no GPU plugin here); profile on the machine it describes")
    try:
        match_cpu_cost_model(cost_model)
        resolve_devices(cost_model.device_names, hint="")
    except SimplaceError:
        return (f"its devices ({', '.join(cost_model.device_names)}) are not all on this "
                "host; profile on the machine it describes")
    return True

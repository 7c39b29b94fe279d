"""Command-line options for instances of other systems and for the objective.

``--from FORMAT`` reads MODEL as an instance file of that format (its machine comes with
it, so ``--cost-model`` is not given); ``--objective`` picks what placements are judged
by; ``--ruler`` whether an imported instance is scored by its own system's rules (the
default) or by simplace's simulation of the machine it implies.
"""

from __future__ import annotations

from simplace import _argtypes
from simplace.errors import OptionError
from simplace.external import FORMATS
from simplace.sim.objective import OBJECTIVES


def add_instance_args(sp) -> None:
    """``--from FORMAT`` and ``--devices N``: MODEL as an instance file of another system."""
    sp.add_argument("--from", dest="from_format", choices=FORMATS, default=None,
                    metavar="FORMAT",
                    help=f"MODEL is an instance file of another placement system "
                         f"({', '.join(FORMATS)}); its machine comes with it (no "
                         f"--cost-model)")
    sp.add_argument("--devices", type=_argtypes.positive_int, default=None, metavar="N",
                    help="with --from: the number of accelerators (default: the file's)")


def add_objective_args(sp) -> None:
    """``--objective`` and ``--ruler``."""
    sp.add_argument("--objective", choices=OBJECTIVES, default=None,
                    help="latency: the step time (default); throughput: the time between "
                         "steps pipelined over the devices (the busiest device, link or "
                         "host). An imported instance defaults to its format's objective")
    sp.add_argument("--ruler", choices=("own", "simplace"), default="own",
                    help="with --from: score placements by the instance's own system's "
                         "rules (own, default) or by simplace's simulation of its machine")


def imported(args) -> bool:
    """True when MODEL is an instance file (``--from``)."""
    return getattr(args, "from_format", None) is not None


def check_instance_args(args) -> None:
    """The options that go with ``--from`` only, or never with it."""
    if imported(args):
        if getattr(args, "cost_model", None):
            raise OptionError(f"--from {args.from_format}: the instance brings its machine; "
                              f"drop --cost-model {args.cost_model}.")
        for flag, value in (("--batch", getattr(args, "batch", None)),
                            ("--inference", getattr(args, "inference", False)),
                            ("--small", getattr(args, "small", False))):
            if value:
                raise OptionError(f"{flag} applies to traced models, not to an instance "
                                  f"file (--from {args.from_format}).")
        if getattr(args, "validate_every", None) is not None:
            raise OptionError("An imported instance has no hardware to validate on: drop "
                              "--validate-every.")
        return
    if getattr(args, "cost_model", None) is None:
        raise OptionError("Give --cost-model NAME (e.g. haswell_k40x4, or a .json file), or "
                          "--from FORMAT when MODEL is an instance file of another system.")
    for flag, value in (("--devices", getattr(args, "devices", None)),
                        ("--ruler", getattr(args, "ruler", "own") != "own" or None)):
        if value:
            raise OptionError(f"{flag} goes with --from FORMAT (an instance file).")


def load_problem(args):
    """``(instance, graph, cost_model)`` of an instance file (``--from``), its machine
    judging by ``--objective`` (default: the format's) with its own ruler where it has
    one for that objective (unless ``--ruler simplace``)."""
    from simplace.external import load_instance

    inst = load_instance(args.model, args.from_format, devices=args.devices)
    objective = args.objective or inst.default_objective
    judge = objective
    if args.ruler == "own":
        judge = inst.rulers.get(objective, objective)
    return inst, inst.graph, inst.cost_model.with_objective(judge)

"""``simplace simulate``: one placement (a file, or every op on one device) simulated on
the machine, reported, and optionally saved and drawn."""

from __future__ import annotations

import sys

from simplace.cli_model import problem_from_args
from simplace.cli_report import _oom_devices, report_result
from simplace.errors import EXIT_OOM


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

"""``simplace parallelize MODEL --cost-model NAME --devices P``: PaSE from the command line.
"""

from __future__ import annotations

import argparse

from simplace import paths
from simplace._argtypes import int_range, positive_int
from simplace.parallel.costs import MAX_DEVICES

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``parallelize`` subcommand to an argparse subparsers object."""
    sp = subparsers.add_parser(
        "parallelize", help="split every layer over P devices (PaSE dynamic programming)",
        description="Find a parallelization strategy (split factors per layer) by PaSE's "
                    "dynamic programming and compare it with data parallelism and the "
                    "expert strategy under the same cost model.")
    sp.add_argument("model", metavar="MODEL",
                    help="zoo name (see `simplace models`), path/file.py:factory, "
                         "package.module:factory, or a saved graph .json")
    sp.add_argument("--cost-model", required=True, metavar="NAME",
                    help=paths.CLI_COST_MODEL_HELP + "; its fastest accelerator and link "
                         "stand for all P devices")
    sp.add_argument("--cost-model-dir", default=None, metavar="DIR",
                    help=paths.CLI_COST_MODEL_DIR_HELP)
    sp.add_argument("--devices", type=int_range(1, MAX_DEVICES), required=True, metavar="P",
                    help=f"number of devices to split over, 1..{MAX_DEVICES}")
    sp.add_argument("--method", default="pase", choices=("pase", "data_parallel", "expert"),
                    help="strategy to print per layer (default pase)")
    sp.add_argument("--batch", type=positive_int, default=None,
                    help="batch size (default: the model's)")
    sp.add_argument("--inference", action="store_true",
                    help="trace inference instead of a training step")
    sp.add_argument("--small", action="store_true", help="tiny sizes of a zoo model")
    sp.add_argument("--at-most", action="store_true",
                    help="allow configurations using fewer than P devices (larger search)")
    sp.add_argument("--min-part", type=positive_int, default=1, metavar="N",
                    help="cut-off: no split leaves fewer than N elements per part (default 1)")
    sp.add_argument("--out", metavar="S.JSON", help="save the per-layer splits and specs as JSON")
    sp.set_defaults(func=run)
    return sp


def run(args) -> int:
    """Run ``simplace parallelize``; returns the exit status."""
    from simplace.cli_model import graph_from_args
    from simplace.cost_model import CostModel
    from simplace.parallel import parallelize
    from simplace.progress import note

    cost_model = CostModel.load(args.cost_model, args.cost_model_dir)
    graph = graph_from_args(args)  # says on stderr that it traces, and how long it took
    note(f"{args.method} over {args.devices} devices...")
    st = parallelize(graph, cost_model, args.devices, method=args.method,
                     exact=not args.at_most, min_part_elements=args.min_part)
    m = st.info["machine"]
    print(f"{graph.name}: {graph.num_ops:,} ops -> {len(st.layers)} layers; "
          f"{st.devices} x {m['device_name']} of {cost_model.name} "
          f"(links {m['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, {m['latency_s'] * 1e6:.1f} us)")
    print()
    print(st.table())
    print()
    rows = [(st.method, st.step_time_s)] + [(k, v) for k, v in st.baselines_s.items()
                                             if k != st.method]
    for name, t in rows:
        rel = f"{t / st.step_time_s:.2f}x the {st.method} time" if name != st.method else ""
        print(f"  {name:<14} {t * 1e3:10.3f} ms  {rel}")
    if st.method == "pase":
        print(f"\nspeedup over data parallelism {st.speedup_over('data_parallel'):.2f}x, over "
              f"the expert {st.speedup_over('expert'):.2f}x; search {st.search_time_s:.2f} s "
              f"(largest dependent set {st.info['max_dependent_set']}, largest table "
              f"{st.info['max_table_entries']:,} entries)")
    else:
        print(f"\nevaluated in {st.search_time_s:.2f} s")
    if st.unsupported:
        print(f"replicated (no split rule): {', '.join(st.unsupported)}")
    print(f"mesh {st.mesh_shape} axes {st.mesh_axis_names}")
    if args.out:
        from simplace._jsonfile import write_json

        write_json(args.out, strategy_to_dict(st))  # atomic: a failure keeps the old file
        print(f"strategy saved to {args.out}")
    return 0


def strategy_to_dict(st) -> dict:
    """A JSON-able record of a strategy (splits per layer, specs as lists)."""
    def spec(s):
        return [list(e) if isinstance(e, tuple) else e for e in tuple(s)]

    return {
        "schema": "simplace.parallel_strategy", "schema_version": 1,
        "method": st.method, "devices": st.devices, "step_time_s": st.step_time_s,
        "baselines_s": st.baselines_s, "search_time_s": st.search_time_s,
        "mesh_shape": list(st.mesh_shape), "mesh_axis_names": list(st.mesh_axis_names),
        "layers": [{"name": lp.name, "kind": lp.kind, "dims": lp.dims, "splits": lp.splits,
                    "compute_s": lp.compute_s, "comm_s": lp.comm_s} for lp in st.layers],
        "param_specs": {k: spec(v) for k, v in st.param_specs.items()},
        "unsupported": list(st.unsupported),
    }

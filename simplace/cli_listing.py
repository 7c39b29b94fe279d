"""The commands that list and describe: ``simplace models`` (the zoo), ``simplace
graph`` (a model's op graph) and ``simplace methods`` (the placement methods)."""

from __future__ import annotations

import sys
import time

from simplace.cli_model import graph_from_args, raise_if_terminated
from simplace.cli_report import _table
from simplace.errors import SimplaceError


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


def cmd_methods(args) -> int:
    """``simplace methods``: every placement method, one line each."""
    from simplace.placers import method_docs

    docs = method_docs()
    width = max(map(len, docs), default=0)
    for name, doc in docs.items():
        print(f"{name:<{width}}  {doc}")
    return 0

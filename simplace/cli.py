"""The ``simplace`` command line. Each subcommand is one function ``cmd_<name>(args)``."""

from __future__ import annotations

import argparse
import sys
import time

from simplace.errors import SimplaceError


def _fmt_bytes(n: float) -> str:
    from simplace.graph import _fmt_bytes as fmt

    return fmt(n)


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
    from simplace import zoo

    rows = []
    for name in zoo.names():
        info = zoo.info(name)
        row = [name, info.family, info.description]
        if args.count:
            from simplace.models import load_graph

            g = load_graph(name, training=not args.inference, small=args.small)
            row += [f"{g.num_ops:,}", f"{g.flops.sum() / 1e9:.1f}"]
        rows.append(row)
    header = ["model", "family", "description"] + (["ops", "GFLOP"] if args.count else [])
    print(_table(rows, header))
    if not args.count:
        print("\n(op counts: `simplace models --count`, which traces every model)")
    return 0


# ---------------------------------------------------------------------------- graph
def cmd_graph(args) -> int:
    from simplace.models import load_graph

    t0 = time.perf_counter()
    g = load_graph(args.model, training=not args.inference, batch=args.batch, small=args.small)
    elapsed_s = time.perf_counter() - t0
    print(g.summary(top=args.top))
    print(f"  loaded in {elapsed_s:.2f} s")
    if args.out:
        g.save(args.out)
        print(f"saved to {args.out}")
    return 0


# ---------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="simplace",
        description="Simulator-first device placement for JAX computation graphs.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def model_args(sp):
        sp.add_argument("model", metavar="MODEL",
                        help="zoo name (see `simplace models`), path/file.py:factory, "
                             "package.module:factory, or a saved graph .json")
        sp.add_argument("--batch", type=int, default=None, help="batch size (default: "
                        "the model's)")
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
    sp.add_argument("--out", help="save the graph as JSON")
    sp.add_argument("--top", type=int, default=8, help="how many common primitives to list")
    sp.set_defaults(func=cmd_graph)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SimplaceError as err:
        print(f"simplace {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

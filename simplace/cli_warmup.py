"""``simplace warmup``: compile numba's kernels once, ahead of the first search
(``simplace.kernels``), or say which this install has (``--check``)."""

from __future__ import annotations

import time

from simplace.cli_report import _table
from simplace.errors import SimplaceError
from simplace.progress import note


def add_parser(sub) -> None:
    """The ``warmup`` subcommand's parser."""
    from simplace import kernels

    sp = sub.add_parser(
        "warmup", help="compile the compiled loops (numba) once, so that the first search's "
                       "budget does not pay for it")
    sp.add_argument("--check", action="store_true",
                    help="only say which kernels this install has compiled")
    sp.add_argument("--kernels", default=None, metavar="NAME,...",
                    help=f"these kernels only (of {', '.join(k.name for k in kernels.KERNELS)})")
    sp.set_defaults(func=cmd_warmup)


def cmd_warmup(args) -> int:
    """``simplace warmup``: compile (or load) every kernel, with the seconds each took."""
    from simplace import kernels
    from simplace.warmup import warm_up

    names = None
    if args.kernels is not None:
        names = [n.strip() for n in args.kernels.split(",") if n.strip()]
        unknown = [n for n in names if n not in {k.name for k in kernels.KERNELS}]
        if unknown or not names:
            raise SimplaceError(f"--kernels {args.kernels!r}: give names among "
                                f"{', '.join(k.name for k in kernels.KERNELS)}, "
                                f"separated by commas.")
    chosen = [kernels.kernel(n) for n in names] if names else list(kernels.KERNELS)
    if args.check:
        rows = [[k.name, "compiled" if kernels.on_disk(k.name) else "not compiled", k.what]
                for k in chosen]
        print(_table(rows, ["kernel", "this install", "for"]))
        return 0
    t0 = time.perf_counter()
    rows = warm_up([k.name for k in chosen], progress=note)
    print(_table([[r["name"], "loaded" if r["was_compiled"] else "compiled",
                   f"{r['seconds']:.1f}"] for r in rows], ["kernel", "", "seconds"]))
    fresh = sum(not r["was_compiled"] for r in rows)
    print(f"{fresh} of {len(rows)} kernels compiled, {len(rows) - fresh} already were; "
          f"{time.perf_counter() - t0:.1f} s in all")
    lost = [r["name"] for r in rows if not r["on_disk"]]
    if lost:
        print(f"numba could not keep {', '.join(lost)} on disk (a read-only install?): every "
              f"process compiles them again. Set NUMBA_CACHE_DIR to a writable folder and run "
              f"`simplace warmup` again.")
    return 0

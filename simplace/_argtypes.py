"""argparse ``type=`` checkers for the numbers of the command line.

A number out of range is refused while the arguments are parsed, before any work: argparse
prints ``argument --seed: must be an integer in 0..4294967295, got '-5'`` and exits 2.
"""

from __future__ import annotations

import argparse
import math

# numpy's legacy seeding (RandomState, used by some placers) takes 0..2**32-1.
MAX_SEED = 2**32 - 1


def int_range(lo: int, hi: int | None = None, what: str = "an integer"):
    """A ``type=`` for integers in ``lo..hi`` (``hi`` None: no upper bound)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}.") from None
        if value < lo or (hi is not None and value > hi):
            rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
            raise argparse.ArgumentTypeError(f"must be {what} {rng}, got {text!r}.")
        return value

    parse.__name__ = "int"
    return parse


def float_range(lo: float, hi: float | None = None, *, lo_open: bool = False,
                hi_open: bool = False, what: str = "a number"):
    """A ``type=`` for finite floats in ``[lo, hi]`` (open ends as asked); NaN and
    infinities are refused, so a budget is always a real number of seconds."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}.") from None
        low_ok = value > lo if lo_open else value >= lo
        high_ok = hi is None or (value < hi if hi_open else value <= hi)
        if not math.isfinite(value) or not low_ok or not high_ok:
            low = f"> {lo:g}" if lo_open else f">= {lo:g}"
            high = "" if hi is None else f" and {'<' if hi_open else '<='} {hi:g}"
            raise argparse.ArgumentTypeError(f"must be a finite {what} {low}{high}, got "
                                             f"{text!r}.")
        return value

    parse.__name__ = "float"
    return parse


seed = int_range(0, MAX_SEED, "an integer seed")
positive_int = int_range(1)
nonnegative_int = int_range(0)
positive_seconds = float_range(0.0, lo_open=True, what="number of seconds")
nonnegative_seconds = float_range(0.0, what="number of seconds")

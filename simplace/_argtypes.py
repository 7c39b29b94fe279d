"""Number checks shared by the command line and the Python API.

On the command line (argparse ``type=``), a number out of range is refused while the
arguments are parsed, before any work: argparse prints ``argument --seed: must be an
integer seed in 0..4294967295, got '-5'.`` and exits 2. The Python API
(``check_int``, ``check_float``) raises ``OptionError`` with the same words:
``seed must be an integer seed in 0..4294967295, got -5.``
"""

from __future__ import annotations

import argparse
import math
import numbers

from simplace.errors import OptionError

# numpy's legacy seeding (RandomState, used by some placers) takes 0..2**32-1.
MAX_SEED = 2**32 - 1
# Batch sizes become array dimensions; past int32 JAX cannot make the shapes.
MAX_BATCH = 2**31 - 1
# A time budget longer than this is a typo (1e12 s is 30,000 years): refused, not waited.
MAX_BUDGET_S = 7 * 24 * 3600.0


def _int_text(lo: int, hi: int | None, what: str) -> str:
    return f"{what} {f'>= {lo}' if hi is None else f'in {lo}..{hi}'}"


def _float_text(lo, hi, lo_open, hi_open, what) -> str:
    low = f"> {lo:g}" if lo_open else f">= {lo:g}"
    high = "" if hi is None else f" and {'<' if hi_open else '<='} {hi:g}"
    return f"a finite {what} {low}{high}"


def check_int(value, name: str, lo: int, hi: int | None = None,
              what: str = "an integer") -> int:
    """``value`` as an int in ``lo..hi`` (``hi`` None: no upper bound), else OptionError
    naming ``name``. Booleans and non-integral numbers (1.5, NaN) are refused."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok or value < lo or (hi is not None and value > hi):
        raise OptionError(f"{name} must be {_int_text(lo, hi, what)}, got {value!r}.")
    return int(value)


def check_float(value, name: str, lo: float, hi: float | None = None, *,
                lo_open: bool = False, hi_open: bool = False,
                what: str = "number") -> float:
    """``value`` as a finite float in ``[lo, hi]`` (open ends as asked), else OptionError
    naming ``name``. Booleans, strings, NaN and infinities are refused."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    x = float(value) if ok else math.nan
    low_ok = x > lo if lo_open else x >= lo
    high_ok = hi is None or (x < hi if hi_open else x <= hi)
    if not (ok and math.isfinite(x) and low_ok and high_ok):
        raise OptionError(f"{name} must be {_float_text(lo, hi, lo_open, hi_open, what)}, "
                          f"got {value!r}.")
    return x


def check_seed(value, name: str = "seed") -> int:
    """A seed in ``0..MAX_SEED``, as ``--seed`` takes it."""
    return check_int(value, name, 0, MAX_SEED, "an integer seed")


def check_budget(value, name: str = "budget_s") -> float | None:
    """A time budget in seconds, ``> 0`` and at most ``MAX_BUDGET_S`` (None: none)."""
    if value is None:
        return None
    return check_float(value, name, 0.0, MAX_BUDGET_S, lo_open=True,
                       what="number of seconds")


def int_range(lo: int, hi: int | None = None, what: str = "an integer"):
    """A ``type=`` for integers in ``lo..hi`` (``hi`` None: no upper bound)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}.") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {_int_text(lo, hi, what)}, got "
                                             f"{text!r}.")
        return value

    parse.__name__ = "int"
    return parse


def float_range(lo: float, hi: float | None = None, *, lo_open: bool = False,
                hi_open: bool = False, what: str = "number"):
    """A ``type=`` for finite floats in ``[lo, hi]`` (open ends as asked); NaN and
    infinities are refused, so a budget is always a real number of seconds."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a {what}, got {text!r}.") from None
        low_ok = value > lo if lo_open else value >= lo
        high_ok = hi is None or (value < hi if hi_open else value <= hi)
        if not math.isfinite(value) or not low_ok or not high_ok:
            raise argparse.ArgumentTypeError(
                f"must be {_float_text(lo, hi, lo_open, hi_open, what)}, got {text!r}.")
        return value

    parse.__name__ = "float"
    return parse


seed = int_range(0, MAX_SEED, "an integer seed")
positive_int = int_range(1)
nonnegative_int = int_range(0)
batch_size = int_range(1, MAX_BATCH, "a batch size")
positive_seconds = float_range(0.0, lo_open=True, what="number of seconds")
nonnegative_seconds = float_range(0.0, what="number of seconds")
budget_seconds = float_range(0.0, MAX_BUDGET_S, lo_open=True, what="number of seconds")

"""One way to compile the project's loops: ``njit``.

numba is a default dependency. Where it is missing, ``njit`` leaves the function as
plain Python (same results, much slower); modules that cannot do without it (the native
simulator) import numba themselves, so that their absence shows as an ImportError.
"""

from __future__ import annotations

try:
    import numba
except ImportError:
    numba = None


def njit(**kw):
    """``numba.njit(cache=True, error_model="numpy", **kw)``: machine code kept on disk
    for later processes, or compiled once per process where numba finds no writable
    place for its cache (a read-only install); the plain function without numba.
    ``error_model="numpy"``: no zero-divisor checks (the loops divide only by numbers
    > 0, so results do not change; the checks cost a few percent)."""

    def wrap(fn):
        if numba is None:
            return fn
        try:
            return numba.njit(cache=True, error_model="numpy", **kw)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return numba.njit(cache=False, error_model="numpy", **kw)(fn)

    return wrap

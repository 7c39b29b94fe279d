"""numba's compiled loops (kernels): which of them this install has compiled
(``simplace.warmup`` compiles them all once: ``simplace warmup``).

numba compiles a kernel on its first call in an install and keeps the machine code on
disk (``simplace._numba.njit``: ``cache=True``, in ``__pycache__`` beside the sources or
in ``$NUMBA_CACHE_DIR``); later processes load it in a fraction of a second. The first
compile takes seconds (the batched simulator's the longest: ``compile_s``), and a search's
time budget counts it, so the first budgeted run of a fresh install overshoots its
budget by that much. ``simplace warmup`` pays it once, ahead; until then the searches say
so when they start (``note_cold``), and a fast method whose kernel is not compiled yet is
estimated with its compile time (``compile_s``), so a short budget skips it rather than
overshooting.

Whether a kernel is compiled is read from numba's cache index (an entry for this source
file's version); where numba cannot keep a cache (a read-only install) every process
compiles, and ``cached`` is False for good.
"""

from __future__ import annotations

import dataclasses
import importlib


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One group of compiled loops: ``name``; ``what`` it is for; its ``functions``
    (``"module:function"``, numba dispatchers); ``compile_s``, about what compiling them
    takes on the project's 2-core VM (``python bench/kernels.py``). ``simplace.warmup``
    runs each on a tiny problem."""

    name: str
    what: str
    functions: tuple[str, ...]
    compile_s: float


# In the order simplace.warmup compiles them: the simulator first, which every search needs.
KERNELS = (
    Kernel("simulator", "the batched simulator (every search)",
           ("simplace.sim.native:_simulate_block",), 13.0),
    Kernel("throughput", "the throughput objective's copies per link",
           ("simplace.sim.objective:_link_loads_kernel",), 0.5),
    Kernel("pipeline", "the pipeline method's stage costs",
           ("simplace.placers.pipeline:_range_loads",), 1.0),
    Kernel("ideals", "the ideals method's dynamic programme",
           ("simplace.placers.ideals:_run", "simplace.placers.ideals:_add",
            "simplace.placers.ideals:_remove"), 2.0),
    Kernel("policy", "the pretrained policy's sampling and its guided search",
           ("simplace.rl.policies.universal:_resolve_kernel", "simplace.rl.guided:_propose"),
           2.0),
    Kernel("doppler", "Doppler's simulator, the ruler of its imported instances",
           ("simplace.external.doppler:_replay_batch",), 6.0),
    Kernel("msr", "msr's rulers of its imported instances",
           ("simplace.external.msr:_loads_batch", "simplace.external.msr:_latency_batch"),
           2.0),
)
_BY_NAME = {k.name: k for k in KERNELS}
# Kernels found compiled in this process: they stay so (the index is read once).
_COMPILED: set[str] = set()


def kernel(name: str) -> Kernel:
    """The kernel called ``name`` (``ValueError`` naming the known ones otherwise)."""
    if name not in _BY_NAME:
        raise ValueError(f"unknown kernel {name!r}: one of {', '.join(_BY_NAME)}")
    return _BY_NAME[name]


def dispatcher_cached(fn) -> bool:
    """Whether numba's on-disk cache holds machine code of ``fn`` (a numba dispatcher)
    for its current source; False where it keeps no cache or ``fn`` is no dispatcher."""
    cache = getattr(fn, "_cache", None)
    index = getattr(getattr(cache, "_cache_file", None), "_load_index", None)
    if index is None:  # not compiled by numba, or a cache this numba lays out otherwise
        return False
    try:
        return bool(index())
    except (OSError, EOFError, ValueError, TypeError, AttributeError):
        return False


def _function(path: str):
    mod, _, name = path.partition(":")
    return getattr(importlib.import_module(mod), name)


def cached(name: str) -> bool:
    """Whether every function of kernel ``name`` is compiled: in numba's cache
    (``dispatcher_cached``) or already in this process (a read-only install compiles once
    per process); True where numba is not installed (the loops run as Python)."""
    from simplace._numba import numba

    if numba is None or name in _COMPILED:
        return True
    fns = [_function(f) for f in kernel(name).functions]
    if all(getattr(fn, "signatures", None) or dispatcher_cached(fn) for fn in fns):
        _COMPILED.add(name)
        return True
    return False


def loaded(name: str) -> bool:
    """Whether every function of kernel ``name`` is already machine code in this process
    (a call costs no compilation nor cache load); True where numba is not installed."""
    from simplace._numba import numba

    if numba is None:
        return True
    return all(getattr(_function(f), "signatures", None) for f in kernel(name).functions)


def on_disk(name: str) -> bool:
    """Whether numba's cache holds every function of kernel ``name`` (for later
    processes), whatever this process has compiled."""
    return all(dispatcher_cached(_function(f)) for f in kernel(name).functions)


def compile_s(names) -> float:
    """Seconds of compilation the kernels ``names`` still need in this install (0 for
    those cached): what a method that runs them adds to its first call."""
    return sum(kernel(n).compile_s for n in names if not cached(n))


def cold() -> list[str]:
    """Names of the kernels not compiled in this install."""
    return [k.name for k in KERNELS if not cached(k.name)]


_SAID: list[bool] = []


def note_cold(progress, budget_s: float | None) -> None:
    """Tell ``progress`` once per process, when a search with a time budget starts
    before the simulator is compiled in this install, that the compilation counts
    against the budget and how to pay it ahead."""
    if progress is None or budget_s is None or _SAID or cached("simulator"):
        return
    _SAID.append(True)
    progress(f"the simulator is not compiled yet in this install (numba's cache has no "
             f"copy of it): compiling it takes about {kernel('simulator').compile_s:.0f} s "
             f"on 2 cores, once, and counts against this {budget_s:.1f} s budget; "
             f"`simplace warmup` compiles every kernel ahead")

"""numba's compiled loops (kernels): which of them this install has compiled, and
``warm_up``, which compiles them all once (``simplace warmup``).

numba compiles a kernel on its first call in an install and keeps the machine code on
disk (``simplace._numba.njit``: ``cache=True``, in ``__pycache__`` beside the sources or
in ``$NUMBA_CACHE_DIR``); later processes load it in a fraction of a second. The first
compile takes seconds (the batched simulator's about 12 s on a 2-core VM), and a search's
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
import time
from collections.abc import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One group of compiled loops: ``name``; ``what`` it is for; its ``functions``
    (``"module:function"``, numba dispatchers); ``compile_s``, about what compiling them
    takes on the project's 2-core VM (``python bench/kernels.py``); ``warm``, a call that
    runs them on a tiny problem (compiling them where they are not cached)."""

    name: str
    what: str
    functions: tuple[str, ...]
    compile_s: float
    warm: Callable[[], None]


def _tiny_problem(objective: str = "latency"):
    from simplace.cost_model import CostModel
    from simplace.rl.distribution import random_dag

    graph = random_dag(40, 0)
    return graph, CostModel.load("haswell_k40x4").with_objective(objective)


def _warm_simulator() -> None:
    from simplace.sim import batched_simulator

    graph, model = _tiny_problem()
    p = np.random.default_rng(0).integers(0, model.num_devices, (4, graph.num_ops))
    for memory in (True, False):
        batched_simulator(graph, model, memory=memory)(p.astype(np.int32))


def _warm_throughput() -> None:
    from simplace.sim import batched_simulator

    graph, model = _tiny_problem("throughput")
    batched_simulator(graph, model)(np.zeros((2, graph.num_ops), np.int32))


def _warm_method(name: str, budget_s: float | None = None, **options) -> Callable[[], None]:
    def warm() -> None:
        from simplace.placers import optimize

        graph, model = _tiny_problem()
        optimize(graph, model, name, budget_s=budget_s, **options)

    return warm


# Small instances of the imported formats, written to a temporary folder and read back:
# reading one builds its ruler, and scoring with it runs the format's kernels.
_DOPPLER = "6\n0, 1,\n0, 0, 1, 2,\n1, 2, 3, 3,\n10,100,einsummable\n20,200,einsummable\n" \
           "30,300,formation\n40,400,einsummable\n"


def _msr_doc() -> dict:
    nodes = [{"id": i, "name": f"n{i}", "supportedOnFpga": True, "cpuLatency": 10.0,
              "fpgaLatency": 1.0 + i, "isBackwardNode": False, "size": 1.0}
             for i in range(4)]
    edges = [{"sourceId": a, "destId": b, "cost": 0.5} for a, b in ((0, 1), (0, 2), (1, 3),
                                                                    (2, 3))]
    return {"maxSizePerFPGA": 100.0, "maxFPGAs": 2, "maxCPUs": 1, "nodes": nodes,
            "edges": edges}


def _warm_instance(fmt: str) -> Callable[[], None]:
    def warm() -> None:
        import json
        import tempfile
        from pathlib import Path

        from simplace.external import load_instance

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / ("g.txt" if fmt == "doppler" else "g.json")
            path.write_text(_DOPPLER if fmt == "doppler" else json.dumps(_msr_doc()))
            inst = load_instance(path, fmt)
            p = np.zeros((2, inst.graph.num_ops), np.int32)
            for ruler in inst.rulers.values():
                ruler(p)

    return warm


# In the order warm_up compiles them: the simulator first, which every search needs.
KERNELS = (
    Kernel("simulator", "the batched simulator (every search)",
           ("simplace.sim.native:_simulate_block",), 13.0, _warm_simulator),
    Kernel("throughput", "the throughput objective's copies per link",
           ("simplace.sim.objective:_link_loads_kernel",), 0.5, _warm_throughput),
    Kernel("pipeline", "the pipeline method's stage costs",
           ("simplace.placers.pipeline:_range_loads",), 1.0, _warm_method("pipeline")),
    Kernel("ideals", "the ideals method's dynamic programme",
           ("simplace.placers.ideals:_run", "simplace.placers.ideals:_add",
            "simplace.placers.ideals:_remove"), 2.0, _warm_method("ideals", budget_s=0.1)),
    Kernel("policy", "the pretrained policy's sampling and its guided search",
           ("simplace.rl.policies.universal:_resolve_kernel", "simplace.rl.guided:_propose"),
           2.0, _warm_method("rl-pretrained", refine_rounds=2)),
    Kernel("doppler", "Doppler's simulator, the ruler of its imported instances",
           ("simplace.external.doppler:_replay_batch",), 6.0, _warm_instance("doppler")),
    Kernel("msr", "msr's rulers of its imported instances",
           ("simplace.external.msr:_loads_batch", "simplace.external.msr:_latency_batch"),
           2.0, _warm_instance("msr")),
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
    """Whether every function of kernel ``name`` is in numba's cache (``dispatcher_cached``)
    or numba is not installed (nothing to compile: the loops run as Python)."""
    from simplace._numba import numba

    if numba is None or name in _COMPILED:
        return True
    if all(dispatcher_cached(_function(f)) for f in kernel(name).functions):
        _COMPILED.add(name)
        return True
    return False


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


def warm_up(names=None, progress=None) -> list[dict]:
    """Compile the kernels ``names`` (default: all, in ``KERNELS``' order) by running
    each on a tiny problem; those already cached are loaded, which is quick. One row per
    kernel: ``name``, ``seconds``, ``was_cached`` and ``cached`` (False after the run
    where numba keeps no cache: a read-only install)."""
    rows = []
    for k in [kernel(n) for n in (names or [k.name for k in KERNELS])]:
        was = cached(k.name)
        if progress is not None:
            progress(f"{k.name}: {'loading' if was else 'compiling'} {k.what}"
                     + ("" if was else f" (about {k.compile_s:g} s)"))
        t = time.perf_counter()
        k.warm()
        rows.append({"name": k.name, "seconds": time.perf_counter() - t, "was_cached": was,
                     "cached": cached(k.name)})
    return rows

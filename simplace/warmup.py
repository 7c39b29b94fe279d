"""Compiling numba's kernels ahead (``simplace warmup``): each kernel of
``simplace.kernels`` run once on a tiny problem, which compiles it where this install
has not (and keeps it in numba's cache), or loads it."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


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


# How each kernel of simplace.kernels.KERNELS is run.
_WARM: dict[str, Callable[[], None]] = {
    "simulator": _warm_simulator,
    "throughput": _warm_throughput,
    "pipeline": _warm_method("pipeline"),
    "ideals": _warm_method("ideals", budget_s=0.1),
    "policy": _warm_method("rl-pretrained", refine_rounds=2),
    "doppler": _warm_instance("doppler"),
    "msr": _warm_instance("msr"),
}


def warm_up(names=None, progress=None) -> list[dict]:
    """Compile the kernels ``names`` (default: all, in ``KERNELS``' order) by running
    each on a tiny problem; those already compiled are loaded, which is quick. One row per
    kernel: ``name``, ``seconds``, ``was_compiled`` and ``on_disk`` (False after the run
    where numba keeps no cache: a read-only install)."""
    from simplace.kernels import KERNELS, cached, kernel, on_disk

    rows = []
    for k in [kernel(n) for n in (names or [k.name for k in KERNELS])]:
        was = cached(k.name)
        if progress is not None:
            progress(f"{k.name}: {'loading' if was else 'compiling'} {k.what}"
                     + ("" if was else f" (about {k.compile_s:g} s)"))
        t = time.perf_counter()
        _WARM[k.name]()
        rows.append({"name": k.name, "seconds": time.perf_counter() - t, "was_compiled": was,
                     "on_disk": on_disk(k.name)})
    return rows

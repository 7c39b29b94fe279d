"""The front of the batched simulators: ``batched_simulator(graph, cost_model)`` picks
the native one (``simplace.sim.native``, a compiled numba loop) where numba is installed,
else the JAX scan (``BatchedSimulator``, in ``simplace.sim._scan``), and wraps it for a
throughput objective or a ruler (``simplace.sim.objective``)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from simplace import _lazy
from simplace.sim.inputs import sim_inputs
from simplace.sim.results import BatchResult

# Defined in the modules of the JAX simulator, and imported from here on first use:
# they import JAX, which the native simulator (and every command that uses only it)
# does not need.
__all__ = ["BatchResult", "batched_simulator"]  # and the lazily exported names below
__getattr__, __dir__ = _lazy.exports(globals(), {
    "BatchedSimulator": "simplace.sim._scan", "batch_bucket": "simplace.sim._scan",
    "_sweep_peaks": "simplace.sim._scan_memory"})

_NO_NUMBA_SAID: list[bool] = []


def _notice_no_numba(err: ImportError) -> None:
    """Say once per process that the native simulator is missing, and what it costs."""
    if _NO_NUMBA_SAID:
        return
    _NO_NUMBA_SAID.append(True)
    print(f"simplace: numba cannot be imported ({err}); the batched simulator runs on JAX, "
          "several times slower (pip install numba)", file=sys.stderr)


def batched_simulator(graph, cost_model, *, memory: bool | str = True,
                      max_batch: int | None = None, backend: str = "auto") -> Callable:
    """A fast simulator of many placements of ``graph`` on one machine.

    Args:
      graph: an ``OpGraph``.
      cost_model: a ``CostModel`` (or its interface) or a ``SimInputs``.
      memory: True: exact peak memory and OOM (the event sweep costs several times the
        scan on CPU). False: ``peak_memory_bytes`` is NaN and ``oom`` False. "oom": the
        exact OOM flag at nearly the cost of False: an upper bound of each device's
        peak (everything it ever holds, held all step) screens the placements, and only
        those whose bound exceeds a capacity are simulated with memory; the others,
        which cannot be OOM, report NaN peaks.
      max_batch: placements simulated at once (default: a power of two that keeps ops
        x placements within 1M, at least 64: 256 for ResNet-50, 64 for a 22k-op graph;
        the native simulator's memory does not grow with it: 8M there); larger batches
        run in chunks, with the same results.
      backend: "auto" (the native simulator where numba is installed, else JAX),
        "numba" (``simplace.sim.native.NativeSimulator``: a compiled loop, several times
        faster on CPU; numba is a default dependency) or "jax" (``BatchedSimulator``:
        a jitted scan, whose pure function ``traceable()`` a caller can run inside its
        own jit, e.g. on a GPU).

    Returns:
      ``f(placements int[B, M]) -> BatchResult`` (numpy arrays), with the reference
      simulator's semantics; ``step_time_s`` is the inputs' objective (see
      ``simplace.sim.objective``: a throughput objective or a ruler wraps the
      simulator, and has no ``traceable``). The JAX ``f`` compiles once per batch-size bucket (see
      ``batch_bucket``) and reuses the compiled code across calls; ``f.num_traces``
      counts compilations. The native ``f`` compiles once per install (numba's cache).
      Raises ``PlacementError`` for placements that do not fit.
    """
    if backend not in ("auto", "numba", "jax"):
        raise ValueError(f"backend must be 'auto', 'numba' or 'jax', got {backend!r}")
    inputs = sim_inputs(graph, cost_model)
    from simplace.sim.objective import ObjectiveSimulator, Ruler

    if isinstance(inputs.objective, Ruler):  # another system's rules: no simulation
        return ObjectiveSimulator(graph, inputs)
    sim = None
    if backend != "jax":
        try:
            from simplace.sim.native import NativeSimulator
        except ImportError as err:
            if backend == "numba":
                raise ImportError(
                    f"backend='numba' needs numba ({err}): pip install numba, or use "
                    "backend='jax'.") from err
            _notice_no_numba(err)
        else:
            sim = NativeSimulator(graph, inputs, memory=memory, max_batch=max_batch)
    if sim is None:
        from simplace.sim._scan import BatchedSimulator

        sim = BatchedSimulator(graph, inputs, memory=memory, max_batch=max_batch)
    return sim if inputs.objective == "latency" else ObjectiveSimulator(graph, inputs, sim)

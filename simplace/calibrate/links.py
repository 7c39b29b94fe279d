"""Timing transfers between devices with ``jax.device_put``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simplace.calibrate.harness import Timing, robust_stats


def link_sizes(max_nbytes: int, factor: int) -> list[int]:
    """Transfer sizes from 4 bytes up to ``max_nbytes``, each ``factor`` times the last."""
    sizes, n = [], 4
    while n <= max_nbytes:
        sizes.append(n)
        n *= factor
    return sizes


def time_link(src, dst, sizes: Sequence[int], *, rounds: int, repeats: int,
              budget_s: float) -> dict[int, tuple[Timing, Timing]]:
    """Time every size of one link, interleaved: ``rounds`` passes over all sizes, each
    taking ``repeats`` back-to-back samples (after one warm-up run). Load from other
    processes drifts over seconds; interleaving lets it hit every size alike instead of
    bending the size-time curve. A pass stops early once ``budget_s`` is spent (after
    the first).

    Returns ``{size: (blocking, after_call)}``, robust statistics of the pooled samples:
    ``blocking`` from the ``jax.device_put`` call to the copy's arrival, ``after_call``
    from the call's return to the arrival. The second is what a step waits for beyond
    the host time the call costs (``put_s``, timed in context); taken from the same
    sample it does not depend on how slow calls are in this process at this moment:
    on CPU devices the call copies before it returns, and late in a calibration (after
    hundreds of executables) the blocking time had doubled while the copy had not."""
    import time

    import jax

    xs = {n: jax.device_put(np.zeros(int(n), dtype=np.uint8), src) for n in sizes}
    jax.block_until_ready(list(xs.values()))
    blocking: dict[int, list[float]] = {n: [] for n in sizes}
    after: dict[int, list[float]] = {n: [] for n in sizes}
    start = time.perf_counter()
    for r in range(rounds):
        if r and time.perf_counter() - start > budget_s:
            break
        for n in sizes:
            jax.block_until_ready(jax.device_put(xs[n], dst))  # warm-up
            for _ in range(repeats):
                t0 = time.perf_counter()
                y = jax.device_put(xs[n], dst)
                t1 = time.perf_counter()
                jax.block_until_ready(y)
                t2 = time.perf_counter()
                blocking[n].append(t2 - t0)
                after[n].append(t2 - t1)
    return {n: (robust_stats(blocking[n]), robust_stats(after[n])) for n in sizes}

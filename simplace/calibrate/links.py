"""Timing transfers between devices with ``jax.device_put``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simplace.calibrate.harness import Timing, robust_stats, time_fn


def link_sizes(max_nbytes: int, factor: int) -> list[int]:
    """Transfer sizes from 4 bytes up to ``max_nbytes``, each ``factor`` times the last."""
    sizes, n = [], 4
    while n <= max_nbytes:
        sizes.append(n)
        n *= factor
    return sizes


def time_link(src, dst, sizes: Sequence[int], *, rounds: int, repeats: int,
              budget_s: float) -> dict[int, Timing]:
    """Time every size of one link, interleaved: ``rounds`` passes over all sizes, each
    taking ``repeats`` back-to-back samples (after one warm-up run). Load from other
    processes drifts over seconds; interleaving lets it hit every size alike instead of
    bending the size-time curve. A pass stops early once ``budget_s`` is spent (after
    the first). Returns the pooled samples' robust statistics per size."""
    import time

    import jax

    xs = {n: jax.device_put(np.zeros(int(n), dtype=np.uint8), src) for n in sizes}
    jax.block_until_ready(list(xs.values()))
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    start = time.perf_counter()
    for r in range(rounds):
        if r and time.perf_counter() - start > budget_s:
            break
        for n in sizes:
            t = time_fn(jax.device_put, xs[n], dst, warmup=1, min_repeats=repeats,
                        max_repeats=repeats, budget_s=0.0)
            samples[n].extend(t.samples_s)
    return {n: robust_stats(s) for n, s in samples.items()}

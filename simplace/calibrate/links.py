"""Timing transfers between devices with ``jax.device_put``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from simplace.errors import CalibrationError
from simplace.hardware.timing import Timing, robust_stats


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


# Segments of a chain: each is made this many times longer than the host's cost of one
# hop (a call and a device_put), so that the devices, not the host, set the pace.
CHAIN_DEVICE_BOUND = 4.0
# ... and at least this long (seconds), above the timer's and the launch's noise.
CHAIN_MIN_SEGMENT_S = 60e-6
# Matmul loop lengths tried per device, doubling, before a chain is given up.
_CHAIN_MAX_LOOP = 4096


def _chain_work(loop: int):
    """A jitted segment: ``loop`` small matmuls whose result scales its input (so the
    output has the input's size and depends on all the work)."""
    import jax
    import jax.numpy as jnp

    def seg(x, w):
        m = jax.lax.fori_loop(0, loop, lambda _, m: jnp.tanh(m @ w), w * x[0])
        return x * 0.999 + jnp.sum(m) * 1e-9

    return jax.jit(seg)


def time_link_chain(a, b, sizes: Sequence[int], *, hops: int, rounds: int, repeats: int,
                    budget_s: float, same_loop: bool = False) -> dict[str, Any]:
    """Copies between ``a`` and ``b`` timed in context: a chain of ``hops + 1`` segments
    alternating between the devices, each fed by a ``jax.device_put`` of the previous
    one's output, against the same segments chained on each device alone.

    Copies timed one at a time from idle (``time_link``) include waking the receiving
    side, which a copy between busy devices does not pay: what a step waits for is the
    copy inside the pipeline, so that is what this measures. Each device's
    segment is a loop of small matmuls, lengthened until it takes ``CHAIN_DEVICE_BOUND``
    times the host's cost of a hop, so that the devices set the pace and the chain's
    time beyond the devices' own work is the copies'. With ``same_loop`` (devices of the
    same hardware) both take the longer of their two lengths, so that the chains alone
    take the same time and their difference from the alternating one is less noisy.

    Returns ``{"loop": {"a": n, "b": n}, "hop_host_s": s, "sizes": {nbytes: {"alone_a",
    "alone_b", "chain", "chain_host": Timing}}}`` (``hop_host_s``: the host's cost of a
    hop with the shortest segments; ``chain_host``: the host time of dispatching the
    chain, to check that it was device-bound), or raises ``CalibrationError`` when no loop
    length makes the chain device-bound."""
    import time

    import jax

    w0 = np.eye(64, dtype=np.float32) * 0.5 + 0.01
    ws = {0: jax.device_put(w0, a), 1: jax.device_put(w0, b)}
    devs = (a, b)

    def run(fns, x, pattern):
        """Dispatch the chain (pattern: the device of each segment); returns (host, total)."""
        t0 = time.perf_counter()
        y = x
        for k, d in enumerate(pattern):
            if k and d != pattern[k - 1]:
                y = jax.device_put(y, devs[d])
            y = fns[d](y, ws[d])
        t1 = time.perf_counter()
        jax.block_until_ready(y)
        return t1 - t0, time.perf_counter() - t0

    n = hops + 1
    alt = [k % 2 for k in range(n)]
    small = min(sizes)
    x_small = {d: jax.device_put(np.ones(max(small // 4, 1), np.float32), devs[d])
               for d in (0, 1)}
    # The host's cost of one hop, with the shortest segments.
    fns = {d: _chain_work(1) for d in (0, 1)}
    for _ in range(3):
        run(fns, x_small[0], alt)
    hop_host = float(np.median([run(fns, x_small[0], alt)[0] for _ in range(7)])) / n
    target = max(CHAIN_DEVICE_BOUND * hop_host, CHAIN_MIN_SEGMENT_S)
    loop = {}
    for d in (0, 1):
        k = 1
        while True:
            f = _chain_work(k)
            for _ in range(2):
                run({d: f}, x_small[d], [d] * n)
            per_seg = float(np.median([run({d: f}, x_small[d], [d] * n)[1]
                                       for _ in range(5)])) / n
            if per_seg >= target:
                break
            if k >= _CHAIN_MAX_LOOP:
                raise CalibrationError(
                    f"A chain of segments on {devs[d]} stays host-bound ({per_seg * 1e6:.1f} "
                    f"us a segment at {k} matmuls, the host {hop_host * 1e6:.1f} us a hop): "
                    "copies cannot be timed in context on it.")
            k = min(max(2 * k, int(k * target / per_seg) + 1) if per_seg > 0 else 2 * k,
                    _CHAIN_MAX_LOOP)
        loop[d] = k
    if same_loop:
        loop[0] = loop[1] = max(loop.values())
    out: dict[str, Any] = {"loop": {"a": loop[0], "b": loop[1]},
                           "hop_host_s": hop_host, "sizes": {}}
    start = time.perf_counter()
    fns = {d: _chain_work(loop[d]) for d in (0, 1)}
    for nbytes in sorted(sizes):
        xs = {d: jax.device_put(np.ones(max(nbytes // 4, 1), np.float32), devs[d])
              for d in (0, 1)}
        cases = {"alone_a": (xs[0], [0] * n), "alone_b": (xs[1], [1] * n),
                 "chain": (xs[0], alt)}
        samples: dict[str, list[float]] = {k: [] for k in (*cases, "chain_host")}
        for r in range(rounds):
            if r and time.perf_counter() - start > budget_s:
                break
            # Interleaved, so that drift in the machine's speed hits all three alike.
            for key, (x, pattern) in cases.items():
                run(fns, x, pattern)  # warm-up (compilation on the first round)
                for _ in range(repeats):
                    host, total = run(fns, x, pattern)
                    samples[key].append(total)
                    if key == "chain":
                        samples["chain_host"].append(host)
        out["sizes"][int(nbytes)] = {k: robust_stats(v) for k, v in samples.items()}
    return out


def probe_put_wait(src, dst, *, target_s: float = 0.02, repeats: int = 5) -> dict:
    """Whether a ``jax.device_put`` from ``src`` to ``dst`` holds the host until its copy
    has arrived (``CostModel.put_waits``): the put of an array still being computed (a
    jitted loop that takes about ``target_s`` on ``src``) either returns at once or only
    once the computation and the copy are done. Between PjRt clients (the CPU and a GPU)
    JAX fetches the value to the host first, so the call waits.

    Returns ``{"call_s", "dispatch_s", "compute_s", "waits"}``: the put call's and the
    loop's dispatch host time (the least of ``repeats``: a busy host only adds to them)
    and the loop's blocking time, and whether the call took over half the loop (None
    when the loop ran before its own call returned: nothing was pending when the put
    was made, so this cannot tell)."""
    import time

    import jax
    import jax.numpy as jnp

    @jax.jit
    def work(y, n):
        return jax.lax.fori_loop(0, n, lambda i, z: jnp.tanh(z @ z), y)

    x = jax.device_put(jnp.full((128, 128), 0.01, jnp.float32), src)
    n = 4
    while True:
        jax.block_until_ready(work(x, n))  # compiled once: n is an argument
        t0 = time.perf_counter()
        jax.block_until_ready(work(x, n))
        compute = time.perf_counter() - t0
        if compute >= target_s or n >= 1 << 22:
            break
        n = int(n * min(64.0, max(2.0, 1.2 * target_s / max(compute, 1e-9))))
    jax.block_until_ready(jax.device_put(work(x, n), dst))  # the put's first call
    calls, dispatches = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        y = work(x, n)
        t1 = time.perf_counter()
        z = jax.device_put(y, dst)
        t2 = time.perf_counter()
        jax.block_until_ready(z)
        dispatches.append(t1 - t0)
        calls.append(t2 - t1)
    call, dispatch = float(min(calls)), float(min(dispatches))
    waits = None if dispatch > 0.5 * compute else bool(call > 0.5 * compute)
    return {"call_s": call, "dispatch_s": dispatch, "compute_s": compute, "waits": waits}

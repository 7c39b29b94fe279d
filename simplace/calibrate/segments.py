"""Measuring what a placed program costs, in context: segments, launches, dispatch, puts.

The simulator charges a segment (one jitted XLA computation) ``launch_s`` of device time
plus the fused costs of its ops, and the host ``dispatch_s`` per segment call and
``put_s`` per ``jax.device_put`` call. A time measured for one op alone holds all of
these, so it is never used as an op cost. Instead:

* ``time_runtime``: per device, a tiny jitted call timed with blocking (dispatch +
  launch + wait) and dispatched only (host time per call, calls queued back to back);
* ``time_put_host``: per link, the host time of a ``device_put`` call of a small ready
  array (the copy itself is the link's latency and bandwidth, timed in ``links``);
* ``cut_placements`` and ``time_segments``: real segments cut from zoo graphs (random
  contiguous runs of ops, and the whole graph as one), each timed alone on the inputs
  it has in a real step; ``segment_features`` gives each segment's ops (class, flops,
  bytes) so that the fit can spread its time over them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from simplace.calibrate.harness import Timing, robust_stats, time_fn

# How many placements to cut from each model, and how long their runs of ops are
# (log-uniform between 1 op and the whole graph): short runs pin launch and per-op
# costs, long ones the rates.
PLACEMENTS_PER_MODEL = 3
RUNS_PER_PLACEMENT = (3, 9)


def time_runtime(device, *, calls: int = 200, **harness_kw) -> dict:
    """``{"block": Timing, "host": Timing}`` of a tiny jitted call on ``device``: the
    blocking time of one call (host dispatch + launch + wait) and the host time of one
    call when calls are only dispatched (back to back, one wait at the end)."""
    import jax
    import jax.numpy as jnp

    f = jax.jit(lambda x: x + 1)
    x = jax.device_put(jnp.ones((8,), jnp.float32), device)
    block = time_fn(f, x, **harness_kw)
    jax.block_until_ready(f(x))
    samples = []
    out = None
    for _ in range(calls):
        t0 = time.perf_counter()
        out = f(x)
        samples.append(time.perf_counter() - t0)
    jax.block_until_ready(out)
    return {"block": block, "host": robust_stats(samples)}


def time_put_host(src, dst, *, calls: int = 100) -> Timing:
    """Host time of one ``jax.device_put`` call from ``src`` to ``dst`` of a small ready
    array (not waiting for the copy)."""
    import jax

    x = jax.device_put(np.zeros(256, dtype=np.float32), src)
    jax.block_until_ready(jax.device_put(x, dst))
    samples, outs = [], []
    for _ in range(calls):
        t0 = time.perf_counter()
        outs.append(jax.device_put(x, dst))
        samples.append(time.perf_counter() - t0)
    jax.block_until_ready(outs)
    return robust_stats(samples)


def cut_placements(num_ops: int, num_devices: int, rng: np.random.Generator,
                   count: int = PLACEMENTS_PER_MODEL) -> list[np.ndarray]:
    """``count`` placements of ``num_ops`` ops made of random runs (log-uniform lengths),
    the first one all on device 0 (the whole graph as one segment)."""
    out = [np.zeros(num_ops, dtype=np.int32)]
    lo, hi = RUNS_PER_PLACEMENT
    for _ in range(count - 1):
        if num_ops < 2:
            break
        runs = int(rng.integers(lo, hi + 1))
        # log-uniform cut points favour both short and long runs
        cuts = np.unique(np.round(np.exp(rng.uniform(0, np.log(num_ops), runs))).astype(int))
        cuts = cuts[(cuts > 0) & (cuts < num_ops)]
        p = np.zeros(num_ops, dtype=np.int32)
        dev = int(rng.integers(num_devices))
        prev = 0
        for c in list(cuts) + [num_ops]:
            p[prev:c] = dev
            dev = (dev + 1 + int(rng.integers(max(num_devices - 1, 1)))) % num_devices \
                if num_devices > 1 else 0
            prev = c
        out.append(p)
    return out


def segment_features(graph, first: int, stop: int) -> dict:
    """The ops of one segment as lists: ``primitive``, ``flops``, ``bytes_accessed`` and
    ``local_input`` (some input comes from the segment itself)."""
    sl = slice(first, stop)
    ptr, order = graph.in_edges
    src = graph.src[order]
    local = [bool(np.any(src[ptr[i]:ptr[i + 1]] >= first)) for i in range(first, stop)]
    return {"primitive": graph.op[sl].tolist(), "flops": graph.flops[sl].tolist(),
            "bytes_accessed": graph.bytes_accessed[sl].tolist(), "local_input": local}


def time_segments(program, args: Sequence, placement: np.ndarray, devices: list,
                  **harness_kw) -> list[tuple[int, int, int, Timing]]:
    """``[(device index, first, stop, Timing)]``: each segment of ``placement`` timed alone
    (blocking) on the inputs it has in a real step."""
    import jax

    placed = program.place(placement, devices=devices)
    out = []
    # One real step compiles every segment and leaves each one's inputs in ``vals``.
    _, vals = placed.run(placed.place_args(*args), _keep=True)
    jax.block_until_ready([v for v in vals if v is not None])
    for seg, k in zip(placed.segments, placed._seg_steps, strict=True):
        _, fn, ins, _ = placed._steps[k]
        inputs = [vals[i] for i in ins]
        t = time_fn(lambda *xs, fn=fn: jax.block_until_ready(fn(*xs)), *inputs, **harness_kw)
        out.append((seg.device, seg.start, seg.stop, t))
    return out


def model_specs(fn, args) -> list:
    """``OpSpec`` of every distinct op signature that does work in ``fn(*args)``."""
    from simplace.calibrate.ops import specs_of

    return [s for s in specs_of(fn, args, "model").values() if s.does_work]


def host_placements(num_ops: int, num_devices: int, rng: np.random.Generator) -> list:
    """Placements whose steps the host is busy dispatching: every op on a random device
    (a segment and a put or so per op), and one op in four moved off device 0."""
    if num_devices < 2 or num_ops < 2:
        return []
    scattered = rng.integers(0, num_devices, num_ops).astype(np.int32)
    sparse = np.where(rng.random(num_ops) < 0.25,
                      rng.integers(1, num_devices, num_ops), 0).astype(np.int32)
    return [scattered, sparse]


def time_host(program, args: Sequence, placement: np.ndarray, devices: list,
              **harness_kw) -> dict:
    """Step time of ``placement``, a step the host is busy dispatching, timed as
    validation times steps (``simplace.validate.executor.measure``), with what it
    dispatched: ``{"host": Timing, "segments": [per device], "puts": [[per link]]}``.
    (Timing the calls alone, without waiting, gave per-call costs about twice those of
    steady repeated steps on a 2-core VM.)"""
    from simplace.validate.executor import measure

    placed = program.place(placement, devices=devices)
    step = measure(placed, args, **harness_kw).step
    d = len(devices)
    segs = [0] * d
    for s in placed.segments:
        segs[s.device] += 1
    puts = [[0] * d for _ in range(d)]
    for a, b in placed.put_links:
        puts[a][b] += 1
    return {"host": step, "segments": segs, "puts": puts}

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

from simplace.hardware.timing import Timing, robust_stats, time_fn

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
                  **harness_kw) -> list[tuple[int, int, int, Timing, dict]]:
    """``[(device index, first, stop, Timing, call)]``: each segment of ``placement``
    timed alone (blocking) on the inputs it has in a real step; ``call`` is
    ``{"host_s", "inputs", "outputs"}``: the host time of the segment's jitted call
    alone (``call_host_s``) and its arity. The call's host time grows with its arguments
    (a few microseconds each): it is taken out of the segment's time before op costs
    are fitted, instead of being spread over its ops."""
    import jax

    placed = program.place(placement, devices=devices)
    out = []
    # One real step compiles every segment and leaves each one's inputs in ``vals``.
    _, vals = placed.run(placed.place_args(*args), keep_values=True)
    jax.block_until_ready([v for v in vals if v is not None])
    for seg, k in zip(placed.segments, placed.segment_steps, strict=True):
        _, fn, ins, outs = placed.steps[k]
        inputs = [vals[i] for i in ins]
        t = time_fn(lambda *xs, fn=fn: jax.block_until_ready(fn(*xs)), *inputs, **harness_kw)
        call = {"host_s": call_host_s(fn, inputs), "inputs": len(ins), "outputs": len(outs)}
        out.append((seg.device, seg.start, seg.stop, t, call))
    return out


def call_host_s(fn, inputs: Sequence, *, calls: int = 15) -> float:
    """Median host time of one call ``fn(*inputs)`` made on an idle device: each call is
    timed up to its return (dispatch only), then waited for before the next one."""
    import jax

    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        res = fn(*inputs)
        samples.append(time.perf_counter() - t0)
        jax.block_until_ready(res)
    return float(np.median(samples))


def model_specs(fn, args) -> list:
    """``OpSpec`` of every distinct op signature that does work in ``fn(*args)``."""
    from simplace.calibrate.ops import specs_of

    return [s for s in specs_of(fn, args, "model").values() if s.does_work]


# Host-bound steps scatter at most this many consecutive ops (a random window of the
# graph) so that a large graph compiles a bounded number of distinct segments.
HOST_WINDOW_OPS = 160


def host_placements(num_ops: int, num_devices: int, rng: np.random.Generator) -> list:
    """Placements whose steps the host is busy dispatching: every op of a random window
    of at most ``HOST_WINDOW_OPS`` ops on a random device (about a segment and a put per
    op; the ops outside the window stay on device 0), and one op in four of such a
    window moved off device 0."""
    if num_devices < 2 or num_ops < 2:
        return []
    w = min(num_ops, HOST_WINDOW_OPS)
    out = []
    for sparse in (False, True):
        lo = int(rng.integers(0, num_ops - w + 1))
        p = np.zeros(num_ops, dtype=np.int32)
        if sparse:
            p[lo:lo + w] = np.where(rng.random(w) < 0.25, rng.integers(1, num_devices, w), 0)
        else:
            p[lo:lo + w] = rng.integers(0, num_devices, w)
        out.append(p)
    return out


def profile_steps(placed, placed_args, *, steps: int = 7) -> dict:
    """Host time of every segment call and ``device_put`` call in real steps of
    ``placed`` (the step loop of ``PlacedFunction.run``, each call timed up to its
    return; every step waited for at its end, as validation does), on arguments from
    ``placed.place_args``.

    Returns ``{"call_host_s": [per segment], "put_host_s": [per put], "loop_s",
    "step_s"}``: each call's median over ``steps`` steps, and the medians of the host
    loop's time and of the whole step's. These are the dispatch and put costs in
    context: with the devices' work and the other calls around them, a call costs the
    host several times what it costs alone on a 2-core VM.
    """
    import jax

    n_calls = sum(st[0] == "call" for st in placed.steps)
    calls = np.zeros((steps, n_calls))
    puts = np.zeros((steps, len(placed.steps) - n_calls))
    loops, totals = [], []
    clock = time.perf_counter
    for s in range(steps):
        vals = list(placed_args.slots)
        kc = kp = 0
        start = clock()
        for st in placed.steps:
            t0 = clock()
            if st[0] == "call":
                _, fn, ins, outs = st
                res = fn(*[vals[i] for i in ins])
                for k, v in zip(outs, res, strict=True):
                    vals[k] = v
                calls[s, kc] = clock() - t0
                kc += 1
            else:
                _, src, dst, dev = st
                moved = jax.device_put([vals[i] for i in src], dev)
                for k, v in zip(dst, moved, strict=True):
                    vals[k] = v
                puts[s, kp] = clock() - t0
                kp += 1
        loops.append(clock() - start)
        jax.block_until_ready([v for v in vals if v is not None])
        totals.append(clock() - start)
    return {"call_host_s": np.median(calls, axis=0).tolist(),
            "put_host_s": np.median(puts, axis=0).tolist(),
            "loop_s": float(np.median(loops)), "step_s": float(np.median(totals))}


def time_host(program, args: Sequence, placement: np.ndarray, devices: list,
              **harness_kw) -> dict:
    """Step time of ``placement`` timed as validation times steps
    (``simplace.hardware.executor.measure``), with what it dispatched and what each
    call cost the host in context (``profile_steps``): ``{"host": Timing, "segments":
    [per device], "puts": [[per link]], "segment_calls": [[device, first, stop, inputs,
    outputs] per segment], "put_links": [[src, dst] per put], "call_host_s",
    "put_host_s", "loop_s"}``."""
    from simplace.hardware.executor import measure

    placed = program.place(placement, devices=devices)
    step = measure(placed, args, **harness_kw).step
    prof = profile_steps(placed, placed.place_args(*args))
    d = len(devices)
    segs = [0] * d
    for s in placed.segments:
        segs[s.device] += 1
    puts = [[0] * d for _ in range(d)]
    for a, b in placed.put_links:
        puts[a][b] += 1
    calls = []
    for s, k in zip(placed.segments, placed.segment_steps, strict=True):
        _, _, ins, outs = placed.steps[k]
        calls.append([int(s.device), int(s.start), int(s.stop), len(ins), len(outs)])
    return {"host": step, "segments": segs, "puts": puts, "segment_calls": calls,
            "put_links": [[int(a), int(b)] for a, b in placed.put_links],
            "call_host_s": prof["call_host_s"], "put_host_s": prof["put_host_s"],
            "loop_s": prof["loop_s"]}

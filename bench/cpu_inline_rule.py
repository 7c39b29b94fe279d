"""Which jitted computations XLA:CPU runs inline on the calling thread, and what the others
cost when they wake a worker thread.

PjRt's CPU client runs an executable whose flop count (XLA's HloCostAnalysis, what
``jax.jit(f).lower(x).compile().cost_analysis()["flops"]`` reports) is under 1000 on the
thread that calls it, and hands the others to a worker thread (``cheap_computation_`` in
``xla/pjrt/cpu/cpu_client.cc``). This times one jitted computation of a few elementwise
ops over sizes either side of that threshold: the host time of a call when calls are
pipelined, the time per call of the pipeline, and a blocking call from idle (which pays
the worker's wake-up). The simulator does not model the rule yet (the cost model
charges a thread-pool wake-up per op by size, ``parallel_min_bytes``); this is the
evidence for doing so.

    python bench/cpu_inline_rule.py [--out bench/results/cpu_inline_rule_DATE_vm.txt]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import numpy as np  # noqa: E402
from report import Transcript, machine_line  # noqa: E402

SIZES = (100, 200, 400, 480, 520, 600, 1000, 4000, 16000)


def probe(n: int, *, calls: int = 200, blocking: int = 50) -> dict:
    """Host, pipelined and blocking time of one call of ``x * 1.0001 + 0.5`` then
    ``sin`` over ``n`` float32s, with XLA's flop count."""
    import jax
    import jax.numpy as jnp

    jf = jax.jit(lambda x: jnp.sin(x * 1.0001 + 0.5))
    x = jax.device_put(np.ones(n, np.float32), jax.devices()[0])
    ca = jf.lower(x).compile().cost_analysis()
    ca = ca[0] if isinstance(ca, list) else ca
    for _ in range(5):
        jf(x).block_until_ready()
    t0 = time.perf_counter()
    y = x
    for _ in range(calls):
        y = jf(y)
    t1 = time.perf_counter()
    y.block_until_ready()
    t2 = time.perf_counter()
    bl = []
    for _ in range(blocking):
        s = time.perf_counter()
        jf(x).block_until_ready()
        bl.append(time.perf_counter() - s)
    return {"n": n, "xla_flops": float(ca.get("flops", float("nan"))),
            "host_per_call_s": (t1 - t0) / calls, "pipelined_per_call_s": (t2 - t0) / calls,
            "blocking_call_s": float(np.median(bl))}


SINGLE_OP_SHAPES = ((480,), (1000,), (1800,), (2, 15, 15, 4), (2, 15, 15, 40))


def single_ops(order_seed: int, *, blocking: int = 200) -> list[dict]:
    """Blocking time (median and 75th percentile of ``blocking`` calls) and XLA's flops
    and transcendentals of one-op jitted computations over ``SINGLE_OP_SHAPES``, in an
    order shuffled by ``order_seed``."""
    import jax
    import jax.numpy as jnp

    ops = {"x+y": (lambda x, y: x + y, 2), "x+1": (lambda x: x + 1.0, 1), "sin": (jnp.sin, 1)}
    cases = [(name, shape) for shape in SINGLE_OP_SHAPES for name in ops]
    rows = []
    for k in np.random.default_rng(order_seed).permutation(len(cases)):
        name, shape = cases[k]
        fn, arity = ops[name]
        args = [jax.device_put(np.ones(shape, np.float32), jax.devices()[0])] * arity
        jf = jax.jit(fn)
        ca = jf.lower(*args).compile().cost_analysis()
        ca = ca[0] if isinstance(ca, list) else ca
        jf(*args).block_until_ready()
        t = []
        for _ in range(blocking):
            s = time.perf_counter()
            jf(*args).block_until_ready()
            t.append(time.perf_counter() - s)
        rows.append({"op": name, "shape": shape, "flops": float(ca.get("flops", 0.0)),
                     "transcendentals": float(ca.get("transcendentals", 0.0)),
                     "median_s": float(np.median(t)), "p75_s": float(np.percentile(t, 75))})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--single-ops", action="store_true",
                    help="also time one-op computations from idle, in two orders")
    ap.add_argument("--out", help="write the table here (.txt)")
    args = ap.parse_args(argv)
    out = Transcript()
    out.say(f"XLA:CPU inline rule; {machine_line()}")
    out.say(f"{'elements':>8} {'XLA flops':>9} {'host/call':>10} {'pipelined':>10} "
            f"{'blocking':>9}  (us)")
    for n in SIZES:
        r = probe(n)
        out.say(f"{r['n']:>8} {r['xla_flops']:>9.0f} {1e6 * r['host_per_call_s']:>10.2f} "
                f"{1e6 * r['pipelined_per_call_s']:>10.2f} "
                f"{1e6 * r['blocking_call_s']:>9.2f}")
    if args.single_ops:
        out.say("one-op computations, blocking calls from idle (us: median, p75), in two "
                "shuffled orders:")
        runs = [{(r["op"], r["shape"]): r for r in single_ops(seed)} for seed in (0, 1)]
        out.say(f"{'op':<4} {'shape':<16} {'flops':>7} {'transc':>7} "
                f"{'order 0':>13} {'order 1':>13}")
        for key, r in runs[0].items():
            cells = [f"{1e6 * x['median_s']:6.1f} {1e6 * x['p75_s']:6.1f}"
                     for x in (r, runs[1][key])]
            out.say(f"{r['op']:<4} {str(r['shape']):<16} {r['flops']:>7.0f} "
                    f"{r['transcendentals']:>7.0f} {cells[0]:>13} {cells[1]:>13}")
    out.finish(__file__, argv, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

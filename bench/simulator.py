"""Throughput of the simulators: placements per second, batched vs reference.

    python bench/simulator.py [--model resnet50 | --graph g.json | --synthetic-ops N]
                              [--cost-model cpu_h100x4_nvlink] [--batches 1,64,256,1024]
                              [--out results.json]

Prints a table (placements/s of the batched simulator per batch size, with exact peak
memory (memory=True), with the exact OOM flag only (memory="oom": peaks only for
placements that might not fit) and without memory (memory=False), its compile time, the
reference simulator's placements/s and the ratio) and writes it as JSON with ``--out``.
Quote figures with the machine they ran on (and whether other work shared its cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np


def _layered_dag(m: int, seed: int = 0):
    """A random layered DAG of ``m`` ops shaped like a training graph (in-degree 1-3)."""
    from simplace.graph import OpGraph

    rng = np.random.default_rng(seed)
    src, dst = [], []
    for j in range(1, m):
        k = int(rng.choice([1, 1, 2, 2, 3]))
        preds = {j - 1} | {int(x) for x in rng.integers(max(0, j - 64), j, size=k - 1)}
        for i in sorted(preds):
            src.append(i)
            dst.append(j)
    e = len(src)
    sizes = rng.integers(1, 64, 300) * 4096.0
    uses = np.stack([rng.integers(0, m, 600), rng.integers(0, 300, 600)], axis=1)
    uses = np.unique(uses, axis=0)
    return OpGraph(op=["op"] * m, name_path=[f"n{i}" for i in range(m)],
                   flops=rng.uniform(1e6, 1e9, m), bytes_accessed=rng.uniform(1e4, 1e7, m),
                   out_bytes=rng.integers(1, 4096, m) * 1024.0, signature=["s"] * m,
                   src=src, dst=dst, edge_bytes=rng.integers(1, 4096, e) * 1024.0,
                   is_output=rng.random(m) < 0.02, param_names=[f"p{j}" for j in range(300)],
                   param_sizes=sizes, param_op=uses[:, 0], param_index=uses[:, 1],
                   name=f"synthetic{m}")


def load_graph(args):
    if args.graph:
        from simplace.graph import OpGraph
        return OpGraph.load(args.graph)
    if args.synthetic_ops:
        return _layered_dag(args.synthetic_ops)
    try:
        from simplace import zoo
        from simplace.trace import trace
    except ImportError as err:
        sys.exit(f"cannot trace {args.model} ({err}); use --graph or --synthetic-ops")
    fn, ex = zoo.get(args.model, training=True, batch=args.batch)
    return trace(fn, *ex, name=args.model)


def load_machine(name: str, graph, d: int = 5):
    try:
        from simplace.cost_model import CostModel
    except ImportError:
        CostModel = None
    if CostModel is not None:
        try:
            return CostModel.load(name), name
        except Exception:  # noqa: BLE001 - any failure: fall back to a synthetic machine
            return CostModel.synthetic(d), f"synthetic({d})"
    from simplace.sim.inputs import make_sim_inputs
    rng = np.random.default_rng(0)
    return make_sim_inputs(rng.uniform(1e-5, 1e-3, (graph.num_ops, d)),
                           np.full((d, d), 1e-5), np.full((d, d), 1e10),
                           np.full(d, 16e9)), f"synthetic-inputs({d})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=None, help="model batch size")
    ap.add_argument("--graph", help="a saved OpGraph .json instead of a zoo model")
    ap.add_argument("--synthetic-ops", type=int, help="a random layered DAG of N ops")
    ap.add_argument("--cost-model", default="cpu_h100x4_nvlink")
    ap.add_argument("--batches", default="1,64,256,1024")
    ap.add_argument("--reference-runs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-memory", action="store_true",
                    help="only the memory=True rows (skip the 'oom' and memory-off rows)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    from simplace.sim import batched_simulator, lower_bound, sim_inputs, simulate

    graph = load_graph(args)
    machine, machine_name = load_machine(args.cost_model, graph)
    inp = sim_inputs(graph, machine)
    d = inp.num_devices
    rng = np.random.default_rng(0)
    print(f"graph {graph.name}: {graph.num_ops} ops, {graph.num_edges} edges; machine "
          f"{machine_name}: {d} devices; lower bound {lower_bound(graph, inp):.4g} s")

    t = time.perf_counter()
    for _ in range(args.reference_runs):
        simulate(graph, inp, rng.integers(0, d, graph.num_ops))
    ref_rate = args.reference_runs / (time.perf_counter() - t)

    rows = []
    for memory in ((True,) if args.no_memory else (True, "oom", False)):
        f = batched_simulator(graph, inp, memory=memory)
        for b in (int(x) for x in args.batches.split(",")):
            p = rng.integers(0, d, (b, graph.num_ops)).astype(np.int32)
            t = time.perf_counter()
            f(p)
            first = time.perf_counter() - t
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                f(p)
                times.append(time.perf_counter() - t)
            best = min(times)
            rows.append(dict(batch=b, memory=memory, compile_s=first - best,
                             call_s=best, placements_per_s=b / best,
                             speedup_vs_reference=b / best / ref_rate))
    print(f"\nreference: {ref_rate:.2f} placements/s")
    print(f"{'B':>6} {'memory':>7} {'compile s':>10} {'call s':>9} {'placements/s':>13} "
          f"{'x reference':>12}")
    for r in rows:
        print(f"{r['batch']:>6} {str(r['memory']):>7} {r['compile_s']:>10.2f} "
              f"{r['call_s']:>9.4f} {r['placements_per_s']:>13.1f} "
              f"{r['speedup_vs_reference']:>12.1f}")
    if args.out:
        import jax
        doc = dict(graph=graph.name, ops=graph.num_ops, edges=graph.num_edges,
                   machine=machine_name, devices=d, reference_placements_per_s=ref_rate,
                   rows=rows, host=platform.node(), cpu_count=os.cpu_count(),
                   jax=jax.__version__, platform=jax.default_backend())
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=1)


if __name__ == "__main__":
    main()

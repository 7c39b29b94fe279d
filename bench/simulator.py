"""Throughput of the simulators: placements per second, batched vs reference.

    python bench/simulator.py [--models resnet50,nmt_4layer | --graph g.json |
                               --synthetic-ops N] [--cost-model cpu_h100x4_nvlink]
                              [--batches 1,64,256,1024] [--backend jax|numba|both]
                              [--threads 1,2] [--scaling-batch 1024]
                              [--out results.json]

For each graph: the reference simulator's placements/s, then per backend (the JAX scan,
the native numba loop; both by default where numba is installed), batch size and memory
mode (exact peak memory (memory=True), the exact OOM flag only (memory="oom": peaks only
for placements that might not fit) and no memory (memory=False)) the batched
simulator's compile time (first call less a steady call; for numba, loading its cached
machine code unless the cache was cold), steady call time, CPU time per placement
(all threads: steadier than wall time on a loaded machine),
placements/s, ratio to the reference and memory use (peak resident set size during the
row, above what the process held before it, and in all). Placements are uniformly
random (``--batches ''`` runs none of these rows).

Scaling with cores (the numba backend, where installed): for one batch of
``--scaling-batch`` placements and memory="oom" and memory=False, the native
simulator's placements/s on each thread count of ``--threads`` (calls on the counts
taken in turn, the best of ``--repeats`` rounds each), the speedup over the first count
and the scaling efficiency ``speedup / (threads / first count)``, CPU time per
placement, and whether every count gave the first count's results bit for bit and a few
rows the reference's step times (``scaling`` in the JSON; ``--threads ''`` skips it).

Prints a table and writes JSON (``--out``, by default
``bench/results/simulator_<date>_<host>.json``). Quote figures with the machine they
ran on and the load average (printed and saved).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import threading
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


def load_graphs(args):
    if args.graph:
        from simplace.graph import OpGraph
        return [OpGraph.load(args.graph)]
    if args.synthetic_ops:
        return [_layered_dag(args.synthetic_ops)]
    try:
        from simplace import zoo
        from simplace.trace import trace
    except ImportError as err:
        sys.exit(f"cannot trace {args.models} ({err}); use --graph or --synthetic-ops")
    graphs = []
    for name in args.models.split(","):
        fn, ex = zoo.get(name, training=True, batch=args.batch)
        graphs.append(trace(fn, *ex, name=name))
    return graphs


def load_machine(name: str, graph, d: int = 5):
    try:
        from simplace.cost_model import CostModel
    except ImportError:
        CostModel = None
    if CostModel is not None:
        try:
            return CostModel.load(name), name
        except Exception as err:  # noqa: BLE001 - any failure: a synthetic machine
            print(f"cost model {name} not loaded ({err}); using a synthetic machine")
            return CostModel.synthetic(d), f"synthetic({d})"
    from simplace.sim.inputs import make_sim_inputs
    rng = np.random.default_rng(0)
    return make_sim_inputs(rng.uniform(1e-5, 1e-3, (graph.num_ops, d)),
                           np.full((d, d), 1e-5), np.full((d, d), 1e10),
                           np.full(d, 16e9)), f"synthetic-inputs({d})"


def _rss_bytes() -> int:
    """The process's resident set size now (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _PeakRss:
    """Samples the resident set size every few milliseconds while in use."""

    def __enter__(self):
        self.start = self.peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _numba_version() -> str | None:
    try:
        import numba
    except ImportError:
        return None
    return numba.__version__


def _backends(args) -> list[str]:
    if args.backend == "both":
        return ["jax", "numba"] if _numba_version() else ["jax"]
    return [args.backend]


def _uptime() -> str:
    """``uptime``'s line (the load averages, as quoted with figures)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True,
                              timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _git_commit() -> str:
    """The commit the bench ran at ("+dirty" with uncommitted changes to simplace/sim)."""
    here = pathlib.Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here,
                              capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "../simplace/sim"],
                               cwd=here, capture_output=True, text=True,
                               timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("+dirty" if dirty else "")


def bench_graph(graph, args, rng):
    from simplace.sim import batched_simulator, lower_bound, sim_inputs, simulate

    machine, machine_name = load_machine(args.cost_model, graph)
    inp = sim_inputs(graph, machine)
    d = inp.num_devices
    print(f"\ngraph {graph.name}: {graph.num_ops} ops, {graph.num_edges} edges; machine "
          f"{machine_name}: {d} devices; lower bound {lower_bound(graph, inp):.4g} s",
          flush=True)
    t, c = time.perf_counter(), time.process_time()
    for _ in range(args.reference_runs):
        simulate(graph, inp, rng.integers(0, d, graph.num_ops))
    ref_rate = args.reference_runs / (time.perf_counter() - t)
    ref_cpu = (time.process_time() - c) / args.reference_runs

    rows = []
    print(f"reference: {ref_rate:.2f} placements/s, {ref_cpu * 1e3:.1f} ms CPU each "
          f"(load {_load()})")
    print(f"{'backend':>7} {'B':>6} {'memory':>7} {'compile s':>10} {'call s':>9} "
          f"{'placements/s':>13} {'x reference':>12} {'CPU us/pl':>10} {'chunk':>6} "
          f"{'mem MB':>8} {'RSS MB':>8}", flush=True)
    modes = (True,) if args.no_memory else (True, "oom", False)
    for backend, memory in ((k, mem) for k in _backends(args) for mem in modes):
        for b in (int(x) for x in args.batches.split(",") if x.strip()):
            p = rng.integers(0, d, (b, graph.num_ops)).astype(np.int32)
            with _PeakRss() as rss:
                f = batched_simulator(graph, inp, memory=memory, backend=backend)
                t = time.perf_counter()
                f(p)
                first = time.perf_counter() - t
                times, cpu = [], []
                # Slow rows (big graphs with exact memory) are timed once.
                for _ in range(args.repeats if first < 10 else 1):
                    t, c = time.perf_counter(), time.process_time()
                    f(p)
                    times.append(time.perf_counter() - t)
                    cpu.append(time.process_time() - c)
            best = min(times)
            row = dict(backend=backend, batch=b, memory=memory,
                       compile_s=max(0.0, first - best),
                       first_call_s=first, call_s=best, placements_per_s=b / best,
                       # CPU time (all threads) per placement: steadier than wall time
                       # on a loaded machine
                       cpu_per_placement_s=min(cpu) / b,
                       cpu_speedup_vs_reference=ref_cpu / (min(cpu) / b),
                       speedup_vs_reference=b / best / ref_rate, max_batch=f.max_batch,
                       memory_bytes=rss.peak - rss.start, peak_rss_bytes=rss.peak,
                       load_average=_load())
            rows.append(row)
            print(f"{backend:>7} {b:>6} {str(memory):>7} {row['compile_s']:>10.2f} "
                  f"{best:>9.4f} "
                  f"{b / best:>13.1f} {row['speedup_vs_reference']:>12.1f} "
                  f"{min(cpu) / b * 1e6:>10.1f} {min(b, f.max_batch):>6} "
                  f"{row['memory_bytes'] / 2**20:>8.0f} "
                  f"{rss.peak / 2**20:>8.0f}", flush=True)
            del f
    scaling = bench_scaling(graph, inp, args, rng)
    return dict(graph=graph.name, ops=graph.num_ops, edges=graph.num_edges,
                machine=machine_name, devices=d, reference_placements_per_s=ref_rate,
                reference_cpu_per_placement_s=ref_cpu,
                rows=rows, scaling=scaling)


def _same_bits(a, b) -> bool:
    """Two BatchResults equal field by field, NaN peaks included."""
    return all(np.array_equal(x, y, equal_nan=x.dtype.kind == "f")
               for x, y in zip(a, b, strict=True))


def bench_scaling(graph, inp, args, rng) -> list[dict]:
    """The native simulator's placements/s per thread count (see the module docstring)."""
    counts = [int(x) for x in args.threads.split(",") if x.strip()]
    if not counts or "numba" not in _backends(args):
        return []
    if inp.objective != "latency":
        print(f"(no scaling rows: the machine's objective is {inp.objective!r}, not the "
              f"native simulator's step time)")
        return []
    from simplace.sim import simulate
    from simplace.sim.native import NativeSimulator

    b, d = args.scaling_batch, inp.num_devices
    p = rng.integers(0, d, (b, graph.num_ops)).astype(np.int32)
    print(f"\nscaling: numba, {b} placements; load {_load()}")
    print(f"{'memory':>7} {'threads':>7} {'call s':>9} {'placements/s':>13} {'speedup':>8} "
          f"{'efficiency':>10} {'CPU us/pl':>10} {'same bits':>9}", flush=True)
    # A few rows against the reference (its step time, bit for bit).
    checked = list(range(0, b, max(1, b // 2)))[:2]
    ref_steps = [simulate(graph, inp, p[r]).step_time_s for r in checked]
    rows = []
    for memory in ("oom", False):
        sims = {t: NativeSimulator(graph, inp, memory=memory, threads=t) for t in counts}
        first = {t: sims[t](p) for t in counts}  # compiles or loads the kernel
        times = {t: [] for t in counts}
        cpu = {t: [] for t in counts}
        # Counts in turn, round after round: a burst of other work on the machine
        # lands on every count rather than on one.
        for _ in range(args.repeats):
            for t in counts:
                t0, c0 = time.perf_counter(), time.process_time()
                sims[t](p)
                times[t].append(time.perf_counter() - t0)
                cpu[t].append(time.process_time() - c0)
        base_t, base_rate = counts[0], b / min(times[counts[0]])
        for t in counts:
            rate = b / min(times[t])
            speedup = rate / base_rate
            same = _same_bits(first[t], first[base_t])
            ref_ok = all(first[t].step_time_s[r] == s
                         for r, s in zip(checked, ref_steps, strict=True))
            row = dict(backend="numba", batch=b, memory=memory, threads=t,
                       call_s=min(times[t]), placements_per_s=rate, speedup=speedup,
                       scaling_efficiency=speedup / (t / base_t),
                       cpu_per_placement_s=min(cpu[t]) / b,
                       same_bits_as_first_count=same, reference_rows_equal=ref_ok,
                       reference_rows=checked, load_average=_load())
            rows.append(row)
            print(f"{str(memory):>7} {t:>7} {row['call_s']:>9.4f} {rate:>13.1f} "
                  f"{speedup:>8.2f} {row['scaling_efficiency']:>10.2f} "
                  f"{row['cpu_per_placement_s'] * 1e6:>10.1f} "
                  f"{str(same and ref_ok):>9}", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,nmt_4layer",
                    help="comma-separated zoo models (default: resnet50,nmt_4layer)")
    ap.add_argument("--model", help="one zoo model (same as --models MODEL)")
    ap.add_argument("--batch", type=int, default=None, help="model batch size")
    ap.add_argument("--graph", help="a saved OpGraph .json instead of zoo models")
    ap.add_argument("--synthetic-ops", type=int, help="a random layered DAG of N ops")
    ap.add_argument("--cost-model", default="cpu_h100x4_nvlink")
    ap.add_argument("--batches", default="1,64,256,1024")
    ap.add_argument("--reference-runs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backend", choices=("jax", "numba", "both"), default="both",
                    help="simulator backend(s): the JAX scan, the native numba loop, or "
                         "both (default; numba only where installed)")
    ap.add_argument("--no-memory", action="store_true",
                    help="only the memory=True rows (skip the 'oom' and memory-off rows)")
    ap.add_argument("--threads", default="1,2",
                    help="thread counts of the numba scaling rows (default 1,2; '' for "
                         "none); the first is the baseline")
    ap.add_argument("--scaling-batch", type=int, default=1024,
                    help="placements per call in the scaling rows (default 1024)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random placements")
    ap.add_argument("--out", help="JSON results path (default: bench/results/"
                                  "simulator_<date>_<host>.json)")
    args = ap.parse_args(argv)
    if args.model:
        args.models = args.model

    import jax

    if args.backend == "numba" and not _numba_version():
        sys.exit("--backend numba needs numba: pip install 'simplace[fast]'")
    load0, uptime0 = _load(), _uptime()
    print(f"{uptime0}\nload average {load0}; {os.cpu_count()} cores; jax {jax.__version__}"
          f" on {jax.default_backend()}; numba {_numba_version()}")
    rng = np.random.default_rng(args.seed)
    results = [bench_graph(g, args, rng) for g in load_graphs(args)]
    out = args.out or str(pathlib.Path(__file__).parent / "results" / (
        f"simulator_{datetime.date.today().isoformat()}_{platform.node()}.json"))
    doc = dict(graphs=results, host=platform.node(), cpu_count=os.cpu_count(),
               jax=jax.__version__, numba=_numba_version(), platform=jax.default_backend(),
               load_average_start=load0, load_average_end=_load(),
               uptime_start=uptime0, uptime_end=_uptime(), git_commit=_git_commit(),
               command=shlex.join(sys.argv))
    pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"\nload average {_load()}; wrote {out}")


if __name__ == "__main__":
    main()

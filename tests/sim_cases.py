"""Graphs and machines for simulator and placer tests: random DAGs of many shapes and
the named corner cases. Byte sizes are whole numbers (as real tensors' are), so sums of
them are exact in float64 and the two simulators can be compared to 1e-9."""

from __future__ import annotations

import numpy as np

from simplace.graph import OpGraph
from simplace.sim.inputs import SimInputs, make_sim_inputs

SHAPES = ("chain", "fan", "layered", "multi_output", "random", "params")


def make_graph(src, dst, *, m, edge_bytes=None, edge_output=None, out_bytes=None,
               is_output=None, params=None, name="") -> OpGraph:
    """An OpGraph from edges; ``params`` is ``(sizes, [(op, param), ...])``."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    e = len(src)
    eb = np.full(e, 1000.0) if edge_bytes is None else np.asarray(edge_bytes, float)
    ob = np.full(m, 1000.0) if out_bytes is None else np.asarray(out_bytes, float)
    sizes, uses = params if params is not None else ([], [])
    uses = np.asarray(uses, dtype=np.int64).reshape(-1, 2)
    return OpGraph(
        op=["op"] * m, name_path=[f"n{i}" for i in range(m)], flops=np.ones(m),
        bytes_accessed=np.ones(m), out_bytes=ob, signature=["sig"] * m, src=src, dst=dst,
        edge_bytes=eb, edge_output=edge_output, is_output=is_output,
        param_names=[f"p{j}" for j in range(len(sizes))], param_sizes=sizes,
        param_op=uses[:, 0], param_index=uses[:, 1], name=name)


def random_graph(rng: np.random.Generator, shape: str, m: int) -> OpGraph:
    """A random DAG of ``m`` ops (ops in topological order) of the given shape."""
    edges: set[tuple[int, int]] = set()
    if shape == "chain":
        edges = {(i, i + 1) for i in range(m - 1)}
    elif shape == "fan":  # one root fanning out to many, fanning back in to a sink
        mid = range(1, max(1, m - 1))
        edges = {(0, i) for i in mid} | {(i, m - 1) for i in mid if m - 1 > i}
        edges |= {(i, i + 1) for i in mid if i + 1 < m - 1 and rng.random() < 0.2}
    elif shape == "layered":
        width = int(rng.integers(1, 6))
        layers = [list(range(i, min(m, i + width))) for i in range(0, m, width)]
        for a, b in zip(layers, layers[1:], strict=False):
            for j in b:
                for i in rng.choice(a, size=int(rng.integers(1, len(a) + 1)), replace=False):
                    edges.add((int(i), j))
    else:  # random, multi_output, params: random edges to a few earlier ops
        for j in range(1, m):
            for i in rng.integers(max(0, j - 8), j, size=int(rng.integers(0, 4))):
                edges.add((int(i), j))
    src = dst = np.zeros(0, np.int64)
    if edges:
        pairs = np.array(sorted(edges), dtype=np.int64)
        src, dst = pairs[:, 0], pairs[:, 1]
    e = len(src)
    edge_bytes = rng.integers(0, 5000, e).astype(float)
    edge_bytes[rng.random(e) < 0.1] = 0.0  # zero-byte tensors
    edge_output = np.zeros(e, dtype=np.int64)
    if shape == "multi_output" and e:
        edge_output = rng.integers(0, 3, e)
        # Add edges re-using a tensor: another consumer of the same (src, output).
        extra = []
        for k in range(e):
            j = int(dst[k]) + 1 + int(rng.integers(0, 3))
            if j < m and rng.random() < 0.3 and (src[k], j) not in edges:
                edges.add((int(src[k]), j))
                extra.append((src[k], j, edge_output[k], edge_bytes[k]))
        if extra:
            x = np.array(extra, dtype=float)
            src = np.concatenate([src, x[:, 0].astype(np.int64)])
            dst = np.concatenate([dst, x[:, 1].astype(np.int64)])
            edge_output = np.concatenate([edge_output, x[:, 2].astype(np.int64)])
            edge_bytes = np.concatenate([edge_bytes, x[:, 3]])
    out_bytes = rng.integers(0, 8000, m).astype(float)
    is_output = rng.random(m) < 0.1
    params = None
    if shape == "params" or rng.random() < 0.5:
        n_par = int(rng.integers(1, 6))
        sizes = rng.integers(1, 20000, n_par).astype(float)
        uses = {(int(rng.integers(0, m)), int(rng.integers(0, n_par)))
                for _ in range(int(rng.integers(1, 2 * n_par + 2)))}
        params = (sizes, sorted(uses))
    return make_graph(src, dst, m=m, edge_bytes=edge_bytes, edge_output=edge_output,
                      out_bytes=out_bytes, is_output=is_output, params=params,
                      name=f"{shape}{m}")


def random_inputs(rng: np.random.Generator, m: int, d: int, *, exclusive: bool = False,
                  integer_times: bool = False, memory_bytes: float = 1e12,
                  host_costs: bool = False, link_classes: int | None = None) -> SimInputs:
    """A random machine for an ``m``-op graph with ``d`` devices.

    ``exclusive``: some devices share an exclusive group. ``integer_times``: whole-number
    op times and latencies, with some zero op times, so that ties are everywhere.
    ``host_costs``: random segment launch, dispatch, device_put, per-op launch and
    unfused costs too (each sometimes all zeros), and links whose put holds the host
    (``put_waits``: between devices of two random "clients", sometimes none); otherwise
    they are zeros and every put is asynchronous.
    ``link_classes``: the links take only that many distinct (latency, bandwidth, put)
    triples (as on real machines, whose links are of one or two kinds).
    """
    if integer_times:
        t = rng.integers(0, 4, (m, d)).astype(float)
        lat = rng.integers(0, 3, (d, d)).astype(float)
        bw = rng.choice([1000.0, 2000.0, 4000.0], (d, d))
    else:
        t = rng.uniform(1e-4, 1e-2, (m, d))
        lat = rng.uniform(1e-6, 1e-4, (d, d))
        bw = rng.uniform(1e6, 1e8, (d, d))
    group = np.arange(d)
    if exclusive and d > 1:
        group = rng.integers(0, max(1, d - 1), d)
    host = {}
    if host_costs:
        def costs(shape, scale, p_zero=0.25):
            v = (rng.integers(0, 3, shape).astype(float) if integer_times
                 else rng.uniform(0, scale, shape))
            return v * (rng.random() >= p_zero)

        host = dict(launch_s=costs(d, 1e-3), dispatch_s=costs(d, 1e-3),
                    put_s=costs((d, d), 1e-3), op_unfused_s=costs((m, d), 1e-3, 0.5))
        # A pool launch for segments whose ops' pool work (flops, say) reaches a
        # minimum: some devices never, the others from 1 to 4 units (a whole number,
        # so that sums of whole-number work cross it exactly).
        host.update(op_pool_work=rng.integers(0, 3, (m, d)).astype(float),
                    pool_min_work=np.where(rng.random(d) < 0.25, np.inf,
                                           rng.integers(1, 5, d).astype(float)),
                    pool_launch_s=costs(d, 1e-3, 0.4))
        client = rng.integers(0, 2, d) * (rng.random() >= 0.3)
        host["put_waits"] = client[:, None] != client[None, :]
    if link_classes is not None:
        kind = rng.integers(0, link_classes, (d, d))
        put = host.get("put_s", np.zeros((d, d)))
        lat, bw, put = (x.reshape(-1)[:link_classes][kind] for x in (lat, bw, put))
        if "put_s" in host:
            host["put_s"] = put
            host["put_waits"] = rng.random(link_classes)[kind] < 0.5
    return make_sim_inputs(t, lat, bw, np.full(d, float(memory_bytes)), group, **host)


def random_case(rng: np.random.Generator, *, max_ops: int = 40, max_devices: int = 5,
                host_costs: bool = False):
    """(graph, inputs) of a random shape, size and machine."""
    shape = SHAPES[int(rng.integers(0, len(SHAPES)))]
    m = int(rng.integers(1, max_ops + 1))
    d = int(rng.integers(1, max_devices + 1))
    g = random_graph(rng, shape, m)
    inp = random_inputs(rng, m, d, exclusive=bool(rng.random() < 0.4),
                        integer_times=bool(rng.random() < 0.3), host_costs=host_costs)
    return g, inp


def union_graph(graphs, name="") -> OpGraph:
    """The disjoint union of graphs (ops, edges and parameters of each in turn)."""
    src, dst, eb, eo, ob, out, sizes, uses = [], [], [], [], [], [], [], []
    m = n_par = 0
    for g in graphs:
        src.append(g.src + m)
        dst.append(g.dst + m)
        eb.append(g.edge_bytes)
        eo.append(g.edge_output)
        ob.append(g.out_bytes)
        out.append(g.is_output)
        sizes.append(g.param_sizes)
        uses.append(np.stack([g.param_op + m, g.param_index + n_par], axis=1))
        m += g.num_ops
        n_par += g.num_params
    cat = np.concatenate
    return make_graph(cat(src), cat(dst), m=m, edge_bytes=cat(eb), edge_output=cat(eo),
                      out_bytes=cat(ob), is_output=cat(out),
                      params=(cat(sizes), cat(uses).tolist()), name=name)


def long_run_placements(rng: np.random.Generator, b: int, m: int, d: int) -> np.ndarray:
    """``b`` placements made of long runs (8 to 60 ops) on one device, with a few ops
    elsewhere: segments much longer than the batched simulator's fill window."""
    p = np.zeros((b, m), np.int32)
    for row in p:
        i = 0
        while i < m:
            n = int(rng.integers(8, 61))
            row[i:i + n] = rng.integers(0, d)
            i += n
        stray = rng.random(m) < 0.03
        row[stray] = rng.integers(0, d, int(stray.sum()))
    return p


def random_placements(rng: np.random.Generator, b: int, m: int, d: int) -> np.ndarray:
    """``b`` placements: random ones, plus all-on-one-device and blocky ones."""
    p = rng.integers(0, d, (b, m)).astype(np.int32)
    for k in range(min(b, d)):
        p[k] = k  # everything on device k
    if b > d and m:
        cut = np.sort(rng.integers(0, m, d - 1)) if d > 1 else np.zeros(0, int)
        p[d] = np.searchsorted(cut, np.arange(m), side="right") % d
    return p


def simple_inputs(m: int, d: int, *, op_time: float = 1.0, latency: float = 0.5,
                  bandwidth: float = 100.0, memory_bytes: float = 1e12,
                  group=None) -> SimInputs:
    """Uniform machine: every op takes ``op_time`` everywhere, every link the same."""
    return make_sim_inputs(np.full((m, d), op_time), np.full((d, d), latency),
                           np.full((d, d), bandwidth), np.full(d, memory_bytes), group)


# Named corner cases: name -> (graph, inputs)
def corner_cases() -> dict[str, tuple[OpGraph, SimInputs]]:
    cases = {}
    cases["empty"] = (make_graph([], [], m=0), simple_inputs(0, 2))
    cases["one_op"] = (make_graph([], [], m=1), simple_inputs(1, 3))
    cases["no_edges"] = (make_graph([], [], m=6), simple_inputs(6, 3))
    g = random_graph(np.random.default_rng(1), "random", 12)
    cases["one_device"] = (g, simple_inputs(12, 1))
    cases["zero_byte_tensors"] = (
        make_graph([0, 1], [1, 2], m=3, edge_bytes=[0.0, 0.0]), simple_inputs(3, 2))
    cases["fits_nowhere"] = (
        make_graph([0], [1], m=2, params=([5e9], [(1, 0)])),
        simple_inputs(2, 2, memory_bytes=1e9))
    return cases


def binade_span_case():
    """(graph, inputs, placements int[8, 8]): a chain-like graph on 3 devices in one
    exclusive group whose op times span from 1e-300 s to 1 s, so that event times span
    nearly every binade (the placements' peak sweeps must still be exact); the first
    placement alternates devices."""
    m = 8
    rng = np.random.default_rng(13)
    g = make_graph([0, 1, 2, 3, 4, 5], [2, 3, 4, 5, 6, 7], m=m,
                   out_bytes=rng.integers(1, 9, m) * 1000.0)
    t = np.ones((m, 3))
    t[0] = 1e-300
    inp = make_sim_inputs(t, np.full((3, 3), 0.5), np.full((3, 3), 1000.0), np.full(3, 1e9),
                          [0, 0, 0])
    p = np.concatenate([[[0, 1, 0, 1, 2, 2, 0, 1]], random_placements(rng, 7, m, 3)])
    return g, inp, p

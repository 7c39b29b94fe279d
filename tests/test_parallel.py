"""PaSE (simplace.parallel): search exactness, vertex ordering, costs, baselines, errors."""

import argparse
import itertools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import pytest

from simplace import CostModel, OpGraph, SimplaceError, trace, zoo
from simplace.parallel import (
    ParallelizeError,
    SearchTooLargeError,
    build_layer_graph,
    parallelize,
)
from simplace.parallel import cli as parallel_cli
from simplace.parallel.configs import enumerate_configs
from simplace.parallel.costs import Machine, edge_cost, layer_cost
from simplace.parallel.layers import align
from simplace.parallel.search import brute_force, solve, total_cost, vertex_order
from simplace.parallel.strategy import _cost_tables

CM = "haswell_k40x4"


@pytest.fixture(scope="module")
def cost_model():
    return CostModel.load(CM)


# ----------------------------------------------------------------------------- search
def _random_problem(rng, n, p_edge):
    sizes = rng.integers(1, 5, n)
    unary = [rng.random(s) for s in sizes]
    pair = {}
    for u, v in itertools.combinations(range(n), 2):
        if rng.random() < p_edge:
            if rng.random() < 0.5:
                u, v = v, u  # keys in both orientations
            pair[(u, v)] = rng.random((sizes[u], sizes[v]))
    return unary, pair


@pytest.mark.parametrize("seed", range(12))
def test_dp_equals_brute_force_on_random_graphs(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    unary, pair = _random_problem(rng, n, p_edge=[0.2, 0.5, 0.9][seed % 3])
    choice, cost, _ = solve(unary, pair)
    bf_choice, bf_cost = brute_force(unary, pair)
    assert cost == pytest.approx(bf_cost, rel=1e-12, abs=1e-12)
    # the returned assignment really has the optimal cost
    assert total_cost(choice, unary, pair) == pytest.approx(bf_cost, rel=1e-12, abs=1e-12)


def test_dp_handles_parallel_edges_and_both_orientations():
    rng = np.random.default_rng(7)
    unary = [rng.random(3), rng.random(2), rng.random(4)]
    pair = {(0, 1): rng.random((3, 2)), (1, 0): rng.random((2, 3)), (2, 1): rng.random((4, 2))}
    assert solve(unary, pair)[1] == pytest.approx(brute_force(unary, pair)[1])


def _tiny_mlp_graph(training: bool):
    class Tiny(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.relu(nn.Dense(8, name="fc1")(x))
            return nn.Dense(4, name="fc2")(h)

    model = Tiny()
    x = jnp.ones((4, 8))
    variables = model.init(jax.random.key(0), x)

    def infer(v, x):
        with nn.override_named_call(True):
            return model.apply(v, x)

    def step(v, x):
        return jax.grad(lambda v: (infer(v, x) ** 2).sum())(v)

    return trace(step if training else infer, variables, x)


@pytest.mark.parametrize("training", [False, True])
def test_dp_equals_brute_force_on_a_tiny_layer_graph(cost_model, training):
    graph = _tiny_mlp_graph(training)
    st = parallelize(graph, cost_model, 4, exact=False)
    lg = st.layer_graph
    assert [lay.kind for lay in lg.layers if lay.kind == "matmul"] == ["matmul"] * 2
    machine = Machine.from_cost_model(cost_model, 4)
    configs = [enumerate_configs(lay.dim_sizes, lay.splittable, 4, exact=False)
               for lay in lg.layers]
    unary, pair = _cost_tables(lg, configs, machine)
    assert math.prod(len(c) for c in configs) <= 2_000_000
    _, best = brute_force(unary, pair)
    choice, dp, _ = solve(unary, pair)
    assert dp == pytest.approx(best, rel=1e-12)
    # parallelize's step time is the optimum (plus ops no layer owns)
    assert st.step_time_s == pytest.approx(best + lg.unattributed_time_s, rel=1e-9)


# ----------------------------------------------------------------------------- ordering
def _neighbours(g: nx.Graph):
    return [set(g.neighbors(v)) for v in range(g.number_of_nodes())]


@pytest.mark.parametrize("n", [1, 2, 5, 30])
def test_ordering_on_chains_keeps_dependent_sets_at_one(n):
    plan = vertex_order(_neighbours(nx.path_graph(n)))
    assert sorted(plan.order) == list(range(n))
    assert plan.max_dependent == min(1, n - 1)


@pytest.mark.parametrize("seed", range(5))
def test_ordering_on_trees_keeps_dependent_sets_at_one(seed):
    tree = nx.random_labeled_tree(25, seed=seed)
    plan = vertex_order(_neighbours(tree))
    assert plan.max_dependent == 1
    # a vertex is eliminated only once it is a leaf of what remains
    assert all(len(d) <= 1 for d in plan.dependent)


def test_ordering_on_cycles_grids_and_cliques():
    assert vertex_order(_neighbours(nx.cycle_graph(12))).max_dependent == 2
    # a 3 x n grid has treewidth 3; min-dependent-set ordering stays within it
    grid = nx.convert_node_labels_to_integers(nx.grid_2d_graph(3, 8))
    assert vertex_order(_neighbours(grid)).max_dependent <= 3
    assert vertex_order(_neighbours(nx.complete_graph(6))).max_dependent == 5


def test_real_layer_graphs_have_small_dependent_sets(cost_model):
    fn, ex = zoo.get("alexnet", small=True)
    st = parallelize(trace(fn, *ex), cost_model, 4)
    assert st.info["max_dependent_set"] == 1  # AlexNet's layer graph is a tree
    fn, ex = zoo.get("transformer", small=True)
    st = parallelize(trace(fn, *ex), cost_model, 4)
    assert 2 <= st.info["max_dependent_set"] <= 4  # residuals and encoder memory


def test_too_large_a_table_is_an_error_not_an_approximation(cost_model):
    fn, ex = zoo.get("transformer", small=True)
    graph = trace(fn, *ex)
    with pytest.raises(SearchTooLargeError, match="max_table_entries"):
        parallelize(graph, cost_model, 8, max_table_entries=10)


# ----------------------------------------------------------------------------- configs
def test_configs_products_and_cut_off():
    c = enumerate_configs((32, 64, 16), (True, True, True), 8, exact=True)
    assert (c.prod(axis=1) == 8).all() and len(c) == 10  # 3 factors of 2^3: C(5, 2)
    c = enumerate_configs((32, 64, 16), (True, True, True), 8, exact=False)
    assert (c.prod(axis=1) <= 8).all() and len(c) == 20
    assert [1, 1, 1] in c.tolist()
    c = enumerate_configs((32, 64, 16), (True, True, False), 8, exact=False,
                          min_part_elements=16)
    assert (c[:, 2] == 1).all()
    assert (np.ceil(np.array([32, 64]) / c[:, :2]) >= 16).all()
    assert c[:, 0].max() == 2  # 32 / 4 = 8 < 16 elements: dropped
    # a dimension smaller than p cannot take every device
    c = enumerate_configs((2,), (True,), 8, exact=True)
    assert c.tolist() == [[2]]


def test_align_maps_reshapes_by_major_axis():
    assert align((4, 8, 16), (4, 8, 2, 8), (0, 2, 1, 3)) == (0, 2, 1)
    assert align((4, 72), (4, 3, 3, 8), (0, 2, 3, 1)) == (0, 2)
    assert align((4, 16), (4, 8, 16), (0, 1, 2)) == (0, 2)


# ----------------------------------------------------------------------------- costs
def test_layer_costs_follow_the_split(cost_model):
    graph = _tiny_mlp_graph(True)
    lg = build_layer_graph(graph, cost_model, 1)
    machine = Machine.from_cost_model(cost_model, 4)
    # fc2: its input comes from another layer, so its gradient is an edge too
    fc2 = next(lay for lay in lg.layers if lay.name.endswith("fc2"))
    # Per-op overhead that no split removes: fc2's dot_general, and in the backward pass
    # its reduce_sum, transpose and two dot_generals, 5 us each on a K40; its bias add
    # (elementwise) fuses into a neighbour (no overhead of its own), reshapes are views.
    assert fc2.overhead_s == pytest.approx(5 * 5e-6)
    assert fc2.time_s > fc2.overhead_s
    b, n, k = (fc2.dim(x) for x in "bnk")
    cfgs = np.ones((4, 3), dtype=np.int64)
    cfgs[1, b] = 4  # data parallel: weight-gradient all-reduce
    cfgs[2, k] = 4  # split reduction: forward all-reduce of partial sums
    cfgs[3, n] = 4  # split outputs: backward all-reduce of the input gradient
    comp, comm = layer_cost(fc2, cfgs, machine, training=True, detail=True)
    assert comm[0] == 0 and (comm[1:] > 0).all()
    assert (comp[1:] < comp[0]).all()
    _, comm_inf = layer_cost(fc2, cfgs, machine, training=False, detail=True)
    assert comm_inf[1] == 0 and comm_inf[2] > 0 and comm_inf[3] == 0


def test_redistribution_is_free_only_between_matching_layouts(cost_model):
    graph = _tiny_mlp_graph(False)
    lg = build_layer_graph(graph, cost_model, 1)
    machine = Machine.from_cost_model(cost_model, 4)
    edge = next(e for e in lg.edges if lg.layers[e[0]].kind == "matmul")
    src, dst = lg.layers[edge[0]], lg.layers[edge[1]]
    cs = np.ones((2, len(src.dim_sizes)), dtype=np.int64)
    cd = np.ones((2, len(dst.dim_sizes)), dtype=np.int64)
    cs[1, src.batch_dim] = 4
    cd[1, dst.batch_dim] = 4
    m = edge_cost(lg.layers, edge, cs, cd, machine, training=False)
    assert m[0, 0] == 0 and m[1, 1] == 0  # same layout
    assert m[1, 0] > 0  # batch-split producer, replicated consumer: gather 3/4
    assert m[0, 1] == 0  # replicated producer: every device holds what it needs


def test_machine_uses_the_fastest_accelerator_for_any_p(cost_model):
    m = Machine.from_cost_model(cost_model, 64)
    assert cost_model.devices[m.device_index].kind == "gpu"
    assert m.devices == 64 and m.bandwidth_bytes_per_s > 0


# ----------------------------------------------------------------------------- methods
@pytest.mark.parametrize("name", ["alexnet", "transformer", "rnnlm"])
def test_pase_never_loses_to_its_baselines(cost_model, name):
    fn, ex = zoo.get(name, small=True, batch=8)
    graph = trace(fn, *ex)
    st = parallelize(graph, cost_model, 4)
    for method in ("data_parallel", "expert"):
        other = parallelize(graph, cost_model, 4, method=method)
        assert other.step_time_s == pytest.approx(st.baselines_s[method], rel=1e-9)
        assert st.step_time_s <= other.step_time_s * (1 + 1e-9)
    assert len(st.layers) == len(st.layer_graph.layers)


def test_baselines_split_as_documented(cost_model):
    fn, ex = zoo.get("transformer", small=True, batch=8)
    graph = trace(fn, *ex)
    dp = parallelize(graph, cost_model, 4, method="data_parallel")
    for lp in dp.layers:
        if "b" in lp.splits:
            assert lp.splits["b"] == 4
            assert all(f == 1 for d, f in lp.splits.items() if d != "b")
    ex_st = parallelize(graph, cost_model, 4, method="expert")
    # 2 heads: tensor parallelism of degree 2, data parallelism of degree 2
    att = [lp for lp in ex_st.layers if lp.kind == "attention"]
    assert att and all(lp.splits["h"] == 2 and lp.splits["b"] == 2 for lp in att)
    q = next(lp for lp in ex_st.layers if lp.name.endswith("self_attention/query"))
    out = next(lp for lp in ex_st.layers if lp.name.endswith("self_attention/out"))
    assert q.splits["n"] == 2 and out.splits["k"] == 2


def test_unsupported_layers_are_replicated_and_named(cost_model):
    class Sorter(nn.Module):
        @nn.compact
        def __call__(self, x):
            return jnp.sort(x, axis=-1)

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Dense(8, name="fc1")(x)
            x = Sorter(name="sorter")(x)
            return nn.Dense(4, name="fc2")(x)

    model = Net()
    x = jnp.ones((8, 8))
    variables = model.init(jax.random.key(0), x)

    def f(v, x):
        with nn.override_named_call(True):
            return model.apply(v, x).sum()

    graph = trace(f, variables, x)
    with pytest.warns(UserWarning, match="Net/sorter"):
        st = parallelize(graph, cost_model, 4)
    assert st.unsupported == ("Net/sorter",)
    sorter = next(lp for lp in st.layers if lp.name == "Net/sorter")
    assert sorter.kind == "unsupported" and sorter.devices_used == 1
    assert any(lp.devices_used == 4 for lp in st.layers if lp.kind == "matmul")


# ----------------------------------------------------------------------------- errors
def test_bad_input_is_a_clear_error(cost_model):
    graph = _tiny_mlp_graph(False)
    with pytest.raises(ParallelizeError, match="Unknown parallelization method 'magic'"):
        parallelize(graph, cost_model, 4, method="magic")
    with pytest.raises(SimplaceError, match="devices must be an integer >= 1"):
        parallelize(graph, cost_model, 0)
    with pytest.raises(ParallelizeError, match="min_part_elements"):
        parallelize(graph, cost_model, 4, min_part_elements=0)
    empty = OpGraph(op=[], name_path=[], flops=[], bytes_accessed=[], out_bytes=[],
                    signature=[], src=[], dst=[], edge_bytes=[])
    with pytest.raises(ParallelizeError, match="no forward ops"):
        parallelize(empty, cost_model, 4)
    with pytest.raises(ParallelizeError, match="OpGraph"):
        parallelize("not a graph", cost_model, 4)


def test_single_device_is_the_unsplit_graph(cost_model):
    graph = _tiny_mlp_graph(True)
    st = parallelize(graph, cost_model, 1)
    assert all(lp.devices_used == 1 and lp.comm_s == 0 for lp in st.layers)
    assert st.redistribution_s == 0
    assert st.step_time_s == pytest.approx(sum(lay.time_s for lay in st.layer_graph.layers)
                                           + st.layer_graph.unattributed_time_s)


def test_deterministic(cost_model):
    fn, ex = zoo.get("transformer", small=True, batch=8)
    graph = trace(fn, *ex)
    a = parallelize(graph, cost_model, 8)
    b = parallelize(graph, cost_model, 8)
    assert [lp.splits for lp in a.layers] == [lp.splits for lp in b.layers]
    assert a.step_time_s == b.step_time_s


# ----------------------------------------------------------------------------- CLI
def test_cli_prints_the_strategy_and_comparison(capsys, tmp_path):
    ap = argparse.ArgumentParser()
    parallel_cli.add_parser(ap.add_subparsers(dest="command"))
    out_file = tmp_path / "s.json"
    args = ap.parse_args(["parallelize", "alexnet", "--cost-model", CM, "--devices", "8",
                          "--small", "--out", str(out_file)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "AlexNet/fc6" in out and "speedup over data parallelism" in out
    assert "data_parallel" in out and "expert" in out and "search" in out
    import json

    saved = json.loads(out_file.read_text())
    assert saved["devices"] == 8 and saved["layers"][0]["name"] == "AlexNet/conv1"

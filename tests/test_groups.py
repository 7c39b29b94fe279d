import networkx as nx
import numpy as np
import pytest

from simplace import GroupingError, OpGraph
from simplace import groups as G


def random_dag(seed: int, n: int = 30, p: float = 0.15, free_frac: float = 0.3) -> OpGraph:
    """A random DAG with some no-work ops, multi-output producers and shared params."""
    rng = np.random.default_rng(seed)
    src, dst, out = [], [], []
    for j in range(1, n):
        for i in range(j):
            if rng.random() < p:
                src.append(i)
                dst.append(j)
                out.append(int(rng.integers(0, 2)))
    flops = rng.uniform(1, 100, n) * (rng.random(n) > free_frac)
    paths = [f"M/layer{i % 4}/op" if i < n // 2 else f"backward/M/layer{i % 4}/op"
             for i in range(n)]
    return OpGraph(
        op=["free" if f == 0 else "dot" for f in flops], name_path=paths, flops=flops,
        bytes_accessed=rng.uniform(0, 10, n), out_bytes=rng.uniform(0, 10, n),
        signature=[f"s{i}" for i in range(n)], src=src, dst=dst,
        edge_bytes=rng.uniform(0, 10, len(src)), edge_output=out,
        param_names=["w0", "w1"], param_sizes=[5.0, 7.0], param_op=[0, n - 1, 1],
        param_index=[0, 0, 1],
    )


def assert_quotient_acyclic(g: OpGraph, groups: np.ndarray):
    q = nx.DiGraph()
    q.add_nodes_from(set(groups.tolist()))
    for s, d in zip(g.src, g.dst, strict=True):
        if groups[s] != groups[d]:
            q.add_edge(int(groups[s]), int(groups[d]))
    assert nx.is_directed_acyclic_graph(q)


@pytest.mark.parametrize("seed", range(40))
def test_acyclic_rules_keep_quotient_acyclic_and_preserve_cost(seed):
    g = random_dag(seed, n=int(10 + seed % 25), p=0.05 + 0.02 * (seed % 7))
    rules = [
        G.chain_collapse(g),
        G.colocate_free_ops(g),
        G.chain_collapse(g, G.colocate_free_ops(g)),
        G.target_count(g, 4, G.chain_collapse(g, G.colocate_free_ops(g))),
        G.target_count(g, 3),
    ]
    for groups in rules:
        assert_quotient_acyclic(g, groups)
        q = G.coarsen(g, groups)
        assert q.num_ops == groups.max() + 1
        np.testing.assert_allclose(q.flops.sum(), g.flops.sum())
        np.testing.assert_allclose(q.bytes_accessed.sum(), g.bytes_accessed.sum())
        # Parameters keep their sizes; each group reads a parameter at most once.
        np.testing.assert_array_equal(q.param_sizes, g.param_sizes)
        # A quotient placement expands back to the ops it stands for.
        qp = np.arange(q.num_ops) % 3
        op_p = G.expand(np.asarray(q.meta["op_to_group"]), qp)
        assert all(op_p[i] == qp[q.meta["op_to_group"][i]] for i in range(g.num_ops))


def test_normalize_and_expand():
    np.testing.assert_array_equal(G.normalize([5, 5, 2, 9, 2]), [0, 0, 1, 2, 1])
    np.testing.assert_array_equal(G.expand([0, 0, 1, 2, 1], [3, 1, 0]), [3, 3, 1, 0, 1])
    with pytest.raises(GroupingError, match="one device per group"):
        G.expand([0, 1, 2], [0, 1])


def chain_graph() -> OpGraph:
    #   0 -> 1 -> 2 -> 4
    #   0 -> 3 -> 4          (1 and 3 have one predecessor each; 4 has two)
    return OpGraph(op=["a"] * 5, name_path=[""] * 5, flops=[1.0] * 5,
                   bytes_accessed=[0.0] * 5, out_bytes=[0.0] * 5, signature=["a"] * 5,
                   src=[0, 1, 2, 0, 3], dst=[1, 2, 4, 3, 4], edge_bytes=[1.0] * 5)


def test_chain_collapse_merges_single_predecessor_successors():
    groups = G.chain_collapse(chain_graph())
    # 1, 2 and 3 each have a single predecessor, so they join it; 4 has two.
    np.testing.assert_array_equal(groups, [0, 0, 0, 0, 1])


def test_rules_are_computed_once_per_graph_and_answer_alike(monkeypatch):
    g = chain_graph()
    first = G.chain_collapse(g, G.colocate_free_ops(g))
    first[:] = 7  # a caller's changes to its copy do not reach the next caller
    calls = []
    monkeypatch.setattr(G, "_chain_collapse",
                        lambda *a: calls.append(a) or np.zeros(5, np.int32))
    again = G.chain_collapse(g, G.colocate_free_ops(g))
    np.testing.assert_array_equal(again, [0, 0, 0, 0, 1])
    assert not calls  # from the graph's memo
    G.chain_collapse(g, [0, 0, 1, 1, 2])  # another grouping is another question
    G.chain_collapse(chain_graph())  # and another graph
    assert len(calls) == 2


def test_colocate_free_ops_joins_producer_or_earliest_consumer():
    # 0: iota (no work, no producer) feeding 2 and 3; 1: work; 2: reshape of 1 (one
    # producer); 3: add(1, 0); 4: convert of 2 and 3 (two producers, stays alone).
    g = OpGraph(op=["iota", "dot", "reshape", "add", "convert"], name_path=[""] * 5,
                flops=[0.0, 5.0, 0.0, 1.0, 0.0], bytes_accessed=[0.0] * 5,
                out_bytes=[0.0] * 5, signature=list("abcde"),
                src=[0, 0, 1, 1, 2, 3], dst=[2, 3, 2, 3, 4, 4], edge_bytes=[1.0] * 6)
    groups = G.colocate_free_ops(g)
    # reshape (2) has two producers (iota and dot) -> stays; iota joins earliest consumer 2.
    assert groups[0] == groups[2]
    assert len(set(groups.tolist())) == 4
    assert_quotient_acyclic(g, groups)


def test_by_module_and_gradient_colocation():
    paths = ["M/a/x", "M/a/y", "M/b/x", "backward/M/b/x", "backward/M/a/y", ""]
    g = OpGraph(op=["a"] * 6, name_path=paths, flops=[1.0] * 6, bytes_accessed=[0.0] * 6,
                out_bytes=[0.0] * 6, signature=["a"] * 6, src=[0, 1, 2, 3, 4],
                dst=[1, 2, 3, 4, 5], edge_bytes=[1.0] * 5)
    by2 = G.by_module(g, 2)
    assert by2[0] == by2[1] != by2[2]
    assert by2[3] != by2[2]  # backward ops apart by default
    joined = G.by_module(g, 2, join_backward=True)
    assert joined[3] == joined[2] and joined[4] == joined[0]
    grads = G.colocate_gradients(g)
    assert grads[3] == grads[2] and grads[4] == grads[1] and len(set(grads.tolist())) == 4
    # Forward a -> forward b -> backward b -> backward a: joining makes a cycle.
    with pytest.raises(GroupingError, match="cycle"):
        G.coarsen(g, joined)


def test_target_count_balances_weight_in_topological_ranges():
    g = chain_graph()
    groups = G.target_count(g, 2, weights=[1, 1, 1, 1, 1])
    assert groups.max() == 1
    assert_quotient_acyclic(g, groups)
    assert G.target_count(g, 10).max() == 4  # never more groups than ops
    with pytest.raises(GroupingError):
        G.target_count(g, 0)


def test_bad_grouping_lengths():
    with pytest.raises(GroupingError, match="one group id per op"):
        G.coarsen(chain_graph(), [0, 1])


def test_coarsen_dedupes_tensors_and_keeps_outputs():
    # op 0 produces one tensor consumed by 1 and 2; grouping {0}, {1, 2}: one edge crosses.
    g = OpGraph(op=["a"] * 3, name_path=["A/x", "B/y", "B/z"], flops=[1.0, 2.0, 3.0],
                bytes_accessed=[1.0] * 3, out_bytes=[4.0] * 3, signature=["a"] * 3,
                src=[0, 0], dst=[1, 2], edge_bytes=[4.0, 4.0], is_output=[False, False, True])
    q = G.coarsen(g, [0, 1, 1])
    assert q.num_edges == 1 and q.edge_bytes.tolist() == [4.0]
    assert q.flops.tolist() == [1.0, 5.0]
    assert q.is_output.tolist() == [False, True]
    assert q.name_path.tolist() == ["A/x", "B"]


def test_empty_graph():
    g = OpGraph(op=[], name_path=[], flops=[], bytes_accessed=[], out_bytes=[], signature=[],
                src=[], dst=[], edge_bytes=[])
    assert G.chain_collapse(g).size == 0
    assert G.coarsen(g, np.zeros(0, dtype=np.int32)).num_ops == 0

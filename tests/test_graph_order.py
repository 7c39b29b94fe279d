"""The topological order used by OpGraph.from_unordered and the group quotients: the
lowest index first among ready nodes, None on a cycle."""

import heapq

import numpy as np
import pytest

from simplace.graph import find_cycle, topological_order


def _lowest_first(m, src, dst):
    """Reference: Kahn's algorithm taking the lowest ready index each step."""
    preds = [set() for _ in range(m)]
    for s, d in zip(src, dst, strict=True):
        preds[d].add(s)
    done, order = set(), []
    ready = [i for i in range(m) if not preds[i]]
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        done.add(i)
        for j in range(m):
            if j not in done and j not in ready and preds[j] <= done and i in preds[j]:
                heapq.heappush(ready, j)
    return order


def _random_dag(rng, m, p):
    upper = np.triu(rng.random((m, m)) < p, k=1)
    return np.nonzero(upper)


@pytest.mark.parametrize("seed", range(5))
def test_unordered_graph_gets_the_lowest_index_first_order(seed):
    rng = np.random.default_rng(seed)
    m = 30
    src, dst = _random_dag(rng, m, 0.1)
    perm = rng.permutation(m)  # relabel so edges go both ways
    s, d = perm[src], perm[dst]
    assert np.any(s > d)
    order = topological_order(m, s, d)
    assert order.tolist() == _lowest_first(m, s.tolist(), d.tolist())
    rank = np.empty(m, dtype=np.int64)
    rank[order] = np.arange(m)
    assert np.all(rank[s] < rank[d])


def test_forward_edges_keep_the_identity_order():
    # duplicate edges (two tensors between the same ops) change nothing
    src, dst = np.array([0, 0, 2, 1, 1]), np.array([3, 3, 3, 2, 4])
    assert topological_order(5, src, dst).tolist() == [0, 1, 2, 3, 4]
    assert topological_order(0, np.zeros(0, int), np.zeros(0, int)).tolist() == []


@pytest.mark.parametrize("src,dst", [([0, 1, 2], [1, 2, 0]), ([0, 1], [1, 1])])
def test_cycle_gives_none_and_find_cycle_names_it(src, dst):
    assert topological_order(3, np.array(src), np.array(dst)) is None
    cycle = find_cycle(3, src, dst)
    assert cycle[0] == cycle[-1] and len(cycle) >= 2
    edges = set(zip(src, dst, strict=True))
    assert all((a, b) in edges for a, b in zip(cycle, cycle[1:], strict=False))

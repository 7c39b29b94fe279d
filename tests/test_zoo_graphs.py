"""Every zoo model traces into a valid OpGraph, and its coarsenings stay acyclic."""

import functools

import networkx as nx
import numpy as np
import pytest

import simplace
from simplace import groups as G
from simplace import zoo


@functools.cache
def small_graph(name: str, training: bool) -> simplace.OpGraph:
    fn, args = zoo.get(name, training=training, small=True)
    return simplace.trace(fn, *args, name=name)


CASES = [(n, t) for n in zoo.names() for t in (True, False)]


@pytest.mark.parametrize("name, training", CASES)
def test_traces_in_both_modes(name, training):
    g = small_graph(name, training)
    assert g.num_ops > 10 and g.num_edges > 0
    assert g.flops.sum() > 0 and g.num_params > 0
    # Every parameter is read by some op.
    assert set(g.param_index.tolist()) == set(range(g.num_params))
    assert g.is_output.any()
    backward = np.char.startswith(g.name_path.astype(str), "backward/")
    # Training graphs carry the gradient ops, marked backward; inference has none.
    assert backward.any() == training
    # Module paths survive the trace.
    assert np.mean([p != "" for p in g.name_path]) > 0.5


@pytest.mark.parametrize("name, training", CASES)
def test_quotients_stay_acyclic_and_keep_cost(name, training):
    g = small_graph(name, training)
    base = G.chain_collapse(g, G.colocate_free_ops(g))
    for groups in (base, G.target_count(g, 16, base), G.target_count(g, 4)):
        q = G.coarsen(g, groups)  # raises if the quotient has a cycle
        assert nx.is_directed_acyclic_graph(q.to_networkx())
        assert q.num_ops == groups.max() + 1
        np.testing.assert_allclose(q.flops.sum(), g.flops.sum(), rtol=1e-12)
        np.testing.assert_allclose(q.bytes_accessed.sum(), g.bytes_accessed.sum(), rtol=1e-12)
        np.testing.assert_allclose(q.param_sizes.sum(), g.param_sizes.sum())
    # Coarsening shrinks real graphs a lot (HSDAG's point).
    assert base.max() + 1 < 0.6 * g.num_ops


def test_gradient_colocation_groups_layers_in_training_graph():
    g = small_graph("nmt_2layer", True)
    groups = G.colocate_gradients(g)
    paths = g.name_path.tolist()
    # A backward op whose module has forward ops shares a group with one of them.
    fwd = {p: groups[i] for i, p in enumerate(paths) if p and not p.startswith("backward/")}
    joined = [groups[i] == fwd[p[len("backward/"):]] for i, p in enumerate(paths)
              if p.startswith("backward/") and p[len("backward/"):] in fwd]
    assert joined and all(joined)

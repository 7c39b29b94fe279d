"""PaSE strategies as JAX shardings run on the fake CPU devices and match unsharded runs."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from simplace import CostModel, trace, zoo
from simplace.parallel import ParallelizeError, parallelize, shard
from simplace.parallel.sharding import config_axes, mesh_axes, tensor_spec


def test_mesh_and_specs():
    assert mesh_axes(8) == ((2, 2, 2), ("d0", "d1", "d2"))
    assert mesh_axes(12)[0] == (2, 2, 3)
    # batch takes axes first, then the other dims in order
    assert config_axes([2, 1, 4], 0, 8) == [("d0",), (), ("d1", "d2")]
    assert config_axes([1, 3, 2], 0, 6) == [(), ("d1",), ("d0",)]
    axes = config_axes([2, 2], 0, 4)
    assert tensor_spec((8, 6), (0, 1), axes, 4) == P("d0", "d1")
    assert tensor_spec((8, 5), (0, 1), axes, 4) == P("d0")  # 5 is not divisible by 2
    assert tensor_spec((6, 8), (1, 0), axes, 4) == P("d1", "d0")


def _close(a, b):
    return all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(
        lambda x, y: np.allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5), a, b)))


@pytest.mark.parametrize("name,p,method", [
    ("transformer", 4, "expert"),   # Megatron: heads and columns/rows split
    ("alexnet", 2, "expert"),        # model-parallel fully-connected layers
    ("mlp", 4, "pase"),
])
def test_sharded_execution_matches_unsharded(name, p, method):
    if len(jax.devices()) < p:
        pytest.skip("needs the conftest's fake CPU devices")
    fn, ex = zoo.get(name, small=True, batch=8, abstract=False)
    graph = trace(fn, *ex)
    # links as fast as memory make model parallelism pay on the tiny test models
    cm = CostModel.load("cpu_h100x4_nvlink")
    st = parallelize(graph, cm, p, method=method)
    if method == "expert":
        split = [s for s in st.param_specs.values() if any(e is not None for e in s)]
        assert split, "the expert strategy splits some parameter"
    jitted, args = shard(fn, ex, st)
    if st.info["batch_axes"]:
        assert not args[1].sharding.is_fully_replicated  # inputs split along the batch
    if name == "transformer":  # module outputs are constrained to their layer's layout
        assert "sharding_constraint" in jitted.lower(*args).as_text()
    got = jitted(*args)
    want = jax.jit(fn)(*ex)
    assert _close(got, want)
    # the parameters really are laid out by the strategy
    leaves = jax.tree_util.tree_leaves_with_path(args[0])
    for path, leaf in leaves:
        key = jax.tree_util.keystr(tuple(path), simple=True, separator="/")
        spec = st.param_specs.get(key)
        if spec is not None and leaf.sharding.spec != P():
            assert leaf.sharding.spec == spec


def test_mesh_needs_enough_devices():
    fn, ex = zoo.get("mlp", small=True)
    st = parallelize(trace(fn, *ex), CostModel.load("haswell_k40x4"), 64)
    with pytest.raises(ParallelizeError, match="xla_force_host_platform_device_count"):
        st.mesh(jax.devices()[:1])

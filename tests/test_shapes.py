"""Structured shapes: ops carry their operands' and outputs' shapes, dtypes and primitive
parameters as data (OpGraph.in_avals, out_avals, attrs, param_avals), in memory and in
the graph file; PaSE reads them, never the signature text."""

import dataclasses
import json
import pickle

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simplace import CostModel, OpGraph, trace
from simplace.errors import GraphError, TraceError
from simplace.graph import SCHEMA_VERSION, Aval
from simplace.groups import coarsen
from simplace.parallel import ParallelizeError, build_layer_graph

F32 = jnp.float32


def _sds(*shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def _dense_net(dtype):
    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Dense(16, dtype=dtype, param_dtype=dtype, name="fc1")(x))
            return nn.Dense(4, dtype=dtype, param_dtype=dtype, name="fc2")(x)

    net = Net()
    x = _sds(8, 32, dtype=dtype)
    params = jax.eval_shape(net.init, jax.random.key(0), x)
    return trace(lambda p, x: net.apply(p, x), params, x, name=f"dense_{dtype.__name__}")


@pytest.fixture(scope="module")
def cost_model():
    return CostModel.load("haswell_k40x4")


@pytest.fixture(scope="module")
def f32_net():
    return _dense_net(jnp.float32)


# ----------------------------------------------------------------------------- trace
def test_trace_records_operand_and_output_shapes():
    g = trace(lambda a, b: jnp.einsum("bij,bjk->bik", a, b), _sds(4, 16, 32), _sds(4, 32, 8),
              param_argnums=())
    (i,) = np.flatnonzero(g.op == "dot_general")
    ins, outs = g.avals(i)
    assert ins == (Aval((4, 16, 32), "float32", 4), Aval((4, 32, 8), "float32", 4))
    assert outs == (Aval((4, 16, 8), "float32", 4),)
    assert g.attrs[i]["dimension_numbers"] == (((2,), (1,)), ((0,), (0,)))
    assert outs[0].nbytes == g.out_bytes[i] == 4 * 16 * 8 * 4


def test_every_edge_carries_its_producers_output(f32_net):
    g = f32_net
    for e in range(g.num_edges):
        a = g.edge_aval(e)
        assert a == g.out_avals[g.src[e]][g.edge_output[e]]
        assert a.nbytes == g.edge_bytes[e]
    for i in range(g.num_ops):
        assert sum(a.nbytes for a in g.out_avals[i]) == g.out_bytes[i]


@pytest.mark.parametrize("dtype, itemsize", [
    (jnp.bfloat16, 2), (jnp.float16, 2), (jnp.int8, 1), (jnp.float8_e4m3fn, 1),
    (jnp.uint32, 4), (jnp.bool_, 1),
])
def test_itemsize_is_the_dtypes_never_a_guess(dtype, itemsize):
    # float8 and friends counted 4 bytes when shapes were read back from signature text
    g = trace(lambda x: x.reshape(-1), _sds(3, 5, dtype=dtype), param_argnums=())
    (a,) = g.in_avals[0]
    assert a == Aval((3, 5), np.dtype(dtype).name, itemsize)
    assert g.out_bytes[0] == 15 * itemsize


def test_prng_keys_count_their_physical_size():
    g = trace(lambda k: jax.random.split(k, 3), jax.random.key(0), param_argnums=())
    dtypes = {a.dtype: a.itemsize for row in g.in_avals + g.out_avals for a in row}
    keys = {d: n for d, n in dtypes.items() if d.startswith("key<")}
    assert keys and all(n == 8 for n in keys.values())  # threefry: two uint32 words


def test_an_unsizable_dtype_is_an_error():
    from simplace.trace import _dtype_bytes

    with pytest.raises(TraceError, match="cannot size dtype"):
        _dtype_bytes(object())


def test_parameters_carry_their_shapes(f32_net):
    g = f32_net
    shapes = dict(zip(g.param_names.tolist(), [a.shape for a in g.param_avals], strict=True))
    assert shapes == {"params/fc1/kernel": (32, 16), "params/fc1/bias": (16,),
                      "params/fc2/kernel": (16, 4), "params/fc2/bias": (4,)}
    assert [a.nbytes for a in g.param_avals] == g.param_sizes.tolist()


def test_attrs_are_read_only_and_graphs_pickle(f32_net):
    i = int(np.flatnonzero(f32_net.op == "dot_general")[0])
    a = f32_net.attrs[i]
    for change in (lambda: a.__setitem__("dimension_numbers", ()), lambda: a.update(x=1),
                   lambda: a.pop("dimension_numbers"), a.clear):
        with pytest.raises(TypeError, match="read-only"):
            change()
    assert "dimension_numbers" in a
    g = pickle.loads(pickle.dumps(f32_net))  # process pools pickle graphs
    assert g.attrs == f32_net.attrs and g.in_avals == f32_net.in_avals
    with pytest.raises(TypeError, match="read-only"):
        g.attrs[i]["x"] = 1


# ----------------------------------------------------------------------------- graph
def _fields(g: OpGraph, **over) -> dict:
    d = {f.name: getattr(g, f.name) for f in dataclasses.fields(g)}
    d.update(over)
    return d


def test_shape_fields_are_optional_and_not_hashed(f32_net):
    bare = OpGraph(**_fields(f32_net, in_avals=None, out_avals=None, attrs=None,
                             param_avals=None))
    assert bare.avals(0) == ((), ()) and bare.edge_aval(0) is None
    # placements and validation records made for a graph stay valid for the same graph
    # with (or without) its shapes
    assert bare.hash == f32_net.hash


def test_json_round_trip_keeps_shapes_and_interns_them(tmp_path, f32_net):
    path = tmp_path / "g.json"
    f32_net.save(path)
    d = json.loads(path.read_text())
    assert d["schema_version"] == SCHEMA_VERSION == 2
    n_avals = sum(len(r) for r in f32_net.in_avals + f32_net.out_avals)
    assert len(d["avals"]["shape"]) < n_avals  # a table of distinct avals
    assert len(d["attrs"]) < f32_net.num_ops
    g = OpGraph.load(path)
    assert (g.in_avals, g.out_avals, g.attrs, g.param_avals) == (
        f32_net.in_avals, f32_net.out_avals, f32_net.attrs, f32_net.param_avals)
    assert g.hash == f32_net.hash


def test_a_graph_without_shapes_saves_nulls(tmp_path, f32_net):
    bare = OpGraph(**_fields(f32_net, in_avals=None, out_avals=None, attrs=None,
                             param_avals=None))
    bare.save(tmp_path / "g.json")
    d = json.loads((tmp_path / "g.json").read_text())
    assert d["ops"]["in_avals"] is None and d["params"]["param_avals"] is None
    assert OpGraph.load(tmp_path / "g.json").in_avals is None


def test_an_old_graph_file_says_how_to_remake_it(tmp_path, f32_net):
    d = f32_net.to_dict()
    d["schema_version"] = 1
    for f in ("in_avals", "out_avals", "attrs"):
        del d["ops"][f]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(d))
    with pytest.raises(GraphError) as err:
        OpGraph.load(path)
    msg = str(err.value)
    assert str(path) in msg and "schema_version 1" in msg
    assert f"simplace graph MODEL --out {path}" in msg  # a name the CLI did not make


@pytest.mark.parametrize("name, args", [
    ("mlp/train/small", "mlp --small"), ("bert_base/inference/b8", "bert_base --inference "
                                         "--batch 8"), ("resnet50/train", "resnet50"),
    ("my_fn", "MODEL"), ("", "MODEL"),
])
def test_an_old_cli_graph_names_its_command(tmp_path, f32_net, name, args):
    d = dict(f32_net.to_dict(), schema_version=1, name=name)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(d))
    with pytest.raises(GraphError, match=f"`simplace graph {args} --out "):
        OpGraph.load(path)


def _edit(d, section, field, fn):
    fn(d[section] if section else d, field)
    return d


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["ops"].pop("in_avals"), "'ops.in_avals' is missing"),
    (lambda d: d.pop("avals"), "section 'avals'"),
    (lambda d: d["avals"]["shape"].__setitem__(0, [-1]), r"'avals.shape' entry 0"),
    (lambda d: d["avals"]["itemsize"].__setitem__(0, 2.5), r"'avals.itemsize' entry 0"),
    (lambda d: d["avals"]["dtype"].__setitem__(0, ""), r"'avals.dtype' entry 0"),
    (lambda d: d["avals"]["dtype"].pop(), "one entry per aval"),
    (lambda d: d["ops"]["in_avals"][0].__setitem__(0, 10 ** 6), r"index into 'avals'"),
    (lambda d: d["ops"]["out_avals"].__setitem__(0, 3), r"'ops.out_avals' entry 0"),
    (lambda d: d["ops"]["attrs"].__setitem__(0, -1), r"'ops.attrs' entry 0"),
    (lambda d: d.__setitem__("attrs", [1]), "section 'attrs'"),
    (lambda d: d["params"].__setitem__("param_avals", [0]), "'param_avals' has 1 entries"),
    (lambda d: d["ops"]["out_avals"].pop(), "'out_avals' has"),
])
def test_bad_shape_fields_in_a_file(tmp_path, f32_net, edit, message):
    d = f32_net.to_dict()
    edit(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(GraphError, match=message) as err:
        OpGraph.load(path)
    assert str(path) in str(err.value)


def test_shapes_must_agree_with_the_byte_counts(f32_net):
    g = f32_net
    e = 0
    s, o = int(g.src[e]), int(g.edge_output[e])
    wrong = list(g.out_avals)
    a = wrong[s][o]
    wrong[s] = wrong[s][:o] + (a._replace(itemsize=a.itemsize * 2),) + wrong[s][o + 1:]
    with pytest.raises(GraphError, match="add up to"):
        OpGraph(**_fields(g, out_avals=wrong))
    with pytest.raises(GraphError, match="'param_sizes' says"):
        OpGraph(**_fields(g, param_avals=[Aval((1,), "float32", 4)] * g.num_params))
    with pytest.raises(GraphError, match="must hold integer sizes >= 0"):
        OpGraph(**_fields(g, in_avals=[[((-1,), "float32", 4)]] * g.num_ops))
    with pytest.raises(GraphError, match="'attrs' of op 0 must be a mapping"):
        OpGraph(**_fields(g, attrs=[1] * g.num_ops))


def test_triples_become_avals_and_from_unordered_sorts_them():
    g = OpGraph.from_unordered(
        op=["b", "a"], name_path=["", ""], flops=[1, 1], bytes_accessed=[1, 1],
        out_bytes=[8, 4], signature=["b", "a"], src=[1], dst=[0], edge_bytes=[4],
        in_avals=[[((1,), "float32", 4)], []], out_avals=[[((2,), "float32", 4)],
                                                          [((1,), "float32", 4)]],
        attrs=[{"k": [1, 2]}, {}])
    assert list(g.op) == ["a", "b"]
    assert g.out_avals == ((Aval((1,), "float32", 4),), (Aval((2,), "float32", 4),))
    assert g.in_avals[1] == (Aval((1,), "float32", 4),)
    assert dict(g.attrs[1]) == {"k": (1, 2)}


# ----------------------------------------------------------------------------- consumers
def test_coarse_graphs_record_no_op_shapes(f32_net, cost_model):
    q = coarsen(f32_net, np.arange(f32_net.num_ops) // 4)
    assert q.in_avals is None and q.out_avals is None and q.attrs is None
    assert q.param_avals == f32_net.param_avals
    with pytest.raises(ParallelizeError, match="does not record its ops' shapes"):
        build_layer_graph(q, cost_model)


def test_layers_never_read_signature_text(f32_net, cost_model):
    lg = build_layer_graph(f32_net, cost_model)
    blind = OpGraph(**_fields(f32_net, signature=["x"] * f32_net.num_ops))
    lb = build_layer_graph(blind, cost_model)
    # op times are keyed by signature; everything PaSE reads off the ops is not
    strip = lambda lay: dataclasses.replace(lay, time_s=0.0, overhead_s=0.0)  # noqa: E731
    assert [strip(x) for x in lb.layers] == [strip(x) for x in lg.layers]
    assert lb.edges == lg.edges
    kinds = [lay.kind for lay in lg.layers]
    assert kinds.count("matmul") == 2


@pytest.mark.parametrize("dtype, itemsize", [(jnp.bfloat16, 2), (jnp.float8_e4m3fn, 1)])
def test_layer_itemsize_follows_the_dtype(cost_model, dtype, itemsize):
    lg = build_layer_graph(_dense_net(dtype), cost_model)
    mm = [lay for lay in lg.layers if lay.kind == "matmul"]
    assert len(mm) == 2 and all(lay.itemsize == itemsize for lay in mm)
    params = [t for lay in mm for t in lay.tensors if t.role == "param"]
    assert {t.shape for t in params} == {(32, 16), (16,), (16, 4), (4,)}


def test_the_executor_traces_the_same_shapes():
    from simplace.validate.executor import Program

    def f(p, x):
        return jnp.tanh(x @ p["w"]).sum(axis=0)

    args = ({"w": jnp.ones((6, 3))}, jnp.ones((5, 6)))
    g, h = trace(f, *args), Program(f, args).graph
    assert (h.in_avals, h.out_avals, h.attrs, h.param_avals) == (
        g.in_avals, g.out_avals, g.attrs, g.param_avals)
    assert g.param_avals == (Aval((6, 3), "float32", 4),)


def test_loops_carry_their_operands_and_results():
    def f(x):
        return jax.lax.scan(lambda c, _: (c * 2.0, c.sum()), x, None, length=7)

    g = trace(f, _sds(3, 4), param_argnums=())
    (i,) = np.flatnonzero(g.op == "scan")
    ins, outs = g.avals(i)
    assert ins == (Aval((3, 4), "float32", 4),)
    assert outs == (Aval((3, 4), "float32", 4), Aval((7,), "float32", 4))
    assert g.attrs[i]["length"] == 7 and "jaxpr" not in g.attrs[i]  # sub-jaxprs left out

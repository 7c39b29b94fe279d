"""Tests of simplace.trace: JAX function -> OpGraph."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import pytest
from jax import lax

from simplace.errors import TraceError
from simplace.graph import BACKWARD_PREFIX, OpGraph
from simplace.trace import module_path, op_specs, trace

F32 = 4  # bytes per float32
CALL_PRIMITIVES = {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call",
                   "custom_vjp_call", "custom_vjp_call_jaxpr", "remat2", "checkpoint"}


def _sds(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def _only(g: OpGraph, op: str) -> int:
    idx = np.flatnonzero(g.op == op)
    assert idx.size == 1, f"expected one {op}, got {g.op.tolist()}"
    return int(idx[0])


def _edges(g: OpGraph) -> set[tuple[int, int, int]]:
    return set(zip(g.src.tolist(), g.dst.tolist(), g.edge_output.tolist(), strict=True))


# ----------------------------------------------------------------------------- FLOPs
def test_dot_general_flops_with_batch_dims():
    def f(a, b):  # batch 4, M 16, K 32, N 8
        return lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,))))

    g = trace(f, _sds(4, 16, 32), _sds(4, 32, 8), param_argnums=())
    i = _only(g, "dot_general")
    assert g.flops[i] == 2 * 4 * 16 * 8 * 32
    assert g.bytes_accessed[i] == (4 * 16 * 32 + 4 * 32 * 8 + 4 * 16 * 8) * F32
    assert g.out_bytes[i] == 4 * 16 * 8 * F32
    assert g.signature[i].startswith("dot_general|f32[4,16,32],f32[4,32,8]|")
    assert "(((2,), (1,)), ((0,), (0,)))" in g.signature[i]


CONV_CASES = {
    # lhs NHWC, rhs HWIO, kwargs, hand-computed FLOPs = 2 x out batch x out features x
    # kernel input features x taps, where taps multiplies, over the spatial dims, the
    # (output position, kernel tap) pairs that read an input element (not padding, not a
    # zero inserted by lhs dilation): XLA's count
    "strided_same": ((2, 16, 16, 8), (3, 3, 8, 16), dict(window_strides=(2, 2),
                                                         padding="SAME"),
                     2 * 2 * 16 * 8 * 23 ** 2),  # 8 outputs x 3 taps, 1 on SAME's pad
    "rhs_dilated_valid": ((2, 16, 16, 8), (3, 3, 8, 16), dict(
        window_strides=(1, 1), padding="VALID", rhs_dilation=(2, 2)),
        2 * 2 * 16 * 8 * (12 * 3) ** 2),  # effective kernel 5 -> 12 outputs, no padding
    "lhs_dilated_transposed": ((1, 5, 5, 4), (3, 3, 4, 6), dict(
        window_strides=(1, 1), padding=((2, 2), (2, 2)), lhs_dilation=(2, 2)),
        2 * 1 * 6 * 4 * (5 * 3) ** 2),  # every input pixel meets every tap once; the 11
    # x 11 output counted over the dilated input (2 x 121 x 6 x 4 x 9) would be 2.4x more
    "strided_transposed": ((2, 4, 4, 8), (3, 3, 8, 8), dict(
        window_strides=(2, 2), padding=((1, 1), (1, 1)), lhs_dilation=(3, 3)),
        2 * 2 * 8 * 8 * 5 ** 2),  # dilated input 10, padded 12 -> 5 outputs; of the 15
    # (output, tap) pairs per dim, 5 land on input pixels
    "feature_groups": ((2, 16, 16, 8), (3, 3, 2, 16), dict(
        window_strides=(1, 1), padding="SAME", feature_group_count=4),
        2 * 2 * 16 * 2 * 46 ** 2),  # 8/4 input channels per output; 16 x 3 - 2 padded
    "depthwise": ((1, 10, 10, 8), (5, 5, 1, 8), dict(
        window_strides=(1, 1), padding="VALID", feature_group_count=8),
        2 * (1 * 6 * 6 * 8) * 1 * 25),
    "batch_groups": ((4, 8, 8, 6), (3, 3, 6, 4), dict(
        window_strides=(1, 1), padding="VALID", batch_group_count=2),
        2 * (2 * 6 * 6 * 4) * 6 * 9),  # output batch 4 / 2
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_flops(case):
    lhs, rhs, kw, want = CONV_CASES[case]

    def f(x, w):
        return lax.conv_general_dilated(x, w, dimension_numbers=("NHWC", "HWIO", "NHWC"), **kw)

    g = trace(f, _sds(*lhs), _sds(*rhs), param_argnums=(1,))
    i = _only(g, "conv_general_dilated")
    assert g.flops[i] == want
    assert g.param_bytes[i] == np.prod(rhs) * F32


def test_conv_signatures_distinguish_strides():
    x, w = _sds(1, 8, 8, 4), _sds(3, 3, 4, 4)

    def conv(s):
        return lambda x, w: lax.conv_general_dilated(
            x, w, (s, s), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    s1 = trace(conv(1), x, w).signature[0]
    s2 = trace(conv(2), x, w).signature[0]
    assert s1 != s2 and "window_strides=(2, 2)" in s2
    assert trace(conv(1), x, w).signature[0] == s1  # deterministic


def test_elementwise_reduction_view_and_move_costs():
    def f(x):
        y = jnp.exp(x)                 # elementwise: one per output element
        z = y.reshape(8, 4)            # view: no bytes
        t = z.T                        # data movement: bytes, no flops
        return jnp.sum(t, axis=0)      # reduction: input size

    g = trace(f, _sds(4, 8), param_argnums=())
    e, r, t, s = (_only(g, p) for p in ("exp", "reshape", "transpose", "reduce_sum"))
    assert (g.flops[e], g.bytes_accessed[e]) == (32, 2 * 32 * F32)
    assert (g.flops[r], g.bytes_accessed[r], g.out_bytes[r]) == (0, 0, 32 * F32)
    assert (g.flops[t], g.bytes_accessed[t]) == (0, 2 * 32 * F32)
    assert (g.flops[s], g.bytes_accessed[s]) == (32 - 8, (32 + 8) * F32)  # n - 1 adds


def test_pooling_and_its_gradient():
    def f(x):
        return nn.max_pool(x, (2, 2), strides=(2, 2)).sum()

    x = _sds(1, 8, 8, 2)
    g = trace(f, x, param_argnums=())
    i = _only(g, "reduce_window_max")
    assert g.flops[i] == (4 * 4 * 2) * 3  # window positions x (window size - 1)
    gg = trace(jax.grad(f), x, param_argnums=())
    assert "reduce_window_max" not in gg.meta["unknown_primitives"]
    back = [i for i in range(gg.num_ops) if gg.op[i].startswith("select_and")]
    # XLA's CPU expansion: (7 + rank) ops per extra window element, one scatter-add
    assert back and all(gg.flops[i] == (4 * 4 * 2) * (11 * 3 + 1) for i in back)


# ----------------------------------------------------------------------------- inlining
@jax.custom_vjp
def _my_cos(x):
    return jnp.cos(x)


_my_cos.defvjp(lambda x: (jnp.cos(x), x), lambda x, ct: (-jnp.sin(x) * ct,))


def _nested(x):
    y = jax.jit(jnp.sin)(x)            # jit / pjit
    y = jax.nn.relu(y)                 # custom_jvp (with a jit inside)
    y = _my_cos(y)                     # custom_vjp
    y = jax.checkpoint(jnp.tanh)(y)    # remat
    return y


def test_nested_calls_are_inlined_and_connected():
    g = trace(_nested, _sds(16), param_argnums=())
    assert not CALL_PRIMITIVES & set(g.op.tolist())
    assert g.op.tolist() == ["sin", "max", "cos", "tanh"]
    assert _edges(g) == {(0, 1, 0), (1, 2, 0), (2, 3, 0)}
    assert g.is_output.tolist() == [False, False, False, True]


def test_nested_calls_inlined_under_grad():
    g = trace(jax.grad(lambda x: _nested(x).sum()), _sds(16), param_argnums=())
    assert not CALL_PRIMITIVES & set(g.op.tolist())
    # the custom_vjp backward rule (-sin(x) * ct) is part of the graph
    assert "sin" in g.op.tolist() and "neg" in g.op.tolist()
    # edges run across the former call boundaries: one connected graph
    assert nx.is_weakly_connected(g.to_networkx())
    # dead code of the jaxpr (the loss value grad does not return) is dropped
    full = trace(jax.grad(lambda x: _nested(x).sum()), _sds(16), param_argnums=(), dce=False)
    assert g.meta["dead_ops_removed"] > 0
    assert full.num_ops == g.num_ops + g.meta["dead_ops_removed"]
    assert "reduce_sum" in full.op.tolist() and "reduce_sum" not in g.op.tolist()


def test_params_read_inside_jit_are_attributed():
    @jax.jit
    def layer(w, x):
        return x @ w

    def f(p, x):
        return layer(p["w"], x) + layer(p["w"], 2 * x)

    g = trace(f, {"w": _sds(8, 4)}, _sds(3, 8))
    dots = np.flatnonzero(g.op == "dot_general")
    assert len(dots) == 2
    assert g.param_names.tolist() == ["w"]
    assert sorted(g.param_op.tolist()) == sorted(dots.tolist())
    assert np.all(g.param_bytes[dots] == 8 * 4 * F32)


# ----------------------------------------------------------------------------- loops
def test_scan_is_one_op_costed_body_times_length():
    def f(w, c):
        def body(c, _):
            return jnp.tanh(c @ w), None
        return lax.scan(body, c, None, length=7)[0]

    g = trace(f, _sds(16, 16), _sds(2, 16))
    assert g.op.tolist() == ["scan"]
    body_flops = 2 * 2 * 16 * 16 + 2 * 16  # matmul + tanh
    assert g.flops[0] == 7 * body_flops
    assert g.meta["loops"] == 1
    assert g.param_bytes[0] == 16 * 16 * F32  # the weight is a scan const
    assert "length=7" in g.signature[0] and "body=" in g.signature[0]

    def f3(w, c):
        return lax.scan(lambda c, _: (jnp.tanh(c @ w), None), c, None, length=3)[0]

    g3 = trace(f3, _sds(16, 16), _sds(2, 16))
    assert g3.flops[0] == 3 * body_flops and g3.signature[0] != g.signature[0]


def test_while_fori_trip_count():
    def f(x, n):
        known = lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + 1, jnp.sin(c[1])),
                               (0, x))[1]
        return lax.fori_loop(0, n, lambda i, c: jnp.cos(c), known)

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        g = trace(f, _sds(8), _sds(dtype=jnp.int32), param_argnums=())
    loops = np.flatnonzero(g.op == "while")
    assert len(loops) == 2 and g.meta["loops"] == 2
    first, second = (int(i) for i in loops)
    assert "trips=10" in g.signature[first]
    assert g.flops[first] == 10 * (1 + 1 + 8)  # cond lt + add + sin per iteration
    assert "trips=1" in g.signature[second]    # bound is a traced value
    assert g.flops[second] == 1 + 1 + 8
    msgs = [str(x.message) for x in w]
    assert len(msgs) == 1 and "while loop" in msgs[0]


def test_cond_costs_the_larger_branch():
    def f(p, x):
        return lax.cond(x.sum() > 0, lambda v: jnp.sin(v), lambda v: v @ p, x)

    g = trace(f, _sds(32, 32), _sds(4, 32))
    i = _only(g, "cond")
    assert g.flops[i] == 2 * 4 * 32 * 32
    assert g.param_bytes[i] == 32 * 32 * F32
    assert g.meta["loops"] == 0
    assert "branches=(" in g.signature[i]


def test_loop_inside_flax_scan_gets_module_path():
    class Cell(nn.Module):
        @nn.compact
        def __call__(self, c, x):
            c = nn.tanh(nn.Dense(8, name="lin")(c) + x)
            return c, c

    class Net(nn.Module):
        @nn.compact
        def __call__(self, xs):
            scan = nn.scan(Cell, variable_broadcast="params", split_rngs={"params": False})
            return scan(name="rnn")(xs[0], xs)[0]

    xs = jnp.ones((5, 8))
    p = Net().init(jax.random.PRNGKey(0), xs)["params"]
    g = trace(jax.grad(lambda p, xs: Net().apply({"params": p}, xs).sum()), p, xs)
    paths = {str(g.name_path[i]) for i in np.flatnonzero(g.op == "scan")}
    assert paths == {"Net/rnn", BACKWARD_PREFIX + "Net/rnn"}


# ----------------------------------------------------------------------------- parameters
class _Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Conv(4, (3, 3), name="conv")(x)
        return nn.relu(x)


class _Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = _Block(name="block1")(x)
        x = x.reshape(x.shape[0], -1)
        return nn.Dense(3, name="head")(x)


def _net_params():
    variables = jax.eval_shape(lambda: _Net().init(jax.random.PRNGKey(0),
                                                   jnp.zeros((1, 8, 8, 3))))
    return variables


def test_shape_dtype_struct_params_and_names():
    variables = _net_params()
    leaves = jax.tree_util.tree_leaves(variables)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    g = trace(lambda v, x: _Net().apply(v, x), variables, _sds(2, 8, 8, 3))
    assert sorted(g.param_names.tolist()) == [
        "params/block1/conv/bias", "params/block1/conv/kernel",
        "params/head/bias", "params/head/kernel"]
    sizes = dict(zip(g.param_names.tolist(), g.param_sizes.tolist(), strict=True))
    assert sizes["params/block1/conv/kernel"] == 3 * 3 * 3 * 4 * F32
    conv = _only(g, "conv_general_dilated")
    dot = _only(g, "dot_general")
    assert g.param_bytes[conv] == sizes["params/block1/conv/kernel"]
    assert g.param_bytes[dot] == sizes["params/head/kernel"]
    assert g.name_path[conv] == "_Net/block1/conv"
    assert g.name_path[dot] == "_Net/head"
    assert g.meta["jax_version"] == jax.__version__ and g.meta["trace_s"] >= 0


def test_weight_read_by_two_ops_gives_two_uses():
    def f(p, x):
        return x @ p["w"] + jnp.tanh(p["w"]).sum()

    g = trace(f, {"w": _sds(4, 4)}, _sds(2, 4))
    assert len(g.param_op) == 2
    assert set(g.op[g.param_op].tolist()) == {"dot_general", "tanh"}
    assert np.all(g.param_bytes[g.param_op] == 4 * 4 * F32)


def test_param_argnums():
    def f(a, b, x):
        return x @ a + x @ b["k"]

    args = (_sds(4, 4), {"k": _sds(4, 4)}, _sds(2, 4))
    g = trace(f, *args, param_argnums=(0, 1))
    assert g.param_names.tolist() == ["arg0", "arg1/k"]
    assert trace(f, *args, param_argnums=-1).num_params == 1
    assert trace(f, *args, param_argnums=()).num_params == 0
    with pytest.raises(TraceError, match="param_argnums"):
        trace(f, *args, param_argnums=(3,))


def test_make_jaxpr_failure_is_a_trace_error():
    with pytest.raises(TraceError, match="make_jaxpr failed"):
        trace(lambda x: x @ x, _sds(2, 3))


# ----------------------------------------------------------------------------- name paths
def test_flax_name_paths_forward_and_backward():
    variables = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), _net_params())

    def loss(p, x):
        return jnp.sum(_Net().apply({"params": p}, x) ** 2)

    g = trace(jax.value_and_grad(loss), variables["params"], _sds(2, 8, 8, 3))
    convs = np.flatnonzero(g.op == "conv_general_dilated")
    paths = [str(g.name_path[i]) for i in convs]
    assert paths == ["_Net/block1/conv", BACKWARD_PREFIX + "_Net/block1/conv"]
    dots = {str(g.name_path[i]) for i in np.flatnonzero(g.op == "dot_general")}
    assert dots == {"_Net/head", BACKWARD_PREFIX + "_Net/head"}
    relu = _only(g, "max")
    assert g.name_path[relu] == "_Net/block1"
    # ops of the loss outside any module, and their gradients
    assert g.name_path[_only(g, "integer_pow")] == ""
    assert BACKWARD_PREFIX in set(g.name_path.tolist())
    # no transform wrapper survives
    assert not any("(" in p for p in g.name_path.tolist())


def test_module_path_cleaning():
    from jax._src.source_info_util import NameStack, Scope, Transform

    ns = NameStack((Transform("transpose"), Transform("jvp"), Scope("Net"),
                    Transform("jvp"), Scope("Net"), Scope("blk"),
                    Scope("rematted_computation"), Scope("Dense_0")))
    assert module_path(ns) == "backward/Net/blk/Dense_0"
    assert module_path(NameStack((Transform("vmap"), Scope("A"), Scope("B")))) == "A/B"
    assert module_path(NameStack(())) == ""
    # flax scopes methods other than __call__ as "<module>.<method>"
    assert module_path(NameStack((Scope("Top"), Scope("enc"), Scope("enc.encode"),
                                  Scope("d")))) == "Top/enc/d"
    assert module_path(NameStack((Scope("enc.encode"), Scope("d")))) == "enc/d"
    assert module_path(NameStack((Scope("layer.1"),))) == "layer.1"


# ----------------------------------------------------------------------------- edges etc.
def test_edges_dedupe_bytes_and_outputs():
    def f(x):
        y = jnp.sin(x)
        z = y * y                                   # one edge sin -> mul
        keys, vals = lax.sort((x, z), num_keys=1)   # two outputs
        return vals + 1.0, x                        # x is an input: marks no op

    g = trace(f, _sds(5, 3), param_argnums=())
    sin, mul, srt, add = (_only(g, p) for p in ("sin", "mul", "sort", "add"))
    assert _edges(g) == {(sin, mul, 0), (mul, srt, 0), (srt, add, 1)}
    assert np.all(g.edge_bytes == 5 * 3 * F32)
    assert g.is_output.tolist() == [i == add for i in range(g.num_ops)]
    assert g.bytes_accessed[mul] == 2 * 15 * F32  # y read once, written once
    assert g.bytes_accessed[add] == 2 * 15 * F32  # literal 1.0 is not an input


def test_unknown_primitive_warns_once_and_is_costed():
    mystery_p = jax.extend.core.Primitive("simplace_test_mystery")
    mystery_p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))

    def f(x):
        return mystery_p.bind(mystery_p.bind(jnp.sin(x)))

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        g = trace(f, _sds(6), param_argnums=())
    msgs = [str(x.message) for x in w]
    assert len(msgs) == 1 and "simplace_test_mystery (x2)" in msgs[0]
    assert g.meta["unknown_primitives"] == ["simplace_test_mystery"]
    i = np.flatnonzero(g.op == "simplace_test_mystery")
    assert len(i) == 2
    assert np.all(g.flops[i] == 6) and np.all(g.bytes_accessed[i] == 2 * 6 * F32)


def test_op_specs_rebuild_an_op():
    def f(a, b):
        return jnp.tanh(a @ b)

    specs = op_specs(f, _sds(3, 5), _sds(5, 2))
    sig = next(s for s in specs if s.startswith("dot_general|"))
    prim, params, ins = specs[sig]
    out = prim.bind(*(jnp.ones(s.shape, s.dtype) for s in ins), **params)
    assert out.shape == (3, 2) and float(out[0, 0]) == 5.0
    assert set(specs) == set(trace(f, _sds(3, 5), _sds(5, 2)).signature.tolist())


def test_trace_is_deterministic_and_saves(tmp_path):
    args = (_net_params(), _sds(2, 8, 8, 3))

    def fn(v, x):
        return _Net().apply(v, x)

    g1, g2 = trace(fn, *args), trace(fn, *args)
    assert g1.hash == g2.hash
    g1.save(tmp_path / "g.json")
    assert OpGraph.load(tmp_path / "g.json").hash == g1.hash


def test_einsum_scope_is_not_a_module():
    from jax._src.source_info_util import NameStack, Scope

    ns = NameStack((Scope("BERT"), Scope("attention"), Scope("bqhd,bkhd->bhqk")))
    assert module_path(ns) == "BERT/attention"

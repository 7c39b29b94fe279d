"""Tests of the benchmark model zoo: every model traces, runs (small), is deterministic,
carries its module paths in the name stacks, and the LSTMs are unrolled."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import numpy as np
import pytest

from simplace import zoo
from simplace.errors import ModelError

ALL = zoo.names()
BATCHNORM_MODELS = {"resnet50", "inception_v3", "tiny_cnn"}
# Default-size models traced in the fast suite; the rest are behind --runslow.
DEFAULT_FAST = ["resnet50", "inception_v3", "bert_base", "nmt_4layer", "rnnlm", "transformer",
                "alexnet", "mlp", "tiny_cnn"]


# ------------------------------------------------------------------------------ helpers


def _sub_jaxprs(eqn):
    for value in eqn.params.values():
        for v in value if isinstance(value, list | tuple) else (value,):
            if hasattr(v, "eqns"):
                yield v
            elif hasattr(v, "jaxpr") and hasattr(v.jaxpr, "eqns"):
                yield v.jaxpr


def _eqns(jaxpr, prefix=""):
    """``(name_stack, eqn)`` of every equation, nested jaxprs included.

    The name stacks of a nested jaxpr's equations are relative to the equation that
    holds it, so the outer stack is prefixed.
    """
    for eqn in jaxpr.eqns:
        stack = "/".join(p for p in (prefix, str(eqn.source_info.name_stack)) if p)
        yield stack, eqn
        for sub in _sub_jaxprs(eqn):
            yield from _eqns(sub, stack)


@functools.cache
def _small_trace(name: str, training: bool):
    """``(closed_jaxpr, output shapes, example_args)`` of a small model (abstract)."""
    fn, args = zoo.get(name, small=True, training=training)
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    return closed, out_shape, args


def _small_jaxpr(name: str, training: bool):
    return _small_trace(name, training)[0].jaxpr


def _stacks(name: str, training: bool = True) -> set[str]:
    return {stack for stack, _ in _eqns(_small_jaxpr(name, training))}


def _components(stacks) -> set[str]:
    return {c for s in stacks for c in s.split("/")}


def _run_jaxpr(closed, out_shape, args):
    """Run the traced jaxpr itself (what a placement will run) on concrete ``args``."""
    flat = jax.tree.leaves(args)
    # Optimisation level 0 halves XLA's CPU compile time (8 s instead of 15 s for the
    # Inception training step on 2 cores); these tests check values, not speed.
    compiled = jax.jit(jax.extend.core.jaxpr_as_fun(closed)).lower(*flat).compile(
        {"xla_backend_optimization_level": 0})
    return jax.tree.unflatten(jax.tree.structure(out_shape), compiled(*flat))


def _all_finite(tree) -> bool:
    return all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(tree))


def _same_shapes(a, b) -> bool:
    if jax.tree.structure(a) != jax.tree.structure(b):
        return False
    return all(x.shape == y.shape and x.dtype == y.dtype
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


# ------------------------------------------------------------------------------- catalogue


def test_names_and_info():
    expected = {"resnet50", "inception_v3", "alexnet", "bert_base", "bert_large",
                "transformer", "nmt_2layer", "nmt_4layer", "nmt_8layer", "rnnlm", "mlp",
                "tiny_cnn"}
    assert set(ALL) == expected
    assert sorted(ALL) == ALL
    for name in ALL:
        i = zoo.info(name)
        assert i.name == name
        assert i.family in {"cnn", "transformer", "rnn", "mlp"}
        assert i.description and "\n" not in i.description
        assert "batch" in i.sizes and "batch" in i.small_sizes
        assert set(i.sizes) == set(i.small_sizes)
        with pytest.raises(TypeError):
            i.sizes["batch"] = 1  # read-only
    assert zoo.info("nmt_4layer").family == "rnn"
    assert zoo.info("nmt_4layer").sizes["layers"] == 4
    assert zoo.info("resnet50").sizes["batch"] == 32
    assert zoo.info("inception_v3").sizes["image_size"] == 299


def test_unknown_model_lists_names():
    with pytest.raises(ModelError) as err:
        zoo.get("resnet51")
    for name in ALL:
        assert name in str(err.value)
    with pytest.raises(ModelError, match="nmt_4layer"):
        zoo.info("nope")


def test_unknown_size_keyword_lists_valid_ones():
    with pytest.raises(ModelError) as err:
        zoo.get("nmt_2layer", small=True, hiden=8)
    msg = str(err.value)
    assert "hiden" in msg
    for key in ("hidden", "layers", "vocab", "src_len", "tgt_len"):
        assert key in msg


@pytest.mark.parametrize("bad", [{"hidden": 0}, {"hidden": 2.5}, {"layers": 1}])
def test_bad_size_values(bad):
    with pytest.raises(ModelError):
        zoo.get("nmt_2layer", small=True, **bad)


def test_sizes_and_batch_override():
    fn, (variables, x, labels) = zoo.get("mlp", small=True, batch=3, hidden=7)
    assert x.shape == (3, zoo.info("mlp").small_sizes["in_features"])
    assert labels.shape == (3,)
    assert variables["params"]["layer_0"]["kernel"].shape[1] == 7
    _, (_, ids, _) = zoo.get("rnnlm", small=True, seq_len=6)
    assert ids.shape == (zoo.info("rnnlm").small_sizes["batch"], 6)
    with pytest.raises(ModelError):
        zoo.get("transformer", small=True, d_model=10, heads=3)


# ------------------------------------------------------------------------ trace and run


@pytest.mark.parametrize("training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("name", ALL)
def test_small_model_traces_and_runs(name, training):
    closed, expected, abstract_args = _small_trace(name, training)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(abstract_args))
    # small: a few MB at most
    assert sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract_args)) < 4e6

    _, args = zoo.get(name, small=True, training=training, abstract=False)
    assert _same_shapes(args, abstract_args)
    out = _run_jaxpr(closed, expected, args)
    assert _same_shapes(out, expected)
    assert _all_finite(out)
    variables = args[0]
    if not training:
        assert isinstance(out, jax.Array)
        return
    if name in BATCHNORM_MODELS:
        loss, grads, updates = out
        assert set(updates) == {"batch_stats"}
        assert _same_shapes(updates["batch_stats"], variables["batch_stats"])
    else:
        assert set(variables) == {"params"}
        loss, grads = out
    assert loss.shape == () and float(loss) > 0
    assert _same_shapes(grads, variables["params"])
    assert any(np.abs(np.asarray(g)).max() > 0 for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("name", [
    *DEFAULT_FAST,
    *(pytest.param(n, marks=pytest.mark.slow) for n in ALL if n not in DEFAULT_FAST)])
def test_default_size_traces_abstractly(name):
    fn, args = zoo.get(name)
    variables = args[0]
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(args))
    out = jax.eval_shape(fn, *args)
    assert out[0].shape == ()
    assert _same_shapes(out[1], variables["params"])
    assert args[1].shape[0] == zoo.info(name).sizes["batch"]


def test_default_sizes_match_the_papers():
    def count(name):
        _, args = zoo.get(name)
        return sum(x.size for x in jax.tree.leaves(args[0]["params"]))
    # ResNet-50: 25.6M parameters (He et al. 2016); Inception-V3 without the auxiliary
    # head: 23.8M (torchvision counts 27.2M with it); BERT-Base: 110M (Devlin et al.).
    assert abs(count("resnet50") - 25.56e6) < 0.05e6
    assert abs(count("inception_v3") - 23.8e6) < 0.1e6
    assert abs(count("bert_base") - 110e6) < 1e6
    _, (variables, images, labels) = zoo.get("inception_v3")
    assert images.shape == (32, 299, 299, 3) and labels.shape == (32,)


def test_inception_aux_head():
    fn, args = zoo.get("inception_v3", small=True, aux_head=True)
    assert "aux" in args[0]["params"]
    out = jax.eval_shape(fn, *args)
    assert _same_shapes(out[1], args[0]["params"])


# ------------------------------------------------------------------------- determinism


def test_seeded_values_are_deterministic():
    _, a = zoo.get("nmt_2layer", small=True, abstract=False, seed=3)
    _, b = zoo.get("nmt_2layer", small=True, abstract=False, seed=3)
    _, c = zoo.get("nmt_2layer", small=True, abstract=False, seed=4)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    ka = a[0]["params"]["encoder"]["layer_0"]["input"]["kernel"]
    kc = c[0]["params"]["encoder"]["layer_0"]["input"]["kernel"]
    assert not np.array_equal(np.asarray(ka), np.asarray(kc))
    assert not np.array_equal(np.asarray(a[1]), np.asarray(c[1]))  # the inputs too
    # Parameters follow flax's defaults: unit BatchNorm scales and variances, zero biases.
    _, (v, *_) = zoo.get("tiny_cnn", small=True, abstract=False)
    np.testing.assert_array_equal(np.asarray(v["params"]["block0_bn"]["scale"]), 1.0)
    np.testing.assert_array_equal(np.asarray(v["batch_stats"]["block0_bn"]["var"]), 1.0)
    np.testing.assert_array_equal(np.asarray(v["params"]["head"]["fc"]["bias"]), 0.0)


# -------------------------------------------------------------------------- module paths


def test_nmt_module_paths():
    stacks = _stacks("nmt_2layer")
    comps = _components(stacks)
    for c in ("jvp(NMT)", "embed", "source", "target", "encoder", "decoder", "layer_0",
              "layer_1", "attention", "softmax", "projection", "input", "recurrent"):
        assert c in comps, c
    assert "jvp(NMT)/encoder/layer_0/input" in stacks
    assert "jvp(NMT)/decoder/attention" in stacks
    assert "jvp(NMT)/softmax/projection" in stacks
    assert "transpose(jvp(NMT))/decoder/layer_1/recurrent" in stacks
    # Every top-level equation carries a module path.
    assert all(str(e.source_info.name_stack) for e in _small_jaxpr("nmt_2layer", True).eqns)
    inference = _stacks("nmt_2layer", training=False)
    assert "NMT/encoder/layer_1/input" in inference and "NMT/softmax/projection" in inference


def test_rnnlm_module_paths():
    stacks = _stacks("rnnlm")
    for s in ("jvp(RNNLM)/embed/table", "jvp(RNNLM)/layer_0/input",
              "jvp(RNNLM)/layer_1/recurrent", "jvp(RNNLM)/softmax/projection"):
        assert s in stacks, s


@pytest.mark.parametrize("name, paths", [
    ("resnet50", ["ResNet/stem/conv", "ResNet/stage1/block0/conv1",
                  "ResNet/stage2/block0/proj_conv", "ResNet/stage4/block2/bn3",
                  "ResNet/head/fc"]),
    ("inception_v3", ["InceptionV3/stem/conv_1a_3x3/conv", "InceptionV3/mixed_5b",
                      "InceptionV3/mixed_5d", "InceptionV3/mixed_6a", "InceptionV3/mixed_6e",
                      "InceptionV3/mixed_7a", "InceptionV3/mixed_7c/branch3x3dbl_3b/conv",
                      "InceptionV3/head/fc"]),
    ("bert_base", ["BERT/embed/word", "BERT/encoder/layer_1/attention/query",
                   "BERT/encoder/layer_0/ffn/intermediate", "BERT/head/transform"]),
    ("transformer", ["Transformer/embed/table", "Transformer/encoder/layer_1/self_attention",
                     "Transformer/decoder/layer_0/cross_attention/key", "Transformer/head"]),
    ("alexnet", ["AlexNet/conv1", "AlexNet/conv5", "AlexNet/fc7", "AlexNet/head/fc"]),
])
def test_module_paths(name, paths):
    stacks = _stacks(name, training=False)
    for p in paths:
        assert any(s == p or s.startswith(p + "/") for s in stacks), p


def test_module_paths_survive_named_call_off():
    # flax names module scopes only while named_call is on (config flax_profile, on by
    # default); the zoo switches it on itself, so a caller who turned it off still gets
    # module paths.
    fn, args = zoo.get("rnnlm", small=True, training=False)
    with nn.override_named_call(False):
        jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    assert "RNNLM/layer_1/input" in {s for s, _ in _eqns(jaxpr)}


# ---------------------------------------------------------------------------- unrolling


@pytest.mark.parametrize("name", ALL)
def test_no_loops_in_any_model(name):
    prims = {e.primitive.name for _, e in _eqns(_small_jaxpr(name, True))}
    assert not prims & {"scan", "while", "fori_loop"}, prims


def test_lstm_is_unrolled_with_shared_weights():
    sizes = zoo.info("nmt_4layer").small_sizes
    fn, args = zoo.get("nmt_4layer", small=True, training=False)
    params = args[0]["params"]
    # One parameter set per layer, whatever the number of steps.
    assert sorted(params["encoder"]) == [f"layer_{i}" for i in range(4)]
    assert sorted(params["decoder"]) == ["attention"] + [f"layer_{i}" for i in range(4)]
    hidden = sizes["hidden"]
    assert params["encoder"]["layer_0"]["input"]["kernel"].shape == (hidden, 4 * hidden)
    assert params["encoder"]["layer_0"]["recurrent"]["kernel"].shape == (hidden, 4 * hidden)
    # Decoder layers above the bottom take [output below, attention context].
    assert params["decoder"]["layer_1"]["input"]["kernel"].shape == (2 * hidden, 4 * hidden)
    # One input matmul per time step.
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    dots = [s for s, e in _eqns(jaxpr) if e.primitive.name == "dot_general"]
    assert dots.count("NMT/encoder/layer_3/input") == sizes["src_len"]
    assert dots.count("NMT/decoder/layer_2/recurrent") == sizes["tgt_len"]
    assert dots.count("NMT/softmax/projection") == sizes["tgt_len"]

"""The benchmark model zoo: the seed papers' models as JAX training steps or inference.

``get(name)`` returns ``(fn, example_args)`` with ``fn(variables, *inputs)``; the first
argument is always the model's variables (``{"params": ...}``, plus ``"batch_stats"``
for BatchNorm models), so ``param_argnums=(0,)`` attributes the parameters.

* ``training=True``: ``fn`` is one training step without the optimizer update: it
  returns ``(loss, grads)``, ``grads`` shaped as ``variables["params"]``; BatchNorm
  models run in training mode and return ``(loss, grads, updates)``, ``updates`` being
  ``{"batch_stats": ...}`` with the new running statistics. Inputs: the features, then
  the labels.
* ``training=False``: inference; ``fn`` returns the model's outputs (logits). Inputs:
  the features only.

Families: ``cnn`` (resnet50, inception_v3, alexnet, tiny_cnn), ``transformer``
(bert_base, bert_large, transformer), ``rnn`` (nmt_2layer, nmt_4layer, nmt_8layer,
rnnlm), ``mlp`` (mlp). The module docstrings of ``simplace.zoo.cnn``, ``.transformer``,
``.rnn`` and ``.mlp`` list each model's module paths, which every traced op carries in
its name stack (flax runs each module method under ``jax.named_scope``; ``get`` turns
that on explicitly with ``flax.linen.override_named_call`` so it holds even when the
``flax_profile`` config flag is off). Two things a reader of name stacks meets:
``jnp.einsum`` adds its subscripts as one more component
(``.../attention/bqhd,bkhd->bhqk``), and the equations inside a nested jaxpr (a
``pjit`` such as ``jnp.take``'s) carry stacks relative to the equation that holds it.
The default sizes and their sources are in the registries of the family modules.
"""

from __future__ import annotations

import types
import zlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from simplace.errors import ModelError
from simplace.zoo import cnn, mlp, rnn, transformer
from simplace.zoo._base import Built, InputSpec, ModelInfo, ModelSpec

__all__ = ["ModelInfo", "get", "info", "names"]

def _collect() -> dict[str, ModelSpec]:
    registry: dict[str, ModelSpec] = {}
    for family in (cnn, transformer, rnn, mlp):
        for name, spec in family.MODELS.items():
            assert name not in registry, name
            i = spec.info
            # Read-only copies of the size presets: callers cannot change the zoo.
            registry[name] = ModelSpec(
                ModelInfo(i.name, i.family, i.description,
                          types.MappingProxyType(dict(i.sizes)),
                          types.MappingProxyType(dict(i.small_sizes))),
                spec.build)
    return registry


_REGISTRY = _collect()


def names() -> list[str]:
    """The zoo's model names, sorted."""
    return sorted(_REGISTRY)


def _spec(name: str) -> ModelSpec:
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ModelError(f"Unknown model {name!r}. The zoo has: {', '.join(names())}.") from None


def info(name: str) -> ModelInfo:
    """Name, family, one-line description and default (and small) sizes of a model."""
    return _spec(name).info


def _resolve_sizes(spec: ModelSpec, batch: int | None, small: bool,
                   overrides: dict[str, Any]) -> dict[str, Any]:
    defaults = spec.info.small_sizes if small else spec.info.sizes
    valid = sorted(k for k in defaults if k != "batch")
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise ModelError(
            f"{spec.info.name}: unknown size keyword(s) {', '.join(unknown)}. Valid ones: "
            f"{', '.join(valid)} (and the batch= argument).")
    sizes = {**defaults, **overrides}
    if batch is not None:
        sizes["batch"] = batch
    for key, value in sizes.items():
        default = defaults[key]
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        else:
            ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        if not ok:
            kind = type(default).__name__
            raise ModelError(f"{spec.info.name}: size {key}={value!r} must be a "
                             f"{'positive ' if kind != 'bool' else ''}{kind}.")
    return sizes


def _structs(specs: tuple[InputSpec, ...]) -> tuple[jax.ShapeDtypeStruct, ...]:
    return tuple(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in specs)


def _leaf_rng(seed: int, path: str) -> np.random.Generator:
    # Seeded by (seed, leaf path): a leaf's values do not depend on the other leaves.
    return np.random.default_rng([seed % 2**64, zlib.crc32(path.encode())])


def _init_leaf(seed: int, path: str, leaf: jax.ShapeDtypeStruct) -> np.ndarray:
    """A parameter or statistic drawn as flax's default initialisers draw it.

    LeCun-normal kernels (std 1/sqrt(fan_in), flax's Dense/Conv default), embeddings
    with std 1/sqrt(features) (flax's Embed default), zero biases and means, unit scales
    and variances.
    """
    name = path.rsplit("/", 1)[-1]
    shape, dtype = leaf.shape, leaf.dtype
    if name in ("bias", "mean"):
        return np.zeros(shape, dtype)
    if name in ("scale", "var"):
        return np.ones(shape, dtype)
    if name == "embedding":
        fan_in = shape[-1]
    else:
        fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else shape[0]
    values = _leaf_rng(seed, path).standard_normal(shape, dtype=np.float32)
    return (values / np.float32(np.sqrt(max(fan_in, 1)))).astype(dtype)


def _concrete_variables(abstract_vars, seed: int):
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract_vars)
    leaves = []
    for keypath, leaf in flat:
        path = "/".join(str(getattr(k, "key", k)) for k in keypath)
        leaves.append(jnp.asarray(_init_leaf(seed, path, leaf)))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _concrete_inputs(specs: tuple[InputSpec, ...], seed: int) -> tuple[jax.Array, ...]:
    out = []
    for s in specs:
        rng = _leaf_rng(seed, "inputs/" + s.name)
        if s.high is not None:
            out.append(jnp.asarray(rng.integers(0, s.high, s.shape), s.dtype))
        else:
            out.append(jnp.asarray(rng.standard_normal(s.shape, dtype=np.float32), s.dtype))
    return tuple(out)


def _make_fn(name: str, model: nn.Module, training: bool, stateful: tuple[str, ...]):
    if not training:
        def inference(variables, *features):
            with nn.override_named_call(True):
                return model.apply(variables, *features, train=False)
        fn = inference
    else:
        def train_step(variables, *inputs):
            *features, labels = inputs
            state = {k: variables[k] for k in stateful}

            def loss_fn(params):
                if not stateful:
                    return model.apply({"params": params}, *features, labels=labels,
                                       train=True), None
                return model.apply({"params": params, **state}, *features, labels=labels,
                                   train=True, mutable=list(stateful))

            with nn.override_named_call(True):
                (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                    variables["params"])
            return (loss, grads, updates) if stateful else (loss, grads)
        fn = train_step
    fn.__name__ = fn.__qualname__ = f"{name}_{fn.__name__}"
    return fn


def get(name: str, *, training: bool = True, batch: int | None = None, small: bool = False,
        abstract: bool = True, seed: int = 0, **sizes: Any):
    """``(fn, example_args)`` of a zoo model; ``example_args = (variables, *inputs)``.

    ``batch=None`` takes the model's default batch; ``small=True`` the tiny preset (a
    few MB, for tests); ``sizes`` override single sizes (see ``info(name).sizes``).
    ``abstract=True`` gives ``jax.ShapeDtypeStruct`` leaves (nothing is allocated);
    ``abstract=False`` gives real arrays, parameters and inputs drawn from ``seed`` with
    numpy (flax's default initialiser distributions, the same values on every platform).
    Raises ModelError for an unknown name, size keyword or size value.
    """
    spec = _spec(name)
    resolved = _resolve_sizes(spec, batch, small, sizes)
    built: Built = spec.build(resolved)
    model = built.module
    inputs = built.features + ((built.labels,) if training else ())
    init_inputs = built.features + (built.labels,)

    def init(key, *args):
        # Initialise through the training path so that every parameter exists (the
        # optional Inception auxiliary head is built only there).
        *features, labels = args
        with nn.override_named_call(True):
            return model.init({"params": key}, *features, labels=labels, train=True)

    variables = dict(jax.eval_shape(init, jax.random.key(seed), *_structs(init_inputs)))
    if abstract:
        example_inputs = _structs(inputs)
    else:
        # Values are drawn with numpy, leaf by leaf, not by running flax's init: that
        # would compile the model and its threefry RNG (about a minute for Inception-V3
        # on 2 CPU cores, eager or jitted); numpy takes milliseconds and gives the same
        # values on every platform.
        variables = _concrete_variables(variables, seed)
        example_inputs = _concrete_inputs(inputs, seed)
    stateful = tuple(sorted(k for k in variables if k != "params"))
    fn = _make_fn(name, model, training, stateful)
    return fn, (variables, *example_inputs)

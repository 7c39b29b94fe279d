"""Shared pieces of the zoo: model records, input specs, the loss, the classifier head."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import optax

from simplace.errors import ModelError


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What the zoo knows about one model without building it.

    ``sizes`` are the default sizes (``batch`` included) and ``small_sizes`` the tiny
    preset that ``get(..., small=True)`` uses; both are read-only mappings.
    """

    name: str
    family: str
    description: str
    sizes: Mapping[str, Any]
    small_sizes: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One model input: shape, dtype, and for integer inputs the exclusive upper bound
    of the values drawn for concrete example inputs (token ids, class labels)."""

    name: str
    shape: tuple[int, ...]
    dtype: Any
    high: int | None = None


@dataclasses.dataclass(frozen=True)
class Built:
    """A model built at given sizes: the flax module and its inputs.

    The module is called as ``module.apply(variables, *features, labels=..., train=...)``
    and returns the scalar training loss when ``labels`` is given, else its outputs.
    """

    module: nn.Module
    features: tuple[InputSpec, ...]
    labels: InputSpec


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A zoo entry: its info and a function from a full sizes dict to a ``Built``."""

    info: ModelInfo
    build: Callable[[dict[str, Any]], Built]


def require(cond: bool, name: str, msg: str) -> None:
    """Raise ModelError for model ``name`` unless ``cond`` holds."""
    if not cond:
        raise ModelError(f"{name}: {msg}")


def cross_entropy(logits, labels):
    """Mean softmax cross-entropy of integer labels (optax's stable log-softmax form)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


class ClassifierHead(nn.Module):
    """Optional global average pool, the final dense layer ``fc``, and the loss."""

    num_classes: int
    pool: bool = False

    @nn.compact
    def __call__(self, x, labels=None):
        if self.pool:
            x = jnp.mean(x, axis=(1, 2))  # NHWC global average pool
        x = x.reshape(x.shape[0], -1)
        logits = nn.Dense(self.num_classes, name="fc")(x)
        return logits if labels is None else cross_entropy(logits, labels)

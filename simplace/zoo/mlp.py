"""Multi-layer perceptron (for tests and as the simplest placement problem).

Module paths: ``MLP/layer_{i}`` (dense + ReLU), ``MLP/head/fc`` (logits, loss).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from simplace.zoo._base import Built, ClassifierHead, InputSpec, ModelInfo, ModelSpec, require


class MLP(nn.Module):
    """``layers`` dense+ReLU layers and a classifier head."""

    layers: int
    hidden: int
    num_classes: int

    @nn.compact
    def __call__(self, x, labels=None, train: bool = False):
        del train
        for i in range(self.layers):
            x = nn.relu(nn.Dense(self.hidden, name=f"layer_{i}")(x))
        return ClassifierHead(self.num_classes, name="head")(x, labels)


def _build_mlp(s: dict) -> Built:
    require(s["layers"] >= 0, "mlp", "layers must be >= 0")
    n = s["batch"]
    features = (InputSpec("x", (n, s["in_features"]), jnp.float32),)
    labels = InputSpec("labels", (n,), jnp.int32, high=s["num_classes"])
    return Built(MLP(s["layers"], s["hidden"], s["num_classes"]), features, labels)


MODELS: dict[str, ModelSpec] = {
    "mlp": ModelSpec(ModelInfo(
        "mlp", "mlp",
        "MLP on flattened 28x28 images (for tests)",
        # 784 = 28x28 MNIST-sized inputs, 10 classes.
        {"batch": 64, "in_features": 784, "hidden": 512, "layers": 3, "num_classes": 10},
        {"batch": 4, "in_features": 16, "hidden": 16, "layers": 2, "num_classes": 10},
    ), _build_mlp),
}

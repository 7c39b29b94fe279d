"""Models outside the zoo, for fidelity on graphs the calibration never saw.

Each factory returns ``(fn, (variables, *inputs))`` with real arrays (numpy draws, seeded),
the training step's loss and gradients, as ``simplace`` takes a ``file.py:factory``:

    PYTHONPATH=. python bench/fidelity_real.py --models bench/data/unseen_models.py:mixer:16

* ``mixer``: an MLP-Mixer (token-mixing and channel-mixing MLPs over image patches,
  layer norm, GELU): matmuls and transposes, no convolution;
* ``unet``: a small U-Net (strided convolutions down, transposed convolutions up, skip
  concatenations, group norm): convolutions of changing shapes.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


class _MixerBlock(nn.Module):
    tokens: int
    channels: int

    @nn.compact
    def __call__(self, x):
        y = nn.LayerNorm()(x).swapaxes(1, 2)
        y = nn.Dense(self.tokens * 2)(y)
        y = nn.Dense(self.tokens)(nn.gelu(y)).swapaxes(1, 2)
        x = x + y
        y = nn.Dense(self.channels * 4)(nn.LayerNorm()(x))
        return x + nn.Dense(self.channels)(nn.gelu(y))


class _Mixer(nn.Module):
    patch: int = 8
    channels: int = 256
    depth: int = 6
    classes: int = 100

    @nn.compact
    def __call__(self, images):
        x = nn.Conv(self.channels, (self.patch, self.patch), strides=self.patch)(images)
        b, h, w, c = x.shape
        x = x.reshape(b, h * w, c)
        for _ in range(self.depth):
            x = _MixerBlock(h * w, c)(x)
        return nn.Dense(self.classes)(nn.LayerNorm()(x).mean(axis=1))


class _Down(nn.Module):
    features: int

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.GroupNorm(8)(nn.Conv(self.features, (3, 3))(x)))
        return x, nn.Conv(self.features, (3, 3), strides=2)(x)


class _UNet(nn.Module):
    widths: tuple = (32, 64, 128)
    classes: int = 4

    @nn.compact
    def __call__(self, images):
        skips, x = [], images
        for w in self.widths:
            s, x = _Down(w)(x)
            skips.append(s)
        x = nn.relu(nn.Conv(self.widths[-1] * 2, (3, 3))(x))
        for w, s in zip(reversed(self.widths), reversed(skips), strict=True):
            x = nn.ConvTranspose(w, (2, 2), strides=(2, 2))(x)
            x = jnp.concatenate([x, s], axis=-1)
            x = nn.relu(nn.GroupNorm(8)(nn.Conv(w, (3, 3))(x)))
        return nn.Conv(self.classes, (1, 1))(x)


def _training_step(model, images, labels, loss):
    def step(variables, images, labels):
        def objective(params):
            return loss(model.apply({"params": params}, images), labels)

        value, grads = jax.value_and_grad(objective)(variables["params"])
        return value, grads

    shapes = jax.eval_shape(model.init, jax.random.key(0), images)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: (rng.standard_normal(s.shape) * 0.02).astype(s.dtype),
                          shapes)
    return step, (params, images, labels)


def mixer(batch: int = 16, training: bool = True):
    """An MLP-Mixer on 64x64 images, 64 patches, 6 blocks of 256 channels."""
    rng = np.random.default_rng(1)
    images = rng.standard_normal((batch, 64, 64, 3)).astype(np.float32)
    labels = rng.integers(0, 100, batch).astype(np.int32)

    def loss(logits, labels):
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

    return _training_step(_Mixer(), images, labels, loss)


def unet(batch: int = 4, training: bool = True):
    """A three-level U-Net segmenting 128x128 images into 4 classes."""
    rng = np.random.default_rng(2)
    images = rng.standard_normal((batch, 128, 128, 3)).astype(np.float32)
    labels = rng.integers(0, 4, (batch, 128, 128)).astype(np.int32)

    def loss(logits, labels):
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], -1))

    return _training_step(_UNet(), images, labels, loss)

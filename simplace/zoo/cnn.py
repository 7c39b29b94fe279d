"""Convolutional networks: ResNet-50 (v1.5), Inception-V3, AlexNet and a tiny CNN.

Images are NHWC float32; every model ends in ``head`` (global pool where the paper has
one, the final dense layer ``fc``, and the softmax cross-entropy in training mode).
Dropout is left out everywhere: it is a cheap elementwise mask and would need an RNG
input. Module paths (the name stacks an expert placer pattern-matches; the backward
pass carries the same paths inside ``transpose(jvp(...))``):

``resnet50``::

    ResNet/stem/{conv,bn}                         7x7/2 conv, BN, ReLU, 3x3/2 max pool
    ResNet/stage{1..4}/block{j}/{conv1,bn1,conv2,bn2,conv3,bn3}
    ResNet/stage{s}/block0/{proj_conv,proj_bn}    projection shortcut (first block)
    ResNet/head/fc                                pool, 1000-way dense, loss

  Stages are numbered 1-4 and blocks from 0, as torchvision's ``layer1.0``; blocks per
  stage (3, 4, 6, 3). v1.5: the stride of a downsampling block is on its 3x3 conv.

``inception_v3`` (block names as TF-slim / torchvision)::

    InceptionV3/stem/{conv_1a_3x3, conv_2a_3x3, conv_2b_3x3, conv_3b_1x1, conv_4a_3x3}
    InceptionV3/mixed_5{b,c,d}/...                InceptionA (35x35)
    InceptionV3/mixed_6a/...                      InceptionB (grid reduction to 17x17)
    InceptionV3/mixed_6{b,c,d,e}/...              InceptionC (factorised 7x7)
    InceptionV3/mixed_7a/...                      InceptionD (grid reduction to 8x8)
    InceptionV3/mixed_7{b,c}/...                  InceptionE (expanded filter bank)
    InceptionV3/aux/...                           auxiliary head (only if aux_head=True)
    InceptionV3/head/fc

  Inside a block each branch has its own conv: ``branch1x1``, ``branch5x5_1``,
  ``branch3x3dbl_2``, ``branch7x7_3``, ``branch_pool``..., each ``{conv, bn}``.

``alexnet`` (single-tower, "one weird trick" variant as torchvision)::

    AlexNet/conv{1..5}, AlexNet/fc6, AlexNet/fc7, AlexNet/head/fc

``tiny_cnn``::

    TinyCNN/block{0,1}_conv, TinyCNN/block{0,1}_bn, TinyCNN/head/fc
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax.numpy as jnp

from simplace.zoo._base import Built, ClassifierHead, InputSpec, ModelInfo, ModelSpec, require

# ------------------------------------------------------------------------------ common


def _image_inputs(s: dict) -> tuple[tuple[InputSpec, ...], InputSpec]:
    n, hw = s["batch"], s["image_size"]
    images = InputSpec("images", (n, hw, hw, 3), jnp.float32)
    return (images,), InputSpec("labels", (n,), jnp.int32, high=s["num_classes"])


def _max_pool(x, window, stride, pad=0):
    return nn.max_pool(x, (window, window), (stride, stride), ((pad, pad), (pad, pad)))


def _avg_pool(x, window, stride, pad=0):
    # count_include_pad=True (flax's default) matches the TF/torch Inception reference.
    return nn.avg_pool(x, (window, window), (stride, stride), ((pad, pad), (pad, pad)))


# ------------------------------------------------------------------------------ ResNet


def _resnet_bn(train: bool, name: str, **kw) -> nn.BatchNorm:
    # momentum 0.9, epsilon 1e-5: the TF official / MLPerf ResNet-50 v1.5 values.
    return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                        name=name, **kw)


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 -> 3x3 (carries the stride) -> 1x1 (4x wider)."""

    width: int
    strides: int = 1

    @nn.compact
    def __call__(self, x, train: bool):
        out = 4 * self.width  # expansion 4 (He et al. 2016, Table 1)
        y = nn.Conv(self.width, (1, 1), use_bias=False, name="conv1")(x)
        y = nn.relu(_resnet_bn(train, "bn1")(y))
        y = nn.Conv(self.width, (3, 3), (self.strides, self.strides), padding=((1, 1), (1, 1)),
                    use_bias=False, name="conv2")(y)
        y = nn.relu(_resnet_bn(train, "bn2")(y))
        y = nn.Conv(out, (1, 1), use_bias=False, name="conv3")(y)
        y = _resnet_bn(train, "bn3")(y)
        if x.shape[-1] != out or self.strides != 1:
            x = nn.Conv(out, (1, 1), (self.strides, self.strides), use_bias=False,
                        name="proj_conv")(x)
            x = _resnet_bn(train, "proj_bn")(x)
        return nn.relu(x + y)


class ResNetStage(nn.Module):
    """``blocks`` bottlenecks; the first one downsamples by ``strides``."""

    width: int
    blocks: int
    strides: int

    @nn.compact
    def __call__(self, x, train: bool):
        for j in range(self.blocks):
            x = Bottleneck(self.width, self.strides if j == 0 else 1, name=f"block{j}")(x, train)
        return x


class ResNetStem(nn.Module):
    """7x7/2 convolution, BatchNorm, ReLU, 3x3/2 max pool."""

    width: int

    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Conv(self.width, (7, 7), (2, 2), padding=((3, 3), (3, 3)), use_bias=False,
                    name="conv")(x)
        x = nn.relu(_resnet_bn(train, "bn")(x))
        return _max_pool(x, 3, 2, pad=1)


class ResNet(nn.Module):
    """ResNet v1.5 (He et al. 2016 with the stride on the 3x3 conv, as NVIDIA/MLPerf)."""

    stage_sizes: tuple[int, ...]
    width: int
    num_classes: int

    @nn.compact
    def __call__(self, images, labels=None, train: bool = False):
        x = ResNetStem(self.width, name="stem")(images, train)
        for i, blocks in enumerate(self.stage_sizes):
            # stage i has bottleneck width width * 2^i; stages after the first halve H, W.
            x = ResNetStage(self.width * 2**i, blocks, 1 if i == 0 else 2,
                            name=f"stage{i + 1}")(x, train)
        return ClassifierHead(self.num_classes, pool=True, name="head")(x, labels)


def _build_resnet(s: dict) -> Built:
    require(s["image_size"] >= 32, "resnet50", "image_size must be at least 32")
    features, labels = _image_inputs(s)
    # (3, 4, 6, 3) bottlenecks per stage: ResNet-50, He et al. 2016, Table 1.
    return Built(ResNet((3, 4, 6, 3), s["width"], s["num_classes"]), features, labels)


# --------------------------------------------------------------------------- Inception


class ConvBN(nn.Module):
    """Inception's BasicConv2d: conv without bias, BatchNorm (eps 1e-3), ReLU."""

    features: int
    kernel: tuple[int, int]
    strides: int = 1
    padding: tuple[int, int] = (0, 0)

    @nn.compact
    def __call__(self, x, train: bool):
        ph, pw = self.padding
        x = nn.Conv(self.features, self.kernel, (self.strides, self.strides),
                    padding=((ph, ph), (pw, pw)), use_bias=False, name="conv")(x)
        # epsilon 0.001 as the TF-slim / torchvision Inception-V3 reference.
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-3,
                         name="bn")(x)
        return nn.relu(x)


class _InceptionBlock(nn.Module):
    """Base: ``self.c(n)`` scales a channel count of the paper by ``width``."""

    width: float

    def c(self, n: int) -> int:
        return max(1, round(n * self.width))

    def conv(self, name, n, kernel, strides=1, padding=(0, 0)):
        return ConvBN(self.c(n), kernel, strides, padding, name=name)


# Channel counts below are those of Szegedy et al. 2016 as released in TF-slim's
# inception_v3.py (and torchvision's port), block by block.


class InceptionA(_InceptionBlock):
    """35x35 block: 1x1, 5x5, double 3x3 and pool branches."""

    pool_features: int = 32

    @nn.compact
    def __call__(self, x, train: bool):
        b1 = self.conv("branch1x1", 64, (1, 1))(x, train)
        b5 = self.conv("branch5x5_1", 48, (1, 1))(x, train)
        b5 = self.conv("branch5x5_2", 64, (5, 5), padding=(2, 2))(b5, train)
        b3 = self.conv("branch3x3dbl_1", 64, (1, 1))(x, train)
        b3 = self.conv("branch3x3dbl_2", 96, (3, 3), padding=(1, 1))(b3, train)
        b3 = self.conv("branch3x3dbl_3", 96, (3, 3), padding=(1, 1))(b3, train)
        bp = self.conv("branch_pool", self.pool_features, (1, 1))(_avg_pool(x, 3, 1, 1), train)
        return jnp.concatenate([b1, b5, b3, bp], axis=-1)


class InceptionB(_InceptionBlock):
    """Grid reduction 35x35 -> 17x17."""

    @nn.compact
    def __call__(self, x, train: bool):
        b3 = self.conv("branch3x3", 384, (3, 3), strides=2)(x, train)
        bd = self.conv("branch3x3dbl_1", 64, (1, 1))(x, train)
        bd = self.conv("branch3x3dbl_2", 96, (3, 3), padding=(1, 1))(bd, train)
        bd = self.conv("branch3x3dbl_3", 96, (3, 3), strides=2)(bd, train)
        return jnp.concatenate([b3, bd, _max_pool(x, 3, 2)], axis=-1)


class InceptionC(_InceptionBlock):
    """17x17 block with 7x7 convolutions factorised into 1x7 and 7x1."""

    channels_7x7: int = 128

    @nn.compact
    def __call__(self, x, train: bool):
        c7 = self.channels_7x7
        b1 = self.conv("branch1x1", 192, (1, 1))(x, train)
        b7 = self.conv("branch7x7_1", c7, (1, 1))(x, train)
        b7 = self.conv("branch7x7_2", c7, (1, 7), padding=(0, 3))(b7, train)
        b7 = self.conv("branch7x7_3", 192, (7, 1), padding=(3, 0))(b7, train)
        bd = self.conv("branch7x7dbl_1", c7, (1, 1))(x, train)
        bd = self.conv("branch7x7dbl_2", c7, (7, 1), padding=(3, 0))(bd, train)
        bd = self.conv("branch7x7dbl_3", c7, (1, 7), padding=(0, 3))(bd, train)
        bd = self.conv("branch7x7dbl_4", c7, (7, 1), padding=(3, 0))(bd, train)
        bd = self.conv("branch7x7dbl_5", 192, (1, 7), padding=(0, 3))(bd, train)
        bp = self.conv("branch_pool", 192, (1, 1))(_avg_pool(x, 3, 1, 1), train)
        return jnp.concatenate([b1, b7, bd, bp], axis=-1)


class InceptionD(_InceptionBlock):
    """Grid reduction 17x17 -> 8x8."""

    @nn.compact
    def __call__(self, x, train: bool):
        b3 = self.conv("branch3x3_1", 192, (1, 1))(x, train)
        b3 = self.conv("branch3x3_2", 320, (3, 3), strides=2)(b3, train)
        b7 = self.conv("branch7x7x3_1", 192, (1, 1))(x, train)
        b7 = self.conv("branch7x7x3_2", 192, (1, 7), padding=(0, 3))(b7, train)
        b7 = self.conv("branch7x7x3_3", 192, (7, 1), padding=(3, 0))(b7, train)
        b7 = self.conv("branch7x7x3_4", 192, (3, 3), strides=2)(b7, train)
        return jnp.concatenate([b3, b7, _max_pool(x, 3, 2)], axis=-1)


class InceptionE(_InceptionBlock):
    """8x8 block with expanded filter banks (parallel 1x3 and 3x1)."""

    @nn.compact
    def __call__(self, x, train: bool):
        b1 = self.conv("branch1x1", 320, (1, 1))(x, train)
        b3 = self.conv("branch3x3_1", 384, (1, 1))(x, train)
        b3 = jnp.concatenate([
            self.conv("branch3x3_2a", 384, (1, 3), padding=(0, 1))(b3, train),
            self.conv("branch3x3_2b", 384, (3, 1), padding=(1, 0))(b3, train)], axis=-1)
        bd = self.conv("branch3x3dbl_1", 448, (1, 1))(x, train)
        bd = self.conv("branch3x3dbl_2", 384, (3, 3), padding=(1, 1))(bd, train)
        bd = jnp.concatenate([
            self.conv("branch3x3dbl_3a", 384, (1, 3), padding=(0, 1))(bd, train),
            self.conv("branch3x3dbl_3b", 384, (3, 1), padding=(1, 0))(bd, train)], axis=-1)
        bp = self.conv("branch_pool", 192, (1, 1))(_avg_pool(x, 3, 1, 1), train)
        return jnp.concatenate([b1, b3, bd, bp], axis=-1)


class InceptionStem(_InceptionBlock):
    """299x299x3 -> 35x35x192: five convolutions and two max pools."""

    @nn.compact
    def __call__(self, x, train: bool):
        x = self.conv("conv_1a_3x3", 32, (3, 3), strides=2)(x, train)
        x = self.conv("conv_2a_3x3", 32, (3, 3))(x, train)
        x = self.conv("conv_2b_3x3", 64, (3, 3), padding=(1, 1))(x, train)
        x = _max_pool(x, 3, 2)
        x = self.conv("conv_3b_1x1", 80, (1, 1))(x, train)
        x = self.conv("conv_4a_3x3", 192, (3, 3))(x, train)
        return _max_pool(x, 3, 2)


class InceptionAux(_InceptionBlock):
    """Auxiliary classifier on the 17x17 grid (after mixed_6e)."""

    num_classes: int = 1000

    @nn.compact
    def __call__(self, x, labels, train: bool):
        x = _avg_pool(x, 5, 3)
        x = self.conv("conv0", 128, (1, 1))(x, train)
        x = self.conv("conv1", 768, (5, 5))(x, train)
        return ClassifierHead(self.num_classes, pool=True, name="head")(x, labels)


class InceptionV3(nn.Module):
    """Inception-V3 (Szegedy et al. 2016): stem, 3xA, B, 4xC, D, 2xE, head."""

    width: float
    num_classes: int
    aux_head: bool = False

    @nn.compact
    def __call__(self, images, labels=None, train: bool = False):
        w = self.width
        x = InceptionStem(w, name="stem")(images, train)
        for name, pool in (("mixed_5b", 32), ("mixed_5c", 64), ("mixed_5d", 64)):
            x = InceptionA(w, pool, name=name)(x, train)
        x = InceptionB(w, name="mixed_6a")(x, train)
        for name, c7 in (("mixed_6b", 128), ("mixed_6c", 160), ("mixed_6d", 160),
                         ("mixed_6e", 192)):
            x = InceptionC(w, c7, name=name)(x, train)
        aux_loss = None
        if self.aux_head and train and labels is not None:
            aux_loss = InceptionAux(w, self.num_classes, name="aux")(x, labels, train)
        x = InceptionD(w, name="mixed_7a")(x, train)
        x = InceptionE(w, name="mixed_7b")(x, train)
        x = InceptionE(w, name="mixed_7c")(x, train)
        out = ClassifierHead(self.num_classes, pool=True, name="head")(x, labels)
        if aux_loss is not None:
            out = out + 0.4 * aux_loss  # auxiliary loss weight 0.4 (torchvision reference)
        return out


def _build_inception(s: dict) -> Built:
    # Smallest input whose valid convs and pools still leave a 1x1 grid at mixed_7c
    # (the same bound torchvision enforces).
    require(s["image_size"] >= 75, "inception_v3", "image_size must be at least 75")
    require(s["width"] > 0, "inception_v3", "width must be positive")
    features, labels = _image_inputs(s)
    model = InceptionV3(float(s["width"]), s["num_classes"], bool(s["aux_head"]))
    return Built(model, features, labels)


# ----------------------------------------------------------------------------- AlexNet


class AlexNet(nn.Module):
    """Single-tower AlexNet (Krizhevsky 2014, "One weird trick"; torchvision's layout)."""

    width: int
    hidden: int
    num_classes: int

    @nn.compact
    def __call__(self, images, labels=None, train: bool = False):
        del train  # no BatchNorm; dropout is omitted
        w = self.width
        conv = functools.partial(nn.Conv, padding="SAME")
        x = nn.relu(nn.Conv(w, (11, 11), (4, 4), padding=((2, 2), (2, 2)), name="conv1")(images))
        x = _max_pool(x, 3, 2)
        # conv channels 64, 192, 384, 256, 256 = width x (1, 3, 6, 4, 4)
        x = nn.relu(conv(3 * w, (5, 5), name="conv2")(x))
        x = _max_pool(x, 3, 2)
        x = nn.relu(conv(6 * w, (3, 3), name="conv3")(x))
        x = nn.relu(conv(4 * w, (3, 3), name="conv4")(x))
        x = nn.relu(conv(4 * w, (3, 3), name="conv5")(x))
        x = _max_pool(x, 3, 2)
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(self.hidden, name="fc6")(x))
        x = nn.relu(nn.Dense(self.hidden, name="fc7")(x))
        return ClassifierHead(self.num_classes, name="head")(x, labels)


def _build_alexnet(s: dict) -> Built:
    # conv1 (11x11/4), three 3x3/2 max pools: 63 is the smallest size leaving 1x1.
    require(s["image_size"] >= 63, "alexnet", "image_size must be at least 63")
    features, labels = _image_inputs(s)
    return Built(AlexNet(s["width"], s["hidden"], s["num_classes"]), features, labels)


# ---------------------------------------------------------------------------- tiny CNN


class TinyCNN(nn.Module):
    """Two conv-BN-ReLU blocks with 2x2 max pools, and a dense head (for tests)."""

    width: int
    num_classes: int

    @nn.compact
    def __call__(self, images, labels=None, train: bool = False):
        x = images
        for i in range(2):
            blk = f"block{i}"
            x = nn.Conv(self.width * 2**i, (3, 3), padding="SAME", use_bias=False,
                        name=f"{blk}_conv")(x)
            x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9,
                                     name=f"{blk}_bn")(x))
            x = _max_pool(x, 2, 2)
        return ClassifierHead(self.num_classes, pool=True, name="head")(x, labels)


def _build_tiny_cnn(s: dict) -> Built:
    require(s["image_size"] >= 4, "tiny_cnn", "image_size must be at least 4")
    features, labels = _image_inputs(s)
    return Built(TinyCNN(s["width"], s["num_classes"]), features, labels)


# ---------------------------------------------------------------------------- registry

MODELS: dict[str, ModelSpec] = {
    "resnet50": ModelSpec(ModelInfo(
        "resnet50", "cnn",
        "ResNet-50 v1.5 (He et al. 2016), ImageNet 224x224, BatchNorm",
        # batch 32: the per-GPU batch of the seed papers' CNN benchmarks; width 64 is
        # the stem / first-stage bottleneck width of ResNet-50 (He et al. 2016, Table 1).
        {"batch": 32, "image_size": 224, "num_classes": 1000, "width": 64},
        {"batch": 2, "image_size": 32, "num_classes": 10, "width": 4},
    ), _build_resnet),
    "inception_v3": ModelSpec(ModelInfo(
        "inception_v3", "cnn",
        "Inception-V3 (Szegedy et al. 2016), 299x299, stem/3A/B/4C/D/2E, BatchNorm",
        # batch 32 at 299x299 as in the seed papers' Inception-V3 runs (ColocRL 2017,
        # hierarchical placer 2018); width multiplies every channel count (1 = paper).
        {"batch": 32, "image_size": 299, "num_classes": 1000, "width": 1.0,
         "aux_head": False},
        {"batch": 2, "image_size": 75, "num_classes": 10, "width": 0.0625, "aux_head": False},
    ), _build_inception),
    "alexnet": ModelSpec(ModelInfo(
        "alexnet", "cnn",
        "AlexNet, single tower (Krizhevsky 2014), 224x224 (PaSE benchmark)",
        # batch 128 as Krizhevsky et al. 2012; 64 conv1 filters and 4096-wide fc layers.
        {"batch": 128, "image_size": 224, "num_classes": 1000, "width": 64, "hidden": 4096},
        {"batch": 2, "image_size": 63, "num_classes": 10, "width": 4, "hidden": 32},
    ), _build_alexnet),
    "tiny_cnn": ModelSpec(ModelInfo(
        "tiny_cnn", "cnn",
        "Tiny two-block CNN with BatchNorm (for tests)",
        {"batch": 8, "image_size": 32, "num_classes": 10, "width": 16},
        {"batch": 2, "image_size": 8, "num_classes": 10, "width": 4},
    ), _build_tiny_cnn),
}

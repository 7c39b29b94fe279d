"""Recurrent models, unrolled: GNMT-style NMT (2/4/8 layers) and a 2-layer LSTM RNNLM.

Time steps are unrolled with a Python loop (no ``scan``): layer-per-device model
parallelism pays off only through the wavefront overlap of layer l at step t with layer
l-1 at step t+1, and a simulator sees that only in an unrolled graph. Each LSTM layer is
one flax module called once per step, so its weights are shared across steps.

LSTM cell (standard 4 gates, Hochreiter & Schmidhuber 1997 with a forget gate): per
step one fused matmul on the input (``input``, [in, 4H] with the bias) and one on the
recurrent state (``recurrent``, [H, 4H], no bias); gates i, f, g, o split from the sum;
``c = sigmoid(f + 1) * c + sigmoid(i) * tanh(g)``, ``h = sigmoid(o) * tanh(c)`` (forget
bias 1.0 as TensorFlow's BasicLSTMCell, which the seed papers' models used). Initial
states are zero.

Module paths (name stacks; the backward pass has the same paths inside
``transpose(jvp(...))``). Every step of a layer carries the same path::

    NMT/embed/{source, target}/table        embedding lookups (then split into steps)
    NMT/encoder/layer_{l}/{input, recurrent}   one LSTM step of encoder layer l
    NMT/decoder/attention                   per decoder step: query projection, additive
                                            scores, softmax, context
    NMT/decoder/attention/memory            once: projection of the encoder outputs
    NMT/decoder/layer_{l}/{input, recurrent}   one LSTM step of decoder layer l
    NMT/softmax/projection                  per step: logits over the vocabulary + loss
    NMT/encoder, NMT/decoder, NMT           glue: residual adds, concats, stacking, sums

    RNNLM/embed/table                       embedding lookup (then split into steps)
    RNNLM/layer_{l}/{input, recurrent}      one LSTM step of layer l (l = 0, 1)
    RNNLM/softmax/projection                per step: logits + loss

NMT follows GNMT (Wu et al. 2016) in the parts that shape the graph: L unidirectional
LSTM layers in the encoder (GNMT's bidirectional first layer is left out so every layer
is one chain), encoder layer l's final state starts decoder layer l, residual
connections from the third layer up, additive (Bahdanau) attention with ``hidden``
units (embeddings are ``hidden`` wide too, as GNMT's 1024) queried by the
bottom decoder layer's current output and its context fed to every decoder layer above
(so the bottom layer never waits for attention and the layers can pipeline), and the
top decoder layer feeding a full softmax. Training is teacher-forced; inference
(``training=False``) runs the same teacher-forced forward pass and returns the logits
[B, T, V].
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from simplace.zoo._base import Built, InputSpec, ModelInfo, ModelSpec, require

# GNMT adds residual connections from the third layer from the bottom (Wu et al. 2016,
# Section 3.1); layer indices are 0-based here.
_FIRST_RESIDUAL_LAYER = 2


class LSTMLayer(nn.Module):
    """One LSTM layer; call it once per time step (the weights are shared)."""

    hidden: int

    @nn.compact
    def __call__(self, x, carry):
        h, c = carry
        gates = (nn.Dense(4 * self.hidden, name="input")(x)
                 + nn.Dense(4 * self.hidden, use_bias=False, name="recurrent")(h))
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)  # forget bias 1
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return h, (h, c)


class StepEmbed(nn.Module):
    """Embedding lookup of [B, T] ids, returned as a list of T [B, D] step inputs."""

    vocab: int
    dim: int

    @nn.compact
    def __call__(self, ids):
        x = nn.Embed(self.vocab, self.dim, name="table")(ids)
        return [x[:, t] for t in range(ids.shape[1])]


class Softmax(nn.Module):
    """Per-step projection onto the vocabulary; with labels, the summed cross-entropy."""

    vocab: int

    @nn.compact
    def __call__(self, h, labels=None):
        logits = nn.Dense(self.vocab, name="projection")(h)
        if labels is None:
            return logits
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).sum()


def _zero_state(batch: int, hidden: int):
    z = jnp.zeros((batch, hidden), jnp.float32)
    return (z, z)


def _mean_loss(step_losses, labels):
    return sum(step_losses) / labels.size


# --------------------------------------------------------------------------------- NMT


class NMTEmbed(nn.Module):
    """Source and target embeddings (``embed/source``, ``embed/target``)."""

    src_vocab: int
    tgt_vocab: int
    dim: int

    @nn.compact
    def __call__(self, src, tgt_in):
        return (StepEmbed(self.src_vocab, self.dim, name="source")(src),
                StepEmbed(self.tgt_vocab, self.dim, name="target")(tgt_in))


class AdditiveAttention(nn.Module):
    """Bahdanau attention, score_s = v . tanh(W_m m_s + W_q q) (Bahdanau et al. 2015).

    Called twice over: ``attention(memory)`` projects the memory once (keys);
    ``attention(memory, query=q, keys=k)`` gives the context vector for one step.
    """

    units: int

    @nn.compact
    def __call__(self, memory, query=None, keys=None):
        if query is None:
            return nn.Dense(self.units, use_bias=False, name="memory")(memory)
        q = nn.Dense(self.units, use_bias=False, name="query")(query)
        v = self.param("v", nn.initializers.normal(1.0 / self.units**0.5), (self.units,))
        scores = jnp.einsum("bsa,a->bs", jnp.tanh(keys + q[:, None, :]), v)
        weights = jax.nn.softmax(scores, axis=-1)
        return jnp.einsum("bs,bsh->bh", weights, memory)


class NMTEncoder(nn.Module):
    """``layers`` unrolled LSTM layers; returns the top outputs and every final state."""

    layers: int
    hidden: int

    @nn.compact
    def __call__(self, xs):
        cells = [LSTMLayer(self.hidden, name=f"layer_{l}") for l in range(self.layers)]
        states = [_zero_state(xs[0].shape[0], self.hidden) for _ in cells]
        outputs = []
        for x in xs:
            for l, cell in enumerate(cells):
                y, states[l] = cell(x, states[l])
                x = y + x if l >= _FIRST_RESIDUAL_LAYER else y
            outputs.append(x)
        return outputs, states


class NMTDecoder(nn.Module):
    """``layers`` unrolled LSTM layers with GNMT attention; returns the top outputs."""

    layers: int
    hidden: int

    @nn.compact
    def __call__(self, ys, enc_outputs, enc_states):
        cells = [LSTMLayer(self.hidden, name=f"layer_{l}") for l in range(self.layers)]
        attention = AdditiveAttention(self.hidden, name="attention")
        memory = jnp.stack(enc_outputs, axis=1)  # [B, S, H]
        keys = attention(memory)
        states = list(enc_states)
        outputs = []
        for y in ys:
            x, states[0] = cells[0](y, states[0])
            context = attention(memory, query=x, keys=keys)
            for l in range(1, self.layers):
                h, states[l] = cells[l](jnp.concatenate([x, context], axis=-1), states[l])
                x = h + x if l >= _FIRST_RESIDUAL_LAYER else h
            outputs.append(x)
        return outputs


class NMT(nn.Module):
    """GNMT-style encoder-decoder with attention (see the module docstring)."""

    layers: int
    hidden: int
    src_vocab: int
    tgt_vocab: int

    @nn.compact
    def __call__(self, src, tgt_in, labels=None, train: bool = False):
        del train  # no dropout, no BatchNorm
        xs, ys = NMTEmbed(self.src_vocab, self.tgt_vocab, self.hidden, name="embed")(src, tgt_in)
        enc_out, enc_states = NMTEncoder(self.layers, self.hidden, name="encoder")(xs)
        tops = NMTDecoder(self.layers, self.hidden, name="decoder")(ys, enc_out, enc_states)
        softmax = Softmax(self.tgt_vocab, name="softmax")
        if labels is None:
            return jnp.stack([softmax(h) for h in tops], axis=1)
        return _mean_loss([softmax(h, labels[:, t]) for t, h in enumerate(tops)], labels)


def _build_nmt(name: str):
    def build(s: dict) -> Built:
        # The decoder's attention context enters layers 1 and up, so there must be two.
        require(s["layers"] >= 2, name, "layers must be at least 2")
        n, v = s["batch"], s["vocab"]
        features = (InputSpec("src_ids", (n, s["src_len"]), jnp.int32, high=v),
                    InputSpec("tgt_in_ids", (n, s["tgt_len"]), jnp.int32, high=v))
        labels = InputSpec("tgt_out_ids", (n, s["tgt_len"]), jnp.int32, high=v)
        return Built(NMT(s["layers"], s["hidden"], v, v), features, labels)
    return build


# ------------------------------------------------------------------------------- RNNLM


class RNNLM(nn.Module):
    """Stacked-LSTM language model (Zaremba et al. 2014), unrolled, per-step softmax."""

    layers: int
    hidden: int
    vocab: int

    @nn.compact
    def __call__(self, ids, labels=None, train: bool = False):
        del train  # no dropout
        xs = StepEmbed(self.vocab, self.hidden, name="embed")(ids)
        cells = [LSTMLayer(self.hidden, name=f"layer_{l}") for l in range(self.layers)]
        softmax = Softmax(self.vocab, name="softmax")
        states = [_zero_state(ids.shape[0], self.hidden) for _ in cells]
        outs = []
        for t, x in enumerate(xs):
            for l, cell in enumerate(cells):
                x, states[l] = cell(x, states[l])
            outs.append(softmax(x) if labels is None else softmax(x, labels[:, t]))
        return jnp.stack(outs, axis=1) if labels is None else _mean_loss(outs, labels)


def _build_rnnlm(s: dict) -> Built:
    require(s["layers"] >= 1, "rnnlm", "layers must be at least 1")
    n, t, v = s["batch"], s["seq_len"], s["vocab"]
    features = (InputSpec("ids", (n, t), jnp.int32, high=v),)
    labels = InputSpec("next_ids", (n, t), jnp.int32, high=v)
    return Built(RNNLM(s["layers"], s["hidden"], v), features, labels)


# ---------------------------------------------------------------------------- registry

# NMT sizes: hidden 1024 per LSTM layer as GNMT (Wu et al. 2016) and the seed papers'
# NMT (ColocRL 2017; hierarchical placer 2018); batch 64 and 40-step sequences as the
# seed papers' NMT / RNNLM benchmarks (recalled, not checked against the papers); a
# 32k shared wordpiece vocabulary, the size GNMT reports for WMT en-de/en-fr.
_NMT_SIZES = {"batch": 64, "src_len": 40, "tgt_len": 40, "hidden": 1024, "vocab": 32000}
_NMT_SMALL = {"batch": 2, "src_len": 4, "tgt_len": 3, "hidden": 8, "vocab": 32}


def _nmt_spec(layers: int) -> ModelSpec:
    name = f"nmt_{layers}layer"
    return ModelSpec(ModelInfo(
        name, "rnn",
        f"GNMT-style NMT: {layers}+{layers} LSTM layers, additive attention, unrolled",
        {**_NMT_SIZES, "layers": layers}, {**_NMT_SMALL, "layers": layers},
    ), _build_nmt(name))


MODELS: dict[str, ModelSpec] = {
    **{f"nmt_{n}layer": _nmt_spec(n) for n in (2, 4, 8)},
    "rnnlm": ModelSpec(ModelInfo(
        "rnnlm", "rnn",
        "2-layer LSTM language model (hidden 2048), unrolled 40 steps",
        # 2 layers of 2048 LSTM units, batch 64, 40 steps: the seed papers' RNNLM
        # (ColocRL 2017; recalled, not checked). Vocabulary 10000: Penn Treebank as in
        # Zaremba et al. 2014 (the seed papers' vocabulary is not stated in our notes).
        {"batch": 64, "seq_len": 40, "hidden": 2048, "vocab": 10000, "layers": 2},
        {"batch": 2, "seq_len": 4, "hidden": 8, "vocab": 32, "layers": 2},
    ), _build_rnnlm),
}

"""Transformers: BERT-Base / BERT-Large (masked-LM pre-training) and the encoder-decoder
Transformer "base" of Vaswani et al. 2017.

Both are post-LayerNorm, as the papers. Attention is written out with ``einsum``
(``dot_general``) and ``jax.nn.softmax`` so each matmul is its own op. No padding: every
sequence in a batch has the full length. Dropout is left out (a cheap elementwise mask
that would need an RNG input). Module paths (name stacks)::

    BERT/embed/{word, position, token_type, norm}
    BERT/encoder/layer_{i}/attention/{query, key, value, out}
    BERT/encoder/layer_{i}/{attention_norm, ffn/{intermediate, output}, ffn_norm}
    BERT/head/{transform, norm}     masked-LM head: gather the masked positions,
                                    dense+GELU+LayerNorm, logits against the (tied) word
                                    embedding table plus a bias, cross-entropy

    Transformer/embed               shared source/target/softmax embedding, x sqrt(d),
                                    plus sinusoidal positions (called for src and tgt)
    Transformer/encoder/layer_{i}/{self_attention/{query,key,value,out},
                                   self_attention_norm, ffn/{intermediate,output}, ffn_norm}
    Transformer/decoder/layer_{i}/{self_attention, self_attention_norm, cross_attention,
                                   cross_attention_norm, ffn, ffn_norm}
    Transformer/head                logits against the tied embedding, cross-entropy

The tied embedding table is read both under ``embed`` and under ``head`` (as in both
papers), so a placer sees one parameter used in two places.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from simplace.zoo._base import Built, InputSpec, ModelInfo, ModelSpec, cross_entropy, require


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over ``heads`` heads (Vaswani et al. 2017, 3.2)."""

    d_model: int
    heads: int

    @nn.compact
    def __call__(self, x_q, x_kv, mask=None):
        b, tq, _ = x_q.shape
        tk = x_kv.shape[1]
        dh = self.d_model // self.heads
        q = nn.Dense(self.d_model, name="query")(x_q).reshape(b, tq, self.heads, dh)
        k = nn.Dense(self.d_model, name="key")(x_kv).reshape(b, tk, self.heads, dh)
        v = nn.Dense(self.d_model, name="value")(x_kv).reshape(b, tk, self.heads, dh)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(dh)
        if mask is not None:
            logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
        weights = jax.nn.softmax(logits, axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, tq, self.d_model)
        return nn.Dense(self.d_model, name="out")(out)


class FeedForward(nn.Module):
    """Position-wise two-layer MLP."""

    d_model: int
    d_ff: int
    activation: str = "relu"

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(self.d_ff, name="intermediate")(x)
        # BERT uses the exact (erf) GELU; the Transformer uses ReLU.
        h = jax.nn.gelu(h, approximate=False) if self.activation == "gelu" else nn.relu(h)
        return nn.Dense(self.d_model, name="output")(h)


# -------------------------------------------------------------------------------- BERT

# LayerNorm epsilon of the released BERT checkpoints (google-research/bert modeling.py).
_BERT_LN_EPS = 1e-12


class BertLayer(nn.Module):
    """Post-LN encoder layer: x = LN(x + MHA(x)); x = LN(x + FFN(x))."""

    d_model: int
    heads: int
    d_ff: int

    @nn.compact
    def __call__(self, x):
        x = nn.LayerNorm(_BERT_LN_EPS, name="attention_norm")(
            x + MultiHeadAttention(self.d_model, self.heads, name="attention")(x, x))
        return nn.LayerNorm(_BERT_LN_EPS, name="ffn_norm")(
            x + FeedForward(self.d_model, self.d_ff, "gelu", name="ffn")(x))


class BertEmbed(nn.Module):
    """Word + learned position + token-type embeddings, LayerNorm."""

    vocab: int
    d_model: int
    max_position: int
    type_vocab: int = 2  # segments A and B (Devlin et al. 2019)

    @nn.compact
    def __call__(self, ids, token_types):
        word = nn.Embed(self.vocab, self.d_model, name="word")
        pos = nn.Embed(self.max_position, self.d_model, name="position")
        x = word(ids) + pos(jnp.arange(ids.shape[1]))[None]
        x = x + nn.Embed(self.type_vocab, self.d_model, name="token_type")(token_types)
        return nn.LayerNorm(_BERT_LN_EPS, name="norm")(x), word.embedding


class BertEncoder(nn.Module):
    """``layers`` BertLayers named ``layer_0`` ... ``layer_{L-1}``."""

    layers: int
    d_model: int
    heads: int
    d_ff: int

    @nn.compact
    def __call__(self, x):
        for i in range(self.layers):
            x = BertLayer(self.d_model, self.heads, self.d_ff, name=f"layer_{i}")(x)
        return x


class BertMLMHead(nn.Module):
    """Masked-LM head: gather masked positions, transform, tied-embedding logits, loss."""

    d_model: int

    @nn.compact
    def __call__(self, x, table, positions, labels=None):
        x = jnp.take_along_axis(x, positions[..., None], axis=1)  # [B, P, d]
        x = jax.nn.gelu(nn.Dense(self.d_model, name="transform")(x), approximate=False)
        x = nn.LayerNorm(_BERT_LN_EPS, name="norm")(x)
        bias = self.param("bias", nn.initializers.zeros, (table.shape[0],))
        logits = jnp.einsum("bpd,vd->bpv", x, table) + bias
        return logits if labels is None else cross_entropy(logits, labels)


class BERT(nn.Module):
    """BERT encoder with the masked-LM pre-training head (Devlin et al. 2019)."""

    vocab: int
    layers: int
    d_model: int
    heads: int
    d_ff: int
    max_position: int

    @nn.compact
    def __call__(self, ids, token_types, masked_positions, labels=None, train: bool = False):
        del train  # no dropout, no BatchNorm
        x, table = BertEmbed(self.vocab, self.d_model, self.max_position, name="embed")(
            ids, token_types)
        x = BertEncoder(self.layers, self.d_model, self.heads, self.d_ff, name="encoder")(x)
        return BertMLMHead(self.d_model, name="head")(x, table, masked_positions, labels)


def _check_heads(name: str, s: dict) -> None:
    require(s["d_model"] % s["heads"] == 0, name,
            f"d_model ({s['d_model']}) must be a multiple of heads ({s['heads']})")


def _build_bert(name: str):
    def build(s: dict) -> Built:
        _check_heads(name, s)
        require(s["seq_len"] <= s["max_position"], name, "seq_len must be <= max_position")
        require(s["masked"] <= s["seq_len"], name, "masked must be <= seq_len")
        n, t, p = s["batch"], s["seq_len"], s["masked"]
        features = (InputSpec("input_ids", (n, t), jnp.int32, high=s["vocab"]),
                    InputSpec("token_type_ids", (n, t), jnp.int32, high=2),
                    InputSpec("masked_positions", (n, p), jnp.int32, high=t))
        labels = InputSpec("masked_ids", (n, p), jnp.int32, high=s["vocab"])
        model = BERT(s["vocab"], s["layers"], s["d_model"], s["heads"], s["d_ff"],
                     s["max_position"])
        return Built(model, features, labels)
    return build


# ------------------------------------------------------------------------- Transformer

_LN_EPS = 1e-6  # tensor2tensor's LayerNorm epsilon for the Transformer


def _sinusoid(length: int, d: int) -> np.ndarray:
    """Sinusoidal position encodings (Vaswani et al. 2017, 3.5); a constant."""
    pos = np.arange(length)[:, None]
    i = np.arange(0, d, 2)[None, :]
    angle = pos / np.power(10000.0, i / d)  # 10000: the paper's wavelength base
    enc = np.zeros((length, d), np.float32)
    enc[:, 0::2] = np.sin(angle)
    enc[:, 1::2] = np.cos(angle[:, : d // 2])
    return enc


class SharedEmbed(nn.Module):
    """Embedding shared by source, target and the pre-softmax projection (3.4)."""

    vocab: int
    d_model: int

    @nn.compact
    def __call__(self, ids):
        embed = nn.Embed(self.vocab, self.d_model, name="table")
        x = embed(ids) * math.sqrt(self.d_model)  # scaled by sqrt(d_model), Section 3.4
        return x + _sinusoid(ids.shape[1], self.d_model)[None], embed.embedding


class EncoderLayer(nn.Module):
    """Post-LN self-attention + feed-forward layer."""

    d_model: int
    heads: int
    d_ff: int

    @nn.compact
    def __call__(self, x):
        x = nn.LayerNorm(_LN_EPS, name="self_attention_norm")(
            x + MultiHeadAttention(self.d_model, self.heads, name="self_attention")(x, x))
        return nn.LayerNorm(_LN_EPS, name="ffn_norm")(
            x + FeedForward(self.d_model, self.d_ff, name="ffn")(x))


class DecoderLayer(nn.Module):
    """Post-LN masked self-attention, cross-attention and feed-forward layer."""

    d_model: int
    heads: int
    d_ff: int

    @nn.compact
    def __call__(self, y, memory, causal):
        y = nn.LayerNorm(_LN_EPS, name="self_attention_norm")(
            y + MultiHeadAttention(self.d_model, self.heads, name="self_attention")(
                y, y, causal))
        y = nn.LayerNorm(_LN_EPS, name="cross_attention_norm")(
            y + MultiHeadAttention(self.d_model, self.heads, name="cross_attention")(
                y, memory))
        return nn.LayerNorm(_LN_EPS, name="ffn_norm")(
            y + FeedForward(self.d_model, self.d_ff, name="ffn")(y))


class TransformerEncoder(nn.Module):
    """``layers`` EncoderLayers named ``layer_0`` ..."""

    layers: int
    d_model: int
    heads: int
    d_ff: int

    @nn.compact
    def __call__(self, x):
        for i in range(self.layers):
            x = EncoderLayer(self.d_model, self.heads, self.d_ff, name=f"layer_{i}")(x)
        return x


class TransformerDecoder(nn.Module):
    """``layers`` DecoderLayers named ``layer_0`` ..., with a causal mask."""

    layers: int
    d_model: int
    heads: int
    d_ff: int

    @nn.compact
    def __call__(self, y, memory):
        t = y.shape[1]
        causal = np.tril(np.ones((t, t), bool))[None, None]  # [1, 1, Tq, Tk] constant
        for i in range(self.layers):
            y = DecoderLayer(self.d_model, self.heads, self.d_ff, name=f"layer_{i}")(
                y, memory, causal)
        return y


class TiedHead(nn.Module):
    """Pre-softmax projection with the shared embedding table, and the loss."""

    @nn.compact
    def __call__(self, y, table, labels=None):
        logits = jnp.einsum("btd,vd->btv", y, table)
        return logits if labels is None else cross_entropy(logits, labels)


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017), teacher-forced."""

    vocab: int
    layers: int
    d_model: int
    heads: int
    d_ff: int

    @nn.compact
    def __call__(self, src, tgt_in, labels=None, train: bool = False):
        del train  # no dropout
        embed = SharedEmbed(self.vocab, self.d_model, name="embed")
        x, table = embed(src)
        y, _ = embed(tgt_in)
        dims = (self.layers, self.d_model, self.heads, self.d_ff)
        memory = TransformerEncoder(*dims, name="encoder")(x)
        y = TransformerDecoder(*dims, name="decoder")(y, memory)
        return TiedHead(name="head")(y, table, labels)


def _build_transformer(s: dict) -> Built:
    _check_heads("transformer", s)
    n = s["batch"]
    features = (InputSpec("src_ids", (n, s["src_len"]), jnp.int32, high=s["vocab"]),
                InputSpec("tgt_in_ids", (n, s["tgt_len"]), jnp.int32, high=s["vocab"]))
    labels = InputSpec("tgt_out_ids", (n, s["tgt_len"]), jnp.int32, high=s["vocab"])
    model = Transformer(s["vocab"], s["layers"], s["d_model"], s["heads"], s["d_ff"])
    return Built(model, features, labels)


# ---------------------------------------------------------------------------- registry

# Devlin et al. 2019: vocab 30522 WordPiece, 512 positions; pre-training phase 1 used
# sequences of 128 with at most 20 masked positions (google-research/bert README,
# max_predictions_per_seq=20). Batch 8: a per-accelerator batch that keeps BERT-Large
# within one 16 GB device in training.
_BERT_COMMON = {"batch": 8, "seq_len": 128, "masked": 20, "vocab": 30522, "max_position": 512}
_BERT_SMALL = {"batch": 2, "seq_len": 16, "masked": 4, "vocab": 64, "max_position": 16,
               "layers": 2, "d_model": 16, "heads": 2, "d_ff": 32}

MODELS: dict[str, ModelSpec] = {
    "bert_base": ModelSpec(ModelInfo(
        "bert_base", "transformer",
        "BERT-Base (12 layers, d 768, 12 heads), masked-LM loss, seq 128",
        # L=12, H=768, A=12, feed-forward 4H (Devlin et al. 2019, Section 3)
        {**_BERT_COMMON, "layers": 12, "d_model": 768, "heads": 12, "d_ff": 3072},
        dict(_BERT_SMALL),
    ), _build_bert("bert_base")),
    "bert_large": ModelSpec(ModelInfo(
        "bert_large", "transformer",
        "BERT-Large (24 layers, d 1024, 16 heads), masked-LM loss, seq 128",
        # L=24, H=1024, A=16, feed-forward 4H (Devlin et al. 2019, Section 3)
        {**_BERT_COMMON, "layers": 24, "d_model": 1024, "heads": 16, "d_ff": 4096},
        {**_BERT_SMALL, "layers": 3},
    ), _build_bert("bert_large")),
    "transformer": ModelSpec(ModelInfo(
        "transformer", "transformer",
        "Transformer base (Vaswani et al. 2017): 6+6 layers, d 512, 8 heads, ff 2048",
        # Vaswani et al. 2017 Table 3 "base": N=6, d_model=512, h=8, d_ff=2048; shared
        # BPE vocabulary of about 37000 tokens (WMT14 en-de, Section 5.1). Batch 32 x 64
        # tokens per side: WMT14 sentences average well under 64 tokens.
        {"batch": 32, "src_len": 64, "tgt_len": 64, "vocab": 37000, "layers": 6,
         "d_model": 512, "heads": 8, "d_ff": 2048},
        {"batch": 2, "src_len": 8, "tgt_len": 6, "vocab": 64, "layers": 2, "d_model": 16,
         "heads": 2, "d_ff": 32},
    ), _build_transformer),
}

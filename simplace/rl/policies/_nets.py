"""Building blocks shared by the policies: flax modules applied inside ``lax.scan``.

Policies keep their parameters as one plain dict of flax parameter trees and call each
module's ``apply`` inside their own scans (no lifted transforms), so that sampling,
teacher forcing and the loss are ordinary JAX functions of ``(params, key)``.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from simplace.errors import SimplaceError

F32 = jnp.float32

# The free tables enter the logits times this: Adam moves a parameter by about the
# learning rate per update, and a warm start puts table entries at logits of 5 or more,
# which training must be able to undo within a few hundred updates.
TABLE_SCALE = 10.0


def check_explore(explore) -> float:
    """``explore`` (the deviations per sample a warm-started policy draws) as a float,
    or a clear error."""
    try:
        val = float(explore)
    except (TypeError, ValueError):
        val = math.nan
    if not val > 0:
        raise SimplaceError(f"explore (deviations per sample after a warm start) must be "
                            f"> 0, got {explore!r}.")
    return val


def dense(features: int) -> nn.Dense:
    """A float32 ``nn.Dense`` of width ``features``."""
    # float32 explicitly: the update step runs under x64 (the simulator needs float64),
    # where unspecified dtypes would silently become float64.
    return nn.Dense(features, dtype=F32, param_dtype=F32)


def f32(x) -> jnp.ndarray:
    """A float32 JAX array of numpy data, converted on the host: ``jnp.zeros`` or
    ``jnp.asarray(x, float32)`` would each compile a small program."""
    return jnp.asarray(np.asarray(x, np.float32))


def param_rng(key) -> np.random.Generator:
    """A numpy generator seeded from a JAX key: parameters are drawn with numpy, because
    flax's initialisers run eagerly and compile a small program each (dozens per policy,
    seconds of a short run's budget)."""
    # Those compilations took 3-5 s of a short run's budget on a loaded 2-core machine.
    return np.random.default_rng(np.asarray(jax.random.key_data(key), np.uint32).ravel()
                                 .tolist())


def lecun_normal(rng: np.random.Generator, in_dim: int, out_dim: int):
    """float32[in, out] drawn as flax's default kernel initialiser: a normal truncated at
    two standard deviations, scaled to variance 1 / in_dim."""
    # 0.8796... is the standard deviation of a unit normal truncated to [-2, 2].
    std = 1.0 / math.sqrt(max(in_dim, 1)) / 0.87962566103423978
    w = rng.standard_normal((in_dim, out_dim))
    bad = np.abs(w) > 2
    while bad.any():  # redraw until every entry lies in [-2, 2]
        w[bad] = rng.standard_normal(int(bad.sum()))
        bad = np.abs(w) > 2
    return f32(w * std)


def orthogonal(rng: np.random.Generator, n: int):
    """float32[n, n], a random orthogonal matrix (flax's recurrent kernel initialiser)."""
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return f32(q * np.sign(np.diag(r))[None])


def init_dense(rng: np.random.Generator, features: int, in_dim: int) -> dict:
    """The parameters of ``dense(features)`` on inputs of width ``in_dim``."""
    return {"kernel": lecun_normal(rng, in_dim, features),
            "bias": f32(np.zeros(features))}


def apply_dense(params, features: int, x):
    """``dense(features)`` applied with ``params`` to ``x``."""
    return dense(features).apply({"params": params}, x)


def lstm(hidden: int) -> nn.OptimizedLSTMCell:
    """A float32 ``nn.OptimizedLSTMCell`` of ``hidden`` units."""
    return nn.OptimizedLSTMCell(hidden, dtype=F32, param_dtype=F32)


def init_lstm(rng: np.random.Generator, hidden: int, in_dim: int) -> dict:
    """The parameters of ``lstm(hidden)`` on inputs of width ``in_dim``, in flax's tree
    (``OptimizedLSTMCell``: input kernels ``i*`` without bias, recurrent kernels ``h*``
    with bias, one per gate)."""
    p = {f"i{g}": {"kernel": lecun_normal(rng, in_dim, hidden)} for g in "ifgo"}
    p.update({f"h{g}": {"kernel": orthogonal(rng, hidden), "bias": f32(np.zeros(hidden))}
              for g in "ifgo"})
    return p


def run_lstm(params, hidden: int, xs, reverse: bool = False):
    """Hidden states [B, T, H] of an LSTM over xs [B, T, I] (zero initial state)."""
    cell = lstm(hidden)
    b = xs.shape[0]
    carry = (jnp.zeros((b, hidden), F32), jnp.zeros((b, hidden), F32))

    def step(c, x):
        c, h = cell.apply({"params": params}, c, x)
        return c, h

    _, hs = jax.lax.scan(step, carry, jnp.swapaxes(xs, 0, 1), reverse=reverse)
    return jnp.swapaxes(hs, 0, 1)


class AttentionDecoder:
    """LSTM decoder with content-based attention that emits one device per position.

    Position t's input is the encoder state of t and the embedding of the device chosen
    at t-1 (Mirhoseini et al. 2017). Keys are the encoder states projected once; scores
    are scaled dot products (Luong style) rather than Bahdanau's tanh layer, whose
    [K, T, A] activations per step made the backward pass memory-bound on CPU.
    """

    def __init__(self, hidden: int, num_devices: int, attention: int = 32):
        self.h, self.d, self.a = hidden, num_devices, attention

    def init(self, rng: np.random.Generator, enc_dim: int) -> dict:
        """Fresh parameters drawn from ``rng`` (``param_rng``)."""
        return {
            "cell": init_lstm(rng, self.h, enc_dim + self.h),
            "dev_emb": f32(0.1 * rng.standard_normal((self.d + 1, self.h))),
            "att_k": init_dense(rng, self.a, enc_dim),
            "att_q": init_dense(rng, self.a, self.h),
            "out": init_dense(rng, self.d, self.h + enc_dim),
        }

    def __call__(self, p, enc, key, num_samples: int, forced=None, bias=None):
        """Decode ``num_samples`` sequences.

        Args:
          enc: float32[Kb, T, E] encoder states (Kb = 1: shared by every sample).
          key: PRNG key for sampling (unused when ``forced``).
          forced: int32[K, T] devices to score instead of sampling (teacher forcing).
          bias: float32[T, D] added to the logits (None: no bias).
        Returns:
          (acts int32[K, T], logp float32[K, T] of the chosen devices, entropy
          float32[K, T], log-probabilities of every device float32[K, T, D]).
        """
        k, t_len = num_samples, enc.shape[1]
        cell = lstm(self.h)
        keys = apply_dense(p["att_k"], self.a, enc)  # [Kb, T, A]
        shared = enc.shape[0] == 1
        scale = 1.0 / float(self.a) ** 0.5
        carry0 = (jnp.zeros((k, self.h), F32), jnp.zeros((k, self.h), F32))
        prev0 = jnp.full((k,), self.d, jnp.int32)  # the start token
        step_keys = jax.random.split(key, t_len)
        forced_t = (jnp.zeros((t_len, k), jnp.int32) if forced is None
                    else jnp.swapaxes(forced, 0, 1).astype(jnp.int32))
        bias_t = jnp.zeros((t_len, self.d), F32) if bias is None else bias

        def step(state, x):
            carry, prev = state
            enc_t, key_t, forced_i, bias_i = x
            inp = jnp.concatenate([jnp.broadcast_to(enc_t, (k, enc_t.shape[-1])),
                                   p["dev_emb"][prev]], axis=-1)
            carry, h = cell.apply({"params": p["cell"]}, carry, inp)
            q = apply_dense(p["att_q"], self.a, h) * scale  # [K, A]
            if shared:
                w = jax.nn.softmax(q @ keys[0].T, axis=-1)  # [K, T]
                ctx = w @ enc[0]
            else:
                w = jax.nn.softmax(jnp.einsum("ka,kta->kt", q, keys), axis=-1)
                ctx = jnp.einsum("kt,kte->ke", w, enc)
            logits = apply_dense(p["out"], self.d, jnp.concatenate([h, ctx], -1)) + bias_i
            logp_all = jax.nn.log_softmax(logits, axis=-1)
            if forced is None:
                act = jax.random.categorical(key_t, logits, axis=-1).astype(jnp.int32)
            else:
                act = forced_i
            lp = jnp.take_along_axis(logp_all, act[:, None], axis=-1)[:, 0]
            ent = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
            return (carry, act), (act, lp, ent, logp_all)

        enc_seq = jnp.swapaxes(enc, 0, 1)  # [T, Kb, E]
        _, (acts, lp, ent, lpa) = jax.lax.scan(
            step, (carry0, prev0), (enc_seq, step_keys, forced_t, bias_t))
        return (jnp.swapaxes(acts, 0, 1), jnp.swapaxes(lp, 0, 1), jnp.swapaxes(ent, 0, 1),
                jnp.swapaxes(lpa, 0, 1))


def sample_categorical(key, logits, num_samples: int):
    """(samples int32[K, N], logp float32[K, N]) of N categoricals with logits [N, C]."""
    s = jax.random.categorical(key, logits[None], axis=-1, shape=(num_samples,
                                                                  logits.shape[0]))
    s = s.astype(jnp.int32)
    lsm = jax.nn.log_softmax(logits, axis=-1)
    lp = jnp.take_along_axis(lsm[None], s[..., None], axis=-1)[..., 0]
    return s, lp


def categorical_entropy(logits):
    """float32[...]: the entropy of each categorical of ``logits`` [..., C]."""
    lsm = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)


def range_prior(num_units: int, num_groups: int):
    """float32[U, G]: a grouping prior that puts unit u (units are in topological order)
    in group floor(u G / U) with probability about 0.73 at initialisation, whatever G.

    Groupers start from contiguous ranges, a sensible coarsening, instead of a uniform
    mix in which every group holds a bit of everything and the placer has nothing to
    tell apart (it then collapsed onto one device)."""
    g_of_u = (jnp.arange(num_units) * num_groups) // max(num_units, 1)
    return (jnp.log(float(num_groups)) + 1.0) * jax.nn.one_hot(g_of_u, num_groups, dtype=F32)

"""``universal``: one placement policy for every graph and machine (the pretrained
policy's network), as pure functions of a parameter tree and a padded problem.

Its inputs are ``simplace.rl.problem.PolicyProblem.padded()`` arrays: unit, device and
unit x device features whose meaning does not depend on the graph or the number of
devices. Units are embedded and exchange messages along the quotient edges both ways
(HSDAG-style, as ``gnn``); devices are embedded from their own features and the mean of
all devices'; a unit's logit for a device comes from the pair (unit embedding, device
embedding, pair features, graph summary), so the same weights score any number of
devices (GiPH and Doppler score device choices the same way).

Sampling keeps ``gnn``'s run structure: in topological order each unit either follows
its predecessor's device (probability ``sigmoid(f_u)``) or draws a fresh one from
``softmax(a_u)``. The probability of a unit placement e is then a chain

  P(e) = prod_u [s_u 1(e_u = e_(u-1)) + (1 - s_u) softmax(a_u)[e_u]],

exact and cheap, which serves both REINFORCE (the placement is the action) and imitation.
Training: ``simplace.rl.pretrain``; the shipped weights and zero-shot placement:
``simplace.rl.pretrained``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from simplace.rl.problem import DEVICE_FEATURES, PAIR_FEATURES, UNIT_FEATURES

NEG = -1e9
HIDDEN = 64
LAYERS = 3


def init_params(seed: int = 0, hidden: int = HIDDEN, layers: int = LAYERS) -> dict:
    """Fresh parameters (numpy draws, LeCun-normal kernels and zero biases, as flax's
    ``Dense``), as a dict of float32 numpy arrays."""
    rng = np.random.default_rng(seed)
    h = int(hidden)

    def dense(inp, out):
        return {"kernel": rng.normal(0.0, 1.0 / math.sqrt(inp), (inp, out)).astype(np.float32),
                "bias": np.zeros(out, np.float32)}

    p = {"unit_in": dense(UNIT_FEATURES, h), "dev_in": dense(DEVICE_FEATURES, h),
         "dev_mix": dense(2 * h, h), "pair_unit": dense(2 * h, h), "pair_dev": dense(h, h),
         "pair_feat": dense(PAIR_FEATURES, h), "pair_out": dense(h, 1),
         "follow_in": dense(3 * h, h), "follow_out": dense(h, 1)}
    for i in range(int(layers)):
        p[f"gate{i}"] = dense(1, 1)
        p[f"mp{i}"] = dense(3 * h, h)
    return p


def _dense(p, x):
    return x @ p["kernel"] + p["bias"]


def num_layers(params) -> int:
    """Message-passing rounds of a parameter tree."""
    return sum(1 for k in params if k.startswith("mp"))


def logits(params, a):
    """(fresh-device logits float32[U, D] with padded devices at -1e9, follow logits
    float32[U], unit 0 never following) of the padded problem ``a``."""
    mask_u = a["unit_mask"][:, None]
    u = a["unit_feat"].shape[0]
    x = jax.nn.relu(_dense(params["unit_in"], a["unit_feat"])) * mask_u
    w = a["edge_w"][:, None]
    deg_in = jnp.maximum(jax.ops.segment_sum(w, a["dst"], u), 1.0)
    deg_out = jnp.maximum(jax.ops.segment_sum(w, a["src"], u), 1.0)
    for i in range(num_layers(params)):
        gate = jax.nn.sigmoid(_dense(params[f"gate{i}"], a["edge_feat"][:, None])) * w
        m_in = jax.ops.segment_sum(x[a["src"]] * gate, a["dst"], u) / deg_in
        m_out = jax.ops.segment_sum(x[a["dst"]] * gate, a["src"], u) / deg_out
        upd = jax.nn.relu(_dense(params[f"mp{i}"], jnp.concatenate([x, m_in, m_out], -1)))
        x = (x + upd) * mask_u
    n_u = jnp.maximum(a["unit_mask"].sum(), 1.0)
    g = x.sum(0) / n_u  # the graph's summary
    mask_d = a["device_mask"][:, None]
    e = jax.nn.relu(_dense(params["dev_in"], a["device_feat"])) * mask_d
    e_mean = e.sum(0) / jnp.maximum(a["device_mask"].sum(), 1.0)
    e = jax.nn.relu(_dense(params["dev_mix"], jnp.concatenate(
        [e, jnp.broadcast_to(e_mean, e.shape)], -1))) * mask_d
    hu = _dense(params["pair_unit"], jnp.concatenate([x, jnp.broadcast_to(g, x.shape)], -1))
    hd = _dense(params["pair_dev"], e)
    hp = _dense(params["pair_feat"], a["pair_feat"])  # [U, D, H]
    z = jax.nn.relu(hu[:, None, :] + hd[None, :, :] + hp)
    lg = _dense(params["pair_out"], z)[..., 0]
    lg = jnp.where(a["device_mask"][None, :] > 0, lg, NEG)
    prev = jnp.concatenate([jnp.zeros_like(x[:1]), x[:-1]], 0)
    f = _dense(params["follow_out"], jax.nn.relu(_dense(params["follow_in"], jnp.concatenate(
        [x, prev, jnp.broadcast_to(g, x.shape)], -1))))[:, 0]
    return lg, f


def _follow_prob(f):
    s = jax.nn.sigmoid(f)
    return s.at[0].set(0.0)  # unit 0 has no predecessor


def sample(params, a, key, num_samples: int):
    """(unit devices int32[K, U], entropy float32[K]) of ``num_samples`` placements drawn
    by follow-or-fresh decisions (module docstring). Padded units get device 0."""
    lg, f = logits(params, a)
    u = lg.shape[0]
    lsm = jax.nn.log_softmax(lg, axis=-1)
    k1, k2 = jax.random.split(key)
    fresh = jax.random.categorical(k1, lsm[None], axis=-1, shape=(num_samples, u))
    s = _follow_prob(f)
    follow = jax.random.uniform(k2, (num_samples, u)) < s[None]
    idx = jnp.where(follow, -1, jnp.arange(u, dtype=jnp.int32)[None])
    dev = jnp.take_along_axis(fresh.astype(jnp.int32), jax.lax.cummax(idx, axis=1), axis=1)
    dev = jnp.where(a["unit_mask"][None] > 0, dev, 0)
    return dev


def chain_logp(params, a, unit_devices):
    """float32[K]: log P(e) of unit placements int32[K, U] (the chain of the module
    docstring), summed over real units; and the mean per-unit entropy of the fresh
    draws (a regulariser), as a pair."""
    lg, f = logits(params, a)
    lsm = jax.nn.log_softmax(lg, axis=-1)
    s = _follow_prob(f)
    e = unit_devices.astype(jnp.int32)
    q = jnp.exp(jnp.take_along_axis(lsm[None], e[..., None], axis=-1)[..., 0])  # [K, U]
    same = jnp.concatenate([jnp.zeros_like(e[:, :1], bool), e[:, 1:] == e[:, :-1]], 1)
    p = jnp.where(same, s[None], 0.0) + (1 - s[None]) * q
    mask = a["unit_mask"]
    lp = (jnp.log(p + 1e-9) * mask[None]).sum(-1)
    ent = -(jnp.exp(lsm) * jnp.where(lsm > NEG / 2, lsm, 0.0)).sum(-1)
    return lp, (ent * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def chain_mode(lg: np.ndarray, f: np.ndarray, num_units: int) -> np.ndarray:
    """int32[U]: the most probable unit placement of the chain (Viterbi, numpy), from
    ``logits``' outputs cut to the real units and devices."""
    lg = np.asarray(lg, np.float64)[:num_units]
    s = 1.0 / (1.0 + np.exp(-np.asarray(f, np.float64)[:num_units]))
    s[0] = 0.0
    q = np.exp(lg - lg.max(1, keepdims=True))
    q /= q.sum(1, keepdims=True)
    d = q.shape[1]
    score = np.log(q[0] + 1e-12)
    back = np.zeros((num_units, d), np.int64)
    for i in range(1, num_units):
        # Staying on e: s + (1 - s) q[e] from e; moving from e' != e: (1 - s) q[e].
        move = np.log((1 - s[i]) * q[i] + 1e-12)
        stay = np.log(s[i] + (1 - s[i]) * q[i] + 1e-12)
        best_prev = int(np.argmax(score))
        from_move = score[best_prev] + move
        from_stay = score + stay
        take_stay = from_stay >= from_move
        back[i] = np.where(take_stay, np.arange(d), best_prev)
        score = np.where(take_stay, from_stay, from_move)
    out = np.zeros(num_units, np.int64)
    out[-1] = int(np.argmax(score))
    for i in range(num_units - 1, 0, -1):
        out[i - 1] = back[i, out[i]]
    return out.astype(np.int32)

"""``universal``: one placement policy for every graph and machine (the pretrained
policy's network), as pure functions of a parameter tree and a padded problem.

Its inputs are ``simplace.rl.problem.PolicyProblem.padded()`` arrays: unit, device and
unit x device features whose meaning does not depend on the graph or the number of
devices. Units are embedded and exchange messages along the quotient edges both ways
(HSDAG-style, as ``gnn``); devices are embedded from their own features and the mean of
all devices'; a unit's logit for a device comes from the pair (unit embedding, device
embedding, pair features, graph summary), so the same weights score any number of
devices (GiPH and Doppler score device choices the same way).

Sampling keeps runs, as ``gnn``'s does, but along the data flow: each unit either
follows its parent (the predecessor it receives the most bytes from) onto its device
(probability ``s_u = sigmoid(f_u)``; 0 for a unit without one) or draws a fresh device
from ``softmax(a_u)``. The probability of a unit placement e is then a product over a
tree,

  P(e) = prod_u [s_u 1(e_u = e_parent(u)) + (1 - s_u) softmax(a_u)[e_u]],

exact and cheap, which serves both REINFORCE (the placement is the action) and
imitation. A sample's decisions are drawn in JAX (``draw``) and resolved into devices on
the host in one pass (``resolve``: parents come before their children).
Training: ``simplace.rl.pretrain``; the shipped weights and zero-shot placement:
``simplace.rl.pretrained``.
"""

from __future__ import annotations

import math

import numpy as np

from simplace._lazy import LazyModule
from simplace._numba import njit
from simplace.rl.problem import DEVICE_FEATURES, PAIR_FEATURES, UNIT_FEATURES

# Imported on first use: checking whether this module's compiled loop is in numba's
# cache (what a budgeted search does before it starts) must not import JAX.
jax = LazyModule("jax")
jnp = LazyModule("jax.numpy")

NEG = -1e9
HIDDEN = 32
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
    f = _dense(params["follow_out"], jax.nn.relu(_dense(params["follow_in"], jnp.concatenate(
        [x, x[a["parent"]], jnp.broadcast_to(g, x.shape)], -1))))[:, 0]
    return lg, f


def _follow_prob(f, a):
    return jax.nn.sigmoid(f) * a["has_parent"]  # a unit without a parent draws afresh


def draw(params, a, key, num_samples: int):
    """(fresh devices int32[K, U], follow flags bool[K, U]): the random decisions of
    ``num_samples`` placements (module docstring); ``resolve`` turns them into unit
    placements."""
    lg, f = logits(params, a)
    u = lg.shape[0]
    # Two uniforms per unit and sample, drawn as one flat array, the fresh device by
    # inverting the softmax's cumulative distribution: XLA:CPU draws a [K, U, D] Gumbel
    # array several times slower.
    r = jax.random.uniform(key, (2 * num_samples * u,)).reshape(2, num_samples, u)
    cdf = jnp.cumsum(jax.nn.softmax(lg, axis=-1), axis=-1)[:, :-1]  # [U, D-1]
    fresh = jnp.sum(r[1][..., None] >= cdf[None], axis=-1).astype(jnp.int32)
    # rounding can leave the cdf just under 1 before the padded devices: never past them
    fresh = jnp.minimum(fresh, a["device_mask"].sum().astype(jnp.int32) - 1)
    follow = (r[0] < _follow_prob(f, a)[None]) & (a["unit_mask"][None] > 0)
    return fresh, follow


@njit(fastmath=False)
def _resolve_kernel(fresh, follow, parent, out):
    # parents come first (parent[u] <= u), so one pass in unit order resolves chains
    for k in range(fresh.shape[0]):
        for u in range(fresh.shape[1]):
            out[k, u] = out[k, parent[u]] if follow[k, u] else fresh[k, u]


def resolve(fresh, follow, parent) -> np.ndarray:
    """int32[K, U]: unit placements from ``draw``'s decisions (numpy, on the host: XLA's
    gathers for pointer jumping cost several times the policy's forward pass here)."""
    fresh = np.ascontiguousarray(fresh, np.int32)
    out = np.empty_like(fresh)
    _resolve_kernel(fresh, np.ascontiguousarray(follow, np.bool_),
                    np.ascontiguousarray(parent, np.int64), out)
    return out


def chain_logp(params, a, unit_devices):
    """(float32[K]: log P(e) of unit placements int32[K, U] (the product of the module
    docstring) summed over real units, and the mean per-unit entropy of the fresh draws,
    a regulariser)."""
    lg, f = logits(params, a)
    lsm = jax.nn.log_softmax(lg, axis=-1)
    s = _follow_prob(f, a)
    e = unit_devices.astype(jnp.int32)
    q = jnp.exp(jnp.take_along_axis(lsm[None], e[..., None], axis=-1)[..., 0])  # [K, U]
    same = e == e[:, a["parent"]]
    p = jnp.where(same, s[None], 0.0) + (1 - s[None]) * q
    mask = a["unit_mask"]
    lp = (jnp.log(p + 1e-9) * mask[None]).sum(-1)
    ent = -(jnp.exp(lsm) * jnp.where(lsm > NEG / 2, lsm, 0.0)).sum(-1)
    return lp, (ent * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def greedy(lg: np.ndarray, f: np.ndarray, parent: np.ndarray, num_units: int) -> np.ndarray:
    """int32[U]: the greedy unit placement (numpy): every unit follows its parent where
    that is likelier than not, else takes its most probable fresh device; from
    ``logits``' outputs and the padded ``parent``, cut to the real units and devices."""
    lg = np.asarray(lg, np.float64)[:num_units]
    par = np.asarray(parent, np.int64)[:num_units]
    follow = (np.asarray(f, np.float64)[:num_units] > 0) & (par != np.arange(num_units))
    ptr = np.where(follow, par, np.arange(num_units))
    for _ in range(max(1, math.ceil(math.log2(max(num_units, 2))))):
        ptr = ptr[ptr]
    return lg.argmax(1)[ptr].astype(np.int32)

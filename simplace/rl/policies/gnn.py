"""``gnn`` (HSDAG, Duan et al. 2024; Placeto): message passing over the coarsened graph,
a learned pooling that samples a group for every unit, and an MLP that places each
group (a softmax over devices on its pooled embedding).

Node features are the units' (op types, sizes, costs on each device, topological
position, degrees); messages flow both ways along the quotient edges, summed with
``segment_sum`` and gated by the edge's bytes. Groups are pooled with the pooling
probabilities (soft, DiffPool style, the same for every sample); each sample then draws a
group per unit and a device per group. (Pooling each sample's drawn members made every
group's embedding alike, and the placer collapsed to one device.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from simplace.rl.policies import Policy, Sample
from simplace.rl.policies._nets import (
    F32,
    apply_dense,
    categorical_entropy,
    init_dense,
    range_prior,
    sample_categorical,
)


class GNN(Policy):
    """``layers`` rounds of message passing; ``groups`` pooled groups (default
    min(20 x devices, units))."""

    name = "gnn"

    def __init__(self, units, num_devices: int, *, hidden: int = 64, layers: int = 3,
                 groups: int | None = None):
        super().__init__(units, num_devices)
        self.h, self.layers = int(hidden), int(layers)
        self.g = int(groups or min(20 * self.num_devices, self.num_units))
        self.feat = jnp.asarray(units.features, F32)
        self.prior = range_prior(self.num_units, self.g)
        self.src = jnp.asarray(units.src, jnp.int32)
        self.dst = jnp.asarray(units.dst, jnp.int32)
        self.efeat = jnp.asarray(units.edge_feat, F32)[:, None]
        u = self.num_units
        self.deg_in = jnp.maximum(jnp.zeros(u, F32).at[self.dst].add(1.0), 1.0)[:, None]
        self.deg_out = jnp.maximum(jnp.zeros(u, F32).at[self.src].add(1.0), 1.0)[:, None]

    def init(self, key):
        k = jax.random.split(key, 4 + 2 * self.layers)
        f, h = self.feat.shape[1], self.h
        p = {"embed": init_dense(k[0], h, f), "pool": init_dense(k[1], self.g, h),
             "mlp1": init_dense(k[2], h, h + 1), "mlp2": init_dense(k[3], self.num_devices, h),
             # A free device preference per group: groups whose pooled embeddings are
             # alike (early on, all of them) can still go to different devices.
             "group_bias": jnp.zeros((self.g, self.num_devices), F32)}
        for i in range(self.layers):
            p[f"gate{i}"] = init_dense(k[4 + 2 * i], 1, 1)
            p[f"mp{i}"] = init_dense(k[5 + 2 * i], h, 3 * h)
        return p

    def _embed(self, params):
        u = self.num_units
        x = jax.nn.relu(apply_dense(params["embed"], self.h, self.feat))
        for i in range(self.layers):
            gate = jax.nn.sigmoid(apply_dense(params[f"gate{i}"], 1, self.efeat))  # [E, 1]
            m_in = jax.ops.segment_sum(x[self.src] * gate, self.dst, u) / self.deg_in
            m_out = jax.ops.segment_sum(x[self.dst] * gate, self.src, u) / self.deg_out
            x = x + jax.nn.relu(apply_dense(params[f"mp{i}"], self.h,
                                            jnp.concatenate([x, m_in, m_out], -1)))
        # [U, H], and pooling logits [U, G] around the contiguous-range prior
        return x, apply_dense(params["pool"], self.g, x) + self.prior

    def _place_logits(self, params, x, assign):
        """Device logits [K, G, D] of the groups of assignments [K, U, G]."""
        count = assign.sum(1)
        pooled = jnp.einsum("kug,uh->kgh", assign, x) / jnp.maximum(count, 1.0)[..., None]
        z = jnp.concatenate([pooled, jnp.log1p(count)[..., None]], -1)
        z = jax.nn.relu(apply_dense(params["mlp1"], self.h, z))
        return apply_dense(params["mlp2"], self.num_devices, z) + params["group_bias"], count

    def sample(self, params, key, num_samples):
        kg, kd = jax.random.split(key)
        x, pool = self._embed(params)
        grp, lp_g = sample_categorical(kg, pool, num_samples)  # [K, U]
        logits, _ = self._place_logits(params, x, jax.nn.softmax(pool, axis=-1)[None])
        logits = logits[0]  # [G, D]
        dev = jax.random.categorical(kd, logits, axis=-1,
                                     shape=(num_samples, self.g)).astype(jnp.int32)
        lsm = jax.nn.log_softmax(logits, axis=-1)
        lp_d = jnp.take_along_axis(lsm[None], dev[..., None], axis=-1)[..., 0]  # [K, G]
        used = (jax.nn.one_hot(grp, self.g, dtype=F32).sum(1) > 0).astype(F32)
        unit_dev = jnp.take_along_axis(dev, grp, axis=1)
        logp = lp_g.sum(-1) + (lp_d * used).sum(-1)
        # The bonus keeps device choices open; on the pooling it would only push every
        # unit towards a uniform mix of groups (the range prior's structure lost).
        ent = (categorical_entropy(logits)[None] * used).sum(-1)
        return Sample(unit_dev, logp, ent)

    def imitation_logp(self, params, unit_devices):
        """Exact for independent group placements: P(u on d) = sum_g P(u in g) q_g(d),
        with q from the soft pooled embeddings."""
        d_u = jnp.asarray(unit_devices, jnp.int32)
        x, pool = self._embed(params)
        s = jax.nn.softmax(pool, axis=-1)
        logits, _ = self._place_logits(params, x, s[None])
        q = jax.nn.softmax(logits[0], axis=-1)  # [G, D]
        lik = jnp.sum(s * q[:, d_u].T, axis=-1)
        return jnp.log(lik + 1e-9).mean()

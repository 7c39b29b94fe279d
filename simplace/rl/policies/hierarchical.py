"""``hierarchical`` (Mirhoseini et al. 2018; Liu et al. 2019): a feed-forward grouper
puts every unit into one of G groups (a softmax over groups per unit), and a seq2seq
placer (bidirectional LSTM encoder, attention decoder) puts every group on a device.
Both are trained with one REINFORCE loss: a sample's log-probability is the sum of the
grouper's and the placer's.

Group embeddings are pooled with the grouper's probabilities (soft, the same for every
sample) rather than from each sample's drawn groups: a group then keeps one identity
across samples ("group 3 goes to GPU 1") that units learn to join, where embeddings of
randomly drawn members are all alike early on and the placer collapsed to one device.
The encoder and the decoder's attention keys are thus computed once per update."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simplace.rl.policies import Policy, Sample
from simplace.rl.policies._nets import (
    F32,
    AttentionDecoder,
    apply_dense,
    f32,
    init_dense,
    init_lstm,
    param_rng,
    range_prior,
    run_lstm,
    sample_categorical,
)


class Hierarchical(Policy):
    """``groups`` defaults to min(256, 20 x devices, units), the paper's rule."""

    name = "hierarchical"

    def __init__(self, units, num_devices: int, *, hidden: int = 64, groups: int | None = None,
                 grouper_hidden: int = 64, attention: int = 32):
        super().__init__(units, num_devices)
        self.h, self.gh = int(hidden), int(grouper_hidden)
        self.g = int(groups or min(256, 20 * self.num_devices, self.num_units))
        self.feat = jnp.asarray(units.features, F32)
        self.prior = range_prior(self.num_units, self.g)
        self.dec = AttentionDecoder(self.h, self.num_devices, attention)

    def init(self, key):
        """A fresh parameter tree: grouper, group encoder, decoder and per-group device bias."""
        rng, f = param_rng(key), self.feat.shape[1]
        return {"g1": init_dense(rng, self.gh, f), "g2": init_dense(rng, self.g, self.gh),
                "embed": init_dense(rng, self.h, f + 1),
                "fwd": init_lstm(rng, self.h, self.h), "bwd": init_lstm(rng, self.h, self.h),
                "merge": init_dense(rng, self.h, 2 * self.h),
                "dec": self.dec.init(rng, self.h),
                # A free device preference per group: groups whose embeddings are alike
                # (early on, all of them) can still go to different devices.
                "group_bias": f32(np.zeros((self.g, self.num_devices)))}

    def _group_logits(self, params):
        x = jax.nn.relu(apply_dense(params["g1"], self.gh, self.feat))
        return apply_dense(params["g2"], self.g, x) + self.prior  # [U, G]

    def _encode(self, params, assign):
        """Encoder states [K, G, H] from soft or hard assignments [K, U, G]: a group's
        embedding is the mean of its units' features and the log of its size."""
        count = assign.sum(1)  # [K, G]
        mean = jnp.einsum("kug,uf->kgf", assign, self.feat) / jnp.maximum(count, 1.0)[..., None]
        x = jnp.concatenate([mean, jnp.log1p(count)[..., None]], -1)
        x = jnp.tanh(apply_dense(params["embed"], self.h, x))
        both = jnp.concatenate([run_lstm(params["fwd"], self.h, x),
                                run_lstm(params["bwd"], self.h, x, reverse=True)], -1)
        return jnp.tanh(apply_dense(params["merge"], self.h, both)), count

    def sample(self, params, key, num_samples):
        """``num_samples`` placements: each unit's group drawn by the grouper, each group's device
        by the decoder."""
        kg, kd = jax.random.split(key)
        logits = self._group_logits(params)
        grp, lp_g = sample_categorical(kg, logits, num_samples)  # [K, U]
        enc, _ = self._encode(params, jax.nn.softmax(logits, axis=-1)[None])  # [1, G, H]
        acts, lp_d, ent_d, _ = self.dec(params["dec"], enc, kd, num_samples,
                                        bias=params["group_bias"])
        count = jax.nn.one_hot(grp, self.g, dtype=F32).sum(1)  # [K, G]
        used = (count > 0).astype(F32)  # an empty group's device changes nothing
        unit_dev = jnp.take_along_axis(acts, grp, axis=1)
        logp = lp_g.sum(-1) + (lp_d * used).sum(-1)
        # The bonus keeps device choices open; on the grouping it would only push every
        # unit towards a uniform mix of groups (the range prior's structure lost).
        ent = (ent_d * used).sum(-1)
        return Sample(unit_dev, logp, ent)

    def imitation_logp(self, params, unit_devices):
        """The placer is teacher-forced on each group's (soft) majority target device;
        the likelihood of unit u's device is sum_g P(u in g) P(g on d_u)."""
        d_u = jnp.asarray(unit_devices, jnp.int32)
        s = jax.nn.softmax(self._group_logits(params), axis=-1)  # [U, G]
        enc, _ = self._encode(params, s[None])
        votes = jax.lax.stop_gradient(s).T @ jax.nn.one_hot(d_u, self.num_devices, dtype=F32)
        target = jnp.argmax(votes, axis=-1)[None]  # [1, G]
        _, _, _, lpa = self.dec(params["dec"], enc, jax.random.key(0), 1, forced=target,
                                bias=params["group_bias"])
        q = jnp.exp(lpa[0])  # [G, D]
        lik = jnp.sum(s * q[:, d_u].T, axis=-1)  # [U]
        return jnp.log(lik + 1e-9).mean()

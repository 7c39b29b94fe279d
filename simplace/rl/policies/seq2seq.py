"""``seq2seq`` (Mirhoseini et al. 2017): an LSTM encoder over the units' embeddings and
an attention decoder that emits one device per unit, in topological order."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from simplace.rl.policies import Policy, Sample
from simplace.rl.policies._nets import (
    F32,
    AttentionDecoder,
    apply_dense,
    init_dense,
    init_lstm,
    param_rng,
    run_lstm,
)


class Seq2Seq(Policy):
    """Units are the co-location groups; the encoder runs once per update (it does not
    depend on the samples), the decoder once per sample."""

    name = "seq2seq"

    def __init__(self, units, num_devices: int, *, hidden: int = 64, attention: int = 32):
        super().__init__(units, num_devices)
        self.h = int(hidden)
        self.feat = jnp.asarray(units.features, F32)
        self.dec = AttentionDecoder(self.h, self.num_devices, attention)

    def init(self, key):
        rng, f = param_rng(key), self.feat.shape[1]
        return {"embed": init_dense(rng, self.h, f), "enc": init_lstm(rng, self.h, self.h),
                "dec": self.dec.init(rng, self.h)}

    def _encode(self, params):
        x = jnp.tanh(apply_dense(params["embed"], self.h, self.feat))[None]  # [1, U, H]
        return run_lstm(params["enc"], self.h, x)  # [1, U, H]

    def sample(self, params, key, num_samples):
        acts, lp, ent, _ = self.dec(params["dec"], self._encode(params), key, num_samples)
        return Sample(acts, lp.sum(-1), ent.sum(-1))

    def imitation_logp(self, params, unit_devices):
        forced = jnp.asarray(unit_devices, jnp.int32)[None]
        _, lp, _, _ = self.dec(params["dec"], self._encode(params), jax.random.key(0), 1,
                               forced=forced)
        return lp.mean()

"""``seq2seq`` (Mirhoseini et al. 2017): an LSTM encoder over the units' embeddings and
an attention decoder that emits one device per unit, in topological order.

Warm start (``warm_start``), as gnn's: a per-unit table added to the decoder's logits
(``unit_bias``, times ``TABLE_SCALE``) is set so that, decoding the target itself, each
unit keeps its target device with probability 1 - ``explore`` / U (about ``explore``
deviations per sample); the network's own logits along the target are cancelled. One
forward program instead of Adam steps of imitation, which compiled a program of their own
and took many steps.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from simplace.rl.policies import Policy, Sample
from simplace.rl.policies._nets import (
    TABLE_SCALE,
    AttentionDecoder,
    apply_dense,
    check_explore,
    f32,
    init_dense,
    init_lstm,
    param_rng,
    run_lstm,
)


class Seq2Seq(Policy):
    """Units are the co-location groups; the encoder runs once per update (it does not
    depend on the samples), the decoder once per sample."""

    name = "seq2seq"

    def __init__(self, units, num_devices: int, *, hidden: int = 64, attention: int = 32,
                 explore: float = 2.0):
        super().__init__(units, num_devices)
        self.h = int(hidden)
        self.explore = check_explore(explore)
        self.feat = f32(units.features)
        self.dec = AttentionDecoder(self.h, self.num_devices, attention)
        self._forced_jit = None  # compiled on the first warm start

    def init(self, key):
        """A fresh parameter tree: embedding, encoder, decoder and per-unit device bias."""
        rng, f = param_rng(key), self.feat.shape[1]
        return {"embed": init_dense(rng, self.h, f), "enc": init_lstm(rng, self.h, self.h),
                "dec": self.dec.init(rng, self.h),
                "unit_bias": f32(np.zeros((self.num_units, self.num_devices)))}

    def _bias(self, params):
        return TABLE_SCALE * params["unit_bias"]

    def _encode(self, params):
        x = jnp.tanh(apply_dense(params["embed"], self.h, self.feat))[None]  # [1, U, H]
        return run_lstm(params["enc"], self.h, x)  # [1, U, H]

    def sample(self, params, key, num_samples):
        """``num_samples`` placements decoded one unit at a time, with their log-probabilities."""
        acts, lp, ent, _ = self.dec(params["dec"], self._encode(params), key, num_samples,
                                    bias=self._bias(params))
        return Sample(acts, lp.sum(-1), ent.sum(-1))

    def _forced_logp(self, params, unit_devices):
        """float32[U, D]: every device's log-probability at each unit, decoding
        ``unit_devices`` (teacher forcing)."""
        forced = jnp.asarray(unit_devices, jnp.int32)[None]
        _, _, _, lpa = self.dec(params["dec"], self._encode(params), jax.random.key(0), 1,
                                forced=forced, bias=self._bias(params))
        return lpa[0]

    def imitation_logp(self, params, unit_devices):
        """Mean log-probability per unit of the unit placement ``unit_devices`` int32[U], decoded
        with teacher forcing."""
        lpa = self._forced_logp(params, unit_devices)
        d_u = jnp.asarray(unit_devices, jnp.int32)
        return jnp.take_along_axis(lpa, d_u[:, None], axis=1).mean()

    def _host_forced_logp(self, params, unit_devices) -> np.ndarray:
        """``_forced_logp`` as float64 numpy, from one compiled program kept for restarts."""
        if self._forced_jit is None:
            self._forced_jit = jax.jit(self._forced_logp)
        return np.asarray(self._forced_jit(params, jnp.asarray(unit_devices, jnp.int32)),
                          np.float64)

    def host_imitation_logp(self, params, unit_devices) -> float:
        """``imitation_logp`` from the program the warm start compiles (nothing new)."""
        d_u = np.asarray(unit_devices, np.int64)
        lpa = self._host_forced_logp(params, d_u)
        return float(lpa[np.arange(len(d_u)), d_u].mean())

    def warm_start(self, params, unit_devices):
        """Parameters that decode ``unit_devices`` int32[U] up to about ``explore``
        deviations per sample (module docstring): along the target, the logits become
        ``c e_target`` (``c`` from the deviation rate), the network's cancelled."""
        # Set in one forward program: Adam steps of imitation compiled a program of their
        # own (2-4 s on a 2-core machine) and took 20-50 steps on the zoo's recurrent models.
        u, d = self.num_units, self.num_devices
        target = np.asarray(unit_devices, np.int64)
        eps = min(0.5, max(self.explore / max(u, 1), 1e-4))
        # softmax(c e_t) puts 1 - eps on t: c = log((1 - eps) (D - 1) / eps)
        c = math.log((1 - eps) * max(d - 1, 1) / eps)
        bare = {**params, "unit_bias": f32(np.zeros((u, d)))}
        net = self._host_forced_logp(bare, target)  # log-softmax: the same softmax
        want = c * np.eye(d)[target]
        return {**params, "unit_bias": f32((want - net) / TABLE_SCALE)}

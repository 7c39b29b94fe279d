"""``gnn`` (HSDAG, Duan et al. 2024): message passing over the coarsened graph and an MLP
that places every coarse node (unit), with run-preserving sampling.

The graph is coarsened before the policy sees it (``features.unit_grouping``: free ops
with their producer, chains collapsed as HSDAG's code merges an op into a successor with
one predecessor, then contiguous ranges), so the policy places a few hundred units and a
placement is expanded to ops by one gather. Node features are the units' (sizes, costs on
each device, op types, topological position, degrees); messages flow both ways along the
quotient edges, summed with ``segment_sum`` and gated by the edge's bytes.

Sampling is cheap and keeps runs: units are visited in topological order and each either
**follows** its predecessor (takes the device of unit u-1, probability sigmoid(f_u)) or
draws a **fresh** device from softmax(a_u). A sample's device of unit u is then the fresh
draw of the last unit at or before u that did not follow: one ``cummax`` and a gather,
no scan, O(K x U x D) work. A fresh draw that leaves the current device starts a run of
units on the new device (a block move, not a scattered op), which is what placements
under segment semantics need: every device change costs a segment launch and dispatch.
The actions are the follow flags and the fresh draws at units that did not follow, so a
sample's log-probability is the sum of those decisions' log-probabilities.

Warm start (``warm_start``): the per-unit bias tables are set so that the policy
reproduces a given unit placement except for about ``explore`` fresh deviations per
sample (a temperature around it); training then moves probability to what improves it.
Groups (``groups``, contiguous ranges of units) share a learned device bias, so that
what is learned for some units of a range carries to its neighbours.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from simplace.rl.policies import Policy, Sample
from simplace.rl.policies._nets import TABLE_SCALE, apply_dense, check_explore, f32, param_rng


class GNN(Policy):
    """``layers`` rounds of message passing of width ``hidden``; ``groups`` contiguous
    ranges of units with a shared device bias (default min(20 x devices, units));
    ``explore``: expected fresh deviations per sample after a warm start."""

    name = "gnn"

    def __init__(self, units, num_devices: int, *, hidden: int = 32, layers: int = 2,
                 groups: int | None = None, explore: float = 2.0):
        super().__init__(units, num_devices)
        self.h, self.layers = int(hidden), int(layers)
        u = self.num_units
        self.g = max(1, min(int(groups or 20 * self.num_devices), max(u, 1)))
        self.explore = check_explore(explore)
        self._net_logits_jit = None  # compiled on the first warm start (warm_start)
        # Constants built with numpy: eager JAX ops would compile a small program each.
        src, dst = np.asarray(units.src, np.int32), np.asarray(units.dst, np.int32)
        self.feat = f32(units.features)
        self.group_of_unit = jnp.asarray((np.arange(u) * self.g) // max(u, 1), jnp.int32)
        self.src, self.dst = jnp.asarray(src), jnp.asarray(dst)
        self.efeat = f32(np.asarray(units.edge_feat)[:, None])
        self.deg_in = f32(np.maximum(np.bincount(dst, minlength=u), 1)[:, None])
        self.deg_out = f32(np.maximum(np.bincount(src, minlength=u), 1)[:, None])
        # Unit 0 has no predecessor to follow.
        self.first = jnp.asarray(np.arange(u) == 0)

    def init(self, key):
        """Fresh parameters from ``key``, drawn with numpy (LeCun-normal kernels, zero
        biases, as flax's ``Dense``): flax's initialisers would compile a dozen small
        programs, seconds on a loaded machine."""
        rng = param_rng(key)
        f, h, d = self.feat.shape[1], self.h, self.num_devices

        def dense(out, inp):
            w = rng.normal(0.0, 1.0 / math.sqrt(max(inp, 1)), (inp, out))
            return {"kernel": f32(w), "bias": f32(np.zeros(out))}

        p = {"embed": dense(h, f), "dev": dense(d, h), "follow": dense(1, h),
             # Free per-unit and per-group tables: the warm start is written into them,
             # and they let units whose embeddings are alike go different ways.
             "unit_bias": f32(np.zeros((self.num_units, d))),
             "follow_bias": f32(np.zeros(self.num_units)),
             "group_bias": f32(np.zeros((self.g, d)))}
        for i in range(self.layers):
            p[f"gate{i}"] = dense(1, 1)
            p[f"mp{i}"] = dense(h, 3 * h)
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
        return x

    def _net_logits(self, params):
        """(fresh-device logits [U, D] and follow logits [U]) without the unit tables."""
        x = self._embed(params)
        a = apply_dense(params["dev"], self.num_devices, x) + \
            TABLE_SCALE * params["group_bias"][self.group_of_unit]
        f = apply_dense(params["follow"], 1, x)[:, 0]
        return a, f

    def logits(self, params):
        """(fresh-device logits float32[U, D], follow logits float32[U]; unit 0 never
        follows, whatever its logit)."""
        a, f = self._net_logits(params)
        return (a + TABLE_SCALE * params["unit_bias"],
                f + TABLE_SCALE * params["follow_bias"])

    def sample(self, params, key, num_samples):
        """``num_samples`` placements drawn by follow-or-fresh decisions per unit (see the module
        docstring)."""
        a, f = self.logits(params)
        u = self.num_units
        lsm = jax.nn.log_softmax(a, axis=-1)  # [U, D]
        # Two uniforms per unit and sample, drawn as one flat array (XLA:CPU compiles a
        # flat threefry draw several times faster than a [K, U, D] Gumbel draw): one
        # decides whether to follow, the other picks the fresh device by inverting the
        # softmax's cumulative distribution.
        r = jax.random.uniform(key, (2 * num_samples * u,)).reshape(2, num_samples, u)
        cdf = jax.lax.stop_gradient(jnp.cumsum(jnp.exp(lsm), axis=-1))[:, :-1]  # [U, D-1]
        fresh = jnp.sum(r[1][..., None] >= cdf[None], axis=-1).astype(jnp.int32)
        follow = (r[0] < jax.lax.stop_gradient(jax.nn.sigmoid(f))[None]) & ~self.first[None]
        # Each unit takes the fresh draw of the last unit at or before it that drew one.
        idx = jnp.where(follow, -1, jnp.arange(u, dtype=jnp.int32)[None])
        src = jax.lax.cummax(idx, axis=1)
        dev = jnp.take_along_axis(fresh, src, axis=1)
        lp_fresh = jnp.take_along_axis(lsm[None], fresh[..., None], axis=-1)[..., 0]
        log_follow, log_fresh = jax.nn.log_sigmoid(f), jax.nn.log_sigmoid(-f)
        # unit 0 makes no follow decision: only its fresh draw counts
        log_fresh = jnp.where(self.first, 0.0, log_fresh)
        lp = jnp.where(follow, log_follow[None], log_fresh[None] + lp_fresh)
        ent_d = -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)  # [U]
        p_f = jax.nn.sigmoid(f)
        ent_f = jnp.where(self.first, 0.0, -(p_f * log_follow + (1 - p_f) * log_fresh))
        ent = jnp.where(follow, 0.0, ent_d[None]).sum(-1) + ent_f.sum()
        return Sample(dev, lp.sum(-1), ent)

    def marginals(self, params):
        """float32[U, D]: the probability of each unit's device (a forward recursion,
        P(u on d) = s_u P(u-1 on d) + (1 - s_u) softmax(a_u)_d)."""
        a, f = self.logits(params)
        q = jax.nn.softmax(a, axis=-1)
        s = jnp.where(self.first, 0.0, jax.nn.sigmoid(f))

        def step(prev, x):
            q_u, s_u = x
            cur = s_u * prev + (1 - s_u) * q_u
            return cur, cur

        _, m = jax.lax.scan(step, q[0], (q, s))
        return m

    def imitation_logp(self, params, unit_devices):
        """Mean log-likelihood per unit of a unit placement int32[U]: of the whole
        sequence, divided by U. The devices form a Markov chain (unit u keeps unit
        u-1's device with probability s_u, else draws from softmax(a_u)), so

          P(e) = prod_u [s_u 1(e_u = e_(u-1)) + (1 - s_u) softmax(a_u)[e_u]],

        exact and without the marginals' scan over units: that scan and its gradient (in
        every update, for self-imitation) took seconds to compile on big graphs."""
        d_u = jnp.asarray(unit_devices, jnp.int32)
        a, f = self.logits(params)
        q = jnp.take_along_axis(jax.nn.softmax(a, axis=-1), d_u[:, None], axis=-1)[:, 0]
        s = jnp.where(self.first, 0.0, jax.nn.sigmoid(f))
        same = jnp.concatenate([jnp.zeros(1, bool), d_u[1:] == d_u[:-1]])
        p = jnp.where(same, s, 0.0) + (1 - s) * q
        return jnp.log(p + 1e-9).mean()

    def _host_net_logits(self, params) -> tuple[np.ndarray, np.ndarray]:
        """``_net_logits`` as numpy arrays, from one compiled program kept for restarts
        (not a few dozen eager ops that each compile: seconds of a short run's
        budget)."""
        # Those eager compilations took seconds on a loaded 2-core machine.
        if self._net_logits_jit is None:
            self._net_logits_jit = jax.jit(self._net_logits)
        a, f = self._net_logits_jit(params)
        return np.asarray(a, np.float64), np.asarray(f, np.float64)

    def host_imitation_logp(self, params, unit_devices) -> float:
        """``imitation_logp`` computed on the host (numpy) from the program that the
        warm start compiles anyway: the trainer reports a warm start's likelihood
        without compiling ``imitation_logp`` for it."""
        a_net, f_net = self._host_net_logits(params)
        a = a_net + TABLE_SCALE * np.asarray(params["unit_bias"], np.float64)
        f = f_net + TABLE_SCALE * np.asarray(params["follow_bias"], np.float64)
        d_u = np.asarray(unit_devices, np.int64)
        a = a - a.max(axis=1, keepdims=True)
        q = np.exp(a[np.arange(len(d_u)), d_u]) / np.exp(a).sum(axis=1)
        s = np.where(np.asarray(self.first), 0.0, 1.0 / (1.0 + np.exp(-f)))
        same = np.concatenate([[False], d_u[1:] == d_u[:-1]])
        return float(np.log(np.where(same, s, 0.0) + (1 - s) * q + 1e-9).mean())

    def warm_start(self, params, unit_devices):
        """Parameters whose samples reproduce ``unit_devices`` int32[U] up to about
        ``explore`` fresh deviations per sample: each unit's fresh draw keeps its target
        device with probability 1 - explore / (U / 2), and follows its predecessor with
        probability 1/2 where their targets agree (else rarely), so a deviation moves a
        short run of units. The network's own logits are cancelled by the unit tables,
        so training starts exactly there and can move away from it."""
        u, d = self.num_units, self.num_devices
        target = np.asarray(unit_devices, np.int64)
        eps = min(0.5, self.explore / max(u / 2, 1.0))
        eps = max(eps, 1e-4)
        # softmax(c e_t) puts 1 - eps on t: c = log((1 - eps) (D - 1) / eps)
        c = math.log((1 - eps) * max(d - 1, 1) / eps)
        a_net, f_net = self._host_net_logits(params)
        want_a = c * np.eye(d, dtype=np.float32)[target]
        same = np.zeros(u, bool)
        same[1:] = target[1:] == target[:-1]
        # follow logit 0 (p 1/2) inside a run; at a device change log(eps / (1 - eps))
        want_f = np.where(same, 0.0, math.log(eps / (1 - eps))).astype(np.float32)
        new = dict(params)
        new["unit_bias"] = f32((want_a - a_net) / TABLE_SCALE)
        new["follow_bias"] = f32((want_f - f_net) / TABLE_SCALE)
        return new

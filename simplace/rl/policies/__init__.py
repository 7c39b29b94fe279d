"""Placement policies, all with one interface (``Policy``), built by ``make_policy``.

A policy is a pair of pure functions over an explicit parameter tree, optax style:
``init(key) -> params`` and ``sample(params, key, K) -> Sample``; plus
``imitation_logp(params, unit_devices)`` for warm starts. Everything a policy knows
about the problem (unit features, quotient edges) is fixed at construction and closed
over as constants, so that the whole REINFORCE update can be one jitted function.
"""

from __future__ import annotations

from typing import NamedTuple

from simplace.errors import SimplaceError


class Sample(NamedTuple):
    """K placements sampled from a policy.

    unit_devices: int32[K, U], the device of each unit.
    logp: float32[K], log-probability of each sample (differentiable in the params).
    entropy: float32[K], entropy of the distributions the sample was drawn from.
    """

    unit_devices: object
    logp: object
    entropy: object


class Policy:
    """Interface of every policy; see the module docstring.

    Attributes: name, num_units (U), num_devices (D).
    """

    name = "policy"

    def __init__(self, units, num_devices: int):
        self.units = units
        self.num_units = units.num_units
        self.num_devices = int(num_devices)

    def init(self, key) -> dict:
        """A fresh parameter tree."""
        raise NotImplementedError

    def sample(self, params, key, num_samples: int) -> Sample:
        """``num_samples`` placements of the units, with their log-probabilities."""
        raise NotImplementedError

    def imitation_logp(self, params, unit_devices):
        """Mean log-likelihood per unit of one unit placement int32[U] (warm start)."""
        raise NotImplementedError


POLICIES = ("seq2seq", "hierarchical", "gnn")


def make_policy(name: str, units, num_devices: int, **kw) -> Policy:
    """The policy ``name`` (one of ``POLICIES``) over ``units`` (``features.Units``).

    Keyword options go to the policy's constructor (``hidden``, ``groups``...)."""
    if name == "seq2seq":
        from simplace.rl.policies.seq2seq import Seq2Seq as cls
    elif name == "hierarchical":
        from simplace.rl.policies.hierarchical import Hierarchical as cls
    elif name == "gnn":
        from simplace.rl.policies.gnn import GNN as cls
    else:
        raise SimplaceError(f"Unknown policy {name!r}: use one of {', '.join(POLICIES)}.")
    return cls(units, num_devices, **kw)

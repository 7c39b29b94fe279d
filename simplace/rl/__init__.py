"""REINFORCE placement policies in JAX: features, policies, the engine, checkpoints.

``simplace optimize MODEL --method rl-seq2seq | rl-hierarchical | rl-gnn`` runs them
(``simplace.placers.rl``); this package is the engine behind those methods:

* ``features``: units (co-location groups of ops) and their features;
* ``policies``: ``seq2seq``, ``hierarchical`` and ``gnn``, one interface (``Policy``);
* ``reinforce``: ``RLConfig``, ``Trainer`` (the jitted update) and ``train``;
* ``checkpoint`` and ``history``: resumable runs, reward curves and their plots.
"""

from simplace.rl.features import Units, build_units, unit_grouping
from simplace.rl.history import plot_history, save_history
from simplace.rl.policies import POLICIES, Policy, Sample, make_policy
from simplace.rl.reinforce import RLConfig, Trainer, TrainResult, train

__all__ = [
    "POLICIES",
    "Policy",
    "RLConfig",
    "Sample",
    "TrainResult",
    "Trainer",
    "Units",
    "build_units",
    "make_policy",
    "plot_history",
    "save_history",
    "train",
    "unit_grouping",
]

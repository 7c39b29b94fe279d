"""REINFORCE placement policies in JAX: features, policies, the engine, checkpoints, and
the pretrained universal policy.

``simplace optimize MODEL --method rl-seq2seq | rl-hierarchical | rl-gnn`` runs the
per-graph policies (``simplace.placers.rl``); ``rl-pretrained`` and ``rl-universal``
run the pretrained one (``simplace.placers.pretrained``). This package is the engine:

* ``features``: units (co-location groups of ops) and their features;
* ``policies``: ``seq2seq``, ``hierarchical`` and ``gnn``, one interface (``Policy``),
  and ``universal``, the pretrained policy's network;
* ``config`` (``RLConfig``), ``trainer`` (``Trainer``, the jitted update), ``reinforce``
  (``train``), with ``legs`` (resumed runs) and ``stints`` (restarts, the polish);
* ``checkpoint`` and ``history``: resumable runs, reward curves and their plots;
* ``problem``, ``distribution``, ``pretrain`` and ``pretrained``: what the universal
  policy sees, what it is trained on, its training and its shipped weights.
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

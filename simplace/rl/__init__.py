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

from simplace import _lazy

# Exported names and the modules that define them, imported on first use: the
# command line builds its parser from this package's light modules without
# importing the rest (flax, scipy.optimize).
__getattr__, __dir__ = _lazy.exports(globals(), {
    "Units": "simplace.rl.features",
    "build_units": "simplace.rl.features",
    "unit_grouping": "simplace.rl.features",
    "plot_history": "simplace.rl.history",
    "save_history": "simplace.rl.history",
    "POLICIES": "simplace.rl.policies",
    "Policy": "simplace.rl.policies",
    "Sample": "simplace.rl.policies",
    "make_policy": "simplace.rl.policies",
    "RLConfig": "simplace.rl.reinforce",
    "Trainer": "simplace.rl.reinforce",
    "TrainResult": "simplace.rl.reinforce",
    "train": "simplace.rl.reinforce",
})

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

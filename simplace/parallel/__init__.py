"""PaSE: parallelization strategies by dynamic programming (Elango, IPDPS 2021).

``parallelize(graph, cost_model, devices=P, method="pase" | "data_parallel" | "expert")``
reads a layer graph off an OpGraph's module paths (``layers``), enumerates split
configurations per layer (``configs``), prices them on a simplace CostModel (``costs``),
finds the cheapest strategy exactly by dynamic programming over a small-dependent-set
vertex ordering (``search``), and expresses it as a JAX ``Mesh`` with ``PartitionSpec``s
(``sharding``); ``shard`` runs a model function with them.
"""

from simplace.parallel.layers import LayerGraph, ParallelizeError, build_layer_graph
from simplace.parallel.search import SearchTooLargeError
from simplace.parallel.strategy import METHODS, LayerPlan, Strategy, parallelize, shard

__all__ = [
    "METHODS",
    "LayerGraph",
    "LayerPlan",
    "ParallelizeError",
    "SearchTooLargeError",
    "Strategy",
    "build_layer_graph",
    "parallelize",
    "shard",
]

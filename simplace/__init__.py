"""simplace: simulator-first device placement for JAX computation graphs.

Importing simplace starts no JAX backend and probes no hardware; that happens only
when a function that needs it is called.
"""

from simplace.errors import (
    CostModelError,
    GraphError,
    GroupingError,
    ModelError,
    PlacementError,
    SimplaceError,
    TraceError,
)
from simplace.cost_model import CostModel, Corrections, Device, Provenance
from simplace.graph import OpGraph

__version__ = "0.1.0"

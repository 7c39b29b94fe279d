"""simplace: simulator-first device placement for JAX computation graphs.

Importing simplace starts no JAX backend and probes no hardware; that happens only
when a function that needs it is called.
"""

import time as _time

# When this process imported simplace: where the `simplace` command's --budget-s clock
# starts (importing JAX is part of the wait a user sees).
_IMPORTED_AT = _time.perf_counter()

from simplace import _lazy, validate  # the package; called, the function validate()
from simplace.cost_model import CostModel, Device, Provenance
from simplace.errors import (
    CalibrationError,
    CostModelError,
    GraphError,
    GroupingError,
    ModelError,
    PlacementError,
    SimplaceError,
    TraceError,
)
from simplace.graph import Aval, OpGraph
from simplace.groups import coarsen
from simplace.parallel import Strategy, parallelize
from simplace.placement import Placement
from simplace.placers import compare, optimize
from simplace.profile import Profile, profile
from simplace.scales import Scales
from simplace.sim import batched_simulator, lower_bound, simulate
from simplace.trace import trace

__version__ = "0.1.0"

# ``apply`` runs a placement and imports JAX: imported on first use, so that importing
# simplace (every command) does not wait for JAX.
__getattr__, __dir__ = _lazy.exports(globals(), {"apply": "simplace.hardware.executor"})

__all__ = [
    "Aval",
    "CalibrationError",
    "CostModel",
    "CostModelError",
    "Device",
    "GraphError",
    "GroupingError",
    "ModelError",
    "OpGraph",
    "Placement",
    "PlacementError",
    "Profile",
    "Provenance",
    "Scales",
    "SimplaceError",
    "Strategy",
    "TraceError",
    "apply",
    "batched_simulator",
    "lower_bound",
    "optimize",
    "parallelize",
    "profile",
    "simulate",
    "coarsen",
    "compare",
    "trace",
    "validate",
]

"""Simulators of one training/inference step of a placed graph, and lower bounds.

``simulate`` is the reference (plain Python, the oracle); ``batched_simulator`` returns
a function that simulates many placements at once with the same semantics: the native
one (``simplace.sim.native``, a compiled loop; needs numba, a default dependency) where
numba is installed, else the jitted JAX scan (``BatchedSimulator``); ``lower_bound`` is
a step time no placement can beat.
"""

from simplace import _lazy
from simplace.sim.batched import batched_simulator
from simplace.sim.bounds import critical_path_s, lower_bound
from simplace.sim.inputs import SimInputs, check_placement, make_sim_inputs, sim_inputs
from simplace.sim.reference import Schedule, SimResult, simulate
from simplace.sim.results import BatchResult

# The JAX simulator imports JAX: imported on first use, so that commands and placers
# that simulate only with the native one do not wait for it.
__getattr__, __dir__ = _lazy.exports(globals(), {"BatchedSimulator": "simplace.sim._scan"})

__all__ = [
    "BatchResult",
    "BatchedSimulator",
    "Schedule",
    "SimInputs",
    "SimResult",
    "batched_simulator",
    "check_placement",
    "critical_path_s",
    "lower_bound",
    "make_sim_inputs",
    "sim_inputs",
    "simulate",
]

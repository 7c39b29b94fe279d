"""Running on hardware: what calibration and validation share.

* ``executor``: run a placement for real (``apply``, ``prepare``, ``measure``): the op
  sequence cut into per-device jitted segments, tensors moved with ``jax.device_put``
  as the simulator models it;
* ``timing``: the timing harness (``time_fn``, ``robust_stats``, ``Timing``);
* ``devices``: JAX devices by name (``resolve_devices``, ``select_devices``), and
  virtual CPU devices (``use_cpu_devices``);
* ``records``: one typed record class per kind of measurement (calibration's and
  validation's), read and written by one codec.

This package imports neither ``simplace.calibrate`` nor ``simplace.validate``; both
import it.
"""

from simplace import _lazy
from simplace.hardware.devices import (
    all_devices,
    device_name,
    find_devices,
    match_cpu_cost_model,
    resolve_devices,
    select_devices,
    use_cpu_devices,
)
from simplace.hardware.timing import Timing, robust_stats, time_fn

# The executor imports JAX: its names are imported on first use, so that what reads
# records or simulates does not wait for JAX.
__getattr__, __dir__ = _lazy.exports(globals(), {
    name: "simplace.hardware.executor"
    for name in ("Measurement", "PlacedFunction", "Program", "apply", "measure", "prepare")})

__all__ = ["Measurement", "PlacedFunction", "Program", "Timing", "all_devices", "apply",
           "device_name", "find_devices", "match_cpu_cost_model", "measure", "prepare",
           "resolve_devices", "robust_stats", "select_devices", "time_fn",
           "use_cpu_devices"]

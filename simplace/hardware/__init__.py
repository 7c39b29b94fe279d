"""Running on hardware: what calibration and validation share.

* ``timing``: the timing harness (``time_fn``, ``robust_stats``, ``Timing``).

This package imports neither ``simplace.calibrate`` nor ``simplace.validate``; both
import it.
"""

from simplace.hardware.timing import Timing, robust_stats, time_fn

__all__ = ["Timing", "robust_stats", "time_fn"]

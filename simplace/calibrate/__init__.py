"""Calibrate a machine in context: segments, launches, host dispatch, links (issue 13).

``calibrate(name)`` measures every device JAX sees and writes the raw records
(``calibration/NAME/records.jsonl``) and the fitted model (``cost_models/NAME.json``),
by default in the user directory (``simplace.paths``);
``refit(name)`` rebuilds the model from the records alone. The timing harness
(``time_fn``, ``robust_stats``, ``Timing``) is shared with validation.
"""

from simplace import _lazy

# Exported names and the modules that define them, imported on first use: the
# command line builds its parser from this package's light modules without
# importing the rest (flax, scipy.optimize).
__getattr__, __dir__ = _lazy.exports(globals(), {
    "build_cost_model": "simplace.calibrate.build",
    "Settings": "simplace.calibrate.core",
    "calibrate": "simplace.calibrate.core",
    "refit": "simplace.calibrate.core",
    "LinkFit": "simplace.calibrate.fit",
    "SegmentFit": "simplace.calibrate.fit",
    "fit_link": "simplace.calibrate.fit",
    "fit_segments": "simplace.calibrate.fit",
    "read_records": "simplace.calibrate.records",
    "write_records": "simplace.calibrate.records",
    "Timing": "simplace.hardware.timing",
    "robust_stats": "simplace.hardware.timing",
    "time_fn": "simplace.hardware.timing",
})

__all__ = [
    "LinkFit",
    "SegmentFit",
    "Settings",
    "Timing",
    "build_cost_model",
    "calibrate",
    "fit_link",
    "fit_segments",
    "read_records",
    "refit",
    "robust_stats",
    "time_fn",
    "write_records",
]

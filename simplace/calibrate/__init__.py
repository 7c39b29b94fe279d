"""Calibrate a machine in context: segments, launches, host dispatch, links (issue 13).

``calibrate(name)`` measures every device JAX sees and writes the raw records
(``calibration/NAME/records.jsonl``) and the fitted model (``cost_models/NAME.json``),
by default in the user directory (``simplace.paths``);
``refit(name)`` rebuilds the model from the records alone. The timing harness
(``time_fn``, ``robust_stats``, ``Timing``) is shared with validation.
"""

from simplace.calibrate.build import build_cost_model
from simplace.calibrate.core import Settings, calibrate, refit
from simplace.calibrate.fit import LinkFit, SegmentFit, fit_link, fit_segments
from simplace.calibrate.records import read_records, write_records
from simplace.hardware.timing import Timing, robust_stats, time_fn

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

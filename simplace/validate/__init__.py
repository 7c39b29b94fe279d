"""Validation: run placements on hardware, compare with the simulator, correct drift.

One module per concept:

* ``executor``: ``simplace.hardware.executor`` under its old name: run a placement for
  real (``apply``, ``prepare``, ``measure``);
* ``hardware``: ``validate(graph, cost_model, placements, fn=..., args=...)`` runs each
  placement and compares the measured step time with the prediction (a
  ``ValidationReport``: rows, MAPE, Kendall tau, raw and corrected);
* ``metrics``: ``mape``, ``kendall_tau``;
* ``records``: validation records in ``calibration/NAME/validation.jsonl``
  (``append_records``, ``read_records``, ``split_records``);
* ``drift``: ``fit_drift`` fits the cost model's drift corrections (``Scales``) to records;
* ``hook``: ``make_validation_callback``, the hook a search calls with its best
  candidates (validate, refit, go on against the corrected model);
* ``cli``: ``simplace validate`` and ``optimize --validate-every``.

The public names of these modules are importable from ``simplace.validate``
(``from simplace.validate import fit_drift``). Called, ``simplace.validate`` is the
function ``validate`` (``simplace.validate(graph, cost_model, placements, fn=fn,
args=args)``): the package is a callable module, so that ``simplace.validate`` can be
both the package (``simplace.validate.drift``) and the function, and neither hides
the other.
"""

import inspect
import sys
import types

from simplace.validate.drift import FIT_PARAMS, DriftFit, fit_drift, priced_with_raw, raw_model
from simplace.validate.hardware import ValidationReport, ValidationRow, validate
from simplace.validate.hook import SearchValidation, ValidationCallback, make_validation_callback
from simplace.validate.metrics import kendall_tau, mape
from simplace.validate.records import (
    RECORD_SCHEMA,
    RECORD_SCHEMA_VERSION,
    append_records,
    calibration_dir,
    read_records,
    split_records,
    validation_path,
)

__all__ = ["FIT_PARAMS", "RECORD_SCHEMA", "RECORD_SCHEMA_VERSION", "DriftFit",
           "SearchValidation", "ValidationCallback", "ValidationReport", "ValidationRow",
           "append_records", "calibration_dir", "fit_drift", "kendall_tau",
           "make_validation_callback", "mape", "priced_with_raw", "raw_model", "read_records",
           "split_records", "validate", "validation_path"]


class _CallableModule(types.ModuleType):
    """The type of the ``simplace.validate`` package: calling it calls ``validate``."""

    def __call__(self, *args, **kwargs) -> ValidationReport:
        return validate(*args, **kwargs)


__signature__ = inspect.signature(validate)  # what inspect and help() show for a call
sys.modules[__name__].__class__ = _CallableModule

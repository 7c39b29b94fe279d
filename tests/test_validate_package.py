"""simplace.validate as a package: its names, and the package called as the function."""

import importlib
import inspect

import numpy as np
import pytest

import simplace
import simplace.zoo
from simplace.cost_model import CostModel
from simplace.errors import SimplaceError

# Every public name ``simplace/validate.py`` had before it became a package.
NAMES_BEFORE = ["DriftFit", "ValidationReport", "ValidationRow", "append_records",
                "SearchValidation", "calibration_dir", "fit_drift", "kendall_tau",
                "make_validation_callback", "mape", "raw_model", "read_records",
                "split_records", "validate", "validation_path", "FIT_PARAMS",
                "RECORD_SCHEMA", "RECORD_SCHEMA_VERSION", "ValidationCallback"]


@pytest.mark.parametrize("name", NAMES_BEFORE)
def test_the_names_of_validate_py_import_from_the_package(name):
    package = importlib.import_module("simplace.validate")
    assert name in package.__all__
    assert getattr(package, name) is not None


def test_each_module_is_reached_as_an_attribute():
    assert simplace.validate.executor.apply is simplace.apply
    assert simplace.validate.fit_drift is simplace.validate.drift.fit_drift
    assert simplace.validate.hardware.validate is simplace.validate.validate
    importlib.import_module("simplace.validate.cli")  # a submodule imported later
    assert callable(simplace.validate.cli.add_parser)


def test_the_package_called_is_the_function_validate():
    fn, args = simplace.zoo.get("mlp", small=True)
    graph = simplace.trace(fn, *args)
    cm = CostModel.synthetic(2, seed=0)
    with pytest.raises(SimplaceError, match="fn= and args="):
        simplace.validate(graph, cm, [np.zeros(graph.num_ops, np.int32)])
    assert list(inspect.signature(simplace.validate).parameters)[:3] == [
        "graph", "cost_model", "placements"]

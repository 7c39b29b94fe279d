import subprocess
import sys

import simplace


def test_every_public_name_imports():
    for name in simplace.__all__:
        assert getattr(simplace, name) is not None, name


def test_import_starts_no_jax_backend():
    # In a fresh interpreter: importing simplace must not initialise a JAX backend
    # (that would fix the device count before a user sets XLA_FLAGS).
    code = ("import simplace, sys\n"
            "from jax._src import xla_bridge\n"
            "sys.exit(1 if xla_bridge._backends else 0)\n")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_errors_are_value_errors():
    for name in ("GraphError", "TraceError", "ModelError", "CostModelError",
                 "PlacementError", "GroupingError", "CalibrationError"):
        err = getattr(simplace, name)
        assert issubclass(err, simplace.SimplaceError) and issubclass(err, ValueError)

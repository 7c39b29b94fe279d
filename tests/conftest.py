"""Test setup: several fake CPU devices (set before JAX is imported) and a --runslow flag."""

import os

# Multi-device code must run everywhere: give the host CPU 4 virtual devices.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _fresh_user_dir(tmp_path_factory):
    """Tests neither read nor write the user's own calibrations (simplace.paths): the user
    directory is an empty temporary one (subprocesses inherit it)."""
    old = os.environ.get("SIMPLACE_HOME")
    os.environ["SIMPLACE_HOME"] = str(tmp_path_factory.mktemp("simplace_home"))
    yield
    if old is None:
        os.environ.pop("SIMPLACE_HOME", None)
    else:
        os.environ["SIMPLACE_HOME"] = old


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

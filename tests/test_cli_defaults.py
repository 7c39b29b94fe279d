"""Defaults of the command line a new user meets: ``calibrate --quick`` on a host without
accelerators calibrates several virtual CPU devices (one device is a model no placement
can use) and says so."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simplace.calibrate import cli as calibrate_cli

REPO = Path(__file__).resolve().parents[1]


def _args(*argv):
    p = argparse.ArgumentParser(prog="simplace")
    calibrate_cli.add_parser(p.add_subparsers(dest="command", required=True))
    return p.parse_args(["calibrate", *argv])


@pytest.mark.parametrize("argv,environ,want", [
    (["--quick"], {"JAX_PLATFORMS": "cpu"}, calibrate_cli.QUICK_CPU_DEVICES),
    (["--quick"], {"JAX_PLATFORMS": "cuda,cpu"}, None),  # an accelerator: leave JAX alone
    (["--quick"], {"JAX_PLATFORMS": "cpu",
                   "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}, None),
    (["--quick", "--cpu-devices", "2"], {"JAX_PLATFORMS": "cpu"}, None),  # given: as given
    (["--quick", "--devices", "cpu:0"], {"JAX_PLATFORMS": "cpu"}, None),
    ([], {"JAX_PLATFORMS": "cpu"}, None),  # the full calibration measures what JAX has
    (["--refit", "--name", "x"], {"JAX_PLATFORMS": "cpu"}, None),
])
def test_quick_splits_the_cpu_only_on_a_cpu_only_host(argv, environ, want):
    assert calibrate_cli.quick_cpu_devices(_args(*argv), environ) == want


def test_cpu_only_is_read_from_the_installed_plugins(monkeypatch):
    import importlib.metadata

    class Dist:
        def __init__(self, name):
            self.metadata = {"Name": name}

    monkeypatch.setattr(importlib.metadata, "distributions",
                        lambda: [Dist("jax"), Dist("jaxlib")])
    assert calibrate_cli._cpu_only_host({})
    monkeypatch.setattr(importlib.metadata, "distributions",
                        lambda: [Dist("jax"), Dist("jax_cuda12_plugin")])
    assert not calibrate_cli._cpu_only_host({})


@pytest.mark.slow
def test_quick_calibration_on_a_cpu_only_host_has_several_devices(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "simplace", "calibrate", "--quick", "--name", "quick_test",
         "--models", "mlp", "--budget-s", "3", "--records-dir", str(tmp_path / "rec"),
         "--cost-model-dir", str(tmp_path / "cm"), "--no-progress"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"split into {calibrate_cli.QUICK_CPU_DEVICES} virtual devices" in proc.stderr
    model = json.loads((tmp_path / "cm" / "quick_test.json").read_text())
    assert [d["name"] for d in model["devices"]] == [
        f"cpu:{k}" for k in range(calibrate_cli.QUICK_CPU_DEVICES)]

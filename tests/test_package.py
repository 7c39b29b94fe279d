"""simplace as a new user gets it: a wheel (not an editable install) in a fresh venv,
run from a folder outside the repository. The datasheet machines must come with the
wheel, and ``simplace calibrate`` must write into the user directory
(``$SIMPLACE_HOME``), never into the install tree.

Slow (a wheel build, a venv, a trace of resnet50 and a short calibration: a few
minutes on 2 cores), so it runs only with ``--runslow``.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# What the wheel is built from: the package and its metadata, copied so that the build
# leaves no build/ or *.egg-info in the working tree.
SOURCES = ("pyproject.toml", "README.md", "simplace")


def _run(cmd, *, cwd, env, timeout=600):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv python, venv simplace script, environment, work folder, user dir)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp / "dist"),
          str(src)], cwd=tmp, env=env)
    (wheel,) = (tmp / "dist").glob("simplace-*.whl")
    # --system-site-packages: jax and the other dependencies come from this interpreter,
    # nothing is downloaded; the wheel itself goes in with --no-deps.
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=tmp, env=env)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / "python"
    _run([python, "-m", "pip", "install", "--no-deps", "--quiet", str(wheel)], cwd=tmp, env=env)
    work, home = tmp / "work", tmp / "home"
    work.mkdir()
    env.update(SIMPLACE_HOME=str(home), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PATH=str(bindir) + os.pathsep + env.get("PATH", ""))
    return python, bindir / "simplace", env, work, home, venv


def test_the_wheel_is_what_runs_and_ships_the_machines(installed):
    python, _, env, work, home, venv = installed
    probe = ("import json, simplace, simplace.paths as p; print(json.dumps({"
             "'file': simplace.__file__, 'checkout': str(p.checkout_dir()), "
             "'machines': sorted(p.available_cost_models())}))")
    out = json.loads(_run([python, "-c", probe], cwd=work, env=env).stdout)
    assert Path(out["file"]).resolve().is_relative_to(venv.resolve()), out["file"]
    assert out["checkout"] == "None"
    shipped = {p.stem for p in (REPO / "simplace" / "machines").glob("*.json")}
    assert shipped and shipped <= set(out["machines"])
    assert "cpu_vm2core_x4" not in out["machines"]  # measured here: stays in the repo


def test_the_wheel_ships_the_pretrained_policy(installed):
    _, simplace, env, work, _, _ = installed
    proc = _run([simplace, "optimize", "mlp", "--cost-model", "haswell_k40x2", "--method",
                 "rl-pretrained"], cwd=work, env=env)
    assert "rl-pretrained" in proc.stdout and "fallback" not in proc.stdout + proc.stderr


def test_warmup_keeps_the_kernels_in_the_installed_package(installed):
    # msr's rulers: no other test here compiles them, and they need no simulator
    _, simplace, env, work, _, _ = installed
    env = {k: v for k, v in env.items() if k != "NUMBA_CACHE_DIR"}  # the package's own
    check = [simplace, "warmup", "--check", "--kernels", "msr"]
    assert "not compiled" in _run(check, cwd=work, env=env).stdout
    out = _run([simplace, "warmup", "--kernels", "msr"], cwd=work, env=env).stdout
    assert "1 of 1 kernels compiled" in out and "could not keep" not in out
    assert "not compiled" not in _run(check, cwd=work, env=env).stdout


def test_simulate_a_shipped_machine(installed):
    _, simplace, env, work, _, _ = installed
    proc = _run([simplace, "simulate", "resnet50", "--cost-model", "cpu_h100x4_nvlink",
                 "--single", "fastest"], cwd=work, env=env)
    assert "machine cpu_h100x4_nvlink (datasheet)" in proc.stdout
    assert "step" in proc.stdout


def test_calibrate_writes_into_the_user_dir(installed):
    python, simplace, env, work, home, venv = installed
    package = Path(_run([python, "-c", "import simplace; print(simplace.__file__)"],
                        cwd=work, env=env).stdout.strip()).parent
    before = sorted(p.relative_to(package) for p in package.rglob("*")
                    if "__pycache__" not in p.parts)
    proc = _run([simplace, "calibrate", "--quick", "--name", "wheel_box", "--models", "mlp",
                 "--budget-s", "20", "--no-progress"], cwd=work, env=env)
    model_file = home / "cost_models" / "wheel_box.json"
    assert str(model_file) in proc.stdout
    model = json.loads(model_file.read_text())
    assert model["provenance"]["source"] == "measured" and len(model["devices"]) == 4
    assert (home / "calibration" / "wheel_box" / "records.jsonl").is_file()
    after = sorted(p.relative_to(package) for p in package.rglob("*")
                   if "__pycache__" not in p.parts)
    assert after == before  # nothing written into the install tree
    assert not list(work.iterdir())  # nor into the folder it ran from
    # the new machine is found by name from then on
    proc = _run([simplace, "simulate", "mlp", "--small", "--cost-model", "wheel_box",
                 "--single", "0"], cwd=work, env=env)
    assert "machine wheel_box (measured)" in proc.stdout

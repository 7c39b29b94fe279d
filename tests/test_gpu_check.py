"""``bench/gpu_check.sh``: the one command a GPU host runs, end to end on this VM's CPU
devices in its quick mode (issue 32, step 5), and its argument checks."""

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_check.sh"


def _run(*args, env=None, timeout=600):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)


def test_gpu_check_refuses_bad_arguments(tmp_path):
    res = _run()
    assert res.returncode == 2 and "usage" in res.stderr
    res = _run(tmp_path, "--total-s", "ten")
    assert res.returncode == 2 and "whole seconds" in res.stderr
    res = _run(tmp_path, "--fast")
    assert res.returncode == 2 and "unknown option --fast" in res.stderr


@pytest.mark.slow
def test_gpu_check_quick_runs_every_stage_into_one_folder(tmp_path):
    """Every stage runs and exits 0; the calibration, the real-size tables (with the
    profile's and the calibration's figures and the pick) and the small-model table
    land in OUT_DIR, and nothing is written outside it (SIMPLACE_HOME unset: OUT/home)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SIMPLACE_HOME", "XLA_FLAGS")}
    out = tmp_path / "out"
    # a generous total: the quick stages end when done; on a loaded CI host they run slow
    res = _run(out, "--quick", "--total-s", 800, env=env, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    status = (out / "status.txt").read_text().splitlines()
    names = [s.split(":")[0] for s in status]
    assert names == ["env", "calibrate", "cost_model", "real_mlp", "real_tiny_cnn",
                     "small_models", "summary"]
    assert all(": exit 0 in" in s for s in status), status
    model = json.loads((out / "gpu_check.json").read_text())
    assert model["name"] == "gpu_check" and (out / "records.jsonl").stat().st_size > 0
    assert (out / "home" / "cost_models" / "gpu_check.json").exists()
    for m in ("mlp", "tiny_cnn"):
        (row,) = json.loads(next(out.glob(f"fidelity_real_*_{m}.json")).read_text())
        assert len(row["placements"]) >= 8
        assert row["mape_profile"] >= 0 and row["mape_calibration"] >= 0
        assert row["pick"] in [p["label"] for p in row["placements"]]
        assert row["profile_wall_s"] > 0
    summary = (out / "summary.txt").read_text()
    assert "MAPE prof" in summary and "real_tiny_cnn: exit 0" in summary
    assert list(out.glob("fidelity_2*.txt"))


def test_gpu_check_a_failing_stage_does_not_stop_the_others(tmp_path):
    """A Python that cannot run simplace: every stage fails, each is reported with its
    exit status, and the script still ends (its summary and status written)."""
    env = dict(os.environ, PYTHON="false")
    res = _run(tmp_path, "--quick", "--total-s", 60, env=env, timeout=120)
    status = (tmp_path / "status.txt").read_text()
    assert "calibrate: exit 1" in status and "small_models: exit 1" in status
    assert "summary: exit 0" in status and "done in" in res.stdout

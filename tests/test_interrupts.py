"""Ctrl-C and SIGTERM during ``simplace optimize`` (the real command in a subprocess):
the search stops at its next step, the best placement so far, the checkpoint and the
history are kept, the command exits 130 saying what it kept, and a resumed run goes on
from there (local search from the saved placement, RL from the checkpoint)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from simplace.errors import EXIT_INTERRUPTED
from simplace.rl import checkpoint as ckpt

REPO = Path(__file__).resolve().parents[1]
MODEL = ("mlp", "--small", "--cost-model", "haswell_k40x4")


def _env():
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH",
                                                                              ""))


def _interrupt_when(argv, marker: str, cwd: Path, sig=signal.SIGINT, timeout_s=600):
    """Run ``simplace optimize ARGV``, send ``sig`` once ``marker`` shows on stderr;
    (exit status, stdout, stderr)."""
    err_path = cwd / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "simplace", "optimize", *argv],
                                cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=err,
                                text=True)
        try:
            t0 = time.monotonic()
            while marker not in err_path.read_text():
                assert proc.poll() is None, f"ended early:\n{err_path.read_text()}"
                assert time.monotonic() - t0 < timeout_s, "no progress shown"
                time.sleep(0.2)
            proc.send_signal(sig)
            out, _ = proc.communicate(timeout=timeout_s)
        finally:
            proc.kill()
    return proc.returncode, out, err_path.read_text()


def _run(argv, cwd: Path):
    return subprocess.run([sys.executable, "-m", "simplace", "optimize", *argv], cwd=cwd,
                          env=_env(), capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_local_search_interrupted_keeps_its_best_and_resumes(tmp_path):
    rc, out, err = _interrupt_when([*MODEL, "--method", "local", "--budget-s", "600",
                                    "--out", "p.json"], "[local:", tmp_path)
    assert rc == EXIT_INTERRUPTED and "Traceback" not in err
    assert "interrupted (SIGINT): kept the best placement so far" in err
    assert "stopped: interrupted" in out
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved["meta"]["stop"] == "interrupted"
    kept = saved["predicted_step_time_s"]
    # Resume: local search from the saved placement; never worse than it.
    proc = _run([*MODEL, "--method", "local", "--budget-s", "5", "--start", "p.json",
                 "--out", "q.json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    again = json.loads((tmp_path / "q.json").read_text())
    assert again["predicted_step_time_s"] <= kept * (1 + 1e-12)


@pytest.mark.slow
def test_rl_interrupted_by_sigterm_keeps_checkpoint_and_history_and_resumes(tmp_path):
    files = ["--out", "p.json", "--checkpoint", "ck.npz", "--history", "h.json"]
    rc, out, err = _interrupt_when([*MODEL, "--method", "rl-gnn", "--budget-s", "600",
                                    "--samples", "16", *files], " episodes, ", tmp_path,
                                   sig=signal.SIGTERM)
    assert rc == EXIT_INTERRUPTED and "Traceback" not in err
    assert "interrupted (SIGTERM): kept" in err and "ck.npz" in err and "h.json" in err
    _, meta = ckpt.load(tmp_path / "ck.npz", {})
    done = meta["update"]
    rows = json.loads((tmp_path / "h.json").read_text())["rows"]
    assert done >= 1 and meta["finished"] is False and len(rows) == done
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved["meta"]["stop"] == "interrupted"
    # Resume: 3 more updates, after the kept ones; the best is never lost.
    proc = _run([*MODEL, "--method", "rl-gnn", "--samples", "16", "--episodes", "48",
                 *files], tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows2 = json.loads((tmp_path / "h.json").read_text())["rows"]
    assert [r["update"] for r in rows2] == list(range(1, done + 4))
    assert rows2[:done] == rows
    assert all(np.isfinite(r["mean_step_time_s"]) for r in rows2[done:])
    again = json.loads((tmp_path / "p.json").read_text())
    assert again["predicted_step_time_s"] <= saved["predicted_step_time_s"] * (1 + 1e-12)

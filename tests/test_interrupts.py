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
    assert f"resuming from checkpoint ck.npz: update {done}," in proc.stderr
    rows2 = json.loads((tmp_path / "h.json").read_text())["rows"]
    assert [r["update"] for r in rows2] == list(range(1, done + 4))
    assert rows2[:done] == rows
    assert all(np.isfinite(r["mean_step_time_s"]) for r in rows2[done:])
    again = json.loads((tmp_path / "p.json").read_text())
    assert again["predicted_step_time_s"] <= saved["predicted_step_time_s"] * (1 + 1e-12)


# ------------------------------------------------------------ --method all, in process
@pytest.fixture(scope="module")
def saved_graph(tmp_path_factory):
    """The small mlp's graph saved as JSON (no tracing in the cases below)."""
    from simplace import trace, zoo

    fn, args = zoo.get("mlp", small=True)
    path = tmp_path_factory.mktemp("interrupts") / "g.json"
    trace(fn, *args, name="mlp/small").save(path)
    return path


def _signal_at(monkeypatch, marker: str, sig=signal.SIGTERM):
    """Raise ``sig`` in this (the main) thread when a progress message starts with
    ``marker``; returns the list of messages and when the signal was sent."""
    from simplace import cli

    seen, sent = [], []

    def note(message):
        seen.append(message)
        if message.startswith(marker) and not sent:
            sent.append(time.perf_counter())
            signal.raise_signal(sig)

    monkeypatch.setattr(cli, "note", note)
    return seen, sent


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_method_all_stops_at_its_next_step_and_saves_the_best(saved_graph, tmp_path,
                                                              monkeypatch, capsys, sig):
    from simplace import cli
    from simplace.cli import main

    # The watchdog would end this (pytest's) process: here the method returns in time.
    monkeypatch.setattr(cli, "STOP_GRACE_S", 120.0)
    seen, sent = _signal_at(monkeypatch, "running expert", sig)
    out = tmp_path / "p.json"
    code = main(["optimize", str(saved_graph), "--cost-model", "haswell_k40x4",
                 "--budget-s", "60", "--out", str(out)])
    stopped_s = time.perf_counter() - sent[0]
    stdout, err = capsys.readouterr()
    assert code == EXIT_INTERRUPTED, err
    assert stopped_s < 5.0
    # expert (second of the fast methods, after single), running when the signal came,
    # finished; nothing after it began.
    assert not any(m.startswith(("running scotch", "running m_etf", "running local",
                                 "running rl-")) for m in seen), seen
    skipped = next(m for m in seen if m.startswith("interrupted: skipped"))
    assert "m_etf" in skipped and "local" in skipped and "rl-gnn" in skipped
    saved = json.loads(out.read_text())
    assert saved["method"] in ("single", "expert")
    assert f"interrupted ({signal.Signals(sig).name}): kept" in err and str(out) in err
    assert "search time" in stdout and "(every method)" in stdout


def test_a_signal_lost_before_the_search_writes_nothing(saved_graph, tmp_path, monkeypatch,
                                                        capsys):
    # A SIGTERM whose KeyboardInterrupt was dropped during tracing (JAX's gc callback)
    # leaves only the flag: the command stops before the search, --out untouched.
    from simplace import cli, cli_model

    real = cli_model.use_profile

    def lost_during_tracing(*args, **kw):
        cli._TERMINATED[0] = True
        return real(*args, **kw)

    monkeypatch.setattr(cli_model, "use_profile", lost_during_tracing)
    out = tmp_path / "p.json"
    out.write_text("old\n")
    assert cli.main(["optimize", str(saved_graph), "--cost-model", "haswell_k40x4",
                     "--method", "heft", "--out", str(out)]) == EXIT_INTERRUPTED
    assert out.read_text() == "old\n"
    stdout, err = capsys.readouterr()
    assert "best:" not in stdout and err.rstrip().endswith("interrupted")


def test_search_time_is_the_wall_time_waited():
    # The line gives the time the user waited (every method with --method all), not the
    # winner's own; a first batch past the budget is said.
    from types import SimpleNamespace

    from simplace.cli import _budget_line

    metis = SimpleNamespace(method="metis", wall_s=0.84, info={})
    assert _budget_line(metis, 20.0, 20.5, True) == \
        "search time 20.50 s of a 20 s budget (every method)"
    line = _budget_line(metis, 20.0, 27.9, True)
    assert line.startswith("search time 27.90 s of a 20 s budget (every method); 7.9 s "
                           "over it: first batches (compilation)")
    assert "60 s budget" in _budget_line(metis, None, 61.0, True)
    local = SimpleNamespace(method="local", wall_s=27.0, info={
        "first_batch_s": 21.0, "first_batch_over_budget": True, "stop": "time budget"})
    line = _budget_line(local, 6.7, 27.2, False)
    assert line.startswith("search time 27.20 s of a 6.7 s budget; first batch ready after "
                           "21.00 s (past the budget: compilation)")
    assert line.endswith("stopped: time budget")


@pytest.mark.slow  # a subprocess (JAX's import) and the 4 s grace: about 10 s
def test_method_all_exits_within_5_s_when_a_method_cannot_stop(saved_graph, tmp_path):
    # m_etf stands for a policy compiling for many seconds: it cannot be interrupted. The
    # command still exits 130 within 5 s of the signal, the best so far saved.
    script = tmp_path / "run.py"
    script.write_text(f"""
import os, signal, sys, time
from simplace import cli
from simplace.placers import front
real = front.optimize
def optimize(graph, cost_model, method, **kw):
    if method == "m_etf":
        print("SIGNAL AT", time.time(), file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # does not return for the stop request
    return real(graph, cost_model, method, **kw)
front.optimize = optimize  # what compare calls
sys.exit(cli.main(["optimize", {str(saved_graph)!r}, "--cost-model", "haswell_k40x4",
                   "--budget-s", "60", "--out", "p.json"]))
""")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)
    ended = time.time()
    assert proc.returncode == EXIT_INTERRUPTED, proc.stderr
    sent = float(proc.stderr.split("SIGNAL AT ", 1)[1].split()[0])
    assert ended - sent < 5.0 + 1.0  # the grace, and the process's exit
    assert "did not reach its next step" in proc.stderr and "Traceback" not in proc.stderr
    saved = json.loads((tmp_path / "p.json").read_text())
    # The best of the fast methods run before m_etf (by their registered rank).
    assert saved["method"] in ("single", "expert", "rl-pretrained", "scotch", "metis",
                               "pipeline", "m_topo")
    assert saved["meta"]["stop"] == "interrupted"

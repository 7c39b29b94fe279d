"""``simplace calibrate --quick`` end to end on fake CPU devices: interrupted, resumed,
refitted from its records; and the command's input errors."""

import argparse
import json

import pytest

from simplace.calibrate import cli, read_records
from simplace.calibrate import ops as ops_mod
from simplace.cost_model import CostModel
from simplace.errors import CalibrationError


def _run(argv, tmp_path):
    p = argparse.ArgumentParser(prog="simplace")
    cli.add_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(["calibrate", *argv, "--records-dir", str(tmp_path / "calibration"),
                         "--cost-model-dir", str(tmp_path / "cost_models"), "--no-progress"])
    return args.func(args)


QUICK = ["--name", "fake2", "--quick", "--models", "mlp", "--devices", "cpu:0,cpu:1"]


def test_quick_interrupted_resumed_and_refit(tmp_path, monkeypatch, capsys):
    real = ops_mod.time_spec
    calls = {"n": 0}

    def flaky(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 40:
            raise KeyboardInterrupt  # the user presses ^C mid-calibration
        return real(*a, **kw)

    monkeypatch.setattr(ops_mod, "time_spec", flaky)
    with pytest.raises(KeyboardInterrupt):
        _run(QUICK, tmp_path)
    rec_path = tmp_path / "calibration" / "fake2" / "records.jsonl"
    partial = read_records(rec_path)
    kept = [r for r in partial if r["kind"] in ("op", "op_error")]
    assert len(kept) == 39  # everything measured before the interrupt is kept
    assert not (tmp_path / "cost_models" / "fake2.json").exists()

    # a second start without --resume refuses to overwrite
    with pytest.raises(CalibrationError, match="--resume"):
        _run(QUICK, tmp_path)

    monkeypatch.setattr(ops_mod, "time_spec", real)
    assert _run(["--name", "fake2", "--resume"], tmp_path) == 0
    out = capsys.readouterr().out
    assert "held-out" in out and "cpu:0->cpu:1" in out

    recs = read_records(rec_path)
    ops = [(r["device"], r["signature"]) for r in recs if r["kind"] in ("op", "op_error")]
    assert len(ops) == len(set(ops))  # resume measured only what was missing
    assert ops[:39] == [(r["device"], r["signature"]) for r in kept]
    sigs = {s for _, s in ops}
    assert {s for d, s in ops if d == "cpu:0"} == {s for d, s in ops if d == "cpu:1"} == sigs
    assert any(r["kind"] == "op" and r["set"] == "model" for r in recs)
    links = {(r["src"], r["dst"]) for r in recs if r["kind"] == "link"}
    assert links == {("cpu:0", "cpu:1"), ("cpu:1", "cpu:0")}
    assert [(r["a"], r["b"]) for r in recs if r["kind"] == "exclusive"] == [("cpu:0", "cpu:1")]

    cm_path = tmp_path / "cost_models" / "fake2.json"
    model = CostModel.load(cm_path)
    prov = model.provenance
    assert prov.source == "measured" and prov.host and prov.date
    assert prov.jax_version and prov.jaxlib_version
    assert prov.meta["device_kinds"] == {"cpu:0": "cpu", "cpu:1": "cpu"}
    assert model.device_names == ["cpu:0", "cpu:1"]
    for dev in model.devices:
        assert len(dev.op_times_s) == sum(1 for r in recs if r["kind"] == "op"
                                          and r["device"] == dev.name)
        assert dev.overhead_s > 0 and dev.peak_flops_per_s > 0
    assert model.latency_s[0, 1] > 0 and model.bandwidth_bytes_per_s[0, 1] > 0

    # --refit rebuilds the same model from the records alone
    text = cm_path.read_text()
    cm_path.unlink()
    assert _run(["--name", "fake2", "--refit"], tmp_path) == 0
    assert cm_path.read_text() == text
    assert CostModel.load(cm_path) == model


def test_resume_after_a_truncated_write(tmp_path, capsys):
    """A record cut mid-write (power loss) is dropped and measured again on --resume."""
    assert _run(QUICK[:-2] + ["--devices", "cpu:0,cpu:1", "--budget-s", "3"], tmp_path) == 0
    rec_path = tmp_path / "calibration" / "fake2" / "records.jsonl"
    lines = rec_path.read_text().splitlines()
    n_ops = sum(1 for ln in lines if json.loads(ln)["kind"] == "op")
    # cut the file inside the last op record (as if killed while writing it)
    last_op = max(k for k, ln in enumerate(lines) if json.loads(ln)["kind"] == "op")
    rec_path.write_text("\n".join(lines[:last_op]) + "\n" + lines[last_op][:30])
    with pytest.raises(CalibrationError, match="truncated"):
        read_records(rec_path)
    assert _run(["--name", "fake2", "--resume", "--budget-s", "3"], tmp_path) == 0
    recs = read_records(rec_path)
    assert sum(1 for r in recs if r["kind"] == "op") >= n_ops  # the cut one came back
    assert "dropped a truncated last record" in capsys.readouterr().err


@pytest.mark.parametrize("argv, match", [
    (["--refit", "--name", "absent"], "does not exist"),
    (["--resume", "--name", "absent"], "Nothing to resume"),
    (["--refit"], "need --name"),
    (["--name", "x", "--devices", "cpu:9"], "No device 'cpu:9'"),
    (["--name", "x", "--devices", "cpu:0,cpu:0"], "repeats a device"),
    (["--name", "x", "--budget-s", "0"], "must be > 0"),
    (["--name", "x", "--resume", "--overwrite"], "contradict"),
    (["--name", "x", "--refit", "--quick"], "only refits"),
    (["--name", "../x"], "plain file name"),
    (["--name", "x", "--models", "no_such_model", "--devices", "cpu:0"], "Unknown model"),
])
def test_cli_errors(tmp_path, argv, match):
    with pytest.raises(Exception, match=match) as err:
        _run(argv, tmp_path)
    assert isinstance(err.value, ValueError)  # SimplaceError subclasses: clean CLI errors

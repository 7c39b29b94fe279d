"""``simplace calibrate`` end to end: a real ``--quick`` run on two fake CPU devices
(interrupted, resumed under a budget, resumed after a torn write, refitted); ``--refit``
of synthetic records (fast, no hardware); and the command's input errors."""

import argparse
import json

import numpy as np
import pytest

from simplace.calibrate import build_cost_model, cli, read_records, write_records
from simplace.calibrate import ops as ops_mod
from simplace.cost_model import CostModel
from simplace.errors import CalibrationError
from tests.test_calibrate import PUT_READY_S, synthetic_records


def _run(argv, tmp_path):
    p = argparse.ArgumentParser(prog="simplace")
    cli.add_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(["calibrate", *argv, "--records-dir", str(tmp_path / "calibration"),
                         "--cost-model-dir", str(tmp_path / "cost_models"), "--no-progress"])
    return args.func(args)


QUICK = ["--name", "fake2", "--quick", "--models", "mlp", "--devices", "cpu:0,cpu:1"]
INTERRUPT_AT = 10  # the op timed alone at which the user presses ^C


def _kinds(recs, kind):
    return [r for r in recs if r["kind"] == kind]


def test_quick_interrupted_resumed_and_refit(tmp_path, monkeypatch, capsys):
    real = ops_mod.time_spec
    calls = {"n": 0, "timed": 0}

    def flaky(*a, **kw):
        calls["n"] += 1
        if calls["n"] == INTERRUPT_AT:
            raise KeyboardInterrupt  # the user presses ^C mid-calibration
        out = real(*a, **kw)
        calls["timed"] += 1
        return out

    monkeypatch.setattr(ops_mod, "time_spec", flaky)
    with pytest.raises(KeyboardInterrupt):
        _run(QUICK, tmp_path)
    rec_path = tmp_path / "calibration" / "fake2" / "records.jsonl"
    cm_path = tmp_path / "cost_models" / "fake2.json"
    partial = read_records(rec_path)
    assert partial[0]["schema_version"] == 2 and partial[0]["settings"]["models"] == ["mlp"]
    assert [d["name"] for d in partial[0]["devices"]] == ["cpu:0", "cpu:1"]
    kept = _kinds(partial, "op")
    assert len(kept) == calls["timed"] > 0  # everything measured before ^C is kept
    assert {r["device"] for r in _kinds(partial, "runtime")} == {"cpu:0", "cpu:1"}
    assert {(r["src"], r["dst"]) for r in _kinds(partial, "put_host")} == {
        ("cpu:0", "cpu:1"), ("cpu:1", "cpu:0")}
    # ^C came in the model's single-op phase, after its segments: the model is not done
    assert not [r for r in _kinds(partial, "phase") if r["phase"] == "model:mlp"]
    assert not cm_path.exists()
    cut_short = {(r["device"], r["first"], r["stop"]) for r in _kinds(partial, "segment")}

    # a second start without --resume refuses to overwrite
    with pytest.raises(CalibrationError, match="--resume"):
        _run(QUICK, tmp_path)

    # resumed under a budget that the model's segments alone use up: the second link
    # is left to the median of the first
    monkeypatch.setattr(ops_mod, "time_spec", real)
    assert _run(["--name", "fake2", "--resume", "--budget-s", "1"], tmp_path) == 0
    out = capsys.readouterr().out
    assert "held-out" in out and "cpu:0->cpu:1" in out
    assert "cpu:1->cpu:0   not measured (median of the others)" in out
    assert "exclusive groups:" in out and "calibration wall time" in out
    assert f"cost model: {cm_path}" in out

    recs = read_records(rec_path)
    ops = [(r["device"], r["signature"]) for r in _kinds(recs, "op")]
    assert len(ops) == len(set(ops)) > len(kept)  # resume measured only what was missing
    assert ops[:len(kept)] == [(r["device"], r["signature"]) for r in kept]
    assert {d for d, _ in ops} == {"cpu:0"}  # one device per kind of hardware
    assert len(_kinds(recs, "runtime")) == 2 and len(_kinds(recs, "put_host")) == 2
    # Two virtual CPU devices are one PjRt client: a put of an array still being
    # computed returns at once (one probe, measured once across the resume).
    (pw,) = _kinds(recs, "put_wait")
    assert (pw["src"], pw["dst"], pw["waits"]) == ("cpu:0", "cpu:1", False)
    assert pw["call_s"] < 0.5 * pw["compute_s"]
    segs = _kinds(recs, "segment")
    assert len(segs) >= 8 and {r["device"] for r in segs} == {"cpu:0", "cpu:1"}
    # the model cut short was measured again (same seeded cuts), its old segments dropped
    assert [r for r in _kinds(recs, "phase") if r["phase"] == "model:mlp"]
    assert {(r["device"], r["first"], r["stop"]) for r in segs} == cut_short
    assert len(segs) == len(_kinds(partial, "segment"))
    for r in segs:
        n = r["stop"] - r["first"]
        assert r["model"] == "mlp" and n >= 1
        assert len(r["primitive"]) == len(r["flops"]) == len(r["bytes_accessed"]) == n
        assert len(r["local_input"]) == n and r["local_input"][0] is False
    assert any(r["first"] == 0 and r["device"] == "cpu:0" for r in segs)  # the whole graph
    hosts = _kinds(recs, "host")
    # two scattered placements, plus each cut placement (the first: the whole graph)
    assert len(hosts) >= 5
    assert any(sum(h["segments"]) == 1 for h in hosts)
    for h in hosts:
        assert len(h["segments"]) == 2 and sum(h["segments"]) >= 1
        assert np.shape(h["puts"]) == (2, 2) and h["puts"][0][0] == h["puts"][1][1] == 0
        # each call's host time in context, and what the step fit simulates again
        assert len(h["call_host_s"]) == len(h["segment_calls"]) == sum(h["segments"])
        assert len(h["put_host_s"]) == len(h["put_links"]) == sum(map(sum, h["puts"]))
        assert all(t > 0 for t in h["call_host_s"] + h["put_host_s"])
        assert len(h["assignment"]) == 78 and h["graph_hash"] and h["loop_s"] > 0
    for r in segs:  # the host time of each segment's own call, and its arity
        assert r["call_host_s"] > 0 and r["inputs"] >= 1 and r["outputs"] >= 1
    assert {(r["src"], r["dst"]) for r in _kinds(recs, "link")} == {("cpu:0", "cpu:1")}
    for r in _kinds(recs, "link"):  # the copy after the call returned, within each sample
        after, block = r["after_call"]["samples_s"], r["timing"]["samples_s"]
        assert len(after) == len(block)
        assert all(0 < a <= b for a, b in zip(after, block, strict=True))
    phases = {r["phase"]: r for r in _kinds(recs, "phase")}
    assert phases["links"]["skipped_for_budget"] == 1
    # copies in context: the one pair, chained at each size, both devices alike
    chains = _kinds(recs, "link_chain")
    assert [(r["a"], r["b"], r["nbytes"]) for r in chains] == [
        ("cpu:0", "cpu:1", n) for n in (256, 2 ** 16, 2 ** 20)]
    for r in chains:
        assert r["hops"] == 15 and r["loop"]["a"] == r["loop"]["b"] >= 1
        assert 0 < r["chain_host"]["median_s"] < r["chain"]["median_s"]
    assert phases["link_chains"]["measured"] == 1
    assert [(r["a"], r["b"]) for r in _kinds(recs, "exclusive")] == [("cpu:0", "cpu:1")]

    model = CostModel.load(cm_path)
    assert json.loads(cm_path.read_text())["schema_version"] == 2
    prov = model.provenance
    assert prov.source == "measured" and prov.host and prov.date
    assert prov.jax_version and prov.jaxlib_version
    assert prov.meta["device_kinds"] == {"cpu:0": "cpu", "cpu:1": "cpu"}
    assert prov.meta["fit_report"]["links_missing"] == ["cpu:1->cpu:0"]
    steps = prov.meta["fit_report"]["steps"]  # the step fit ran on the model's steps
    assert steps["steps"] == len(hosts) and steps["graphs"] == 1
    assert set(steps["scales"]) == {"host", "argument", "compute", "launch", "link"}
    assert model.device_names == ["cpu:0", "cpu:1"]
    for dev in model.devices:
        assert dev.launch_s > 0 and dev.dispatch_s > 0
        assert dev.peak_flops_per_s > 0 and dev.memory_bandwidth_bytes_per_s > 0
        assert 0 <= dev.fused_bytes_fraction <= 1 and dev.op_times_s == {}
    assert model.put_s[0, 1] > 0 and model.put_s[1, 0] > 0
    assert model.latency_s[0, 1] >= 0 and model.bandwidth_bytes_per_s[0, 1] > 0
    assert model.latency_s[1, 0] == model.latency_s[0, 1]  # the median of the one fitted
    context = prov.meta["fit_report"]["link_context"]
    assert set(context["pairs"]) == {"cpu:0<->cpu:1"}
    pair = context["pairs"]["cpu:0<->cpu:1"]
    if pair["used"] and not context["refused"]:
        assert context["scaled"] == ["cpu:0->cpu:1", "cpu:1->cpu:0"]
    else:  # chains timed under load (other tests on the cores) can be host-bound or
        # refused: then no latency is scaled, and the report says why
        assert context["scaled"] == [] and (pair.get("why") or context["refused"])
    assert model.bandwidth_bytes_per_s[1, 0] == model.bandwidth_bytes_per_s[0, 1]

    # A link record cut mid-write (power loss) is dropped and measured again on --resume,
    # with the link the budget left out; the rest is not measured again.
    lines = rec_path.read_text().splitlines()
    last_link = max(k for k, ln in enumerate(lines) if json.loads(ln)["kind"] == "link")
    cut = json.loads(lines[last_link])
    rec_path.write_text("\n".join(lines[:last_link]) + "\n" + lines[last_link][:30])
    with pytest.warns(UserWarning, match="truncated last record"):
        assert len(read_records(rec_path)) == last_link
    assert _run(["--name", "fake2", "--resume"], tmp_path) == 0
    assert "skipped a truncated last record" in capsys.readouterr().err
    recs = read_records(rec_path)
    links = {(r["src"], r["dst"], r["nbytes"]) for r in _kinds(recs, "link")}
    assert (cut["src"], cut["dst"], cut["nbytes"]) in links
    assert {(a, b) for a, b, _ in links} == {("cpu:0", "cpu:1"), ("cpu:1", "cpu:0")}
    assert len(_kinds(recs, "segment")) == len(segs)  # the model was not measured again
    assert len(_kinds(recs, "op")) == len(ops)
    model = CostModel.load(cm_path)
    assert model.provenance.meta["fit_report"]["links_missing"] == []

    # --refit rebuilds the same model from the records alone
    text = cm_path.read_text()
    cm_path.unlink()
    assert _run(["--name", "fake2", "--refit"], tmp_path) == 0
    assert cm_path.read_text() == text
    assert CostModel.load(cm_path) == model


def test_refit_of_synthetic_records(tmp_path, capsys):
    """The fast variant: ``--refit`` of records of a made-up machine, no hardware."""
    recs = synthetic_records(name="syn", flat_links={("cpu:1", "gpu:0")})
    write_records(tmp_path / "calibration" / "syn" / "records.jsonl", recs)
    assert _run(["--name", "syn", "--refit"], tmp_path) == 0
    out = capsys.readouterr().out
    cm_path = tmp_path / "cost_models" / "syn.json"
    model = CostModel.load(cm_path)
    assert model == build_cost_model(recs, name="syn")[0]
    assert json.loads(cm_path.read_text())["schema_version"] == 2
    for dev in model.devices:
        assert dev.launch_s > 0 and dev.dispatch_s > 0
    assert np.all(model.put_s[~np.eye(3, dtype=bool)] > PUT_READY_S)  # from the steps
    assert "CostModel syn" in out and "held-out" in out
    for d in ("cpu:0", "cpu:1", "gpu:0"):
        assert f"  {d}" in out
    assert "cpu:0->cpu:1" in out
    assert ("cpu:1->gpu:0   NOT FITTED, took the median of the others: the transfer times "
            "do not grow with size") in out
    assert "--name syn --overwrite" in out
    assert "exclusive groups: shared:cpu:0: cpu:0, cpu:1" in out
    assert "calibration wall time: 13.5 s" in out
    assert f"records: {tmp_path / 'calibration' / 'syn' / 'records.jsonl'}" in out
    # a records file of schema 1 is refused, and nothing is written
    old = tmp_path / "calibration" / "old" / "records.jsonl"
    old.parent.mkdir()
    old.write_text("\n".join(json.dumps(dict(r, schema_version=1) if r["kind"] == "header"
                                         else r) for r in recs) + "\n")
    with pytest.raises(CalibrationError, match="schema_version 1 is not supported"):
        _run(["--name", "old", "--refit"], tmp_path)
    assert not (tmp_path / "cost_models" / "old.json").exists()


@pytest.mark.parametrize("argv, match", [
    (["--refit", "--name", "absent"], "does not exist"),
    (["--resume", "--name", "absent"], "Nothing to resume"),
    (["--refit"], "need --name"),
    (["--name", "x", "--devices", "cpu:9"], "'cpu:9', which JAX does not have"),
    (["--name", "x", "--devices", "cpu:0,cpu:0"], "repeats a device"),
    (["--name", "x", "--resume", "--overwrite"], "contradict"),
    (["--name", "x", "--refit", "--quick"], "only refits"),
    (["--name", "../x"], "plain file name"),
])
def test_cli_errors(tmp_path, argv, match):
    with pytest.raises(Exception, match=match) as err:
        _run(argv, tmp_path)
    assert isinstance(err.value, ValueError)  # SimplaceError subclasses: clean CLI errors


@pytest.mark.parametrize("budget", ["0", "-1", "nan", "inf"])
def test_cli_budget_is_refused_while_parsing(tmp_path, capsys, budget):
    with pytest.raises(SystemExit) as stop:  # argparse: exit 2 with a message
        _run(["--name", "x", "--budget-s", budget], tmp_path)
    assert stop.value.code == 2 and "--budget-s: must be a finite" in capsys.readouterr().err


def test_cli_unknown_model_is_refused_before_measuring(tmp_path):
    with pytest.raises(ValueError, match="Unknown model"):
        _run(["--name", "x", "--models", "no_such_model", "--devices", "cpu:0"], tmp_path)
    assert not (tmp_path / "calibration" / "x" / "records.jsonl").exists()


def test_resume_splits_the_cpu_as_the_records_did(tmp_path, monkeypatch):
    """``calibrate --resume`` without --cpu-devices asks JAX for as many virtual CPU
    devices as the records' header names; records of other machines, one CPU device, a
    count already in XLA_FLAGS, --devices or unreadable records leave JAX alone."""
    monkeypatch.setenv("XLA_FLAGS", "")
    args = argparse.Namespace(devices=None, records_dir=str(tmp_path), cost_model_dir=None)

    def header(names):
        path = tmp_path / "m" / "records.jsonl"
        path.parent.mkdir(exist_ok=True)
        recs = synthetic_records(segments_per_kind=8, host_steps=2)
        recs[0]["devices"] = [dict(recs[0]["devices"][0], name=n) for n in names]
        path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")

    header([f"cpu:{k}" for k in range(4)])
    assert cli._resumed_cpu_devices("m", args) == 4
    assert cli._resumed_cpu_devices("m", argparse.Namespace(**{**vars(args),
                                                                "devices": "cpu:0"})) is None
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    assert cli._resumed_cpu_devices("m", args) is None
    monkeypatch.setenv("XLA_FLAGS", "")
    for names in (["cpu:0"], ["cpu:0", "cuda:0"]):
        header(names)
        assert cli._resumed_cpu_devices("m", args) is None
    (tmp_path / "m" / "records.jsonl").write_text("{not json\n")
    assert cli._resumed_cpu_devices("m", args) is None
    assert cli._resumed_cpu_devices("absent", args) is None

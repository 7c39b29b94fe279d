"""simplace.validate: validation reports, records, drift fits, the search callback, CLI."""

import argparse
import json

import numpy as np
import pytest

import simplace
from simplace import zoo
from simplace.cost_model import CostModel, Device
from simplace.errors import PlacementError, SimplaceError
from simplace.hardware.executor import prepare
from simplace.placement import Placement
from simplace.scales import Scales
from simplace.sim import simulate
from simplace.validate import (
    append_records,
    fit_drift,
    kendall_tau,
    make_validation_callback,
    mape,
    read_records,
    split_records,
    validate,
)

TIMING = {"warmup": 1, "min_repeats": 3, "max_repeats": 5, "budget_s": 0.1}


def cpu_model(d: int = 4, name: str = "test_cpu") -> CostModel:
    """A made-up model of the fake CPU devices (names cpu:0..), one exclusive group: each
    segment costs a launch (device) and a dispatch (host), each device_put host time."""
    devs = [Device(name=f"cpu:{k}", kind="cpu", memory_bytes=2.0 ** 33,
                   peak_flops_per_s=5e10 * (1 + 0.3 * k), memory_bandwidth_bytes_per_s=1e10,
                   overhead_s=1e-6, launch_s=2e-5, dispatch_s=1e-5, exclusive_group="host")
            for k in range(d)]
    return CostModel.from_devices(name, devs, 5e-5, 5e9, put_s=1e-5)


def tiny_machine(*, launch_s=(1e-5, 2e-5), dispatch_s=(1e-6, 1e-6), put_s=1e-6,
                 group=("a", "b")) -> CostModel:
    """Two devices with given per-segment launch and dispatch costs (exclusive groups
    ``group``)."""
    devs = [Device(name=f"dev:{k}", kind="gpu", memory_bytes=2.0 ** 34,
                   peak_flops_per_s=1e12 * (k + 1), memory_bandwidth_bytes_per_s=2e11,
                   overhead_s=1e-6, launch_s=launch_s[k], dispatch_s=dispatch_s[k],
                   exclusive_group=group[k]) for k in range(2)]
    return CostModel.from_devices("tiny", devs, 5e-6, 1e10, put_s=put_s)


@pytest.fixture(scope="module")
def mlp():
    fn, args = zoo.get("mlp", small=True, abstract=False)
    program = prepare(fn, args)
    return fn, args, program, program.graph


def _records(graph, cm, placements, measured):
    return [{"graph_hash": graph.hash, "graph_name": graph.name,
             "device_names": list(cm.device_names), "assignment": np.asarray(p).tolist(),
             "measured_step_time_s": float(t)} for p, t in zip(placements, measured,
                                                               strict=True)]


def _placements(rng, m, d, n):
    out = []
    for k in range(n):
        if k % 3 == 0:
            out.append(rng.integers(0, d, m))
        else:
            p = np.full(m, rng.integers(d))
            for c in np.sort(rng.choice(np.arange(1, m), 4, replace=False)):
                p[c:] = rng.integers(d)
            out.append(p)
    return out


# ----------------------------------------------------------------------------- metrics
def test_mape_and_kendall_tau():
    assert mape([1.1, 0.9], [1.0, 1.0]) == pytest.approx(0.1)
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert np.isnan(kendall_tau([1.0], [2.0]))


# ----------------------------------------------------------------------------- validate
def test_validate_reports_every_candidate_and_writes_records(mlp, tmp_path):
    fn, args, program, graph = mlp
    cm = cpu_model(2)
    m = graph.num_ops
    half = np.zeros(m, np.int32)
    half[m // 2:] = 1
    placements = [np.zeros(m, np.int32), half,
                  Placement(np.ones(m, np.int32), graph.hash, cm.name, tuple(cm.device_names),
                            method="single")]
    path = tmp_path / "cm" / "validation.jsonl"
    rep = validate(graph, cm, placements, program=program, args=args, timing=TIMING,
                   records_path=path)
    assert len(rep.rows) == 3 and rep.rows[2].method == "single"
    for row, p in zip(rep.rows, [placements[0], half, placements[2].assignment], strict=True):
        sim = simulate(graph, cm, p)
        assert row.predicted_s == pytest.approx(sim.step_time_s)
        assert row.raw_predicted_s == row.predicted_s  # the model carries no corrections
        assert row.measured_s > 0
        # the executor runs the segments and device_puts the simulator counts
        assert (row.num_segments, row.num_transfers) == (sim.num_segments, sim.num_transfers)
        assert (row.sim_num_segments, row.sim_num_transfers) == (sim.num_segments,
                                                                 sim.num_transfers)
    assert rep.rows[0].num_segments == 1 and rep.rows[1].num_segments == 2
    assert rep.rows[0].num_transfers == 0 and rep.rows[1].num_transfers >= 1
    assert rep.mape == pytest.approx(np.mean([abs(r.rel_error) for r in rep.rows]))
    assert rep.raw_mape == rep.mape and not rep.corrected
    assert -1 <= rep.kendall_tau <= 1
    table = rep.table()
    assert "MAPE" in table and "raw model:" in table and "no drift corrections" in table
    back = read_records(path)
    assert len(back) == 3 and back[1]["assignment"] == half.tolist()
    assert back[0]["measured_step_time_s"] == rep.rows[0].measured_s
    assert back[1]["raw_predicted_step_time_s"] == back[1]["predicted_step_time_s"]
    assert back[1]["sim_num_segments"] == 2 and back[1]["sim_num_transfers"] >= 1
    # An append cut short (an interrupted run) loses that line only, not the next ones.
    text = path.read_text()
    path.write_text(text + text.splitlines()[0][:40])
    with pytest.warns(UserWarning, match="cut short"):
        assert len(read_records(path)) == 3
    with pytest.warns(UserWarning, match="dropped a truncated last record"):
        append_records(path, back[:1])  # drops the cut line, then appends
    assert read_records(path) == [*back, back[0]]
    # fn= works as program= does
    rep2 = validate(graph, cm, placements[:1], fn=fn, args=args, timing=TIMING)
    assert len(rep2.rows) == 1


def test_validate_warms_every_candidate_before_timing_any(mlp, monkeypatch):
    """The first runs after a compilation are slow: every candidate is compiled and run
    WARM_RUNS times before the first timed round, so no round's samples carry them."""
    from simplace.hardware import executor
    from simplace.validate import hardware

    fn, args, program, graph = mlp
    cm = cpu_model(2)
    m = graph.num_ops
    placements = [np.zeros(m, np.int32), np.ones(m, np.int32)]
    runs, timed_after = {}, []
    real_place, real_measure = program.place, executor.measure

    def place(a, **kw):
        placed = real_place(a, **kw)
        key = tuple(np.asarray(a).tolist())
        real_run = placed.run

        def run(*xs, **kws):
            runs[key] = runs.get(key, 0) + 1
            return real_run(*xs, **kws)

        monkeypatch.setattr(placed, "run", run)
        return placed

    def measure(placed, *a, **kw):
        timed_after.append(dict(runs))
        return real_measure(placed, *a, **kw)

    monkeypatch.setattr(program, "place", place)
    monkeypatch.setattr(executor, "measure", measure)
    validate(graph, cm, placements, program=program, args=args, timing=TIMING, rounds=2)
    assert len(timed_after) == 4  # two candidates, two rounds
    assert all(n == hardware.WARM_RUNS for n in timed_after[0].values())
    assert len(timed_after[0]) == 2
    # slow steps (here: any step outlasts the round's budget) get the compiling run and
    # one more, so that warming never takes much more than the timing budget
    runs.clear()
    timed_after.clear()
    validate(graph, cm, placements, program=program, args=args,
             timing=dict(TIMING, budget_s=1e-9), rounds=2)
    assert timed_after[0] == {k: 2 for k in timed_after[0]} and len(timed_after[0]) == 2


def test_validate_reports_raw_and_corrected_predictions(mlp):
    fn, args, program, graph = mlp
    cm = cpu_model(2)
    corr = Scales([2.0, 0.5], [1.5, 0.5], [[1, 3.0], [3.0, 1]])
    ccm = cm.with_corrections(corr)
    m = graph.num_ops
    half = np.zeros(m, np.int32)
    half[m // 3:] = 1
    rep = validate(graph, ccm, [half, np.ones(m, np.int32)], program=program, args=args,
                   timing=TIMING, rounds=1)
    assert rep.corrected
    for row, p in zip(rep.rows, [half, np.ones(m)], strict=True):
        assert row.predicted_s == pytest.approx(simulate(graph, ccm, p).step_time_s)
        assert row.raw_predicted_s == pytest.approx(simulate(graph, cm, p).step_time_s)
        assert row.raw_predicted_s != pytest.approx(row.predicted_s)
    assert rep.raw_mape == pytest.approx(np.mean([abs(r.raw_rel_error) for r in rep.rows]))
    assert rep.raw_mape != pytest.approx(rep.mape)
    table = rep.table()
    assert "raw ms" in table and "corr. ms" in table and "drift-corrected" in table
    assert "corrected model: MAPE" in table
    assert f"{rep.rows[0].raw_predicted_s * 1e3:.3f}" in table
    assert f"{rep.rows[0].predicted_s * 1e3:.3f}" in table
    assert rep.records[0]["raw_predicted_step_time_s"] == rep.rows[0].raw_predicted_s
    assert rep.records[0]["corrected"] is True


def test_validate_refuses_other_graphs_and_bad_records(mlp, tmp_path):
    fn, args, program, graph = mlp
    cm = cpu_model(2)
    other_fn, other_args = zoo.get("tiny_cnn", small=True)
    other = simplace.trace(other_fn, *other_args)
    with pytest.raises(PlacementError, match="traces to graph"):
        validate(other, cm, [np.zeros(other.num_ops)], program=program, args=args)
    foreign = Placement(np.zeros(other.num_ops, np.int32), other.hash, cm.name,
                        tuple(cm.device_names))
    with pytest.raises(PlacementError, match="made for graph"):
        validate(graph, cm, [foreign], program=program, args=args)
    with pytest.raises(SimplaceError, match="fn= and args="):
        validate(graph, cm, [np.zeros(graph.num_ops)])
    bad = tmp_path / "v.jsonl"
    bad.write_text('{"schema": "something else"}\n')
    with pytest.raises(SimplaceError, match="not a simplace validation record"):
        read_records(bad)
    with pytest.raises(SimplaceError, match="No validation records"):
        read_records(tmp_path / "missing.jsonl")


# ----------------------------------------------------------------------------- drift
def test_drift_fit_recovers_known_scales(mlp):
    *_, graph = mlp
    cm = CostModel.synthetic(3, seed=5)
    truth_ls = np.ones((3, 3))
    truth_ls[0, 1], truth_ls[1, 2], truth_ls[2, 0] = 2.5, 0.6, 1.8
    truth = Scales([1.6, 0.7, 1.3], [1.0, 1.0, 1.0], truth_ls)
    rng = np.random.default_rng(0)
    ps = _placements(rng, graph.num_ops, 3, 30)
    meas = [simulate(graph, cm.with_corrections(truth), p).step_time_s for p in ps]
    recs = _records(graph, cm, ps, meas)
    res = fit_drift(recs[:20], [graph], cm, held_out=recs[20:],
                    params=("compute", "link"), tie=(), regularization=1e-8,
                    max_nfev=100)
    np.testing.assert_allclose(res.corrections.compute_scale, truth.compute_scale, rtol=0.02)
    for i, j in ((0, 1), (1, 2), (2, 0)):
        assert res.corrections.link_scale[i, j] == pytest.approx(truth_ls[i, j], rel=0.05)
    assert res.fit["mape_raw"] > 0.05 and res.fit["mape_corrected"] < 0.005
    assert res.fit["mape_previous"] == res.fit["mape_raw"]  # cm had no corrections
    assert res.held_out["mape_corrected"] < 0.01 < res.held_out["mape_raw"]
    assert res.held_out["tau_corrected"] > 0.95
    # the corrected model predicts the truth; its history says what it was fitted on
    entry = res.cost_model.corrections.history[-1]
    assert entry["fitted_on"]["records"] == 20 and entry["held_out"]["n"] == 10
    assert res.cost_model.corrections == res.corrections


def test_drift_fit_with_launch_scales_matches_held_out_and_keeps_history(mlp):
    *_, graph = mlp
    cm = CostModel.synthetic(2, seed=1)
    truth = Scales([1.4, 0.8], [1.5, 1.2], [[1, 2.0], [1.5, 1]])
    rng = np.random.default_rng(3)
    ps = _placements(rng, graph.num_ops, 2, 16)
    meas = [simulate(graph, cm.with_corrections(truth), p).step_time_s for p in ps]
    recs = _records(graph, cm, ps, meas)
    fit, held = split_records(recs, 0.5, seed=0)
    assert len(fit) == len(held) == 8
    first = fit_drift(fit, {graph.hash: graph}, cm, held_out=held, tie=(),
                      regularization=1e-8, max_nfev=60)
    assert first.held_out["mape_corrected"] < 0.02 < first.held_out["mape_raw"]
    again = fit_drift(recs, [graph], first.cost_model, tie=(), regularization=1e-8,
                      max_nfev=60)
    assert len(again.corrections.history) == 2  # corrections never compound: history grows
    assert again.fit["mape_corrected"] < 0.02
    # raw is the uncorrected model even though the model given carries corrections;
    # "previous" are those corrections
    assert again.fit["mape_raw"] == pytest.approx(
        mape([simulate(graph, cm, p).step_time_s for p in ps], meas))
    assert again.fit["mape_previous"] == pytest.approx(
        mape([simulate(graph, first.cost_model, p).step_time_s for p in ps], meas))
    assert again.fit["mape_previous"] < again.fit["mape_raw"]
    text = again.summary()
    assert "MAPE raw" in text and "-> corrected" in text and "previous corrections" in text


def test_drift_fit_recovers_compute_launch_and_link_corrections(mlp):
    """Known corrections of every device kind (compute scale, launch scale, per-link
    scale) come back from 'measured' times simulated with them."""
    *_, graph = mlp
    cm = CostModel.synthetic(3, seed=5)
    ls = np.ones((3, 3))
    ls[0, 1], ls[1, 0], ls[1, 2], ls[2, 1], ls[0, 2], ls[2, 0] = 1.8, 1.6, 0.7, 0.8, 2.2, 1.3
    truth = Scales([1.5, 0.8, 1.2], [1.6, 0.7, 1.4], ls)
    rng = np.random.default_rng(5)
    ps = _placements(rng, graph.num_ops, 3, 40)
    meas = [simulate(graph, cm.with_corrections(truth), p).step_time_s for p in ps]
    recs = _records(graph, cm, ps, meas)
    res = fit_drift(recs[:30], [graph], cm, held_out=recs[30:], tie=(), regularization=1e-8,
                    max_nfev=100)
    c = res.corrections
    np.testing.assert_allclose(c.compute_scale, truth.compute_scale, rtol=0.03)
    np.testing.assert_allclose(c.launch_scale, truth.launch_scale, rtol=0.05)
    off = ~np.eye(3, dtype=bool)
    np.testing.assert_allclose(c.link_scale[off], ls[off], rtol=0.03)
    assert res.held_out["mape_raw"] > 0.03 and res.held_out["mape_corrected"] < 0.002
    # the fitted launch correction is what CostModel applies to each segment
    np.testing.assert_allclose(res.cost_model.launch_s, cm.launch_s * c.launch_scale)


def test_drift_fit_ties_devices_that_share_compute(mlp):
    *_, graph = mlp
    cm = CostModel.synthetic(3, seed=2, exclusive_pair=True)  # cpu:0, cpu:1 share compute
    truth = Scales([1.5, 1.5, 0.8], [1, 1, 1], np.full((3, 3), 1.7))
    rng = np.random.default_rng(4)
    ps = _placements(rng, graph.num_ops, 3, 12)
    meas = [simulate(graph, cm.with_corrections(truth), p).step_time_s for p in ps]
    res = fit_drift(_records(graph, cm, ps, meas), [graph], cm, regularization=1e-8,
                    params=("compute", "link"), max_nfev=60)
    assert res.entry["tied"] == ["compute", "launch", "argument", "link"]
    cs = res.corrections.compute_scale
    assert cs[0] == cs[1] and cs[0] == pytest.approx(1.5, rel=0.03)
    assert cs[2] == pytest.approx(0.8, rel=0.03)
    off = res.corrections.link_scale[~np.eye(3, dtype=bool)]
    np.testing.assert_allclose(off, 1.7, rtol=0.03)


def test_drift_fit_refuses_records_it_cannot_simulate(mlp):
    *_, graph = mlp
    cm = CostModel.synthetic(2)
    rec = _records(graph, cm, [np.zeros(graph.num_ops)], [1e-3])
    with pytest.raises(SimplaceError, match="was not given"):
        fit_drift(rec, {}, cm)
    with pytest.raises(SimplaceError, match="measured on devices"):
        fit_drift(rec, [graph], CostModel.synthetic(3))
    with pytest.raises(SimplaceError, match="unknown parameter"):
        fit_drift(rec, [graph], cm, params=("speed",))
    with pytest.raises(SimplaceError, match="'compute_scale' is now called 'compute'"):
        fit_drift(rec, [graph], cm, params=("compute_scale",))
    with pytest.raises(SimplaceError, match="at least one"):
        fit_drift([], [graph], cm)


def test_records_round_trip(tmp_path):
    rec = {"schema": "simplace.validation_record", "schema_version": 1, "cost_model": "x",
           "graph_hash": "ab", "graph_name": "g", "device_names": ["cpu:0"],
           "assignment": [0], "predicted_step_time_s": 1.0, "measured_step_time_s": 2.0,
           "method": "m"}
    path = tmp_path / "a" / "validation.jsonl"
    append_records(path, [rec])
    append_records(path, [rec])
    assert read_records(path) == [rec, rec]
    with pytest.raises(SimplaceError, match="measured_step_time_s"):
        append_records(path, [dict(rec, measured_step_time_s="fast")])


# ----------------------------------------------------------------------------- search hook
def test_validation_callback_in_local_search(mlp, tmp_path):
    fn, args, program, graph = mlp
    cm = cpu_model(2)
    cb = make_validation_callback(graph, fn, args, cm, top_k=2, every=3, program=program,
                                  timing=TIMING, records_path=tmp_path / "v.jsonl")
    assert cb(1, [np.zeros(graph.num_ops)], cm) is None  # not a validation round
    assert cb.records == []
    res = simplace.optimize(graph, cm, "local", seed=0, max_evaluations=300,
                            starts=["single"], validate=cb, validate_every=3,
                            top_k=2, batch=64)
    info = res.info["validation"]
    assert info["calls"] >= 2 and info["corrections"] >= 1
    assert len(cb.records) >= 2 and cb.fits
    corrected = res.cost_model  # the model the result was judged by
    assert corrected is not cm and not corrected.corrections.is_identity
    # the result is simulated with the corrected model
    assert res.step_time_s == pytest.approx(simulate(graph, corrected, res.placement)
                                            .step_time_s)
    assert len(read_records(tmp_path / "v.jsonl")) == len(cb.records)


# ----------------------------------------------------------------------------- CLI
def cli_setup(graph, cm, tmp_path, monkeypatch) -> list[str]:
    """Save ``cm`` where the CLI finds it by name, and four placements of ``graph`` on it
    (each device alone, alternating ops, a split at a third); their paths."""
    models = tmp_path / "models"
    models.mkdir()
    cm.save(models / f"{cm.name}.json")
    monkeypatch.setenv("SIMPLACE_COST_MODELS", str(models))
    m = graph.num_ops
    files = []
    for k, p in enumerate([np.zeros(m), np.ones(m), np.arange(m) % 2,
                           (np.arange(m) >= m // 3)]):
        path = tmp_path / f"p{k}.json"
        Placement(np.asarray(p, np.int32), graph.hash, cm.name, tuple(cm.device_names),
                  method="test").save(path)
        files.append(str(path))
    return files


def test_validate_cli(mlp, tmp_path, monkeypatch, capsys):
    from simplace.validate import cli as validate_cli

    *_, graph = mlp
    cm = cpu_model(2, name="clitest_cpu")
    files = cli_setup(graph, cm, tmp_path, monkeypatch)
    cm_dir = tmp_path / "models"  # where cli_setup saved it
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    validate_cli.add_parser(sub)
    args = parser.parse_args(["validate", "mlp", "--small", "--cost-model", "clitest_cpu",
                              *files, "--update", "--records-dir", str(tmp_path / "cal"),
                              "--repeats", "3", "--budget-s", "0.1"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "MAPE" in out and "Kendall tau" in out and "held-out" in out
    # the table and both fits report the raw and the corrected model side by side
    assert "raw ms" in out and "corr. ms" in out and "no drift corrections" in out
    assert out.count("MAPE raw") >= 3 and out.count("-> corrected") >= 3
    recs = read_records(tmp_path / "cal" / "clitest_cpu" / "validation.jsonl")
    assert len(recs) == 4 and recs[0]["model_spec"]["model"] == "mlp"
    updated = json.loads((cm_dir / "clitest_cpu.json").read_text())
    assert len(updated["corrections"]["history"]) == 1
    fitted = CostModel.load(cm_dir / "clitest_cpu.json")
    assert not fitted.corrections.is_identity
    # --top-k validates only the candidates predicted fastest, now against the corrected
    # model: raw and corrected predictions differ
    args = parser.parse_args(["validate", "mlp", "--small", "--cost-model", "clitest_cpu",
                              *files, "--top-k", "1", "--records-dir", str(tmp_path / "cal"),
                              "--repeats", "3", "--budget-s", "0.1"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "drift-corrected" in out and "corrected model: MAPE" in out
    recs = read_records(tmp_path / "cal" / "clitest_cpu" / "validation.jsonl")
    assert len(recs) == 5 and recs[-1]["corrected"] is True
    p = np.asarray(recs[-1]["assignment"])
    assert recs[-1]["raw_predicted_step_time_s"] == pytest.approx(
        simulate(graph, cm, p).step_time_s)
    assert recs[-1]["predicted_step_time_s"] == pytest.approx(
        simulate(graph, fitted, p).step_time_s)


def test_optimize_options_validate_the_winner(mlp, tmp_path, capsys):
    from simplace.validate import cli as validate_cli

    *_, graph = mlp
    cm = cpu_model(2)
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--method")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--inference", action="store_true")
    parser.add_argument("--batch", type=int, default=None)
    validate_cli.add_validate_args(parser)
    args = parser.parse_args(["mlp", "--small", "--inference", "--method", "local",
                              "--validate-every", "0", "--top-k", "2",
                              "--validation-repeats", "3", "--validation-budget-s", "0.1",
                              "--records-dir", str(tmp_path)])
    fn, fargs = zoo.get("mlp", small=True, training=False)
    g = simplace.trace(fn, *fargs)
    opts = validate_cli.validate_options(args, g, cm)
    assert set(opts) == {"validate", "validate_every", "top_k"}
    best = simplace.optimize(g, cm, "local", max_evaluations=128, batch=64,
                             starts=["single"], **opts)
    text = validate_cli.report_winner(best, g, cm, opts)
    assert "validated winner: predicted raw" in text and "measured" in text
    raw = simulate(g, cm, best.placement).step_time_s
    assert f"raw {raw * 1e3:.3f} ms" in text
    corrected = best.cost_model  # the fit at the end of the search
    assert not corrected.corrections.is_identity
    assert f"corrected {simulate(g, corrected, best.placement).step_time_s * 1e3:.3f} ms" \
        in text and "fitted during the search" in text
    assert opts["validate"].reports  # validated once, at the end of the search
    args.method = "rl-gnn"  # RL takes the same hook
    rl_opts = validate_cli.validate_options(args, g, cm)
    assert set(rl_opts) == {"validate", "validate_every", "top_k"}
    assert rl_opts["validate_every"] == 0  # --validate-every 0: at the end only
    args.method = "heft"
    with pytest.raises(SimplaceError, match="local"):
        validate_cli.validate_options(args, g, cm)
    args.validate_every = None
    assert validate_cli.validate_options(args, g, cm) == {}

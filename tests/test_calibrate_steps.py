"""Host and compute costs fitted to whole steps in context (``calibrate.steps``), and
host calls timed inside steps (``build``): scales recovered from steps simulated under a
known machine, scales no step can see reported and left alone, absurd fits refused, and
the per-call host times and their arity turned into ``dispatch_s`` and ``argument_s``."""

import copy
import dataclasses

import numpy as np
import pytest

from simplace.calibrate import build_cost_model, robust_stats
from simplace.calibrate.segments import cut_placements, host_placements
from simplace.calibrate.steps import MAX_SCALE, SCALES, fit_steps, scaled_model
from simplace.cost_model import CostModel
from simplace.errors import CalibrationError
from simplace.sim import simulate
from tests.test_calibrate import synthetic_records


def _machine(argument_s=2e-6):
    base = CostModel.synthetic(4, seed=1)
    # Four virtual CPU devices, as calibrate times them on a CPU host.
    devs = tuple(dataclasses.replace(d, kind="cpu", argument_s=argument_s, dispatch_s=12e-6,
                                     exclusive_group="shared") for d in base.devices)
    return CostModel(name="m", devices=devs, latency_s=base.latency_s,
                     bandwidth_bytes_per_s=base.bandwidth_bytes_per_s,
                     put_s=np.where(np.eye(4, dtype=bool), 0.0, 20e-6))


def _steps(graph, model, seed=0):
    """Host records of the placements calibrate times (scattered windows, random runs,
    the whole graph on one device), 'measured' as ``model`` simulates them."""
    rng = np.random.default_rng(seed)
    ps = (host_placements(graph.num_ops, 4, rng) + cut_placements(graph.num_ops, 4, rng, 6)
          + [np.full(graph.num_ops, 2, np.int32)]
          + host_placements(graph.num_ops, 4, rng))
    return [{"kind": "host", "model": "mlp", "graph_hash": graph.hash,
             "assignment": p.tolist(),
             "timing": robust_stats([simulate(graph, model, p).step_time_s]).to_dict()}
            for p in ps]


def test_scaled_model_scales_each_kind_of_cost(mlp_graph):
    m = _machine()
    s = scaled_model(m, {"host": 2.0, "argument": 5.0, "compute": 7.0, "launch": 11.0,
                         "link": 0.5})
    assert s.dispatch_s == pytest.approx(2 * m.dispatch_s)
    assert s.put_s == pytest.approx(2 * m.put_s)
    assert s.launch_s == pytest.approx(11 * m.launch_s)
    # a copy of any size takes half as long
    assert s.latency_s == pytest.approx(0.5 * m.latency_s)
    assert s.bandwidth_bytes_per_s == pytest.approx(2 * m.bandwidth_bytes_per_s)
    # op times: the argument part (per parameter read / output returned) and the ops'
    # own part scale apart
    no_arg = scaled_model(_machine(argument_s=0.0), {})
    own = no_arg.op_times(mlp_graph)
    args = m.op_times(mlp_graph) - own
    assert np.all(args >= 0) and args.sum() > 0
    assert s.op_times(mlp_graph) == pytest.approx(7 * own + 5 * args)
    assert scaled_model(m, {}) == m


def test_fit_steps_recovers_the_scales_of_a_known_machine(mlp_graph):
    truth = {"host": 1.6, "argument": 1.4, "compute": 1.3, "launch": 1.0}
    base = _machine()
    recs = _steps(mlp_graph, scaled_model(base, truth))
    fit = fit_steps(base, recs, {mlp_graph.hash: mlp_graph}, held_out_fraction=0.0)
    for k in ("host", "compute"):
        assert k in fit.pinned
        assert fit.scales[k] == pytest.approx(truth[k], rel=0.1), k
    rep = fit.report
    assert rep["steps"] == len(recs) and rep["graphs"] == 1
    assert rep["fitted"]["median_rel_error"] < 0.03 < rep["before"]["median_rel_error"]
    # every scale the steps cannot see is named, with what to measure, and left at 1
    for k, why in rep["not_pinned"].items():
        assert k in SCALES and fit.scales[k] == 1.0 and why.startswith("no measured step")
    # deterministic, and a held-out part is reported when asked for
    assert fit_steps(base, recs, {mlp_graph.hash: mlp_graph},
                     held_out_fraction=0.0).scales == fit.scales
    held = fit_steps(base, recs, {mlp_graph.hash: mlp_graph}, held_out_fraction=0.3, seed=2)
    assert held.report["held_out"]["n"] > 0
    assert held.report["held_out"]["median_rel_error"] < 0.1


def test_fit_steps_leaves_a_scale_no_step_sees(mlp_graph):
    """Only whole-graph steps: one call, no put: host stays at 1 and says why."""
    base = _machine()
    truth = scaled_model(base, {"compute": 1.5})
    recs = [r for r in _steps(mlp_graph, truth) if len(set(r["assignment"])) == 1]
    recs = recs + copy.deepcopy(recs) * 3
    fit = fit_steps(base, recs, {mlp_graph.hash: mlp_graph}, held_out_fraction=0.0)
    assert "host" not in fit.pinned and fit.scales["host"] == 1.0
    assert "scatter ops" in fit.report["not_pinned"]["host"]
    assert fit.scales["compute"] == pytest.approx(1.5, rel=0.1)


def test_fit_steps_refuses_an_absurd_fit(mlp_graph):
    base = _machine()
    recs = _steps(mlp_graph, base)
    for r in recs:  # every step 100x slower than the pieces say
        r["timing"] = robust_stats([100 * r["timing"]["samples_s"][0]]).to_dict()
    with pytest.raises(CalibrationError, match=f"beyond {MAX_SCALE:g}x.*--overwrite"):
        fit_steps(base, recs, {mlp_graph.hash: mlp_graph})


def test_fit_steps_needs_steps_it_can_simulate(mlp_graph):
    base = _machine()
    recs = _steps(mlp_graph, base)
    with pytest.raises(CalibrationError, match="Only 3 whole steps.*--budget-s"):
        fit_steps(base, recs[:3], {mlp_graph.hash: mlp_graph})
    with pytest.raises(CalibrationError, match="Only 0 whole steps"):
        fit_steps(base, recs, {})  # graphs unknown: nothing to simulate


def _profiled(recs, rng):
    """Host records of ``synthetic_records`` with per-call host times: a call costs
    8 us + 2 us per input + 3 us per output, a put 20 us (+ noise)."""
    out = []
    for r in recs:
        if r["kind"] != "host":
            out.append(r)
            continue
        n_seg, n_put = sum(r["segments"]), sum(map(sum, r["puts"]))
        calls, times = [], []
        for k in range(n_seg):
            dev = int(rng.integers(len(r["segments"])))
            ins, outs = int(rng.integers(1, 40)), int(rng.integers(1, 30))
            calls.append([dev, k, k + 1, ins, outs])
            times.append((8e-6 + 2e-6 * ins + 3e-6 * outs) * rng.uniform(0.97, 1.03))
        links = [[0, 1]] * n_put
        out.append(dict(r, segment_calls=calls, call_host_s=times, put_links=links,
                        put_host_s=list(rng.uniform(19e-6, 21e-6, n_put))))
    return out


def test_build_takes_host_calls_timed_in_context():
    rng = np.random.default_rng(0)
    recs = _profiled(synthetic_records(), rng)
    model, report = build_cost_model(recs)
    hc = report["host_calls"]
    ar = hc["arity"]
    assert ar["base_s"] == pytest.approx(8e-6, rel=0.15)
    assert ar["per_input_s"] == pytest.approx(2e-6, rel=0.1)
    assert ar["per_output_s"] == pytest.approx(3e-6, rel=0.1)
    for dev in model.devices:
        assert dev.argument_s == pytest.approx(2.5e-6, rel=0.1)
    # dispatch: the median call of each kind of device; puts: the mean put
    calls = {}
    for r in recs:
        for c, t in zip(r.get("segment_calls", []), r.get("call_host_s", []), strict=True):
            calls.setdefault(model.devices[c[0]].kind, []).append(t)
    for dev in model.devices:
        assert dev.dispatch_s == pytest.approx(np.median(calls[dev.kind]))
    assert model.put_s[0, 1] == pytest.approx(20e-6, rel=0.02)
    assert "in context" in " ".join(model.provenance.notes)
    assert "steps" not in report  # no placements recorded: no step fit
    # the same records, the same model
    assert build_cost_model(copy.deepcopy(recs))[0] == model


def test_fit_steps_rejects_scales_that_do_not_help_held_out_steps(mlp_graph):
    """Steps the pieces predict well except a quarter slowed 3x by something else (a busy
    host): the fit may chase them, but it must not predict held-out steps worse than the
    pieces do; then every scale stays 1 and the report says why."""
    base = _machine()
    recs = _steps(mlp_graph, base) * 2
    rng = np.random.default_rng(5)
    recs = [dict(r, timing=robust_stats([r["timing"]["samples_s"][0]
                                         * (3.0 if rng.random() < 0.3 else 1.0)]).to_dict())
            for r in recs]
    fit = fit_steps(base, recs, {mlp_graph.hash: mlp_graph}, held_out_fraction=0.3, seed=1)
    rep = fit.report
    assert rep["held_out"]["n"] > 0
    assert rep["held_out"]["median_rel_error"] >= rep["held_out_before"]["median_rel_error"]
    assert fit.scales == {k: 1.0 for k in SCALES} and fit.pinned == ()
    assert "no better than the pieces alone" in rep["rejected"]
    assert rep["rejected_scales"] != fit.scales
    # steps of a machine that truly is slower are fitted, not rejected
    truth = {"host": 1.6, "argument": 1.0, "compute": 1.3, "launch": 1.0}
    scaled = fit_steps(base, _steps(mlp_graph, scaled_model(base, truth)) * 2,
                       {mlp_graph.hash: mlp_graph}, held_out_fraction=0.3, seed=1)
    assert "rejected" not in scaled.report
    assert scaled.scales["host"] == pytest.approx(1.6, rel=0.1)


def test_calibration_summary_says_when_the_step_fit_was_not_kept():
    """``format_report``: a rejected step fit is named with the scales it found and why
    it was not kept, beside the scales of 1 that stand."""
    from simplace.calibrate.cli import format_report

    model, report = build_cost_model(synthetic_records(), "syn")
    errs = {"n": 7, "median_rel_error": 0.137, "p90_rel_error": 0.3}
    report["steps"] = {
        "steps": 32, "graphs": 4, "scales": {k: 1.0 for k in SCALES},
        "before": errs, "fitted": errs, "held_out": errs, "held_out_before": errs,
        "rejected": "the fitted scales predict the 7 held-out steps 13.7% off (median), "
                    "no better than the pieces alone (7.7%): left at 1",
        "rejected_scales": {"host": 1.16, "argument": 1.33, "compute": 0.753,
                            "launch": 1.0}}
    text = format_report(model, report)
    assert "scales host 1, argument 1, compute 1, launch 1" in text
    assert ("fit not kept (host 1.16, argument 1.33, compute 0.753, launch 1): the fitted "
            "scales predict the 7 held-out steps 13.7% off") in text
    del report["steps"]["rejected"]
    assert "fit not kept" not in format_report(model, report)


def test_fit_steps_finds_copies_faster_in_steps_than_timed_alone(mlp_graph):
    """Links timed blocking (200 us a copy) on a machine whose copies take 0.3 of that
    inside pipelined steps: the link scale is pinned and recovered, with the host's."""
    base = _machine()
    slow = CostModel(name="m", devices=base.devices,
                     latency_s=np.where(np.eye(4, dtype=bool), 0.0, 200e-6),
                     bandwidth_bytes_per_s=base.bandwidth_bytes_per_s, put_s=base.put_s)
    truth = {"link": 0.3, "host": 1.2}
    fit = fit_steps(slow, _steps(mlp_graph, scaled_model(slow, truth)),
                    {mlp_graph.hash: mlp_graph}, held_out_fraction=0.0)
    assert "link" in fit.pinned
    assert fit.scales["link"] == pytest.approx(0.3, rel=0.05)
    assert fit.scales["host"] == pytest.approx(1.2, rel=0.05)
    fitted = scaled_model(slow, fit.scales)
    assert fitted.latency_s[0, 1] == pytest.approx(0.3 * 200e-6, rel=0.05)

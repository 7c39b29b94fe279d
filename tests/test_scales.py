"""simplace.scales: one Scales type, applied to a priced problem in one place and fitted
by one fitter that calibration's step fit and validation's drift fit share."""

import dataclasses
import json

import numpy as np
import pytest

import simplace
from simplace.calibrate import robust_stats
from simplace.calibrate.steps import fit_steps, scaled_model
from simplace.cost_model import CostModel
from simplace.errors import CostModelError, SimplaceError
from simplace.scales import (
    KINDS,
    SHAPES,
    Scales,
    Step,
    _Problem,
    apply_scales,
    bake_scales,
    fit_scales,
    predict_steps,
    scale_sensitivity,
)
from simplace.sim import simulate
from simplace.validate import fit_drift


def _machine(d=3, seed=0, group=None) -> CostModel:
    """A synthetic machine with every kind of cost the scales act on: call arguments,
    unfused loops, a worker-thread wake-up on the CPUs, host calls and puts."""
    base = CostModel.synthetic(d, seed=seed, exclusive_pair=True)
    devs = tuple(dataclasses.replace(
        dev, argument_s=2e-6, unfused_overhead_s=1e-6 * (k + 1),
        exclusive_group=group or dev.exclusive_group,
        **(dict(parallel_launch_s=3e-5, parallel_min_segment_flops=3e3)
           if dev.kind == "cpu" else {})) for k, dev in enumerate(base.devices))
    return dataclasses.replace(base, devices=devs)


def _random_scales(rng, d) -> Scales:
    shape = {"one": None, "device": (d,), "link": (d, d)}
    return Scales(**{f"{k}_scale": rng.uniform(0.5, 2, shape[SHAPES[k]]) for k in KINDS})


def _placements(rng, m, d, n):
    out = []
    for k in range(n):
        if k % 3 == 0:
            out.append(rng.integers(0, d, m).astype(np.int32))
        else:
            p = np.full(m, rng.integers(d), np.int32)
            for c in np.sort(rng.choice(np.arange(1, m), 4, replace=False)):
                p[c:] = rng.integers(d)
            out.append(p)
    return out


def _assert_same_inputs(a, b, rtol=1e-12):
    for f in a._fields:
        x, y = getattr(a, f), getattr(b, f)
        if isinstance(x, np.ndarray):
            np.testing.assert_allclose(x, y, rtol=rtol, atol=0, err_msg=f)
        else:
            assert x == y, f


# --------------------------------------------------------------------------- applying
def test_identity_is_a_no_op_and_scales_compose(mlp_graph):
    cm = _machine()
    inp = cm.price(mlp_graph)
    assert apply_scales(inp, Scales.identity(3)) is inp
    rng = np.random.default_rng(0)
    a, b = _random_scales(rng, 3), _random_scales(rng, 3)
    twice = apply_scales(apply_scales(inp, a), b)
    _assert_same_inputs(twice, apply_scales(inp, a.compose(b)))
    assert a.compose(Scales.identity(3)) == a
    # a priced problem stays read-only: the simulators take it as it is
    assert not twice.op_time_s.flags.writeable
    assert simulate(mlp_graph, twice, np.zeros(mlp_graph.num_ops, np.int32)).step_time_s > 0


def test_each_kind_scales_its_own_costs(mlp_graph):
    cm = _machine()
    inp = cm.price(mlp_graph)
    arg = inp.op_argument_s
    assert arg.sum() > 0 and inp.op_unfused_s.sum() > 0 and inp.pool_launch_s.sum() > 0
    for kind in KINDS:
        out = apply_scales(inp, Scales.uniform(3, **{kind: 2.0}))
        changed = {f for f in inp._fields if isinstance(getattr(inp, f), np.ndarray)
                   and not np.array_equal(getattr(inp, f), getattr(out, f))}
        want = {"compute": {"op_time_s", "op_unfused_s"},
                "launch": {"launch_s", "pool_launch_s"},
                "link": {"latency_s", "bandwidth_bytes_per_s"},
                "host": {"dispatch_s", "put_s"},
                "argument": {"op_time_s", "op_argument_s"}}[kind]
        assert changed == want, kind
    out = apply_scales(inp, Scales.uniform(3, compute=2.0, argument=5.0))
    np.testing.assert_allclose(out.op_time_s, 2 * (inp.op_time_s - arg) + 5 * arg)
    np.testing.assert_allclose(out.op_unfused_s, 2 * inp.op_unfused_s)
    out = apply_scales(inp, Scales.uniform(3, link=4.0))
    off = ~np.eye(3, dtype=bool)
    np.testing.assert_allclose(out.latency_s[off], 4 * inp.latency_s[off])
    np.testing.assert_allclose(out.bandwidth_bytes_per_s[off],
                               inp.bandwidth_bytes_per_s[off] / 4)


def test_a_scale_means_the_same_in_a_model_corrected_or_baked(mlp_graph):
    """Drift corrections (CostModel.corrections) and a calibration's scales baked into a
    model's figures price a graph alike: apply_scales on the uncorrected price."""
    cm = _machine()
    s = _random_scales(np.random.default_rng(1), 3)
    want = apply_scales(cm.price(mlp_graph), s)
    _assert_same_inputs(cm.with_corrections(s).price(mlp_graph), want)
    _assert_same_inputs(bake_scales(cm, s).price(mlp_graph), want, rtol=1e-9)
    # the figures a model shows agree with its price
    corrected = cm.with_corrections(s)
    np.testing.assert_allclose(corrected.op_times(mlp_graph), want.op_time_s)
    np.testing.assert_allclose(corrected.launch_s, want.launch_s)
    np.testing.assert_allclose(corrected.dispatch_s, want.dispatch_s)
    np.testing.assert_allclose(corrected.transfer_times_s(1e6),
                               want.latency_s + 1e6 / want.bandwidth_bytes_per_s)
    # calibration's per-kind figures are uniform Scales
    assert scaled_model(cm, {"compute": 2.0}) == bake_scales(cm, Scales.uniform(3, compute=2))


# --------------------------------------------------------------------------- files
def test_scales_round_trip_through_json(tmp_path):
    s = dataclasses.replace(_random_scales(np.random.default_rng(2), 3),
                            history=({"fitted_on": {"records": 3}},))
    d = json.loads(json.dumps(s.to_dict()))
    assert Scales.from_dict(d, 3) == s
    assert set(d) == {f"{k}_scale" for k in KINDS} | {"history"}
    cm = _machine().with_corrections(s)
    cm.save(tmp_path / "m.json")
    back = CostModel.load(tmp_path / "m.json")
    assert back.corrections == s and back == cm
    ident = Scales.identity(2).to_dict()
    assert "host_scale" not in ident and "argument_scale" not in ident
    same = Scales.uniform(2, host=1.5, argument=1.5).to_dict()
    assert same["host_scale"] == 1.5 and "argument_scale" not in same
    assert Scales.from_dict({}, 2) == Scales.identity(2)


def test_corrections_of_older_files_are_read_as_scales(mlp_graph):
    """Before Scales: an additive launch correction (extra_overhead_s) and one host scale
    that covered call arguments too. Read as the launch scale that gives the same launch
    and an argument scale equal to the host's."""
    cm = CostModel.synthetic(2, seed=0)
    d = cm.to_dict()
    launch = np.array([dev.launch_s for dev in cm.devices])
    d["corrections"] = {"compute_scale": [1.2, 0.9], "extra_overhead_s": [1e-6, -1e-6],
                        "link_scale": [[1.0, 2.0], [1.5, 1.0]], "history": [{"n": 1}],
                        "host_scale": 1.3}
    old = CostModel.from_dict(d)
    c = old.corrections
    np.testing.assert_allclose(old.launch_s, launch + [1e-6, -1e-6])
    assert c.host_scale == c.argument_scale == 1.3
    assert c.history[0] == {"n": 1} and c.history[1]["extra_overhead_s"] == [1e-6, -1e-6]
    # written back in the current form, which reads back the same
    assert "extra_overhead_s" not in c.to_dict()
    assert CostModel.from_dict(old.to_dict()) == old
    # zeros (every committed file) change nothing and leave no note
    d["corrections"]["extra_overhead_s"] = [0.0, 0.0]
    assert CostModel.from_dict(d).corrections.history == ({"n": 1},)
    # a launch no scale can give is refused with how to refit
    d["corrections"]["extra_overhead_s"] = [-1.0, 0.0]
    with pytest.raises(CostModelError, match="extra_overhead_s\\[0\\].*validate --update"):
        CostModel.from_dict(d)
    d["corrections"]["launch_scale"] = [1.0, 1.0]
    with pytest.raises(CostModelError, match="both launch_scale and"):
        CostModel.from_dict(d)


@pytest.mark.parametrize("field, value, message", [
    ("compute_scale", [1.0, 0.0], "scales.compute_scale[1] must be > 0"),
    ("compute_scale", [1.0, np.nan], "scales.compute_scale[1] must be > 0 and finite"),
    ("launch_scale", [1.0], "scales.launch_scale must have 2 entries for 2 devices"),
    ("launch_scale", [1.0, -2.0], "scales.launch_scale[1] must be > 0"),
    ("link_scale", [[1.0, np.inf], [1.0, 1.0]], "scales.link_scale[0][1] must be > 0"),
    ("link_scale", [[1.0, 1.0]], "scales.link_scale must be 2x2"),
    ("host_scale", 0.0, "scales.host_scale must be > 0"),
    ("argument_scale", True, "scales.argument_scale must be a number"),
    ("history", ({"x": {1, 2}},), "scales.history[0] must be JSON-able"),
])
def test_bad_scales_raise_an_error_naming_the_field(field, value, message):
    with pytest.raises(CostModelError) as err:
        dataclasses.replace(Scales.identity(2), **{field: value})
    assert message in str(err.value) and isinstance(err.value, SimplaceError)


def test_scales_of_another_machine_or_kind_are_refused(mlp_graph):
    inp = _machine().price(mlp_graph)
    with pytest.raises(CostModelError, match="scales are for 2 devices"):
        apply_scales(inp, Scales.identity(2))
    with pytest.raises(CostModelError, match="compose"):
        Scales.identity(2).compose(Scales.identity(3))
    with pytest.raises(CostModelError, match="unknown kind"):
        Scales.uniform(2, speed=2.0)
    with pytest.raises(CostModelError, match="corrections must be a Scales"):
        _machine().with_corrections({"compute": 2.0})
    step = Step(mlp_graph, inp, np.zeros(mlp_graph.num_ops, np.int32), 1e-3)
    with pytest.raises(SimplaceError, match="unknown kind or sharing"):
        fit_scales([step], kinds=("speed",))
    with pytest.raises(SimplaceError, match="unknown kind or sharing"):
        fit_scales([step], share={"compute": "host"})  # a per-device kind, one value
    with pytest.raises(SimplaceError, match="unknown kind or sharing"):
        fit_scales([step], share={"link": "every"})
    with pytest.raises(SimplaceError, match="at least one measured step"):
        fit_scales([])
    with pytest.raises(SimplaceError, match="must be > 0 seconds"):
        fit_scales([step._replace(measured_s=0.0)])


# --------------------------------------------------------------------------- fitting
def test_the_gradient_is_the_derivative_of_the_simulated_step(mlp_graph):
    """The critical-path subgradient equals central finite differences of the simulated
    step time (away from ties) for every kind of scale, and the step times are those of
    the corrected CostModel."""
    graph, seen = mlp_graph, set()
    for seed, group in ((0, None), (2, "one")):
        cm = _machine(seed=seed, group=group)
        rng = np.random.default_rng(seed)
        ps = _placements(rng, graph.num_ops, 3, 9)
        inp = cm.price(graph)
        prob = _Problem([Step(graph, inp, p, 1.0) for p in ps], 3)
        z = rng.normal(0.0, 0.3, prob.size)  # host, argument, compute 3, launch 3, links 6
        steps, jac = prob.evaluate(z)
        corrected = cm.with_corrections(prob.scales_of(z))
        np.testing.assert_allclose(steps, [simulate(graph, corrected, p).step_time_s
                                           for p in ps], rtol=1e-12)
        fd = np.zeros_like(jac)
        for v in range(len(z)):
            zp, zm = z.copy(), z.copy()
            zp[v] += 1e-6
            zm[v] -= 1e-6
            fd[:, v] = (prob.evaluate(zp)[0] - prob.evaluate(zm)[0]) / 2e-6
        np.testing.assert_allclose(jac, fd, atol=1e-6 * steps.max())
        # every step has compute on its path
        assert np.all(jac[:, prob.slices["compute"]].sum(axis=1) > 0)
        seen |= {k for k in KINDS if np.any(jac[:, prob.slices[k]] != 0)}
    assert seen == set(KINDS)  # every kind of cost was on some path


def test_the_gradient_follows_the_critical_path_by_hand():
    """d step / d log launch is the launch time of the path's segments, d step / d log
    compute those segments' op times, d step / d log link the durations of the path's
    copies; the path stops at a host call."""
    import jax.numpy as jnp

    from simplace.cost_model import Device
    from simplace.sim.reference import segments_of

    def chain(x):
        for _ in range(6):
            x = jnp.tanh(x @ x)
        return x

    def machine(dispatch_s):
        # dev:0 and dev:1 share one exclusive group: their segments run one after
        # another, each waiting for the copy of its input: every segment and copy is on
        # the path
        devs = [Device(name=f"dev:{k}", kind="gpu", memory_bytes=2.0 ** 34,
                       peak_flops_per_s=1e12 * (k + 1), memory_bandwidth_bytes_per_s=2e11,
                       overhead_s=1e-6, launch_s=(1e-5, 2e-5)[k], dispatch_s=dispatch_s,
                       exclusive_group="x") for k in range(2)]
        return CostModel.from_devices("tiny", devs, 5e-6, 1e10, put_s=1e-6)

    g = simplace.trace(chain, jnp.ones((64, 64)))
    m = g.num_ops
    work = np.flatnonzero(g.flops > 0)
    cm = machine(1e-6)
    t = cm.op_times(g)
    alt = np.zeros(m, np.int32)
    alt[work[len(work) // 2]:] = 1
    alt2 = alt.copy()
    alt2[work[-1]:] = 0
    for p, n_seg, links in ((np.zeros(m, np.int32), 1, ()), (alt, 2, ((0, 1),)),
                            (alt2, 3, ((0, 1), (1, 0)))):
        res = simulate(g, cm, p, schedule=True)
        assert res.num_segments == n_seg
        prob = _Problem([Step(g, cm.price(g), p, 1.0)], 2)
        steps, jac = prob.evaluate(np.zeros(prob.size))
        assert steps[0] == res.step_time_s
        on_dev0 = sum(p[a] == 0 for a, _ in segments_of(p))
        sl = prob.slices
        assert jac[0, sl["launch"]] == pytest.approx([on_dev0 * 1e-5,
                                                      (n_seg - on_dev0) * 2e-5])
        assert jac[0, sl["compute"]] == pytest.approx([t[p == 0, 0].sum(),
                                                       t[p == 1, 1].sum()])
        sch = res.schedule
        for k, (i, j) in enumerate(((0, 1), (1, 0))):
            on = (sch.transfer_from == i) & (sch.transfer_to == j)
            dur = float((sch.transfer_end_s - sch.transfer_start_s)[on].sum())
            assert jac[0, sl["link"].start + k] == pytest.approx(dur)
            assert (dur > 0) == ((i, j) in links)
    # a slow host: the last segment waits for its dispatch, and the path stops there:
    # that segment's launch and ops are on it, and the host time before it (every host
    # call scales with the host scale)
    slow = machine(1e-2)
    prob = _Problem([Step(g, slow.price(g), alt2, 1.0)], 2)
    steps, jac = prob.evaluate(np.zeros(prob.size))
    res = simulate(g, slow, alt2, schedule=True)
    assert res.schedule.segment_start_s[-1] == res.schedule.segment_dispatch_s[-1]
    last = slice(int(res.schedule.segment_first[-1]), m)
    want = np.zeros(prob.size)
    want[prob.index("compute", 0)] = t[last, 0].sum()
    want[prob.index("launch", 0)] = 1e-5
    want[prob.index("host")] = res.schedule.segment_dispatch_s[-1]
    assert jac[0] == pytest.approx(want)


def test_calibration_and_drift_fit_the_same_scales_on_the_same_steps(mlp_graph):
    """One truth, 'measured' as whole steps for calibration's step fit and as validation
    records for the drift fit: both fitters (one fit_scales underneath) find it, and the
    scales they give predict the steps alike."""
    from simplace.calibrate.segments import cut_placements, host_placements

    graph = mlp_graph
    cm = _machine(4, seed=1, group="one")  # one exclusive group: drift ties like calibrate
    truth = Scales.uniform(4, compute=1.3, host=1.5, argument=1.5)
    rng = np.random.default_rng(0)
    ps = (host_placements(graph.num_ops, 4, rng) + cut_placements(graph.num_ops, 4, rng, 6)
          + [np.full(graph.num_ops, 2, np.int32)] + host_placements(graph.num_ops, 4, rng))
    times = [simulate(graph, cm.with_corrections(truth), p).step_time_s for p in ps]
    host_records = [{"kind": "host", "model": "mlp", "graph_hash": graph.hash,
                     "assignment": np.asarray(p).tolist(),
                     "timing": robust_stats([t]).to_dict()} for p, t in zip(ps, times,
                                                                           strict=True)]
    validation = [{"graph_hash": graph.hash, "graph_name": graph.name,
                   "device_names": cm.device_names, "assignment": np.asarray(p).tolist(),
                   "measured_step_time_s": t} for p, t in zip(ps, times, strict=True)]
    cal = fit_steps(cm, host_records, {graph.hash: graph}, held_out_fraction=0.0)
    drift = fit_drift(validation, [graph], cm, regularization=1e-8, max_nfev=60)
    assert set(cal.pinned) >= {"compute", "host"}
    for kind in ("compute", "host"):
        want = float(np.mean(truth.factor(kind)))
        assert cal.scales[kind] == pytest.approx(want, rel=0.05), kind
        assert float(np.mean(drift.corrections.factor(kind))) == pytest.approx(want,
                                                                              rel=0.05)
    steps = [Step(graph, cm.price(graph), np.asarray(p, np.int32), t)
             for p, t in zip(ps, times, strict=True)]
    by_cal = predict_steps(steps, Scales.uniform(4, **cal.scales))
    by_drift = predict_steps(steps, drift.corrections)
    np.testing.assert_allclose(by_cal, times, rtol=0.03)
    np.testing.assert_allclose(by_drift, times, rtol=0.03)
    # and the calibrated model (scales baked in) predicts what the drift-corrected one does
    baked = scaled_model(cm, cal.scales)
    np.testing.assert_allclose([simulate(graph, baked, p).step_time_s for p in ps[:5]],
                               by_cal[:5], rtol=1e-9)


def test_a_scale_no_step_sees_has_no_sensitivity(mlp_graph):
    cm = _machine()
    inp = cm.price(mlp_graph)
    whole = [Step(mlp_graph, inp, np.full(mlp_graph.num_ops, k, np.int32), 1.0)
             for k in range(3)]
    sens = scale_sensitivity(whole, Scales.identity(3))
    assert sens["link"] == 0.0 and sens["compute"] > 0.5
    fit = fit_scales(whole[:1], kinds=(), start=Scales.uniform(3, host=2.0))
    assert fit.scales == Scales.uniform(3, host=2.0) and "note" in fit.solver

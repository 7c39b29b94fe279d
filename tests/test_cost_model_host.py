"""Host-time costs of a cost model: ``Device.argument_s`` (a call's host time per
parameter and graph output it passes, charged to the ops that read or return them) and
the drift corrections ``Scales.host_scale`` (every host call, as the simulators see it)
and ``Scales.argument_scale`` (the argument part of the op times)."""

import dataclasses

import numpy as np
import pytest

from simplace.cost_model import CostModel
from simplace.errors import CostModelError
from simplace.graph import OpGraph
from simplace.scales import Scales
from simplace.sim import simulate
from simplace.sim.inputs import sim_inputs


def _graph():
    # op 0 reads parameters 0 and 1, op 1 reads parameter 1, op 2 returns an output
    return OpGraph(op=["dot_general", "add", "mul"], name_path=[""] * 3,
                   flops=[100.0, 10.0, 10.0], bytes_accessed=[40.0, 40.0, 40.0],
                   out_bytes=np.full(3, 4.0), signature=list("abc"), src=[0, 1],
                   dst=[1, 2], edge_bytes=[4.0, 4.0], is_output=[False, False, True],
                   param_names=["w", "b"], param_sizes=[4.0, 4.0], param_op=[0, 0, 1],
                   param_index=[0, 1, 1])


def _model(argument_s=0.0, **corr):
    base = CostModel.synthetic(2, seed=0)
    # Two GPUs (one PjRt client): puts do not hold the host, whose time is calls only.
    devs = tuple(dataclasses.replace(d, argument_s=argument_s, kind="gpu")
                 for d in base.devices)
    m = CostModel(name="h", devices=devs, latency_s=base.latency_s,
                  bandwidth_bytes_per_s=base.bandwidth_bytes_per_s,
                  put_s=np.array([[0.0, 20e-6], [30e-6, 0.0]]))
    if corr:
        m = m.with_corrections(dataclasses.replace(Scales.identity(2), **corr))
    return m


def test_argument_cost_is_charged_to_parameter_readers_and_output_producers():
    g = _graph()
    plain = _model().op_times(g)
    extra = _model(argument_s=3e-6).op_times(g) - plain
    # parameter 0: op 0 alone; parameter 1: shared by ops 0 and 1; op 2 returns an output
    expected = 3e-6 * np.array([1.5, 0.5, 1.0])
    assert extra == pytest.approx(np.repeat(expected[:, None], 2, axis=1))
    # so the whole step on one device pays for all three arguments once
    one = simulate(g, _model(argument_s=3e-6), np.zeros(3, np.int32)).step_time_s
    assert one - simulate(g, _model(), np.zeros(3, np.int32)).step_time_s == pytest.approx(
        9e-6)


def test_argument_cost_round_trips_and_is_validated(tmp_path):
    m = _model(argument_s=2e-6)
    path = tmp_path / "h.json"
    m.save(path)
    back = CostModel.load(path)
    assert back == m and back.devices[0].argument_s == 2e-6
    assert "argument_s" not in _model().devices[0].to_dict()  # older files unchanged
    with pytest.raises(CostModelError, match="argument_s"):
        dataclasses.replace(m.devices[0], argument_s=-1.0)


def test_host_scale_scales_every_host_call_and_nothing_else():
    g = _graph()
    m = _model(argument_s=2e-6)
    h = _model(argument_s=2e-6, host_scale=1.5, argument_scale=1.5)
    assert not h.corrections.is_identity
    a, b = sim_inputs(g, m), sim_inputs(g, h)
    assert b.dispatch_s == pytest.approx(1.5 * a.dispatch_s)
    assert b.put_s == pytest.approx(1.5 * a.put_s)
    assert np.array_equal(b.launch_s, a.launch_s)
    assert np.array_equal(b.latency_s, a.latency_s)
    # op times: only the argument part (host time) is scaled
    plain = sim_inputs(g, _model()).op_time_s
    assert b.op_time_s - plain == pytest.approx(1.5 * (a.op_time_s - plain))
    # a placement that moves a tensor pays more host time under the correction
    p = np.array([0, 1, 1], np.int32)
    assert simulate(g, h, p).host_s == pytest.approx(1.5 * simulate(g, m, p).host_s)
    # saved and loaded with the model; an identity correction writes no host_scale
    d = h.corrections.to_dict()
    assert d["host_scale"] == 1.5
    assert Scales.from_dict(d, 2) == h.corrections
    assert "host_scale" not in Scales.identity(2).to_dict()
    assert "argument_scale" not in d  # the same as host_scale: not written
    assert h.corrections.subset(np.array([1])).host_scale == 1.5
    with pytest.raises(CostModelError, match="host_scale"):
        Scales(np.ones(2), np.ones(2), np.ones((2, 2)), 0.0)


def test_argument_scale_scales_the_argument_part_alone():
    g = _graph()
    m = _model(argument_s=2e-6)
    a = _model(argument_s=2e-6, argument_scale=3.0)
    plain = sim_inputs(g, _model()).op_time_s
    got, base = sim_inputs(g, a), sim_inputs(g, m)
    assert got.op_time_s - plain == pytest.approx(3.0 * (base.op_time_s - plain))
    assert got.op_argument_s == pytest.approx(3.0 * base.op_argument_s)
    np.testing.assert_array_equal(got.dispatch_s, base.dispatch_s)
    np.testing.assert_array_equal(got.put_s, base.put_s)
    d = a.corrections.to_dict()
    assert d["argument_scale"] == 3.0 and "host_scale" not in d
    assert Scales.from_dict(d, 2) == a.corrections

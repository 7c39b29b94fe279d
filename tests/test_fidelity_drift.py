"""The drift correction of host time (issue 13): a host busier or quieter than at
calibration moves host-bound steps, which compute, launch and link scales cannot
express; ``fit_drift`` fits one host scale for every host call (dispatch,
``device_put``, and call arguments: ``argument_scale`` is tied to it by default) and
recovers it from steps simulated under it."""

import dataclasses

import numpy as np
import pytest

from simplace.cost_model import CostModel
from simplace.scales import Scales
from simplace.sim import simulate
from simplace.validate import fit_drift


@pytest.fixture()
def graph(mlp_graph):
    return mlp_graph


def _machine():
    """Four virtual CPU devices of one host: one exclusive group, host calls of ~10-20 us
    and a call-argument cost, as calibrated on a small VM."""
    base = CostModel.synthetic(4, seed=3)
    devs = tuple(dataclasses.replace(d, kind="cpu", dispatch_s=12e-6, argument_s=2e-6,
                                     exclusive_group="vm") for d in base.devices)
    return CostModel(name="vm", devices=devs, latency_s=base.latency_s,
                     bandwidth_bytes_per_s=base.bandwidth_bytes_per_s,
                     put_s=np.where(np.eye(4, dtype=bool), 0.0, 20e-6))


def _records(graph, cm, truth, n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        if k % 4 == 0:
            p = np.full(graph.num_ops, k % 4, np.int32)  # the whole graph on one device
        elif k % 2:
            p = rng.integers(0, 4, graph.num_ops).astype(np.int32)  # host-bound
        else:
            p = np.zeros(graph.num_ops, np.int32)
            for c in np.sort(rng.choice(np.arange(1, graph.num_ops), 5, replace=False)):
                p[c:] = rng.integers(4)
        out.append({"graph_hash": graph.hash, "graph_name": graph.name,
                    "device_names": list(cm.device_names), "assignment": p.tolist(),
                    "measured_step_time_s": simulate(
                        graph, cm.with_corrections(truth), p).step_time_s})
    return out


def test_drift_fit_recovers_a_host_scale(graph):
    cm = _machine()
    truth = dataclasses.replace(Scales.identity(4), compute_scale=np.full(4, 0.8),
                                host_scale=1.4, argument_scale=1.4)
    recs = _records(graph, cm, truth, 24, seed=0)
    held = _records(graph, cm, truth, 12, seed=1)
    res = fit_drift(recs, [graph], cm, held_out=held, regularization=1e-8, max_nfev=100)
    c = res.corrections
    assert c.host_scale == pytest.approx(1.4, rel=0.03)
    np.testing.assert_allclose(c.compute_scale, 0.8, rtol=0.05)
    assert res.held_out["mape_raw"] > 0.15 and res.held_out["mape_corrected"] < 0.01
    assert "host" in res.entry["params"]
    assert "host_scale (dispatch, device_put, call arguments) 1.4" in res.summary()
    # the corrected model charges every host call the scale
    assert res.cost_model.dispatch_s == pytest.approx(c.host_scale * cm.dispatch_s)


def test_drift_fit_without_host_scale_cannot_fix_host_bound_steps(graph):
    """The reason for the term: with compute, launch and link scales only, a host 1.4x
    slower leaves host-bound steps under-predicted."""
    cm = _machine()
    truth = dataclasses.replace(Scales.identity(4), host_scale=1.4, argument_scale=1.4)
    recs = _records(graph, cm, truth, 24, seed=0)
    old = fit_drift(recs, [graph], cm, params=("compute", "launch", "link"),
                    regularization=1e-8)
    new = fit_drift(recs, [graph], cm, regularization=1e-8)
    assert old.corrections.host_scale == 1.0
    assert old.fit["mape_corrected"] > 0.05 > 0.01 > new.fit["mape_corrected"]


def test_a_drift_fit_prices_each_graph_once(graph, pricings):
    """The fit scales one priced problem per graph (issue 34: a validate --update built
    SimInputs 70 times): its many simulations reuse it."""
    cm = _machine()
    truth = dataclasses.replace(Scales.identity(4), compute_scale=np.full(4, 0.9))
    recs = _records(graph, cm, truth, 8, seed=2)
    pricings.clear()  # the records' own pricing is not the fit's
    built = pricings
    fresh = dataclasses.replace(cm)  # not priced before: its one pricing is counted
    res = fit_drift(recs, [graph], fresh, max_nfev=20)
    assert res.corrections.compute_scale == pytest.approx(np.full(4, 0.9), rel=0.05)
    assert len(built) <= 2  # the base model, and the corrected model the fit returns

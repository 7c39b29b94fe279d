"""A calibration prices each graph once (issue 34: one ``calibrate --quick`` built SimInputs
476 times): building the cost model from records (what ``calibrate`` and ``--refit`` do
after measuring) makes one ``SimInputs`` per graph whose whole steps it fits, however
many steps and fit iterations; a real ``--quick`` run on fake CPU devices does the same
(slow: ``--runslow``)."""

import argparse
import warnings

import numpy as np
import pytest

from simplace.calibrate import build_cost_model, cli, read_records, robust_stats
from simplace.calibrate.segments import cut_placements, host_placements
from simplace.sim import simulate
from tests.test_calibrate import synthetic_records


def _tiny_cnn():
    from simplace import trace, zoo

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn, args = zoo.get("tiny_cnn", small=True, abstract=True, training=True)
        return trace(fn, *args, name="tiny_cnn")


def _step_records(graphs, model, per_graph):
    """``host`` records of whole placed steps of ``graphs``, 'measured' as ``model``
    simulates them (the machine of ``synthetic_records``, 3 devices)."""
    rng = np.random.default_rng(0)
    out = []
    for g in graphs:
        d = model.num_devices
        placements = (host_placements(g.num_ops, d, rng) + cut_placements(g.num_ops, d, rng, 6)
                      + [np.full(g.num_ops, k, np.int32) for k in range(d)])
        for p in placements[:per_graph]:
            t = simulate(g, model, p).step_time_s
            out.append({"kind": "host", "model": g.name, "graph_hash": g.hash,
                        "assignment": p.tolist(), "segments": [0] * model.num_devices,
                        "puts": [[0] * model.num_devices] * model.num_devices,
                        "timing": robust_stats([t * 1.1]).to_dict()})
    return out


def test_building_a_cost_model_prices_each_stepped_graph_once(mlp_graph, pricings):
    recs = synthetic_records()
    pieces, _ = build_cost_model(recs)
    graphs = [mlp_graph, _tiny_cnn()]
    steps = _step_records(graphs, pieces, per_graph=6)
    assert len(steps) == 12
    pricings.clear()
    model, report = build_cost_model(recs + steps,
                                     step_graphs_of={g.hash: g for g in graphs})
    assert report["steps"]["steps"] == len(steps) and report["steps"]["graphs"] == 2
    assert len(pricings) == len(graphs)


@pytest.mark.slow
def test_a_quick_calibration_prices_each_stepped_graph_once(tmp_path, pricings):
    p = argparse.ArgumentParser(prog="simplace")
    cli.add_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(["calibrate", "--name", "fake2", "--quick", "--models", "mlp",
                         "--devices", "cpu:0,cpu:1", "--no-progress",
                         "--records-dir", str(tmp_path / "calibration"),
                         "--cost-model-dir", str(tmp_path / "cost_models")])
    assert args.func(args) == 0
    recs = read_records(tmp_path / "calibration" / "fake2" / "records.jsonl")
    stepped = {r["graph_hash"] for r in recs if r["kind"] == "host" and "graph_hash" in r}
    assert stepped  # the quick calibration timed whole steps of its model
    assert len(pricings) == len(stepped)

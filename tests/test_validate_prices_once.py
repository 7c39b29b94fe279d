"""A validation prices its graph once (issue 34: one ``validate --update`` built SimInputs
70 times): ``simplace validate`` of a drift-corrected model, with its raw and corrected
predictions, ``--top-k`` ranking and ``--update``'s two drift fits, makes one
``SimInputs`` (the raw problem; the corrections are applied to it), and its predictions
are the simulator's on the model as loaded, to the bit."""

import argparse
import json

import numpy as np
import pytest

from simplace import zoo
from simplace.cost_model import CostModel
from simplace.hardware.executor import prepare
from simplace.scales import Scales
from simplace.sim import simulate
from simplace.validate import cli as validate_cli
from simplace.validate import priced_with_raw, raw_model, read_records
from tests.test_validate import cli_setup, cpu_model


@pytest.fixture(scope="module")
def graph():
    fn, args = zoo.get("mlp", small=True, abstract=False)
    return prepare(fn, args).graph


def test_priced_with_raw_is_the_models_own_pricing(graph):
    cm = cpu_model(2)
    corrected = cm.with_corrections(Scales.uniform(2, compute=1.3, host=0.8, link=2.0))
    priced, raw = priced_with_raw(graph, corrected)
    assert raw is raw_model(corrected).price(graph) and raw_model(corrected) is raw_model(
        corrected)
    for field in ("op_time_s", "launch_s", "dispatch_s", "put_s", "latency_s",
                  "bandwidth_bytes_per_s"):
        np.testing.assert_array_equal(getattr(priced, field),
                                      getattr(corrected.price(graph), field))
    same, same_raw = priced_with_raw(graph, cm)
    assert same is same_raw is cm.price(graph)


def test_a_validation_of_a_corrected_model_prices_its_graph_once(graph, tmp_path,
                                                                 monkeypatch, pricings):
    cm = cpu_model(2, name="prices_once").with_corrections(
        Scales.uniform(2, compute=1.2, host=0.9))
    files = cli_setup(graph, cm, tmp_path, monkeypatch)
    models = tmp_path / "models"  # where cli_setup saved it
    parser = argparse.ArgumentParser()
    validate_cli.add_parser(parser.add_subparsers())
    common = ["validate", "mlp", "--small", "--cost-model", "prices_once", *files,
              "--records-dir", str(tmp_path / "cal"), "--repeats", "3", "--budget-s", "0.05"]

    args = parser.parse_args([*common, "--top-k", "3"])
    assert args.func(args) == 0
    assert len(pricings) == 1
    recs = read_records(tmp_path / "cal" / "prices_once" / "validation.jsonl")
    loaded = CostModel.load(models / "prices_once.json")
    for r in recs:
        p = np.asarray(r["assignment"])
        assert r["predicted_step_time_s"] == simulate(graph, loaded, p).step_time_s
        assert r["raw_predicted_step_time_s"] == simulate(
            graph, raw_model(loaded), p).step_time_s

    pricings.clear()
    args = parser.parse_args([*common, "--update", "--held-out", "0.25"])
    assert args.func(args) == 0
    # validate (raw and corrected), the held-out check's fit and the full fit: one pricing
    assert len(pricings) == 1
    history = json.loads((models / "prices_once.json").read_text())["corrections"]["history"]
    assert len(history) == 1

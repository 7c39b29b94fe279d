"""The command line with instances of other systems (--from) and the objective."""

from pathlib import Path

import pytest

from simplace.cli import main
from simplace.placement import Placement

MSR = Path(__file__).parent.parent / "bench" / "data" / "external" / "msr"
BERT = MSR / "throughput-inputs" / "LayerGraphs" / "bert24_inference.json"


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_optimize_an_msr_instance_by_its_own_rules(capsys, tmp_path):
    out_file = tmp_path / "p.json"
    code, out, err = run(capsys, "optimize", BERT, "--from", "msr", "--method", "local",
                         "--budget-s", "3", "--out", out_file)
    assert code == 0, err
    assert "time between pipelined steps, by msr" in out
    assert "device_put" not in out  # no segments or host thread under another's rules
    saved = Placement.load(out_file)
    from simplace.external import load_instance

    inst = load_instance(BERT, "msr")
    ruler = inst.ruler()
    assert saved.predicted_step_time_s == pytest.approx(
        float(ruler(saved.assignment[None]).step_time_s[0]))
    # simulate reads it back and says the same
    code, out2, err = run(capsys, "simulate", BERT, "--from", "msr", "--placement", out_file)
    assert code == 0, err
    assert f"{saved.predicted_step_time_s * 1e3:.3f} ms" in out2


def test_the_simplace_ruler_and_the_latency_objective(capsys):
    code, out, err = run(capsys, "simulate", BERT, "--from", "msr", "--single", "fastest",
                         "--ruler", "simplace", "--objective", "latency")
    assert code == 0, err
    assert "step time" in out and "by msr" not in out
    code, out, err = run(capsys, "simulate", BERT, "--from", "msr", "--single", "fastest",
                         "--objective", "latency")
    assert code == 0, err
    assert "step time, by msr latency" in out


@pytest.mark.parametrize("argv, message", [
    (["optimize", "mlp", "--small", "--method", "single"], "Give --cost-model"),
    (["optimize", BERT, "--from", "msr", "--cost-model", "haswell_k40x4"],
     "brings its machine"),
    (["optimize", BERT, "--from", "msr", "--batch", "4"], "--batch applies to traced"),
    (["optimize", "mlp", "--small", "--cost-model", "haswell_k40x4", "--ruler", "simplace"],
     "--ruler goes with --from"),
    (["simulate", "nowhere.json", "--from", "msr", "--single", "0"], "nowhere.json"),
])
def test_bad_instance_options_are_clear_errors(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_an_unknown_objective_is_refused_by_the_parser(capsys):
    code, _, err = run(capsys, "optimize", "mlp", "--small", "--cost-model", "haswell_k40x4",
                       "--objective", "speed")
    assert code == 2
    assert "invalid choice: 'speed'" in err


def test_optimize_a_zoo_model_for_throughput(capsys):
    code, out, err = run(capsys, "optimize", "mlp", "--small", "--cost-model",
                         "haswell_k40x4", "--objective", "throughput", "--method", "heft")
    assert code == 0, err
    assert "time between pipelined steps" in out


def test_a_placement_goes_back_in_the_file_numbering():
    from simplace.external import ExternalFormatError, load_instance

    inst = load_instance(BERT, "msr")
    p = (inst.node_ids % inst.cost_model.num_devices).astype("int32")
    back = inst.by_node(p)
    assert set(back) == set(inst.node_ids.tolist())
    assert (inst.from_nodes(back) == p).all()
    with pytest.raises(ExternalFormatError, match="no device for node"):
        inst.from_nodes({})

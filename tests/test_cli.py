import json
import os
import textwrap

import numpy as np
import pytest

from simplace import CostModel, OpGraph
from simplace.cli import main
from simplace.cost_model import Device
from simplace.placement import Placement

FACTORY = textwrap.dedent("""
    import jax, jax.numpy as jnp

    def factory(batch=4, training=True):
        w = jax.ShapeDtypeStruct((8, 16), jnp.float32)
        x = jax.ShapeDtypeStruct((batch, 8), jnp.float32)
        def f(w, x):
            return jnp.tanh(x @ w).sum()
        return (jax.grad(f) if training else f), (w, x)

    def broken():
        raise RuntimeError("no weights here")
""")


@pytest.fixture
def factory_file(tmp_path):
    path = tmp_path / "mymodel.py"
    path.write_text(FACTORY)
    return path


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_models_lists_the_zoo(capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0
    for name in ("resnet50", "inception_v3", "bert_base", "nmt_4layer", "rnnlm", "mlp"):
        assert name in out


def test_graph_on_zoo_name_and_save_and_reload(capsys, tmp_path):
    out_path = tmp_path / "g.json"
    code, out, _ = run(capsys, "graph", "mlp", "--small", "--out", str(out_path))
    assert code == 0 and "ops" in out and "FLOP" in out and "dot_general" in out
    g = OpGraph.load(out_path)
    assert g.num_ops > 0
    code, out2, _ = run(capsys, "graph", str(out_path))
    assert code == 0 and g.hash[:12] in out2


def test_graph_on_file_factory_with_batch_and_inference(capsys, factory_file):
    code, out, _ = run(capsys, "graph", f"{factory_file}:factory", "--batch", "3")
    assert code == 0 and "dot_general" in out
    code, out, _ = run(capsys, "graph", f"{factory_file}:factory", "--inference")
    assert code == 0 and "tanh" in out


def test_graph_on_module_factory(capsys, tmp_path, monkeypatch):
    (tmp_path / "user_models_pkg").mkdir()
    (tmp_path / "user_models_pkg" / "__init__.py").write_text("")
    (tmp_path / "user_models_pkg" / "nets.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = run(capsys, "graph", "user_models_pkg.nets:factory", "--batch", "2")
    assert code == 0 and "dot_general" in out
    code, _, err = run(capsys, "graph", "user_models_pkg.nope:factory")
    assert code == 2 and "Cannot import module 'user_models_pkg.nope'" in err


def test_unknown_model_lists_the_zoo(capsys):
    code, _, err = run(capsys, "graph", "resnet5")
    assert code == 2 and "resnet50" in err and "error" in err


def test_failing_factory_says_which_and_why(capsys, factory_file):
    code, _, err = run(capsys, "graph", f"{factory_file}:broken")
    assert code == 2 and "broken" in err and "no weights here" in err
    code, _, err = run(capsys, "graph", f"{factory_file}:nothing")
    assert code == 2 and "has no callable 'nothing'" in err and "factory" in err


def test_simulate_single_and_placement_file(capsys, tmp_path):
    p_path = tmp_path / "p.json"
    code, out, _ = run(capsys, "simulate", "mlp", "--small", "--cost-model",
                       "cpu_h100x4_nvlink", "--single", "fastest", "--out", str(p_path))
    assert code == 0 and "step time" in out and "lower bound" in out
    # One device: one segment, nothing moved.
    assert "1 segment (one jitted call each)" in out and "in 0 device_put calls" in out
    p = Placement.load(p_path)
    assert p.cost_model == "cpu_h100x4_nvlink" and len(set(p.assignment.tolist())) == 1
    # The placement file simulates to the same step time.
    code, out2, _ = run(capsys, "simulate", "mlp", "--small", "--cost-model",
                        "cpu_h100x4_nvlink", "--placement", str(p_path))
    assert code == 0
    assert out.split("step time")[1].split("ms")[0] == out2.split("step time")[1].split("ms")[0]


def test_optimize_says_why_a_method_returned_one_device(capsys):
    # scotch spreads the small MLP over the five devices; the CPU alone is faster, and
    # the answer says so (every note of the method's, not only info["note"]).
    code, out, _ = run(capsys, "optimize", "mlp", "--small", "--cost-model",
                       "cpu_h100x4_nvlink", "--method", "scotch", "--no-profile")
    assert code == 0
    assert "note: the partition (" in out and "returned that" in out


def test_simulate_refuses_mismatched_placements(capsys, tmp_path):
    p_path = tmp_path / "p.json"
    run(capsys, "simulate", "mlp", "--small", "--cost-model", "cpu_h100x4_nvlink",
        "--single", "gpu:0", "--out", str(p_path))
    # Another graph (inference instead of training): the hash does not match.
    code, _, err = run(capsys, "simulate", "mlp", "--small", "--inference", "--cost-model",
                       "cpu_h100x4_nvlink", "--placement", str(p_path))
    assert code == 2 and "made for graph" in err
    # Another machine with fewer devices.
    code, _, err = run(capsys, "simulate", "mlp", "--small", "--cost-model",
                       "cpu_h100_pcie", "--placement", str(p_path))
    assert code == 2 and "5 devices" in err
    # A hand-edited file with the wrong length.
    d = json.loads(p_path.read_text())
    d["assignment"] = d["assignment"][:-1]
    p_path.write_text(json.dumps(d))
    code, _, err = run(capsys, "simulate", "mlp", "--small", "--cost-model",
                       "cpu_h100x4_nvlink", "--placement", str(p_path))
    assert code == 2 and "entries but the graph has" in err


def test_simulate_unknown_device_and_cost_model(capsys):
    code, _, err = run(capsys, "simulate", "mlp", "--small", "--cost-model",
                       "cpu_h100x4_nvlink", "--single", "tpu:9")
    assert code == 2 and "gpu:0" in err
    code, _, err = run(capsys, "simulate", "mlp", "--small", "--cost-model", "nosuch",
                       "--single", "0")
    assert code == 2 and "cpu_h100x4_nvlink" in err


def test_simulate_gantt(capsys, tmp_path):
    png = tmp_path / "g.png"
    code, _, _ = run(capsys, "simulate", "tiny_cnn", "--small", "--cost-model",
                     "haswell_k40x2", "--single", "1", "--gantt", str(png))
    assert code == 0 and png.stat().st_size > 1000
    assert np.frombuffer(png.read_bytes()[:8], dtype=np.uint8).tolist()[1:4] == [80, 78, 71]


def cpu_model_file(tmp_path, d: int = 4):
    """A made-up model of ``d`` virtual CPU devices of one host (one exclusive group),
    with segment launch and dispatch costs and device_put host time, saved as JSON."""
    devs = [Device(name=f"cpu:{k}", kind="cpu", memory_bytes=2.0 ** 33,
                   peak_flops_per_s=5e10 * (1 + 0.3 * k), memory_bandwidth_bytes_per_s=1e10,
                   overhead_s=1e-6, launch_s=2e-5, dispatch_s=1e-5, exclusive_group="host")
            for k in range(d)]
    cm = CostModel.from_devices(f"cpu_test_x{d}", devs, 5e-5, 5e9, put_s=1e-5)
    path = tmp_path / f"{cm.name}.json"
    cm.save(path)
    return path


def test_optimize_validates_on_the_virtual_cpu_devices_of_a_cpu_cost_model(tmp_path):
    # A fresh process with one CPU device: validating against a 4-device CPU model must
    # split the CPU before tracing starts JAX.
    import os
    import subprocess
    import sys

    model = cpu_model_file(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [sys.executable, "-m", "simplace.cli", "optimize", "mlp", "--small", "--inference",
         "--cost-model", str(model), "--method", "local", "--budget-s", "1",
         "--validate-every", "0", "--top-k", "1", "--validation-repeats", "2",
         "--validation-budget-s", "0.05", "--records-dir", str(tmp_path / "records")],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "validated winner: predicted" in proc.stdout
    assert (tmp_path / "records" / "cpu_test_x4" / "validation.jsonl").stat().st_size > 0


def test_the_parser_is_built_without_the_heavy_packages():
    # Every command builds the whole parser: the rl and calibrate packages export their
    # names lazily, so that flax and scipy.optimize load only for the commands that use
    # them (they took 0.9 s of every command's start).
    import subprocess
    import sys

    code = ("import sys; from simplace.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('flax', 'optax', 'scipy.optimize') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    from simplace import calibrate, rl

    assert callable(rl.train) and callable(calibrate.refit) and "train" in dir(rl)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rl.nope  # noqa: B018


def test_a_command_that_needs_no_jax_does_not_import_it(tmp_path):
    # Importing JAX took half a second of every command. A saved graph placed by a
    # heuristic on a GPU machine this host does not have (no GPU plugin: said without
    # JAX) never needs it; simplace.trace and simplace.apply still resolve.
    import subprocess
    import sys

    from simplace.models import load_graph

    saved = tmp_path / "mlp.json"
    load_graph("mlp", small=True).save(saved)
    code = ("import sys, simplace; from simplace.cli import main; "
            f"code = main(['optimize', {str(saved)!r}, '--cost-model', 'haswell_k40x4', "
            "'--method', 'm_topo']); "
            "print('JAX', 'jax' in sys.modules, code); "
            "print(callable(simplace.trace), callable(simplace.apply))")
    env = {**os.environ, "SIMPLACE_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "JAX False 0" in proc.stdout and "True True" in proc.stdout

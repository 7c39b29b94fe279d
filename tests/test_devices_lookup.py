"""Device lookup on every backend (``resolve_devices``) and the hints its errors give.

This machine has no GPU, so hosts with GPUs are fake backends (platform -> devices)
given to ``find_devices``, the lookup ``resolve_devices`` runs on JAX's backends.
"""

import dataclasses

import jax
import pytest

from simplace import cli, cli_model
from simplace.cost_model import CostModel
from simplace.errors import PlacementError
from simplace.hardware.devices import find_devices, resolve_devices

API_HINT = "pass devices=[...]"


@dataclasses.dataclass(frozen=True, eq=False)
class FakeDevice:
    """What the lookup reads of a JAX device; compared by identity, as JAX's are."""

    platform: str
    id: int
    device_kind: str
    label: str

    def __str__(self) -> str:
        return self.label


def cpus(n: int) -> list[FakeDevice]:
    return [FakeDevice("cpu", k, "cpu", f"cpu:{k}") for k in range(n)]


def cudas(n: int, first_id: int = 0) -> list[FakeDevice]:
    return [FakeDevice("gpu", first_id + k, "NVIDIA H100 80GB HBM3", f"cuda:{first_id + k}")
            for k in range(n)]


def find(names, backends, hint="HINT"):
    return find_devices(names, backends, hint)


def test_cpu_only_host():
    have = {"cpu": cpus(4)}
    assert find(["cpu:0", "cpu:3", "CPU:1"], have) == [have["cpu"][k] for k in (0, 3, 1)]


def test_old_jax_cpu_name_still_found_as_cpu_k():
    # Older JAX prints the CPU as TFRT_CPU_0: the cost model's cpu:0 must still find it.
    dev = FakeDevice("cpu", 0, "cpu", "TFRT_CPU_0")
    assert find(["cpu:0", "TFRT_CPU_0"], {"cpu": [dev]}) == [dev, dev]


def test_cpu_and_one_gpu_host():
    have = {"cpu": cpus(1), "cuda": cudas(1)}
    cpu, gpu = have["cpu"][0], have["cuda"][0]
    # The default backend is the GPU's, yet the host CPU is found too.
    assert find(["cpu:0", "gpu:0"], have) == [cpu, gpu]
    assert find(["cuda:0", "NVIDIA H100 80GB HBM3:0"], have) == [gpu, gpu]


def test_two_gpus_by_rank_and_by_id():
    have = {"cpu": cpus(1), "cuda": cudas(2)}
    assert find(["gpu:1", "gpu:0", "cuda:1"], have) == [
        have["cuda"][1], have["cuda"][0], have["cuda"][1]]
    # Another process's GPUs (ids 4, 5): gpu:k is still the k-th, platform:id still works.
    far = {"cpu": cpus(1), "cuda": cudas(2, first_id=4)}
    assert find(["gpu:0", "gpu:1", "gpu:5"], far) == [
        far["cuda"][0], far["cuda"][1], far["cuda"][1]]


def test_missing_device_lists_every_backend():
    have = {"cuda": cudas(2), "cpu": cpus(2)}
    with pytest.raises(PlacementError) as err:
        find(["cpu:0", "gpu:2", "tpu:0"], have, hint="Do this.")
    assert str(err.value) == (
        "The placement names device(s) 'gpu:2', 'tpu:0', which JAX does not have here (it "
        "has cpu backend: cpu:0, cpu:1; cuda backend: cuda:0 (gpu:0), cuda:1 (gpu:1)). "
        "Do this.")


def test_name_fitting_two_devices_is_an_error_naming_both():
    rocm = FakeDevice("gpu", 0, "AMD Instinct MI300X", "rocm:0")
    have = {"cpu": cpus(1), "cuda": cudas(1), "rocm": [rocm]}
    with pytest.raises(PlacementError, match="'gpu:0' fits 2 JAX devices here: cuda:0 "
                                             r"\(cuda backend\) and rocm:0 \(rocm backend\)"
                                             ".*JAX_PLATFORMS=cpu,cuda"):
        find(["gpu:0"], have)
    assert find(["rocm:0", "cuda:0"], have) == [rocm, have["cuda"][0]]


def test_cli_hint_names_options_not_python_arguments():
    cm = CostModel.synthetic(3, seed=0)  # cpu:0, gpu:0, gpu:1
    with pytest.raises(PlacementError) as err:
        find(cm.device_names, {"cpu": cpus(4)}, cli_model.device_hint(cm))
    msg = str(err.value)
    assert "'gpu:0', 'gpu:1'" in msg and "cpu backend: cpu:0, cpu:1, cpu:2, cpu:3" in msg
    assert f"Cost model '{cm.name}' describes another machine" in msg
    assert "--cost-model" in msg and "simplace calibrate --name NAME" in msg
    assert "devices=" not in msg and "XLA_FLAGS" not in msg
    two_cpus = CostModel.synthetic(3, seed=0, exclusive_pair=True)  # cpu:0, cpu:1, gpu:0
    assert ("Its 2 CPU devices need XLA_FLAGS=--xla_force_host_platform_device_count=2"
            in cli_model.device_hint(two_cpus))


# ------------------------------------------------------------ this machine's real devices
def test_real_cpu_devices():
    have = jax.devices("cpu")
    assert len(have) >= 2  # conftest splits the CPU
    assert resolve_devices([f"cpu:{k}" for k in range(len(have))][::-1]) == have[::-1]
    with pytest.raises(PlacementError, match=r"'gpu:0', which JAX does not have here \(it "
                                             r"has cpu backend: cpu:0, cpu:1.*\)\. Run on the "
                                             r"machine .*pass devices=\[\.\.\.\]"):
        resolve_devices(["cpu:0", "gpu:0"])


def test_cli_validate_on_another_machine_says_what_to_type(tmp_path, capsys):
    path = tmp_path / "gpu_box.json"
    CostModel.synthetic(3, seed=0, name="gpu_box").save(path)
    # Fails on the devices, before the model or the placement file is read.
    rc = cli.main(["validate", "mlp", "--small", "--cost-model", str(path),
                   str(tmp_path / "never_read.json")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "simplace validate: error: The placement names device(s) 'gpu:0', 'gpu:1'" in err
    assert "Cost model 'gpu_box' describes another machine" in err
    assert "--cost-model" in err and API_HINT not in err


def test_cli_optimize_validate_every_checks_devices_before_searching(tmp_path, capsys):
    path = tmp_path / "gpu_box.json"
    CostModel.synthetic(3, seed=0, name="gpu_box").save(path)
    rc = cli.main(["optimize", "mlp", "--small", "--cost-model", str(path), "--method",
                   "local", "--validate-every", "1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "'gpu:0', 'gpu:1'" in err and "--cost-model" in err and API_HINT not in err


def test_calibration_names_devices_with_the_same_lookup():
    """``select_devices`` (calibration) finds devices by the names ``resolve_devices``
    (running placements) knows, and refuses a missing or repeated one."""
    from simplace.errors import CalibrationError
    from simplace.hardware.devices import all_devices, device_name, select_devices

    have = all_devices()
    assert select_devices(None) == have
    names = [device_name(d) for d in have]
    assert select_devices(names[::-1]) == have[::-1]
    with pytest.raises(CalibrationError, match="'cpu:99', which JAX does not have"):
        select_devices(["cpu:99"])
    with pytest.raises(CalibrationError, match="repeats a device"):
        select_devices([names[0], names[0]])

"""The random but valid machines of ``CostModel.synthetic``, for tests and benchmarks."""

from __future__ import annotations

import numbers

import numpy as np

from simplace._cost_model_device import Device, Provenance
from simplace._cost_model_fields import _string
from simplace._cost_model_ops import WORK_CLASSES
from simplace.errors import CostModelError


def synthetic_machine(num_devices: int, *, seed: int = 0, exclusive_pair: bool = False,
                      name: str | None = None) -> tuple:
    """The parts of ``CostModel.synthetic(num_devices, ...)``, checked: its name, devices,
    latency, bandwidth and device_put matrices, and provenance (``CostModel.from_devices``
    makes the model of them)."""
    from simplace._argtypes import check_seed

    max_devices = 1024  # DxD link matrices: beyond this, minutes and gigabytes
    if isinstance(num_devices, bool) or not isinstance(num_devices, numbers.Integral) \
            or not 1 <= num_devices <= max_devices:
        raise CostModelError(f"synthetic needs num_devices, an integer in "
                             f"1..{max_devices}, got {num_devices!r}.")
    try:
        check_seed(seed)
    except ValueError as err:
        raise CostModelError(str(err)) from None
    if not isinstance(exclusive_pair, bool | np.bool_):
        raise CostModelError(f"exclusive_pair must be True or False, got "
                             f"{exclusive_pair!r}.")
    if name is not None:
        _string(name, "name")
    d = int(num_devices)
    if exclusive_pair and d < 2:
        raise CostModelError("synthetic(exclusive_pair=True) needs num_devices >= 2.")
    rng = np.random.default_rng(seed)
    gib = 2.0 ** 30

    def loguniform(lo, hi, size=None):
        return np.exp(rng.uniform(np.log(lo), np.log(hi), size))

    n_cpu = 2 if exclusive_pair else 1
    cpu = dict(kind="cpu", memory_bytes=float(rng.choice([64, 128, 256])) * gib,
               peak_flops_per_s=float(loguniform(0.3e12, 2e12)),
               memory_bandwidth_bytes_per_s=float(loguniform(50e9, 200e9)),
               overhead_s=float(loguniform(1e-6, 5e-6)),
               launch_s=float(loguniform(2e-6, 10e-6)),
               dispatch_s=float(loguniform(2e-6, 10e-6)),
               efficiency={c: round(float(rng.uniform(0.2, 0.7)), 3) for c in WORK_CLASSES})
    devices = []
    for k in range(n_cpu):
        devices.append(Device(name=f"cpu:{k}", exclusive_group="cpu" if exclusive_pair
                              else "", **cpu))
    for k in range(d - n_cpu):
        devices.append(Device(
            name=f"gpu:{k}", kind="gpu",
            memory_bytes=float(rng.choice([8, 16, 24, 40, 80])) * gib,
            peak_flops_per_s=float(loguniform(2e12, 60e12)),
            memory_bandwidth_bytes_per_s=float(loguniform(200e9, 3000e9)),
            overhead_s=float(loguniform(2e-6, 10e-6)),
            launch_s=float(loguniform(5e-6, 30e-6)),
            dispatch_s=float(loguniform(5e-6, 40e-6)),
            efficiency={c: round(float(rng.uniform(0.3, 0.9)), 3) for c in WORK_CLASSES}))
    lat = loguniform(2e-6, 30e-6, (d, d))
    bw = loguniform(5e9, 100e9, (d, d))
    lat, bw = np.triu(lat) + np.triu(lat, 1).T, np.triu(bw) + np.triu(bw, 1).T
    if exclusive_pair:  # a memcpy between two virtual devices of one host
        lat[0, 1] = lat[1, 0] = 1e-6
        bw[0, 1] = bw[1, 0] = devices[0].memory_bandwidth_bytes_per_s / 2
    put = loguniform(5e-6, 40e-6, (d, d))
    return (name or f"synthetic{d}_seed{seed}" + ("_excl" if exclusive_pair else ""),
            devices, lat, bw, put,
            Provenance(source="synthetic", notes=(
                f"CostModel.synthetic({d}, seed={seed}, exclusive_pair={exclusive_pair}): "
                "random figures for tests and benchmarks, not a real machine.",)))

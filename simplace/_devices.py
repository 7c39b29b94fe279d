"""Virtual CPU devices: split the host CPU into N JAX devices before JAX starts.

A cost model measured on N virtual CPU devices (``cpu:0`` ... ``cpu:N-1``) can only be
run again (validation, calibration) in a process whose JAX has N CPU devices; JAX fixes
that count when its backend starts, so it must be set first.
"""

from __future__ import annotations

from simplace.errors import SimplaceError


def use_cpu_devices(n: int, error: type[SimplaceError] = SimplaceError, *,
                    at_least: bool = False) -> None:
    """Make JAX see ``n`` CPU devices (``at_least``: ``n`` or more); raises ``error`` if
    its backend already started with another count."""
    import jax

    if n < 1:
        raise error(f"The number of CPU devices must be >= 1, got {n}.")
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except Exception as err:  # noqa: BLE001 - JAX refuses once its backend started
        have = len(jax.devices("cpu"))
        if have == n or (at_least and have > n):
            return
        raise error(f"Cannot split the CPU into {n} devices now ({err}); start a fresh "
                    "process, or set XLA_FLAGS="
                    f"--xla_force_host_platform_device_count={n}.") from None
    have = len(jax.devices("cpu"))
    if have != n and not (at_least and have > n):
        raise error(f"Asked for {n} CPU devices but JAX has {have} (its backend started "
                    "before, or XLA_FLAGS sets another count). Run in a fresh process with "
                    f"XLA_FLAGS=--xla_force_host_platform_device_count={n}.")


def match_cpu_cost_model(cost_model) -> None:
    """If every device of ``cost_model`` is a CPU device (a model calibrated on virtual
    CPU devices), give JAX at least as many CPU devices; otherwise leave JAX alone."""
    if cost_model.num_devices > 1 and all(d.kind == "cpu" for d in cost_model.devices):
        use_cpu_devices(cost_model.num_devices, at_least=True)

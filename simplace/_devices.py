"""Virtual CPU devices, kept under their old name: they live in
``simplace.hardware.devices``."""

from simplace.hardware.devices import match_cpu_cost_model, use_cpu_devices

__all__ = ["match_cpu_cost_model", "use_cpu_devices"]

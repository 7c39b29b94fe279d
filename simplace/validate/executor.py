"""The executor, kept under its old name: it lives in ``simplace.hardware.executor``."""

from simplace.hardware.executor import (
    Measurement,
    PlacedArgs,
    PlacedFunction,
    Program,
    Segment,
    apply,
    measure,
    prepare,
    resolve_devices,
)

__all__ = ["Measurement", "PlacedArgs", "PlacedFunction", "Program", "Segment", "apply",
           "measure", "prepare", "resolve_devices"]

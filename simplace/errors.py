"""Errors simplace raises for bad input. Each message says what is wrong and how to mend it.

All derive from ``SimplaceError`` and from ``ValueError``, so callers can catch either.
"""


class SimplaceError(ValueError):
    """Base class of simplace's input errors."""


class GraphError(SimplaceError):
    """A malformed op graph or graph file (wrong lengths, bad indices, a cycle...)."""


class TraceError(SimplaceError):
    """A function could not be traced into an op graph."""


class ModelError(SimplaceError):
    """An unknown model name or a model factory that failed."""


class CostModelError(SimplaceError):
    """A malformed cost model or cost-model file, or an unknown cost-model name."""


class PlacementError(SimplaceError):
    """A placement that does not fit its graph or cost model (length, devices, hash)."""


class GroupingError(SimplaceError):
    """A grouping that cannot be used (wrong length, or a quotient graph with a cycle)."""


class CalibrationError(SimplaceError):
    """Bad calibration input: timing arguments, a malformed records file, a failed fit."""

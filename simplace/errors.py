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


class OptionError(SimplaceError):
    """An option a placement method does not take, or a bad value of one."""


class OutputError(SimplaceError):
    """An output path that cannot be written (missing folder, a directory, read-only)."""


# Exit codes of the ``simplace`` command (documented in ``simplace --help`` and the README).
EXIT_OK = 0
EXIT_ERROR = 1  # an unexpected error (a bug: please report it with its traceback)
EXIT_USAGE = 2  # bad input: options, numbers, files, models; the message says what to mend
EXIT_OOM = 3  # the result does not fit the machine's memory (saved anyway, marked "oom")
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM


class ParallelizeError(SimplaceError):
    """Bad input to ``simplace.parallelize`` or a search that cannot be done exactly."""

"""The timing harness, kept under its old name: it lives in ``simplace.hardware.timing``."""

from simplace.hardware.timing import (
    MAD_TO_SIGMA,
    OUTLIER_Z,
    Timing,
    robust_stats,
    time_fn,
)

__all__ = ["MAD_TO_SIGMA", "OUTLIER_Z", "Timing", "robust_stats", "time_fn"]

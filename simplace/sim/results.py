"""What the batched simulators return: ``BatchResult``, one row per placement."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class BatchResult(NamedTuple):
    """Results of a batch of placements (numpy arrays).

    step_time_s: float64[B]; peak_memory_bytes: float64[B, D]; oom: bool[B];
    busy_s: float64[B, D]; bytes_moved: float64[B]; num_segments: int[B];
    num_transfers: int[B]; host_s: float64[B]. Same meanings as ``SimResult``.
    """

    step_time_s: np.ndarray
    peak_memory_bytes: np.ndarray
    oom: np.ndarray
    busy_s: np.ndarray
    bytes_moved: np.ndarray
    num_segments: np.ndarray | None = None
    num_transfers: np.ndarray | None = None
    host_s: np.ndarray | None = None

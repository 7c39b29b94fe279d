"""One invariant checker for every placer's tests (networkx style)."""

import numpy as np

from simplace.sim import lower_bound, simulate


def check_result(graph, cost_model, result, *, expect_fit: bool | None = None):
    """Assert what every OptimizeResult must satisfy; returns the reference result.

    - the placement is int32[M] with valid device indices;
    - the reported step time, OOM flag, memory, segments, device_put calls and host time
      are the reference simulator's;
    - the step time is at least the lower bound;
    - ``expect_fit``: True -> not OOM, False -> OOM, None -> not checked.
    """
    p = result.placement
    assert p.dtype == np.int32 and p.shape == (graph.num_ops,)
    if graph.num_ops:
        assert p.min() >= 0 and p.max() < cost_model.num_devices
    ref = simulate(graph, cost_model, p)
    assert result.step_time_s == ref.step_time_s
    assert result.oom == ref.oom
    np.testing.assert_array_equal(result.peak_memory_bytes, ref.peak_memory_bytes)
    assert (result.num_segments, result.num_transfers, result.host_s) == \
        (ref.num_segments, ref.num_transfers, ref.host_s)
    assert result.num_segments == (1 + int(np.count_nonzero(np.diff(p))) if len(p) else 0)
    assert ref.step_time_s >= lower_bound(graph, cost_model) * (1 - 1e-12)
    assert result.wall_s >= 0
    if expect_fit is not None:
        assert result.oom == (not expect_fit)
    return ref

"""Which ops the segment fit charges a thread pool's wake-up (``build.parallel_thresholds``),
on op records timed the way ``harness.time_fn`` times them: in rounds of back-to-back runs,
where an op on the pool pays the wake-up at the start of a round only (issue 13: on the
2-core VM the median of such an op's samples missed it, and the segments holding it were
predicted 5 us where they took 55-60 us). Hand-built records and segments, no hardware.
"""

import numpy as np
import pytest

from simplace.calibrate import build
from simplace.calibrate.build import PARALLEL_MIN_EXTRA_S, fit_device, parallel_thresholds
from simplace.calibrate.harness import Timing, robust_stats
from tests.test_calibrate_segments import (
    BASE_S,
    TRUE_CPU,
    random_segments,
    segment_times,
)

WAKE_S = 40e-6  # what waking the pool costs (25-55 us on the 2-core VM)
ROUND = 5  # time_fn's runs per round with the calibration's op_min_repeats


def _rounds(fast_s, slow_per_round, rounds=6):
    """Samples of ``rounds`` rounds of ``ROUND`` runs, the first ``slow_per_round`` of
    each paying the pool's wake-up."""
    one = [fast_s + WAKE_S] * slow_per_round + [fast_s] * (ROUND - slow_per_round)
    return one * rounds


def _op_rec(prim, nbytes, samples):
    return {"kind": "op", "device": "cpu:0", "signature": f"{prim}|{nbytes}",
            "primitive": prim, "op_class": "x", "flops": 0.0, "bytes_accessed": float(nbytes),
            "set": "model", "timing": robust_stats(samples).to_dict()}


def _records(fast_s):
    return [
        # from 1e5 bytes on, the pool wakes at the start of each round (2 runs in 5):
        # the median of the samples is a fast run
        _op_rec("add", 1e3, [fast_s] * 30), _op_rec("add", 1e4, [fast_s] * 30),
        _op_rec("add", 1e5, _rounds(fast_s, 2)), _op_rec("add", 1e6, _rounds(fast_s, 2)),
        # slow in every run from 1e4 bytes on (a large op: the pool never sleeps)
        _op_rec("dot_general", 1e3, [fast_s] * 30),
        _op_rec("dot_general", 1e4, _rounds(fast_s, ROUND)),
        _op_rec("dot_general", 1e5, _rounds(fast_s, ROUND)),
        # a context switch now and then (1 run in 30) is not a pool
        _op_rec("mul", 1e5, [fast_s] * 29 + [fast_s + WAKE_S]),
        _op_rec("mul", 1e6, [fast_s + WAKE_S] + [fast_s] * 29),
    ]


def test_parallel_thresholds_see_a_pool_that_wakes_at_each_round_start():
    fast = BASE_S + 0.2 * PARALLEL_MIN_EXTRA_S
    recs = _records(fast)
    # the median misses the wake-up: that is what the thresholds must not rely on
    assert Timing.from_dict(recs[2]["timing"]).median_s == pytest.approx(fast)
    assert parallel_thresholds(recs, BASE_S) == {"add": 1e5, "dot_general": 1e4}
    # one slow run in five per round is under a quarter of the runs: not a pool here
    one_in_five = [_op_rec("add", 1e5, _rounds(fast, 1)), _op_rec("add", 1e6, _rounds(fast, 1))]
    assert parallel_thresholds(one_in_five, BASE_S) == {}
    # the wake-up must stand PARALLEL_MIN_EXTRA_S above the base
    assert parallel_thresholds(recs, BASE_S + WAKE_S) == {}


def _holds_add(seg, min_bytes):
    return any(p == "add" and b >= min_bytes
               for p, b in zip(seg["primitive"], seg["bytes_accessed"], strict=True))


def test_fit_device_recovers_the_wake_up_of_segments_whose_ops_wake_the_pool_per_round(
        monkeypatch):
    """Segments holding an add of 1e5 bytes or more pay the wake-up every time (as alone
    in a segment on the VM); the op records show it at the start of each round only.
    The thresholds from those records flag exactly those segments, and the fit gets the
    wake-up and the held-out segments right; thresholds from the median (the rule before)
    flag none of them, and the fit is far off."""
    rng = np.random.default_rng(21)
    segs = random_segments(rng, 90, primitives=("add", "mul", "reduce_sum", "transpose",
                                                "reshape"), max_ops=12)
    par = np.array([_holds_add(s, 1e5) for s in segs])
    assert 20 < par.sum() < 70
    t = segment_times(TRUE_CPU, segs, BASE_S, par, rng, noise=0.005)
    recs = [dict(s, kind="segment", device="cpu:0", model="syn", first=0,
                 stop=len(s["primitive"]), timing=robust_stats([float(x)] * 3).to_dict())
            for s, x in zip(segs, t, strict=True)]
    ops = _records(BASE_S + 0.2 * PARALLEL_MIN_EXTRA_S)

    thr = parallel_thresholds(ops, BASE_S)
    assert thr["add"] == 1e5
    fit, rep = fit_device(recs, BASE_S, thr, seed=1)
    assert fit.parallel_launch_s == pytest.approx(TRUE_CPU.parallel_launch_s, rel=0.1)
    assert rep["held_out"]["median_rel_error"] < 0.02
    assert rep["held_out"]["p90_rel_error"] < 0.05

    monkeypatch.setattr(build, "PARALLEL_PERCENTILE", 50)
    thr_median = parallel_thresholds(ops, BASE_S)
    assert "add" not in thr_median
    _, rep_median = fit_device(recs, BASE_S, thr_median, seed=1)
    assert rep_median["held_out"]["p90_rel_error"] > 4 * rep["held_out"]["p90_rel_error"]

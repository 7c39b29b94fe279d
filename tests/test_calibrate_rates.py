"""Device rates pinned by saturating microbenchmarks (``simplace.calibrate.rates``) and
the segment fit that takes them as they are (issue 32: small segments alone fitted an
H200 at 9,423 TFLOP/s with matmul efficiency 0.001, 12-70x off at real sizes).
"""

import math

import numpy as np
import pytest

from simplace.calibrate import rates as rates_mod
from simplace.calibrate.build import rate_problems
from simplace.calibrate.fit import fit_segments, predict_segments
from simplace.calibrate.rates import (
    RATE_CLASSES,
    device_rates,
    measure_rate,
    rate_record,
    rates_of,
)
from simplace.calibrate.records import check_record
from simplace.errors import CalibrationError
from tests.test_calibrate_segments import (
    BASE_S,
    TRUE_CPU,
    random_segments,
    segment_times,
    true_device,
)


def _true_rates(fit=TRUE_CPU):
    """The per-class rates a device with ``fit``'s roofline runs at."""
    return {c: (fit.peak_flops_per_s if rates_mod.RATE_UNITS[c] == "flop"
                else fit.memory_bandwidth_bytes_per_s) * fit.efficiency[c]
            for c in RATE_CLASSES}


def test_device_rates_peaks_are_the_best_rates_and_efficiencies_the_rest():
    peak, bw, eff = device_rates(_true_rates())
    assert peak == pytest.approx(8e10)  # matmul, efficiency 1
    assert bw == pytest.approx(1.5e10 * 0.5)  # elementwise, the best memory class
    assert eff["matmul"] == pytest.approx(1.0) and eff["conv"] == pytest.approx(0.6)
    assert eff["elementwise"] == pytest.approx(1.0)
    assert eff["data_movement"] == pytest.approx(0.3 / 0.5)


def test_device_rates_refuse_a_missing_class_and_a_failed_measurement():
    r = _true_rates()
    del r["conv"]
    with pytest.raises(CalibrationError, match="conv.*--resume"):
        device_rates(r)
    r = _true_rates() | {"reduction": 1e6}  # 1e-4 of the best memory rate
    with pytest.raises(CalibrationError, match="reduction microbenchmark"):
        device_rates(r)
    with pytest.raises(CalibrationError, match="positive"):
        device_rates(_true_rates() | {"matmul": math.nan})


def test_pinned_fit_keeps_the_rates_and_recovers_what_small_segments_show():
    """Segments of a known device: with its rates pinned, the fit writes exactly those
    rates and finds the per-op costs and fusion; the held-out segments are predicted."""
    rng = np.random.default_rng(5)
    segs = random_segments(rng, 80)
    t = segment_times(TRUE_CPU, segs, BASE_S, rng=rng, noise=0.01)
    fit = fit_segments(segs[:60], t[:60], BASE_S, rates=_true_rates())
    peak, bw, eff = device_rates(_true_rates())
    assert fit.peak_flops_per_s == peak and fit.memory_bandwidth_bytes_per_s == bw
    for c in RATE_CLASSES:
        assert fit.efficiency[c] == pytest.approx(eff[c])
    assert fit.unpinned == ()
    assert fit.fused_bytes_fraction == pytest.approx(0.35, abs=0.08)
    assert fit.class_overhead_s["matmul"] == pytest.approx(3e-6, rel=0.3)
    pred = predict_segments(fit.device(name="f", kind="cpu", memory_bytes=1.0), segs[60:],
                            BASE_S)
    assert np.median(np.abs(pred / t[60:] - 1)) < 0.03


def test_rates_pin_real_sizes_where_small_segments_cannot():
    """Segments a fifth of whose time is work: fitted without rates, the op costs of a
    real-size matmul come out wherever the fit's bounds let them; with the rates pinned
    the real-size op is priced at the device's rate."""
    rng = np.random.default_rng(9)
    segs = random_segments(rng, 60, scale=1e-3)
    t = segment_times(TRUE_CPU, segs, BASE_S, rng=rng, noise=0.02)
    unpinned = fit_segments(segs, t, BASE_S)
    pinned = fit_segments(segs, t, BASE_S, rates=_true_rates())
    big = {"primitive": ["dot_general"], "flops": [2.0 * 4096 ** 3],
           "bytes_accessed": [3 * 4.0 * 4096 ** 2], "local_input": [False]}
    true_t = predict_segments(true_device(), [big], 0.0)[0]
    got = predict_segments(pinned.device(name="f", kind="cpu", memory_bytes=1.0), [big],
                           0.0)[0]
    assert got == pytest.approx(true_t, rel=0.05)
    guessed = predict_segments(unpinned.device(name="u", kind="cpu", memory_bytes=1.0),
                               [big], 0.0)[0]
    assert not 0.5 < guessed / true_t < 2  # 50x off with these segments


def test_a_fit_that_runs_to_a_bound_is_refused_with_the_measurement_to_repeat():
    """Segments whose times are per-op costs only (no work to see): the unpinned fit
    runs a rate to its bound; the calibration refuses it and says to measure the
    rates, where the old code wrote the model with a warning."""
    rng = np.random.default_rng(2)
    segs = random_segments(rng, 40, scale=1e-6)
    t = segment_times(TRUE_CPU, segs, BASE_S, rng=rng, noise=0.01)
    fit = fit_segments(segs, t, BASE_S)
    assert fit.unpinned
    problems = rate_problems(fit, ("cpu", "cpu"), 2)
    assert problems and all("microbenchmarks" in p for p in problems)
    assert rate_problems(fit_segments(segs, t, BASE_S, rates=_true_rates()),
                         ("cpu", "cpu"), 2) == []


def test_measure_rate_grows_until_two_sizes_agree(monkeypatch):
    """A fake kernel whose rate rises, then settles: the series stops at the first pair
    of agreeing sizes past the class's saturating size, and keeps their mean."""
    plan = {"start": 1, "factor": 2, "min": 4, "max": 64}
    monkeypatch.setattr(rates_mod, "_sizes", lambda kind, quick: {"matmul": plan})
    speed = {1: 1e9, 2: 4e9, 4: 9e9, 8: 9.5e9, 16: 9.6e9}

    def fake_kernel(op_class, size, kind, device):
        work = 1e6 * size
        return (lambda: None), (), work

    monkeypatch.setattr(rates_mod, "_kernel", fake_kernel)

    def fake_time_fn(fn, *args, **kw):
        size = sizes.pop(0)
        return type("T", (), {"median_s": 1e6 * size / speed[size]})()

    sizes = [1, 2, 4, 8, 16]
    monkeypatch.setattr(rates_mod, "time_fn", fake_time_fn)
    res = measure_rate("matmul", None, kind="cpu", memory_bytes=1e12)
    assert [p["size"] for p in res["points"]] == [1, 2, 4, 8]
    assert res["saturated"] and res["rate"] == pytest.approx((9e9 + 9.5e9) / 2)
    # a series that never settles ends at the largest size, unsaturated, and says so
    plan.update(max=4, min=64)
    sizes[:] = [1, 2, 4]
    res = measure_rate("matmul", None, kind="cpu", memory_bytes=1e12)
    assert not res["saturated"] and "largest size" in res["why"]
    assert res["rate"] == pytest.approx(9e9)


def test_measure_rate_runs_each_kernel_on_a_cpu_device(monkeypatch):
    """Each class's real kernel at a small plan: positive rates, work over time."""
    import jax

    dev = jax.devices("cpu")[0]
    for c in RATE_CLASSES:
        small = {"start": 64 if rates_mod.RATE_UNITS[c] == "flop" else 2 ** 20,
                 "factor": 2, "min": 1, "max": 128 if c == "matmul" else 2 ** 21}
        if c == "conv":
            small.update(start=8, max=16)
        monkeypatch.setattr(rates_mod, "_sizes", lambda kind, quick, c=c, s=small: {c: s})
        res = measure_rate(c, dev, kind="cpu", memory_bytes=1e10, budget_s=2.0)
        assert res["rate"] > 0 and len(res["points"]) >= 2
        for p in res["points"]:
            assert p["rate"] == pytest.approx(p["work"] / p["time_s"])
        rec = check_record(rate_record("cpu:0", c, res), "test")
        assert rates_of([rec], ["cpu:0"]) == {c: res["rate"]}
        assert rates_of([rec], ["cpu:1"]) == {}


def test_a_rate_record_with_a_bad_rate_is_refused():
    rec = rate_record("cpu:0", "matmul", {"rate": 1e9, "saturated": True, "points": []})
    with pytest.raises(CalibrationError, match="rate"):
        check_record(rec | {"rate": 0.0}, "line 3")
    with pytest.raises(CalibrationError, match="saturated"):
        check_record({k: v for k, v in rec.items() if k != "saturated"}, "line 3")

"""The segment fit of calibration, without hardware: segments made up from a known device
(``predict_segments``) are fitted back (``fit_segments``, ``build.fit_device``) and the
fitted device must predict segments it never saw; from how many flops a computation runs
on a worker thread (``build.parallel_min_flops``); and the pure helpers of
``calibrate.segments`` (how placements are cut, what a segment's ops are).

``true_fit``, ``random_segments`` and ``segment_times`` are shared with
``test_calibrate`` (synthetic calibration records)."""

import dataclasses

import numpy as np
import pytest

from simplace.calibrate.build import (
    OP_PART_MIN_S,
    PARALLEL_MIN_AGREEMENT,
    PARALLEL_MIN_EXTRA_S,
    fit_device,
    parallel_min_flops,
)
from simplace.calibrate.fit import SegmentFit, fit_segments, predict_segments
from simplace.calibrate.harness import robust_stats
from simplace.calibrate.segments import (
    HOST_WINDOW_OPS,
    RUNS_PER_PLACEMENT,
    cut_placements,
    host_placements,
    segment_features,
)
from simplace.cost_model import DEFAULT_EFFICIENCY, OP_CLASSES, WORK_CLASSES, Device
from simplace.errors import CalibrationError

# A made-up CPU-like device: every figure differs from the fit's starting point.
TRUE_CPU = SegmentFit(
    peak_flops_per_s=8e10, memory_bandwidth_bytes_per_s=1.5e10,
    efficiency={"matmul": 1.0, "conv": 0.6, "elementwise": 0.5, "reduction": 0.4,
                "data_movement": 0.3, "control": 0.3},
    class_overhead_s={"matmul": 3e-6, "conv": 5e-6, "elementwise": 0.5e-6,
                      "reduction": 1.5e-6, "data_movement": 1e-6, "control": 0.0},
    fused_bytes_fraction=0.35, classes_fitted=("matmul", "conv", "elementwise", "reduction",
                                               "data_movement"),
    parallel_launch_s=25e-6, unfused_overhead_s=2e-6)
# A made-up accelerator: faster rates, costlier per-op kernels, no thread pool.
TRUE_GPU = SegmentFit(
    peak_flops_per_s=2e12, memory_bandwidth_bytes_per_s=4e11,
    efficiency={"matmul": 1.0, "conv": 0.7, "elementwise": 0.6, "reduction": 0.5,
                "data_movement": 0.45, "control": 0.3},
    class_overhead_s={"matmul": 6e-6, "conv": 8e-6, "elementwise": 2e-6,
                      "reduction": 3e-6, "data_movement": 2.5e-6, "control": 0.0},
    fused_bytes_fraction=0.5, classes_fitted=("matmul", "conv", "elementwise", "reduction",
                                              "data_movement"),
    parallel_launch_s=0.0, unfused_overhead_s=4e-6)
BASE_S = 12e-6  # a tiny call's blocking time
# One primitive or more per class; convert_element_type with bytes is a working free op
# (charged like data_movement, with fused bytes), reshape a free op that does nothing.
PRIMITIVES = ("dot_general", "conv_general_dilated", "add", "mul", "tanh", "reduce_sum",
              "transpose", "convert_element_type", "reshape")


def true_fit(kind="cpu"):
    return TRUE_CPU if kind == "cpu" else TRUE_GPU


def true_device(fit=TRUE_CPU, **fields):
    return fit.device(**({"name": "true", "kind": "cpu", "memory_bytes": 1.0} | fields))


def _op(rng, prim, scale):
    if prim in ("dot_general", "conv_general_dilated"):
        n = 2 ** rng.uniform(3, 8.5) * scale
        return 2 * n ** 3 * (3 if prim.startswith("conv") else 1), 12 * n * n
    if prim == "reshape":
        return 0.0, 0.0
    n = 2 ** rng.uniform(6, 20) * scale
    return (0.0 if prim in ("transpose", "convert_element_type") else n), 8 * n


def random_segments(rng, count, *, primitives=PRIMITIVES, max_ops=40, scale=1.0):
    """``count`` segments (``segment_features`` dicts) of 1..max_ops random ops; about a
    third of the ops after the first take no input from their own segment."""
    out = []
    for _ in range(count):
        k = int(np.exp(rng.uniform(0, np.log(max_ops))))
        prims = [str(p) for p in rng.choice(primitives, k)]
        flops, nbytes = zip(*[_op(rng, p, scale) for p in prims], strict=True)
        local = [bool(i > 0 and rng.random() < 0.7) for i in range(k)]
        out.append({"primitive": prims, "flops": [float(f) for f in flops],
                    "bytes_accessed": [float(b) for b in nbytes], "local_input": local})
    return out


def segment_times(fit, segments, base_s, parallel=None, rng=None, noise=0.0):
    """Blocking times of ``segments`` timed alone on a device with ``fit``'s costs."""
    par = np.zeros(len(segments), bool) if parallel is None else np.asarray(parallel)
    t = predict_segments(true_device(fit), segments, base_s + par * fit.parallel_launch_s)
    if noise:
        t = t * np.exp(rng.normal(0, noise, len(t)))
    return t


def _fitted_device(fit):
    return fit.device(name="fit", kind="cpu", memory_bytes=1.0)


def _rel_err(pred, true):
    return np.abs(np.asarray(pred) / np.asarray(true) - 1.0)


# --------------------------------------------------------------------------- predict
def test_predict_segments_charges_base_roofline_fused_bytes_and_unfused_loops():
    dev = Device(name="d", kind="cpu", memory_bytes=1.0, peak_flops_per_s=1e9,
                 memory_bandwidth_bytes_per_s=1e8,
                 efficiency={"matmul": 0.5, "elementwise": 0.25, "data_movement": 0.2},
                 class_overhead_s={"matmul": 3e-6, "elementwise": 1e-6,
                                   "data_movement": 2e-6},
                 fused_bytes_fraction=0.5, unfused_overhead_s=7e-6)
    seg = {"primitive": ["dot_general", "add", "add", "convert_element_type", "reshape",
                         "transpose"],
           "flops": [2e6, 1e3, 1e3, 0.0, 0.0, 0.0],
           "bytes_accessed": [1e3, 4e4, 4e4, 2e4, 0.0, 1e4],
           "local_input": [False, True, False, False, False, False]}
    expect = [
        3e-6 + 2e6 / 1e9 / 0.5,                    # matmul: compute-bound, never unfused
        1e-6 + 0.5 * 4e4 / 1e8 / 0.25,             # add fed in-segment: fused bytes only
        1e-6 + 0.5 * 4e4 / 1e8 / 0.25 + 7e-6,      # add fed from outside: its own loop
        2e-6 + 0.5 * 2e4 / 1e8 / 0.2 + 7e-6,       # working free op: data_movement, fused
        0.0,                                       # reshape that does nothing: free
        2e-6 + 1e4 / 1e8 / 0.2,                    # data movement: all its bytes
    ]
    base = 11e-6
    got = predict_segments(dev, [seg], base)
    assert got.shape == (1,)
    assert got[0] == pytest.approx(base + sum(expect), rel=1e-12)
    # one segment per op: each op's cost on its own, and a base per segment
    singles = [{k: [v[i]] for k, v in seg.items()} for i in range(len(expect))]
    bases = np.arange(1, len(expect) + 1) * 1e-6
    assert predict_segments(dev, singles, bases) == pytest.approx(
        bases + np.array(expect), rel=1e-12)
    # without local_input every op counts as fed in-segment (no unfused loops)
    plain = {k: v for k, v in seg.items() if k != "local_input"}
    assert predict_segments(dev, [plain], 0.0)[0] == pytest.approx(
        sum(expect) - 2 * 7e-6, rel=1e-12)


def test_segment_fit_device_carries_every_fitted_figure():
    dev = true_device(TRUE_CPU, name="x", kind="gpu", memory_bytes=5.0, launch_s=1e-6)
    assert (dev.name, dev.kind, dev.memory_bytes, dev.launch_s) == ("x", "gpu", 5.0, 1e-6)
    assert dev.peak_flops_per_s == TRUE_CPU.peak_flops_per_s
    assert dev.memory_bandwidth_bytes_per_s == TRUE_CPU.memory_bandwidth_bytes_per_s
    assert dev.fused_bytes_fraction == TRUE_CPU.fused_bytes_fraction
    assert dev.parallel_launch_s == TRUE_CPU.parallel_launch_s
    assert dev.unfused_overhead_s == TRUE_CPU.unfused_overhead_s
    assert {c: dev.efficiency[c] for c in WORK_CLASSES} == TRUE_CPU.efficiency
    assert dict(dev.class_overhead_s) == dict(TRUE_CPU.class_overhead_s)
    assert dev.overhead_s == pytest.approx(np.median(list(TRUE_CPU.class_overhead_s.values())))


# --------------------------------------------------------------------------- fit
@pytest.mark.parametrize("truth", [TRUE_CPU, TRUE_GPU], ids=["cpu", "gpu"])
def test_fit_segments_predicts_held_out_segments(truth):
    rng = np.random.default_rng(0)
    segs = random_segments(rng, 120)
    par = rng.random(120) < 0.4 if truth.parallel_launch_s else None
    t = segment_times(truth, segs, BASE_S, par, rng, noise=0.01)
    fit = fit_segments(segs, t, BASE_S, parallel=par)
    # The rates and efficiencies are not identifiable one by one (only peak x
    # efficiency is seen); predictions are what must come back.
    fresh = random_segments(np.random.default_rng(1), 200)
    fpar = np.random.default_rng(2).random(200) < 0.4
    true_t = segment_times(truth, fresh, BASE_S, fpar if par is not None else None)
    pred = predict_segments(_fitted_device(fit), fresh,
                            BASE_S + (fpar if par is not None else 0) * fit.parallel_launch_s)
    err = _rel_err(pred, true_t)
    assert np.median(err) < 0.01 and err.max() < 0.05
    # The op part alone (what the simulator sums in a segment), where it is large.
    true_ops = predict_segments(true_device(truth), fresh, 0.0)
    fit_ops = predict_segments(_fitted_device(fit), fresh, 0.0)
    big = true_ops > 20e-6
    assert big.sum() > 50
    assert np.median(_rel_err(fit_ops[big], true_ops[big])) < 0.02
    # What is identifiable from these segments comes back on its own.
    assert fit.unfused_overhead_s == pytest.approx(truth.unfused_overhead_s, rel=0.15)
    assert fit.fused_bytes_fraction == pytest.approx(truth.fused_bytes_fraction, rel=0.1)
    assert fit.parallel_launch_s == pytest.approx(truth.parallel_launch_s, rel=0.1, abs=1e-9)
    for c in ("matmul", "conv"):  # compute-bound: peak x efficiency
        assert fit.peak_flops_per_s * fit.efficiency[c] == pytest.approx(
            truth.peak_flops_per_s * truth.efficiency[c], rel=0.1), c
    assert max(fit.efficiency.values()) == pytest.approx(1.0)  # the gauge: best class 1
    assert set(fit.classes_fitted) == {"matmul", "conv", "elementwise", "reduction",
                                       "data_movement"}


def test_fit_segments_is_robust_to_outliers():
    rng = np.random.default_rng(3)
    segs = random_segments(rng, 150)
    par = rng.random(150) < 0.3
    t = segment_times(TRUE_CPU, segs, BASE_S, par, rng, noise=0.01)
    bad = np.arange(0, 150, 15)
    t[bad] *= rng.uniform(3, 8, len(bad))  # a busy machine now and then
    fit = fit_segments(segs, t, BASE_S, parallel=par)
    fresh = random_segments(np.random.default_rng(4), 150)
    err = _rel_err(predict_segments(_fitted_device(fit), fresh, BASE_S),
                   segment_times(TRUE_CPU, fresh, BASE_S))
    assert np.median(err) < 0.02 and np.percentile(err, 90) < 0.05
    assert fit.parallel_launch_s == pytest.approx(TRUE_CPU.parallel_launch_s, rel=0.15)


def test_fit_segments_uses_a_base_per_segment():
    rng = np.random.default_rng(5)
    segs = random_segments(rng, 80)
    base = rng.uniform(8e-6, 40e-6, 80)  # e.g. each segment's own launch
    fit = fit_segments(segs, segment_times(TRUE_CPU, segs, base, None, rng, 0.005), base)
    fresh = random_segments(np.random.default_rng(6), 80)
    err = _rel_err(predict_segments(_fitted_device(fit), fresh, 20e-6),
                   segment_times(TRUE_CPU, fresh, 20e-6))
    assert np.median(err) < 0.01 and err.max() < 0.05
    # a scalar base is the same as one equal base per segment
    t = segment_times(TRUE_CPU, segs, BASE_S, None, rng, 0.01)
    assert fit_segments(segs, t, BASE_S) == fit_segments(segs, t, np.full(80, BASE_S))
    # ... and a wrong base (twice the empty call) is not absorbed: predictions suffer
    off = fit_segments(segs, t, 2 * BASE_S)
    err_off = _rel_err(predict_segments(_fitted_device(off), fresh, 20e-6),
                       segment_times(TRUE_CPU, fresh, 20e-6))
    assert np.median(err_off) > 2 * np.median(err)


def test_fit_segments_without_parallel_segments_fits_no_parallel_launch():
    rng = np.random.default_rng(7)
    segs = random_segments(rng, 60)
    t = segment_times(TRUE_GPU, segs, BASE_S)
    assert fit_segments(segs, t, BASE_S).parallel_launch_s == 0.0
    assert fit_segments(segs, t, BASE_S, parallel=np.zeros(60, bool)).parallel_launch_s == 0.0


def test_fit_segments_unfused_loops_come_from_local_input():
    # The same ops, once all fed in-segment and once not: only the second pays loops.
    rng = np.random.default_rng(8)
    segs = random_segments(rng, 80, primitives=("add", "tanh", "reduce_sum", "transpose"))
    fused = [dict(s, local_input=[True] * len(s["primitive"])) for s in segs]
    t = segment_times(TRUE_CPU, segs, BASE_S, None, rng, noise=0.01)
    fit = fit_segments(segs, t, BASE_S)
    assert fit.unfused_overhead_s == pytest.approx(TRUE_CPU.unfused_overhead_s, rel=0.15)
    # the fitted device charges the loops by local_input too
    dev = _fitted_device(fit)
    gap = predict_segments(dev, segs, 0.0) - predict_segments(dev, fused, 0.0)
    loops = [sum(1 for p, loc in zip(s["primitive"], s["local_input"], strict=True)
                 if p in ("add", "tanh") and not loc) for s in segs]
    assert gap == pytest.approx(np.array(loops) * fit.unfused_overhead_s, rel=1e-9, abs=1e-15)
    # fitted as if every op were fed in-segment, the same times are predicted worse
    wrong = fit_segments(fused, t, BASE_S)
    fresh = random_segments(np.random.default_rng(18), 80,
                            primitives=("add", "tanh", "reduce_sum", "transpose"))
    truth = segment_times(TRUE_CPU, fresh, BASE_S)
    good = np.median(_rel_err(predict_segments(dev, fresh, BASE_S), truth))
    bad = np.median(_rel_err(predict_segments(_fitted_device(wrong), fresh, BASE_S), truth))
    assert good < 0.01 and bad > 2 * good


def test_fit_segments_leaves_unseen_classes_at_their_defaults():
    rng = np.random.default_rng(9)
    segs = random_segments(rng, 60, primitives=("dot_general", "add", "reduce_sum"))
    fit = fit_segments(segs, segment_times(TRUE_CPU, segs, BASE_S), BASE_S)
    assert fit.classes_fitted == ("matmul", "elementwise", "reduction")
    for c in ("conv", "data_movement", "control"):
        assert fit.efficiency[c] == DEFAULT_EFFICIENCY[c], c
        assert fit.class_overhead_s[c] == 0.0, c
    assert set(fit.efficiency) == set(fit.class_overhead_s) == set(WORK_CLASSES)
    assert all(0 < e <= 1 for e in fit.efficiency.values())


def test_fit_segments_is_deterministic():
    rng = np.random.default_rng(10)
    segs = random_segments(rng, 40)
    par = rng.random(40) < 0.5
    t = segment_times(TRUE_CPU, segs, BASE_S, par, rng, noise=0.02)
    assert fit_segments(segs, t, BASE_S, parallel=par) == fit_segments(
        segs, list(t), BASE_S, parallel=list(par))


def test_fit_segments_needs_8_segments():
    rng = np.random.default_rng(11)
    segs = random_segments(rng, 7)
    with pytest.raises(CalibrationError, match=r"Only 7 timed segments .*8 needed.*--models"):
        fit_segments(segs, segment_times(TRUE_CPU, segs, BASE_S), BASE_S)
    with pytest.raises(CalibrationError, match="Only 0 timed segments"):
        fit_segments([], [], BASE_S)


def test_fit_segments_refuses_segments_no_slower_than_an_empty_call():
    segs = random_segments(np.random.default_rng(12), 20, scale=0.05)
    t = np.full(20, BASE_S * 1.02)
    with pytest.raises(CalibrationError,
                       match=r"hardly slower than an empty call.*Calibrate with larger "
                             r"--models"):
        fit_segments(segs, t, BASE_S)
    # faster than an empty call: the same
    with pytest.raises(CalibrationError, match="hardly slower"):
        fit_segments(segs, np.full(20, BASE_S / 2), BASE_S)


@pytest.mark.parametrize("times, match", [
    ([1e-3] * 9, "10 segments but 9 times"),
    ([1e-3] * 9 + [float("nan")], "finite and > 0"),
    ([1e-3] * 9 + [0.0], "finite and > 0"),
    ([1e-3] * 9 + [-1e-3], "finite and > 0"),
])
def test_fit_segments_bad_times(times, match):
    segs = random_segments(np.random.default_rng(13), 10)
    with pytest.raises(CalibrationError, match=match):
        fit_segments(segs, times, BASE_S)


def test_fit_segments_with_no_working_op_says_why():
    segs = [{"primitive": ["reshape", "broadcast_in_dim"], "flops": [0.0, 0.0],
             "bytes_accessed": [0.0, 0.0]}] * 10
    with pytest.raises(CalibrationError):
        fit_segments(segs, [2 * BASE_S] * 10, BASE_S)


def test_fit_segments_does_not_stop_in_a_local_minimum():
    rng = np.random.default_rng(4)
    segs = random_segments(rng, 60)
    t = segment_times(TRUE_GPU, segs, 50e-6, None, rng, noise=0.005)
    fit = fit_segments(segs, t, 50e-6)
    fresh = random_segments(np.random.default_rng(104), 200)
    err = _rel_err(predict_segments(_fitted_device(fit), fresh, 50e-6),
                   segment_times(TRUE_GPU, fresh, 50e-6))
    assert np.median(err) < 0.01 and err.max() < 0.05  # got median 2.9%, max 13%


# --------------------------------------------------------------------------- fit_device
def _seg_records(segs, t, device="cpu:0"):
    return [dict(s, kind="segment", device=device, model="syn", first=0,
                 stop=len(s["primitive"]), timing=robust_stats([float(x)] * 3).to_dict())
            for s, x in zip(segs, t, strict=True)]


def _holds(seg, prim, min_bytes):
    return any(p == prim and b >= min_bytes
               for p, b in zip(seg["primitive"], seg["bytes_accessed"], strict=True))


def _flops(seg):
    """The segment's flops as XLA counts them (transcendentals apart)."""
    from simplace._primitive_costs import xla_flops_fraction

    return sum(f * xla_flops_fraction(p) for p, f in zip(seg["primitive"], seg["flops"],
                                                          strict=True))


def test_fit_device_pays_parallel_launch_by_threshold_and_reports_held_out_errors():
    rng = np.random.default_rng(14)
    segs = random_segments(rng, 100)
    min_flops = 3e6  # segments of this many flops or more run on a worker thread
    par = np.array([_flops(s) >= min_flops for s in segs])
    assert 20 < par.sum() < 80
    t = segment_times(TRUE_CPU, segs, BASE_S, par, rng, noise=0.005)
    recs = _seg_records(segs, t)
    fit, rep = fit_device(recs, BASE_S, min_flops, seed=3)
    assert fit.parallel_launch_s == pytest.approx(TRUE_CPU.parallel_launch_s, rel=0.1)
    held = np.random.default_rng(3).random(100) < 0.25  # the seeded held-out split
    assert rep["held_out"]["n"] == held.sum() and rep["fitted"]["n"] == (~held).sum()
    assert rep["held_out"]["median_rel_error"] < 0.01
    assert rep["held_out"]["p90_rel_error"] < 0.03
    assert rep["fitted"]["median_rel_error"] < 0.01
    op_part = t - BASE_S - par * TRUE_CPU.parallel_launch_s
    assert rep["held_out_op_part"]["n"] == (held & (op_part >= OP_PART_MIN_S - 1e-7)).sum()
    assert rep["held_out_op_part"]["median_rel_error"] < 0.03
    assert rep["segments_measured"] == 100
    assert rep["ops_in_segments"] == sum(len(s["primitive"]) for s in segs)
    assert rep["classes_fitted"] == list(fit.classes_fitted)
    # the fit never saw the held-out segments: fitting on the others alone is the same
    t_rec = np.array([r["timing"]["median_s"] for r in recs])  # as stored (ns)
    fit2 = fit_segments([s for s, h in zip(segs, held, strict=True) if not h], t_rec[~held],
                        BASE_S, parallel=par[~held])
    assert fit2 == fit
    # without a threshold nothing pays a parallel launch, and the fit is worse
    fit0, rep0 = fit_device(recs, BASE_S, None, seed=3)
    assert fit0.parallel_launch_s == 0.0
    assert rep0["fitted"]["p90_rel_error"] > 2 * rep["fitted"]["p90_rel_error"]
    # another seed holds out other segments
    _, rep7 = fit_device(recs, BASE_S, min_flops, seed=7)
    assert rep7["held_out"]["n"] == (np.random.default_rng(7).random(100) < 0.25).sum()


def test_a_segment_pays_the_parallel_launch_from_the_threshold_on_like_the_simulator():
    # The fit and the simulators agree on which segments pay: the ops' flops added up,
    # whatever their primitives and sizes; a segment split in two pays in neither half.
    from simplace.calibrate.build import _has_parallel
    from simplace.cost_model import CostModel
    from simplace.graph import OpGraph
    from simplace.sim import simulate

    dev = true_device(TRUE_CPU, parallel_min_segment_flops=1000.0)
    bare = dataclasses.replace(dev, parallel_min_segment_flops=None)
    model, nopool = (CostModel.from_devices(n, [d, dataclasses.replace(d, name="other")],
                                            1e-6, 1e9) for n, d in (("m", dev), ("n", bare)))
    seg = {"primitive": ["dot_general", "add", "reduce_sum"], "bytes_accessed": [8.0] * 3}
    cases = [([999.0, 0.0, 0.0], False), ([1000.0, 0.0, 0.0], True),
             ([400.0, 300.0, 300.0], True), ([400.0, 300.0, 299.0], False)]
    for flops, pays in cases:
        assert _has_parallel(dict(seg, flops=flops), 1000.0) is pays, flops
        g = OpGraph(op=seg["primitive"], name_path=[""] * 3, flops=flops,
                    bytes_accessed=seg["bytes_accessed"], out_bytes=np.ones(3),
                    signature=list("abc"), src=[0, 1], dst=[1, 2], edge_bytes=np.ones(2))
        work, min_work, launch = model.pool_rule(g)
        np.testing.assert_array_equal(work[:, 0], flops)
        assert min_work[0] == 1000.0 and launch[0] == TRUE_CPU.parallel_launch_s
        for p in ([0, 0, 0], [0, 0, 1]):
            halves_pay = [sum(flops[:2]) >= 1000, flops[2] >= 1000] if p[2] else [pays]
            gap = (simulate(g, model, np.array(p)).step_time_s
                   - simulate(g, nopool, np.array(p)).step_time_s)
            # (the halves run one after the other: what each pays adds up)
            assert gap == pytest.approx(sum(halves_pay) * TRUE_CPU.parallel_launch_s,
                                        abs=1e-12), (flops, p)
    assert not _has_parallel(dict(seg, flops=[1e9] * 3), None)
    # transcendentals are not flops to XLA: 5000 of exp run inline, 2000 of logistic
    # (3 flops and 1 transcendental per element) count 1500
    for prim, flops, pays in (("exp", 5000.0, False), ("logistic", 2000.0, True),
                              ("logistic", 1200.0, False)):
        assert _has_parallel({"primitive": [prim], "flops": [flops]}, 1000.0) is pays
        g = OpGraph(op=[prim], name_path=[""], flops=[flops], bytes_accessed=[8.0],
                    out_bytes=np.ones(1), signature=["a"], src=[], dst=[], edge_bytes=[])
        work, _, _ = model.pool_rule(g)
        assert bool(work[0, 0] >= 1000.0) is pays


def test_fit_device_with_too_few_segments_says_what_to_do():
    segs = random_segments(np.random.default_rng(15), 5)
    with pytest.raises(CalibrationError, match="--budget-s"):
        fit_device(_seg_records(segs, segment_times(TRUE_CPU, segs, BASE_S)), BASE_S)


# --------------------------------------------------------------------------- thresholds
def _op_rec(prim, nbytes, median_s, device="cpu:0", flops=0.0):
    return {"kind": "op", "device": device, "signature": f"{prim}|{nbytes}|{flops}",
            "primitive": prim, "op_class": "x", "flops": flops, "bytes_accessed": nbytes,
            "set": "model", "timing": robust_stats([median_s] * 3).to_dict()}


def test_parallel_min_flops_on_hand_made_op_records():
    base = 20e-6
    fast, slow = base + 0.2 * PARALLEL_MIN_EXTRA_S, base + 3 * PARALLEL_MIN_EXTRA_S
    # Any primitive pays from 1000 flops on (given out of order); one small op is slow
    # (noise) and one large is fast: 18 of 20 agree with the split between 960 and 1040.
    recs = [_op_rec(p, 0.0, slow if f >= 1000 else fast, flops=f)
            for p in ("dot_general", "add") for f in (1040.0, 10.0, 960.0, 5e3, 1e6, 0.0,
                                                       2e3, 100.0)]
    recs += [_op_rec("mul", 0.0, slow, flops=50.0), _op_rec("mul", 0.0, fast, flops=1e5),
             _op_rec("reshape", 0.0, fast, flops=0.0),
             _op_rec("reduce_sum", 0.0, slow, flops=1e4)]
    got, agreement = parallel_min_flops(recs, base)
    assert got == pytest.approx(np.sqrt(960.0 * 1040.0))
    assert agreement == pytest.approx(18 / 20)
    assert parallel_min_flops(list(reversed(recs)), base) == (got, agreement)  # any order
    # the extra time is over the base: with a slower base no op pays, no rule
    assert parallel_min_flops(recs, slow) == (None, 0.0)
    # the bar is PARALLEL_MIN_EXTRA_S over the base, not the time itself
    just = [_op_rec("mul", 0.0, base + 0.9 * PARALLEL_MIN_EXTRA_S, flops=10.0),
            _op_rec("mul", 0.0, base + 1.1 * PARALLEL_MIN_EXTRA_S, flops=1e4)]
    assert parallel_min_flops(just, base) == (pytest.approx(np.sqrt(10.0 * 1e4)), 1.0)
    assert parallel_min_flops([], base) == (None, 0.0)
    # flops that do not decide (half the large ops pay, half do not): no rule
    mixed = [_op_rec("add", 0.0, slow if k % 2 else fast, flops=1e3 * (k + 1))
             for k in range(10)]
    got_mixed, share = parallel_min_flops(mixed, base)
    assert got_mixed is None and share < PARALLEL_MIN_AGREEMENT


# --------------------------------------------------------------------------- segments
@pytest.mark.parametrize("num_ops, num_devices", [(1, 2), (2, 2), (50, 1), (78, 2), (500, 4)])
def test_cut_placements(num_ops, num_devices):
    for seed in range(5):
        ps = cut_placements(num_ops, num_devices, np.random.default_rng(seed), count=4)
        assert len(ps) == (1 if num_ops < 2 else 4)
        assert ps[0].dtype == np.int32 and not ps[0].any()  # the whole graph, on device 0
        for p in ps:
            assert p.shape == (num_ops,)
            assert p.min() >= 0 and p.max() < num_devices
            runs = 1 + int(np.count_nonzero(np.diff(p)))
            assert runs <= RUNS_PER_PLACEMENT[1] + 1
            if num_devices == 1:
                assert not p.any()
        # the same seed, the same cuts
        again = cut_placements(num_ops, num_devices, np.random.default_rng(seed), count=4)
        assert all(np.array_equal(a, b) for a, b in zip(ps, again, strict=True))
    if num_ops >= 50 and num_devices > 1:  # several runs, on several devices
        ps = [p for s in range(5)
              for p in cut_placements(num_ops, num_devices, np.random.default_rng(s))[1:]]
        assert max(1 + np.count_nonzero(np.diff(p)) for p in ps) >= RUNS_PER_PLACEMENT[0]
        assert len({int(d) for p in ps for d in p}) == num_devices


def test_host_placements():
    rng = np.random.default_rng(0)
    assert host_placements(100, 1, rng) == [] and host_placements(1, 4, rng) == []
    for num_ops in (120, 2000):
        scattered, sparse = host_placements(num_ops, 4, rng)
        assert scattered.dtype == sparse.dtype == np.int32
        assert scattered.shape == sparse.shape == (num_ops,)
        assert set(scattered.tolist()) == {0, 1, 2, 3}
        w = min(num_ops, HOST_WINDOW_OPS)
        # about one segment per op of one window; the rest stays on device 0
        assert 0.6 * w < np.count_nonzero(np.diff(scattered)) <= w + 1
        assert np.count_nonzero(scattered) <= w
        on = np.flatnonzero(scattered)
        assert on.max() - on.min() < w
        off = np.count_nonzero(sparse)
        assert 0.1 * w < off < 0.4 * w and sparse.max() < 4  # one op in four off device 0
    # the same seed, the same placements
    a = host_placements(500, 4, np.random.default_rng(5))
    b = host_placements(500, 4, np.random.default_rng(5))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_segment_features_lists_ops_and_which_take_an_in_segment_input():
    from simplace.graph import OpGraph

    # 0 -> 1 -> 3, 0 -> 2, 2 -> 3, 1 -> 4
    g = OpGraph(op=["dot_general", "add", "reshape", "mul", "reduce_sum"],
                name_path=[""] * 5, flops=[10.0, 2.0, 0.0, 3.0, 4.0],
                bytes_accessed=[100.0, 20.0, 0.0, 30.0, 40.0], out_bytes=np.ones(5),
                signature=list("abcde"), src=[0, 1, 0, 2, 1], dst=[1, 3, 2, 3, 4],
                edge_bytes=np.ones(5))
    f = segment_features(g, 1, 4)
    assert f == {"primitive": ["add", "reshape", "mul"], "flops": [2.0, 0.0, 3.0],
                 "bytes_accessed": [20.0, 0.0, 30.0], "local_input": [False, False, True]}
    assert segment_features(g, 0, 5)["local_input"] == [False, True, True, True, True]
    assert segment_features(g, 4, 5)["local_input"] == [False]
    # features go straight into the fit's op arrays
    assert OP_CLASSES[0] == "matmul"
    assert predict_segments(true_device(), [f], 0.0).shape == (1,)


def test_fit_segments_names_rates_the_segments_cannot_see():
    """Segment times that are a per-op cost alone, whatever the ops' flops and bytes:
    the rates run to their bounds and the fit names them (the calibration then warns)
    instead of passing 1e14 B/s off as a measurement; a fit that sees them names none."""
    rng = np.random.default_rng(0)
    segs = random_segments(rng, 80)
    t = np.array([BASE_S + 3e-6 * len(s["primitive"]) for s in segs])
    fit = fit_segments(segs, t, BASE_S)
    assert fit.unpinned and set(fit.unpinned) <= {"peak compute rate", "memory bandwidth"}
    good = fit_segments(segs, segment_times(TRUE_CPU, segs, BASE_S), BASE_S)
    assert good.unpinned == ()

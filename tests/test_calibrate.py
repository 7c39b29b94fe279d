"""Calibration without hardware: the harness's statistics and stopping rule, the fits on
synthetic measurements with noise and outliers, records files (round trip, bad lines),
and cost models built and refitted from records."""

import json
import math
import sys

import numpy as np
import pytest

from simplace.calibrate import (
    Timing,
    build_cost_model,
    fit_link,
    fit_roofline,
    read_records,
    refit,
    robust_stats,
    time_fn,
    write_records,
)
from simplace.calibrate.exclusive import exclusive_groups, overlap
from simplace.calibrate.fit import roofline_time
from simplace.calibrate.records import SCHEMA, SCHEMA_VERSION
from simplace.cost_model import CostModel, Device
from simplace.errors import CalibrationError, CostModelError, SimplaceError


# --------------------------------------------------------------------------- harness
def test_harness_import_starts_no_backend():
    import subprocess

    code = ("import sys, simplace.calibrate.harness; "
            "import jax._src.xla_bridge as xb; "
            "print(bool(xb._backends))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_robust_stats_drops_and_counts_outliers_but_keeps_samples():
    samples = [1.0, 1.1, 0.9, 1.05, 0.95, 50.0, 1.0]
    t = robust_stats(samples)
    assert t.samples_s == tuple(samples)
    assert t.repeats == 7
    assert t.outliers_dropped == 1
    assert t.median_s == pytest.approx(1.0)
    assert t.mad_s == pytest.approx(0.05)
    # to_dict / from_dict round trip, statistics recomputed from the samples
    assert Timing.from_dict(json.loads(json.dumps(t.to_dict()))) == t


def test_robust_stats_identical_samples_are_not_outliers():
    t = robust_stats([2e-6] * 5 + [2.01e-6])
    assert t.outliers_dropped == 0 and t.mad_s == 0.0


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [-1.0], ["x"]])
def test_robust_stats_rejects_bad_samples(bad):
    with pytest.raises(CalibrationError):
        robust_stats(bad)


def test_timing_validates_repeats():
    with pytest.raises(CalibrationError, match="repeats"):
        Timing(1.0, 0.0, (1.0, 1.0), 0, 3)


class FakeClock:
    """A timer that advances only when the timed function runs, by scripted durations."""

    def __init__(self, durations):
        self.now, self.durations, self.calls = 0.0, list(durations), 0

    def __call__(self):
        return self.now

    def fn(self):
        self.now += self.durations[min(self.calls, len(self.durations) - 1)]
        self.calls += 1
        return 0.0


def test_time_fn_stops_when_the_median_is_stable():
    clock = FakeClock([1.0] * 1000)
    t = time_fn(clock.fn, warmup=2, min_repeats=5, max_repeats=100, budget_s=1e9,
                rel_tol=0.02, timer=clock)
    assert t.repeats == 5 and clock.calls == 7  # 2 warm-up runs, one round of 5
    assert t.median_s == 1.0


def test_time_fn_keeps_going_while_noisy_and_respects_max_repeats():
    rng = np.random.default_rng(0)
    clock = FakeClock(list(rng.uniform(0.5, 1.5, 1000)))
    t = time_fn(clock.fn, warmup=0, min_repeats=5, max_repeats=40, budget_s=1e9,
                rel_tol=0.001, timer=clock)
    assert t.repeats == 40 and len(t.samples_s) == 40


def test_time_fn_respects_the_budget():
    rng = np.random.default_rng(1)
    clock = FakeClock(list(rng.uniform(0.5, 1.5, 1000)))
    t = time_fn(clock.fn, warmup=1, min_repeats=3, max_repeats=1000, budget_s=20.0,
                rel_tol=0.0, timer=clock)
    # stops at the first sample past 20 s of timing (warm-up included)
    assert sum(t.samples_s) + clock.durations[0] >= 20.0
    assert sum(t.samples_s[:-1]) + clock.durations[0] < 20.0


def test_time_fn_times_real_jax_work():
    import jax.numpy as jnp

    x = jnp.ones((64, 64))
    t = time_fn(lambda a: a @ a, x, min_repeats=3, max_repeats=10, budget_s=0.5)
    assert 3 <= t.repeats <= 10 and t.median_s > 0


@pytest.mark.parametrize("kw", [dict(min_repeats=10, max_repeats=5), dict(max_repeats=0),
                                dict(warmup=-1), dict(budget_s=-1.0), dict(rel_tol=-0.1)])
def test_time_fn_rejects_bad_arguments(kw):
    with pytest.raises(CalibrationError):
        time_fn(lambda: 0.0, **kw)


# --------------------------------------------------------------------------- fits
TRUE = dict(overhead=8e-6, peak=2e11, bw=2e10,
            class_overhead={"matmul": 40e-6, "conv": 30e-6, "elementwise": 8e-6,
                            "reduction": 10e-6, "data_movement": 9e-6},
            eff={"matmul": 1.0, "conv": 0.7, "elementwise": 0.6, "reduction": 0.4,
                 "data_movement": 0.3, "control": 0.2})


def _synthetic_ops(rng, n_per_class=20, noise=0.03, outlier_every=9):
    f, b, cls = [], [], []
    for c in ("matmul", "conv", "elementwise", "reduction", "data_movement"):
        for k in range(n_per_class):
            if c in ("matmul", "conv"):
                n = 2 ** (2 + 8 * k / n_per_class)  # 4 .. 1024: overhead- to compute-bound
                f.append(2 * n ** 3)
                b.append(12 * n * n)
            else:
                n = 2 ** (4 + 20 * k / n_per_class)  # 16 .. 16M elements
                f.append(n)
                b.append(8 * n)
            cls.append(c)
    t = roofline_time(TRUE["overhead"], TRUE["peak"], TRUE["bw"], TRUE["eff"], f, b, cls,
                      class_overhead_s=TRUE["class_overhead"])
    t = t * np.exp(rng.normal(0, noise, len(t)))
    if outlier_every:
        t[::outlier_every] *= rng.uniform(3, 10, len(t[::outlier_every]))  # gross outliers
    return np.array(f), np.array(b), cls, t


def test_fit_roofline_recovers_known_parameters_despite_noise_and_outliers():
    f, b, cls, t = _synthetic_ops(np.random.default_rng(0))
    fit = fit_roofline(f, b, cls, t)
    # Timings see only peak x efficiency (compute-bound) and bandwidth x efficiency
    # (memory-bound): those products and the launch overheads are what must come back.
    for c, o in TRUE["class_overhead"].items():
        assert fit.class_overhead_s[c] == pytest.approx(o, rel=0.1), c
    assert fit.peak_flops_per_s * fit.efficiency["matmul"] == pytest.approx(
        TRUE["peak"] * TRUE["eff"]["matmul"], rel=0.1)
    assert fit.peak_flops_per_s * fit.efficiency["conv"] == pytest.approx(
        TRUE["peak"] * TRUE["eff"]["conv"], rel=0.1)
    for c in ("elementwise", "reduction", "data_movement"):
        assert fit.memory_bandwidth_bytes_per_s * fit.efficiency[c] == pytest.approx(
            TRUE["bw"] * TRUE["eff"][c], rel=0.1), c
    assert max(fit.efficiency.values()) == pytest.approx(1.0)
    assert set(fit.classes_fitted) == set(TRUE["class_overhead"])
    # predictions on fresh, clean points of the same model
    f2, b2, cls2, t2 = _synthetic_ops(np.random.default_rng(1), n_per_class=7, noise=0.0,
                                      outlier_every=None)
    err = np.abs(fit.predict(f2, b2, cls2) / t2 - 1)
    assert np.median(err) < 0.05 and err.max() < 0.2


def test_fit_roofline_without_robust_loss_would_be_pulled_by_outliers():
    # the same data, outliers only: a plain median-free fit must not be what we do
    f, b, cls, t = _synthetic_ops(np.random.default_rng(0))
    fit = fit_roofline(f, b, cls, t)
    inl = np.ones(len(t), bool)
    inl[::9] = False
    assert np.median(np.abs(fit.log_residuals[inl])) < 0.05
    assert np.median(fit.log_residuals[~inl]) < -0.5  # outliers stay far from the fit


@pytest.mark.parametrize("args, match", [
    (([1.0] * 3, [1.0] * 3, ["matmul"] * 3, [1.0] * 3), "at least 4"),
    (([1.0] * 4, [1.0] * 4, ["matmul"] * 4, [1.0, 1.0, 0.0, 1.0]), "finite and > 0"),
    (([0.0] * 4, [0.0] * 4, ["matmul"] * 4, [1.0] * 4), "nothing to fit"),
    (([1.0] * 4, [1.0] * 4, ["warp"] * 4, [1.0] * 4), "unknown op class"),
    (([1.0] * 4, [1.0] * 3, ["matmul"] * 4, [1.0] * 4), "equal-length"),
])
def test_fit_roofline_bad_input(args, match):
    with pytest.raises(CalibrationError, match=match):
        fit_roofline(*args)


def test_fit_link_recovers_latency_and_bandwidth():
    rng = np.random.default_rng(0)
    n = 4.0 * 4.0 ** np.arange(13)  # 4 B .. 64 MiB
    t = (25e-6 + n / 8e9) * np.exp(rng.normal(0, 0.02, n.size))
    t[[3, 9]] *= 5  # two gross outliers
    lf = fit_link(n, t)
    assert lf.latency_s == pytest.approx(25e-6, rel=0.05)
    assert lf.bandwidth_bytes_per_s == pytest.approx(8e9, rel=0.05)
    assert lf.median_abs_rel_error < 0.05
    assert lf.rel_residuals.shape == n.shape


def test_fit_link_bad_input():
    with pytest.raises(CalibrationError, match="2 distinct sizes"):
        fit_link([8, 8], [1e-5, 1e-5])
    with pytest.raises(CalibrationError, match="finite"):
        fit_link([8, 16], [1e-5, -1.0])


def test_exclusive_groups_are_connected_components():
    assert overlap(1.0, 1.0, 1.0) == pytest.approx(1.0)  # fully parallel
    assert overlap(1.0, 1.0, 2.0) == pytest.approx(0.0)  # one at a time
    devs = ["cpu:0", "cpu:1", "cpu:2", "gpu:0"]
    pairs = {("cpu:0", "cpu:1"): 0.05, ("cpu:1", "cpu:2"): 0.1, ("cpu:0", "gpu:0"): 0.95,
             ("cpu:2", "gpu:0"): 0.9}
    g = exclusive_groups(devs, pairs)
    assert g["cpu:0"] == g["cpu:1"] == g["cpu:2"] == "shared:cpu:0"
    assert g["gpu:0"] == "gpu:0"


# --------------------------------------------------------------------------- records
def _timing(rng, median_s, n=7):
    return robust_stats(list(median_s * np.exp(rng.normal(0, 0.02, n)))).to_dict()


def synthetic_records(seed=0, devices=("cpu:0", "cpu:1"), name="syn"):
    """Records of a made-up two-device machine with known figures."""
    rng = np.random.default_rng(seed)
    head = {"kind": "header", "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
            "name": name, "host": "testhost", "date": "2026-11-21T00:00:00Z",
            "jax_version": "0.0", "jaxlib_version": "0.0",
            "devices": [{"name": d, "kind": "cpu", "id": k, "device_kind": "cpu",
                         "memory_bytes": 2.0 ** 33} for k, d in enumerate(devices)],
            "settings": {"quick": True}}
    recs = [head]
    f, b, cls, t = _synthetic_ops(rng, n_per_class=16, noise=0.0, outlier_every=None)
    for dev in devices:
        for k, (ff, bb, c, tt) in enumerate(zip(f, b, cls, t, strict=True)):
            recs.append({"kind": "op", "device": dev, "signature": f"syn|{c}|{k}",
                         "primitive": {"matmul": "dot_general", "conv": "conv_general_dilated",
                                       "elementwise": "add", "reduction": "reduce_sum",
                                       "data_movement": "transpose"}[c],
                         "op_class": c, "flops": float(ff), "bytes_accessed": float(bb),
                         "set": "micro" if k % 2 else "model",
                         "timing": _timing(rng, tt)})
    recs.append({"kind": "phase", "phase": "ops", "wall_s": 10.0})
    for a in devices:
        for c in devices:
            if a != c:
                for n in (4, 1024, 2 ** 20, 2 ** 24):
                    recs.append({"kind": "link", "src": a, "dst": c, "nbytes": n,
                                 "timing": _timing(rng, 30e-6 + n / 1e10)})
    recs.append({"kind": "exclusive", "a": devices[0], "b": devices[1],
                 "alone_a": _timing(rng, 0.01), "alone_b": _timing(rng, 0.01),
                 "together": _timing(rng, 0.02)})
    recs.append({"kind": "phase", "phase": "links", "wall_s": 2.5})
    return recs


def test_records_round_trip(tmp_path):
    recs = synthetic_records()
    path = tmp_path / "records.jsonl"
    write_records(path, recs)
    assert read_records(path) == json.loads(json.dumps(recs))


def _bad_file(tmp_path, recs, mutate):
    lines = [json.dumps(r) for r in recs]
    lines = mutate(lines)
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_truncated_line_names_the_line(tmp_path):
    recs = synthetic_records()

    def cut(lines):
        lines[5] = lines[5][: len(lines[5]) // 2]
        return lines
    path = _bad_file(tmp_path, recs, cut)
    with pytest.raises(CalibrationError, match=r"line 6 is not valid JSON"):
        read_records(path)


def test_truncated_last_line_is_an_error_but_resume_repairs_it(tmp_path):
    recs = synthetic_records()
    path = tmp_path / "records.jsonl"
    text = "\n".join(json.dumps(r) for r in recs)
    path.write_text(text[:-20])  # an interrupted write: no final newline
    with pytest.raises(CalibrationError, match=rf"line {len(recs)} .*truncated"):
        read_records(path)
    with pytest.warns(UserWarning, match="truncated last record"):
        got = read_records(path, repair_tail=True)
    assert got == json.loads(json.dumps(recs[:-1]))


def test_appending_after_a_missing_final_newline(tmp_path):
    from simplace.calibrate.records import RecordWriter

    recs = synthetic_records()
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs[:3]))  # cut before the newline
    with RecordWriter(path) as w:
        w.write(recs[3])
    assert read_records(path) == json.loads(json.dumps(recs[:4]))


def test_missing_field_names_the_line_and_field(tmp_path):
    recs = synthetic_records()
    del recs[3]["flops"]
    path = _bad_file(tmp_path, recs, lambda lines: lines)
    with pytest.raises(CalibrationError, match=r"line 4: op record is missing field 'flops'"):
        read_records(path)


@pytest.mark.parametrize("mutate, match", [
    (lambda r: r[2].update(kind="opp"), r"line 3: 'kind' must be one of"),
    (lambda r: r[2].update(flops="many"), r"line 3: field 'flops' .* must be int or float"),
    (lambda r: r[2]["timing"].update(samples_s=[]), r"line 3: field 'timing': No timing"),
    (lambda r: r[0].update(schema="other"), r"line 1: schema must be"),
    (lambda r: r[0].update(schema_version=99), r"line 1: schema_version 99"),
    (lambda r: r.insert(4, dict(r[0])), r"line 5: a second header"),
    (lambda r: r.pop(0), r"line 1: the first record must be the header"),
])
def test_bad_records(tmp_path, mutate, match):
    recs = synthetic_records()
    mutate(recs)
    path = _bad_file(tmp_path, recs, lambda lines: lines)
    with pytest.raises(CalibrationError, match=match) as err:
        read_records(path)
    assert isinstance(err.value, SimplaceError) and str(path) in str(err.value)


def test_empty_line_and_missing_file(tmp_path):
    path = _bad_file(tmp_path, synthetic_records(), lambda lines: lines[:2] + [""] + lines[2:])
    with pytest.raises(CalibrationError, match="line 3 is empty"):
        read_records(path)
    with pytest.raises(CalibrationError, match="does not exist"):
        read_records(tmp_path / "nope.jsonl")


# --------------------------------------------------------------------------- models
def test_build_cost_model_from_records():
    recs = json.loads(json.dumps(synthetic_records()))
    model, report = build_cost_model(recs)
    assert model.provenance.source == "measured"
    assert model.provenance.host == "testhost"
    assert model.device_names == ["cpu:0", "cpu:1"]
    dev = model.devices[0]
    assert dev.class_overhead_s["matmul"] == pytest.approx(40e-6, rel=0.1)
    assert len(dev.op_times_s) == 80
    # links: 30 us + n / 10 GB/s, recovered
    assert model.latency_s[0, 1] == pytest.approx(30e-6, rel=0.05)
    assert model.bandwidth_bytes_per_s[1, 0] == pytest.approx(1e10, rel=0.05)
    assert report["links"]["cpu:0->cpu:1"]["median_rel_error"] < 0.05
    # together = alone_a + alone_b: one exclusive group
    assert model.devices[0].exclusive_group == model.devices[1].exclusive_group
    held = report["devices"]["cpu:0"]["held_out"]
    assert held["n"] == sum(1 for r in recs if r["kind"] == "op" and r["device"] == "cpu:0"
                            and r["set"] == "model")
    assert held["median_rel_error"] < 0.05
    assert report["wall_s"] == pytest.approx(12.5)
    # the model is a valid file
    assert CostModel.from_dict(model.to_dict()) == model


def test_build_cost_model_errors():
    recs = synthetic_records()
    no_ops = [r for r in recs if not (r["kind"] == "op" and r["device"] == "cpu:1")]
    with pytest.raises(CalibrationError, match="No op timings for device 'cpu:1'"):
        build_cost_model(no_ops)
    no_links = [r for r in recs if r["kind"] != "link"]
    with pytest.raises(CalibrationError, match="No link"):
        build_cost_model(no_links)


def test_refit_reproduces_the_model_from_records(tmp_path):
    recs = synthetic_records(name="syn")
    (tmp_path / "rec" / "syn").mkdir(parents=True)
    write_records(tmp_path / "rec" / "syn" / "records.jsonl", recs)
    m1, r1 = refit("syn", records_dir=tmp_path / "rec", cost_model_dir=tmp_path / "cm")
    text1 = (tmp_path / "cm" / "syn.json").read_text()
    m2, r2 = refit("syn", records_dir=tmp_path / "rec", cost_model_dir=tmp_path / "cm")
    assert m1 == m2 and (tmp_path / "cm" / "syn.json").read_text() == text1
    assert CostModel.load(tmp_path / "cm" / "syn.json") == m1
    with pytest.raises(CalibrationError, match="does not exist"):
        refit("other", records_dir=tmp_path / "rec", cost_model_dir=tmp_path / "cm")


# --------------------------------------------------------------------------- CostModel
def test_class_overhead_in_op_times():
    from simplace.graph import OpGraph

    dev = Device(name="d", kind="cpu", memory_bytes=1e9, peak_flops_per_s=1e9,
                 memory_bandwidth_bytes_per_s=1e9, overhead_s=1e-6,
                 efficiency={c: 1.0 for c in ("matmul", "elementwise", "data_movement")},
                 class_overhead_s={"matmul": 5e-6})
    model = CostModel.from_devices("m", [dev], 0.0, 1.0)
    g = OpGraph(op=np.array(["dot_general", "add", "broadcast_in_dim"], dtype=object),
                name_path=np.array(["", "", ""], dtype=object),
                flops=np.array([1e3, 1e3, 0.0]), bytes_accessed=np.array([0.0, 0.0, 1e3]),
                out_bytes=np.zeros(3), signature=np.array(["a", "b", "c"], dtype=object),
                src=np.zeros(0, np.int64), dst=np.zeros(0, np.int64),
                edge_bytes=np.zeros(0))
    t = model.op_times(g)[:, 0]
    assert t == pytest.approx([5e-6 + 1e-6, 1e-6 + 1e-6, 1e-6 + 1e-6])
    d = dev.to_dict()
    assert d["class_overhead_s"] == {"matmul": 5e-6}
    assert Device.from_dict(d) == dev
    plain = Device(name="p", kind="cpu", memory_bytes=1.0, peak_flops_per_s=1.0,
                   memory_bandwidth_bytes_per_s=1.0)
    assert "class_overhead_s" not in plain.to_dict()  # older files stay byte-identical
    with pytest.raises(CostModelError, match="unknown op class 'free'"):
        Device(name="x", kind="cpu", memory_bytes=1.0, peak_flops_per_s=1.0,
               memory_bandwidth_bytes_per_s=1.0, class_overhead_s={"free": 1.0})
    with pytest.raises(CostModelError, match=r"class_overhead_s.matmul must be >= 0"):
        Device(name="x", kind="cpu", memory_bytes=1.0, peak_flops_per_s=1.0,
               memory_bandwidth_bytes_per_s=1.0, class_overhead_s={"matmul": -1.0})
    assert math.isfinite(t.sum())

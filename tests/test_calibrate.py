"""Calibration without hardware: the harness's statistics and stopping rule, the link fit
(and its refusal of links whose times do not grow with size), the old single-op roofline
fit, records files (round trip, bad lines, schema), and cost models built and refitted
from synthetic records of a made-up machine with known costs: launch and dispatch per
device, put costs per link from the host time of whole steps, in-segment op costs fitted
to timed segments, links, exclusive groups.

The segment fit itself is tested in ``test_calibrate_segments``."""

import copy
import dataclasses
import itertools
import json
import math
import sys

import numpy as np
import pytest

from simplace.calibrate import (
    Timing,
    build_cost_model,
    fit_link,
    read_records,
    refit,
    robust_stats,
    time_fn,
    write_records,
)
from simplace.calibrate.exclusive import exclusive_groups, overlap
from simplace.calibrate.fit import LINK_BANDWIDTH_MAX_BYTES_PER_S, predict_segments
from simplace.calibrate.records import SCHEMA, SCHEMA_VERSION, check_record
from simplace.cost_model import CostModel, Device
from simplace.errors import CalibrationError, CostModelError, SimplaceError
from tests.test_calibrate_segments import random_segments, segment_times, true_fit


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


def test_time_fn_reports_each_timed_runs_host_time_apart_from_the_wait():
    clock = FakeClock([0.25, 0.5, 1.0, 0.75])

    class Pending:  # the device's work: waiting for it takes 2 s more
        def block_until_ready(self):
            clock.now += 2.0
            return self

    def call():
        clock.fn()
        return Pending()

    host: list[float] = []
    t = time_fn(call, warmup=1, min_repeats=3, max_repeats=3, budget_s=1e9, timer=clock,
                dispatch_s=host)
    assert host == [0.5, 1.0, 0.75]  # the warm-up run not counted
    assert list(t.samples_s) == [2.5, 3.0, 2.75]


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


# --------------------------------------------------------------------------- links
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
    bw = lf.bandwidth_bytes_per_s
    assert lf.predict([0, bw]) == pytest.approx([lf.latency_s, lf.latency_s + 1.0])


def test_fit_link_bad_input():
    with pytest.raises(CalibrationError, match="2 distinct sizes"):
        fit_link([8, 8], [1e-5, 1e-5])
    with pytest.raises(CalibrationError, match="finite"):
        fit_link([8, 16], [1e-5, -1.0])
    with pytest.raises(CalibrationError, match="equal-length"):
        fit_link([8, 16, 32], [1e-5, 2e-5])


def test_fit_link_refuses_times_that_do_not_grow_with_size():
    n = [4, 1024, 2 ** 20, 2 ** 23]
    with pytest.raises(CalibrationError, match=r"do not grow with size \(4 B: 20\.0 us, "
                                               r"8388608 B: 21\.0 us.*idle machine") as err:
        fit_link(n, [20e-6, 19e-6, 20.5e-6, 21e-6])
    assert "cannot be fitted" in str(err.value)
    # falling times too (the largest size first: sizes need not be sorted)
    with pytest.raises(CalibrationError, match=r"8388608 B: 10\.0 us"):
        fit_link(n[::-1], [10e-6, 30e-6, 30e-6, 30e-6])


def test_fit_link_never_fits_a_bandwidth_above_the_bound():
    # times that grow a little, over sizes that make that a bandwidth no link has
    n = [1e3, 1e6, 4e6]
    t = [1.0e-6, 1.0e-6, 1.25e-6]
    with pytest.raises(CalibrationError, match="do not grow with size"):
        fit_link(n, t)
    # and whatever the times, a fit that comes back stays under the bound
    rng = np.random.default_rng(1)
    fitted = 0
    for _ in range(60):
        sizes = np.sort(rng.choice(4.0 ** np.arange(1, 14), int(rng.integers(3, 7)),
                                   replace=False))
        times = rng.uniform(5e-6, 50e-6) + sizes / 10 ** rng.uniform(9, 14.5)
        times = times * np.exp(rng.normal(0, 0.05, sizes.size))
        try:
            lf = fit_link(sizes, times)
        except CalibrationError as err:
            assert "do not grow with size" in str(err)
            continue
        fitted += 1
        assert 0 < lf.bandwidth_bytes_per_s <= LINK_BANDWIDTH_MAX_BYTES_PER_S
        assert lf.latency_s > 0
    assert 10 < fitted < 60  # both outcomes seen


def test_exclusive_groups_are_connected_components():
    assert overlap(1.0, 1.0, 1.0) == pytest.approx(1.0)  # fully parallel
    assert overlap(1.0, 1.0, 2.0) == pytest.approx(0.0)  # one at a time
    devs = ["cpu:0", "cpu:1", "cpu:2", "gpu:0"]
    pairs = {("cpu:0", "cpu:1"): 0.05, ("cpu:1", "cpu:2"): 0.1, ("cpu:0", "gpu:0"): 0.95,
             ("cpu:2", "gpu:0"): 0.9}
    g = exclusive_groups(devs, pairs)
    assert g["cpu:0"] == g["cpu:1"] == g["cpu:2"] == "shared:cpu:0"
    assert g["gpu:0"] == "gpu:0"


# --------------------------------------------------------------------------- synthetic
# A made-up machine: two virtual CPU devices of one socket and one accelerator, with
# known costs that the records below are generated from.
DEVICES = (("cpu:0", "cpu", "cpu"), ("cpu:1", "cpu", "cpu"), ("gpu:0", "gpu", "FakeGPU"))
BLOCK_S = {"cpu:0": 30e-6, "cpu:1": 32e-6, "gpu:0": 50e-6}  # tiny call, blocking
HOST_S = {"cpu:0": 8e-6, "cpu:1": 8.5e-6, "gpu:0": 6e-6}  # tiny call, dispatched only
DISPATCH_S = {"cpu": 9e-6, "gpu": 4e-6}  # per segment call in a real step (NNLS)
PUT_S = {("cpu", "cpu"): 6e-6, ("cpu", "gpu"): 7e-6, ("gpu", "cpu"): 8e-6}  # in a step
PUT_READY_S = 5e-6  # host time of a device_put call of a small ready array
PUT_WAITS = {("cpu:0", "cpu:1"): False, ("cpu:0", "gpu:0"): False, ("gpu:0", "cpu:0"): None}
LINK = {("cpu", "cpu"): (20e-6, 1e10), ("cpu", "gpu"): (15e-6, 2e10),
        ("gpu", "cpu"): (18e-6, 2.5e10)}  # latency, bandwidth
LINK_SIZES = (4, 1024, 2 ** 16, 2 ** 20, 2 ** 24)
# Computations of this many flops or more run on a worker thread of the CPU (the split
# between the op records' 5e5 and 2e6 flops).
PARALLEL_MIN_FLOPS = 1e6
WALL_S = {"runtime": 0.5, "segments": 10.0, "links": 2.0, "exclusive": 1.0}


def _timing(rng, median_s, n=5, noise=0.0):
    if not noise:
        return robust_stats([float(median_s)] * n).to_dict()
    return robust_stats(list(median_s * np.exp(rng.normal(0, noise, n)))).to_dict()


def _kind(name):
    return dict((d, k) for d, k, _ in DEVICES)[name]


def _holds_parallel(seg):
    """Whether the segment's flops as XLA counts them reach PARALLEL_MIN_FLOPS."""
    from simplace._primitive_costs import xla_flops_fraction

    total = 0.0
    for p, f in zip(seg["primitive"], seg["flops"], strict=True):
        total += f * xla_flops_fraction(p)
    return total >= PARALLEL_MIN_FLOPS


def segment_base_s(kind):
    """What a segment timed alone costs besides its ops on ``kind``: the median blocking
    time of a tiny call over the devices of that kind."""
    return float(np.median([BLOCK_S[d] for d, k, _ in DEVICES if k == kind]))


def synthetic_records(seed=3, name="syn", segments_per_kind=60, host_steps=12,
                      flat_links=(), few_sizes_links=()):
    """Schema-2 records of the made-up machine (every kind of record), deterministic.

    (Seed 3: with several other seeds the accelerator's segment fit stops in a local
    minimum, see ``test_fit_segments_does_not_stop_in_a_local_minimum``.)"""
    rng = np.random.default_rng(seed)
    names = [d for d, _, _ in DEVICES]
    recs = [{"kind": "header", "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
             "name": name, "host": "testhost", "date": "2026-11-23T00:00:00Z",
             "jax_version": "0.0", "jaxlib_version": "0.0",
             "devices": [{"name": d, "kind": k, "id": i, "device_kind": dk,
                          "memory_bytes": 2.0 ** 33} for i, (d, k, dk) in enumerate(DEVICES)],
             "settings": {"quick": True, "models": ["syn"], "seed": 0}}]
    for d in names:
        recs.append({"kind": "runtime", "device": d, "block": _timing(rng, BLOCK_S[d]),
                     "host": _timing(rng, HOST_S[d])})
    for a in names:
        for b in names:
            if a != b:
                recs.append({"kind": "put_host", "src": a, "dst": b,
                             "timing": _timing(rng, PUT_READY_S)})
    # The put-wait probe, one pair per pair of kinds: cpu -> cpu returns at once;
    # cpu -> gpu, against the default for different kinds, too; gpu -> cpu cannot tell.
    for (a, b), waits in PUT_WAITS.items():
        recs.append({"kind": "put_wait", "src": a, "dst": b, "call_s": 3e-3 if waits else 1e-4,
                     "dispatch_s": 5e-5 if waits is not None else 2e-2, "compute_s": 2e-2,
                     "waits": waits})
    recs.append({"kind": "phase", "phase": "runtime", "wall_s": WALL_S["runtime"]})
    # Single ops alone on one CPU device: from PARALLEL_MIN_FLOPS on, whatever the
    # primitive, they wake a worker thread.
    base = segment_base_s("cpu")
    for f in (1e4, 1e5, 5e5, 2e6, 1e7):
        extra = 40e-6 if f >= PARALLEL_MIN_FLOPS else 2e-6
        recs.append({"kind": "op", "device": "cpu:0", "signature": f"dot|{f:g}",
                     "primitive": "dot_general", "op_class": "matmul", "flops": f,
                     "bytes_accessed": f / 10, "set": "model",
                     "timing": _timing(rng, base + extra)})
        recs.append({"kind": "op", "device": "cpu:0", "signature": f"add|{f:g}",
                     "primitive": "add", "op_class": "elementwise", "flops": f,
                     "bytes_accessed": 12 * f, "set": "model",
                     "timing": _timing(rng, base + extra)})
    # Host time of whole steps: segment calls per device and puts per link.
    for k in range(host_steps):
        segs = [int(x) for x in rng.integers(0, 20, len(names))]
        puts = [[0 if i == j else int(rng.integers(0, 12)) for j in range(len(names))]
                for i in range(len(names))]
        t = sum(c * DISPATCH_S[_kind(d)] for d, c in zip(names, segs, strict=True))
        t += sum(puts[i][j] * PUT_S[(_kind(a), _kind(b))] for i, a in enumerate(names)
                 for j, b in enumerate(names) if i != j)
        recs.append({"kind": "host", "model": f"syn{k % 2}", "segments": segs, "puts": puts,
                     "timing": _timing(rng, t)})
    # Segments timed alone, spread over the devices of each kind.
    for kind in ("cpu", "gpu"):
        members = [d for d, k, _ in DEVICES if k == kind]
        segs = random_segments(rng, segments_per_kind)
        par = np.array([kind == "cpu" and _holds_parallel(s) for s in segs])
        t = segment_times(true_fit(kind), segs, segment_base_s(kind), par, rng, noise=0.005)
        for k, (s, x) in enumerate(zip(segs, t, strict=True)):
            recs.append({"kind": "segment", "device": members[k % len(members)],
                         "model": "syn", "first": k, "stop": k + len(s["primitive"]), **s,
                         "timing": _timing(rng, x)})
    recs.append({"kind": "segment_error", "model": "broken", "error": "ValueError: no"})
    recs.append({"kind": "phase", "phase": "segments", "wall_s": WALL_S["segments"]})
    for a in names:
        for b in names:
            if a == b:
                continue
            lat, bw = LINK[(_kind(a), _kind(b))]
            sizes = LINK_SIZES[:2] if (a, b) in few_sizes_links else LINK_SIZES
            for n in sizes:
                t = PUT_READY_S + (lat if (a, b) in flat_links else lat + n / bw)
                recs.append({"kind": "link", "src": a, "dst": b, "nbytes": n,
                             "timing": _timing(rng, t, noise=0.01)})
    recs.append({"kind": "phase", "phase": "links", "wall_s": WALL_S["links"]})
    # cpu:0 and cpu:1 take turns (one socket); the accelerator runs beside them.
    for a, b, together in (("cpu:0", "cpu:1", 0.02), ("cpu:0", "gpu:0", 0.0101),
                           ("cpu:1", "gpu:0", 0.0102)):
        recs.append({"kind": "exclusive", "a": a, "b": b, "alone_a": _timing(rng, 0.01),
                     "alone_b": _timing(rng, 0.01), "together": _timing(rng, together)})
    recs.append({"kind": "phase", "phase": "exclusive", "wall_s": WALL_S["exclusive"]})
    return json.loads(json.dumps(recs))  # as read back from a file


def _index(recs, kind):
    return next(k for k, r in enumerate(recs) if r["kind"] == kind)


# --------------------------------------------------------------------------- records
def test_records_round_trip(tmp_path):
    recs = synthetic_records()
    assert {r["kind"] for r in recs} == {"header", "runtime", "put_host", "put_wait", "phase",
                                         "op", "host", "segment", "segment_error", "link",
                                         "exclusive"}
    path = tmp_path / "records.jsonl"
    write_records(path, recs)
    assert read_records(path) == recs
    assert len(path.read_text().splitlines()) == len(recs)


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


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path):
    recs = synthetic_records()
    path = tmp_path / "records.jsonl"
    text = "\n".join(json.dumps(r) for r in recs)
    path.write_text(text[:-20])  # an interrupted write: no final newline
    with pytest.warns(UserWarning, match=rf"line {len(recs)}: skipped a truncated last rec"):
        got = read_records(path)
    assert got == recs[:-1]
    # a cut line that is not the last is never dropped
    path.write_text("\n".join([json.dumps(r) for r in recs[:3]] + ["{\"kind\": \"ru"]
                              + [json.dumps(r) for r in recs[3:]]) + "\n")
    with pytest.raises(CalibrationError, match="line 4 is not valid JSON"):
        read_records(path)


def test_appending_after_a_missing_final_newline(tmp_path):
    from simplace.calibrate.records import RecordWriter

    recs = synthetic_records()
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs[:3]))  # cut before the newline
    with RecordWriter(path) as w:
        w.write(recs[3])
    assert read_records(path) == recs[:4]


def test_schema_1_records_are_refused(tmp_path):
    recs = synthetic_records()
    recs[0]["schema_version"] = 1
    path = _bad_file(tmp_path, recs[:1], lambda lines: lines)
    with pytest.raises(CalibrationError,
                       match=rf"line 1: calibration records file schema_version 1 is not "
                             rf"supported; this simplace reads {SCHEMA_VERSION}: version 1 "
                             "timed single ops") as err:
        read_records(path)
    assert str(path) in str(err.value)
    assert SCHEMA_VERSION == 2


@pytest.mark.parametrize("mutate, match", [
    (lambda r: r[2].update(kind="opp"), r"line 3: 'kind' must be one of"),
    (lambda r: r[0].update(schema="other"), r"line 1: not a simplace calibration records file "
                                            r"\(its 'schema' is \"other\", not"),
    (lambda r: r[0].update(schema_version=99), r"line 1: .* schema_version 99 is not supp"),
    (lambda r: r[0]["devices"][1].pop("memory_bytes"), r"line 1: devices\[1\] must be"),
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


@pytest.mark.parametrize("kind, mutate, match", [
    ("runtime", lambda r: r.pop("block"), r"'block' is missing \(a runtime record needs"),
    ("runtime", lambda r: r["host"].update(samples_s=[]), "field 'host': No timing"),
    ("put_host", lambda r: r.update(dst=1),
     "field 'dst' of a put_host record must be a string, got 1"),
    ("put_wait", lambda r: r.update(waits="yes"),
     "field 'waits' of a put_wait record must be true, false or null, got 'yes'"),
    ("put_wait", lambda r: r.update(waits=1), "field 'waits' .* got 1"),
    ("put_wait", lambda r: r.pop("waits"), r"field 'waits' is missing \(a put_wait record needs"),
    ("op", lambda r: r.update(flops="many"), r"field 'flops' of an op record must be a number"),
    ("op", lambda r: r.update(flops=True), r"field 'flops' .* must be a number, got true"),
    ("op", lambda r: r.pop("flops"), r"field 'flops' is missing \(an op record needs"),
    ("host", lambda r: r.update(segments=3),
     "field 'segments' of a host record must be a list"),
    ("host", lambda r: r.pop("puts"), r"field 'puts' is missing \(a host record needs"),
    ("segment", lambda r: r.pop("primitive"), r"'primitive' is missing \(a segment record"),
    ("segment", lambda r: r.update(first=1.5),
     "field 'first' of a segment record must be an integer"),
    ("segment", lambda r: r.update(stop=True),
     "field 'stop' of a segment record must be an integer"),
    ("segment", lambda r: r["timing"].update(samples_s=[-1.0]), "field 'timing'"),
    ("segment_error", lambda r: r.pop("error"), r"is missing \(a segment_error record needs"),
    ("link", lambda r: r.update(nbytes="4"), "field 'nbytes' of a link record"),
    ("exclusive", lambda r: r.pop("together"), r"'together' is missing \(an exclusive record"),
    ("phase", lambda r: r.pop("phase"), r"field 'phase' is missing \(a phase record needs"),
])
def test_a_bad_record_of_each_kind_names_its_line_and_field(tmp_path, kind, mutate, match):
    recs = synthetic_records(segments_per_kind=8, host_steps=2)
    k = _index(recs, kind)
    mutate(recs[k])
    path = _bad_file(tmp_path, recs, lambda lines: lines)
    with pytest.raises(CalibrationError, match=rf"line {k + 1}: .*{match}"):
        read_records(path)


def test_empty_line_and_missing_file(tmp_path):
    recs = synthetic_records()
    path = _bad_file(tmp_path, recs, lambda lines: lines[:2] + [""] + lines[2:])
    assert read_records(path) == recs  # a blank line holds no record
    with pytest.raises(CalibrationError, match="does not exist"):
        read_records(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(CalibrationError, match="empty"):
        read_records(tmp_path / "empty.jsonl")


# --------------------------------------------------------------------------- models
@pytest.fixture(scope="module")
def built():
    recs = synthetic_records()
    model, report = build_cost_model(copy.deepcopy(recs))
    return recs, model, report


def _device(model, name):
    return model.devices[model.device_names.index(name)]


def test_build_fits_no_worker_thread_rule_on_an_accelerator():
    # Ops alone on the GPU that cost 40 us more than an empty call from 1e6 flops on
    # (real work, not a thread waking up): no rule for the GPU, the CPU's unchanged.
    recs = synthetic_records()
    base = segment_base_s("gpu")
    for f in (1e4, 1e5, 5e5, 2e6, 1e7):
        recs.append({"kind": "op", "device": "gpu:0", "signature": f"gdot|{f:g}",
                     "primitive": "dot_general", "op_class": "matmul", "flops": f,
                     "bytes_accessed": f / 10, "set": "model",
                     "timing": _timing(np.random.default_rng(0),
                                       base + (40e-6 if f >= 1e6 else 1e-6))})
    model, report = build_cost_model(recs)
    gpu = _device(model, "gpu:0")
    assert gpu.parallel_min_segment_flops is None and gpu.parallel_launch_s == 0.0
    assert report["devices"]["gpu:0"]["parallel_rule_ops"] == 0
    assert _device(model, "cpu:0").parallel_min_segment_flops == pytest.approx(
        PARALLEL_MIN_FLOPS)


def test_build_launch_and_dispatch_per_device(built):
    recs, model, report = built
    assert model.device_names == ["cpu:0", "cpu:1", "gpu:0"]
    assert model.name == "syn"
    for d in model.device_names:
        dev = _device(model, d)
        # launch: a tiny call's blocking time minus its host time
        assert dev.launch_s == pytest.approx(BLOCK_S[d] - HOST_S[d], rel=1e-9)
        # dispatch: the per-segment host time of whole steps (NNLS), not the tiny call's
        assert dev.dispatch_s == pytest.approx(DISPATCH_S[_kind(d)], rel=1e-3)
        r = report["devices"][d]
        assert r["launch_s"] == dev.launch_s and r["dispatch_s"] == HOST_S[d]
        assert r["base_s"] == pytest.approx(segment_base_s(_kind(d)))
    assert model.launch_s.shape == model.dispatch_s.shape == (3,)
    assert report["host"]["steps"] == 12 and report["host"]["median_rel_error"] < 1e-3


def test_build_put_costs_from_host_steps(built):
    _, model, _ = built
    for i, a in enumerate(model.device_names):
        for j, b in enumerate(model.device_names):
            want = 0.0 if i == j else PUT_S[(_kind(a), _kind(b))]
            assert model.put_s[i, j] == pytest.approx(want, rel=1e-3, abs=1e-12), (a, b)


def test_build_put_waits_from_the_probe(built):
    # Each probe sets the links between its two kinds of hardware; a probe that cannot
    # tell leaves the default (different kinds wait). cpu -> gpu was probed not to wait.
    _, model, report = built
    names = model.device_names
    want = {(a, b): _kind(a) == "gpu" and _kind(b) == "cpu" for a in names for b in names
            if a != b}
    got = {(a, b): bool(model.put_waits[i, j]) for i, a in enumerate(names)
           for j, b in enumerate(names) if i != j}
    assert got == want
    assert report["put_waits"]["waiting_links"] == ["gpu:0->cpu:0", "gpu:0->cpu:1"]
    assert set(report["put_waits"]["probes"]) == {f"{a}->{b}" for a, b in PUT_WAITS}
    # written to the model file, since it differs from the default, and read back
    assert CostModel.from_dict(model.to_dict()).put_waits.tolist() == model.put_waits.tolist()
    from simplace.calibrate.cli import format_report

    text = format_report(model, report)
    assert "device_put cpu:0->gpu:0: returns at once" in text
    assert "device_put gpu:0->cpu:0: cannot tell" in text
    # records from before the probe: the default, and nothing reported
    old = [r for r in synthetic_records() if r["kind"] != "put_wait"]
    m2, r2 = build_cost_model(old)
    assert m2.put_waits.tolist() == [[_kind(a) != _kind(b) for b in names] for a in names]
    assert "put_waits" not in r2 and "put_waits" not in m2.to_dict()["links"]


def test_build_links_take_the_put_call_out_of_the_latency(built):
    _, model, report = built
    names = model.device_names
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if i == j:
                continue
            lat, bw = LINK[(_kind(a), _kind(b))]
            assert model.latency_s[i, j] == pytest.approx(lat, rel=0.1), (a, b)
            assert model.bandwidth_bytes_per_s[i, j] == pytest.approx(bw, rel=0.05), (a, b)
            r = report["links"][f"{a}->{b}"]
            assert r["measured"] and r["sizes"] == len(LINK_SIZES)
            assert r["median_rel_error"] < 0.03 and len(r["rel_residuals"]) == len(LINK_SIZES)
            assert r["put_s"] == model.put_s[i, j]
    assert report["links_missing"] == []


def test_build_links_from_the_copy_time_after_the_call():
    """Links timed with ``after_call`` (the copy after the put call returned): latency
    and bandwidth come from those times alone, so a blocking time inflated by slow
    calls (late in a calibration, the host time of a put had tripled) changes nothing;
    records of a pair without ``after_call`` keep the blocking path."""
    recs = synthetic_records()
    rng = np.random.default_rng(7)
    for r in recs:
        if r["kind"] == "link" and r["src"] == "cpu:0":
            lat, bw = LINK[(_kind(r["src"]), _kind(r["dst"]))]
            n = r["nbytes"]
            r["timing"] = _timing(rng, 3 * PUT_READY_S + 40e-6 + lat + n / bw)
            r["after_call"] = _timing(rng, lat + n / bw)
    model, report = build_cost_model(recs)
    names = model.device_names
    for j, b in enumerate(names):
        if b == "cpu:0":
            continue
        lat, bw = LINK[("cpu", _kind(b))]
        assert model.latency_s[0, j] == pytest.approx(lat, rel=0.1), b
        assert model.bandwidth_bytes_per_s[0, j] == pytest.approx(bw, rel=0.05), b
        assert report["links"][f"cpu:0->{b}"]["timed"] == "after the call"
    # the other links: blocking times less the ready put, as before
    assert report["links"]["cpu:1->cpu:0"]["timed"] == "blocking, ready put taken out"
    assert model.latency_s[1, 0] == pytest.approx(LINK[("cpu", "cpu")][0], rel=0.1)
    # copies whose time after the call does not grow with size (small sizes only): the
    # blocking times are fitted instead, and the report says why
    for r in recs:
        if r["kind"] == "link" and r["src"] == "cpu:0":
            r["after_call"] = _timing(rng, 3e-6)
    model, report = build_cost_model(recs)
    r = report["links"]["cpu:0->cpu:1"]
    assert r["timed"] == ("blocking, ready put taken out (after the call: not growing "
                          "with size)")
    assert report["links_missing"] == []
    assert model.bandwidth_bytes_per_s[0, 1] == pytest.approx(LINK[("cpu", "cpu")][1],
                                                              rel=0.05)
    # a bad after_call timing is an error naming the record and field
    bad = [dict(r) for r in recs]
    k = next(i for i, r in enumerate(bad) if "after_call" in r)
    bad[k]["after_call"] = {"samples_s": [-1.0]}
    with pytest.raises(CalibrationError, match="record 3.*'after_call'"):
        check_record(bad[k], "record 3")


def test_build_refuses_a_rate_no_cpu_has_and_a_rate_at_its_bound():
    """A segment fit that gives the CPU devices more than 1 TFLOP/s per core (under load
    on the 2-core VM one came out 254 TFLOP/s), or a rate that ran to its bound, is a
    problem that says what to measure again (issue 32: an error, no longer a warning
    beside a written file); the synthetic CPU's 80 GFLOP/s passes."""
    from simplace.calibrate.build import rate_problems

    recs = synthetic_records()
    recs[0] = dict(recs[0], cpu_count=1)
    _, report = build_cost_model(recs)
    assert report.get("warnings", []) == []
    fit = true_fit("cpu")
    assert rate_problems(fit, ("cpu", "cpu"), 1) == []
    assert rate_problems(fit, ("cpu", "cpu"), 0) == []  # cores unknown: nothing to check
    fast = dataclasses.replace(fit, peak_flops_per_s=2e12)
    (w,) = rate_problems(fast, ("cpu", "cpu"), 1)
    assert "2 TFLOP/s" in w and "1 CPU core" in w and "microbenchmarks" in w
    # accelerators are not checked against the host's cores
    assert rate_problems(dataclasses.replace(fit, peak_flops_per_s=2e15), ("gpu", "H100"),
                         1) == []
    # a rate the segments could not pin is named, whatever the device
    (w,) = rate_problems(dataclasses.replace(fit, unpinned=("memory bandwidth",)),
                         ("gpu", "H100"), 1)
    assert "do not pin the gpu devices (H100)' memory bandwidth" in w and "--resume" in w


def test_build_takes_the_rates_of_rate_records():
    """Records with a rate record per class for the CPU kind: its devices get exactly
    those rates (peak, bandwidth, efficiencies), and the report says so."""
    from simplace.calibrate.rates import RATE_CLASSES, device_rates, rate_record

    rates = {"matmul": 9e10, "conv": 5e10, "elementwise": 8e9, "reduction": 6e9,
             "data_movement": 3e9}
    recs = synthetic_records() + [rate_record("cpu:1", c, {"rate": rates[c],
                                                           "saturated": True, "points": []})
                                  for c in RATE_CLASSES]
    model, report = build_cost_model(recs)
    peak, bw, eff = device_rates(rates)
    for name in ("cpu:0", "cpu:1"):
        dev = _device(model, name)
        assert dev.memory_bandwidth_bytes_per_s == pytest.approx(bw, rel=1e-9)
        assert dev.efficiency["data_movement"] == pytest.approx(eff["data_movement"])
        assert report["devices"][name]["rates"]["matmul"]["rate"] == 9e10
    gpu = _device(model, "gpu:0")  # no rate records for this kind: fitted as before
    assert gpu.peak_flops_per_s != pytest.approx(peak)
    assert isinstance(report["devices"]["gpu:0"]["rates"], str)


def test_build_segment_costs_per_kind_of_hardware(built):
    _, model, report = built
    cpu0, cpu1, gpu = (_device(model, d) for d in model.device_names)
    # devices of the same hardware share one fit; another kind gets its own
    shared = ("peak_flops_per_s", "memory_bandwidth_bytes_per_s", "efficiency",
              "class_overhead_s", "fused_bytes_fraction", "parallel_launch_s",
              "parallel_min_segment_flops", "unfused_overhead_s")
    assert all(getattr(cpu0, f) == getattr(cpu1, f) for f in shared)
    assert cpu0.peak_flops_per_s != gpu.peak_flops_per_s
    assert report["devices"]["cpu:0"]["shared_with"] == ["cpu:0", "cpu:1"]
    assert report["devices"]["gpu:0"]["shared_with"] == ["gpu:0"]
    # the worker thread: from PARALLEL_MIN_FLOPS (the op records), and what a segment of
    # so many flops pays (fitted with the segments); the accelerator has none
    assert cpu0.parallel_min_segment_flops == pytest.approx(PARALLEL_MIN_FLOPS)
    assert cpu0.parallel_launch_s == pytest.approx(true_fit("cpu").parallel_launch_s, rel=0.15)
    assert gpu.parallel_min_segment_flops is None and gpu.parallel_launch_s == 0.0
    assert dict(cpu0.parallel_min_bytes) == {} == dict(gpu.parallel_min_bytes)
    rep0 = report["devices"]["cpu:0"]
    assert rep0["parallel_min_segment_flops"] == pytest.approx(PARALLEL_MIN_FLOPS)
    assert rep0["parallel_rule_agreement"] == 1.0
    # the summary says it once per kind of device, and that the accelerator has none
    from simplace.calibrate.cli import format_report

    text = format_report(model, report)
    assert text.count("worker-thread wake-up") == 2
    assert (f"worker-thread wake-up (cpu:0, cpu:1): segments of 1e+06 flops or more pay "
            f"{cpu0.parallel_launch_s * 1e6:.1f} us (the rule explains 100.0% of the 10 ops "
            "timed alone)") in text
    assert "worker-thread wake-up (gpu:0): none charged (no CPU op timed alone)" in text
    no_rule = dict(report, devices={"cpu:0": dict(rep0, parallel_min_segment_flops=None,
                                                  parallel_rule_agreement=0.6)})
    assert ("none charged (the best flops split explains only 60.0% of the 10 ops timed "
            "alone)") in format_report(model, no_rule)
    for d, dev in (("cpu:0", cpu0), ("gpu:0", gpu)):
        truth = true_fit(_kind(d))
        assert dev.unfused_overhead_s == pytest.approx(truth.unfused_overhead_s, rel=0.25), d
        rep = report["devices"][d]
        assert rep["held_out"]["median_rel_error"] < 0.02, d
        assert rep["segments_measured"] == 60
        # a quarter held out, drawn with the header's seed
        held = np.random.default_rng(0).random(60) < 0.25
        assert rep["held_out"]["n"] == held.sum() and rep["fitted"]["n"] == (~held).sum()
        # segments it never saw, on the model's own device: within a few %
        fresh = random_segments(np.random.default_rng(42), 100)
        par = np.array([_kind(d) == "cpu" and _holds_parallel(s) for s in fresh])
        base = segment_base_s(_kind(d))
        want = segment_times(truth, fresh, base, par)
        got = predict_segments(dev, fresh, base + par * dev.parallel_launch_s)
        err = np.abs(got / want - 1)
        assert np.median(err) < 0.02 and np.percentile(err, 90) < 0.05, d


def test_build_exclusive_groups_report_and_provenance(built):
    recs, model, report = built
    groups = {d.name: d.exclusive_group for d in model.devices}
    assert groups == {"cpu:0": "shared:cpu:0", "cpu:1": "shared:cpu:0", "gpu:0": "gpu:0"}
    assert report["exclusive"]["cpu:0+cpu:1"]["exclusive"] is True
    assert report["exclusive"]["cpu:0+cpu:1"]["overlap"] == pytest.approx(0.0, abs=1e-9)
    assert report["exclusive"]["cpu:0+gpu:0"]["exclusive"] is False
    assert report["wall_s"] == pytest.approx(sum(WALL_S.values()))
    prov = model.provenance
    assert prov.source == "measured" and prov.host == "testhost"
    assert prov.date == recs[0]["date"] and prov.jax_version == "0.0"
    assert prov.meta["device_kinds"] == {"cpu:0": "cpu", "cpu:1": "cpu", "gpu:0": "FakeGPU"}
    assert prov.meta["settings"] == recs[0]["settings"]
    fr = prov.meta["fit_report"]
    assert set(fr["devices"]) == {"cpu:0", "cpu:1", "gpu:0"}
    assert all("rel_residuals" not in r for r in fr["links"].values())  # in the records
    assert all("rel_residuals" in r for r in report["links"].values())
    # a valid model file, schema 2
    d = model.to_dict()
    assert d["schema_version"] == 2
    assert CostModel.from_dict(json.loads(json.dumps(d))) == model


def test_build_is_deterministic_and_takes_the_last_of_repeated_measurements(built):
    recs, model, report = built
    model2, report2 = build_cost_model(copy.deepcopy(recs))
    assert model2 == model
    assert json.dumps(model2.to_dict(), sort_keys=True) == json.dumps(model.to_dict(),
                                                                       sort_keys=True)
    assert build_cost_model(recs, name="other")[0].name == "other"
    # another seed holds out other segments
    reseeded = copy.deepcopy(recs)
    reseeded[0]["settings"]["seed"] = 5
    held = (np.random.default_rng(5).random(60) < 0.25).sum()
    assert build_cost_model(reseeded)[1]["devices"]["gpu:0"]["held_out"]["n"] == held
    # a resumed run may measure a runtime again: the last one counts
    again = copy.deepcopy(recs)
    rt = dict(again[_index(again, "runtime")])
    rt["block"] = robust_stats([40e-6] * 3).to_dict()
    again.append(rt)
    m3, _ = build_cost_model(again)
    assert _device(m3, "cpu:0").launch_s == pytest.approx(40e-6 - HOST_S["cpu:0"])


def test_build_without_host_steps_falls_back_to_tiny_calls_and_ready_puts():
    recs = [r for r in synthetic_records() if r["kind"] != "host"]
    model, report = build_cost_model(recs)
    assert "host" not in report
    for d in model.devices:
        assert d.dispatch_s == pytest.approx(HOST_S[d.name])
    off = ~np.eye(3, dtype=bool)
    assert model.put_s[off] == pytest.approx(np.full(6, PUT_READY_S))
    # one step is not enough to split either
    one = synthetic_records(host_steps=1)
    assert build_cost_model(one)[0].put_s[0, 1] == pytest.approx(PUT_READY_S)


def test_build_host_steps_without_a_kind_keep_its_tiny_call():
    # steps that never dispatch on the accelerator nor put to it: those columns are left
    # out of the split, and the accelerator keeps the tiny call's host time
    recs = synthetic_records()
    for r in recs:
        if r["kind"] == "host":
            r["segments"][2] = 0
            for line in r["puts"]:
                line[2] = 0
            r["puts"][2] = [0, 0, 0]
            t = sum(c * DISPATCH_S["cpu"] for c in r["segments"])
            t += (r["puts"][0][1] + r["puts"][1][0]) * PUT_S[("cpu", "cpu")]
            r["timing"] = robust_stats([t] * 3).to_dict()
    model, _ = build_cost_model(recs)
    assert _device(model, "gpu:0").dispatch_s == pytest.approx(HOST_S["gpu:0"])
    assert _device(model, "cpu:1").dispatch_s == pytest.approx(DISPATCH_S["cpu"], rel=1e-3)
    assert model.put_s[0, 1] == pytest.approx(PUT_S[("cpu", "cpu")], rel=1e-3)
    assert model.put_s[0, 2] == pytest.approx(PUT_READY_S)  # the ready put's host time


def test_build_refuses_a_link_that_does_not_grow_and_uses_the_median_of_the_others():
    recs = synthetic_records(flat_links={("cpu:1", "gpu:0")},
                             few_sizes_links={("gpu:0", "cpu:0")})
    model, report = build_cost_model(recs)
    bad = report["links"]["cpu:1->gpu:0"]
    assert bad["measured"] is True and bad["fitted"] is False
    assert "do not grow with size" in bad["error"]
    assert report["links"]["gpu:0->cpu:0"] == {"measured": False}
    assert report["links_missing"] == ["cpu:1->gpu:0", "gpu:0->cpu:0"]
    names = model.device_names
    fitted = [(i, j) for i in range(3) for j in range(3)
              if i != j and (names[i], names[j]) not in {("cpu:1", "gpu:0"), ("gpu:0", "cpu:0")}]
    assert len(fitted) == 4
    for i, j in ((1, 2), (2, 0)):
        assert model.latency_s[i, j] == pytest.approx(
            np.median([model.latency_s[a, b] for a, b in fitted]))
        assert model.bandwidth_bytes_per_s[i, j] == pytest.approx(
            np.median([model.bandwidth_bytes_per_s[a, b] for a, b in fitted]))
        assert model.bandwidth_bytes_per_s[i, j] <= LINK_BANDWIDTH_MAX_BYTES_PER_S
    # the others are fitted as before
    lat, bw = LINK[("cpu", "gpu")]
    assert model.latency_s[0, 2] == pytest.approx(lat, rel=0.1)
    assert model.bandwidth_bytes_per_s[0, 2] == pytest.approx(bw, rel=0.05)
    assert model.put_s[1, 2] == pytest.approx(PUT_S[("cpu", "gpu")], rel=1e-3)


def test_build_raises_only_when_no_link_fits():
    pairs = {(a, b) for a, _, _ in DEVICES for b, _, _ in DEVICES if a != b}
    with pytest.raises(CalibrationError,
                       match=r"No link could be fitted .*cpu:0->cpu:1: the transfer times do "
                             r"not grow with size"):
        build_cost_model(synthetic_records(flat_links=pairs))
    with pytest.raises(CalibrationError, match="No link could be fitted"):
        build_cost_model([r for r in synthetic_records() if r["kind"] != "link"])
    # one good link is enough
    model, report = build_cost_model(synthetic_records(flat_links=pairs - {("cpu:0", "gpu:0")}))
    assert len(report["links_missing"]) == 5
    assert np.all(model.latency_s[~np.eye(3, dtype=bool)] == model.latency_s[0, 2])


@pytest.mark.parametrize("drop, match", [
    (lambda r: r["kind"] == "header", "must start with a header"),
    (lambda r: r["kind"] == "runtime" and r["device"] == "cpu:1",
     r"No launch/dispatch timing for device 'cpu:1'.*--devices"),
    (lambda r: r["kind"] == "segment" and r["device"] == "gpu:0",
     r"No timed segments for device\(s\) gpu:0.*--budget-s"),
    (lambda r: r["kind"] == "segment" and r["device"].startswith("cpu"),
     r"No timed segments for device\(s\) cpu:0, cpu:1"),
])
def test_build_cost_model_errors(drop, match):
    with pytest.raises(CalibrationError, match=match):
        build_cost_model([r for r in synthetic_records(segments_per_kind=12) if not drop(r)])


def test_build_cost_model_header_errors():
    recs = synthetic_records(segments_per_kind=12)
    bad = copy.deepcopy(recs)
    bad[_index(bad, "segment")]["device"] = "tpu:7"
    with pytest.raises(CalibrationError, match=r"device 'tpu:7', which is not in the header"):
        build_cost_model(bad)
    empty = copy.deepcopy(recs)
    empty[0]["devices"] = []
    with pytest.raises(CalibrationError, match="lists no devices"):
        build_cost_model(empty)
    with pytest.raises(CalibrationError, match="header"):
        build_cost_model([])
    # segments too close to an empty call: the fit says so
    slow_base = copy.deepcopy(recs)
    for r in slow_base:
        if r["kind"] == "runtime":
            r["block"] = robust_stats([1.0] * 3).to_dict()
    with pytest.raises(CalibrationError, match="hardly slower than an empty call"):
        build_cost_model(slow_base)


def test_refit_reproduces_the_model_from_records(tmp_path):
    recs = synthetic_records(name="syn")
    write_records(tmp_path / "rec" / "syn" / "records.jsonl", recs)
    m1, r1 = refit("syn", records_dir=tmp_path / "rec", cost_model_dir=tmp_path / "cm")
    cm = tmp_path / "cm" / "syn.json"
    text1 = cm.read_text()
    assert json.loads(text1)["schema_version"] == 2
    m2, r2 = refit("syn", records_dir=tmp_path / "rec", cost_model_dir=tmp_path / "cm")
    assert m1 == m2 and cm.read_text() == text1
    assert CostModel.load(cm) == m1 == build_cost_model(recs, name="syn")[0]
    assert r1["devices"]["cpu:0"]["held_out"] == r2["devices"]["cpu:0"]["held_out"]
    with pytest.raises(CalibrationError, match="does not exist"):
        refit("other", records_dir=tmp_path / "rec", cost_model_dir=tmp_path / "cm")


def chain_records(pairs, *, bound=True, hops=15, sizes=(256, 2 ** 16, 2 ** 20)):
    """``link_chain`` records: for each ``(a, b): latency`` of ``pairs``, chains whose
    copies cost ``latency`` plus bytes over the pair's mean bandwidth per hop (the
    made-up machine's), device-bound unless ``bound`` is False."""
    rng = np.random.default_rng(11)
    recs = []
    for (a, b), latency in pairs.items():
        bw_ab, bw_ba = LINK[(_kind(a), _kind(b))][1], LINK[(_kind(b), _kind(a))][1]
        for n in sizes:
            alone = (hops + 1) * 100e-6
            chain = alone + hops * (latency + 0.5 * (n / bw_ab + n / bw_ba))
            recs.append({"kind": "link_chain", "a": a, "b": b, "nbytes": n, "hops": hops,
                         "loop": {"a": 8, "b": 8}, "alone_a": _timing(rng, alone),
                         "alone_b": _timing(rng, alone), "chain": _timing(rng, chain),
                         "chain_host": _timing(rng, (0.3 if bound else 0.9) * chain)})
    return recs


def test_build_links_take_their_latency_from_copies_in_context():
    """Copies timed one by one include waking the receiving side; chained between two
    busy devices they cost less (on the VM: 3 us against 60 us). Each pair's chains
    scale both directions' latency by one factor (the asymmetry of copies alone is
    kept), pairs of the same kinds of device share the median factor, a pair without
    chains takes it, and bandwidths stay those of the copies alone."""
    from simplace.calibrate.cli import format_report

    recs = synthetic_records()
    base, _ = build_cost_model(copy.deepcopy(recs))
    recs += chain_records({("cpu:0", "cpu:1"): 2e-6, ("cpu:0", "gpu:0"): 4e-6})
    model, report = build_cost_model(recs)
    names = model.device_names
    i0, i1, g = names.index("cpu:0"), names.index("cpu:1"), names.index("gpu:0")
    assert model.latency_s[i0, i1] == pytest.approx(2e-6, rel=0.05)
    assert model.latency_s[i1, i0] == pytest.approx(2e-6, rel=0.05)
    f = 4e-6 / (0.5 * (base.latency_s[i0, g] + base.latency_s[g, i0]))
    for i, j in ((i0, g), (g, i0), (i1, g), (g, i1)):  # cpu:1<->gpu:0 shares the factor
        assert model.latency_s[i, j] == pytest.approx(f * base.latency_s[i, j], rel=1e-3)
    assert np.array_equal(model.bandwidth_bytes_per_s, base.bandwidth_bytes_per_s)
    lc = report["link_context"]
    assert set(lc["pairs"]) == {"cpu:0<->cpu:1", "cpu:0<->gpu:0"}
    assert lc["factor"]["cpu:cpu+gpu:FakeGPU"] == pytest.approx(f, rel=1e-3)
    for r in lc["pairs"].values():  # the model now predicts every chained size
        assert r["used"] and max(map(abs, r["model_rel_error"].values())) < 0.05
    assert "cpu:1->gpu:0" in lc["scaled"]
    assert ("copies in context (chains of segments alternating between two devices, 2 of 2 "
            "pairs device-bound)") in format_report(model, report)

    # a host-bound chain says nothing about the copies: latency as timed alone
    recs = synthetic_records() + chain_records({("cpu:0", "cpu:1"): 2e-6}, bound=False)
    model, report = build_cost_model(recs)
    assert np.array_equal(model.latency_s, base.latency_s)
    r = report["link_context"]["pairs"]["cpu:0<->cpu:1"]
    assert not r["used"] and r["why"].startswith("host-bound")


def test_context_latency_pools_the_pairs_of_one_kind():
    """One pair's difference of two chain totals is noisy: every pair of the same kinds
    takes the median factor, and a median below 0 (noise around a free copy) is 0."""
    from simplace.calibrate.build import context_latency

    names = [f"cpu:{k}" for k in range(4)]
    lat, bw = np.full((4, 4), 50e-6), np.full((4, 4), 1e10)
    np.fill_diagonal(lat, 0.0)

    def t(s):
        return robust_stats([s] * 3).to_dict()

    def chains(per_hop):
        return {(a, b, 256): {"nbytes": 256, "hops": 10, "alone_a": t(1e-3),
                              "alone_b": t(1e-3), "chain": t(1e-3 + 10 * h),
                              "chain_host": t(2e-4)}
                for (a, b), h in zip(itertools.combinations(names, 2), per_hop, strict=True)}

    per_hop = [5e-6, 2e-6, -10e-6, 4e-6, 30e-6, 3e-6]  # one factor each, ~-0.2 to 0.6
    report = {}
    new = context_latency(chains(per_hop), names, ["cpu"] * 4, lat, bw, report)
    want = float(np.median([(h - 256 / 1e10) / 50e-6 for h in per_hop]))
    assert report["link_context"]["factor"] == {"cpu+cpu": pytest.approx(want)}
    off = ~np.eye(4, dtype=bool)
    assert np.allclose(new[off], want * 50e-6) and np.all(np.diag(new) == 0)
    assert len(report["link_context"]["scaled"]) == 12
    new = context_latency(chains([-3e-6] * 6), names, ["cpu"] * 4, lat, bw, {})
    assert np.all(new == 0.0)
    # chained copies 12x slower than copies from idle: refused, with a warning
    report = {}
    new = context_latency(chains([600e-6] * 6), names, ["cpu"] * 4, lat, bw, report)
    assert np.array_equal(new, lat) and report["link_context"]["scaled"] == []
    assert "12.0x the latency of copies timed alone" in report["warnings"][0]
    assert "cpu+cpu" in report["link_context"]["refused"]


def test_a_link_chain_record_round_trips_and_is_checked(tmp_path):
    recs = synthetic_records(segments_per_kind=8, host_steps=2)
    recs += chain_records({("cpu:0", "cpu:1"): 2e-6})
    path = tmp_path / "records.jsonl"
    write_records(path, recs)
    assert read_records(path) == recs
    with pytest.raises(CalibrationError, match="'hops' of a link_chain record must be 1"):
        check_record(dict(recs[-1], hops=0), "line 9")
    with pytest.raises(CalibrationError, match="line 9: field 'chain'"):
        check_record(dict(recs[-1], chain={"samples_s": []}), "line 9")
    bad = {k: v for k, v in recs[-1].items() if k != "alone_b"}
    with pytest.raises(CalibrationError, match=r"'alone_b' is missing \(a link_chain"):
        check_record(bad, "line 9")


@pytest.mark.parametrize("same_loop", [True, False])
def test_time_link_chain_on_two_cpu_devices(same_loop):
    """The real measurement, briefly: the chain device-bound, every size timed; devices
    of one kind share the segment length (``same_loop``), others (a CPU and an
    accelerator) get their own."""
    import jax

    from simplace.calibrate.links import CHAIN_MIN_SEGMENT_S, time_link_chain

    a, b = jax.devices("cpu")[:2]
    out = time_link_chain(a, b, [256, 4096], hops=3, rounds=1, repeats=2, budget_s=1.0,
                          same_loop=same_loop)
    assert min(out["loop"].values()) >= 1 and out["hop_host_s"] > 0
    if same_loop:
        assert out["loop"]["a"] == out["loop"]["b"]
    # each device's segments were lengthened until they set the pace
    alone = out["sizes"][256]
    assert alone["alone_a"].median_s >= 0.5 * 4 * CHAIN_MIN_SEGMENT_S
    assert sorted(out["sizes"]) == [256, 4096]
    for t in out["sizes"].values():
        assert set(t) == {"alone_a", "alone_b", "chain", "chain_host"}
        assert all(x.repeats == 2 and x.median_s > 0 for x in t.values())
        assert t["chain_host"].median_s < t["chain"].median_s


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


def test_a_per_op_cost_at_its_ceiling_asks_for_an_idle_machine():
    from simplace.calibrate.build import rate_problems

    fit = dataclasses.replace(true_fit("cpu"), unpinned=("conv per-op cost",))
    (w,) = rate_problems(fit, ("cpu", "cpu"), 2)
    assert "conv per-op cost to its 1 ms ceiling" in w and "idle machine" in w

"""CostModel: op times (roofline, measured, free, corrections), transfers, subsets, files."""

import copy
import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from simplace.cost_model import (
    DEFAULT_EFFICIENCY,
    OP_CLASSES,
    CostModel,
    Device,
    Provenance,
    available_cost_models,
    op_class,
    op_classes,
)
from simplace.errors import CostModelError
from simplace.graph import OpGraph
from simplace.scales import Scales

REPO = Path(__file__).resolve().parents[1]
# Measured models (written by `simplace calibrate`) have no generator to match.
# Datasheet models ship in the package; the repo's cost_models/ keeps measured ones.
MACHINE_FILES = sorted([*(REPO / "cost_models").glob("*.json"),
                        *(REPO / "simplace" / "machines").glob("*.json")])
DATASHEETS = sorted(p for p in MACHINE_FILES
                    if json.loads(p.read_text())["provenance"]["source"] == "datasheet")
MEASURED = sorted(p for p in MACHINE_FILES if p not in DATASHEETS)

CPU_EFF = {"matmul": 0.5, "conv": 0.4, "elementwise": 0.25, "reduction": 0.2,
           "data_movement": 0.5, "control": 0.1}


def two_devices(**gpu_kw) -> CostModel:
    cpu = Device(name="cpu:0", kind="cpu", memory_bytes=64e9, peak_flops_per_s=1e12,
                 memory_bandwidth_bytes_per_s=1e11, overhead_s=1e-6, efficiency=CPU_EFF)
    gpu = Device(name="gpu:0", kind="gpu", memory_bytes=16e9, peak_flops_per_s=1e13,
                 memory_bandwidth_bytes_per_s=1e12, overhead_s=5e-6, **gpu_kw)
    return CostModel.from_devices("toy", [cpu, gpu], latency_s=[[0, 1e-5], [2e-5, 0]],
                                  bandwidth_bytes_per_s=[[0, 1e10], [5e9, 0]])


# op, flops, bytes_accessed
TINY = [
    ("dot_general", 2e9, 1e6),            # compute-bound everywhere
    ("add", 1e3, 1.2e7),                  # memory-bound
    ("reshape", 0.0, 0.0),                # a view: free
    ("convert_element_type", 0.0, 8e3),   # free class but copies bytes: data_movement rule
    ("reduce_sum", 4e6, 4e6),
    ("transpose", 0.0, 2e6),
    ("broadcast_in_dim", 0.0, 0.0),
    ("conv_general_dilated", 1e8, 1e6),
]


def tiny_graph() -> OpGraph:
    m = len(TINY)
    return OpGraph(
        op=[t[0] for t in TINY], name_path=[f"net/op{i}" for i in range(m)],
        flops=[t[1] for t in TINY], bytes_accessed=[t[2] for t in TINY],
        out_bytes=np.full(m, 4.0), signature=[f"{t[0]}:sig{i}" for i, t in enumerate(TINY)],
        src=np.arange(m - 1), dst=np.arange(1, m), edge_bytes=np.full(m - 1, 4.0))


def roofline(overhead, peak, bw, eff, flops, nbytes):
    return overhead + max(flops / peak, nbytes / bw) / eff


# --------------------------------------------------------------------------- op classes
@pytest.mark.parametrize("primitive, cls", [
    ("dot_general", "matmul"), ("conv_general_dilated", "conv"), ("add", "elementwise"),
    ("exp", "elementwise"), ("reduce_sum", "reduction"), ("reduce_max", "reduction"),
    ("argmax", "reduction"), ("cumsum", "reduction"), ("reduce_precision", "elementwise"),
    ("reduce_window_max", "reduction"), ("transpose", "data_movement"),
    ("concatenate", "data_movement"), ("gather", "data_movement"),
    ("scatter-add", "data_movement"), ("pad", "data_movement"), ("slice", "data_movement"),
    ("dynamic_slice", "data_movement"), ("dynamic_update_slice", "data_movement"),
    ("scan", "control"), ("while", "control"), ("cond", "control"), ("reshape", "free"),
    ("squeeze", "free"), ("expand_dims", "free"), ("broadcast_in_dim", "free"),
    ("convert_element_type", "free"), ("bitcast_convert_type", "free"), ("iota", "free"),
    ("copy", "free"), ("some_new_primitive", "elementwise"),
])
def test_op_class(primitive, cls):
    assert op_class(primitive) == cls
    assert cls in OP_CLASSES


def test_tracer_view_primitives_are_free():
    costs = pytest.importorskip("simplace._primitive_costs")
    views = getattr(costs, "VIEW_PRIMITIVES", frozenset())
    assert [p for p in sorted(views) if op_class(p) != "free"] == []


def test_op_classes_of_graph():
    got = op_classes(tiny_graph())
    assert [OP_CLASSES[k] for k in got] == [op_class(t[0]) for t in TINY]


# --------------------------------------------------------------------------- op times
def test_op_times_match_hand_computed_roofline():
    cm = two_devices()
    t = cm.op_times(tiny_graph())
    assert t.shape == (len(TINY), 2) and t.dtype == np.float64
    # dot_general: compute-bound on both
    assert t[0, 0] == pytest.approx(1e-6 + (2e9 / 1e12) / 0.5)
    assert t[0, 1] == pytest.approx(5e-6 + (2e9 / 1e13) / DEFAULT_EFFICIENCY["matmul"])
    # add: memory-bound
    assert t[1, 0] == pytest.approx(1e-6 + (1.2e7 / 1e11) / 0.25)
    assert t[1, 1] == pytest.approx(5e-6 + (1.2e7 / 1e12) / DEFAULT_EFFICIENCY["elementwise"])
    # reduce_sum, transpose, conv
    assert t[4, 0] == pytest.approx(roofline(1e-6, 1e12, 1e11, 0.2, 4e6, 4e6))
    assert t[5, 1] == pytest.approx(roofline(5e-6, 1e13, 1e12, 0.5, 0, 2e6))
    assert t[7, 0] == pytest.approx(roofline(1e-6, 1e12, 1e11, 0.4, 1e8, 1e6))
    for i, (p, f, b) in enumerate(TINY):
        for k, dev in enumerate(cm.devices):
            if f == 0 and b == 0:
                continue
            eff = dev.efficiency[op_class(p)]
            assert t[i, k] == pytest.approx(roofline(
                dev.overhead_s, dev.peak_flops_per_s, dev.memory_bandwidth_bytes_per_s, eff,
                f, b)), (p, dev.name)


def test_free_ops_cost_zero_and_copying_free_ops_cost_like_data_movement():
    cm = two_devices()
    t = cm.op_times(tiny_graph())
    assert np.all(t[2] == 0) and np.all(t[6] == 0)  # reshape, broadcast_in_dim
    # convert_element_type with bytes: charged like a data_movement op
    assert t[3, 0] == pytest.approx(1e-6 + (8e3 / 1e11) / CPU_EFF["data_movement"])
    assert cm.devices[0].efficiency["free"] == CPU_EFF["data_movement"]


def test_measured_table_overrides_roofline():
    cm = two_devices(op_times_s={"add:sig1": 3.25e-4, "reshape:sig2": 1e-7,
                                 "unrelated:sig": 9.0})
    base = two_devices().op_times(tiny_graph())
    t = cm.op_times(tiny_graph())
    assert t[1, 1] == 3.25e-4 and t[2, 1] == 1e-7
    assert t[1, 0] == base[1, 0]  # the CPU has no table
    rest = [0, 3, 4, 5, 6, 7]
    np.testing.assert_array_equal(t[rest], base[rest])


def test_corrections_scale_op_times_of_working_ops_only():
    cm = two_devices(op_times_s={"add:sig1": 3.25e-4})
    base = cm.op_times(tiny_graph())
    corr = Scales(compute_scale=[2.0, 0.5], launch_scale=[3.0, 0.5],
                  link_scale=np.ones((2, 2)), history=({"fitted_on": "test"},))
    t = cm.with_corrections(corr).op_times(tiny_graph())
    works = np.array([not (f == 0 and b == 0) for _, f, b in TINY])
    # Op times are only scaled: launch_scale goes to segment launches (below).
    np.testing.assert_allclose(t[works, 0], 2.0 * base[works, 0])
    np.testing.assert_allclose(t[works, 1], 0.5 * base[works, 1])
    assert t[1, 1] == 0.5 * 3.25e-4  # a measured time is scaled too
    assert np.all(t[~works] == 0)
    assert corr.history[0]["fitted_on"] == "test"
    assert not corr.is_identity and Scales.identity(3).is_identity


def test_corrections_scale_segment_launches():
    # (what each kind of scale covers in a priced problem: tests/test_scales.py)
    cm = two_devices(launch_s=5e-6, dispatch_s=7e-6)  # the GPU; the CPU has none
    np.testing.assert_array_equal(cm.launch_s, [0.0, 5e-6])
    np.testing.assert_array_equal(cm.dispatch_s, [0.0, 7e-6])
    corr = Scales(compute_scale=[1.0, 1.0], launch_scale=[2.0, 0.6],
                  link_scale=np.ones((2, 2)))
    fixed = cm.with_corrections(corr)
    np.testing.assert_allclose(fixed.launch_s, [0.0, 3e-6])
    np.testing.assert_array_equal(fixed.dispatch_s, cm.dispatch_s)  # host time: not scaled
    np.testing.assert_array_equal(fixed.op_times(tiny_graph()), cm.op_times(tiny_graph()))
    np.testing.assert_allclose(fixed.price(tiny_graph()).launch_s, [0.0, 3e-6])


def test_fused_bytes_fraction_charges_part_of_the_bytes_of_fused_classes():
    frac = two_devices(fused_bytes_fraction=0.25).op_times(tiny_graph())
    full = two_devices().op_times(tiny_graph())
    # add (elementwise, memory-bound): 5e-6 + 0.25 * 1.2e7 / 1e12 / efficiency
    assert frac[1, 1] == pytest.approx(
        5e-6 + (0.25 * 1.2e7 / 1e12) / DEFAULT_EFFICIENCY["elementwise"])
    # convert_element_type (free class, copies bytes): fused too, at data_movement's rate
    assert frac[3, 1] == pytest.approx(
        5e-6 + (0.25 * 8e3 / 1e12) / DEFAULT_EFFICIENCY["data_movement"])
    # matmul, reduction, data_movement, conv: all their bytes; views stay free
    for i in (0, 2, 4, 5, 6, 7):
        assert frac[i, 1] == full[i, 1], TINY[i][0]
    np.testing.assert_array_equal(frac[:, 0], full[:, 0])  # the CPU's fraction is 1
    with pytest.raises(CostModelError, match="fused_bytes_fraction"):
        two_devices(fused_bytes_fraction=1.5)


def test_pool_rule_per_segment_flops_per_op_bytes_or_both(tmp_path):
    # TINY's flops: dot 2e9, add 1e3, reshape 0, convert 0, reduce_sum 4e6, transpose 0,
    # broadcast 0, conv 1e8. The segment rule counts each op's flops toward the minimum;
    # the per-op rule of older models (a primitive at or above its bytes) counts the
    # whole minimum by itself; with neither, or no launch, no segment pays.
    g = tiny_graph()
    flops = np.array([t[1] for t in TINY])
    seg = two_devices(parallel_launch_s=25e-6, parallel_min_segment_flops=1e5)
    work, min_work, launch = seg.pool_rule(g)
    np.testing.assert_array_equal(work[:, 1], flops)
    np.testing.assert_array_equal(work[:, 0], 0.0)  # the CPU has no rule here
    assert min_work.tolist() == [np.inf, 1e5] and launch.tolist() == [0.0, 25e-6]
    old = two_devices(parallel_launch_s=25e-6, parallel_min_bytes={"add": 1e7})
    work, min_work, _ = old.pool_rule(g)
    np.testing.assert_array_equal(work[:, 1], [0, 1, 0, 0, 0, 0, 0, 0])  # add: 1.2e7 bytes
    assert min_work[1] == 1.0
    both = two_devices(parallel_launch_s=25e-6, parallel_min_bytes={"add": 1e7},
                       parallel_min_segment_flops=1e5)
    work, min_work, _ = both.pool_rule(g)
    np.testing.assert_array_equal(work[:, 1], flops + np.array([0, 1e5, 0, 0, 0, 0, 0, 0]))
    assert min_work[1] == 1e5
    none = two_devices(parallel_min_segment_flops=1e5)  # no launch to pay
    assert none.pool_rule(g)[1].tolist() == [np.inf, np.inf]
    # the rule survives a save and load; older files without it load with none
    seg.save(tmp_path / "seg.json")
    assert CostModel.load(tmp_path / "seg.json").devices[1].parallel_min_segment_flops == 1e5
    assert two_devices().devices[1].parallel_min_segment_flops is None
    with pytest.raises(CostModelError, match="parallel_min_segment_flops"):
        two_devices(parallel_min_segment_flops=0.0)


def test_put_s_matrix_defaults_to_zero_and_has_a_zero_diagonal():
    assert np.all(two_devices().put_s == 0) and two_devices().put_s.shape == (2, 2)
    cpu, gpu = two_devices().devices
    cm = CostModel.from_devices("p", [cpu, gpu], 1e-5, 1e10, put_s=[[3.0, 2e-5], [4e-5, 3.0]])
    np.testing.assert_array_equal(cm.put_s, [[0.0, 2e-5], [4e-5, 0.0]])
    np.testing.assert_array_equal(
        CostModel.from_devices("q", [cpu, gpu], 1e-5, 1e10, put_s=1e-5).put_s,
        [[0.0, 1e-5], [1e-5, 0.0]])
    # Corrections scale the link's copy, not the host's call.
    scaled = cm.with_corrections(Scales([1, 1], [1, 1], [[1, 3.0], [1, 1]]))
    np.testing.assert_array_equal(scaled.put_s, cm.put_s)
    np.testing.assert_array_equal(cm.subset([1, 0]).put_s, [[0.0, 4e-5], [2e-5, 0.0]])
    with pytest.raises(CostModelError, match="put_s"):
        CostModel.from_devices("r", [cpu, gpu], 1e-5, 1e10, put_s=-1.0)


def test_op_times_of_empty_graph():
    g = OpGraph(op=[], name_path=[], flops=[], bytes_accessed=[], out_bytes=[],
                signature=[], src=[], dst=[], edge_bytes=[])
    assert two_devices().op_times(g).shape == (0, 2)


# --------------------------------------------------------------------------- transfers
def test_transfer_time():
    cm = two_devices()
    assert cm.transfer_time_s(1e6, 0, 1) == pytest.approx(1e-5 + 1e6 / 1e10)
    assert cm.transfer_time_s(1e6, 1, 0) == pytest.approx(2e-5 + 1e6 / 5e9)
    assert cm.transfer_time_s(1e6, 1, 1) == 0.0
    assert cm.transfer_time_s(0, 0, 1) == pytest.approx(1e-5)
    scaled = cm.with_corrections(Scales([1, 1], [1, 1], [[1, 3.0], [1, 1]]))
    assert scaled.transfer_time_s(1e6, 0, 1) == pytest.approx(3 * (1e-5 + 1e6 / 1e10))
    assert scaled.transfer_time_s(1e6, 1, 0) == cm.transfer_time_s(1e6, 1, 0)


def test_transfer_times_vectorised_match_scalar():
    cm = CostModel.synthetic(4, seed=3)
    cm = cm.with_corrections(Scales(np.ones(4), np.ones(4),
                                         np.linspace(0.5, 2.0, 16).reshape(4, 4)))
    sizes = np.array([[0.0, 1e3], [1e6, 3e8]])
    tt = cm.transfer_times_s(sizes)
    assert tt.shape == (2, 2, 4, 4)
    for idx in np.ndindex(sizes.shape):
        for i in range(4):
            for j in range(4):
                assert tt[idx][i, j] == pytest.approx(cm.transfer_time_s(sizes[idx], i, j))
    assert np.all(np.diagonal(tt, axis1=-2, axis2=-1) == 0)
    np.testing.assert_allclose(cm.corrected_latency_s + 1e6 / cm.corrected_bandwidth_bytes_per_s,
                               cm.transfer_times_s(1e6))


# --------------------------------------------------------------------------- subset
def test_subset_keeps_devices_links_and_op_time_columns():
    cm = CostModel.synthetic(5, seed=7)
    corr = Scales(np.arange(1, 6, dtype=float), np.arange(5, 10, dtype=float),
                       np.arange(25, dtype=float).reshape(5, 5) + 1)
    cm = cm.with_corrections(corr)
    sub = cm.subset([3, 0, 2])
    assert sub.device_names == [cm.device_names[i] for i in (3, 0, 2)]
    assert sub.name != cm.name and sub.name.startswith(cm.name)
    for a, i in enumerate((3, 0, 2)):
        for b, j in enumerate((3, 0, 2)):
            assert sub.latency_s[a, b] == cm.latency_s[i, j]
            assert sub.bandwidth_bytes_per_s[a, b] == cm.bandwidth_bytes_per_s[i, j]
            assert sub.transfer_time_s(1e6, a, b) == cm.transfer_time_s(1e6, i, j)
    np.testing.assert_array_equal(sub.op_times(tiny_graph()),
                                  cm.op_times(tiny_graph())[:, [3, 0, 2]])
    np.testing.assert_array_equal(sub.memory_bytes, cm.memory_bytes[[3, 0, 2]])
    for bad in ([], [0, 0], [5], [-1]):
        with pytest.raises(CostModelError):
            cm.subset(bad)


def test_exclusive_group_ids_dense_first_seen():
    devs = [Device(name=n, kind="cpu", memory_bytes=1, peak_flops_per_s=1,
                   memory_bandwidth_bytes_per_s=1, exclusive_group=g)
            for n, g in (("a", "host"), ("b", ""), ("c", "host"), ("d", "zz"))]
    cm = CostModel.from_devices("g", devs, 1e-6, 1e9)
    assert cm.devices[1].exclusive_group == "b"  # defaults to the device's own name
    assert cm.exclusive_group_ids.tolist() == [0, 1, 0, 2]
    assert cm.exclusive_group_ids.dtype == np.int32


# --------------------------------------------------------------------------- synthetic
def test_synthetic_is_deterministic_per_seed():
    assert CostModel.synthetic(4, seed=1) == CostModel.synthetic(4, seed=1)
    assert CostModel.synthetic(4, seed=1) != CostModel.synthetic(4, seed=2)
    one = CostModel.synthetic(1)
    assert one.num_devices == 1 and one.devices[0].kind == "cpu"
    ex = CostModel.synthetic(4, seed=0, exclusive_pair=True)
    assert ex.exclusive_group_ids.tolist() == [0, 0, 1, 2]
    assert len({d.peak_flops_per_s for d in CostModel.synthetic(6).devices}) == 6
    with pytest.raises(CostModelError):
        CostModel.synthetic(0)


# --------------------------------------------------------------------------- files
def rich_model() -> CostModel:
    cm = CostModel.synthetic(3, seed=5, exclusive_pair=True)
    devs = list(cm.devices)
    devs[2] = dataclasses.replace(devs[2], op_times_s={"dot_general:f32[8,8]": 1.5e-5},
                                  fused_bytes_fraction=0.3)
    corr = Scales([1.1, 0.9, 1.0], [1.2, 1.0, 0.8], np.full((3, 3), 1.2), host_scale=1.3,
                  argument_scale=0.7, history=({"date": "2026-01-01", "runs": 3},))
    return CostModel.from_devices(
        "rich", devs, cm.latency_s, cm.bandwidth_bytes_per_s, put_s=cm.put_s,
        corrections=corr,
        provenance=Provenance(source="measured", host="box", date="2026-01-02",
                              jax_version="0.10.2", jaxlib_version="0.10.2",
                              notes=("a note",), meta={"quick": True}))


def test_save_load_round_trip(tmp_path):
    cm = rich_model()
    path = tmp_path / "rich.json"
    cm.save(path)
    back = CostModel.load(path)
    assert back == cm
    assert back.to_dict() == cm.to_dict()
    assert back.devices[2].op_times_s == {"dot_general:f32[8,8]": 1.5e-5}
    np.testing.assert_array_equal(back.op_times(tiny_graph()), cm.op_times(tiny_graph()))
    assert back.provenance.meta == {"quick": True}
    # Schema 2: segment launch and dispatch per device, device_put host time per link.
    assert back.devices[2].fused_bytes_fraction == 0.3
    for f in ("launch_s", "dispatch_s"):
        np.testing.assert_array_equal(getattr(back, f), getattr(cm, f))
        assert np.all(getattr(cm, f) > 0)
    np.testing.assert_array_equal(back.put_s, cm.put_s)
    assert np.all(cm.put_s[~np.eye(3, dtype=bool)] > 0)
    assert [p.name for p in tmp_path.iterdir()] == ["rich.json"]  # no temporary left
    text = path.read_text()
    assert "Infinity" not in text and "NaN" not in text
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
    d = json.loads(text)
    assert d["schema"] == "simplace.cost_model" and d["schema_version"] == 2
    assert d["links"]["put_s"] == cm.put_s.tolist()
    assert {"launch_s", "dispatch_s", "fused_bytes_fraction"} <= set(d["devices"][0])
    assert d["links"]["bandwidth_bytes_per_s"][0][0] == "inf"


def test_null_diagonal_bandwidth_is_accepted():
    d = rich_model().to_dict()
    for i in range(3):
        d["links"]["bandwidth_bytes_per_s"][i][i] = None
    assert CostModel.from_dict(d) == rich_model()


def test_load_by_name_and_by_path(tmp_path, monkeypatch):
    by_name = CostModel.load("haswell_k40x4")
    by_path = CostModel.load(REPO / "simplace" / "machines" / "haswell_k40x4.json")
    assert by_name == by_path and by_name.num_devices == 5
    assert CostModel.load("haswell_k40x4.json") == by_name
    assert "haswell_k40x4" in available_cost_models()

    monkeypatch.setenv("SIMPLACE_COST_MODELS", str(tmp_path))
    rich_model().save(tmp_path / "my_machine.json")
    assert CostModel.load("my_machine") == rich_model()
    assert "my_machine" in available_cost_models()


def test_unknown_name_lists_available_models():
    with pytest.raises(CostModelError) as err:
        CostModel.load("no_such_machine")
    msg = str(err.value)
    assert "no_such_machine" in msg and "haswell_k40x4" in msg and "cpu_h100_pcie" in msg


def test_not_json_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{ not json")
    with pytest.raises(CostModelError, match="not valid JSON") as err:
        CostModel.load(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("path", DATASHEETS, ids=[p.stem for p in DATASHEETS])
def test_committed_datasheets_load_and_validate(path):
    cm = CostModel.load(path)
    assert cm.name == path.stem
    assert cm.provenance.source == "datasheet"
    assert cm.provenance.notes and all(n.strip() for n in cm.provenance.notes)
    assert cm.corrections.is_identity
    kinds = [d.kind for d in cm.devices]
    assert kinds[0] == "cpu" and "gpu" in kinds
    gpus = [d for d in cm.devices if d.kind == "gpu"]
    # sanity of units: every GPU here streams at least 50 GB/s (an iGPU's DDR5)
    assert all(g.memory_bandwidth_bytes_per_s >= 50e9 for g in gpus)
    assert np.all(cm.op_times(tiny_graph()) >= 0)
    # Segment costs: every device has a launch and a dispatch, every link a put.
    assert np.all(cm.launch_s > 0) and np.all(cm.dispatch_s > 0)
    assert np.all(cm.put_s[~np.eye(cm.num_devices, dtype=bool)] > 0)


@pytest.mark.parametrize("path", MEASURED, ids=[p.stem for p in MEASURED])
def test_committed_measured_models_load_and_say_where_they_come_from(path):
    # the raw records it was fitted from are committed beside it
    assert (REPO / "calibration" / path.stem / "records.jsonl").is_file()
    if json.loads(path.read_text())["schema_version"] == 1:
        # Measured before segment semantics: refused with how to re-measure, never
        # reinterpreted (test_schema_1_files_are_refused covers the message).
        with pytest.raises(CostModelError, match="simplace calibrate"):
            CostModel.load(path)
        return
    cm = CostModel.load(path)
    assert cm.name == path.stem
    assert cm.provenance.source == "measured"
    assert cm.provenance.host and cm.provenance.date and cm.provenance.jax_version
    times = cm.op_times(tiny_graph())
    assert np.all(np.isfinite(times)) and np.all(times >= 0) and times.max() > 0
    assert np.all(cm.launch_s >= 0) and np.all(cm.dispatch_s > 0)


def test_schema_1_files_are_refused_with_how_to_remeasure():
    d = rich_model().to_dict()
    d["schema_version"] = 1
    with pytest.raises(CostModelError) as err:
        CostModel.from_dict(d, source="old.json")
    msg = str(err.value)
    assert msg.startswith("old.json: schema_version 1 is not supported")
    assert "simplace calibrate" in msg and "make_datasheets.py" in msg


def test_expected_datasheets_exist():
    names = {p.stem for p in DATASHEETS}
    assert {"haswell_k40x2", "haswell_k40x4", "haswell_k40x8", "placeto_k80x2",
            "hsdag_cpu_gpu", "cpu_h100_pcie", "cpu_h100x4_nvlink"} <= names


def test_committed_datasheets_match_their_generator():
    spec = importlib.util.spec_from_file_location(
        "make_datasheets", REPO / "cost_models" / "make_datasheets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    built = mod.build_all()
    assert set(built) == {p.stem for p in DATASHEETS}
    for name, model in built.items():
        assert CostModel.load(name) == model, f"{name}.json is stale: run make_datasheets.py"
    k40 = built["haswell_k40x4"].devices[1]
    assert k40.peak_flops_per_s == pytest.approx(4.29e12, rel=1e-3)
    assert k40.memory_bandwidth_bytes_per_s == 288e9
    h100 = built["cpu_h100_pcie"].devices[1]
    assert h100.peak_flops_per_s == pytest.approx(51.2e12, rel=1e-3)
    assert h100.memory_bandwidth_bytes_per_s == 2.0e12


# --------------------------------------------------------------------------- bad input
def _set(path, value):
    def corrupt(d):
        *head, last = path
        for k in head:
            d = d[k]
        d[last] = value
    return corrupt


def _delete(path):
    def corrupt(d):
        *head, last = path
        for k in head:
            d = d[k]
        del d[last]
    return corrupt


def _drop_row(d):
    d["links"]["latency_s"].pop()


def _dup_name(d):
    d["devices"][2]["name"] = d["devices"][0]["name"]


CORRUPTIONS = [
    (_set(["devices", 2, "memory_bytes"], -1), "devices[2].memory_bytes must be > 0, got -1"),
    (_set(["devices", 1, "peak_flops_per_s"], 0), "devices[1].peak_flops_per_s must be > 0"),
    (_set(["devices", 0, "memory_bandwidth_bytes_per_s"], "fast"),
     "devices[0].memory_bandwidth_bytes_per_s must be a number"),
    (_set(["devices", 0, "memory_bytes"], True), "devices[0].memory_bytes must be a number"),
    (_set(["devices", 1, "overhead_s"], -1e-6), "devices[1].overhead_s must be >= 0"),
    (_set(["devices", 1, "overhead_s"], float("nan")), "devices[1].overhead_s must be finite"),
    (_set(["devices", 0, "peak_flops_per_s"], float("inf")),
     "devices[0].peak_flops_per_s must be finite"),
    (_set(["devices", 1, "efficiency", "matmul"], 1.5), "devices[1].efficiency.matmul"),
    (_set(["devices", 1, "efficiency", "conv"], 0), "devices[1].efficiency.conv must be > 0"),
    (_set(["devices", 0, "efficiency", "attention"], 0.5), "unknown op class 'attention'"),
    (_set(["devices", 0, "efficiency", "free"], 0.99), "devices[0].efficiency.free"),
    (_set(["devices", 0, "efficiency"], [0.5]), "devices[0].efficiency must be an object"),
    (_set(["devices", 0, "kind"], "fpga"), "devices[0].kind must be one of"),
    (_set(["devices", 0, "name"], ""), "devices[0].name must not be empty"),
    (_set(["devices", 0, "exclusive_group"], 5), "devices[0].exclusive_group must be a string"),
    (_set(["devices", 2, "op_times_s"], {"sig": -1.0}), "devices[2].op_times_s['sig']"),
    (_set(["devices", 2, "op_times_s"], [1.0]), "devices[2].op_times_s must be an object"),
    (_set(["devices", 0, "peak_flops"], 1e12), "devices[0].peak_flops is not a known field"),
    (_delete(["devices", 1, "name"]), "devices[1].name is missing"),
    (_delete(["devices", 1, "overhead_s"]), "devices[1].overhead_s is missing"),
    (_delete(["devices", 0, "launch_s"]), "devices[0].launch_s is missing"),
    (_delete(["devices", 2, "dispatch_s"]), "devices[2].dispatch_s is missing"),
    (_set(["devices", 1, "launch_s"], -1e-6), "devices[1].launch_s must be >= 0"),
    (_set(["devices", 0, "dispatch_s"], float("inf")), "devices[0].dispatch_s must be finite"),
    (_set(["devices", 0, "fused_bytes_fraction"], 1.5),
     "devices[0].fused_bytes_fraction must be <= 1"),
    (_dup_name, "devices[2].name 'cpu:0' repeats devices[0].name"),
    (_set(["devices"], []), "devices must be a non-empty list"),
    (_set(["devices"], {"cpu": {}}), "devices must be a non-empty list"),
    (_set(["devices", 1], "gpu"), "devices[1] must be an object"),
    (_delete(["links"]), "links is missing"),
    (_delete(["links", "bandwidth_bytes_per_s"]), "links.bandwidth_bytes_per_s is missing"),
    (_delete(["links", "put_s"]), "links.put_s is missing"),
    (_set(["links", "put_s", 0, 1], -1e-6), "links.put_s[0][1] must be >= 0"),
    (_set(["links", "put_s"], [[0.0]]), "links.put_s must be 3x3 for 3 devices"),
    (_drop_row, "links.latency_s must be 3x3 for 3 devices, got 2x3"),
    (_set(["links", "latency_s", 1], [0, 0]), "links.latency_s must be 3x3 for 3 devices"),
    (_set(["links", "latency_s"], 5), "links.latency_s must be a 3x3 matrix"),
    (_set(["links", "latency_s", 0, 1], -1e-6), "links.latency_s[0][1] must be >= 0"),
    (_set(["links", "latency_s", 1, 1], 1e-6), "links.latency_s[1][1] must be 0"),
    (_set(["links", "latency_s", 2, 0], None), "links.latency_s[2][0] must be a number"),
    (_set(["links", "bandwidth_bytes_per_s", 0, 1], 0), "links.bandwidth_bytes_per_s[0][1] must "
                                                        "be > 0"),
    (_set(["links", "bandwidth_bytes_per_s", 0, 1], float("nan")),
     "links.bandwidth_bytes_per_s[0][1] must be finite"),
    (_set(["links", "bandwidth_bytes_per_s", 0, 2], float("inf")),
     "links.bandwidth_bytes_per_s[0][2] must be finite"),
    (_set(["links", "bandwidth_bytes_per_s", 1, 0], "inf"),
     "links.bandwidth_bytes_per_s[1][0] must be a number"),
    (_set(["links", "bandwidth_bytes_per_s", 2, 2], 1e9),
     "links.bandwidth_bytes_per_s[2][2] must be infinite"),
    (_set(["schema_version"], 3), "schema_version 3 is not supported"),
    (_set(["schema_version"], 1), "schema_version 1 is not supported"),
    (_delete(["schema_version"]), "schema_version None is not supported"),
    (_set(["schema"], "simplace.opgraph"), "schema must be 'simplace.cost_model'"),
    (_set(["name"], 7), "name must be a string"),
    (_set(["extra"], 1), "extra is not a known field"),
    (_delete(["provenance"]), "provenance is missing"),
    (_set(["provenance", "source"], "guess"), "provenance.source must be one of"),
    (_delete(["provenance", "source"]), "provenance.source is missing"),
    (_set(["provenance", "notes"], "one string"), "provenance.notes must be a list"),
    (_set(["provenance", "notes", 0], 3), "provenance.notes[0] must be a string"),
    (_set(["provenance", "date"], 20260101), "provenance.date must be a string"),
    (_set(["corrections", "compute_scale", 1], 0), "corrections.compute_scale[1] must be > 0"),
    (_set(["corrections", "compute_scale"], [1.0]),
     "corrections.compute_scale must have 3 entries for 3 devices, got 1"),
    (_set(["corrections", "launch_scale", 0], "x"),
     "corrections.launch_scale[0] must be a number"),
    (_set(["corrections", "argument_scale"], -1.0),
     "corrections.argument_scale must be > 0"),
    (_set(["corrections", "link_scale"], [[1.0]]), "corrections.link_scale must be 3x3"),
    (_set(["corrections", "link_scale", 0, 1], -2.0), "corrections.link_scale[0][1] must be > 0"),
    (_set(["corrections", "history"], {"a": 1}), "corrections.history must be a list"),
    (_set(["corrections", "scale"], 1), "corrections.scale is not a known field"),
]


@pytest.mark.parametrize("corrupt, message", CORRUPTIONS, ids=[m for _, m in CORRUPTIONS])
def test_bad_field_names_the_field(corrupt, message):
    d = copy.deepcopy(rich_model().to_dict())
    corrupt(d)
    with pytest.raises(CostModelError) as err:
        CostModel.from_dict(d, source="bad.json")
    assert message in str(err.value)
    assert str(err.value).startswith("bad.json: ")


def test_datasheet_without_notes_is_rejected():
    d = CostModel.load("haswell_k40x2").to_dict()
    d["provenance"]["notes"] = []
    with pytest.raises(CostModelError, match="provenance.notes must not be empty"):
        CostModel.from_dict(d)


def test_bad_file_error_names_the_path(tmp_path):
    d = rich_model().to_dict()
    d["devices"][2]["memory_bytes"] = -1
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(CostModelError) as err:
        CostModel.load(path)
    assert str(path) in str(err.value)
    assert "devices[2].memory_bytes must be > 0, got -1" in str(err.value)


@pytest.mark.parametrize("value", [[1, 2], "text", 3, None])
def test_top_level_not_an_object(value):
    with pytest.raises(CostModelError):
        CostModel.from_dict(value)


def test_constructors_validate():
    with pytest.raises(CostModelError, match="memory_bytes must be > 0"):
        Device(name="x", kind="gpu", memory_bytes=0, peak_flops_per_s=1,
               memory_bandwidth_bytes_per_s=1)
    with pytest.raises(CostModelError, match="at least one device"):
        CostModel.from_devices("empty", [], 0, 1)
    dev = Device(name="x", kind="gpu", memory_bytes=1, peak_flops_per_s=1,
                 memory_bandwidth_bytes_per_s=1)
    assert dict(dev.efficiency) == dict(DEFAULT_EFFICIENCY) | {
        "free": DEFAULT_EFFICIENCY["data_movement"]}
    with pytest.raises(CostModelError, match="corrections are for 2 devices"):
        CostModel.from_devices("one", [dev], 0, 1, corrections=Scales.identity(2))
    cm = CostModel.from_devices("one", [dev], 0, 1)
    assert cm.provenance.source == "synthetic"
    assert cm.index("x") == 0
    with pytest.raises(CostModelError, match="no device 'y'"):
        cm.index("y")
    assert math.isinf(cm.bandwidth_bytes_per_s[0, 0]) and cm.latency_s[0, 0] == 0
    with pytest.raises(ValueError):  # arrays are read-only
        cm.latency_s[0, 0] = 1.0


def test_puts_between_device_kinds_hold_the_host():
    # JAX has one client per platform: a put between the CPU and a GPU waits on the host
    # (put_waits); puts between GPUs, or between virtual CPU devices, do not.
    from simplace.sim.inputs import sim_inputs
    from tests.sim_cases import make_graph

    cm = CostModel.load("cpu_h100x4_nvlink")
    assert [d.kind for d in cm.devices] == ["cpu", "gpu", "gpu", "gpu", "gpu"]
    w = cm.put_waits
    assert w[0, 1:].all() and w[1:, 0].all() and not w[1:, 1:].any() and not w[0, 0]
    inp = sim_inputs(make_graph([0], [1], m=2), cm)
    assert np.array_equal(inp.put_waits, w)
    if "cpu_vm2core_x4" in available_cost_models():  # a source checkout: four CPU devices
        assert not CostModel.load("cpu_vm2core_x4").put_waits.any()


def test_put_waits_is_validated_and_written_only_where_it_differs():
    cm = CostModel.load("cpu_h100_pcie")  # cpu:0, gpu:0
    assert cm.put_waits.tolist() == [[False, True], [True, False]]
    assert "put_waits" not in cm.to_dict()["links"]  # the default for these kinds
    d = cm.to_dict()
    d["links"]["put_waits"] = [[False, False], [True, False]]  # measured: cpu -> gpu async
    back = CostModel.from_dict(d)
    assert back.put_waits.tolist() == [[False, False], [True, False]]
    assert back.to_dict()["links"]["put_waits"] == [[False, False], [True, False]]
    assert back.subset([1, 0]).put_waits.tolist() == [[False, True], [False, False]]
    for bad, match in (([[False, True]], "2x2 matrix"), ([[0, 1], [1, 0]], "true or false"),
                       ([[True, True], [True, False]], r"put_waits\[0\]\[0\] must be false")):
        d["links"]["put_waits"] = bad
        with pytest.raises(CostModelError, match=match):
            CostModel.from_dict(d)

"""Doppler instances: parsing, the replay of Doppler's simulator, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from simplace.external import ExternalFormatError, load_instance
from simplace.external._machine import TRANSFER_BANDWIDTH_BYTES_PER_S
from simplace.external.doppler import FILE_UNITS_PER_S, DopplerMakespan, default_devices

DATA = Path(__file__).resolve().parents[1] / "bench/data/external/doppler"


def _write(tmp_path, text, name="g.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _ruler(comp, comm, edges, devices):
    src = [s for s, _ in edges]
    dst = [d for _, d in edges]
    return DopplerMakespan(comp, comm, src, dst, devices)


def _units(ruler, placement):
    return int(ruler.makespan_units(np.asarray([placement], dtype=np.int32))[0])


# A diamond 0 -> {1, 2} -> 3 after two input tensors (5 nodes in the header, 2 inputs),
# node 2 typed as in the gdp_ files.
DIAMOND = """6
0, 1,
0, 0, 1, 2,
1, 2, 3, 3,
10,100,einsummable
20,200,einsummable
30,300,formation
40,400,einsummable
"""


def test_parse_small_file(tmp_path):
    inst = load_instance(_write(tmp_path, DIAMOND), "doppler")
    g = inst.graph
    assert g.num_ops == 4 and g.name == "g"
    assert g.src.tolist() == [0, 0, 1, 2] and g.dst.tolist() == [1, 2, 3, 3]
    assert list(g.op) == ["einsummable", "einsummable", "formation", "einsummable"]
    assert list(g.name_path) == ["node0", "node1", "node2", "node3"]
    np.testing.assert_allclose(
        g.edge_bytes, np.array([100, 100, 200, 300]) / FILE_UNITS_PER_S
        * TRANSFER_BANDWIDTH_BYTES_PER_S)
    assert inst.node_ids.tolist() == [0, 1, 2, 3]
    assert inst.colocation.tolist() == [-1] * 4
    assert inst.info["devices"] == 4 and inst.info["input_tensors"] == 2
    assert inst.cost_model.objective is inst.ruler("latency")
    assert len(inst.cost_model.devices) == 4


def test_device_count_from_name_and_override(tmp_path):
    assert default_devices("x/8gpu_full_transformer.txt") == 8
    assert default_devices("x/ffnn_192nodes.txt") == 4
    inst = load_instance(_write(tmp_path, DIAMOND, "8gpu_small.txt"), "doppler")
    assert inst.ruler().num_devices == 8
    inst = load_instance(_write(tmp_path, DIAMOND), "doppler", devices=2)
    assert inst.ruler().num_devices == 2 and len(inst.cost_model.devices) == 2


def test_non_topological_file_is_reordered(tmp_path):
    # Node 0 consumes node 2: ops become file nodes [1, 2, 0] in a topological order.
    text = "3\n\n2, 1,\n0, 2,\n5,50\n7,70\n11,110\n"
    inst = load_instance(_write(tmp_path, text), "doppler", devices=2)
    assert inst.node_ids.tolist() == [1, 2, 0]
    assert all(s < d for s, d in zip(inst.graph.src, inst.graph.dst, strict=True))
    assert list(inst.graph.name_path) == ["node1", "node2", "node0"]
    # Ops 0,1 (file 1,2) on device 0, op 2 (file 0) on device 1: 7 + 11 + 110 + 5.
    r = inst.ruler()
    assert _units(r, [0, 0, 1]) == 7 + 11 + 110 + 5
    assert _units(r, [0, 0, 0]) == 23


def test_duplicate_edges_kept_once(tmp_path):
    text = "2\n\n0, 0,\n1, 1,\n3,4\n5,6\n"
    inst = load_instance(_write(tmp_path, text), "doppler", devices=2)
    assert inst.graph.num_edges == 1 and inst.info["duplicate_edges_dropped"] == 1
    assert _units(inst.ruler(), [0, 1]) == 3 + 4 + 5


def test_ruler_contention_on_one_device():
    # Three independent ops on one device run one after another.
    r = _ruler([3, 4, 5], [0, 0, 0], [], 2)
    assert _units(r, [0, 0, 0]) == 12
    assert _units(r, [0, 1, 0]) == 8


def test_ruler_cut_edge_costs_producer_comm_per_edge():
    # 0 -> 1 and 0 -> 2, both cut: each copy takes node 0's 100, in parallel (no link
    # contention), each consumer then runs on its own device.
    r = _ruler([10, 1, 2, 1], [100, 0, 0, 0], [(0, 1), (0, 2)], 3)
    assert _units(r, [0, 1, 2, 0]) == 10 + 100 + 2
    # Same device: no copy.
    assert _units(r, [0, 0, 0, 1]) == 10 + 1 + 2


def test_ruler_equal_arrivals_ordered_by_copy_start():
    # Node 1 (dev 0) ends at 5 and sends to 3, node 0 (dev 1) ends at 8 and sends to 2:
    # both copies land at 10 on device 2. SimPy runs equal-time timeouts in creation
    # order, so 3 (its copy began first) runs before 2 although 0 < 1 and 2 < 3; 3 feeds
    # 4 on device 0: 3 at 10..11, 4 at 11..21 (22 the other way round).
    r = _ruler([8, 5, 1, 1, 10], [2, 5, 0, 0, 0], [(1, 3), (0, 2), (3, 4)], 3)
    assert _units(r, [1, 0, 2, 2, 0]) == 21


def test_ruler_equal_readiness_ordered_by_file_edge_order():
    # 0 feeds 1 and 2 on device 1 (both ready at 1); 2 feeds 3 (cost 10) on device 2. The
    # consumer first among 0's edges in the file requests first.
    edges = [(0, 1), (0, 2), (2, 3)]
    r = _ruler([1, 1, 1, 10], [0, 0, 0, 0], edges, 3)
    assert _units(r, [0, 1, 1, 2]) == 1 + 1 + 1 + 10
    r = _ruler([1, 1, 1, 10], [0, 0, 0, 0], [edges[1], edges[0], edges[2]], 3)
    assert _units(r, [0, 1, 1, 2]) == 1 + 1 + 10


def test_evaluate_fields_and_bound():
    r = _ruler([10, 20, 30, 40], [100, 200, 300, 400], [(0, 1), (0, 2), (1, 3), (2, 3)], 2)
    res = r(np.array([[0, 1, 0, 0], [0, 0, 0, 0]], dtype=np.int32))
    np.testing.assert_allclose(res.busy_s, np.array([[80, 20], [100, 0]]) / FILE_UNITS_PER_S)
    # Cut edges 0 -> 1 (100) and 1 -> 3 (200).
    np.testing.assert_allclose(res.bytes_moved, [300 / FILE_UNITS_PER_S
                                                 * TRANSFER_BANDWIDTH_BYTES_PER_S, 0])
    assert res.step_time_s[1] == 100 / FILE_UNITS_PER_S
    assert res.step_time_s[0] == (10 + 100 + 20 + 200 + 40) / FILE_UNITS_PER_S
    assert not res.oom.any() and (res.peak_memory_bytes == 0).all()
    # Critical path 10 + 30 + 40 = 80 beats 100 / 2.
    assert r.lower_bound_s() == 80 / FILE_UNITS_PER_S
    assert (res.step_time_s >= r.lower_bound_s()).all()


def test_bad_placements_rejected():
    r = _ruler([1, 1], [0, 0], [(0, 1)], 2)
    with pytest.raises(ValueError, match="devices 0..1"):
        r.makespan_units(np.array([[0, 2]]))
    with pytest.raises(ValueError, match="int\\[B, 2\\]"):
        r.makespan_units(np.array([[0, 1, 0]]))


def _reference():
    return json.loads((DATA / "reference.json").read_text())


def test_reference_outputs_of_doppler_simulator():
    ref = _reference()
    assert len(ref["graphs"]) == 6
    for g in ref["graphs"]:
        inst = load_instance(DATA / g["file"], "doppler")
        assert inst.ruler().num_devices == g["devices"]
        assert not inst.info["reordered"]
        p = np.asarray(g["placements"], dtype=np.int32)
        assert len(p) >= 20
        units = inst.ruler().makespan_units(p)
        assert units.tolist() == g["makespan_units"], g["file"]
        res = inst.ruler()(p)
        np.testing.assert_allclose(res.step_time_s, g["makespan"], rtol=1e-15)
        # Batch == one by one.
        one = [_units(inst.ruler(), row) for row in p]
        assert one == units.tolist()


def test_simulate_returns_the_rulers_makespan():
    from simplace.sim import simulate

    g = _reference()["graphs"][2]
    inst = load_instance(DATA / g["file"], "doppler")
    for p, want in list(zip(g["placements"], g["makespan"], strict=True))[:4]:
        got = simulate(inst.graph, inst.cost_model, np.asarray(p, dtype=np.int32))
        assert got.step_time_s == pytest.approx(want, rel=1e-15)


@pytest.mark.parametrize("text,match", [
    ("3\n\n0,\n1,\n1,1\n", "truncated"),
    ("3\n\n0,\n1,\n1,1\n1,1\n1,1\n1,1\n", "truncated"),
    ("x\n\n\n\n1,1\n", "line 1"),
    ("2\n\n0, 1,\n1,\n1,1\n1,1\n", "lines 3-4"),
    ("2\n\n0,\n5,\n1,1\n1,1\n", "line 4: edge endpoint 5"),
    ("2\n\n0, 1,\n1, 0,\n1,1\n1,1\n", "cycle"),
    ("2\n\n0,\n0,\n1,1\n1,1\n", "self-loop on node 0"),
    ("2\n\n0,\n1,\n1,-1\n1,1\n", "line 5 \\(node 0\\): negative communication"),
    ("2\n\n0,\n1,\n1,1\n1.5,1\n", "line 6 \\(node 1\\)"),
    ("2\n\n0,\n1,\n1,1\n1\n", "line 6"),
    ("2\n\n0, a,\n1,\n1,1\n1,1\n", "line 3"),
    ("3\n0, 1, 2,\n\n\n", "at least one"),
    ("2\n\n", "at least 4"),
])
def test_bad_files(tmp_path, text, match):
    path = _write(tmp_path, text)
    with pytest.raises(ExternalFormatError, match=match) as err:
        load_instance(path, "doppler", devices=2)
    assert str(path) in str(err.value)


def test_missing_file_and_bad_device_count(tmp_path):
    with pytest.raises(ExternalFormatError, match="no such"):
        load_instance(tmp_path / "none.txt", "doppler")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ExternalFormatError, match="devices"):
            load_instance(_write(tmp_path, DIAMOND), "doppler", devices=bad)

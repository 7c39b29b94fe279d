"""Simulators: the batched simulator against the reference, invariants, corner cases."""

import types

import numpy as np
import pytest

import simplace.sim as sim
from simplace.errors import PlacementError
from simplace.sim import batched_simulator, lower_bound, make_sim_inputs, simulate
from tests import sim_cases
from tests.sim_cases import make_graph, simple_inputs

RTOL = 1e-9


def assert_same(ref, out, b):
    """One reference SimResult against row b of a BatchResult."""
    np.testing.assert_allclose(out.step_time_s[b], ref.step_time_s, rtol=RTOL)
    np.testing.assert_allclose(out.peak_memory_bytes[b], ref.peak_memory_bytes, rtol=RTOL)
    np.testing.assert_allclose(out.busy_s[b], ref.busy_s, rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(out.bytes_moved[b], ref.bytes_moved, rtol=RTOL)
    assert bool(out.oom[b]) == ref.oom


def check_agree(graph, inp, placements):
    f = batched_simulator(graph, inp)
    out = f(placements)
    refs = [simulate(graph, inp, p) for p in placements]
    for b, ref in enumerate(refs):
        assert_same(ref, out, b)
    return refs, out


# ---------------------------------------------------------------- reference vs batched
@pytest.mark.parametrize("seed", range(2))
def test_batched_matches_reference_on_random_graphs(seed):
    # 2 x 22 graphs x up to 16 placements: a few hundred cases, one compile per graph.
    rng = np.random.default_rng(seed)
    for _ in range(22):
        g, inp = sim_cases.random_case(rng)
        # Tight memory on some machines so that OOM flags are compared too.
        if rng.random() < 0.3:
            inp = inp._replace(memory_bytes=np.full(inp.num_devices, 2e4))
        b = int(rng.integers(1, 17))
        check_agree(g, inp, sim_cases.random_placements(rng, b, g.num_ops, inp.num_devices))


def test_batched_matches_reference_on_bigger_graphs_with_ties():
    rng = np.random.default_rng(11)
    for shape in sim_cases.SHAPES:
        g = sim_cases.random_graph(rng, shape, 150)
        inp = sim_cases.random_inputs(rng, 150, 4, exclusive=True, integer_times=True)
        check_agree(g, inp, sim_cases.random_placements(rng, 6, 150, 4))


def test_through_cost_model():
    cm_mod = pytest.importorskip("simplace.cost_model")
    cm = cm_mod.CostModel.synthetic(4, seed=3, exclusive_pair=True)
    g = sim_cases.random_graph(np.random.default_rng(5), "layered", 60)
    inp = sim.sim_inputs(g, cm)
    assert inp.exclusive_group[0] == inp.exclusive_group[1]
    p = sim_cases.random_placements(np.random.default_rng(6), 6, 60, 4)
    refs, out = check_agree(g, cm, p)
    # The cost model and its SimInputs give the same results.
    assert simulate(g, inp, p[3]).step_time_s == refs[3].step_time_s


def test_link_scale_is_folded_into_transfer_times():
    g = make_graph([0], [1], m=2, edge_bytes=[100.0])
    inp = simple_inputs(2, 2, op_time=1.0, latency=0.5, bandwidth=100.0)
    scale = np.full((2, 2), 3.0)
    duck = types.SimpleNamespace(
        op_times=lambda graph: inp.op_time_s, latency_s=inp.latency_s,
        bandwidth_bytes_per_s=inp.bandwidth_bytes_per_s, memory_bytes=inp.memory_bytes,
        exclusive_group_ids=inp.exclusive_group,
        corrections=types.SimpleNamespace(link_scale=scale))
    r = simulate(g, duck, [0, 1])
    assert r.step_time_s == pytest.approx(1 + 3 * (0.5 + 1.0) + 1)
    assert batched_simulator(g, duck)(np.array([[0, 1]])).step_time_s[0] == pytest.approx(
        r.step_time_s)


# ---------------------------------------------------------------- invariants
def test_all_on_one_device_is_sum_of_op_times():
    rng = np.random.default_rng(2)
    for _ in range(10):
        g, inp = sim_cases.random_case(rng)
        for d in range(inp.num_devices):
            p = np.full(g.num_ops, d)
            r = simulate(g, inp, p)
            assert r.step_time_s == pytest.approx(inp.op_time_s[:, d].sum(), rel=1e-12)
            assert r.bytes_moved == 0


def test_unused_extra_device_changes_nothing():
    rng = np.random.default_rng(3)
    for _ in range(4):
        g, inp = sim_cases.random_case(rng, max_devices=4)
        d = inp.num_devices
        extra = make_sim_inputs(
            np.concatenate([inp.op_time_s, rng.uniform(0, 1, (g.num_ops, 1))], axis=1),
            np.pad(inp.latency_s, ((0, 1), (0, 1)), constant_values=1.0),
            np.pad(inp.bandwidth_bytes_per_s, ((0, 1), (0, 1)), constant_values=10.0),
            np.append(inp.memory_bytes, 1.0), np.append(inp.exclusive_group, d))
        p = sim_cases.random_placements(rng, 4, g.num_ops, d)
        out_a = batched_simulator(g, inp)(p)
        out_b = batched_simulator(g, extra)(p)
        np.testing.assert_array_equal(out_a.step_time_s, out_b.step_time_s)
        np.testing.assert_array_equal(out_a.peak_memory_bytes, out_b.peak_memory_bytes[:, :d])
        assert np.all(out_b.peak_memory_bytes[:, d] == 0)
        ra, rb = simulate(g, inp, p[-1]), simulate(g, extra, p[-1])
        assert ra.step_time_s == rb.step_time_s


def test_zero_byte_tensor_costs_exactly_the_latency():
    g, inp = sim_cases.corner_cases()["zero_byte_tensors"]
    r = simulate(g, inp, [0, 1, 0])
    assert r.step_time_s == 1 + 0.5 + 1 + 0.5 + 1
    assert r.bytes_moved == 0
    assert len(simulate(g, inp, [0, 1, 0], schedule=True).schedule.transfer_op) == 2
    assert batched_simulator(g, inp)(np.array([[0, 1, 0]])).step_time_s[0] == r.step_time_s


def test_params_larger_than_memory_are_oom():
    g, inp = sim_cases.corner_cases()["fits_nowhere"]
    for p in ([0, 0], [0, 1], [1, 0], [1, 1]):
        r = simulate(g, inp, p)
        assert r.oom and r.oom_devices == (p[1],)
        assert r.peak_memory_bytes[p[1]] >= 5e9
    out = batched_simulator(g, inp)(np.array([[0, 0], [0, 1], [1, 0], [1, 1]]))
    assert out.oom.all()


def test_params_counted_once_per_device():
    # Ops 0 and 1 both read parameter 0 (100 bytes); op 2 reads parameter 1.
    g = make_graph([], [], m=3, out_bytes=[0, 0, 0],
                   params=([100.0, 7.0], [(0, 0), (1, 0), (2, 1)]))
    inp = simple_inputs(3, 2)
    assert list(simulate(g, inp, [0, 0, 0]).peak_memory_bytes) == [107, 0]
    assert list(simulate(g, inp, [0, 1, 1]).peak_memory_bytes) == [100, 107]
    out = batched_simulator(g, inp)(np.array([[0, 0, 0], [0, 1, 1]]))
    np.testing.assert_array_equal(out.peak_memory_bytes, [[107, 0], [100, 107]])


def test_tensor_sent_once_to_a_device_with_two_consumers():
    # Op 0 feeds ops 1 and 2 with the same tensor (output 0), and op 3 with output 1.
    g = make_graph([0, 0, 0], [1, 2, 3], m=4, edge_bytes=[300.0, 300.0, 50.0],
                   edge_output=[0, 0, 1])
    inp = simple_inputs(4, 3)
    r = simulate(g, inp, [0, 1, 1, 2], schedule=True)
    assert r.bytes_moved == 300 + 50
    s = r.schedule
    assert list(s.transfer_to) == [1, 2] and list(s.transfer_bytes) == [300, 50]
    r2 = simulate(g, inp, [0, 1, 1, 1])  # both outputs in one transfer
    assert r2.bytes_moved == 350
    assert r2.step_time_s == 1 + 0.5 + 3.5 + 3
    out = batched_simulator(g, inp)(np.array([[0, 1, 1, 2], [0, 1, 1, 1]]))
    np.testing.assert_array_equal(out.bytes_moved, [350, 350])


def test_transfers_on_one_link_queue():
    # Ops 0 and 1 on device 0 each send 500 bytes (5 s + 0.5 s latency) to device 1.
    g = make_graph([0, 1], [2, 3], m=4, edge_bytes=[500.0, 500.0], out_bytes=[0] * 4)
    inp = simple_inputs(4, 2)
    r = simulate(g, inp, [0, 0, 1, 1], schedule=True)
    s = r.schedule
    np.testing.assert_allclose(s.transfer_start_s, [1.0, 6.5])  # second waits for the link
    np.testing.assert_allclose(s.transfer_end_s, [6.5, 12.0])
    assert r.step_time_s == 13.0
    assert batched_simulator(g, inp)(np.array([[0, 0, 1, 1]])).step_time_s[0] == 13.0


def test_exclusive_group_runs_one_op_at_a_time():
    g = make_graph([], [], m=2)
    shared = simple_inputs(2, 2, group=[0, 0])
    apart = simple_inputs(2, 2, group=[0, 1])
    assert simulate(g, shared, [0, 1]).step_time_s == 2.0
    assert simulate(g, apart, [0, 1]).step_time_s == 1.0
    f = batched_simulator(g, shared)
    np.testing.assert_array_equal(f(np.array([[0, 1], [0, 0]])).step_time_s, [2.0, 2.0])


def test_activation_lives_until_its_transfer_arrives():
    # Op 0 (100 bytes) on device 0 sends to op 1 on device 1; op 2 on device 0 starts at
    # 1 and would overlap op 0's activation while the transfer (until 2.5) is in flight.
    g = make_graph([0], [1], m=3, edge_bytes=[100.0], out_bytes=[100.0, 0.0, 30.0])
    inp = simple_inputs(3, 2)
    r = simulate(g, inp, [0, 1, 0])
    assert r.peak_memory_bytes[0] == 130  # 0's activation and 2's overlap in [1, 2)
    assert r.peak_memory_bytes[1] == 100  # the received copy during [2.5, 3.5)
    out = batched_simulator(g, inp)(np.array([[0, 1, 0]]))
    np.testing.assert_array_equal(out.peak_memory_bytes[0], [130, 100])


def test_step_time_at_least_lower_bound():
    rng = np.random.default_rng(4)
    for _ in range(40):
        g, inp = sim_cases.random_case(rng)
        lb = lower_bound(g, inp)
        for p in sim_cases.random_placements(rng, 6, g.num_ops, inp.num_devices):
            assert simulate(g, inp, p).step_time_s >= lb * (1 - 1e-12)
        # The bound is tight for a single device.
        if inp.num_devices == 1:
            assert simulate(g, inp, np.zeros(g.num_ops, int)).step_time_s == pytest.approx(lb)


def test_schedule_is_consistent():
    rng = np.random.default_rng(7)
    g = sim_cases.random_graph(rng, "layered", 40)
    inp = sim_cases.random_inputs(rng, 40, 3, exclusive=True)
    p = rng.integers(0, 3, 40)
    r = simulate(g, inp, p, schedule=True)
    s = r.schedule
    np.testing.assert_array_equal(s.op_device, p)
    np.testing.assert_allclose(s.op_end_s - s.op_start_s, inp.op_time_s[np.arange(40), p])
    for a, b in zip(g.src, g.dst, strict=True):
        assert s.op_start_s[b] >= s.op_end_s[a]
    assert np.all(s.transfer_start_s >= s.op_end_s[s.transfer_op])
    assert r.step_time_s == max(s.op_end_s.max(), s.transfer_end_s.max(initial=0))
    assert r.bytes_moved == s.transfer_bytes.sum()
    assert simulate(g, inp, p).schedule is None


# ---------------------------------------------------------------- corner cases
@pytest.mark.parametrize("name", sorted(sim_cases.corner_cases()))
def test_corner_cases(name):
    g, inp = sim_cases.corner_cases()[name]
    d = inp.num_devices
    p = sim_cases.random_placements(np.random.default_rng(0), 4, g.num_ops, d)
    refs, out = check_agree(g, inp, p)
    if name == "empty":
        assert refs[0].step_time_s == 0 and not refs[0].oom
        assert out.step_time_s.shape == (4,) and np.all(out.step_time_s == 0)
        assert lower_bound(g, inp) == 0
    if name in ("one_op", "no_edges", "one_device"):
        assert all(r.bytes_moved == 0 for r in refs)
    if name == "fits_nowhere":
        assert all(r.oom for r in refs)


def test_bad_placements_raise_placement_error():
    g = make_graph([0], [1], m=2)
    inp = simple_inputs(2, 3)
    f = batched_simulator(g, inp)
    with pytest.raises(PlacementError, match="3 entries but the graph has 2 ops"):
        simulate(g, inp, [0, 1, 2])
    with pytest.raises(PlacementError, match="op 1 is placed on device 3.*indices 0..2"):
        simulate(g, inp, [0, 3])
    with pytest.raises(PlacementError, match="op 0 is placed on device -1"):
        simulate(g, inp, [-1, 0])
    with pytest.raises(PlacementError, match="must be integers"):
        simulate(g, inp, [0.5, 1])
    with pytest.raises(PlacementError, match="1-D"):
        simulate(g, inp, [[0, 1]])
    with pytest.raises(PlacementError, match="placement 1, op 0 is placed on device 7"):
        f(np.array([[0, 1], [7, 0]]))
    with pytest.raises(PlacementError, match="3 entries"):
        f(np.zeros((2, 3), int))
    with pytest.raises(PlacementError, match="int\\[B, M\\]"):
        f(np.zeros(2, int))
    # Whole-number floats are accepted.
    assert simulate(g, inp, np.array([0.0, 1.0])).step_time_s == 1 + 0.5 + 10 + 1


# ---------------------------------------------------------------- compilation
def test_batched_compiles_once_per_bucket():
    rng = np.random.default_rng(8)
    g, inp = sim_cases.random_case(rng)
    f = batched_simulator(g, inp)
    for _ in range(3):
        f(sim_cases.random_placements(rng, 5, g.num_ops, inp.num_devices))
    f(sim_cases.random_placements(rng, 7, g.num_ops, inp.num_devices))  # same bucket (8)
    assert f.num_traces == 1
    f(sim_cases.random_placements(rng, 9, g.num_ops, inp.num_devices))
    assert f.num_traces == 2


def test_memory_off_skips_peak():
    rng = np.random.default_rng(9)
    g, inp = sim_cases.random_case(rng)
    p = sim_cases.random_placements(rng, 3, g.num_ops, inp.num_devices)
    full = batched_simulator(g, inp)(p)
    fast = batched_simulator(g, inp, memory=False)(p)
    np.testing.assert_array_equal(full.step_time_s, fast.step_time_s)
    assert np.all(np.isnan(fast.peak_memory_bytes)) and not fast.oom.any()


def test_public_names():
    for name in sim.__all__:
        assert hasattr(sim, name), name
    from simplace.sim.batched import batch_bucket
    assert [batch_bucket(b) for b in (1, 2, 3, 64, 65, 256, 257, 1000)] == [
        1, 2, 4, 64, 128, 256, 512, 1024]


def test_memory_oom_mode_flags_exactly():
    # memory="oom" screens placements with an upper bound of the peak and simulates only
    # those that might not fit: its OOM flags equal the exact ones, and the peaks it does
    # report are the exact peaks.
    rng = np.random.default_rng(12)
    screened = exact_rows = 0
    for _ in range(6):
        g, inp = sim_cases.random_case(rng)
        cap = float(rng.choice([5e3, 2e4, 1e12]))
        inp = inp._replace(memory_bytes=np.full(inp.num_devices, cap))
        p = sim_cases.random_placements(rng, 8, g.num_ops, inp.num_devices)
        fast = batched_simulator(g, inp, memory="oom")(p)
        full = batched_simulator(g, inp)(p)
        np.testing.assert_array_equal(fast.oom, full.oom)
        np.testing.assert_array_equal(fast.step_time_s, full.step_time_s)
        np.testing.assert_array_equal(fast.busy_s, full.busy_s)
        rows = ~np.isnan(fast.peak_memory_bytes).any(axis=1)
        np.testing.assert_array_equal(fast.peak_memory_bytes[rows], full.peak_memory_bytes[rows])
        assert np.all(rows[full.oom])  # every OOM placement was simulated exactly
        screened += int((~rows).sum())
        exact_rows += int(rows.sum())
    assert screened and exact_rows  # both paths ran
    with pytest.raises(ValueError, match="memory must be"):
        batched_simulator(g, inp, memory="peak")


def test_ready_slots_never_overwrite_a_live_row():
    from simplace.sim.batched import _ready_slots
    rng = np.random.default_rng(13)
    for shape in sim_cases.SHAPES:
        g = sim_cases.random_graph(rng, shape, 80)
        slot, n = _ready_slots(g.num_ops, g.src.astype(np.int64), g.dst.astype(np.int64))
        last = np.full(g.num_ops, -1)
        np.maximum.at(last, g.src, g.dst)
        # Op i's row is written at step i + 1 and read up to step last[i].
        owner = {}
        for step in range(g.num_ops + 1):
            for s, i in list(owner.items()):
                if last[i] < step:
                    del owner[s]
            if step >= 1:
                i = step - 1
                if last[i] > i:
                    assert slot[i] not in owner, (shape, i, owner)
                    owner[slot[i]] = i
                else:
                    assert slot[i] == n - 1  # the scratch row
        assert n - 1 not in slot[last > np.arange(g.num_ops)]

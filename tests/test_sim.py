"""Simulators: the batched simulator and the list schedulers' incremental program against
the reference, the reference against numbers worked out by hand, invariants, corner
cases.

Compiling a batched simulator takes a second or two, so the agreement tests simulate
unions of random graphs (one compile for many shapes) and many placements per compile.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simplace.sim as sim
from simplace.errors import PlacementError
from simplace.sim import lower_bound, make_sim_inputs, simulate
from simplace.sim.batched import BatchedSimulator, _sweep_peaks
from simplace.sim.incremental import IncrementalProgram
from tests import sim_cases
from tests.sim_cases import make_graph, simple_inputs

RTOL = 1e-9


def batched_simulator(graph, cost_model, **kw):
    """The JAX simulator (this file's subject; tests/test_sim_native.py checks the native
    one, which ``sim.batched_simulator`` picks where numba is installed)."""
    return sim.batched_simulator(graph, cost_model, backend="jax", **kw)


def assert_same(ref, out, b):
    """One reference SimResult against row b of a BatchResult."""
    np.testing.assert_allclose(out.step_time_s[b], ref.step_time_s, rtol=RTOL)
    np.testing.assert_allclose(out.peak_memory_bytes[b], ref.peak_memory_bytes, rtol=RTOL)
    np.testing.assert_allclose(out.busy_s[b], ref.busy_s, rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(out.bytes_moved[b], ref.bytes_moved, rtol=RTOL)
    np.testing.assert_allclose(out.host_s[b], ref.host_s, rtol=RTOL)
    assert int(out.num_segments[b]) == ref.num_segments
    assert int(out.num_transfers[b]) == ref.num_transfers
    assert bool(out.oom[b]) == ref.oom


def check_agree(graph, inp, placements, f=None):
    """The batched simulator ``f`` (by default the JAX one) and the list schedulers'
    incremental program against the reference, on every placement."""
    f = batched_simulator(graph, inp) if f is None else f
    out = f(placements)
    refs = [simulate(graph, inp, p) for p in placements]
    for b, ref in enumerate(refs):
        assert_same(ref, out, b)
    inputs = sim.sim_inputs(graph, inp)
    if inputs.objective == "latency":  # (the program simulates the step time only)
        program = IncrementalProgram(graph, inputs)
        for p, ref in zip(placements, refs, strict=True):
            assert program.replay(p) == ref.step_time_s  # same sums, same order: equal
    return refs, out


def hosty_inputs(m, d, *, op_time=1.0, latency=0.5, bandwidth=100.0, launch=0.0,
                 dispatch=0.0, put=0.0, group=None):
    """simple_inputs with segment launch, dispatch and device_put costs (powers of two
    in the hand-worked cases, so that every sum is exact)."""
    base = simple_inputs(m, d, op_time=op_time, latency=latency, bandwidth=bandwidth,
                         group=group)
    return make_sim_inputs(base.op_time_s, base.latency_s, base.bandwidth_bytes_per_s,
                           base.memory_bytes, base.exclusive_group, np.full(d, launch),
                           np.full(d, dispatch), np.full((d, d), put))


# ---------------------------------------------------------------- reference vs batched
@pytest.mark.parametrize("seed", range(2))
def test_batched_matches_reference_on_random_graphs(seed):
    # Three machines per seed (link tables of one, two or many kinds: the batched
    # simulator's two ways of reading link constants), each running a union of random
    # graphs of every shape: hundreds of placements, three compiles. Each simulator is
    # called twice: the second call reuses the first one's segment-end table.
    rng = np.random.default_rng(seed)
    for classes in (1, 2, None):
        graphs = [sim_cases.random_graph(rng, shape, int(rng.integers(1, 41)))
                  for shape in rng.permutation(sim_cases.SHAPES)[:4]]
        g = sim_cases.union_graph(graphs)
        d = int(rng.integers(2 if classes else 3, 6))
        inp = sim_cases.random_inputs(
            rng, g.num_ops, d, exclusive=bool(rng.random() < 0.5),
            integer_times=bool(classes and rng.random() < 0.5), host_costs=True,
            link_classes=classes)
        # Tight memory on some machines so that OOM flags are compared too.
        if rng.random() < 0.5:
            inp = inp._replace(memory_bytes=np.full(d, 3e4))
        f = BatchedSimulator(g, inp)
        assert f._static["TABLE"] == (classes is None)  # d > 2: over 4 kinds of link
        for _ in range(2):
            p = np.concatenate([sim_cases.random_placements(rng, 8, g.num_ops, d),
                                sim_cases.long_run_placements(rng, 8, g.num_ops, d)])
            check_agree(g, inp, p, f)


def test_batched_matches_reference_with_ties_and_long_segments():
    # Whole-number times (ties everywhere), exclusive groups, host costs, and segments
    # running on for tens of ops (the batched simulator's gather path).
    rng = np.random.default_rng(11)
    g = sim_cases.union_graph([sim_cases.random_graph(rng, s, 60) for s in sim_cases.SHAPES])
    inp = sim_cases.random_inputs(rng, g.num_ops, 4, exclusive=True, integer_times=True,
                                  host_costs=True, link_classes=2)
    p = np.concatenate([sim_cases.random_placements(rng, 4, g.num_ops, 4),
                        sim_cases.long_run_placements(rng, 12, g.num_ops, 4)])
    check_agree(g, inp, p)


def test_a_put_between_clients_holds_the_host_until_the_copy_arrives():
    # Op 0 (device 0, "the CPU") feeds op 1 (device 1, "a GPU"); op 2 reads nothing and
    # runs on device 2 (another GPU), after them in graph order. Each op takes 1 s,
    # dispatch 0.1 s, put 0.2 s, a copy 0.5 s + 100 bytes / 100 B/s.
    g = make_graph([0], [1], m=3, edge_bytes=[100.0])
    base = simple_inputs(3, 3, op_time=1.0, latency=0.5, bandwidth=100.0)
    host = dict(dispatch_s=np.full(3, 0.1), put_s=np.full((3, 3), 0.2))
    clients = np.array([0, 1, 1])
    waits = clients[:, None] != clients[None, :]
    p = [0, 1, 2]
    free = simulate(g, make_sim_inputs(*base[:5], **host), p, schedule=True)
    held = simulate(g, make_sim_inputs(*base[:5], **host, put_waits=waits), p, schedule=True)
    # Asynchronous put: issued at 0.3, starts when op 0 ends (1.1), arrives at 2.6; the
    # host dispatches op 1 (0.4) and op 2 (0.5) without waiting.
    assert free.schedule.segment_start_s.tolist() == pytest.approx([0.1, 2.6, 0.5])
    assert free.step_time_s == pytest.approx(3.6)
    # The host waits for the copy (2.6): op 1 is dispatched at 2.7, op 2 at 2.8.
    assert held.schedule.segment_dispatch_s.tolist() == pytest.approx([0.1, 2.7, 2.8])
    assert held.schedule.segment_start_s.tolist() == pytest.approx([0.1, 2.7, 2.8])
    assert held.step_time_s == pytest.approx(3.8) and held.host_s == pytest.approx(2.8)
    # The batched simulators and the bound agree.
    for inp, want in ((make_sim_inputs(*base[:5], **host), 3.6),
                      (make_sim_inputs(*base[:5], **host, put_waits=waits), 3.8)):
        assert sim.batched_simulator(g, inp)(np.array([p])).step_time_s[0] == pytest.approx(want)
        assert BatchedSimulator(g, inp)(np.array([p])).step_time_s[0] == pytest.approx(want)
        assert lower_bound(g, inp) <= want + 1e-12


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
    from simplace.scales import Scales, apply_scales

    g = make_graph([0], [1], m=2, edge_bytes=[100.0])
    inp = simple_inputs(2, 2, op_time=1.0, latency=0.5, bandwidth=100.0)
    scaled = apply_scales(inp, Scales.uniform(2, link=3.0))
    r = simulate(g, scaled, [0, 1])
    assert r.step_time_s == pytest.approx(1 + 3 * (0.5 + 1.0) + 1)
    assert batched_simulator(g, scaled)(np.array([[0, 1]])).step_time_s[0] == pytest.approx(
        r.step_time_s)
    # a duck-typed cost model's figures are taken as they are
    duck = types.SimpleNamespace(
        op_times=lambda graph: inp.op_time_s, latency_s=scaled.latency_s,
        bandwidth_bytes_per_s=scaled.bandwidth_bytes_per_s, memory_bytes=inp.memory_bytes,
        exclusive_group_ids=inp.exclusive_group)
    assert simulate(g, duck, [0, 1]).step_time_s == r.step_time_s


# ---------------------------------------------------------------- worked by hand
def test_fragmented_placement_pays_a_launch_and_a_dispatch_per_segment():
    # A chain of four ops (1 s each, 100-byte edges: 0.5 s + 1 s a transfer); each segment
    # costs a 0.25 s launch and a 0.125 s dispatch, each device_put 0.0625 s of host time.
    g = make_graph([0, 1, 2], [1, 2, 3], m=4, edge_bytes=[100.0] * 3, out_bytes=[0] * 4)
    inp = hosty_inputs(4, 2, launch=0.25, dispatch=0.125, put=0.0625)
    one = simulate(g, inp, [0, 0, 0, 0])
    # One segment: one dispatch, then one launch and the four ops.
    assert one.step_time_s == 0.125 + 0.25 + 4.0
    assert (one.num_segments, one.num_transfers, one.host_s) == (1, 0, 0.125)
    assert list(one.busy_s) == [4.25, 0.0]
    frag = simulate(g, inp, [0, 1, 0, 1], schedule=True)
    s = frag.schedule
    # Host: dispatch 0 (0.125); put 0->1, dispatch 1 (0.3125); put, dispatch 2 (0.5); put,
    # dispatch 3 (0.6875). Each copy starts when its producer's segment ends.
    np.testing.assert_array_equal(s.segment_dispatch_s, [0.125, 0.3125, 0.5, 0.6875])
    np.testing.assert_array_equal(s.transfer_issue_s, [0.1875, 0.375, 0.5625])
    np.testing.assert_array_equal(s.transfer_start_s, [1.375, 4.125, 6.875])
    np.testing.assert_array_equal(s.transfer_end_s, [2.875, 5.625, 8.375])
    np.testing.assert_array_equal(s.segment_start_s, [0.125, 2.875, 5.625, 8.375])
    np.testing.assert_array_equal(s.segment_end_s, [1.375, 4.125, 6.875, 9.625])
    assert frag.step_time_s == 9.625
    assert (frag.num_segments, frag.num_transfers, frag.host_s) == (4, 3, 0.6875)
    assert list(frag.busy_s) == [2.5, 2.5]  # two launches and two ops each
    assert frag.bytes_moved == 300
    out = batched_simulator(g, inp)(np.array([[0, 0, 0, 0], [0, 1, 0, 1]]))
    for b, ref in enumerate((one, frag)):
        assert_same(ref, out, b)


def test_all_on_one_device_is_one_segment():
    # dispatch + launch + the pool's launch if all the ops' pool work reaches the
    # minimum + every op's cost + the unfused costs of the ops with no inputs (the only
    # ones whose inputs are not in the segment).
    rng = np.random.default_rng(2)
    for _ in range(10):
        g, inp = sim_cases.random_case(rng, host_costs=True)
        sources = np.diff(g.in_edges[0]) == 0
        for d in range(inp.num_devices):
            r = simulate(g, inp, np.full(g.num_ops, d))
            pool = (inp.pool_launch_s[d] if inp.op_pool_work[:, d].sum() >= inp.pool_min_work[d]
                    else 0.0)
            expect = (inp.dispatch_s[d] + inp.launch_s[d] + pool
                      + inp.op_time_s[:, d].sum() + inp.op_unfused_s[sources, d].sum())
            assert r.step_time_s == pytest.approx(expect, rel=1e-12)
            assert (r.num_segments, r.num_transfers, r.bytes_moved) == (1, 0, 0)
            assert r.host_s == inp.dispatch_s[d]


def test_segment_waits_for_a_late_input_of_its_last_op():
    # Ops 1..3 form one segment on device 1; only its last op reads op 0 (10 s on device
    # 0, then 0.5 s + 1 s to copy). Fused, the whole segment starts when the copy lands,
    # even op 1, which reads nothing.
    g = make_graph([0, 1, 2], [3, 2, 3], m=4, edge_bytes=[100.0] * 3, out_bytes=[0] * 4)
    inp = simple_inputs(4, 2)
    t = inp.op_time_s.copy()
    t[0, 0] = 10.0
    inp = inp._replace(op_time_s=t)
    r = simulate(g, inp, [0, 1, 1, 1], schedule=True)
    s = r.schedule
    np.testing.assert_array_equal(s.segment_start_s, [0.0, 11.5])
    np.testing.assert_array_equal(s.segment_end_s, [10.0, 14.5])
    assert s.op_start_s[1] == 11.5
    assert r.step_time_s == 14.5
    assert batched_simulator(g, inp)(np.array([[0, 1, 1, 1]])).step_time_s[0] == 14.5


def test_second_consumer_on_a_device_reuses_the_copy():
    # Ops 1 and 3 (device 1, two segments) both read op 0's output: one device_put, paid
    # once (0.25 s of host time), made for op 1; op 3's segment waits for nothing more.
    g = make_graph([0, 0], [1, 3], m=4, edge_bytes=[100.0, 100.0], out_bytes=[0] * 4)
    inp = hosty_inputs(4, 2, dispatch=0.125, put=0.25)
    r = simulate(g, inp, [0, 1, 0, 1], schedule=True)
    s = r.schedule
    assert (r.num_transfers, r.bytes_moved) == (1, 100)
    assert list(s.transfer_op) == [0] and list(s.transfer_to) == [1]
    np.testing.assert_array_equal(s.segment_start_s, [0.125, 2.625, 1.125, 3.625])
    assert r.step_time_s == 4.625
    assert r.host_s == 4 * 0.125 + 0.25


def test_host_bound_placement_is_serialized_by_the_host():
    # Four independent 0.1 s ops on four devices: with no host costs they all run at once;
    # with a 1 s dispatch per segment call the host makes them one after another.
    g = make_graph([], [], m=4, out_bytes=[0] * 4)
    p = [0, 1, 2, 3]
    assert simulate(g, hosty_inputs(4, 4, op_time=0.1), p).step_time_s == 0.1
    inp = hosty_inputs(4, 4, op_time=0.1, dispatch=1.0)
    r = simulate(g, inp, p, schedule=True)
    np.testing.assert_array_equal(r.schedule.segment_start_s, [1.0, 2.0, 3.0, 4.0])
    assert r.step_time_s == pytest.approx(4.1)
    assert r.host_s == 4.0
    # On one device: one segment, one dispatch.
    assert simulate(g, inp, [2] * 4).step_time_s == pytest.approx(1.4)
    out = batched_simulator(g, inp)(np.array([p, [2] * 4]))
    np.testing.assert_allclose(out.step_time_s, [4.1, 1.4], rtol=RTOL)
    np.testing.assert_array_equal(out.host_s, [4.0, 1.0])


def test_zero_byte_tensor_costs_exactly_the_latency():
    g, inp = sim_cases.corner_cases()["zero_byte_tensors"]
    r = simulate(g, inp, [0, 1, 0])
    assert r.step_time_s == 1 + 0.5 + 1 + 0.5 + 1
    assert r.bytes_moved == 0
    assert len(simulate(g, inp, [0, 1, 0], schedule=True).schedule.transfer_op) == 2


def test_params_larger_than_memory_are_oom():
    g, inp = sim_cases.corner_cases()["fits_nowhere"]
    for p in ([0, 0], [0, 1], [1, 0], [1, 1]):
        r = simulate(g, inp, p)
        assert r.oom and r.oom_devices == (p[1],)
        assert r.peak_memory_bytes[p[1]] >= 5e9


def test_params_counted_once_per_device():
    # Ops 0 and 1 both read parameter 0 (100 bytes); op 2 reads parameter 1.
    g = make_graph([], [], m=3, out_bytes=[0, 0, 0],
                   params=([100.0, 7.0], [(0, 0), (1, 0), (2, 1)]))
    inp = simple_inputs(3, 2)
    assert list(simulate(g, inp, [0, 0, 0]).peak_memory_bytes) == [107, 0]
    assert list(simulate(g, inp, [0, 1, 1]).peak_memory_bytes) == [100, 107]


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
    assert r2.step_time_s == 1 + 0.5 + 3.5 + 3  # one segment of three ops after it
    out = batched_simulator(g, inp)(np.array([[0, 1, 1, 2], [0, 1, 1, 1]]))
    np.testing.assert_array_equal(out.bytes_moved, [350, 350])
    np.testing.assert_array_equal(out.step_time_s, [r.step_time_s, 8.0])


def test_transfers_on_one_link_queue():
    # Ops 0 and 1 form one segment on device 0 (ends at 2); ops 2 and 3 read one each
    # over the same link (500 bytes: 0.5 s latency + 5 s of bytes): the second copy
    # waits for the first one's bytes (the link is busy 2..7), not for its latency; it
    # arrives at 7 + 0.5 + 5 = 12.5, and the segment of ops 2 and 3 ends at 14.5.
    g = make_graph([0, 1], [2, 3], m=4, edge_bytes=[500.0, 500.0], out_bytes=[0] * 4)
    inp = simple_inputs(4, 2)
    r = simulate(g, inp, [0, 0, 1, 1], schedule=True)
    s = r.schedule
    np.testing.assert_allclose(s.transfer_start_s, [2.0, 7.0])
    np.testing.assert_allclose(s.transfer_end_s, [7.5, 12.5])
    assert r.step_time_s == 14.5
    assert batched_simulator(g, inp)(np.array([[0, 0, 1, 1]])).step_time_s[0] == 14.5


def test_exclusive_group_runs_one_segment_at_a_time():
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


# ---------------------------------------------------------------- invariants
def test_unused_extra_device_changes_nothing():
    rng = np.random.default_rng(3)
    g, inp = sim_cases.random_case(rng, max_devices=4, host_costs=True)
    d = inp.num_devices
    col = rng.uniform(0, 1, (g.num_ops, 1))
    extra = make_sim_inputs(
        np.concatenate([inp.op_time_s, col], axis=1),
        np.pad(inp.latency_s, ((0, 1), (0, 1)), constant_values=1.0),
        np.pad(inp.bandwidth_bytes_per_s, ((0, 1), (0, 1)), constant_values=10.0),
        np.append(inp.memory_bytes, 1.0), np.append(inp.exclusive_group, d),
        np.append(inp.launch_s, 1.0), np.append(inp.dispatch_s, 1.0),
        np.pad(inp.put_s, ((0, 1), (0, 1)), constant_values=1.0),
        np.concatenate([inp.op_pool_work, col], axis=1), np.append(inp.pool_min_work, 0.5),
        np.append(inp.pool_launch_s, 1.0), np.concatenate([inp.op_unfused_s, col], axis=1))
    p = sim_cases.random_placements(rng, 8, g.num_ops, d)
    out_a = batched_simulator(g, inp)(p)
    out_b = batched_simulator(g, extra)(p)
    np.testing.assert_array_equal(out_a.step_time_s, out_b.step_time_s)
    np.testing.assert_array_equal(out_a.peak_memory_bytes, out_b.peak_memory_bytes[:, :d])
    assert np.all(out_b.peak_memory_bytes[:, d] == 0)
    for q in p:
        assert simulate(g, inp, q).step_time_s == simulate(g, extra, q).step_time_s


def test_step_time_at_least_lower_bound():
    rng = np.random.default_rng(4)
    for _ in range(40):
        g, inp = sim_cases.random_case(rng, host_costs=bool(rng.random() < 0.5))
        lb = lower_bound(g, inp)
        for p in sim_cases.random_placements(rng, 6, g.num_ops, inp.num_devices):
            assert simulate(g, inp, p).step_time_s >= lb * (1 - 1e-12)
        # The bound is tight for a single device.
        if inp.num_devices == 1:
            assert simulate(g, inp, np.zeros(g.num_ops, int)).step_time_s == pytest.approx(lb)


def test_schedule_is_consistent():
    rng = np.random.default_rng(7)
    g = sim_cases.random_graph(rng, "layered", 40)
    inp = sim_cases.random_inputs(rng, 40, 3, exclusive=True, host_costs=True)
    p = rng.integers(0, 3, 40)
    r = simulate(g, inp, p, schedule=True)
    s = r.schedule
    np.testing.assert_array_equal(s.op_device, p)
    # Segments: maximal runs of one device, in order, covering every op.
    np.testing.assert_array_equal(s.segment_first, [0] + list(s.segment_stop[:-1]))
    assert s.segment_stop[-1] == 40
    np.testing.assert_array_equal(s.segment_device, p[s.segment_first])
    assert np.all(s.segment_device[1:] != s.segment_device[:-1])
    seg = s.op_segment
    # A segment lasts its launch, its pool launch (if its ops' pool work reaches the
    # minimum), op costs and unfused costs; it starts
    # after its host call, and the host calls come in order.
    for k, (a, b) in enumerate(zip(s.segment_first, s.segment_stop, strict=True)):
        dev = s.segment_device[k]
        fused = [any(a <= j < i for j in g.src[g.dst == i]) for i in range(a, b)]
        pool = (inp.pool_launch_s[dev] if inp.op_pool_work[a:b, dev].sum()
                >= inp.pool_min_work[dev] else 0.0)
        work = (inp.launch_s[dev] + pool
                + inp.op_time_s[a:b, dev].sum()
                + inp.op_unfused_s[a:b, dev][~np.asarray(fused)].sum())
        assert s.segment_end_s[k] - s.segment_start_s[k] == pytest.approx(work, rel=1e-12)
    assert np.all(s.segment_start_s >= s.segment_dispatch_s)
    assert np.all(np.diff(s.segment_dispatch_s) >= 0)
    # Ops sit inside their segments, back to back, each for its cost (its unfused cost
    # included when none of its inputs comes from its segment).
    fused = np.array([any(s.segment_first[seg[i]] <= j < i for j in g.src[g.dst == i])
                      for i in range(40)])
    np.testing.assert_allclose(s.op_end_s - s.op_start_s,
                               inp.op_time_s[np.arange(40), p]
                               + np.where(fused, 0.0, inp.op_unfused_s[np.arange(40), p]))
    assert np.all(s.op_start_s >= s.segment_start_s[seg] - 1e-12)
    assert np.all(s.op_end_s <= s.segment_end_s[seg] + 1e-12)
    # Inputs: from an earlier segment of the device (done first) or from a copy.
    arrival = {(j, t): e for j, t, e in zip(s.transfer_op, s.transfer_to, s.transfer_end_s,
                                            strict=True)}
    for j, i in zip(g.src, g.dst, strict=True):
        if seg[j] == seg[i]:
            continue
        assert s.segment_start_s[seg[i]] >= s.segment_end_s[seg[j]] - 1e-12 \
            if p[j] == p[i] else s.segment_start_s[seg[i]] >= arrival[j, p[i]]
    # A copy starts after its call and its producer's segment; each link is a FIFO.
    assert np.all(s.transfer_start_s >= s.transfer_issue_s)
    assert np.all(s.transfer_start_s >= s.segment_end_s[seg[s.transfer_op]])
    for a in range(3):
        for b in range(3):
            on = (s.transfer_from == a) & (s.transfer_to == b)
            # the link is busy for the bytes of each copy; latencies overlap
            busy_until = s.transfer_end_s[on] - inp.latency_s[a, b]
            assert np.all(s.transfer_start_s[on][1:] >= busy_until[:-1] - 1e-12)
            assert np.all(np.diff(s.transfer_end_s[on]) >= 0)
    # An exclusive group runs one segment at a time.
    grp = inp.exclusive_group[s.segment_device]
    for x in set(grp.tolist()):
        ks = np.flatnonzero(grp == x)
        assert np.all(s.segment_start_s[ks][1:] >= s.segment_end_s[ks][:-1])
    assert r.step_time_s == max(s.segment_end_s.max(), s.transfer_end_s.max(initial=0),
                                r.host_s)
    assert r.bytes_moved == s.transfer_bytes.sum()
    assert (r.num_segments, r.num_transfers) == (len(s.segment_first), len(s.transfer_op))
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


# ---------------------------------------------------------------- compilation, modes
def test_batched_compiles_once_per_bucket():
    rng = np.random.default_rng(8)
    g, inp = sim_cases.random_case(rng, host_costs=True)
    f = batched_simulator(g, inp, memory=False)
    for _ in range(3):
        f(sim_cases.random_placements(rng, 5, g.num_ops, inp.num_devices))
    p = sim_cases.random_placements(rng, 7, g.num_ops, inp.num_devices)  # bucket 8 too
    out = f(p)
    assert f.num_traces == 1
    # memory=False skips the peaks, and gives the same times.
    assert np.all(np.isnan(out.peak_memory_bytes)) and not out.oom.any()
    for b, q in enumerate(p):
        ref = simulate(g, inp, q)
        np.testing.assert_allclose(out.step_time_s[b], ref.step_time_s, rtol=RTOL)
        np.testing.assert_allclose(out.busy_s[b], ref.busy_s, rtol=RTOL, atol=1e-12)
    f(sim_cases.random_placements(rng, 9, g.num_ops, inp.num_devices))
    assert f.num_traces == 2


def test_chunked_batches_give_the_results_of_one_run():
    # A batch larger than max_batch runs in chunks (the last one padded), compiled once.
    rng = np.random.default_rng(12)
    g = sim_cases.union_graph([sim_cases.random_graph(rng, s, 20) for s in sim_cases.SHAPES])
    inp = sim_cases.random_inputs(rng, g.num_ops, 3, exclusive=True, host_costs=True)
    p = sim_cases.random_placements(rng, 11, g.num_ops, 3)
    peak = batched_simulator(g, inp)(p).peak_memory_bytes.max(axis=1)
    inp = inp._replace(memory_bytes=np.full(3, np.median(peak)))  # some placements OOM
    for memory in (True, "oom"):
        whole = BatchedSimulator(g, inp, memory=memory)(p)
        f = BatchedSimulator(g, inp, memory=memory, max_batch=4)
        chunked = f(p)
        assert f.num_traces == 1
        for name in sim.BatchResult._fields:
            np.testing.assert_array_equal(getattr(chunked, name), getattr(whole, name),
                                          err_msg=name)
    assert whole.oom.any() and not whole.oom.all()
    with pytest.raises(ValueError, match="max_batch"):
        BatchedSimulator(g, inp, max_batch=0)


def test_peak_memory_exact_when_times_span_many_binades():
    # Sort keys hold the device only while a placement's times span under 2**61 bit
    # patterns (3 devices). A segment of 1e-300 s, then, in one exclusive group, one
    # that starts at 1e-300 s and lasts 1 s do not fit: the sweep groups those events
    # by device itself.
    g, inp, p = sim_cases.binade_span_case()
    f = batched_simulator(g, inp)
    fn, consts = f.traceable()
    with jax.enable_x64(True):
        _, _, _, (_, kf, _, dev, _) = jax.jit(fn)(consts, jnp.asarray(p, jnp.int32))
    packed = np.all((np.asarray(kf) >> np.uint64(62)) == np.asarray(dev), axis=0)
    assert not packed[0]  # the case this test is about
    check_agree(g, inp, p, f)


def test_batched_matches_reference_with_wide_fan_out():
    # Op 0 feeds 12 ops and parameter 0 is read by 10: maxima along chains of more than
    # 8 consumers (or uses) run by doubling in the batched simulator's memory pass.
    rng = np.random.default_rng(14)
    m = 16
    src = [0] * 12 + [3, 5, 7]
    dst = list(range(1, 13)) + [13, 14, 15]
    uses = [(i, 0) for i in range(10)] + [(12, 1), (13, 1)]
    g = make_graph(src, dst, m=m, out_bytes=rng.integers(1, 9, m) * 100.0,
                   is_output=np.arange(m) == 15, params=([400.0, 700.0], uses))
    inp = sim_cases.random_inputs(rng, m, 4, host_costs=True)
    st = BatchedSimulator(g, inp)._static
    assert len(st["rank_offsets"]) - 1 == 12 and len(st["use_offsets"]) - 1 == 10
    check_agree(g, inp, sim_cases.random_placements(rng, 16, m, 4))


def test_traceable_gives_the_call_results():
    # The pure function behind __call__ (what RL jits inside its update).
    rng = np.random.default_rng(10)
    g, inp = sim_cases.random_case(rng, host_costs=True)
    p = sim_cases.random_placements(rng, 8, g.num_ops, inp.num_devices)
    f = batched_simulator(g, inp)
    want = f(p)
    fn, consts = f.traceable()
    with jax.enable_x64(True):
        step, busy, moved, mem = jax.jit(fn)(consts, jnp.asarray(p, jnp.int32))
    np.testing.assert_allclose(step, want.step_time_s, rtol=1e-12)
    np.testing.assert_allclose(busy, want.busy_s, rtol=1e-12)
    np.testing.assert_allclose(moved, want.bytes_moved, rtol=1e-12)
    params, kf, ka, dev, size = (np.asarray(x) for x in mem)
    peak = params + _sweep_peaks(kf, ka, dev, size, inp.num_devices)
    np.testing.assert_allclose(peak, want.peak_memory_bytes, rtol=1e-12)


def test_public_names():
    for name in sim.__all__:
        assert hasattr(sim, name), name
    from simplace.sim.batched import batch_bucket
    assert [batch_bucket(b) for b in (1, 2, 3, 64, 65, 256, 257, 1000)] == [
        1, 2, 4, 64, 128, 256, 512, 1024]


def test_memory_oom_mode_flags_exactly():
    # memory="oom" screens placements with an upper bound of the peak (everything a
    # device ever holds) and simulates only those that might not fit: its OOM flags equal
    # the exact ones, and the peaks it does report are the exact peaks. The capacity is
    # the median bound, so that about half the placements take each path.
    rng = np.random.default_rng(12)
    g = sim_cases.union_graph([sim_cases.random_graph(rng, s, 12)
                               for s in sim_cases.SHAPES[:3]])
    inp = sim_cases.random_inputs(rng, g.num_ops, 3, host_costs=True)
    p = np.concatenate([sim_cases.random_placements(rng, 12, g.num_ops, 3),
                        sim_cases.long_run_placements(rng, 4, g.num_ops, 3)])
    bounds = []
    for q in p:
        s = simulate(g, inp, q, schedule=True).schedule
        held = np.bincount(q, weights=g.out_bytes, minlength=3)
        held += np.bincount(s.transfer_to, weights=s.transfer_bytes, minlength=3)
        held += np.bincount(q[g.param_op], weights=g.param_sizes[g.param_index], minlength=3)
        bounds.append(held.max())
    inp = inp._replace(memory_bytes=np.full(3, float(np.median(bounds))))
    fast = batched_simulator(g, inp, memory="oom")(p)
    refs = [simulate(g, inp, q) for q in p]
    np.testing.assert_array_equal(fast.oom, [r.oom for r in refs])
    np.testing.assert_allclose(fast.step_time_s, [r.step_time_s for r in refs], rtol=RTOL)
    rows = ~np.isnan(fast.peak_memory_bytes).any(axis=1)
    np.testing.assert_allclose(fast.peak_memory_bytes[rows],
                               [r.peak_memory_bytes for r, k in zip(refs, rows, strict=True)
                                if k], rtol=RTOL)
    assert all(rows[b] for b, r in enumerate(refs) if r.oom)  # every OOM simulated
    assert 0 < rows.sum() < len(p)  # both paths ran
    assert any(r.oom for r in refs) and not all(r.oom for r in refs)
    with pytest.raises(ValueError, match="memory must be"):
        batched_simulator(g, inp, memory="peak")


def test_fused_elementwise_chain_costs_about_its_producer():
    # A matmul and three elementwise ops that read it in a chain, on one device of a
    # machine whose elementwise ops fuse (a quarter of their bytes, no per-op cost) but
    # cost 5 us when they start a segment's data flow (no in-segment input).
    from simplace.cost_model import CostModel, Device
    from simplace.graph import OpGraph

    m = 4
    g = OpGraph(op=["dot_general", "add", "tanh", "mul"], name_path=[f"n{i}" for i in range(m)],
                flops=np.array([2e9, 1e6, 1e6, 1e6]), bytes_accessed=np.array([3e6, 8e6, 8e6, 8e6]),
                out_bytes=np.full(m, 4e6), signature=[f"s{i}" for i in range(m)],
                src=np.array([0, 1, 2]), dst=np.array([1, 2, 3]), edge_bytes=np.full(3, 4e6))
    dev = dict(kind="gpu", memory_bytes=1e10, peak_flops_per_s=1e13,
               memory_bandwidth_bytes_per_s=1e12, overhead_s=2e-6, launch_s=10e-6,
               dispatch_s=20e-6, fused_bytes_fraction=0.25, unfused_overhead_s=5e-6,
               class_overhead_s={"elementwise": 0.0},
               efficiency={c: 1.0 for c in ("matmul", "conv", "elementwise", "reduction",
                                             "data_movement", "control")})
    cm = CostModel.from_devices("fusing", [Device(name="gpu:0", **dev),
                                           Device(name="gpu:1", **dev)], 1e-6, 1e11)
    producer = 2e-6 + 2e9 / 1e13  # the matmul's per-op cost + its flops: 202 us
    chain = 3 * 0.25 * 8e6 / 1e12  # each elementwise op: a quarter of its bytes, 2 us
    one = simulate(g, cm, [0, 0, 0, 0])
    assert one.num_segments == 1
    assert one.step_time_s == pytest.approx(20e-6 + 10e-6 + producer + chain)
    assert (one.step_time_s - 30e-6 - producer) < 0.05 * producer  # the chain adds ~3%
    # Cut after the matmul: the chain starts a segment of its own and its first op
    # cannot fuse into an in-segment producer (+5 us), besides the copy, launch, dispatch.
    cut = simulate(g, cm, [0, 1, 1, 1])
    assert cut.num_segments == 2
    assert cut.step_time_s > one.step_time_s + 5e-6 + 10e-6
    np.testing.assert_allclose(batched_simulator(g, cm)(np.array([[0, 0, 0, 0], [0, 1, 1, 1]]))
                               .step_time_s, [one.step_time_s, cut.step_time_s], rtol=1e-9)

"""lower_bound under segment semantics: launches, dispatches, per-op launches and unfused
ops are part of every step, so the bound counts the least of them any placement pays."""

import itertools

import numpy as np
import pytest

import simplace
from simplace import groups as G
from simplace import zoo
from simplace.sim import critical_path_s, lower_bound, make_sim_inputs, sim_inputs, simulate
from simplace.sim.bounds import (
    _pool_launch_lb,
    chain_bound_s,
    chain_tables,
    tail_table,
    window_bound_s,
    work_bound_s,
)
from tests import sim_cases


def machine(t, *, launch, dispatch, group=None, put=0.0, pool=None, unfused=None):
    """``pool``: (op_pool_work, pool_min_work, pool_launch_s), or None for no pool."""
    t = np.asarray(t, dtype=float)
    d = t.shape[1]
    return make_sim_inputs(t, np.zeros((d, d)), np.full((d, d), np.inf), np.full(d, 1e12),
                           group, launch, dispatch, np.full((d, d), put),
                           *(pool or (None, None, None)), unfused)


def best_step(g, inp):
    return min(simulate(g, inp, np.array(p)).step_time_s
               for p in itertools.product(range(inp.num_devices), repeat=g.num_ops))


def test_chain_bound_adds_dispatch_and_launch_per_segment():
    # Chain 0 -> 1 -> 2; device 0 runs each op in 1 s, device 1 in 2 s; free copies.
    g = sim_cases.make_graph([0, 1], [1, 2], m=3)
    inp = machine([[1.0, 2.0]] * 3, launch=[0.5, 0.1], dispatch=[0.25, 0.05])
    # The critical path of fastest ops plus the least dispatch and launch: 3 * 1 +
    # min(0.25 + 0.5, 0.05 + 0.1) = 3.15; work bound 0.05 + (3 + 0.1) / 2 groups = 1.6.
    assert old_chain_bound(g, inp) == pytest.approx(3.15)
    # But the cheap launch is device 1's, and switching to device 0 after it costs a
    # segment there: op 0 on device 1 ends >= 0.05 + 0.1 + 2 = 2.15, then op 1 on device
    # 0 starts a segment: 2.15 + 0.5 + 1 and op 2 ends >= 4.65. All on device 0 ends at
    # 0.25 + 0.5 + 3 = 3.75, the bound, and the best placement.
    assert lower_bound(g, inp) == pytest.approx(3.75)
    assert best_step(g, inp) == pytest.approx(3.75)


def test_work_bound_of_one_exclusive_group_is_tight():
    # 4 independent 1 s ops on two devices sharing compute: one group runs everything.
    g = sim_cases.make_graph([], [], m=4)
    inp = machine(np.ones((4, 2)), launch=[0.2, 0.3], dispatch=[0.1, 0.4], group=[0, 0])
    # work: min dispatch 0.1 + (4 + min launch 0.2) / 1 group = 4.3; critical path
    # 1 + min(0.1 + 0.2, 0.4 + 0.3) = 1.3.
    assert lower_bound(g, inp) == pytest.approx(4.3)
    # All on device 0 is one segment: dispatch 0.1, launch 0.2, ops 4.
    assert simulate(g, inp, np.zeros(4, int)).step_time_s == pytest.approx(4.3)
    assert best_step(g, inp) == pytest.approx(4.3)


def test_pool_launch_and_unfused_costs_count():
    # Op 0 has no inputs (never fuses: +0.5 s unfused on either device); op 1 alone has
    # the pool work of a worker thread (+0.7 s on device 0, +0.9 s on device 1).
    g = sim_cases.make_graph([0], [1], m=2)
    inp = machine(np.ones((2, 2)), launch=[0.0, 0.0], dispatch=[0.0, 0.0],
                  pool=([[0.0, 0.0], [1.0, 1.0]], [1.0, 1.0], [0.7, 0.9]),
                  unfused=[[0.5, 0.5], [0.5, 0.5]])
    # critical path (1 + 0.5) + 1 = 2.5; work (2.5 + 0 + max_i min_d pool launch 0.7) / 2
    # = 1.6. One device: 0.7 + 1.5 + 1 = 3.2, which is also the best placement.
    assert lower_bound(g, inp) == pytest.approx(2.5)
    one = machine(np.ones((2, 1)), launch=[0.0], dispatch=[0.0],
                  pool=([[0.0], [1.0]], [1.0], [0.7]), unfused=[[0.5], [0.5]])
    assert lower_bound(g, one) == pytest.approx(3.2)
    assert simulate(g, one, np.zeros(2, int)).step_time_s == pytest.approx(3.2)
    assert best_step(g, inp) >= lower_bound(g, inp)


def test_bound_is_valid_on_random_machines_and_tight_on_one_device():
    rng = np.random.default_rng(5)
    for k in range(60):
        g, inp = sim_cases.random_case(rng, max_ops=20, max_devices=4)
        m, d = g.num_ops, inp.num_devices
        scale = [0.0, 1e-3, 1.0][k % 3]  # none, small, or dominant host and launch costs
        inp = make_sim_inputs(
            *inp[:5], rng.uniform(0, scale, d), rng.uniform(0, scale, d),
            rng.uniform(0, scale, (d, d)),
            rng.integers(0, 3, (m, d)) * (rng.random((m, d)) < 0.5),
            rng.integers(1, 4, d), rng.uniform(0, scale, d),
            rng.uniform(0, scale, (m, d)) * (rng.random((m, d)) < 0.5))
        lb = lower_bound(g, inp)
        for p in sim_cases.random_placements(rng, 6, m, d):
            assert simulate(g, inp, p).step_time_s >= lb * (1 - 1e-12)
        if d == 1 and m:
            assert simulate(g, inp, np.zeros(m, int)).step_time_s == pytest.approx(lb)
    empty = sim_cases.make_graph([], [], m=0)
    assert lower_bound(empty, machine(np.zeros((0, 2)), launch=[1, 1], dispatch=[1, 1])) == 0


def test_work_bound_weighs_slow_groups_by_what_they_can_take():
    # 6 independent ops: 1 s each on a fast device, 10 s on a slow one (two groups).
    # Equal weights give 6 / 2 = 3 s; the best weights (10/11 on the fast group) give
    # sum_i min(10/11 * 1, 1/11 * 10) = 60/11 s, and the best placement (all on the fast
    # device) takes 6 s.
    g = sim_cases.make_graph([], [], m=6)
    inp = machine([[1.0, 10.0]] * 6, launch=[0.0, 0.0], dispatch=[0.0, 0.0])
    assert lower_bound(g, inp) == pytest.approx(60 / 11)
    assert best_step(g, inp) == pytest.approx(6.0)
    # Launches are weighted too: a 0.11 s launch on each device adds min(10/11, 1/11) *
    # 0.11 = 0.01 s.
    inp = machine([[1.0, 10.0]] * 6, launch=[0.11, 0.11], dispatch=[0.0, 0.0])
    assert work_bound_s(g, inp) == pytest.approx(60 / 11 + 0.01)
    # The busy windows do better here: no op runs before its segment's 0.11 s launch.
    assert lower_bound(g, inp) == pytest.approx(0.11 + 60 / 11)
    assert best_step(g, inp) == pytest.approx(6.11)


def test_bound_never_exceeds_the_best_placement_on_small_random_cases():
    # Exhaustive: every placement of up to 6 ops on up to 3 devices, with heterogeneous
    # op times (the weighted work bound matters there) and host and launch costs.
    rng = np.random.default_rng(11)
    for _ in range(25):
        g, inp = sim_cases.random_case(rng, max_ops=6, max_devices=3, host_costs=True)
        slow = rng.uniform(1.0, 20.0, inp.num_devices)  # some devices much slower
        inp = make_sim_inputs(inp.op_time_s * slow[None, :], *inp[1:])
        assert best_step(g, inp) >= lower_bound(g, inp) * (1 - 1e-12)


# ---------------------------------------------------------------- critical path with
# communication (chain_tables / chain_bound_s)

def old_chain_bound(g, inp):
    """The bound before communication counted: each op at its fastest device, free
    copies, plus the least first dispatch and launch."""
    no_inputs = np.diff(g.in_edges[0]) == 0
    t = inp.op_time_s + inp.op_unfused_s * no_inputs[:, None]
    return critical_path_s(g, t.min(axis=1)) + float((inp.dispatch_s + inp.launch_s).min())


def chain_tables_by_loops(g, inp):
    """``chain_tables`` written op by op, device by device, from its docstring."""
    m, d = inp.num_ops, inp.num_devices
    t, ol, uf = inp.op_time_s, _pool_launch_lb(inp), inp.op_unfused_s
    launch, dispatch, put = inp.launch_s, inp.dispatch_s, inp.put_s
    size = {}  # (producer, output) -> bytes: the largest edge carrying it
    for s, k, nb in zip(g.src.tolist(), g.edge_output.tolist(), g.edge_bytes.tolist(),
                        strict=True):
        size[s, k] = max(size.get((s, k), 0.0), nb)
    reads = {}  # (producer, consumer) -> the producer's outputs the consumer reads
    for s, c, k in zip(g.src.tolist(), g.dst.tolist(), g.edge_output.tolist(), strict=True):
        reads.setdefault((s, c), set()).add(k)
    end = np.zeros((m, d))
    call = np.zeros((m, d))
    for v in range(m):
        producers = sorted(u for (u, c) in reads if c == v)
        for dv in range(d):
            enter = launch[dv] + ol[v, dv] + t[v, dv]
            if not producers:
                call[v, dv] = dispatch[dv]
                end[v, dv] = dispatch[dv] + enter + uf[v, dv]
                continue
            same, new, calls = [], [], []
            for u in producers:
                nbytes = sum(size[u, k] for k in reads[u, v])
                s1 = end[u, dv] + t[u + 1:v + 1, dv].sum()
                s2 = max(end[u, dv], call[u, dv] + dispatch[dv]) + enter
                moved, after_min = np.inf, np.inf
                for du in range(d):
                    if du == dv:
                        continue
                    after = call[u, du] + put[du, dv] + dispatch[dv]
                    arrive = (max(end[u, du], call[u, du] + put[du, dv])
                              + inp.latency_s[du, dv]
                              + nbytes / inp.bandwidth_bytes_per_s[du, dv])
                    if inp.put_waits[du, dv]:
                        after = max(after, arrive + dispatch[dv])  # the host waited
                    moved = min(moved, max(arrive, after) + enter)
                    after_min = min(after_min, after)
                same.append(s1)
                new.append(min(s2, moved))
                calls.append(min(call[u, dv], after_min))
            call[v, dv] = max(dispatch[dv], max(calls))
            floor = call[v, dv] + enter
            fused = max(max(min(a, b) for a, b in zip(same, new, strict=True)), min(same), floor)
            alone = max(max(new), floor) + uf[v, dv]
            end[v, dv] = min(fused, alone)
    return end, call


def test_chain_bound_counts_copies_and_new_segments():
    # Chain 0 -> 1 -> 2 on two devices: ops 0 and 2 take 1 s on device 0 and 5 s on
    # device 1, op 1 the reverse. Each copy takes latency 2 s + 1000 bytes / 1000 B/s;
    # each segment a 0.5 s launch after a 0.25 s dispatch.
    g = sim_cases.make_graph([0, 1], [1, 2], m=3)
    inp = make_sim_inputs([[1.0, 5.0], [5.0, 1.0], [1.0, 5.0]], np.full((2, 2), 2.0),
                          np.full((2, 2), 1000.0), np.full(2, 1e12), None, [0.5, 0.5],
                          [0.25, 0.25])
    # Free copies: 1 + 1 + 1 plus one dispatch and launch, 3.75 s. With copies, by hand:
    # op 0 ends >= [1.75, 5.75] on devices [0, 1]. Op 1 on device 0: in op 0's segment,
    # 1.75 + 5 = 6.75; on device 1: op 0's copy arrives 1.75 + 3 = 4.75, then a launch
    # and op 1, 6.25. Op 2 on device 0: in op 1's segment 6.75 + 1 = 7.75, or op 1's
    # copy from device 1 at 6.25 + 3 + 0.5 + 1 = 10.75; on device 1: 6.25 + 5 = 11.25.
    end_s, call_s = chain_tables(g, inp)
    np.testing.assert_allclose(end_s, [[1.75, 5.75], [6.75, 6.25], [7.75, 11.25]])
    np.testing.assert_allclose(call_s, 0.25)
    assert old_chain_bound(g, inp) == pytest.approx(3.75)
    assert chain_bound_s(g, inp) == pytest.approx(7.75)
    # The work bound (0.25 + (3 + 0.5) / 2 = 2) is lower: lower_bound is the chain, and
    # all on device 0 reaches it (0.25 + 0.5 + 1 + 5 + 1).
    assert lower_bound(g, inp) == pytest.approx(7.75)
    assert best_step(g, inp) == pytest.approx(7.75)


def test_chain_bound_counts_host_calls_on_the_path():
    # 0 -> 1: op 0 is free on device 0, op 1 on device 1 (9 s elsewhere); copies take no
    # device time, but the host spends 1 s per segment call and 3 s per device_put.
    g = sim_cases.make_graph([0], [1], m=2)
    inp = make_sim_inputs([[0.0, 9.0], [9.0, 0.0]], np.zeros((2, 2)),
                          np.full((2, 2), np.inf), np.full(2, 1e12), None, None, [1.0, 1.0],
                          np.full((2, 2), 3.0))
    # Split: op 0's call (1), the put (3), op 1's call (1): op 1 starts at 5, not at 1.
    assert simulate(g, inp, np.array([0, 1])).step_time_s == pytest.approx(5.0)
    end_s, call_s = chain_tables(g, inp)
    np.testing.assert_allclose(call_s, [[1.0, 1.0], [1.0, 1.0]])
    np.testing.assert_allclose(end_s, [[1.0, 10.0], [10.0, 5.0]])
    assert old_chain_bound(g, inp) == pytest.approx(1.0)
    assert lower_bound(g, inp) == pytest.approx(5.0)
    assert best_step(g, inp) == pytest.approx(5.0)


def test_chain_bound_moves_each_tensor_at_its_size():
    # Op 0 has two outputs: output 0 (4000 bytes as op 2 reads it, though op 1's edge
    # claims 1000) and output 1 (2000 bytes); op 1 reads both. A put to op 1's device
    # carries each output once, at its largest edge size (as the simulators do): 6000
    # bytes at 1000 B/s.
    g = sim_cases.make_graph([0, 0, 0], [1, 1, 2], m=3, edge_bytes=[1000.0, 2000.0, 4000.0],
                             edge_output=[0, 1, 0])
    inp = make_sim_inputs([[0.0, 9.0], [9.0, 0.0], [0.0, 9.0]], np.zeros((2, 2)),
                          np.full((2, 2), 1000.0), np.full(2, 1e12))
    assert simulate(g, inp, np.array([0, 1, 0])).step_time_s == pytest.approx(6.0)
    assert chain_bound_s(g, inp) == pytest.approx(6.0)
    assert best_step(g, inp) == pytest.approx(6.0)


def test_chain_tables_match_the_loops_and_bound_every_op_of_every_schedule():
    # The proof, op by op: end_s[i, p[i]] is at most op i's end in p's schedule (its
    # virtual end: ops back to back after the launch), call_s[i, p[i]] at most its
    # segment's call and tail_s[i, p[i]] at most the step less its end, for every op of
    # every placement tried. Ties, zero op times,
    # exclusive groups, several outputs per op and host costs all occur.
    rng = np.random.default_rng(21)
    for k in range(80):
        g, inp = sim_cases.random_case(rng, max_ops=18, max_devices=4,
                                       host_costs=bool(k % 2))
        end_s, call_s = chain_tables(g, inp)
        tail_s = tail_table(g, inp)
        want_end, want_call = chain_tables_by_loops(g, inp)
        np.testing.assert_allclose(end_s, want_end, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(call_s, want_call, rtol=1e-12, atol=1e-15)
        ops = np.arange(g.num_ops)
        for p in sim_cases.random_placements(rng, 12, g.num_ops, inp.num_devices):
            res = simulate(g, inp, p, schedule=True)
            s = res.schedule
            slack = 1e-12 * max(1.0, res.step_time_s)
            assert np.all(end_s[ops, p] <= s.op_end_s + slack)
            assert np.all(call_s[ops, p] <= s.segment_dispatch_s[s.op_segment] + slack)
            assert np.all(tail_s[ops, p] <= res.step_time_s - s.op_end_s + slack)


def test_chain_bound_is_valid_and_never_below_the_free_copy_chain():
    rng = np.random.default_rng(8)
    for k in range(60):
        g, inp = sim_cases.random_case(rng, max_ops=30, max_devices=5,
                                       host_costs=bool(k % 3))
        chain = chain_bound_s(g, inp)
        assert chain >= old_chain_bound(g, inp) * (1 - 1e-12)
        assert lower_bound(g, inp) >= chain
        for p in sim_cases.random_placements(rng, 10, g.num_ops, inp.num_devices):
            assert simulate(g, inp, p).step_time_s >= chain * (1 - 1e-12)


def test_bound_is_exact_on_small_cases_it_should_be_and_valid_on_all():
    # Exhaustive over all placements: the bound never exceeds the best step, and where
    # it binds (it equals the best), the chain or the work bound is tight.
    rng = np.random.default_rng(17)
    tight = 0
    for _ in range(30):
        g, inp = sim_cases.random_case(rng, max_ops=6, max_devices=3, host_costs=True)
        best = best_step(g, inp)
        lb = lower_bound(g, inp)
        assert best >= lb * (1 - 1e-12)
        tight += best <= lb * (1 + 1e-9)
    assert tight >= 5  # not vacuous: the bound is often the optimum on small cases


def test_window_bound_counts_work_that_can_run_neither_early_nor_late():
    # 0 -> {1, 2, 3, 4} -> 5, every op 1 s on either of two devices, free copies and
    # calls. Chain 3 s, work 6 / 2 = 3 s; but ops 1-4 start no earlier than 1 s (after op
    # 0) and end no later than 1 s before the step (op 5 follows): 1 + 1 + 4 / 2 = 4 s.
    g = sim_cases.make_graph([0, 0, 0, 0, 1, 2, 3, 4], [1, 2, 3, 4, 5, 5, 5, 5], m=6)
    inp = make_sim_inputs(np.ones((6, 2)), np.zeros((2, 2)), np.full((2, 2), np.inf),
                          np.full(2, 1e12))
    assert chain_bound_s(g, inp) == pytest.approx(3.0)
    assert work_bound_s(g, inp) == pytest.approx(3.0)
    np.testing.assert_allclose(tail_table(g, inp), [[2, 2]] + [[1, 1]] * 4 + [[0, 0]])
    assert window_bound_s(g, inp) == pytest.approx(4.0)
    assert lower_bound(g, inp) == pytest.approx(4.0)
    # Reached: op 0 alone, ops 1-2 on the other device while 3-4 run after op 0, op 5.
    assert simulate(g, inp, np.array([0, 1, 1, 0, 0, 1])).step_time_s == pytest.approx(4.0)
    assert best_step(g, inp) == pytest.approx(4.0)


def test_window_bound_is_valid_on_random_machines():
    rng = np.random.default_rng(29)
    for k in range(60):
        g, inp = sim_cases.random_case(rng, max_ops=30, max_devices=5,
                                       host_costs=bool(k % 2))
        window = window_bound_s(g, inp)
        assert lower_bound(g, inp) >= window
        for p in sim_cases.random_placements(rng, 10, g.num_ops, inp.num_devices):
            assert simulate(g, inp, p).step_time_s >= window * (1 - 1e-12)


def zoo_graph(name):
    fn, args = zoo.get(name, training=True, small=True)
    return simplace.trace(fn, *args, name=name)


@pytest.mark.parametrize("name", ["mlp", "tiny_cnn", "rnnlm"])
def test_bound_below_every_placement_of_zoo_graphs(name):
    graph = zoo_graph(name)
    rng = np.random.default_rng(3)
    for machine in ("cpu_vm2core_x4", "cpu_h100x4_nvlink", "haswell_k40x4"):
        cm = simplace.CostModel.load(machine)
        inp = sim_inputs(graph, cm)
        d = inp.num_devices
        lb = lower_bound(graph, cm)
        assert chain_bound_s(graph, cm) >= old_chain_bound(graph, inp) * (1 - 1e-12)
        end_s, _ = chain_tables(graph, inp)
        tail_s = tail_table(graph, inp)
        fastest = inp.op_time_s.argmin(axis=1).astype(np.int32)
        tries = [*sim_cases.random_placements(rng, 8, graph.num_ops, d), fastest]
        for k in range(2, 5):  # contiguous ranges on random devices (few copies)
            ranges = G.target_count(graph, k * d)
            tries.append(G.expand(ranges, rng.integers(0, d, ranges.max() + 1)))
        for p in tries:
            sched = simulate(graph, inp, p, schedule=True)
            assert sched.step_time_s >= lb * (1 - 1e-12), (machine, p)
            ops = np.arange(graph.num_ops)
            op_end = sched.schedule.op_end_s
            assert np.all(end_s[ops, p] <= op_end * (1 + 1e-12))
            assert np.all(tail_s[ops, p] <= (sched.step_time_s - op_end) + 1e-12 * lb)

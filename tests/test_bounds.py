"""lower_bound under segment semantics: launches, dispatches, per-op launches and unfused
ops are part of every step, so the bound counts the least of them any placement pays."""

import itertools

import numpy as np
import pytest

from simplace.sim import lower_bound, make_sim_inputs, simulate
from tests import sim_cases


def machine(t, *, launch, dispatch, group=None, put=0.0, op_launch=None, unfused=None):
    t = np.asarray(t, dtype=float)
    d = t.shape[1]
    return make_sim_inputs(t, np.zeros((d, d)), np.full((d, d), np.inf), np.full(d, 1e12),
                           group, launch, dispatch, np.full((d, d), put), op_launch, unfused)


def best_step(g, inp):
    return min(simulate(g, inp, np.array(p)).step_time_s
               for p in itertools.product(range(inp.num_devices), repeat=g.num_ops))


def test_chain_bound_adds_one_dispatch_and_launch():
    # Chain 0 -> 1 -> 2; device 0 runs each op in 1 s, device 1 in 2 s.
    g = sim_cases.make_graph([0, 1], [1, 2], m=3)
    inp = machine([[1.0, 2.0]] * 3, launch=[0.5, 0.1], dispatch=[0.25, 0.05])
    # critical path 3 * 1 + min(0.25 + 0.5, 0.05 + 0.1) = 3.15; work bound
    # 0.05 + (3 + 0.1) / 2 groups = 1.6. (Ops alone, the old bound, gave 3.)
    assert lower_bound(g, inp) == pytest.approx(3.15)
    # The best placement: all on device 0, 0.25 + 0.5 + 3 = 3.75 >= 3.15.
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


def test_op_launch_and_unfused_costs_count():
    # Op 0 has no inputs (never fuses: +0.5 s unfused on either device); op 1 needs a
    # thread pool (+0.7 s on device 0, +0.9 s on device 1).
    g = sim_cases.make_graph([0], [1], m=2)
    inp = machine(np.ones((2, 2)), launch=[0.0, 0.0], dispatch=[0.0, 0.0],
                  op_launch=[[0.0, 0.0], [0.7, 0.9]], unfused=[[0.5, 0.5], [0.5, 0.5]])
    # critical path (1 + 0.5) + 1 = 2.5; work (2.5 + 0 + max_i min_d op_launch 0.7) / 2
    # = 1.6. One device: 0.7 + 1.5 + 1 = 3.2, which is also the best placement.
    assert lower_bound(g, inp) == pytest.approx(2.5)
    one = machine(np.ones((2, 1)), launch=[0.0], dispatch=[0.0], op_launch=[[0.0], [0.7]],
                  unfused=[[0.5], [0.5]])
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
            rng.uniform(0, scale, (m, d)) * (rng.random((m, d)) < 0.3),
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
    assert lower_bound(g, inp) == pytest.approx(60 / 11 + 0.01)
    assert best_step(g, inp) >= lower_bound(g, inp)


def test_bound_never_exceeds_the_best_placement_on_small_random_cases():
    # Exhaustive: every placement of up to 6 ops on up to 3 devices, with heterogeneous
    # op times (the weighted work bound matters there) and host and launch costs.
    rng = np.random.default_rng(11)
    for _ in range(25):
        g, inp = sim_cases.random_case(rng, max_ops=6, max_devices=3, host_costs=True)
        slow = rng.uniform(1.0, 20.0, inp.num_devices)  # some devices much slower
        inp = make_sim_inputs(inp.op_time_s * slow[None, :], *inp[1:])
        assert best_step(g, inp) >= lower_bound(g, inp) * (1 - 1e-12)

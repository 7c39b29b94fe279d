"""The optimize front end, and invariants every registered method must keep."""

import dataclasses

import numpy as np
import pytest

import simplace
from simplace import SimplaceError, zoo
from simplace.placers import compare, methods, optimize
from tests.placer_checks import check_result

FAST_METHODS = [m for m in methods() if m not in ("local", "exact")]
# The rl-* methods train for thousands of episodes: tests/test_rl.py checks their
# invariants and determinism on smaller graphs.
HEURISTICS = [m for m in FAST_METHODS if not m.startswith("rl-")]


def test_unknown_method_lists_the_available_ones(nmt, k40x4):
    with pytest.raises(SimplaceError, match="Available: .*single"):
        optimize(nmt, k40x4, "no_such_method")


@pytest.mark.parametrize("method", HEURISTICS)
def test_every_method_keeps_the_invariants_and_is_deterministic(nmt, k40x4, method):
    a = optimize(nmt, k40x4, method, seed=3)
    check_result(nmt, k40x4, a, expect_fit=True)
    b = optimize(nmt, k40x4, method, seed=3)
    np.testing.assert_array_equal(a.placement, b.placement)


@pytest.mark.parametrize("method", FAST_METHODS)
def test_corner_cases(method):
    one_device = simplace.CostModel.load("haswell_k40x4").subset([1])
    fn, args = zoo.get("mlp", small=True)
    g = simplace.trace(fn, *args)
    r = optimize(g, one_device, method)
    check_result(g, one_device, r, expect_fit=True)
    assert set(r.placement.tolist()) == {0}


def test_single_says_when_nothing_fits(nmt, k40x4):
    tiny = tuple(dataclasses.replace(d, memory_bytes=1.0) for d in k40x4.devices)
    cm = dataclasses.replace(k40x4, devices=tiny)
    r = optimize(nmt, cm, "single")
    check_result(nmt, cm, r, expect_fit=False)
    assert "fits on no single device" in r.info["note"]


def test_single_tries_the_same_devices_with_or_without_the_compiled_simulator(
        nmt, k40x4, monkeypatch):
    # the fastest device cannot hold the model, the next can: two trials either way
    from simplace.placers import context
    from simplace.placers.context import PlacerContext
    from simplace.placers.single import single_device_candidates, single_device_trials

    order = single_device_candidates(PlacerContext(nmt, k40x4))
    need = simplace.simulate(nmt, k40x4, np.full(nmt.num_ops, order[0])).peak_memory_bytes
    devs = tuple(dataclasses.replace(d, memory_bytes=float(need[order[0]]) / 2)
                 if i == order[0] else d for i, d in enumerate(k40x4.devices))
    cm = dataclasses.replace(k40x4, devices=devs)
    # the batched path whether or not this worker has loaded the simulator yet
    monkeypatch.setattr(context, "batched_pays", lambda m, k: True)
    compiled = single_device_trials(PlacerContext(nmt, cm))
    monkeypatch.setattr(context, "batched_pays", lambda m, k: False)  # a fresh install
    reference = single_device_trials(PlacerContext(nmt, cm))
    assert [t["device"] for t in compiled] == [t["device"] for t in reference] == order[:2]
    assert [t["oom"] for t in compiled] == [t["oom"] for t in reference] == [True, False]
    np.testing.assert_allclose([t["step_time_s"] for t in compiled],
                               [t["step_time_s"] for t in reference], rtol=1e-12)


def test_the_batched_simulator_checks_where_it_costs_less_than_the_reference(monkeypatch):
    from simplace import kernels
    from simplace.placers.context import (
        BATCHED_LOAD_S,
        REFERENCE_S_PER_OP,
        batched_pays,
        simulate_each_s,
    )

    big = int(BATCHED_LOAD_S / REFERENCE_S_PER_OP) + 1  # ops x placements past the load
    monkeypatch.setattr(kernels, "cached", lambda name: True)
    monkeypatch.setattr(kernels, "loaded", lambda name: False)  # a fresh process
    assert not batched_pays(100, 3) and batched_pays(big, 1) and batched_pays((big + 1) // 2, 2)
    # what a list scheduler's runs leave for its final checks: the cheaper way's time
    assert simulate_each_s(100, 3) == pytest.approx(300 * REFERENCE_S_PER_OP)
    assert simulate_each_s(big, 2) == BATCHED_LOAD_S
    monkeypatch.setattr(kernels, "loaded", lambda name: True)  # loaded: always
    assert batched_pays(100, 1) and simulate_each_s(big, 2) == 0.0
    monkeypatch.setattr(kernels, "cached", lambda name: False)  # compiling: never
    assert not batched_pays(big, 10)
    assert simulate_each_s(big, 2) == pytest.approx(2 * big * REFERENCE_S_PER_OP)


def test_compare_runs_each_method_once(nmt, k40x4):
    results = compare(nmt, k40x4, ["single", *FAST_METHODS[:2]])
    assert [r.method for r in results][0] == "single"
    for r in results:
        check_result(nmt, k40x4, r)


def test_compare_shares_its_budget_and_searches_start_from_the_best_so_far(nmt, k40x4):
    messages = []
    results = compare(nmt, k40x4, ["local", "single", "heft"], budget_s=4.0,
                      progress=messages.append)
    # Fast methods first in the order given, the search last, starting from them all.
    assert [r.method for r in results] == ["single", "heft", "local"]
    assert results[-1].step_time_s <= min(r.step_time_s for r in results[:-1]) * (1 + 1e-9)
    assert any("running local (" in m and "s budget)" in m for m in messages)
    # A search left with too little of the shared budget is skipped and says so.
    messages.clear()
    results = compare(nmt, k40x4, ["single", "local"], budget_s=0.5,
                      progress=messages.append)
    assert [r.method for r in results] == ["single"]
    assert any("local skipped" in m and "--budget-s" in m for m in messages)
    with pytest.raises(SimplaceError, match="Unknown placement method"):
        compare(nmt, k40x4, ["single", "nope"])


def test_compare_takes_prior_results_as_starts_without_running_them_again(nmt, k40x4):
    # expert's placement is not single's (heft's is, on this graph), so its score
    # among local's starts shows that local started from it.
    expert = simplace.optimize(nmt, k40x4, "expert")
    single = simplace.optimize(nmt, k40x4, "single")
    assert expert.step_time_s > 2 * single.step_time_s
    messages = []
    results = compare(nmt, k40x4, ["single", "expert", "local"], budget_s=4.0,
                      progress=messages.append, prior=[expert])
    assert [r.method for r in results] == ["expert", "single", "local"]
    assert results[0] is expert
    assert not any("running expert" in m for m in messages)
    starts = results[-1].info["starts"]
    assert starts[0]["start"] == "placement[0]"
    assert starts[0]["score"] == pytest.approx(expert.step_time_s, rel=1e-9)
    assert results[-1].step_time_s <= single.step_time_s * (1 + 1e-9)


def test_all_returns_the_best_fitting_result(nmt, k40x4):
    messages = []
    best = simplace.optimize(nmt, k40x4, "all", budget_s=2.0, progress=messages.append)
    check_result(nmt, k40x4, best, expect_fit=True)
    compared = best.info["compared"]
    # The cheapest run first; under 2 s a later one may be skipped, said through progress
    # (under load even expert: single's pace scales the estimates up; and local, when the
    # fast methods' overrun leaves it under a second), so only single's is sure to be there.
    ran = {row["method"] for row in compared}
    assert "single" in ran
    for m in ("expert", "local"):
        assert m in ran or any(msg.startswith(f"{m} skipped") for msg in messages), messages
    fitting = [row["step_time_s"] for row in compared if not row["oom"]]
    assert best.step_time_s == min(fitting)


def test_single_takes_the_device_with_the_fastest_whole_graph_segment():
    from simplace.sim import make_sim_inputs, simulate
    from tests.sim_cases import make_graph

    # 5 ops in a chain. Device 0 (a CPU): 10 us per op, launch 2 us, dispatch 9 us;
    # device 1 (a GPU): 1 us per op, launch 35 us, dispatch 38 us. Alone, the CPU's one
    # segment takes 9 + 2 + 5 * 10 = 61 us, the GPU's 38 + 35 + 5 * 1 = 78 us: the CPU
    # is the faster single device although every op is faster on the GPU.
    g = make_graph(range(4), range(1, 5), m=5)
    inp = make_sim_inputs(np.tile([10e-6, 1e-6], (5, 1)), np.zeros((2, 2)),
                          np.full((2, 2), 1e9), np.full(2, 1e12), None, [2e-6, 35e-6],
                          [9e-6, 38e-6])
    res = optimize(g, inp, "single")
    assert res.placement.tolist() == [0] * 5
    assert res.step_time_s == pytest.approx(61e-6)
    assert simulate(g, inp, np.ones(5, int)).step_time_s == pytest.approx(78e-6)
    # Random machines with launch, dispatch and put costs: the best single device.
    from tests.sim_cases import random_case

    rng = np.random.default_rng(2)
    for _ in range(20):
        g, inp = random_case(rng, max_ops=20, max_devices=4)
        d = inp.num_devices
        inp = make_sim_inputs(*inp[:5], rng.uniform(0, 5e-3, d), rng.uniform(0, 5e-3, d))
        res = optimize(g, inp, "single")
        assert res.step_time_s == pytest.approx(min(
            simulate(g, inp, np.full(g.num_ops, k)).step_time_s for k in range(d)))


def test_the_final_reference_simulation_counts_against_the_budget(nmt):
    import types

    from simplace.placers.front import FINAL_SIMULATION_S_PER_OP, _search_budget

    assert _search_budget(nmt, None) is None
    # the method gets the budget less the final simulation's expected seconds...
    assert _search_budget(nmt, 2.0) == pytest.approx(
        2.0 - FINAL_SIMULATION_S_PER_OP * nmt.num_ops)
    assert _search_budget(nmt, 2.0) < 2.0
    # ...but never less than half of it
    assert _search_budget(types.SimpleNamespace(num_ops=10**7), 2.0) == 1.0

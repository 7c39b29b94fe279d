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


@pytest.fixture(scope="module")
def nmt():
    fn, args = zoo.get("nmt_2layer", small=True)
    return simplace.trace(fn, *args, name="nmt_2layer")


@pytest.fixture(scope="module")
def k40x4():
    return simplace.CostModel.load("haswell_k40x4")


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


def test_compare_runs_each_method_once(nmt, k40x4):
    results = compare(nmt, k40x4, ["single", *FAST_METHODS[:2]])
    assert [r.method for r in results][0] == "single"
    for r in results:
        check_result(nmt, k40x4, r)


def test_all_returns_the_best_fitting_result(nmt, k40x4):
    best = simplace.optimize(nmt, k40x4, "all", budget_s=2.0)
    check_result(nmt, k40x4, best, expect_fit=True)
    compared = best.info["compared"]
    assert {row["method"] for row in compared} >= {"single", "expert", "heft"}
    fitting = [row["step_time_s"] for row in compared if not row["oom"]]
    assert best.step_time_s == min(fitting)

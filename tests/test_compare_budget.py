"""compare keeps its budget: fast methods run cheap first, each within a part of the fast
share, and one whose estimated cost does not fit is skipped and reported; list
schedulers and ideals stop when their budget is spent; local's own starts keep to their
time. No wall-clock assertions: clocks are faked, or the budget is asserted on what ran."""

import math
import time
import types

import numpy as np
import pytest

import simplace
import simplace.placers as placers
from simplace import zoo
from simplace.placers import compare, front, optimize, registry
from simplace.placers.registry import _METHODS, Cost, Method

# What compare's own checks need of a graph and a machine when optimize is faked.
_MACHINE = types.SimpleNamespace(num_devices=5)


def _graph(num_ops):
    return types.SimpleNamespace(num_ops=num_ops)


def _fake_optimize(clock, ran, cost_s):
    """An ``optimize`` that records (method, budget_s) and advances the fake clock by
    ``cost_s(method, budget_s)``."""

    def fake(graph, cost_model, method, *, budget_s=None, **kw):
        ran.append((method, budget_s))
        took = cost_s(method, budget_s)
        clock[0] += took
        return types.SimpleNamespace(method=method, oom=False, step_time_s=1.0,
                                     placement=np.zeros(graph.num_ops, np.int32),
                                     wall_s=took, info={"first_batch_s": 0.0})

    return fake


@pytest.fixture(autouse=True)
def first_calls(monkeypatch):
    """No method has run in this process yet, as far as estimates go (first-call costs
    such as the pretrained policy's loading count): the orders below do not depend on
    which tests ran before."""
    monkeypatch.setattr(registry, "_CALLED", set())


@pytest.fixture()
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(front.time, "perf_counter", lambda: now[0])
    return now


def test_fast_methods_run_cheap_first_each_in_a_part_of_the_fast_share(clock, monkeypatch):
    ran = []
    monkeypatch.setattr(front, "optimize", _fake_optimize(clock, ran, lambda m, b: 0.0))
    # On a small graph every fast method runs (each estimate fits), cheap ones first.
    fast = ["ideals", "heft", "m_sct", "single", "rl-pretrained", "metis", "expert"]
    compare(_graph(100), _MACHINE, fast, budget_s=10.0)
    # ideals is cheap on 100 ops: it runs before the pretrained policy, which compiles.
    assert [m for m, _ in ran] == ["single", "expert", "metis", "m_sct", "heft", "ideals",
                                   "rl-pretrained"]
    ran.clear()
    compare(_graph(6000), _MACHINE, fast, budget_s=1000.0)  # ideals: seconds here
    # the pretrained policy is the best start on big graphs: early, by its rank
    assert [m for m, _ in ran] == ["expert", "single", "rl-pretrained", "metis", "m_sct",
                                   "heft", "ideals"]
    ran.clear()
    compare(_graph(100), _MACHINE, fast, budget_s=10.0)
    # No search: the whole budget is the fast methods'; each takes no time here, so each
    # part is an equal share of what is left (at least its estimate).
    for k, (m, b) in enumerate(ran):
        assert b == pytest.approx(max(10.0 / (len(fast) - k), front.fast_cost_s(m, 100, 5)))


def test_a_fast_method_that_does_not_fit_the_fast_share_is_skipped_and_said(clock,
                                                                           monkeypatch):
    ran = []
    # Each fast method takes its estimate (ideals' grows as the square of the ops), the
    # search its whole part.
    monkeypatch.setattr(front, "optimize", _fake_optimize(
        clock, ran, lambda m, b: b if m == "local" else front.fast_cost_s(m, 40_000, 5)))
    said = []
    methods = ["single", "expert", "m_etf", "ideals", "local"]
    compare(_graph(40_000), _MACHINE, methods, budget_s=60.0, progress=said.append)
    names = [m for m, _ in ran]
    # 40k ops: ideals' first window alone would take minutes, more than the 24 s fast
    # share: skipped, named, and its time goes to local.
    assert "ideals" not in names
    assert names == ["single", "expert", "m_etf", "local"]
    skipped = [m for m in said if "skipped" in m]
    assert len(skipped) == 1 and skipped[0].startswith("ideals skipped: it takes about")
    assert "--budget-s" in skipped[0]
    fast_s = sum(front.fast_cost_s(m, 40_000, 5) for m in names[:-1])
    assert fast_s < 0.4 * 60.0
    assert dict(ran)["local"] == pytest.approx(60.0 - fast_s)
    assert clock[0] == pytest.approx(60.0)  # the whole kept the budget


def test_a_slow_method_that_ignores_its_budget_leaves_no_time_to_the_ones_after(
        clock, monkeypatch):
    """A fast method that overran the fast share (it takes no budget): the methods after
    it are skipped, said so, not run with a floor of time as before."""
    ran = []
    monkeypatch.setattr(front, "optimize", _fake_optimize(
        clock, ran, lambda m, b: 5.0 if m == "scotch" else 0.01))
    said = []
    compare(_graph(1000), _MACHINE, ["single", "scotch", "m_etf", "m_sct", "local"],
            budget_s=10.0, progress=said.append)
    assert [m for m, _ in ran] == ["single", "scotch", "local"]
    assert [m.split()[0] for m in said if "skipped" in m] == ["m_etf", "m_sct"]


def test_a_fake_slow_heuristic_is_skipped_under_a_short_budget_and_runs_under_a_long(
        monkeypatch):
    """A heuristic registered here, whose estimated cost is 100 s: under a 10 s budget
    compare does not start it (real methods, real graph); under a 1000 s budget it runs
    (its fake clock: it takes no time)."""
    calls = []

    def slow(ctx):
        calls.append(ctx.budget_s)
        return placers.PlacerOutput(np.zeros(ctx.graph.num_ops, np.int32))

    monkeypatch.setitem(_METHODS, "zz_slow", Method("zz_slow", slow, "heuristic", {},
                                                    cost=Cost(100.0, 0.0)))
    fn, args = zoo.get("mlp", small=True)
    g = simplace.trace(fn, *args)
    cm = simplace.CostModel.load("haswell_k40x4")
    said = []
    out = compare(g, cm, ["single", "expert", "zz_slow"], budget_s=10.0,
                  progress=said.append)
    assert [r.method for r in out] == ["single", "expert"] and not calls
    assert any(m.startswith("zz_slow skipped: it takes about 100") for m in said)
    out = compare(g, cm, ["single", "zz_slow"], budget_s=1000.0)
    assert [r.method for r in out] == ["single", "zz_slow"] and len(calls) == 1
    assert calls[0] >= 100.0  # at least its estimate


def test_the_pace_rescales_estimates_by_what_methods_without_a_budget_took(clock,
                                                                          monkeypatch):
    # single takes 3x its estimate: the machine is slow (or loaded) now, so m_sct's
    # estimate (under the 4 s fast share) times 3 no longer fits what is left.
    m, d = 20_000, 5
    single_s = front.fast_cost_s("single", m, d)
    assert front.fast_cost_s("m_sct", m, d) < 0.4 * 20.0 - 3 * single_s
    assert 3 * front.fast_cost_s("m_sct", m, d) > 0.4 * 20.0 - 3 * single_s
    ran = []
    monkeypatch.setattr(front, "optimize", _fake_optimize(
        clock, ran, lambda meth, b: 3 * single_s if meth == "single" else 0.0))
    said = []
    compare(_graph(m), _MACHINE, ["single", "m_sct", "local"], budget_s=20.0,
            progress=said.append)
    assert [x for x, _ in ran] == ["single", "local"]
    assert any(s.startswith("m_sct skipped") for s in said)
    pace = front._Pace()
    pace.add("single", 1.0, 100.0)
    assert pace.factor == front._PACE_BOUNDS[1]
    pace.add("m_etf", 1.0, 1e-6)  # anytime methods say nothing about the pace
    assert pace.factor == front._PACE_BOUNDS[1]
    pace.add("rl-pretrained", 1.0, 1e-6)  # nor do compiling ones
    assert pace.factor == front._PACE_BOUNDS[1]


# ---------------------------------------------------------------- the methods' own budgets
def test_a_list_scheduler_gives_up_a_run_under_way_once_its_budget_is_spent(nmt, k40x4):
    from simplace.placers._list_runs import Setup, blocks, earliest

    ctx = placers.PlacerContext(nmt, k40x4, budget_s=1000.0)
    s = Setup(ctx)
    units = blocks(s.work, 0)

    def choose(run, a, b, eligible):
        return earliest(run, a, b, eligible)[0]

    s.late = lambda: True  # the budget is spent from the start
    first = s.run(units, choose)
    assert first is not None and s.completed == 1  # the first run always completes
    assert s.run(units, choose) is None and s.stopped == 1
    out = s.finish([first])
    assert out.info["runs_stopped"] == 1 and "given up half way" in out.info["note_budget"]


def test_a_list_scheduler_budget_runs_from_the_call(nmt, k40x4, monkeypatch):
    # With no time left when it begins, a list scheduler completes its first run only.
    res = optimize(nmt, k40x4, "m_etf", budget_s=1e-9)
    assert len(res.info["runs"]) == 1 and res.info["runs_skipped"] >= 1
    full = optimize(nmt, k40x4, "m_etf")
    assert len(full.info["runs"]) > 1 and "runs_skipped" not in full.info


def test_enumerating_ideals_stops_at_the_deadline():
    from simplace.placers.ideals import _TimeUp, enumerate_ideals

    nb = 12
    edges = np.array([[i, i + 1] for i in range(nb - 1)])
    assert len(enumerate_ideals(nb, edges, 10**6, nb)[0]) == nb + 1
    with pytest.raises(_TimeUp):
        enumerate_ideals(nb, edges, 10**6, nb, deadline=time.perf_counter() - 1.0)
    assert enumerate_ideals(nb, edges, 10**6, nb, deadline=math.inf) is not None


# ---------------------------------------------------------------- local's starts
def test_local_does_not_rerun_single_when_given_a_one_device_placement():
    from simplace.placers.local import _start_list

    one = np.zeros(7, np.int32)
    two = np.array([0, 1, 0, 1, 0, 1, 0], np.int32)
    starts = _start_list(types.SimpleNamespace(options={"starts": [two, one]}))
    assert not any(isinstance(s, str) for s in starts)
    starts = _start_list(types.SimpleNamespace(options={"starts": [two]}))
    assert starts[-1] == "single"
    # Its default starts: by registered rank (the pretrained policy early, ideals last).
    starts = _start_list(types.SimpleNamespace(options={}))
    assert starts == sorted(starts, key=registry.fast_rank)
    assert starts.index("rl-pretrained") < starts.index("pipeline") < starts.index("m_etf")
    assert starts[-1] == "ideals"


def test_local_skips_a_start_whose_estimate_does_not_fit_its_starts_time(nmt, k40x4,
                                                                        monkeypatch):
    import dataclasses

    monkeypatch.setitem(_METHODS, "m_sct", dataclasses.replace(_METHODS["m_sct"],
                                                               cost=Cost(1000.0, 0.0)))
    res = optimize(nmt, k40x4, "local", budget_s=30.0, starts=["m_sct", "expert"],
                   max_evaluations=64, batch=8)
    rows = {r["start"]: r for r in res.info["starts"]}
    assert "takes about 1000" in rows["m_sct"]["error"]
    assert "error" not in rows["expert"] and "error" not in rows["single"]


def test_a_first_call_cost_is_paid_once_per_process(monkeypatch):
    """The pretrained policy's estimate carries its loading until it has run here."""
    cold = registry.fast_cost_s("rl-pretrained", 5000, 5)
    registry.note_called("rl-pretrained")
    warm = registry.fast_cost_s("rl-pretrained", 5000, 5)
    first = _METHODS["rl-pretrained"].cost.first_call_s
    assert first > 0 and cold - warm == pytest.approx(first)
    assert registry.fast_cost_s("single", 5000, 5) == pytest.approx(
        _METHODS["single"].cost.seconds(5000, 5))
    # an unregistered name gets the default estimate
    assert registry.fast_cost_s("nope", 10, 2) == pytest.approx(
        registry.DEFAULT_COST.seconds(10, 2))

"""The search session shared by local search and REINFORCE (``simplace.search``): best and
kept placements, stop reasons, one validation hook that may switch the cost model (a new
context, never a mutated one, and a result judged under the model it names), declared
options, stop requests, resumed and periodic checkpoints."""

import dataclasses
import time

import numpy as np
import pytest

from simplace.cost_model import Corrections, CostModel
from simplace.errors import OptionError, SimplaceError
from simplace.placers import PlacerContext, method_options, optimize
from simplace.rl import checkpoint as ckpt
from simplace.search import (
    OOM_PENALTY,
    SESSION_OPTIONS,
    SearchSession,
    clear_stop,
    request_stop,
    stop_requested,
)
from simplace.sim import lower_bound, simulate
from tests.test_local_exact import tiny_case


@pytest.fixture(autouse=True)
def _no_stale_stop():
    clear_stop()
    yield
    clear_stop()


@pytest.fixture(scope="module")
def case():
    return tiny_case(7, m=14, d=3)


def _slow_device0(cm: CostModel) -> CostModel:
    """``cm`` with drift corrections that make device 0 three times slower."""
    scale = np.ones(cm.num_devices)
    scale[0] = 3.0
    return cm.with_corrections(dataclasses.replace(Corrections.identity(cm.num_devices),
                                                   compute_scale=scale))


def test_session_keeps_the_best_and_top_k_and_switches_models():
    s = SearchSession("t", "model-a", top_k=2, hook=lambda step, cands, cm: None)
    assert s.offer(np.array([0, 1]), 2.0) and s.offer(np.array([1, 1]), 1.0)
    assert not s.offer(np.array([1, 0]), 1.0)  # a tie is not a new best
    s.offer(np.array([0, 0]), OOM_PENALTY + 0.5)  # OOM: behind everything that fits
    assert [sc for sc, _ in s.top.ranked()] == [1.0, 1.0]
    assert np.array_equal(s.best, [1, 1]) and s.best_score == 1.0
    seen = []

    def hook(step, cands, cm):
        seen.append((step, [c.tolist() for c in cands], cm))
        return "model-b"

    s.hook = hook
    # Under model b the placement on device 0 only is the fastest.
    new = s.validate(3, lambda cm, p: np.where(p.sum(axis=1) == 0, 0.5, 4.0))
    assert new == "model-b" and s.cost_model == "model-b"
    assert seen[0][0] == 3 and seen[0][2] == "model-a"
    assert s.best_score == 4.0 and s.validation == {"calls": 1, "corrections": 1}
    # the kept placements were re-scored, none was lost
    assert sorted(c for c, _ in s.top.ranked()) == [4.0, 4.0]


def test_stop_reasons_time_budget_after_the_first_batch_and_interrupts():
    s = SearchSession("t", None, budget_s=1e-6, t_begin=time.perf_counter() - 1.0)
    assert s.should_stop() is None  # the first batch is always built
    s.step_started()
    s.step_done()
    assert s.first_batch_s is not None and s.should_stop() == "time budget"
    free = SearchSession("t", None)  # no budget: never a time stop
    free.step_done()
    assert free.should_stop() is None
    request_stop()
    assert stop_requested() and free.should_stop() == "interrupted"
    assert free.finish("patience")["stop"] == "interrupted"  # the interrupt is kept
    with pytest.raises(OptionError, match="positive"):
        SearchSession("t", None, budget_s=float("nan"))
    with pytest.raises(OptionError, match="validate must be a callable"):
        SearchSession("t", None, hook=42)


def test_a_first_batch_past_the_whole_budget_is_said():
    said = []
    s = SearchSession("local", None, budget_s=0.5, t_begin=time.perf_counter() - 2.0,
                      progress=said.append)
    s.first_batch_ready()  # its compilation took 2 s of a 0.5 s budget
    assert s.over_budget and len(said) == 1
    assert "first batch" in said[0] and "past its 0.5 s budget" in said[0]
    assert s.should_stop() == "time budget"  # and it stops there
    assert s.finish()["first_batch_over_budget"] is True
    ok = SearchSession("local", None, budget_s=10.0, progress=said.append)
    ok.step_started()
    ok.step_done()
    assert not ok.over_budget and len(said) == 1
    assert ok.finish()["first_batch_over_budget"] is False


def test_compare_reports_a_search_that_overran_its_part(monkeypatch):
    import types

    import simplace.placers as placers

    clock = [0.0]
    monkeypatch.setattr(placers.front.time, "perf_counter", lambda: clock[0])

    def fake_optimize(graph, cost_model, method, *, budget_s=None, **kw):
        first = 12.0 if method == "local" else 0.0  # local compiles for 12 s
        clock[0] += first + budget_s
        return types.SimpleNamespace(method=method, oom=False, step_time_s=1.0,
                                     placement=np.zeros(3, np.int32),
                                     wall_s=first + budget_s, info={"first_batch_s": first})

    monkeypatch.setattr(placers.front, "optimize", fake_optimize)
    said = []
    placers.compare(types.SimpleNamespace(num_ops=3), types.SimpleNamespace(num_devices=2),
                    ["single", "local"], budget_s=10.0, progress=said.append)
    over = [m for m in said if m.startswith("local ran")]
    assert len(over) == 1 and "18.0 s of a 6.0 s part" in over[0]
    assert "first batch, compilation included, took 12.0 s" in over[0]


def test_local_without_a_budget_stops_when_it_converges(case):
    # The default budget is a cap, not a promise: a stalled search stops (patience)
    # instead of restarting until the cap (given a budget, it restarts to use it:
    # tests/test_local_exact.py).
    g, cm = case
    t0 = time.perf_counter()
    res = optimize(g, cm, "local", seed=0, starts=["single"], patience=3, batch=8)
    assert res.info["stop"] == "patience" and res.info["restarts"] == 0
    assert time.perf_counter() - t0 < 10.0  # far from the 30 s default budget


def test_unknown_options_are_refused_naming_the_valid_ones(case):
    g, cm = case
    with pytest.raises(OptionError, match=r"'batchsize'.*Valid options: .*\bbatch\b"):
        optimize(g, cm, "local", batchsize=8)
    with pytest.raises(OptionError, match="'callback'"):  # the old hook's name
        optimize(g, cm, "rl-gnn", episodes=16, callback=print)
    with pytest.raises(OptionError, match="takes no options"):
        optimize(g, cm, "single", budget=3)
    with pytest.raises(OptionError, match="'memroy'.*Valid options: .*fifo_links, .*memory"):
        optimize(g, cm, "heft", memroy="off")
    assert set(SESSION_OPTIONS) <= set(method_options("local"))
    assert set(SESSION_OPTIONS) <= set(method_options("rl-seq2seq"))
    assert "layers" in method_options("rl-gnn") and "layers" not in method_options(
        "rl-seq2seq")
    with pytest.raises(SimplaceError, match="Unknown placement method"):
        method_options("nope")


def test_another_cost_model_is_a_new_context(case):
    g, _ = case
    cm = CostModel.synthetic(3, seed=1)
    ctx = PlacerContext(g, cm, seed=1, budget_s=5.0, options={"batch": 8})
    sim = ctx.batched
    other = ctx.with_cost_model(_slow_device0(cm))
    assert ctx.cost_model is cm and ctx.batched is sim  # untouched
    assert other.cost_model is not cm and other.batched is not sim
    assert other.rng is ctx.rng and other.t_begin == ctx.t_begin and other.options == {
        "batch": 8}


# RL's case: tests/test_rl.py::test_hook_returning_a_corrected_cost_model_is_trained_against
@pytest.mark.parametrize("method, kw", [
    ("local", dict(max_evaluations=400, batch=32, starts=["single"], validate_every=3)),
])
def test_a_corrected_model_from_the_hook_judges_the_result(case, method, kw):
    g, _ = case
    cm = CostModel.synthetic(3, seed=1)
    corrected = _slow_device0(cm)
    calls = []

    def hook(step, candidates, cost_model):
        calls.append((step, cost_model))
        assert all(c.shape == (g.num_ops,) for c in candidates)
        return corrected if step == 3 else None

    res = optimize(g, cm, method, seed=0, validate=hook, **kw)
    assert calls[0] == (3, cm) and all(m is corrected for _, m in calls[1:])
    assert calls[-1][0] == -1  # the call at the end
    assert res.cost_model is corrected and res.info["validation"]["corrections"] == 1
    # like with like: the result is simulated under the model it was judged by
    assert res.step_time_s == pytest.approx(simulate(g, corrected, res.placement)
                                            .step_time_s, rel=1e-12)
    assert lower_bound(g, corrected) <= res.step_time_s * (1 + 1e-9)
    plain = optimize(g, cm, method, seed=0, **{k: v for k, v in kw.items()
                                                 if k != "validate_every"})
    assert plain.cost_model is cm and "validation" not in plain.info


def test_local_stops_on_request_with_its_best(case):
    g, cm = case
    kw = dict(max_evaluations=32 * 40, batch=32, starts=["single", "m_topo"])

    def hook(step, candidates, cost_model):
        if step == 5:
            request_stop()  # as Ctrl-C in the CLI does

    res = optimize(g, cm, "local", seed=4, validate=hook, validate_every=1, **kw)
    assert res.info["stop"] == "interrupted" and res.info["rounds"] == 5
    start = min(r["score"] for r in res.info["starts"] if "score" in r)
    assert res.step_time_s <= start * (1 + 1e-12)  # the best so far, never worse
    assert res.info["validation"]["calls"] == 5  # no validation at the end once stopped


def _rl(g, cm, **kw):
    return optimize(g, cm, "rl-seq2seq", seed=2, samples=16, units="ops", hidden=16, **kw)


@pytest.mark.slow  # the continued leg: tests/test_rl.py's resume test
def test_rl_interrupted_then_resumed_goes_on_to_its_target(case, tmp_path):
    g, cm = case

    def hook(step, candidates, cost_model):
        if step == 4:
            request_stop()

    ck = str(tmp_path / "ck.npz")
    part = _rl(g, cm, episodes=16 * 10, checkpoint=ck, validate=hook, validate_every=1)
    assert part.info["stop"] == "interrupted" and part.info["updates"] == 4
    _, meta = ckpt.load(ck, {})
    assert meta["update"] == 4 and meta["finished"] is False
    clear_stop()
    # The same run goes on to its 10 updates (tests/test_rl.py checks that a resumed run
    # equals the uninterrupted one).
    said = []
    resumed = _rl(g, cm, episodes=16 * 10, checkpoint=ck, progress=said.append)
    assert resumed.info["resumed_at_update"] == 4 and resumed.info["trained_updates"] == 6
    assert any(f"resuming from checkpoint {ck}: update 4, 64 episodes" in m for m in said)
    assert resumed.info["updates"] == 10 and "legs" not in resumed.info
    assert resumed.step_time_s <= part.step_time_s * (1 + 1e-12)


@pytest.mark.slow  # the checkpoint path: tests/test_rl.py's resume test
def test_time_interval_checkpoints_and_a_finished_run_resumed_trains_a_new_leg(case,
                                                                               tmp_path):
    g, cm = case
    ck = tmp_path / "ck.npz"
    seen = {}

    def hook(step, candidates, cost_model):
        if step == 3:
            seen["update"] = ckpt.load(ck, {})[1]["update"] if ck.exists() else None

    # Never by update count; every update by time (the first update starts the clock).
    first = _rl(g, cm, episodes=16 * 4, checkpoint=str(ck), checkpoint_every=10**6,
                checkpoint_every_s=1e-9, validate=hook, validate_every=1)
    assert seen["update"] == 2
    assert first.info["stop"] == "episodes" and ckpt.load(ck, {})[1]["finished"] is True
    again = _rl(g, cm, episodes=16 * 4, checkpoint=str(ck))
    assert again.info["resumed_at_update"] == 4 and again.info["trained_updates"] == 4
    assert again.info["updates"] == 8 and again.info["legs"] == 2
    rows = again.history
    assert [r["update"] for r in rows] == list(range(1, 9))
    assert all(np.isfinite(r["mean_step_time_s"]) for r in rows)
    assert again.step_time_s <= first.step_time_s * (1 + 1e-12)  # the best is kept


def test_signals_request_a_stop_then_a_second_one_stops_at_once():
    import signal

    from simplace.search import stop_on_signals

    before = signal.getsignal(signal.SIGTERM)
    told = []
    # raise_signal: to this thread, whose handler then runs at the next bytecode
    # (os.kill may go to another thread, and the handler run later: flaky under load)
    with pytest.raises(KeyboardInterrupt), stop_on_signals(message=told.append) as got:
        signal.raise_signal(signal.SIGTERM)
        time.sleep(0.01)
        assert got["signal"] == "SIGTERM" and stop_requested() and "keeping" in told[0]
        signal.raise_signal(signal.SIGTERM)  # the second: at once
        time.sleep(0.01)
    assert signal.getsignal(signal.SIGTERM) is before and not stop_requested()

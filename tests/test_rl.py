"""REINFORCE policies (``simplace.rl``, methods ``rl-*``): they reach the exact oracle's
optimum on a small graph, learn, keep OOM placements out, resume from checkpoints
exactly, and are deterministic for a seed."""

import argparse
import dataclasses
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simplace
from simplace.errors import SimplaceError
from simplace.placers import OOM_PENALTY, compare, methods, optimize
from simplace.rl import (
    RLConfig,
    Trainer,
    build_units,
    make_policy,
    unit_grouping,
)
from simplace.rl.cli_args import add_rl_args, rl_options
from simplace.sim import sim_inputs
from tests.placer_checks import check_result
from tests.sim_cases import make_graph
from tests.test_local_exact import oom_case, tiny_case

POLICIES = ("seq2seq", "hierarchical", "gnn")
TOL = dict(rel=1e-9, abs=1e-12)


@pytest.fixture(scope="module")
def oracle_case():
    """8 ops on 3 devices (6,561 placements) and the exact optimum."""
    g, cm = tiny_case(18, m=8, d=3)
    return g, cm, optimize(g, cm, method="exact")


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_reaches_oracle_optimum_and_learns(oracle_case, policy):
    g, cm, ex = oracle_case
    res = optimize(g, cm, method=f"rl-{policy}", seed=0, episodes=2048, samples=32,
                   units="ops")
    check_result(g, cm, res, expect_fit=True)
    assert res.step_time_s == pytest.approx(ex.step_time_s, **TOL)
    assert res.info["score"] == pytest.approx(res.step_time_s, **TOL)
    h = res.history
    assert len(h) == 2048 // 32 and h[-1]["episodes"] == 2048
    best = [r["best_step_time_s"] for r in h]
    assert best == sorted(best, reverse=True)
    # The policy learned: its late samples are far better than its first (random) ones.
    late = np.mean([r["mean_step_time_s"] for r in h[-5:]])
    assert late < 0.75 * h[0]["mean_step_time_s"]
    assert all(np.isfinite(r["grad_norm"]) and np.isfinite(r["loss"]) for r in h)


@pytest.mark.slow  # a policy's compilation each (the README suite keeps its 4 minutes)
@pytest.mark.parametrize("policy", POLICIES)
def test_a_policy_slower_than_one_device_returns_that_device(policy):
    # A chain of 24 ops, faster on device 1, each edge 100 s to cross: one update of 32
    # samples of an untrained policy (no polish) crosses somewhere or keeps to device 0;
    # the chain on device 1 takes 24 s.
    from tests.test_list_schedulers import machine as list_machine

    m = 24
    g = make_graph(np.arange(m - 1), np.arange(1, m), m=m, edge_bytes=np.full(m - 1, 100.0))
    inp = list_machine(np.tile([1.1, 1.0], (m, 1)), bandwidth=1.0)
    kw = dict(seed=0, episodes=32, samples=32, units="ops", polish_batches=0)
    raw = optimize(g, inp, method=f"rl-{policy}", fallback_single=False, **kw)
    res = optimize(g, inp, method=f"rl-{policy}", **kw)
    assert raw.step_time_s > 24.0 * 1.05 and "returned" not in raw.info
    assert res.step_time_s == pytest.approx(24.0)
    np.testing.assert_array_equal(res.placement, np.ones(m))
    assert res.info["returned"] == "single" and res.info["single_device"] == 1
    assert res.info["score"] == pytest.approx(raw.step_time_s)  # the policy's own best
    assert "device 1" in res.info["note_single"]


@pytest.mark.parametrize("policy", POLICIES)
def test_gradients_finite_and_update_moves_params(policy):
    g, cm = tiny_case(3, m=12, d=3)
    inp = sim_inputs(g, cm)
    units = build_units(g, inp.op_time_s, unit_grouping(g, "ops"))
    pol = make_policy(policy, units, 3, hidden=16)
    mode = "exact" if policy == "gnn" else "bound"  # both memory paths, one compile each
    tr = Trainer(g, inp, units, pol, RLConfig(samples=8, oom=mode), seed=1)
    state = tr.init_state()
    step = tr.update_fn(mode)
    with jax.enable_x64(True):
        new, p_best, s_best, stats = step(state, jnp.float32(1e-2), jnp.float32(0.1),
                                          jnp.float64(np.nan))
    assert np.isfinite(float(stats["grad_norm"])) and float(stats["grad_norm"]) > 0
    moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), state.params,
                         new.params)
    leaves = jax.tree.leaves(moved)
    assert all(np.isfinite(x) for x in leaves) and max(leaves) > 0
    # The batch's best placement is scored like the batched simulator scores it.
    assert p_best.shape == (g.num_ops,)
    ref = tr.simulator(True)(np.asarray(p_best)[None])
    assert float(s_best) == pytest.approx(float(ref.step_time_s[0]), **TOL)
    # Log-probabilities of a sample are those of teacher forcing / the marginals.
    with jax.enable_x64(True):
        s = pol.sample(state.params, jax.random.key(0), 4)
    assert s.unit_devices.shape == (4, units.num_units)
    assert np.all(np.isfinite(np.asarray(s.logp))) and np.all(np.asarray(s.logp) <= 0)


@pytest.mark.parametrize("oom,simulator", [("bound", "jax"), ("exact", "jax"),
                                           ("bound", "numba")])
def test_oom_samples_never_become_best(oom, simulator):
    if simulator == "numba":
        pytest.importorskip("numba")
    g, cm = oom_case()  # one device cannot hold all parameters; half and half fits
    ex = optimize(g, cm, method="exact")
    res = optimize(g, cm, method="rl-gnn", seed=0, episodes=512, samples=32, units="ops",
                   oom=oom, simulator=simulator)
    check_result(g, cm, res, expect_fit=True)
    assert res.info["fits"] and res.info["score"] < OOM_PENALTY
    assert res.info["simulator"] == simulator
    # The native simulator's OOM flags are exact whatever the option says.
    assert res.info["oom_mode"] == (oom if simulator == "jax" else "exact")
    assert any(r["oom_fraction"] > 0 for r in res.history)  # OOM samples were drawn
    assert all(r["best_step_time_s"] < OOM_PENALTY for r in res.history)
    assert res.step_time_s >= ex.step_time_s * (1 - 1e-12)


def test_auto_oom_mode_picks_exact_when_memory_is_tight():
    g, cm = oom_case()
    res = optimize(g, cm, method="rl-seq2seq", seed=0, episodes=64, samples=32,
                   units="ops", simulator="jax")
    assert res.info["oom_mode"] == "exact" and not res.oom


@pytest.fixture(scope="module")
def small_case():
    return tiny_case(7, m=14, d=3)


def _run(g, cm, **kw):
    return optimize(g, cm, method="rl-seq2seq", seed=3, episodes=16 * 12, samples=16,
                    units="ops", hidden=16, **kw)


def test_deterministic_and_checkpoint_resume_equals_uninterrupted_run(small_case,
                                                                     tmp_path):
    g, cm = small_case
    full = _run(g, cm, checkpoint=str(tmp_path / "full.npz"))
    again = _run(g, cm)  # same seed, no checkpoint: the same run
    assert np.array_equal(again.placement, full.placement)
    assert [r["mean_step_time_s"] for r in again.history] == \
        [r["mean_step_time_s"] for r in full.history]
    ck = str(tmp_path / "part.npz")
    part = _run(g, cm, checkpoint=ck, stop_after_updates=5, checkpoint_every=2)
    assert part.info["stop"] == "stopped" and part.info["updates"] == 5
    resumed = _run(g, cm, checkpoint=ck)
    assert resumed.info["resumed_at_update"] == 5 and resumed.info["updates"] == 12
    assert np.array_equal(resumed.placement, full.placement)
    key = ("mean_step_time_s", "best_step_time_s", "grad_norm", "episodes")
    assert [[r[k] for k in key] for r in resumed.history] == \
        [[r[k] for k in key] for r in full.history]
    # A checkpoint of another run is refused, not silently used.
    with pytest.raises(SimplaceError, match="another run"):
        optimize(g, cm, method="rl-seq2seq", seed=99, episodes=64, samples=16,
                 units="ops", hidden=16, checkpoint=ck)


def test_warm_start_hook_history_and_plot(small_case, tmp_path):
    g, cm = small_case
    single = optimize(g, cm, method="single")
    seen = []

    def hook(step, candidates, cost_model):
        seen.append((step, [np.array(c) for c in candidates], cost_model))

    hist = tmp_path / "h.json"
    res = optimize(g, cm, method="rl-gnn", seed=0, episodes=16 * 50, samples=16,
                   units="ops", hidden=16, warm_start="single,m_topo", validate=hook,
                   validate_every=3, stop_after_updates=6, history=str(hist))
    assert res.step_time_s <= single.step_time_s * (1 + 1e-12)  # never worse than it
    assert res.info["imitation_steps"] >= 1 and 0 < res.info["imitation_likelihood"] <= 1
    assert set(res.info["warm_starts"]) == {"single", "m_topo"}
    assert res.info["stop"] == "stopped" and res.info["updates"] == 6
    timing = res.info["update_timing"]
    assert timing["updates"] == 6 and timing["policy_s"] > 0 and timing["simulator_s"] > 0
    # every 3 updates, then once at the end (step -1), always under the given model
    assert [s for s, _, _ in seen] == [3, 6, -1] and all(m is cm for *_, m in seen)
    assert res.info["validation"] == {"calls": 3, "corrections": 0}
    last = seen[-1][1]
    assert last[0].shape == (g.num_ops,) and np.array_equal(last[0], res.placement)
    assert res.cost_model is cm
    saved = json.loads(hist.read_text())
    rows = saved["rows"]
    assert len(rows) == 6 and {"episodes", "mean_step_time_s", "reward_mean"} <= set(rows[0])
    assert (tmp_path / "h.png").stat().st_size > 0
    # The plot's reference lines: single, the best warm start and the lower bound.
    refs = saved["references_s"]
    assert refs["single"] == pytest.approx(single.step_time_s, rel=1e-6)
    assert refs["lower bound"] == pytest.approx(simplace.lower_bound(g, cm), rel=1e-9)
    (best_name,) = [k for k in refs if k.startswith("best heuristic")]
    assert refs[best_name] == pytest.approx(res.info["warm_starts"]["m_topo"], rel=1e-9)


def test_hook_returning_a_corrected_cost_model_is_trained_against(small_case):
    from simplace.cost_model import Corrections, CostModel
    from simplace.sim import simulate

    g, _ = small_case
    cm = CostModel.synthetic(3, seed=1)
    # "Validation" finds device 0 three times slower than the model says.
    scale = np.ones(cm.num_devices)
    scale[0] = 3.0
    corrected = cm.with_corrections(dataclasses.replace(
        Corrections.identity(cm.num_devices), compute_scale=scale))
    calls = []

    def hook(step, candidates, cost_model):
        calls.append((step, cost_model))
        return corrected if step == 4 else None

    res = optimize(g, cm, method="rl-seq2seq", seed=0, episodes=16 * 10, samples=16,
                   units="ops", hidden=16, validate=hook, validate_every=4)
    assert [s for s, _ in calls] == [4, 8, -1]
    # the hook is told which model the search uses now
    assert [m is corrected for _, m in calls] == [False, True, True]
    assert res.info["cost_model_switches"] == 1
    assert res.cost_model is corrected
    # The result is simulated under the model it was judged by, and after the switch the
    # run's best is scored by the corrected model.
    assert res.step_time_s == pytest.approx(
        simulate(g, corrected, res.placement).step_time_s, **TOL)
    after = [r for r in res.history if r["update"] > 4]
    assert after[-1]["best_step_time_s"] == pytest.approx(res.step_time_s, **TOL)


def test_bad_input_is_a_clear_error(small_case):
    g, cm = small_case
    with pytest.raises(SimplaceError, match="Unknown policy 'lstm'"):
        make_policy("lstm", None, 2)
    with pytest.raises(SimplaceError, match="Unknown warm-start method 'heft2'"):
        optimize(g, cm, method="rl-gnn", episodes=16, warm_start="heft2")
    with pytest.raises(SimplaceError, match=r"'samples' must be an integer in 1\.\.8192, got 0"):
        optimize(g, cm, method="rl-gnn", episodes=16, samples=0)
    with pytest.raises(SimplaceError, match="reward must be one of neg, sqrt, log"):
        RLConfig(reward="exp")
    with pytest.raises(SimplaceError, match=r"'episodes' must be an integer in 1\.\."):
        optimize(g, cm, method="rl-gnn", episodes=0)
    with pytest.raises(SimplaceError, match="'samples' must be an integer in 1..8192, got 'many'"):
        optimize(g, cm, method="rl-gnn", episodes=16, samples="many")
    with pytest.raises(SimplaceError, match=r"'explore' must be a finite number > 0, got 0"):
        optimize(g, cm, method="rl-gnn", episodes=16, explore=0)
    with pytest.raises(SimplaceError, match=r"'explore' must be a finite number > 0, got 'many'"):
        optimize(g, cm, method="rl-seq2seq", episodes=16, explore="many")
    with pytest.raises(SimplaceError, match="explore"):  # gnn's and seq2seq's only
        optimize(g, cm, method="rl-hierarchical", episodes=16, explore=2)


def test_a_foreign_npz_is_not_taken_for_a_checkpoint(tmp_path):
    from simplace.rl import checkpoint

    path = tmp_path / "other.npz"
    np.savez(path, weights=np.zeros(3))
    with pytest.raises(SimplaceError, match="not a simplace RL checkpoint"):
        checkpoint.load(path, {})


def test_registry_and_cli_flags():
    names = methods()
    assert {"rl-seq2seq", "rl-hierarchical", "rl-gnn"} <= set(names)
    ap = argparse.ArgumentParser()
    ap.add_argument("--method")
    add_rl_args(ap)
    args = ap.parse_args(["--method", "rl-gnn", "--episodes", "100", "--samples", "8",
                          "--warm-start", "expert", "--checkpoint", "c.npz"])
    assert rl_options(args) == {"episodes": 100, "samples": 8, "warm_start": "expert",
                                "checkpoint": "c.npz", "progress_bar": True}
    assert rl_options(ap.parse_args(["--method", "heft"])) == {}
    with pytest.raises(SimplaceError, match="rl-\\* methods only"):
        rl_options(ap.parse_args(["--method", "heft", "--episodes", "5"]))
    assert rl_options(ap.parse_args(["--method", "rl-gnn", "--checkpoint", "c.npz",
                                     "--checkpoint-every", "5"]))["checkpoint_every_s"] == 5.0
    with pytest.raises(SimplaceError, match="--checkpoint-every needs --checkpoint"):
        rl_options(ap.parse_args(["--method", "rl-gnn", "--checkpoint-every", "5"]))
    # rl-universal takes its own options: no progress bar, episodes or history
    assert rl_options(ap.parse_args(["--method", "rl-universal"])) == {}
    assert rl_options(ap.parse_args(["--method", "rl-universal", "--samples", "16",
                                     "--warm-start", "heft"])) == {"samples": 16,
                                                                   "warm_start": "heft"}
    with pytest.raises(SimplaceError, match="--episodes does not apply to --method "
                       "rl-universal; of these flags it takes --samples, --warm-start"):
        rl_options(ap.parse_args(["--method", "rl-universal", "--episodes", "5"]))
    # Out-of-range numbers are refused while parsing (argparse exits 2 with a message).
    with pytest.raises(SystemExit) as exit_info:
        ap.parse_args(["--method", "rl-gnn", "--samples", "0"])
    assert exit_info.value.code == 2


# What compare's own checks need of a graph and a machine when optimize is faked.
_GRAPH = types.SimpleNamespace(num_ops=3)
_MACHINE = types.SimpleNamespace(num_devices=2)


def test_compare_runs_rl_after_fast_methods_and_local_leaves_rl_out(monkeypatch):
    import simplace.placers as placers
    from simplace.placers.local import _start_list

    called = []

    def fake_optimize(graph, cost_model, method, **kw):
        called.append(method)
        raise SimplaceError("not run")

    monkeypatch.setattr(placers.front, "optimize", fake_optimize)
    compare(_GRAPH, _MACHINE)
    # compare (--method all) runs every method but exact: fast ones, local, then rl-*.
    assert "heft" in called and "exact" not in called
    rl = [i for i, m in enumerate(called) if placers.method_kind(m) == "policy"]
    assert len(rl) == 4 and min(rl) > called.index("local") > called.index("heft")
    # The pretrained policy places zero-shot among the fast methods, before local.
    assert called.index("rl-pretrained") < called.index("local")
    starts = _start_list(types.SimpleNamespace(options={}))
    assert "heft" in starts and "rl-pretrained" in starts
    assert not any(placers.method_kind(m) == "policy" for m in starts)
    # Cheap starts first, then the list schedulers best first (starts stop at half the
    # budget, so a slow weak one must not crowd out a strong one).
    assert starts[0] == "single" and starts.index("m_etf") < starts.index("heft")


def test_polish_descends_with_range_moves_that_units_cannot_make():
    from simplace.rl.refine import polish, range_moves

    # The target needs a boundary shifted and one op moved out of the middle of a run,
    # to the device across an edge (1 -> 6).
    target = np.array([0, 0, 0, 1, 1, 1, 0, 1], np.int32)
    src, dst = np.array([1, 5]), np.array([6, 6])

    def score(b):
        b = np.asarray(b)
        return (b != target).sum(1) + 0.1 * (np.diff(b, axis=1) != 0).sum(1)

    start = np.array([0, 0, 1, 1, 1, 1, 1, 1], np.int32)
    moves = range_moves(start, 3, reach=2, edges=(src, dst))
    assert moves.shape[1] == 3 and len(moves) > 0
    # Every move changes the placement.
    for lo, hi, d in moves:
        assert np.any(start[lo:hi] != d)
    best, s, used = polish(score, start, float(score(start[None])[0]), 3, 4, 100,
                           edges=(src, dst))
    assert best.tolist() == target.tolist() and s == pytest.approx(0.3)
    assert 1 <= used < 100
    # The batch budget is honoured, and a deadline in the past scores nothing.
    assert polish(score, start, float(score(start[None])[0]), 3, 4, 1,
                  edges=(src, dst))[2] == 1
    assert polish(score, start, 9.0, 3, 4, 100, deadline=0.0)[2] == 0


def test_screened_polish_takes_the_same_steps_and_never_a_placement_that_does_not_fit():
    from simplace.rl.refine import polish
    from simplace.search import OOM_PENALTY, penalised

    target = np.array([0, 0, 0, 1, 1, 1, 0, 1, 2, 2], np.int32)
    src, dst = np.array([1, 5]), np.array([6, 6])

    def step(b):
        b = np.asarray(b)
        return (b != target).sum(1) + 0.1 * (np.diff(b, axis=1) != 0).sum(1)

    exact_rows = []

    def make_score(oom_of):
        def score(b):
            exact_rows.append(len(b))
            return penalised(step(b), oom_of(np.asarray(b)))
        return score

    start = np.array([0, 0, 1, 1, 1, 1, 1, 1, 1, 2], np.int32)
    fits = make_score(lambda b: np.zeros(len(b), bool))
    plain = polish(fits, start, float(fits(start[None])[0]), 3, 8, 500, edges=(src, dst))
    plain_rows, exact_rows[:] = sum(exact_rows), []
    screened = polish(fits, start, float(fits(start[None])[0]), 3, 8, 500,
                      edges=(src, dst), screen=step)
    # Everything fits: the screen's ranking is the exact one, so the same descent, with
    # only the candidates faster than the current placement checked.
    assert screened[0].tolist() == plain[0].tolist() == target.tolist()
    assert screened[1:] == pytest.approx(plain[1:])
    assert sum(exact_rows) < plain_rows / 4
    # A placement with two ops on device 2 does not fit: the screen ranks the target
    # fastest, the check turns it down, and the descent ends on the best that fits.
    tight = make_score(lambda b: (b == 2).sum(1) >= 2)
    best, s, _ = polish(tight, start, float(tight(start[None])[0]), 3, 8, 500,
                        edges=(src, dst), screen=step)
    assert (best == 2).sum() < 2 and s < OOM_PENALTY
    assert s == pytest.approx(float(step(best[None])[0]))
    unscreened = polish(tight, start, float(tight(start[None])[0]), 3, 8, 500,
                        edges=(src, dst))
    assert s == pytest.approx(unscreened[1])


def test_portfolio_starts_are_the_best_distinct_fitting_warm_starts():
    from simplace.rl.reinforce import portfolio_starts

    a, b, c = (np.full(4, i, np.int32) for i in range(3))
    warm = [("a", a), ("a2", a.copy()), ("b", b), ("c", c)]
    got = portfolio_starts(warm, [2.0, 1.0, 3.0, OOM_PENALTY + 1.0], 3)
    # Best first, duplicates once (under the better name), OOM starts left out.
    assert [n for n, _ in got] == ["a2", "b"]
    assert [n for n, _ in portfolio_starts(warm, [2.0, 1.0, 3.0, 0.5], 2)] == ["c", "a2"]
    # None fits: the best alone (the first stint's start).
    assert [n for n, _ in portfolio_starts(warm[3:], [OOM_PENALTY + 1.0], 3)] == ["c"]
    assert portfolio_starts([], [], 3) == []


@pytest.mark.slow
def test_portfolio_restarts_and_polish_are_deterministic(small_case):
    g, cm = small_case
    warm = "single,m_topo,heft,m_etf,m_sct"
    kw = dict(seed=2, episodes=16 * 30, samples=16, hidden=16, warm_start=warm,
              patience=3, portfolio=3)
    a = optimize(g, cm, method="rl-gnn", **kw)
    check_result(g, cm, a, expect_fit=True)
    ws = a.info["warm_starts"]
    assert a.step_time_s <= min(ws.values()) * (1 + 1e-9)
    # Stints from the portfolio's other starts, then restarts on the best placement.
    assert a.info["restarts"] >= 3
    assert len(a.info["stints_from"]) >= 1
    assert set(a.info["stints_from"]) <= set(a.info["portfolio"])
    # The portfolio's starts were polished before training where that helped.
    assert {n.removesuffix("+polish") for n in a.info["portfolio"]} <= set(ws)
    assert set(a.info["prepolished"]) <= {f"{n}+polish" for n in ws}
    assert 0.0 <= a.info["polish_gain"] < 1 and a.info["polished_starts"] >= 1
    b = optimize(g, cm, method="rl-gnn", **kw)
    assert np.array_equal(a.placement, b.placement)
    assert a.info["restarts"] == b.info["restarts"]
    # patience 0: one stint; polish_batches 0: no polish.
    c = optimize(g, cm, method="rl-gnn", **{**kw, "patience": 0, "polish_batches": 0})
    assert "restarts" not in c.info and "polish_gain" not in c.info
    assert "portfolio" not in c.info  # no restarts: the best warm start alone
    with pytest.raises(SimplaceError, match="patience"):
        optimize(g, cm, method="rl-gnn", **{**kw, "patience": -1})


def test_warm_starts_leave_the_budget_to_the_policy(small_case):
    """Under a time budget the named warm-start heuristics after the first are not begun
    once WARM_SHARE of it is spent (nmt_2layer's first update came after the whole
    30 s); without a budget every one runs."""
    import time

    from simplace.placers import PlacerContext
    from simplace.placers.rl import WARM_SHARE, _warm_starts

    g, cm = small_case
    names = "single,m_topo,m_etf"
    late = PlacerContext(g, cm, budget_s=1.0, options={"warm_start": names},
                         t_begin=time.perf_counter() - 2 * WARM_SHARE)
    found, scores, missed = _warm_starts(late)
    assert [n for n, _ in found] == ["single"] and len(scores) == 1
    assert set(missed) == {"m_topo", "m_etf"}
    assert all(why.startswith("skipped") for why in missed.values())
    free = PlacerContext(g, cm, options={"warm_start": names})
    assert [n for n, _ in _warm_starts(free)[0]] == ["single", "m_topo", "m_etf"]
    assert _warm_starts(free)[2] == {}
    early = PlacerContext(g, cm, budget_s=1000.0, options={"warm_start": names})
    assert len(_warm_starts(early)[0]) == 3


def test_warm_starts_fit_their_share_by_estimate_and_stop_at_its_end(small_case, monkeypatch):
    """A heuristic whose cost estimate does not fit what is left of the warm starts'
    share is not begun (but the first), and each is given that share as its budget:
    unbudgeted, ideals begun just inside it took 10.9 s of a 20 s budget on rnnlm."""
    from simplace import placers
    from simplace.placers import PlacerContext, registry
    from simplace.placers.rl import WARM_SHARE, _warm_starts

    g, cm = small_case
    budgets = {}
    run = placers.run_method

    def recording(graph, model, name, **kw):
        budgets[name] = kw.get("budget_s")
        return run(graph, model, name, **kw)

    monkeypatch.setattr(placers, "run_method", recording)
    monkeypatch.setattr(registry, "fast_cost_s",
                        lambda n, m, d: 1e3 if n == "m_topo" else 0.0)
    ctx = PlacerContext(g, cm, budget_s=10.0, options={"warm_start": "single,m_topo,m_etf"})
    found, _, missed = _warm_starts(ctx)
    assert [n for n, _ in found] == ["single", "m_etf"] and list(missed) == ["m_topo"]
    assert 0 < budgets["m_etf"] <= WARM_SHARE * 10.0
    monkeypatch.setattr(registry, "fast_cost_s", lambda n, m, d: 1e3)
    found, _, _ = _warm_starts(ctx)
    assert [n for n, _ in found] == ["single"] and budgets["single"] == 1e3  # the first
    # the first named is begun whatever its estimate: the user asked for a warm start
    found, _, missed = _warm_starts(ctx.with_options({"warm_start": "m_topo,m_etf"}))
    assert [n for n, _ in found] == ["m_topo"] and budgets["m_topo"] == 1e3
    assert list(missed) == ["m_etf"]


def test_a_failing_warm_start_is_reported_and_the_others_stand(small_case, monkeypatch):
    """A heuristic that fails is left out and named in the result (``warm_start best``
    must not sink a run for one method's error); when none gives a placement, the error
    says why each failed."""
    from simplace import placers
    from simplace.placers import PlacerContext
    from simplace.placers.rl import _warm_starts

    g, cm = small_case
    run = placers.run_method

    def failing(graph, model, name, **kw):
        if name in ("m_topo", "heft"):
            raise SimplaceError(f"{name} broke")
        return run(graph, model, name, **kw)

    monkeypatch.setattr(placers, "run_method", failing)
    said = []
    ctx = PlacerContext(g, cm, budget_s=100.0, options={"warm_start": "m_topo,m_etf"},
                        progress=said.append)
    found, scores, missed = _warm_starts(ctx)
    assert [n for n, _ in found] == ["m_etf"] and len(scores) == 1
    assert missed == {"m_topo": "SimplaceError: m_topo broke"}
    assert said == ["warm start m_topo failed (SimplaceError: m_topo broke); going on "
                    "without it."]
    res = optimize(g, cm, method="rl-gnn", episodes=16, samples=8, hidden=16,
                   warm_start="m_topo,m_etf")
    assert set(res.info["warm_starts"]) == {"m_etf"}
    assert res.info["warm_starts_missed"] == missed
    with pytest.raises(SimplaceError, match=r"No warm start could be made: m_topo: "
                       r"SimplaceError: m_topo broke; heft: SimplaceError: heft broke"):
        _warm_starts(ctx.with_options({"warm_start": "m_topo,heft"}))


def test_warm_start_takes_several_placements(small_case):
    """``warm_start`` as int[K, M] (what ``compare`` passes: every placement found so
    far, best first): each is a warm start, scored, in the order given; a bad row is
    named."""
    from simplace.placers import PlacerContext
    from simplace.placers.rl import _warm_starts

    g, cm = small_case
    rng = np.random.default_rng(0)
    rows = rng.integers(0, cm.num_devices, size=(3, g.num_ops))
    found, scores, _ = _warm_starts(PlacerContext(g, cm, options={"warm_start": rows}))
    assert [n for n, _ in found] == ["placement[0]", "placement[1]", "placement[2]"]
    assert all(np.array_equal(p, r) for (_, p), r in zip(found, rows, strict=True))
    ctx = PlacerContext(g, cm)
    assert scores == pytest.approx([float(s) for s in ctx.score(rows)], rel=1e-12)
    one, _, _ = _warm_starts(PlacerContext(g, cm, options={"warm_start": rows[1]}))
    assert [n for n, _ in one] == ["placement"]
    bad = rows.copy()
    bad[2, 0] = cm.num_devices
    with pytest.raises(SimplaceError, match=r"warm_start placement\[2\] is invalid"):
        _warm_starts(PlacerContext(g, cm, options={"warm_start": bad}))
    for shape in ((0, g.num_ops), (2, 2, g.num_ops)):
        with pytest.raises(SimplaceError, match="int\\[K, M\\] placements; got an array"):
            _warm_starts(PlacerContext(g, cm, options={"warm_start": np.zeros(shape, int)}))


def test_compare_skips_a_search_whose_part_is_shorter_than_a_first_batch(monkeypatch):
    """compare's searches may overrun their parts by their first batch (compilation);
    a later search whose part is shorter than the longest first batch seen is skipped
    and reported, so that the whole overruns by about one first batch, not each."""
    import simplace.placers as placers

    clock = [0.0]
    monkeypatch.setattr(placers.front.time, "perf_counter", lambda: clock[0])
    ran = []

    def fake_optimize(graph, cost_model, method, *, budget_s=None, **kw):
        ran.append((method, budget_s))
        first = {"local": 0.2, "rl-gnn": 5.0}.get(method, 9.0)
        clock[0] += first + budget_s  # compiles, then uses its whole part
        return types.SimpleNamespace(method=method, oom=False, step_time_s=1.0,
                                     placement=np.zeros(3, np.int32),
                                     info={"first_batch_s": first})

    monkeypatch.setattr(placers.front, "optimize", fake_optimize)
    said = []
    out = compare(_GRAPH, _MACHINE, ["local", "rl-gnn", "rl-hierarchical", "rl-seq2seq"],
                  budget_s=60.0, progress=said.append)
    # Parts of the time left: local 60 / 4 = 15 s (ends at 15.2 s), rl-gnn 44.8 / 3 (ends
    # at 35.1 s), rl-hierarchical 24.9 / 2 = 12.4 s (ends at 56.6 s); rl-seq2seq would
    # get the last 3.4 s, under rl-hierarchical's first batch (9 s): skipped.
    assert [m for m, _ in ran] == ["local", "rl-gnn", "rl-hierarchical"]
    assert ran[0][1] == pytest.approx(15.0) and ran[1][1] == pytest.approx(44.8 / 3)
    assert ran[2][1] == pytest.approx((60 - 15.2 - 44.8 / 3 - 5.0) / 2)
    assert [r.method for r in out] == ["local", "rl-gnn", "rl-hierarchical"]
    skipped = [m for m in said if "skipped" in m]
    assert len(skipped) == 1 and skipped[0].startswith("rl-seq2seq skipped")
    assert "first batch took 9.0 s" in skipped[0] and "--budget-s" in skipped[0]


def test_compare_gives_a_short_budget_to_local_not_to_compiling_policies(monkeypatch):
    """compare plans only as many policies as get ``_MIN_POLICY_S`` each (rl-gnn first);
    the rest are skipped up front, named, and their time goes to local. Without local,
    one policy runs whatever the budget."""
    import simplace.placers as placers

    clock = [0.0]
    monkeypatch.setattr(placers.front.time, "perf_counter", lambda: clock[0])
    ran = []

    def fake_optimize(graph, cost_model, method, *, budget_s=None, **kw):
        ran.append((method, budget_s))
        clock[0] += budget_s
        return types.SimpleNamespace(method=method, oom=False, step_time_s=1.0,
                                     placement=np.zeros(3, np.int32),
                                     info={"first_batch_s": 0.1})

    monkeypatch.setattr(placers.front, "optimize", fake_optimize)
    four = ["rl-seq2seq", "local", "rl-hierarchical", "rl-gnn"]
    said = []
    compare(_GRAPH, _MACHINE, four, budget_s=10.0, progress=said.append)
    assert ran == [("local", pytest.approx(10.0))]  # 10 / 2 < 8 s: no policy
    skipped = [m for m in said if "skipped" in m]
    assert [m.split()[0] for m in skipped] == ["rl-gnn", "rl-hierarchical", "rl-seq2seq"]
    assert all("8 s a policy needs" in m and "--budget-s" in m for m in skipped)
    assert "would be 5.0 s" in skipped[0]

    ran.clear()
    compare(_GRAPH, _MACHINE, four, budget_s=20.0)  # 20 / 2 = 10 s: local and rl-gnn
    assert ran == [("local", pytest.approx(10.0)), ("rl-gnn", pytest.approx(10.0))]
    ran.clear()
    compare(_GRAPH, _MACHINE, four, budget_s=32.0)  # 32 / 4 = 8 s: every search
    assert [m for m, _ in ran] == ["local", "rl-gnn", "rl-hierarchical", "rl-seq2seq"]
    assert all(b == pytest.approx(8.0) for _, b in ran)
    ran.clear()
    said.clear()
    compare(_GRAPH, _MACHINE, ["rl-hierarchical", "rl-gnn"], budget_s=3.0,  # no local
            progress=said.append)
    assert ran == [("rl-gnn", pytest.approx(3.0))]
    skipped = [m for m in said if "skipped" in m]
    assert len(skipped) == 1 and skipped[0].startswith("rl-hierarchical skipped")
    assert "local" not in skipped[0]

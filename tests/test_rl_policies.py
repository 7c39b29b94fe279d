"""The cheap run-preserving GNN policy, its warm start, self-imitation and the block-move
refinement of REINFORCE's best samples (``simplace.rl.policies.gnn``,
``simplace.rl.refine``, ``simplace.rl.reinforce.Trainer``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simplace.rl import RLConfig, Trainer, build_units, make_policy, unit_grouping
from simplace.rl.refine import block_moves, refine, runs
from simplace.sim import sim_inputs
from tests.test_local_exact import tiny_case


@pytest.fixture(scope="module")
def gnn_case():
    g, cm = tiny_case(5, m=16, d=3)
    inp = sim_inputs(g, cm)
    units = build_units(g, inp.op_time_s, unit_grouping(g, "ops"))
    return g, cm, inp, units


def test_gnn_logp_is_that_of_its_follow_and_fresh_decisions(gnn_case):
    _, _, _, units = gnn_case
    pol = make_policy("gnn", units, 3, hidden=8)
    with jax.enable_x64(True):
        params = pol.init(jax.random.key(0))
        # Make the distributions uneven, so that a wrong log-probability shows.
        params["unit_bias"] = 0.1 * jax.random.normal(jax.random.key(1),
                                                      params["unit_bias"].shape, jnp.float32)
        s = pol.sample(params, jax.random.key(2), 6)
        a, f = pol.logits(params)
    a, f = np.asarray(a, np.float64), np.asarray(f, np.float64)
    lsm = a - np.log(np.exp(a).sum(-1, keepdims=True))
    dev = np.asarray(s.unit_devices)
    # Every assignment of follow flags consistent with the devices has some probability;
    # the sample's logp must be one of them (here: brute force over the 2^(U-1) sets is
    # too many, so check the bound that matters: logp <= log P(devices)).
    m = np.asarray(pol.marginals(params))
    assert m.shape == (units.num_units, 3)
    np.testing.assert_allclose(m.sum(-1), 1.0, rtol=1e-5)
    for k in range(len(dev)):
        # P(devices) by the forward recursion over "same device as the previous unit"
        p_follow = 1 / (1 + np.exp(-f))
        prob = np.exp(lsm[0, dev[k, 0]])
        for u in range(1, len(f)):
            stay = p_follow[u] if dev[k, u] == dev[k, u - 1] else 0.0
            prob *= stay + (1 - p_follow[u]) * np.exp(lsm[u, dev[k, u]])
        assert float(s.logp[k]) <= np.log(prob) + 1e-4
    assert np.all(np.asarray(s.entropy) > 0)


def test_gnn_marginals_match_sampled_frequencies(gnn_case):
    _, _, _, units = gnn_case
    pol = make_policy("gnn", units, 3, hidden=8)
    with jax.enable_x64(True):
        params = pol.init(jax.random.key(3))
        params["follow_bias"] = jnp.full_like(params["follow_bias"], 0.05)
        s = pol.sample(params, jax.random.key(4), 4000)
        m = np.asarray(pol.marginals(params))
    freq = np.stack([(np.asarray(s.unit_devices) == d).mean(0) for d in range(3)], 1)
    np.testing.assert_allclose(freq, m, atol=0.04)


def test_gnn_warm_start_reproduces_the_target_up_to_a_few_deviations(gnn_case):
    _, _, _, units = gnn_case
    u = units.num_units
    target = (np.arange(u) * 3 // u).astype(np.int32)  # three runs
    pol = make_policy("gnn", units, 3, hidden=8, explore=1.0)
    with jax.enable_x64(True):
        params = pol.warm_start(pol.init(jax.random.key(0)), target)
        s = np.asarray(pol.sample(params, jax.random.key(1), 2000).unit_devices)
        ll = float(pol.imitation_logp(params, target))
        # The host's likelihood (what the trainer reports) is the policy's.
        assert pol.host_imitation_logp(params, target) == pytest.approx(ll, abs=1e-5)
        other = np.roll(target, 3)
        assert pol.host_imitation_logp(params, other) == pytest.approx(
            float(pol.imitation_logp(params, other)), abs=1e-5)
    wrong = (s != target[None]).sum(1)
    assert 0.1 < (wrong == 0).mean() < 0.9  # explores, but stays close
    assert np.median(wrong) <= 2 and np.exp(ll) > 0.8
    # A deviation moves a run of units, not always a single one.
    assert (wrong >= 2).mean() > 0.02


def test_block_moves_shift_boundaries_and_move_runs():
    e = np.array([0, 0, 1, 1, 1, 2], np.int32)
    assert runs(e).tolist() == [0, 2, 5, 6]
    c = block_moves(e, 3)
    rows = {tuple(r) for r in c.tolist()}
    assert (0, 0, 0, 1, 1, 2) in rows  # boundary shifted right
    assert (0, 1, 1, 1, 1, 2) in rows  # and left
    assert (0, 0, 2, 2, 2, 2) in rows  # a whole run to another device
    assert tuple(e) not in rows and len(rows) == len(c)
    assert block_moves(e, 1).shape == (0, 6)


def test_refine_descends_to_the_best_block_placement():
    # The score is the distance to a target with two runs plus a cost per run: greedy
    # block moves reach it from a placement with scattered runs.
    target = np.array([0] * 5 + [1] * 5, np.int32)

    def score(b):
        b = np.asarray(b)
        return (b != target).sum(1) + 0.1 * (np.diff(b, axis=1) != 0).sum(1)

    start = np.array([0, 1, 0, 0, 0, 1, 1, 2, 1, 1], np.int32)
    best, s, used = refine(score, start, float(score(start[None])[0]), 3, 8, 100)
    assert best.tolist() == target.tolist() and s == pytest.approx(0.1)
    assert 1 <= used < 100
    # The batch budget is honoured.
    _, _, used = refine(score, start, float(score(start[None])[0]), 3, 8, 2)
    assert used == 2


def test_trainer_keeps_the_elite_refines_it_and_times_the_update(gnn_case):
    g, _, inp, units = gnn_case
    pol = make_policy("gnn", units, 3, hidden=8)
    tr = Trainer(g, inp, units, pol, RLConfig(samples=16, oom="bound", refine_every=2,
                                              refine_batches=3), seed=0)
    state = tr.init_state()
    warm = np.zeros(units.num_units, np.int32)  # everything on device 0
    state, n, lik = tr.imitate(state, warm, 1e-3)
    assert n == 1 and lik > 0.5
    w_score = float(state.opt_state["elite_score"])
    ref = tr.simulator(True)(warm[np.asarray(units.unit_of_op)][None])
    assert w_score == pytest.approx(float(ref.step_time_s[0]), rel=1e-6)
    step = tr.update_fn("bound")
    scores = []
    with jax.enable_x64(True):
        for _ in range(4):
            state, p_best, s_best, stats = step(state, jnp.float32(1e-2), jnp.float32(0.0),
                                                jnp.float64(w_score))
            scores.append(float(state.opt_state["elite_score"]))
            assert "refine_gain" in stats
    # The elite never gets worse, and is what the simulator says it is.
    assert all(b <= a * (1 + 1e-6) for a, b in zip([w_score] + scores[:-1], scores, strict=True))
    elite = np.asarray(state.opt_state["elite"])
    sim = tr.simulator(True)(elite[np.asarray(units.unit_of_op)][None])
    assert scores[-1] == pytest.approx(float(sim.step_time_s[0]), rel=1e-6)
    assert int(state.opt_state["updates"]) == 4
    t = tr.timing
    assert t["updates"] == 4 and min(t["policy_s"], t["simulator_s"], t["learn_s"]) > 0


def test_units_split_by_a_warm_start_represent_it_exactly(gnn_case):
    from simplace.rl.features import split_by_placement

    g, _, inp, _ = gnn_case
    coarse = unit_grouping(g, 3)  # three ranges: a scattered placement cuts through them
    warm = (np.arange(g.num_ops) * 7 % 3).astype(np.int32)
    units = build_units(g, inp.op_time_s, unit_grouping(g, 3, split_by=warm))
    assert units.num_units > int(coarse.max()) + 1
    assert np.array_equal(units.unit_placement(warm)[units.unit_of_op], warm)
    # Each piece lies inside one coarse unit (a refinement of the grouping).
    pieces = split_by_placement(coarse, warm)
    assert all(len(set(coarse[pieces == k])) == 1 for k in range(int(pieces.max()) + 1))


@pytest.mark.parametrize("policy", ["seq2seq", "hierarchical"])
def test_initial_parameters_are_flax_trees_drawn_with_numpy(gnn_case, policy):
    """The policies draw their parameters with numpy (no program compiled per
    initialiser) in the trees the flax modules apply, with flax's scales: LeCun-normal
    kernels truncated at two deviations, orthogonal recurrent kernels, zero biases."""
    import flax.linen as nn

    from simplace.rl.policies._nets import init_dense, init_lstm, param_rng

    rng = param_rng(jax.random.key(5))
    mine = init_lstm(rng, 32, 48)
    carry = (jnp.zeros((1, 32)), jnp.zeros((1, 32)))
    flax_tree = nn.OptimizedLSTMCell(32).init(jax.random.key(0), carry,
                                              jnp.zeros((1, 48)))["params"]
    shapes = jax.tree.map(lambda a: (a.shape, a.dtype), mine)
    assert shapes == jax.tree.map(lambda a: (a.shape, a.dtype), flax_tree)
    h = np.asarray(mine["hf"]["kernel"])
    np.testing.assert_allclose(h @ h.T, np.eye(32), atol=1e-5)
    assert not np.any(np.asarray(mine["hf"]["bias"]))
    w = np.asarray(init_dense(rng, 300, 400)["kernel"])
    assert w.std() * 20 == pytest.approx(1.0, rel=0.03)  # variance 1 / fan-in
    assert np.abs(w).max() * 20 <= 2 / 0.8796 + 1e-6  # truncated at two deviations
    # The policy's own parameters: a fixed function of the key, and the policy runs.
    units = gnn_case[3]
    pol = make_policy(policy, units, 3, hidden=16)
    a, b, c = (pol.init(jax.random.key(s)) for s in (1, 1, 2))
    same = jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a, b)
    assert all(jax.tree.leaves(same))
    assert not all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)),
                                                a, c)))
    s = pol.sample(a, jax.random.key(0), 4)
    assert np.all(np.isfinite(np.asarray(s.logp)))


@pytest.mark.parametrize("policy", ["seq2seq", "hierarchical"])
def test_imitation_puts_the_policy_on_the_warm_start_and_scores_it(gnn_case, policy):
    """A warm start puts the policy on the target (seq2seq directly, hierarchical by
    imitation up to ``imitation_target``) and makes it the self-imitation elite, scored
    as the batched simulator scores it; the baseline and the update count are left for
    the updates."""
    g, cm, inp, units = gnn_case
    pol = make_policy(policy, units, 3, hidden=16)
    tr = Trainer(g, inp, units, pol, RLConfig(samples=8, imitation_target=0.9), seed=2)
    target = np.arange(units.num_units) * 3 // units.num_units
    state0 = tr.init_state()
    with jax.enable_x64(True):
        ll0 = float(jax.jit(pol.imitation_logp)(state0.params, jnp.asarray(target)))
    state, n, lik = tr.imitate(state0, target, 3e-2)
    if policy == "seq2seq":  # set on the target directly (its warm_start): one step
        assert n == 1 and lik == pytest.approx(1 - 2 / units.num_units, rel=1e-4)
    else:  # Adam steps until the likelihood reaches the target
        assert lik >= 0.9 > np.exp(ll0) and 1 <= n <= tr.cfg.imitation_steps
    np.testing.assert_array_equal(np.asarray(state.opt_state["elite"]), target)
    ref = tr.simulator(True)(target[units.unit_of_op][None]).step_time_s[0]
    assert float(state.opt_state["elite_score"]) == pytest.approx(ref, rel=1e-6)
    assert int(state.opt_state["updates"]) == 0 and np.isnan(float(state.baseline))


def test_seq2seq_warm_start_decodes_the_target_up_to_a_few_deviations(gnn_case):
    """seq2seq's warm start cancels the network's logits along the target: samples keep
    the target but for about ``explore`` units, and the host's likelihood (what the
    trainer reports) is the policy's own."""
    _, _, _, units = gnn_case
    u = units.num_units
    target = (np.arange(u) * 3 // u).astype(np.int32)
    pol = make_policy("seq2seq", units, 3, hidden=16, explore=1.0)
    with jax.enable_x64(True):
        params = pol.warm_start(pol.init(jax.random.key(0)), target)
        s = np.asarray(pol.sample(params, jax.random.key(1), 2000).unit_devices)
        ll = float(jax.jit(pol.imitation_logp)(params, jnp.asarray(target)))
        assert pol.host_imitation_logp(params, target) == pytest.approx(ll, abs=1e-5)
    assert np.exp(ll) == pytest.approx(1 - 1 / u, rel=1e-4)
    wrong = (s != target[None]).sum(1)
    assert 0.2 < (wrong == 0).mean() < 0.6  # about e^-1 of the samples are the target
    assert np.median(wrong) <= 2

"""The universal policy: size- and device-independent inputs, its chain distribution,
training over many problems, the weights file, and the rl-pretrained / rl-universal
methods."""

import itertools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simplace.cost_model import CostModel
from simplace.errors import SimplaceError
from simplace.rl import distribution as dist
from simplace.rl.policies import universal as net
from simplace.rl.pretrain import PretrainConfig, make_training_problem, train_universal
from simplace.rl.pretrained import SHIPPED, load_weights, save_weights, zero_shot
from simplace.rl.problem import (
    CLASS_NAMES,
    DEVICE_FEATURES,
    MAX_DEVICES,
    PAIR_FEATURES,
    UNIT_FEATURES,
    op_classes,
    policy_problem,
)
from simplace.sim.inputs import make_sim_inputs

# The device feature that says a device shares its hardware (policy_problem's column 7).
DEVICE_SHARED = 7


def _machine(graph, speeds, mem=1e12, bw=1e10):
    """SimInputs: op time = flops / speed per device, uniform links."""
    d = len(speeds)
    t = np.asarray(graph.flops, np.float64)[:, None] / np.asarray(speeds)[None] + 1e-6
    return make_sim_inputs(t, np.full((d, d), 1e-5), np.full((d, d), bw), np.full(d, mem))


@pytest.fixture(scope="module")
def dag():
    return dist.random_dag(120, seed=3)


def test_features_have_fixed_widths_whatever_the_graph_and_machine(dag, mlp_graph):
    for g, d in ((dag, 3), (mlp_graph, 6)):
        p = policy_problem(g, _machine(g, np.linspace(1e9, 4e9, d)))
        assert p.unit_feat.shape == (p.num_units, UNIT_FEATURES)
        assert p.device_feat.shape == (d, DEVICE_FEATURES)
        assert p.pair_feat.shape == (p.num_units, d, PAIR_FEATURES)
        assert np.isfinite(p.unit_feat).all() and np.isfinite(p.pair_feat).all()
        # units are in a topological order of the quotient graph
        assert (p.src < p.dst).all()
        pad = p.padded()
        u_pad, e_pad, d_pad = p.shape_key()
        assert pad["pair_feat"].shape == (u_pad, d_pad, PAIR_FEATURES)
        assert pad["unit_mask"].sum() == p.num_units and pad["device_mask"].sum() == d
        assert pad["edge_w"].sum() == len(p.src) and len(pad["src"]) == e_pad


def test_padding_to_a_larger_problem_s_shape_changes_no_score(dag):
    # zero_shot pads its coarse problems as the op-level one: the padding must be inert
    params, _ = load_weights()
    inp = _machine(dag, [1e9, 4e9, 4e9])
    p = policy_problem(dag, inp, max_units=32)
    big = (4 * p.shape_key()[0], 4 * p.shape_key()[1], 32)
    pad = p.padded(at_least=big)
    assert tuple(pad["pair_feat"].shape[:2]) == (big[0], 32) and len(pad["src"]) == big[1]
    own = net.logits(params, {k: jnp.asarray(v) for k, v in p.padded().items()})
    wide = net.logits(params, {k: jnp.asarray(v) for k, v in pad.items()})
    u, d = p.num_units, p.num_devices
    np.testing.assert_allclose(np.asarray(wide[0])[:u, :d], np.asarray(own[0])[:u, :d],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(wide[1])[:u], np.asarray(own[1])[:u],
                               rtol=1e-5, atol=1e-5)


def test_device_features_follow_a_permutation_of_the_devices(dag):
    speeds = np.array([1e9, 3e9, 2e9, 5e9])
    perm = np.array([2, 0, 3, 1])
    a = policy_problem(dag, _machine(dag, speeds))
    b = policy_problem(dag, _machine(dag, speeds[perm]))
    np.testing.assert_allclose(b.device_feat, a.device_feat[perm], atol=1e-6)
    np.testing.assert_allclose(b.pair_feat, a.pair_feat[:, perm], atol=1e-6)
    np.testing.assert_allclose(b.unit_feat, a.unit_feat, atol=1e-6)


def test_interchangeable_devices_are_told_apart_and_targets_relabelled(dag):
    from simplace.rl.problem import canonical

    p = policy_problem(dag, _machine(dag, [1e9, 4e9, 4e9, 4e9]))
    assert list(p.device_class) == [0, 1, 1, 1]
    # the three GPUs differ only in their rank within the class
    gpus = p.device_feat[1:]
    assert len({tuple(r) for r in gpus.round(6)}) == 3
    np.testing.assert_allclose(gpus[:, :-2], np.repeat(gpus[:1, :-2], 3, 0))
    # placements equal up to a permutation of the GPUs read the same
    a = np.array([3, 3, 1, 0, 2, 1])
    b = np.array([2, 2, 3, 0, 1, 3])
    np.testing.assert_array_equal(canonical(a, p.device_class), canonical(b, p.device_class))
    np.testing.assert_array_equal(canonical(a, p.device_class), [1, 1, 2, 0, 3, 2])


def test_unknown_op_kinds_count_as_other():
    cls = op_classes(["dot_general", "my_custom_call", "conv_general_dilated", "add"])
    assert [CLASS_NAMES[c] for c in cls] == ["matmul", "other", "conv", "arith"]


def test_too_many_devices_are_refused_with_the_limit(dag):
    with pytest.raises(SimplaceError, match=f"at most {MAX_DEVICES} devices"):
        policy_problem(dag, _machine(dag, np.full(MAX_DEVICES + 1, 1e9)))


def _tiny_arrays(num_units, num_devices, seed=0):
    rng = np.random.default_rng(seed)
    u_pad, d_pad = num_units + 2, num_devices + 3  # padded units and devices present
    # unit 2 follows unit 0 (a branch), unit 1 follows 0; padded units are their own
    parent = np.arange(u_pad, dtype=np.int32)
    parent[1], parent[2] = 0, 0
    a = {"unit_feat": rng.normal(size=(u_pad, UNIT_FEATURES)).astype(np.float32),
         "device_feat": rng.normal(size=(d_pad, DEVICE_FEATURES)).astype(np.float32),
         "pair_feat": rng.normal(size=(u_pad, d_pad, PAIR_FEATURES)).astype(np.float32),
         "src": np.array([0, 0, u_pad - 1], np.int32), "dst": np.array([1, 2, u_pad - 1],
                                                                       np.int32),
         "edge_w": np.array([1, 1, 0], np.float32), "edge_feat": np.zeros(3, np.float32),
         "parent": parent, "has_parent": (parent != np.arange(u_pad)).astype(np.float32),
         "unit_mask": (np.arange(u_pad) < num_units).astype(np.float32),
         "device_mask": (np.arange(d_pad) < num_devices).astype(np.float32)}
    return {k: jnp.asarray(v) for k, v in a.items()}


def _every(u, d):
    every = np.array(list(itertools.product(range(d), repeat=u)), np.int32)
    full = np.zeros((len(every), u + 2), np.int32)
    full[:, :u] = every
    return every, jnp.asarray(full)


def test_shared_variants_split_the_host_into_virtual_devices_of_one_chip(dag):
    inp = CostModel.load("haswell_k40x4").price(dag)
    host_mem = float(np.asarray(inp.memory_bytes)[0])
    splits = set()
    for seed in range(12):
        v = dist.perturbed(inp, seed, shared=True)
        groups = np.asarray(v.exclusive_group)
        split = int(np.sum(groups == groups[0]))
        splits.add(split)
        assert 2 <= split <= 4 and v.num_devices <= MAX_DEVICES
        assert np.all(groups[:split] == groups[0])  # the host's copies share it...
        assert len(set(groups[split:].tolist())) == v.num_devices - split  # ...no others
        t = np.asarray(v.op_time_s)
        assert np.allclose(t[:, :split], t[:, :1])  # one chip's speed
        mem = np.asarray(v.memory_bytes)[:split]
        assert np.allclose(mem, mem[0]) and mem.sum() <= 2.0 * host_mem * (1 + 1e-9)
        # a policy sees the sharing
        feats = policy_problem(dag, v).device_feat
        assert np.all(feats[:split, DEVICE_SHARED] == 1) and not feats[split:, DEVICE_SHARED].any()
    assert len(splits) > 1
    # without shared, copies of a device never share its group (as before)
    groups = np.asarray(dist.perturbed(inp, 0).exclusive_group)
    assert len(set(groups.tolist())) == len(groups)


def test_more_variants_keep_the_names_and_machines_of_the_first():
    one = dist.training_specs(0, quick=True)
    more = dist.training_specs(0, quick=True, variants=3, shared=1)
    names = [n for n, _ in more]
    assert {n for n, _ in one} <= set(names) and len(names) == len(set(names))
    assert len(more) - len(one) == 3 * 2 * 2  # 2 graphs x 2 machines x 3 more
    # the first variant is the very problem it always was (its cached target is its own)
    (name, old), = [(n, b) for n, b in one if n.endswith("~0") and n.startswith("mlp@")][:1]
    _, new = next((n, b) for n, b in more if n == name)
    a, b = old()[1], new()[1]
    assert np.array_equal(np.asarray(a.op_time_s), np.asarray(b.op_time_s))
    shared = [b for n, b in more if n.endswith("s")]
    assert len(shared) == 4 and all(
        np.sum(np.asarray(b()[1].exclusive_group) == 0) >= 2 for b in shared)


def test_probabilities_sum_to_one_and_greedy_follows_the_likelier_choice():
    u, d = 3, 3
    a = _tiny_arrays(u, d)
    params = jax.tree.map(jnp.asarray, net.init_params(1, hidden=8, layers=2))
    every, full = _every(u, d)
    lp, _ = net.chain_logp(params, a, full)
    assert float(jnp.exp(lp).sum()) == pytest.approx(1.0, abs=1e-5)
    lg, f = net.logits(params, a)
    lg, f = np.asarray(lg)[:, :d], np.asarray(f)
    g = net.greedy(lg, f, np.asarray(a["parent"]), u)
    assert g[0] == lg[0].argmax()
    for k in (1, 2):
        assert g[k] == (g[0] if f[k] > 0 else lg[k].argmax())


def test_samples_follow_the_distribution_and_never_draw_padded_devices():
    u, d = 3, 2
    a = _tiny_arrays(u, d, seed=1)
    params = jax.tree.map(jnp.asarray, net.init_params(2, hidden=8, layers=1))
    fresh, follow = net.draw(params, a, jax.random.key(0), 10000)
    dev = net.resolve(fresh, follow, a["parent"])
    assert not np.asarray(follow)[:, u:].any() and not np.asarray(follow)[:, 0].any()
    assert dev.max() < d
    every, full = _every(u, d)
    prob = np.exp(np.asarray(net.chain_logp(params, a, full)[0]))
    freq = np.array([np.mean((dev[:, :u] == e).all(1)) for e in every])
    np.testing.assert_allclose(freq, prob, atol=0.02)


def test_parents_are_the_heaviest_predecessor(dag):
    p = policy_problem(dag, _machine(dag, [1e9, 2e9]))
    assert p.num_units == dag.num_ops  # small graphs are placed op by op
    for u in range(p.num_units):
        ins = np.flatnonzero(p.dst == u)
        if not len(ins):
            assert p.parent[u] == u
        else:
            assert p.parent[u] in p.src[ins] and p.parent[u] < u


def _problems(dag, mlp_graph):
    fast_gpu = [1e9, 8e9, 8e9]
    return [make_training_problem("dag", dag, _machine(dag, fast_gpu)),
            make_training_problem("mlp", mlp_graph, _machine(mlp_graph, fast_gpu)),
            make_training_problem("dag2", dag, _machine(dag, [6e9, 1e9]))]


def test_training_is_seeded_resumable_and_learns(dag, mlp_graph, tmp_path):
    cfg = PretrainConfig(samples=16, lr=3e-3)
    p_a, info_a = train_universal(_problems(dag, mlp_graph), updates=40, seed=5, config=cfg)
    p_b, _ = train_universal(_problems(dag, mlp_graph), updates=40, seed=5, config=cfg)
    for k in p_a:
        np.testing.assert_array_equal(p_a[k]["kernel"], p_b[k]["kernel"])
    ck = str(tmp_path / "ck.npz")
    train_universal(_problems(dag, mlp_graph), updates=40, seed=5, config=cfg, checkpoint=ck,
                    stop_after=20)
    p_c, info_c = train_universal(_problems(dag, mlp_graph), updates=40, seed=5, config=cfg,
                                  checkpoint=ck)
    assert info_c["updates"] == 40
    for k in p_a:
        np.testing.assert_allclose(p_a[k]["kernel"], p_c[k]["kernel"], rtol=1e-4, atol=1e-5)
    # Samples get closer to the best known placements as training goes on.
    curve = train_universal(_problems(dag, mlp_graph), updates=200, seed=5,
                            config=cfg)[1]["curve"]
    assert curve[-1] < curve[0]
    with pytest.raises(SimplaceError, match="other problems"):
        train_universal(_problems(dag, mlp_graph)[:2], updates=50, seed=5, config=cfg,
                        checkpoint=ck)


def test_weights_round_trip_and_bad_files_say_how_to_mend(tmp_path):
    params = net.init_params(0)
    path = tmp_path / "w.npz"
    save_weights(path, params, {"summary": "test"})
    back, meta = load_weights(path)
    assert meta["card"]["summary"] == "test"
    for k in params:
        np.testing.assert_array_equal(back[k]["kernel"], params[k]["kernel"])
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file")
    with pytest.raises(SimplaceError, match="damaged.*train-policy"):
        load_weights(bad)
    with pytest.raises(SimplaceError, match="No policy weights"):
        load_weights(tmp_path / "missing.npz")
    flat = dict(np.load(path))
    meta = json.loads(str(flat["meta"]))
    for change, msg in (({"version": 99}, "version 99"), ({"unit_features": 3}, "other policy "
                                                                                  "inputs")):
        flat["meta"] = np.array(json.dumps({**meta, **change}))
        np.savez(tmp_path / "other.npz", **flat)
        with pytest.raises(SimplaceError, match=msg):
            load_weights(tmp_path / "other.npz")
    flat["meta"] = np.array(json.dumps(meta))
    flat["params/unit_in/kernel"] = flat["params/unit_in/kernel"][:3]
    np.savez(tmp_path / "cut.npz", **flat)
    with pytest.raises(SimplaceError, match="complete set"):
        load_weights(tmp_path / "cut.npz")


def test_shipped_weights_load_are_small_and_carry_a_card():
    assert SHIPPED.stat().st_size < 5 * 2**20
    _, meta = load_weights()
    card = meta["card"]
    for key in ("summary", "command", "problems", "seed", "updates", "held_out_models"):
        assert key in card
    zoo_models = {n.split("@")[0].split("[")[0] for n in card["problems"] if "/" not in n}
    machines = {n.split("@")[1].split("~")[0] for n in card["problems"] if "@" in n}
    assert zoo_models and not zoo_models & set(card["held_out_models"])
    assert machines and not machines & set(card["held_out_machines"])
    assert not set(card["problems"]) & set(card["held_out_imported"])


def test_rl_pretrained_places_validly_and_is_seeded(mlp_graph):
    from simplace.placers import optimize

    cm = CostModel.load("haswell_k40x4")
    a = optimize(mlp_graph, cm, "rl-pretrained", seed=1)
    b = optimize(mlp_graph, cm, "rl-pretrained", seed=1)
    assert a.placement.shape == (mlp_graph.num_ops,)
    assert a.placement.max() < cm.num_devices and not a.oom
    np.testing.assert_array_equal(a.placement, b.placement)
    # The reported time is the best scored, and the reference simulator agrees.
    assert a.step_time_s == pytest.approx(a.info["step_time_s"], rel=1e-9)


def test_rl_pretrained_falls_back_when_the_shipped_weights_are_damaged(mlp_graph, tmp_path,
                                                                       monkeypatch):
    from simplace.placers import optimize
    from simplace.rl import pretrained

    bad = tmp_path / "universal.npz"
    bad.write_bytes(b"\0" * 10)
    monkeypatch.setattr(pretrained, "SHIPPED", bad)
    pretrained.cached_weights.cache_clear()
    said = []
    r = optimize(mlp_graph, CostModel.load("haswell_k40x2"), "rl-pretrained",
                 progress=said.append)
    assert r.info["fallback"] == "heft" and "damaged" in said[0]
    with pytest.raises(SimplaceError, match="damaged"):
        optimize(mlp_graph, CostModel.load("haswell_k40x2"), "rl-pretrained", weights=str(bad))
    pretrained.cached_weights.cache_clear()


def test_zero_shot_is_never_worse_than_its_greedy_placement(dag):
    inp = _machine(dag, [1e9, 4e9, 4e9])
    placement, info = zero_shot(dag, inp, samples=32)
    assert info["step_time_s"] <= info["greedy_s"] + 1e-15
    # the 120 ops and the graph coarsened to 32 groups (128 > 120: not tried), the
    # greedy and 32 samples each, and the 3 single devices
    assert info["scored"] == 2 * 33 + 3 and placement.shape == (dag.num_ops,)
    assert zero_shot(dag, inp, samples=32, coarse=())[1]["scored"] == 33 + 3
    # never slower than the whole graph on one device
    from simplace.sim import simulate

    alone = min(simulate(dag, inp, np.full(dag.num_ops, k)).step_time_s for k in range(3))
    assert info["step_time_s"] <= alone * (1 + 1e-12)


def test_rl_universal_fine_tunes_from_the_pretrained_start(mlp_graph):
    from simplace.placers import optimize

    cm = CostModel.load("haswell_k40x4")
    zs = optimize(mlp_graph, cm, "rl-pretrained", refine_rounds=0)  # its start: the batch
    r = optimize(mlp_graph, cm, "rl-universal", warm_start="pretrained", samples=16,
                 updates=30)
    assert r.step_time_s <= zs.step_time_s * (1 + 1e-9)
    assert r.info["updates"] == 30 and r.info["zero_shot_s"] >= r.step_time_s * (1 - 1e-9)
    again = optimize(mlp_graph, cm, "rl-universal", samples=16, updates=30)
    np.testing.assert_array_equal(again.placement, r.placement)
    heft = optimize(mlp_graph, cm, "heft")
    from_heft = optimize(mlp_graph, cm, "rl-universal", warm_start="heft", samples=16,
                         updates=30)
    assert from_heft.step_time_s <= min(heft.step_time_s, zs.step_time_s) * (1 + 1e-9)
    assert "heft" in from_heft.info["warm_starts"]


def test_rl_universal_skips_updates_whose_share_is_too_short(mlp_graph, monkeypatch):
    """Under a budget whose update share is below MIN_UPDATES_S no update runs (the
    first compiles: 1.35 s on nmt_4layer, past a 2 s budget); the searches take it."""
    from simplace.placers import optimize
    from simplace.rl import pretrain

    calls = []
    real = pretrain.train_universal
    monkeypatch.setattr(pretrain, "train_universal",
                        lambda *a, **k: calls.append(k["budget_s"]) or real(*a, **k))
    cm = CostModel.load("haswell_k40x4")
    r = optimize(mlp_graph, cm, "rl-universal", samples=16, budget_s=1.0)
    assert calls == [] and r.info["updates"] == 0
    assert "under 1.0 s" in r.info["updates_skipped"]
    assert r.step_time_s <= r.info["zero_shot_s"] * (1 + 1e-9)


def test_train_policy_command_writes_weights_and_refuses_no_budget(tmp_path, capsys):
    from simplace.cli import main

    out = tmp_path / "w.npz"
    args = ["train-policy", "--quick", "--updates", "5", "--target-budget-s", "0", "--out",
            str(out)]
    assert main(args) == 0
    _, meta = load_weights(out)
    assert meta["card"]["updates"] == 5 and "problem 1/" in capsys.readouterr().err
    assert main(["train-policy", "--quick", "--out", str(tmp_path / "x.npz")]) == 2
    assert "--budget-s or --updates" in capsys.readouterr().err
    assert not (tmp_path / "x.npz").exists()
    # More training from those weights: the card keeps what they were trained on.
    more = tmp_path / "more.npz"
    assert main([*args[:-1], str(more), "--updates", "3", "--init-weights", str(out)]) == 0
    params, meta2 = load_weights(more)
    assert meta2["card"]["continued_from"]["updates"] == 5
    first, _ = load_weights(out)
    assert not np.array_equal(params["pair_out"]["kernel"], first["pair_out"]["kernel"])
    assert main([*args[:-1], str(more), "--init-weights", str(tmp_path / "none.npz")]) == 2
    assert "No policy weights" in capsys.readouterr().err


@pytest.mark.slow  # seconds of budget, and a traced model
def test_rl_universal_under_a_budget_searches_from_the_fine_tuned_placement(mlp_graph,
                                                                           monkeypatch):
    from simplace.placers import optimize, pretrained
    from simplace.rl import refine

    polished = []

    def spy(score, placement, placement_score, *args, deadline=np.inf, **kwargs):
        out = real(score, placement, placement_score, *args, deadline=deadline, **kwargs)
        polished.append((placement_score, deadline, out[1]))
        return out

    real = refine.polish
    monkeypatch.setattr(refine, "polish", spy)
    # the updates run within their share, short as it is here; compiled first, so that
    # the first update does not take the budget (local is not begun without time left)
    monkeypatch.setattr(pretrained, "MIN_UPDATES_S", 0.01)
    cm = CostModel.load("haswell_k40x4")
    optimize(mlp_graph, cm, "rl-universal", samples=16, updates=1)
    polished.clear()
    t0 = time.perf_counter()
    r = optimize(mlp_graph, cm, "rl-universal", samples=16, budget_s=3.0)
    assert r.info["stop"] == "time budget" and isinstance(r.info["local"], dict)
    assert "updates_skipped" not in r.info
    # local starts from the fine-tuned placement: never worse than it or the zero shot
    assert r.step_time_s <= r.info["fine_tuned_s"] * (1 + 1e-9)
    assert r.step_time_s <= r.info["zero_shot_s"] * (1 + 1e-9)
    assert r.info["updates"] >= 0  # how many fit in the budget depends on the load
    # the fine-tuned policy guided a search before local (its rounds depend on the load:
    # a fresh process spends this budget compiling; the next test runs it)
    assert r.info["guided"]["lanes"][-1]["start"] == r.info["guided"]["start"]
    assert r.step_time_s <= r.info["guided"]["step_time_s"] * (1 + 1e-9)
    # the cheap heuristics ran first, and the result is never worse than any of them
    assert r.step_time_s <= min(r.info["heuristic_starts"].values()) * (1 + 1e-9)
    # the op-level descent ends it, from local's result, until the budget's end (and
    # when it converges early, local and the descent again from its result)
    cycles = r.info["finish"]
    assert len(polished) == len(cycles) >= 1
    assert polished[0][0] == pytest.approx(r.info["local"]["score"], rel=1e-9)
    # every descent runs to the one deadline, the budget's end
    assert len({deadline for _, deadline, _ in polished}) == 1
    assert t0 < polished[0][1] <= t0 + 3.01
    assert all(c["descended"] <= c["annealed"] for c in cycles)
    assert all(b["annealed"] <= a["descended"] for a, b in itertools.pairwise(cycles))
    assert r.step_time_s == pytest.approx(polished[-1][2], rel=1e-9)
    assert r.info["polish_batches"] == sum(c["batches"] for c in cycles)
    alone = optimize(mlp_graph, cm, "rl-universal", samples=16, budget_s=3.0, guided_share=0)
    assert "guided" not in alone.info and isinstance(alone.info["local"], dict)


def test_the_fine_tuned_policy_guides_a_search_that_never_loses(dag):
    import time

    from simplace.placers import PlacerContext
    from simplace.placers.pretrained import _guided
    from simplace.rl.pretrained import SHIPPED, cached_weights

    ctx = PlacerContext(dag, _machine(dag, [1e9, 4e9, 4e9], bw=1e8), seed=1)
    start = (np.arange(dag.num_ops) % 3).astype(np.int32)  # a cut on nearly every edge
    s0 = float(ctx.score(start[None])[0])
    params = cached_weights(str(SHIPPED))[0]
    # compiled first (the policy's programs, the proposer), so that the second counts
    # rounds, not compilation, whatever ran before in this worker
    _guided(ctx, params, [("fine-tuned", start, s0)], time.perf_counter() + 0.01, {})
    info = {}
    p, s = _guided(ctx, params, [("fine-tuned", start, s0)], time.perf_counter() + 1.0, info)
    assert info["guided"]["rounds"] >= 1 and info["guided"]["lanes"][0]["from_s"] == s0
    assert s < s0 * 0.9 and s == pytest.approx(float(ctx.score(p[None])[0]), rel=1e-12)
    # a deadline already past: the start stands
    p2, s2 = _guided(ctx, params, [("fine-tuned", start, s0)], time.perf_counter() - 1, {})
    assert s2 == s0 and np.array_equal(p2, start)


def test_local_is_not_begun_without_the_time_its_first_batch_takes(dag, monkeypatch):
    """Past its share (the first call of a process, the guided search's first round
    compiled) local is skipped and said so, and the descent still runs: begun with no
    time left on nmt_4layer it took 0.26 s past a 2 s budget."""
    import time

    from simplace.placers import PlacerContext, pretrained

    ctx = PlacerContext(dag, _machine(dag, [1e9, 4e9, 4e9], bw=1e8), seed=1)
    start = (np.arange(dag.num_ops) % 3).astype(np.int32)
    s0 = float(ctx.score(start[None])[0])
    ran = []
    monkeypatch.setattr(pretrained, "_local", lambda *a: ran.append(a) or (a[1], a[2], {}))
    edges = (np.asarray(dag.src), np.asarray(dag.dst))
    screen = lambda b: ctx.screen(b).step_time_s  # noqa: E731
    now, info = time.perf_counter(), {}
    p, s = pretrained._anneal_and_descend(ctx, start, s0, [start], info, now - 0.01,
                                          now + 0.5, 8, edges, screen)
    assert ran == [] and info["local"].startswith("skipped: under")
    assert info["finish"][0]["batches"] >= 1 and s <= s0
    monkeypatch.setattr(pretrained, "LOCAL_FIRST_S_PER_OP", 0.0)  # no floor: it runs
    now = time.perf_counter()
    pretrained._anneal_and_descend(ctx, start, s0, [start], {}, now + 0.3, now + 0.4, 8,
                                   edges, screen)
    assert len(ran) >= 1


def test_the_guided_search_races_its_starts_and_keeps_the_fastest(dag):
    import time

    from simplace.placers import PlacerContext
    from simplace.placers.pretrained import _guided
    from simplace.rl.pretrained import SHIPPED, cached_weights

    ctx = PlacerContext(dag, _machine(dag, [1e9, 4e9, 4e9], bw=1e8), seed=1)
    params = cached_weights(str(SHIPPED))[0]
    rr = (np.arange(dag.num_ops) % 3).astype(np.int32)
    one = np.ones(dag.num_ops, np.int32)  # one fast device: far better than round robin
    half = np.where(np.arange(dag.num_ops) < dag.num_ops // 2, 1, 2).astype(np.int32)
    starts = [(name, p, float(ctx.score(p[None])[0]))
              for name, p in (("rr", rr), ("one", one), ("half", half))]
    _guided(ctx, params, starts[:1], time.perf_counter() + 0.01, {})  # compiled first
    info = {}
    p, s = _guided(ctx, params, starts, time.perf_counter() + 1.5, info)
    # three lanes: one stops after the first rung, one after the second; the rows name
    # every lane once, the winner last, each never worse than where it began
    rows = info["guided"]["lanes"]
    assert sorted(r["start"] for r in rows) == ["half", "one", "rr"]
    assert all(r["score"] <= r["from_s"] and r["rounds"] >= 1 for r in rows)
    assert rows[-1]["start"] == info["guided"]["start"]
    assert rows[-1]["score"] == min(r["score"] for r in rows) == s
    assert info["guided"]["rounds"] == sum(r["rounds"] for r in rows)
    assert s <= min(x[2] for x in starts) and s == pytest.approx(float(ctx.score(p[None])[0]))


def test_the_pretrained_policy_is_a_learned_heuristic():
    # Training targets and the held-out baselines leave it out by this flag, not its name.
    from simplace.placers import methods_of_kind

    assert methods_of_kind("heuristic", learned=True) == ["rl-pretrained"]
    plain = methods_of_kind("heuristic", learned=False)
    assert "rl-pretrained" not in plain and {"heft", "m_etf", "single"} <= set(plain)
    assert sorted(plain + ["rl-pretrained"]) == methods_of_kind("heuristic")


@pytest.mark.slow  # seconds of budget, and a traced model
def test_the_optimize_command_runs_rl_universal(tmp_path, capsys):
    # The command passed rl-gnn's progress bar to every policy, which rl-universal
    # refused: the command always failed.
    from simplace.cli import main

    out = tmp_path / "p.json"
    assert main(["optimize", "mlp", "--cost-model", "haswell_k40x4", "--method",
                 "rl-universal", "--samples", "16", "--budget-s", "4", "--out",
                 str(out)]) == 0
    assert out.is_file() and "step time" in capsys.readouterr().out
    assert main(["optimize", "mlp", "--cost-model", "haswell_k40x4", "--method",
                 "rl-universal", "--history", "h.json"]) == 2
    assert "--history does not apply to --method rl-universal" in capsys.readouterr().err


def test_zero_shot_races_the_rivals_that_beat_the_policy(dag):
    import time

    from simplace.sim import simulate

    inp = _machine(dag, [1e9, 4e9, 4e9], bw=1e8)
    batch = zero_shot(dag, inp, samples=8)[1]
    better, _ = zero_shot(dag, inp, samples=8, refine_rounds=40)  # a placement to rival
    better_s = simulate(dag, inp, better).step_time_s
    assert better_s < batch["step_time_s"]
    worst = np.zeros(dag.num_ops, np.int32)  # the slowest device alone
    # scored in the batch: the rival that beats the policy's rows is the answer
    p, info = zero_shot(dag, inp, samples=8, rivals=[("mine", better), ("slow", worst)])
    assert info["picked"] == "mine" and np.array_equal(p, better)
    assert info["scored"] == batch["scored"] + 2
    # under a deadline the search races it with the policy's best; the slow one stays out
    p, info = zero_shot(dag, inp, samples=8, rivals=[("mine", better), ("slow", worst)],
                        refine_rounds=10**9, refine_until=time.perf_counter() + 0.5)
    lanes = {lane["start"] for lane in info["refine"]["lanes"]}
    assert "mine" in lanes and "slow" not in lanes and len(lanes) == 2
    assert info["step_time_s"] <= better_s * (1 + 1e-12)
    assert simulate(dag, inp, p).step_time_s == pytest.approx(info["step_time_s"], rel=1e-9)
    # a rival no faster than the policy's best is not raced
    info = zero_shot(dag, inp, samples=8, rivals=[("slow", worst)], refine_rounds=10**9,
                     refine_until=time.perf_counter() + 0.2)[1]
    assert "lanes" not in info["refine"]


def test_rl_pretrained_with_a_budget_races_the_cheap_heuristics(mlp_graph):
    from simplace.placers import optimize

    cm = CostModel.load("haswell_k40x4")
    r = optimize(mlp_graph, cm, "rl-pretrained", budget_s=1.5)
    found = r.info["heuristic_starts"]
    # single is not run: the batch holds every single device
    assert found and "single" not in found and "rl-pretrained" not in found
    assert r.step_time_s <= min(found.values()) * (1 + 1e-12)
    # without a budget (or rounds) none run
    assert "heuristic_starts" not in optimize(mlp_graph, cm, "rl-pretrained",
                                              refine_rounds=5).info
    assert "heuristic_starts" not in optimize(mlp_graph, cm, "rl-pretrained", budget_s=1.5,
                                              refine_rounds=0).info


def test_zero_shot_also_places_the_coarsened_graph(dag):
    # On a machine of four virtual devices that share one chip the best placement is
    # one device or whole blocks; the coarse candidates are placements of whole groups
    # (every op of a group on one device), and zero-shot is never worse with them.
    from simplace.groups import colocate_free_ops, target_count

    inp = _machine(dag, [2e9] * 4)._replace(exclusive_group=np.zeros(4, np.int64))
    fine = zero_shot(dag, inp, samples=16, coarse=())[1]
    both = zero_shot(dag, inp, samples=16, coarse=(32,))[1]
    assert both["step_time_s"] <= fine["step_time_s"] * (1 + 1e-12)
    assert both["scored"] == fine["scored"] + 17
    groups = target_count(dag, 32, colocate_free_ops(dag))
    prob = policy_problem(dag, inp, max_units=32)
    assert prob.num_units <= 32
    p = prob.expand(np.arange(prob.num_units) % 4)
    for grp in np.unique(groups):
        assert len(set(p[groups == grp].tolist())) == 1


def test_the_fine_tune_runs_the_cheap_heuristics_best_first(mlp_graph):
    from simplace.placers import PlacerContext, optimize
    from simplace.placers.pretrained import _cheap_heuristics

    cm = CostModel.load("haswell_k40x4")
    ctx = PlacerContext(mlp_graph, cm, budget_s=30.0)
    info = {}
    found = _cheap_heuristics(ctx, info)
    scores = ctx.score(np.stack([p for _, _, p in found]))
    assert len(found) >= 5 and np.all(np.diff(scores) >= 0)  # the best first
    assert [s for s, _, _ in found] == pytest.approx(scores.tolist(), rel=1e-12)
    assert info["heuristic_starts"] == {n: s for s, n, _ in found}
    assert "rl-pretrained" not in info["heuristic_starts"]  # the policy's is given apart
    # without a budget there is no search to feed
    assert _cheap_heuristics(PlacerContext(mlp_graph, cm), {}) == []
    heft = optimize(mlp_graph, cm, "heft").step_time_s
    assert min(scores) <= heft * (1 + 1e-9)


def test_the_guided_race_takes_distinct_heuristics_that_beat_the_fine_tuned_placement():
    from simplace.rl.guided import race_lanes

    best = np.array([0, 1, 2, 3], np.int32)
    a, b, c = (np.array(x, np.int32) for x in ([1, 1, 1, 1], [0, 0, 1, 1], [2, 2, 2, 2]))
    found = [("m_sct", a, 1.0), ("m_etf", a.copy(), 1.0),  # alike: one lane
             ("heft", b, 2.0), ("metis", c, 3.0), ("single", c, 9.0)]

    def names(best_s):
        lanes = race_lanes(("fine-tuned", best, best_s), found)
        assert lanes[0][0] == "fine-tuned"
        return [(n, s) for n, _, s in lanes[1:]]

    assert names(5.0) == [("m_sct", 1.0), ("heft", 2.0)]
    assert names(2.5) == [("m_sct", 1.0), ("heft", 2.0)]
    assert names(1.5) == [("m_sct", 1.0)]
    assert names(1.0) == []


def _guided_setup(dag):
    from simplace.sim.native import NativeSimulator

    inp = _machine(dag, [1e9, 4e9, 4e9], bw=1e8)
    sim = NativeSimulator(dag, inp, memory="oom")

    def scores(batch):
        r = sim(batch)
        return np.where(np.asarray(r.oom), np.inf, np.asarray(r.step_time_s, np.float64))

    return inp, scores


def test_guided_resampling_never_loses_is_seeded_and_stops_when_told(dag):
    from simplace.rl.guided import Level, refine

    inp, scores = _guided_setup(dag)
    # a poor start: ops dealt round-robin over the devices (a cut on nearly every edge)
    start = (np.arange(dag.num_ops) % 3).astype(np.int32)
    s0 = float(scores(start[None])[0])
    lv = [Level(np.full((dag.num_ops, 3), 1 / 3), np.arange(dag.num_ops))]
    kw = {"src": dag.src, "dst": dag.dst, "rounds": 30, "seed": 4}
    a, sa, info = refine(lv, start, s0, scores, **kw)
    b, sb, _ = refine(lv, start, s0, scores, **kw)
    np.testing.assert_array_equal(a, b)
    assert sa == sb < s0 * 0.9 and info["gains"] >= 1
    assert sa == pytest.approx(float(scores(a[None])[0]), rel=1e-12)
    assert info["rounds"] <= 30 and info["from_s"] == s0
    # another seed searches elsewhere; a deadline already past runs no round
    c, _, _ = refine(lv, start, s0, scores, **{**kw, "seed": 5})
    assert not np.array_equal(a, c)
    import time

    _, s_late, late = refine(lv, start, s0, scores, **kw, until=time.perf_counter() - 1)
    assert late["rounds"] == 0 and late["stop"] == "time" and s_late == s0



def _converging_search(dag, monkeypatch):
    """A one-level guided search on ``dag`` that converges after 2 idle rounds: (guided
    module, scores, round-robin start, its score, levels, refine's keywords)."""
    from simplace.rl import guided

    _, scores = _guided_setup(dag)
    start = (np.arange(dag.num_ops) % 3).astype(np.int32)
    s0 = float(scores(start[None])[0])
    lv = [guided.Level(np.full((dag.num_ops, 3), 1 / 3), np.arange(dag.num_ops))]
    monkeypatch.setattr(guided, "PATIENCE", 2)
    return guided, scores, start, s0, lv, {"src": dag.src, "dst": dag.dst, "seed": 1}


def test_guided_resampling_restarts_when_converged_under_a_deadline(dag, monkeypatch):
    import time

    guided, scores, start, s0, lv, kw = _converging_search(dag, monkeypatch)
    # without a deadline the search stops once converged...
    p1, s1, done = guided.refine(lv, start, s0, scores, rounds=10_000, **kw)
    assert done["stop"] == "converged" and done["restarts"] == 0
    # ...with one it restarts away from the best, and still returns the best it saw
    best, best_s, info = guided.refine(lv, p1, s1, scores, rounds=40, **kw,
                                       until=time.perf_counter() + 3600)
    assert info["restarts"] >= 1 and info["rounds"] == 40 and info["stop"] == "rounds"
    assert best_s <= s1 * (1 + 1e-12)
    assert best_s == pytest.approx(float(scores(best[None])[0]), rel=1e-12)


def test_a_converged_search_hands_back_its_time_when_told_to(dag, monkeypatch):
    # max_restarts: under a deadline the search stops, converged, once that many restarts
    # in a row found nothing faster than its best, instead of restarting until the
    # deadline; the race's last rung passes it on
    import time

    guided, scores, start, s0, lv, kw = _converging_search(dag, monkeypatch)
    far = time.perf_counter() + 3600
    for cap in (0, 2):
        _, s, info = guided.refine(lv, start, s0, scores, rounds=10_000, **kw, until=far,
                                   max_restarts=cap)
        assert info["stop"] == "converged" and info["restarts"] >= cap and s <= s0
        if cap == 0:
            assert info["restarts"] == 0
    t = time.perf_counter()
    _, s, info = guided.race(lv, [("rr", start, s0)], scores, src=dag.src, dst=dag.dst,
                             until=t + 3600, seed=1, last_restarts=1)
    assert time.perf_counter() - t < 60 and s <= s0 and info["stop"] == "converged"
    assert info["rounds"] >= 2 * guided.PATIENCE


def test_screened_resampling_checks_memory_only_for_the_fastest_and_keeps_what_fits(dag):
    from simplace.rl.guided import Level, refine
    from simplace.rl.refine import SCREEN_CHECKS
    from simplace.sim.native import NativeSimulator

    # the fastest device holds only half of what the graph needs at its peak: the
    # fastest neighbours are often OOM, and only an exact check can tell
    inp = _machine(dag, [1e9, 4e9, 4e9], bw=1e8)
    everything = np.full((1, dag.num_ops), 2, np.int32)
    peak = float(NativeSimulator(dag, inp, memory=True)(everything).peak_memory_bytes[0, 2])
    inp = _machine(dag, [1e9, 4e9, 4e9], mem=np.array([1e12, 1e12, peak / 8]), bw=1e8)
    exact, free = NativeSimulator(dag, inp, memory="oom"), NativeSimulator(dag, inp,
                                                                         memory=False)
    checked = []

    def scores(batch):
        checked.append(len(batch))
        r = exact(batch)
        return np.where(np.asarray(r.oom), np.inf, np.asarray(r.step_time_s, np.float64))

    start = np.zeros(dag.num_ops, np.int32)  # the slow device, which holds everything
    s0 = float(scores(start[None])[0])
    assert np.isfinite(s0) and bool(exact(everything).oom[0])
    lv = [Level(np.tile([0.1, 0.1, 0.8], (dag.num_ops, 1)), np.arange(dag.num_ops))]
    checked.clear()
    best, best_s, info = refine(lv, start, s0, scores, src=dag.src, dst=dag.dst, rounds=40,
                                seed=2, screen=lambda b: free(b).step_time_s)
    assert info["gains"] >= 1 and best_s < s0
    # what it returns fits, and its score is the exact one
    assert not bool(exact(best[None]).oom[0])
    assert best_s == pytest.approx(float(exact(best[None]).step_time_s[0]), rel=1e-12)
    # each round checked the fastest few, more only while none fitted
    assert max(checked) <= SCREEN_CHECKS[-1] - SCREEN_CHECKS[-2]
    assert sum(checked) < info["rounds"] * SCREEN_CHECKS[-1]
    # the screen ranks; the exact scores decide: the two fastest do not fit, the next
    # ones are checked, the fastest of those that fit wins, the rest stay unscored
    from simplace.rl.guided import _round_scores

    fast = np.array([5.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    exact_s = fast + 0.5
    exact_s[[1, 2]] = np.inf
    cands = np.arange(10)[:, None]
    calls = []
    s = _round_scores(cands, lambda b: (calls.append(b[:, 0].tolist()), exact_s[b[:, 0]])[1],
                      lambda b: fast[b[:, 0]])
    assert calls == [[1, 2], [3, 4, 0, 5, 6, 7]]
    assert int(np.argmin(s)) == 3 and s[3] == 3.5 and np.isinf(s[[1, 2, 8, 9]]).all()


def test_guided_moves_draw_devices_from_the_policy_and_cross_cuts(dag, monkeypatch):
    from simplace.rl import guided
    from simplace.rl.guided import Level, _Proposer

    rng = np.random.default_rng(0)
    m = dag.num_ops
    zero = np.zeros(m, np.int32)
    no_edges = np.zeros(0, np.int64)
    monkeypatch.setattr(guided, "SHIFT_SHARE", 0.0)  # shift moves: their own test
    # one policy move per neighbour: a unit drawn twice would leave device 2 the second time
    monkeypatch.setattr(guided, "_POLICY_MOVES", (1,))
    # the policy wants device 2 for every op: policy moves take ops there, nowhere else
    sure = _Proposer([Level(np.tile([0.0, 0.0, 1.0], (m, 1)), np.arange(m))],
                     no_edges, no_edges)
    nb = sure(zero, 64, rng)
    assert set(np.unique(nb).tolist()) == {0, 2} and np.all((nb != 0).sum(1) >= 1)
    # a policy sure of the current device: the move goes to another one
    stay = _Proposer([Level(np.tile([1.0, 0.0, 0.0], (m, 1)), np.arange(m))],
                     no_edges, no_edges)
    nb = stay(zero, 64, rng)
    assert np.all((nb != 0).sum(1) >= 1) and set(np.unique(nb).tolist()) == {0, 1, 2}
    # units of a coarse level move whole: ops 0-59 are unit 0, ops 60-119 unit 1
    halves = _Proposer([Level(np.tile([0.0, 1.0, 0.0], (2, 1)), np.arange(m) // 60)],
                       no_edges, no_edges)
    nb = halves(zero, 16, rng)
    for row in nb:
        assert len(set(row[:60].tolist())) == 1 and len(set(row[60:].tolist())) == 1
    # no levels: cut moves only; an op at the one cut takes the device across it
    p = zero.copy()
    p[dag.dst[0]] = 1
    src, dst = np.asarray(dag.src), np.asarray(dag.dst)
    cut = p[src] != p[dst]
    nb = _Proposer([], src, dst)(p, 32, rng)
    for row in nb:
        moved = np.flatnonzero(row != p)
        assert 1 <= moved.size <= 3
        assert all(np.any(cut & ((src == i) | (dst == i))) for i in moved)
    # whole-unit cut moves: the unit of the op at the cut goes across, and nothing else
    monkeypatch.setattr(guided, "CUT_SHARE", 1.0)
    monkeypatch.setattr(guided, "GROUP_CUT_SHARE", 1.0)
    p = zero.copy()
    p[60:] = 1
    cut = p[src] != p[dst]
    assert m == 120 and cut.any()
    two = _Proposer([Level(np.full((2, 3), 1 / 3), np.arange(m) // 60)], src, dst)
    for row in two(p, 32, rng):  # one half joins the other
        assert len(set(row.tolist())) == 1 and set(row.tolist()) <= {0, 1}
    # the same seed gives the same neighbours
    np.testing.assert_array_equal(sure(zero, 8, np.random.default_rng(3)),
                                  sure(zero, 8, np.random.default_rng(3)))


def test_the_guided_search_gives_more_neighbours_to_the_moves_that_win(dag, monkeypatch):
    from simplace.rl import guided
    from simplace.rl.guided import ADAPT_FLOOR, Level, _ArmStats, _Proposer

    prior = np.array([0.5, 0.25, 0.25])
    used = np.repeat([0, 1, 2], [64, 32, 32])
    arms = _ArmStats(prior)
    arms.update(used, None)  # no winner yet: the prior
    np.testing.assert_array_equal(arms.shares, prior)
    for _ in range(50):  # arm 2 makes every round's winner
        arms.update(used, 2)
    ratio = arms.shares / prior
    assert ratio[2] > 2 and ratio[0] < 1 and ratio[1] < 1
    assert np.all(arms.shares >= ADAPT_FLOOR * prior - 1e-15)
    # the proposer draws its arms from the shares
    m = dag.num_ops
    proposer = _Proposer([Level(np.full((m, 3), 1 / 3), np.arange(m))], dag.src, dag.dst)
    assert proposer.prior.size == 3 and proposer.prior.sum() == pytest.approx(1.0)
    p = (np.arange(m) % 3).astype(np.int32)
    proposer(p, 4000, np.random.default_rng(0), np.array([0.0, 0.0, 1.0]))
    assert np.all(proposer.arms == 2)
    proposer(p, 4000, np.random.default_rng(0))
    np.testing.assert_allclose(np.bincount(proposer.arms, minlength=3) / 4000,
                               proposer.prior, atol=0.03)
    # no adaptation: the prior throughout
    monkeypatch.setattr(guided, "ADAPT_DECAY", 0.0)
    still = _ArmStats(prior)
    still.update(used, 2)
    np.testing.assert_array_equal(still.shares, prior)


def test_shift_moves_move_a_segment_boundary_or_merge_a_run(dag, monkeypatch):
    from simplace.rl import guided
    from simplace.rl.guided import Level, _Proposer

    m = dag.num_ops
    # program order 0..m-1: segments [0, 40) on 0, [40, 45) on 2, [45, 100) on 0, [100, m)
    # on 1; boundaries after ops 39, 44 and 99
    p = np.zeros(m, np.int32)
    p[40:45], p[100:] = 2, 1
    bounds = np.flatnonzero(p[:-1] != p[1:])
    monkeypatch.setattr(guided, "SHIFT_SHARE", 1.0)
    monkeypatch.setattr(guided, "MERGE_SHARE", 0.0)
    proposer = _Proposer([Level(np.full((m, 3), 1 / 3), np.arange(m))], dag.src, dag.dst)
    for row in proposer(p, 64, np.random.default_rng(1)):
        moved = np.flatnonzero(row != p)
        assert 1 <= moved.size <= max(guided._SHIFT_LENGTHS)
        assert np.all(np.diff(moved) == 1)  # one run of consecutive ops
        lo, hi = int(moved[0]), int(moved[-1])
        # it ends at a boundary (the run joins the segment before or after it), and takes
        # that segment's device
        b = next(int(b) for b in bounds if b in (lo - 1, hi))
        assert set(row[moved].tolist()) == {int(p[b] if b == lo - 1 else p[b + 1])}
    monkeypatch.setattr(guided, "MERGE_SHARE", 1.0)
    seen = set()
    for row in proposer(p, 32, np.random.default_rng(2)):  # the next run joins, whole
        moved = np.flatnonzero(row != p)
        seen.add((int(moved[0]), int(moved[-1]) + 1, int(row[moved[0]])))
    assert seen == {(40, 45, 0), (45, 100, 2), (100, m, 0)}


def test_rl_pretrained_refines_its_batch_and_gives_the_batch_alone_as_a_start(dag):
    from simplace.errors import OptionError
    from simplace.placers import PlacerContext, optimize
    from simplace.placers.local import run_starts
    from simplace.placers.registry import method

    inp, _ = _guided_setup(dag)
    batch = optimize(dag, inp, "rl-pretrained", seed=2, refine_rounds=0)
    assert "refine" not in batch.info and batch.info["picked"] != "refined"
    a = optimize(dag, inp, "rl-pretrained", seed=2, refine_rounds=40)
    b = optimize(dag, inp, "rl-pretrained", seed=2, refine_rounds=40)
    np.testing.assert_array_equal(a.placement, b.placement)
    assert a.info["batch_s"] == pytest.approx(batch.step_time_s, rel=1e-12)
    assert a.step_time_s <= batch.step_time_s * (1 + 1e-12)
    assert a.step_time_s == pytest.approx(a.info["step_time_s"], rel=1e-9)
    assert 1 <= a.info["refine"]["rounds"] <= 40
    # (the batch leaves much to gain here: slow links, one slow device)
    assert a.info["refine"]["gains"] >= 1 and a.info["picked"] == "refined"
    assert a.step_time_s < batch.step_time_s * 0.95
    # as local's start it gives its batch alone (the search refines)
    assert method("rl-pretrained").start_options == {"refine_rounds": 0}
    ctx = PlacerContext(dag, inp, seed=2, options={"starts": ["rl-pretrained"]})
    found, _ = run_starts(ctx, float("inf"), None)
    np.testing.assert_array_equal(dict(found)["rl-pretrained"], batch.placement)
    # and so it does among --method all's fast methods, the searches' starts
    from simplace.placers import compare

    (ours,) = [r for r in compare(dag, inp, ["single", "rl-pretrained"], seed=2, budget_s=30.0)
               if r.method == "rl-pretrained"]
    assert "refine" not in ours.info
    np.testing.assert_array_equal(ours.placement, batch.placement)
    with pytest.raises(OptionError, match="refine_rounds"):
        optimize(dag, inp, "rl-pretrained", refine_rounds=-1)


def test_the_basin_start_races_last_whatever_its_score():
    from simplace.placers.pretrained import _with_basin
    from simplace.rl.guided import RACE_LANES

    best, a, b = (np.array(x, np.int32) for x in ([0, 1, 2, 3], [1, 1, 1, 1], [0, 0, 1, 1]))
    lanes = [("fine-tuned", best, 5.0), ("heft", a, 1.0)]
    slow = ("m_etf", b, 9.0)
    assert [n for n, _, _ in _with_basin(lanes, slow)] == ["fine-tuned", "heft", "m_etf"]
    assert _with_basin(lanes, None) == lanes
    assert _with_basin(lanes, ("m_etf", a.copy(), 1.0)) == lanes  # places as heft does
    full = [("fine-tuned", best, 5.0)] + [(f"h{k}", np.full(4, k, np.int32), 1.0)
                                         for k in range(RACE_LANES - 1)]
    raced = _with_basin(full, slow)
    assert len(raced) == RACE_LANES and raced[0][0] == "fine-tuned" and raced[-1] is slow


def test_the_basin_start_is_m_etf_s_placement_within_its_share(mlp_graph, monkeypatch):
    from simplace.placers import PlacerContext, optimize
    from simplace.placers import pretrained as pp

    cm = CostModel.load("haswell_k40x4")
    ctx = PlacerContext(mlp_graph, cm, budget_s=30.0)
    info = {}
    label, p, s = pp._basin_start(ctx, info, [])
    assert label == pp.BASIN_METHOD == "m_etf"
    np.testing.assert_array_equal(p, optimize(mlp_graph, cm, "m_etf").placement)
    assert s == pytest.approx(float(ctx.score(p[None])[0]), rel=1e-12)
    assert info["basin_start"]["score"] == s and info["basin_start"]["wall_s"] > 0
    # taken from the cheap heuristics when it ran there, without running again
    given = (0.5, "m_etf", np.zeros(mlp_graph.num_ops, np.int32))
    info = {}
    assert pp._basin_start(ctx, info, [(0.1, "heft", p), given]) == ("m_etf", given[2], 0.5)
    assert info == {}
    assert pp._basin_start(PlacerContext(mlp_graph, cm), {}, []) is None  # no budget
    monkeypatch.setattr(pp, "BASIN_SHARE", 0.0)
    assert pp._basin_start(ctx, {}, []) is None

"""simplace.apply (simplace.hardware.executor): placed functions give the original outputs."""

import zlib

import jax
import numpy as np
import pytest

import simplace
from simplace import zoo
from simplace.errors import PlacementError, SimplaceError
from simplace.hardware.executor import apply, measure, prepare
from simplace.placement import Placement

# Training steps of the big CNNs compile for tens of seconds on 2 cores: slow tests.
FAST_TRAINING = ("mlp", "tiny_cnn", "alexnet", "rnnlm")


def _random_placement(rng, m: int, d: int, fragmented: bool) -> np.ndarray:
    """Either every op on a random device, or a few random runs of ops (what placers
    give); both use every device index 0..d-1 at least sometimes."""
    if fragmented:
        return rng.integers(0, d, m).astype(np.int32)
    p = np.zeros(m, np.int32)
    cuts = np.sort(rng.choice(np.arange(1, m), min(m - 1, 3 * d), replace=False))
    p[:] = rng.integers(d)
    for c in cuts:
        p[c:] = rng.integers(d)
    return p


def _assert_close(out, ref):
    flat_o, tree_o = jax.tree_util.tree_flatten(out)
    flat_r, tree_r = jax.tree_util.tree_flatten(ref)
    assert tree_o == tree_r
    for a, b in zip(flat_o, flat_r, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert a.shape == b.shape
        scale = float(np.max(np.abs(b))) if b.size else 0.0
        # Segments fuse differently from the whole function: rounding differs a little.
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4 * max(scale, 1e-30))


def _check_model(name: str, training: bool, seed_extra: int = 0):
    fn, args = zoo.get(name, small=True, abstract=False, training=training)
    ref = jax.jit(fn)(*args)
    program = prepare(fn, args)
    assert program.graph.hash == simplace.trace(fn, *args).hash
    rng = np.random.default_rng(zlib.crc32(f"{name}{training}{seed_extra}".encode()))
    m = program.graph.num_ops
    d = 2 + int(rng.integers(3))  # 2..4 fake CPU devices
    # Fully fragmented placements compile one small function per distinct op: only for
    # graphs small enough to keep the test quick.
    for fragmented in ((False, True) if m <= 100 else (False,)):
        p = _random_placement(rng, m, d, fragmented)
        placed = program.place(p, devices=jax.devices()[:d])
        assert len(placed.segments) == 1 + int(np.count_nonzero(np.diff(p)))
        _assert_close(placed(*args), ref)


@pytest.mark.parametrize("name", zoo.names())
def test_apply_gives_original_outputs_inference(name):
    _check_model(name, training=False)


@pytest.mark.parametrize("name", FAST_TRAINING)
def test_apply_gives_original_outputs_training(name):
    _check_model(name, training=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(zoo.names()) - set(FAST_TRAINING)))
def test_apply_gives_original_outputs_training_big(name):
    """At small sizes some training steps are chaotic: ResNet-50's loss differs by 20%
    between ``jax.jit(fn)`` and ``fn`` run eagerly (BatchNorm over a tiny batch amplifies
    rounding), so any other fusion (segments) may differ as much. The outputs, as one
    vector, must be as close to the jitted ones as the eager ones are (x3, or 1e-3)."""
    fn, args = zoo.get(name, small=True, abstract=False, training=True)
    ref = jax.jit(fn)(*args)
    with jax.disable_jit():
        eager = fn(*args)
    program = prepare(fn, args)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    p = _random_placement(rng, program.graph.num_ops, 4, fragmented=False)
    out = program.place(p)(*args)
    flat = []
    for a, b, c in zip(*(jax.tree_util.tree_leaves(x) for x in (out, ref, eager)),
                       strict=True):
        a, b, c = (np.asarray(x, np.float64) for x in (a, b, c))
        assert a.shape == b.shape and np.all(np.isfinite(a))
        # each leaf relative to its own size, so that big gradients do not hide small ones
        scale = max(float(np.linalg.norm(b)), 1e-30)
        flat.append((np.linalg.norm(a - b) / scale, np.linalg.norm(c - b) / scale))
    err, noise = np.array(flat).T
    assert np.sqrt(np.mean(err ** 2)) <= max(1e-3, 3 * np.sqrt(np.mean(noise ** 2)))


@pytest.fixture(scope="module")
def mlp():
    fn, args = zoo.get("mlp", small=True, abstract=False)
    return fn, args, prepare(fn, args)


def test_single_device_is_one_segment_and_outputs_stay_there(mlp):
    fn, args, program = mlp
    dev = jax.devices()[2]
    placed = program.place(np.full(program.graph.num_ops, 2), devices=jax.devices())
    assert len(placed.segments) == 1 and placed.num_transfers == 0
    out = placed(*args)
    for x in jax.tree_util.tree_leaves(out):
        assert x.devices() == {dev}
    _assert_close(out, jax.jit(fn)(*args))


def test_parameters_live_on_the_devices_that_read_them(mlp):
    fn, args, program = mlp
    g = program.graph
    rng = np.random.default_rng(1)
    p = rng.integers(0, 4, g.num_ops).astype(np.int32)
    placed = program.place(p)
    want = [set() for _ in range(g.num_params)]
    for op, j in zip(g.param_op.tolist(), g.param_index.tolist(), strict=True):
        want[j].add(int(p[op]))
    # zoo functions take the variables first: parameter j is argument leaf j
    got = placed.input_devices[:g.num_params]
    assert [set(x) for x in got] == want
    pa = placed.place_args(*args)
    leaves = jax.tree_util.tree_leaves(args)
    for k, devs in enumerate(placed.input_devices):
        for dev in devs:
            slot = next(s for leaf, s in placed._leaf_puts[dev] if leaf == k)
            assert pa.slots[slot].devices() == {jax.devices()[dev]}
            np.testing.assert_array_equal(np.asarray(pa.slots[slot]), np.asarray(leaves[k]))


def test_each_tensor_moves_once_per_destination_device(mlp):
    _, _, program = mlp
    g = program.graph
    p = np.random.default_rng(2).integers(0, 3, g.num_ops).astype(np.int32)
    placed = program.place(p)
    want = {(int(s), int(k), int(p[d])) for s, d, k in zip(g.src, g.dst, g.edge_output,
                                                           strict=True) if p[s] != p[d]}
    assert placed.num_transfers == len(want)
    # The synthetic machine's dispatches and puts all cost host time, so the simulated
    # host's calls come at distinct times, in the order it makes them.
    sim = simplace.simulate(g, simplace.CostModel.synthetic(3), p, schedule=True)
    assert placed.bytes_transferred == pytest.approx(sim.bytes_moved)
    # default: one device_put per producing op and destination, as the simulator sends
    producers = {(s, dev) for s, _, dev in want}
    assert sum(step[0] == "put" for step in placed.steps) == len(producers)
    assert sim.num_transfers == len(producers) and sim.num_segments == len(placed.segments)
    # ... over the same links in the same order, each just before the segment call that
    # first needs it (the simulator's serial host: puts, then the segment's dispatch).
    sched = sim.schedule
    assert placed.put_links == list(zip(sched.transfer_from.tolist(),
                                        sched.transfer_to.tolist(), strict=True))
    kinds = [step[0] for step in placed.steps]
    puts_before_call = [kinds[:k].count("put") for k, x in enumerate(kinds) if x == "call"]
    assert puts_before_call == np.searchsorted(sched.transfer_issue_s,
                                               sched.segment_dispatch_s).tolist()
    assert [seg.device for seg in placed.segments] == sched.segment_device.tolist()
    # "segment": one device_put per receiving segment, same results
    batched = program.place(p, transfers="segment")
    assert sum(step[0] == "put" for step in batched.steps) == sum(
        seg.num_received > 0 for seg in batched.segments)
    _assert_close(batched(*mlp[1]), placed(*mlp[1]))
    with pytest.raises(SimplaceError, match="transfers"):
        program.place(p, transfers="fast")


def test_equal_segments_share_one_compiled_function(mlp):
    _, _, program = mlp
    m = program.graph.num_ops
    a = program.place(np.zeros(m, np.int32))
    n = program.num_compiled_segments
    b = program.place(np.ones(m, np.int32))  # same ops, another device: same function
    assert program.num_compiled_segments == n
    assert a.steps[0][1] is b.steps[0][1]


def test_placement_for_another_graph_is_refused(mlp):
    fn, args, program = mlp
    other_fn, other_args = zoo.get("tiny_cnn", small=True)
    other = simplace.trace(other_fn, *other_args)
    wrong = Placement(np.zeros(other.num_ops, np.int32), other.hash, "x", ("cpu:0",))
    with pytest.raises(PlacementError, match="made for graph"):
        apply(fn, args, wrong)
    with pytest.raises(PlacementError, match="ops"):
        apply(fn, args, np.zeros(other.num_ops, np.int32))
    with pytest.raises(PlacementError, match="not the graph of the function"):
        apply(program, None, np.zeros(program.graph.num_ops, np.int32), graph=other)
    good = Placement(np.zeros(program.graph.num_ops, np.int32), program.graph.hash, "x",
                     ("cpu:0",))
    apply(program, None, good)  # the right one is accepted
    bad_dev = Placement(np.zeros(program.graph.num_ops, np.int32), program.graph.hash, "x",
                        ("gpu:7",))
    with pytest.raises(PlacementError, match="gpu:7"):
        apply(program, None, bad_dev)
    with pytest.raises(PlacementError, match="device"):
        program.place(np.full(program.graph.num_ops, 3), devices=jax.devices()[:2])


def test_arguments_must_match_the_trace(mlp):
    fn, args, program = mlp
    placed = program.place(np.zeros(program.graph.num_ops, np.int32))
    with pytest.raises(SimplaceError, match="structure"):
        placed(*args[:-1])
    bad = list(args)
    bad[1] = np.zeros((3, 3), np.float32)
    with pytest.raises(SimplaceError, match="shape"):
        placed(*bad)
    _, abstract = zoo.get("mlp", small=True)
    with pytest.raises(SimplaceError, match="real arrays"):
        placed(*abstract)


def test_placed_function_with_literal_and_input_outputs():
    """Outputs that are inputs, constants or literals, and closed-over arrays."""
    table = np.arange(6, dtype=np.float32).reshape(2, 3)

    def fn(params, x):
        y = jax.numpy.tanh(x @ params["w"]) + table.sum()
        return {"y": y * 2.0, "x": x, "one": 1.0, "w": params["w"]}

    args = ({"w": np.ones((3, 2), np.float32)}, np.ones((4, 3), np.float32))
    program = prepare(fn, args)
    for d in range(2):
        p = np.arange(program.graph.num_ops) % 2 if d else np.zeros(program.graph.num_ops)
        _assert_close(program.place(p.astype(np.int32))(*args), fn(*args))


def test_measure_times_step_and_segments(mlp):
    _, args, program = mlp
    p = np.zeros(program.graph.num_ops, np.int32)
    p[len(p) // 2:] = 1
    placed = program.place(p)
    meas = measure(placed, args, per_segment=True, warmup=1, min_repeats=3, max_repeats=5,
                   budget_s=0.2)
    assert meas.step_time_s > 0 and meas.step.repeats >= 3
    assert meas.num_segments == 2 and meas.segments_s.shape == (2,)
    assert np.all(meas.segments_s > 0)
    assert meas.to_dict()["num_segments"] == 2

"""The ``expert`` placer and the graph partitioners (``metis``, ``scotch``)."""

import dataclasses
import functools
import os
import re

import numpy as np
import pytest

import simplace
from simplace import zoo
from simplace.cost_model import CostModel
from simplace.graph import OpGraph, split_name_path
from simplace.placers import methods, optimize
from simplace.sim import simulate

PARTITIONERS = [m for m in ("metis", "scotch") if m in methods()]


@functools.cache
def zoo_graph(name):
    fn, args = zoo.get(name, training=True, small=True)
    return simplace.trace(fn, *args, name=name)


def check_result(graph, cost_model, res):
    """Valid, and the reported step time is the reference simulator's."""
    assert res.placement.shape == (graph.num_ops,)
    assert res.placement.dtype == np.int32
    assert res.placement.min() >= 0 and res.placement.max() < cost_model.num_devices
    sim = simulate(graph, cost_model, res.placement)
    assert sim.step_time_s == pytest.approx(res.step_time_s, rel=1e-12)
    assert bool(sim.oom) == res.oom


def with_memory(cost_model, memory_bytes):
    devices = tuple(dataclasses.replace(d, memory_bytes=memory_bytes)
                    for d in cost_model.devices)
    return dataclasses.replace(cost_model, devices=devices)


# ---------------------------------------------------------------------- expert, LSTMs
def lstm_role(path):
    """('layer', l) / 'head' (attention, softmax) / None, from the forward module path."""
    _, parts = split_name_path(path)
    for c in parts:
        m = re.fullmatch(r"layer_(\d+)", c)
        if m:
            return ("layer", int(m.group(1)))
    if "attention" in parts or "softmax" in parts:
        return "head"
    return None


@pytest.mark.parametrize("model, machine, num_layers", [
    ("nmt_4layer", "haswell_k40x4", 4),
    ("nmt_2layer", "haswell_k40x4", 2),
    ("rnnlm", "haswell_k40x4", 2),
    ("nmt_4layer", "haswell_k40x2", 4),  # 4 layers on 2 GPUs: wraps around
])
def test_expert_lstm_one_layer_per_gpu(model, machine, num_layers):
    g = zoo_graph(model)
    cm = CostModel.load(machine)
    gpus = [d for d, dev in enumerate(cm.devices) if dev.kind == "gpu"]
    res = optimize(g, cm, "expert")
    check_result(g, cm, res)
    assert not res.oom
    p = res.placement
    roles = [lstm_role(x) for x in g.name_path.tolist()]
    layer_device = {}
    for layer in range(num_layers):
        idx = [i for i, r in enumerate(roles) if r == ("layer", layer)]
        backward = [i for i in idx if split_name_path(g.name_path[i])[0]]
        assert idx and backward  # forward and backward ops of the layer exist
        devs = set(p[idx].tolist())
        assert len(devs) == 1, f"layer {layer} is split over {devs}"
        layer_device[layer] = devs.pop()
        assert layer_device[layer] == gpus[layer % len(gpus)]
    # Different layers on different GPUs, as far as there are GPUs.
    for a in range(num_layers):
        for b in range(a + 1, num_layers):
            same = layer_device[a] == layer_device[b]
            assert same == (a % len(gpus) == b % len(gpus))
    head = [i for i, r in enumerate(roles) if r == "head"]
    assert head and set(p[head].tolist()) == {gpus[num_layers % len(gpus)]}
    assert res.info["rule"] == "lstm_layer_per_gpu"


def test_expert_lstm_embeddings_on_cpu_option():
    g = zoo_graph("rnnlm")
    cm = CostModel.load("haswell_k40x4")
    res = optimize(g, cm, "expert", embed="cpu")
    check_result(g, cm, res)
    embed = [i for i, x in enumerate(g.name_path.tolist())
             if "embed" in split_name_path(x)[1]]
    assert set(res.placement[embed].tolist()) == {cm.index("cpu:0")}


# ---------------------------------------------------------------------- expert, others
def test_expert_cnn_single_fastest_device():
    g = zoo_graph("resnet50")
    cm = CostModel.load("haswell_k40x4")
    res = optimize(g, cm, "expert")
    single = optimize(g, cm, "single")
    check_result(g, cm, res)
    assert len(set(res.placement.tolist())) == 1
    assert res.placement[0] == single.placement[0]
    assert not res.oom


@pytest.mark.parametrize("method", ["expert", *PARTITIONERS])
def test_priced_inputs_stand_for_the_machine(method):
    # A SimInputs names no device kinds: every device counts as a GPU, and the method
    # places rather than failing on the missing device list.
    g = zoo_graph("resnet50")
    inp = CostModel.load("haswell_k40x4").price(g)
    res = optimize(g, inp, method)
    assert res.placement.shape == (g.num_ops,)
    assert res.placement.min() >= 0 and res.placement.max() < inp.num_devices


def test_expert_cnn_split_when_nothing_fits_one_device():
    g = zoo_graph("resnet50")
    cm = CostModel.load("haswell_k40x4")
    whole = simulate(g, cm, np.full(g.num_ops, 1, dtype=np.int32)).peak_memory_bytes.max()
    small = with_memory(cm, 0.6 * whole)
    res = optimize(g, small, "expert")
    check_result(g, small, res)
    gpus = {d for d, dev in enumerate(cm.devices) if dev.kind == "gpu"}
    used = set(res.placement.tolist())
    assert len(used) > 1 and used <= gpus
    assert res.info["rule"] == "layer_split"
    assert not res.oom


def test_expert_nothing_fits_says_so():
    g = zoo_graph("resnet50")
    cm = with_memory(CostModel.load("haswell_k40x2"), 1.0)
    res = optimize(g, cm, "expert")
    check_result(g, cm, res)
    assert res.oom and "note" in res.info


# ---------------------------------------------------------------------- partitioners
def grid_graph(n=16, flops=1e9, edge_bytes=1024.0):
    """An n x n grid DAG of equal matmul ops: (i, j) -> (i+1, j), (i, j+1)."""
    m = n * n
    src, dst = [], []
    for i in range(n):
        for j in range(n):
            k = i * n + j
            if i + 1 < n:
                src.append(k)
                dst.append(k + n)
            if j + 1 < n:
                src.append(k)
                dst.append(k + 1)
    return OpGraph.from_unordered(
        op=["dot_general"] * m, name_path=[f"grid/op{k}" for k in range(m)],
        flops=[flops] * m, bytes_accessed=[1e4] * m, out_bytes=[edge_bytes] * m,
        signature=["dot_general|grid"] * m, src=src, dst=dst,
        edge_bytes=[edge_bytes] * len(src), name="grid")


def cut_bytes(graph, placement):
    return float(graph.edge_bytes[placement[graph.src] != placement[graph.dst]].sum())


@pytest.fixture(scope="module")
def four_gpus():
    cm = CostModel.load("haswell_k40x4")
    return cm.subset([d for d, dev in enumerate(cm.devices) if dev.kind == "gpu"])


@pytest.mark.parametrize("method", PARTITIONERS)
def test_partitioner_balanced_and_small_cut(method, four_gpus):
    g = grid_graph()
    res = optimize(g, four_gpus, method)
    check_result(g, four_gpus, res)
    assert not res.oom
    used = np.unique(res.placement)
    assert used.size > 1
    load = np.bincount(res.placement, minlength=four_gpus.num_devices)[used]
    assert load.max() <= 1.15 * load.mean(), load  # equal ops: counts are compute
    rng = np.random.default_rng(0)
    random_cuts = [cut_bytes(g, used[rng.integers(0, used.size, g.num_ops)])
                   for _ in range(5)]
    assert cut_bytes(g, res.placement) < min(random_cuts)


def test_interchangeable_devices_differ_in_no_simulated_figure(four_gpus):
    from simplace.placers import PlacerContext
    from simplace.placers.partitioners import device_classes

    g = grid_graph(4)

    def classes(cm):
        return device_classes(PlacerContext(g, cm)).tolist()

    assert classes(four_gpus) == [0, 0, 0, 0]  # four equal K40s, equal links
    # A GPU with a slower dispatch (host time per segment) is not a K40 like the others.
    devs = list(four_gpus.devices)
    devs[2] = dataclasses.replace(devs[2], dispatch_s=2 * devs[2].dispatch_s)
    slow = dataclasses.replace(four_gpus, devices=tuple(devs))
    assert classes(slow) == [0, 0, 2, 0]
    devs[2] = dataclasses.replace(four_gpus.devices[2], launch_s=0.0)
    assert classes(dataclasses.replace(four_gpus, devices=tuple(devs))) == [0, 0, 2, 0]
    # Links: device_put from GPU 3 costs more host time than from the others.
    put = np.array(four_gpus.put_s)
    put[3, :3] *= 3
    uneven = CostModel.from_devices("uneven", four_gpus.devices, four_gpus.latency_s,
                                    four_gpus.bandwidth_bytes_per_s, put_s=put)
    assert classes(uneven) == [0, 0, 0, 3]


@pytest.mark.parametrize("method", PARTITIONERS)
def test_partitioner_on_a_real_model(method):
    g = zoo_graph("resnet50")
    cm = CostModel.load("cpu_h100x4_nvlink")
    res = optimize(g, cm, method, fallback_single=False)
    check_result(g, cm, res)
    assert not res.oom
    assert np.unique(res.placement).size > 1
    again = optimize(g, cm, method, fallback_single=False)
    np.testing.assert_array_equal(res.placement, again.placement)
    # The fastest H100 alone beats both partitions here: that is what they return.
    one = optimize(g, cm, "single")
    assert one.step_time_s < res.step_time_s
    best = optimize(g, cm, method)
    check_result(g, cm, best)
    np.testing.assert_array_equal(best.placement, one.placement)
    assert best.info["returned"] == "single"
    assert best.info["partition_step_time_s"] == pytest.approx(res.step_time_s)


@pytest.mark.parametrize("method", PARTITIONERS)
def test_partitioner_deterministic_per_seed(method, four_gpus):
    g = grid_graph(12)
    a = optimize(g, four_gpus, method, seed=3)
    b = optimize(g, four_gpus, method, seed=3)
    np.testing.assert_array_equal(a.placement, b.placement)


@pytest.mark.parametrize("method", PARTITIONERS)
def test_partitioner_memory_repair(method):
    g = zoo_graph("rnnlm")
    cm = CostModel.load("cpu_h100x4_nvlink")
    res = optimize(g, cm, method)
    peak = res.peak_memory_bytes.max()
    # Memory a little below the peak the unconstrained answer reached: the answer must
    # be repaired (or say it could not be).
    tight = with_memory(cm, 0.8 * peak)
    res2 = optimize(g, tight, method)
    check_result(g, tight, res2)
    assert not res2.oom or "note_memory" in res2.info


@pytest.mark.parametrize("method", ["expert", *PARTITIONERS])
@pytest.mark.parametrize("case", ["one_op", "no_edges", "one_device"])
def test_corner_cases(method, case):
    cm = CostModel.load("haswell_k40x2")
    if case == "one_op":
        g = grid_graph(1)
    elif case == "no_edges":
        g = OpGraph(op=["dot_general"] * 5, name_path=["a"] * 5, flops=[1e9] * 5,
                    bytes_accessed=[1e3] * 5, out_bytes=[1e3] * 5, signature=["s"] * 5,
                    src=[], dst=[], edge_bytes=[])
    else:
        g = grid_graph(4)
        cm = cm.subset([1])
    res = optimize(g, cm, method)
    check_result(g, cm, res)
    assert not res.oom


def test_scotch_loads_with_one_thread_unless_the_user_chose(monkeypatch):
    # Scotch's default thread pool (what runs outside the mapping's one-thread context)
    # is sized when its library loads: one thread, so that a seed gives one mapping.
    pytest.importorskip("pyscotch")
    from simplace.placers.partitioners import _require

    monkeypatch.delenv("SCOTCH_PTHREAD_NUMBER", raising=False)
    _require("pyscotch")
    assert os.environ["SCOTCH_PTHREAD_NUMBER"] == "1"
    monkeypatch.setenv("SCOTCH_PTHREAD_NUMBER", "3")
    _require("pyscotch")
    assert os.environ["SCOTCH_PTHREAD_NUMBER"] == "3"


def test_memory_repair_begins_no_round_past_its_deadline():
    from simplace.placers import OOM_PENALTY, PlacerContext
    from simplace.placers.memory_repair import repair_memory

    g = zoo_graph("rnnlm")
    cm = CostModel.load("cpu_h100x4_nvlink")
    gpus = [d for d, dev in enumerate(cm.devices) if dev.kind == "gpu"]
    tight = with_memory(cm, 0.8 * optimize(g, cm, "single").peak_memory_bytes.max())
    ctx = PlacerContext(g, tight)
    groups = np.arange(g.num_ops)
    start = np.full(g.num_ops, gpus[0], np.int32)
    fixed, rep = repair_memory(ctx, start, groups)
    assert not rep["oom"] and rep["repair_rounds"] >= 1
    assert rep["score"] == pytest.approx(ctx.simulate(fixed).step_time_s)
    late, rep = repair_memory(ctx, start, groups, deadline=0.0)
    assert rep["oom"] and rep["repair_rounds"] == 0
    assert rep["score"] == pytest.approx(OOM_PENALTY + ctx.simulate(start).step_time_s)
    np.testing.assert_array_equal(late, start)


def test_memory_repair_moves_to_the_fastest_device_that_makes_it_fit():
    # Six independent ops, all on device 0, which holds three outputs. Device 1 has the
    # most free memory but is 10x slower; device 2 holds four and is 2x slower: the
    # repair moves three ops to device 2 (step 6 s), not to device 1 (30 s).
    from simplace.placers import PlacerContext
    from simplace.placers.memory_repair import repair_memory
    from simplace.sim import make_sim_inputs
    from tests.sim_cases import make_graph

    g = make_graph([], [], m=6, out_bytes=np.full(6, 100.0), is_output=np.ones(6, bool))
    t = np.tile([1.0, 10.0, 2.0], (6, 1))
    inp = make_sim_inputs(t, np.zeros((3, 3)), np.full((3, 3), np.inf),
                          np.array([350.0, 1e6, 400.0]))
    ctx = PlacerContext(g, inp)
    start = np.zeros(6, np.int32)
    assert ctx.simulate(start).oom
    fixed, rep = repair_memory(ctx, start, np.arange(6))
    assert not rep["oom"] and rep["repair_rounds"] == 1
    np.testing.assert_array_equal(np.bincount(fixed, minlength=3), [3, 0, 3])
    assert rep["score"] == pytest.approx(6.0)
    assert rep["score"] == pytest.approx(float(ctx.simulate(fixed).step_time_s), rel=1e-12)


@pytest.mark.parametrize("batched", [True, False])
def test_a_repair_past_the_budget_runs_only_where_its_rounds_are_batched(monkeypatch, batched):
    # A list scheduler's runs can spend the whole budget; a repair whose rounds cost
    # milliseconds (the batched simulator) still runs, within a small grace; one whose
    # rounds are reference simulations does not begin.
    import time

    import simplace.placers.memory_repair as mr
    from simplace.placers import PlacerContext

    g = zoo_graph("rnnlm")
    cm = CostModel.load("cpu_h100x4_nvlink")
    gpus = [d for d, dev in enumerate(cm.devices) if dev.kind == "gpu"]
    tight = with_memory(cm, 0.8 * optimize(g, cm, "single").peak_memory_bytes.max())
    spent = PlacerContext(g, tight, budget_s=10.0, t_begin=time.perf_counter() - 100.0)
    start = np.full(g.num_ops, gpus[0], np.int32)
    step = float(spent.simulate(start).step_time_s)
    spent.batched(start[None])  # loaded, as batched_pays says it is for one placement
    monkeypatch.setattr(mr, "batched_pays", lambda num_ops, count: batched)
    before = time.perf_counter()
    deadline = mr.repair_deadline(spent)
    assert deadline <= time.perf_counter() + mr.REPAIR_GRACE_SHARE * 10.0
    assert (deadline > before) == batched
    info = {}
    fixed, s, oom = mr.repair_answer(spent, start, step, info)
    if batched:
        assert not oom and info["repair_rounds"] >= 1 and info["unrepaired_step_time_s"] == step
        res = spent.simulate(fixed)  # the batched rounds' numbers are the reference's
        assert not res.oom and s == pytest.approx(float(res.step_time_s), rel=1e-12)
    else:
        assert oom and info["repair_rounds"] == 0 and "no time" in info["note_memory"]
        np.testing.assert_array_equal(fixed, start)


@pytest.mark.parametrize("method", PARTITIONERS)
def test_partitioner_under_a_spent_budget_partitions_one_device_set(method):
    # A CPU and 4 K40s: several device sets (all devices, the GPUs...); with the budget
    # spent at once only the first is partitioned, and the answer says so.
    g = grid_graph(8)
    cm = CostModel.load("haswell_k40x4")
    full = optimize(g, cm, method, fallback_single=False)
    assert full.info["stop"] == "done" and len(full.history) > 1
    res = optimize(g, cm, method, budget_s=1e-9, fallback_single=False)
    check_result(g, cm, res)
    assert res.info["stop"] == "time budget" and len(res.history) == 1
    assert res.history[0]["devices"] == full.history[0]["devices"]


def test_a_list_scheduler_keeps_a_faster_run_that_fits_once_repaired():
    # Two runs: all on device 0 (out of memory: it holds three of the six outputs) and
    # all on the 10x slower device 1 (fits). The first, repaired (three ops to device 2),
    # beats the second; a run that fits and is faster than the one out of memory is kept.
    from simplace.placers import PlacerContext
    from simplace.placers._list_runs import Setup
    from simplace.sim import make_sim_inputs
    from tests.sim_cases import make_graph

    g = make_graph([], [], m=6, out_bytes=np.full(6, 100.0), is_output=np.ones(6, bool))
    t = np.tile([1.0, 10.0, 2.0], (6, 1))
    inp = make_sim_inputs(t, np.zeros((3, 3)), np.full((3, 3), np.inf),
                          np.array([350.0, 1e6, 400.0]))
    setup = Setup(PlacerContext(g, inp))
    runs = [{"placement": np.full(6, d, np.int32)} for d in (0, 1)]
    scored = [(float("inf"), 0, (6.0, True)), (60.0, 1, (60.0, False))]
    k, placement, res, info = setup._repair_faster(runs, scored, (60.0, False))
    assert k == 0 and res == (pytest.approx(6.0), False)
    np.testing.assert_array_equal(np.bincount(placement, minlength=3), [3, 0, 3])
    assert info["unrepaired_step_time_s"] == 6.0 and "faster schedule" in info["note_memory"]
    # the run that fits is faster than the one that does not: nothing to repair
    assert setup._repair_faster(runs, [(float("inf"), 0, (6.0, True)),
                                       (5.0, 1, (5.0, False))], (5.0, False)) is None

"""List schedulers: heft, m_topo, m_etf, m_sct (simplace/placers/list_schedulers.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simplace.cost_model import CostModel
from simplace.errors import SimplaceError
from simplace.graph import OpGraph
from simplace.placers import optimize
from simplace.placers.list_schedulers import _Program, _Timeline
from simplace.sim import lower_bound, make_sim_inputs, simulate
from tests.sim_cases import corner_cases, make_graph, random_case, random_graph

METHODS = ("heft", "m_topo", "m_etf", "m_sct")


def machine(t, *, latency=0.0, bandwidth=math.inf, memory=1e15, group=None):
    """SimInputs from an op-time matrix [M, D]; every link the same."""
    t = np.asarray(t, dtype=float)
    d = t.shape[1]
    return make_sim_inputs(t, np.full((d, d), float(latency)), np.full((d, d), float(bandwidth)),
                           np.broadcast_to(np.asarray(memory, float), (d,)), group)


def chain(m, *, nbytes=1000.0, **kw):
    return make_graph(np.arange(m - 1), np.arange(1, m), m=m,
                      edge_bytes=np.full(m - 1, nbytes), **kw)


def check_result(res, graph, cm):
    p = res.placement
    assert p.dtype == np.int32 and p.shape == (graph.num_ops,)
    assert np.all((p >= 0) & (p < cm.num_devices))
    sim = simulate(graph, cm, p)
    assert res.step_time_s == pytest.approx(sim.step_time_s, rel=1e-12, abs=0)
    assert res.oom == sim.oom


# --------------------------------------------------------------------------- validity
@pytest.mark.parametrize("method", METHODS)
def test_valid_on_random_cases(method):
    rng = np.random.default_rng(7)
    for k in range(15):
        g, inp = random_case(rng, max_ops=40, max_devices=5)
        if k % 2:  # segment launch and dispatch, device_put host time
            d = inp.num_devices
            inp = make_sim_inputs(*inp[:5], rng.uniform(0, 2e-3, d), rng.uniform(0, 2e-3, d),
                                  rng.uniform(0, 1e-3, (d, d)))
        res = optimize(g, inp, method=method)
        check_result(res, g, inp)
        assert res.method == method
        assert res.step_time_s >= lower_bound(g, inp) * (1 - 1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_valid_on_synthetic_cost_models(method):
    rng = np.random.default_rng(3)
    for k, shape in enumerate(("layered", "multi_output", "params", "fan")):
        g = random_graph(rng, shape, 60)
        cm = CostModel.synthetic(4, seed=k, exclusive_pair=k % 2 == 0)
        res = optimize(g, cm, method=method)
        check_result(res, g, cm)
        assert not res.oom


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", sorted(corner_cases()))
def test_corner_cases(method, case):
    g, inp = corner_cases()[case]
    res = optimize(g, inp, method=method)
    check_result(res, g, inp)
    if case == "fits_nowhere":
        assert res.info["note"].startswith("no device can hold op 1")
        assert res.info["unplaceable_ops"] == 1
    else:
        assert "note" not in res.info


@pytest.mark.parametrize("method", METHODS)
def test_deterministic(method):
    rng = np.random.default_rng(11)
    g = random_graph(rng, "random", 80)
    cm = CostModel.synthetic(5, seed=2)
    a = optimize(g, cm, method=method, seed=0)
    b = optimize(g, cm, method=method, seed=0)
    c = optimize(g, cm, method=method, seed=5)  # no randomness at all
    np.testing.assert_array_equal(a.placement, b.placement)
    np.testing.assert_array_equal(a.placement, c.placement)


def test_bad_memory_option():
    g, inp = corner_cases()["no_edges"]
    with pytest.raises(SimplaceError, match="memory model"):
        optimize(g, inp, method="m_etf", memory="optimistic")


# --------------------------------------------------------------------------- exact cases
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("m,d", [(10, 4), (8, 4), (7, 3), (5, 1)])
def test_independent_equal_ops_reach_optimum(method, m, d):
    g = make_graph([], [], m=m)
    inp = machine(np.full((m, d), 2.0))
    res = optimize(g, inp, method=method)
    assert res.step_time_s == pytest.approx(math.ceil(m / d) * 2.0)
    assert np.bincount(res.placement, minlength=d).max() == math.ceil(m / d)


@pytest.mark.parametrize("method", ("heft", "m_etf", "m_sct"))
def test_exclusive_group_is_one_timeline(method):
    # Devices 0 and 1 share compute; device 2 is apart: 9 unit ops need 5 time units at
    # best (not 3, which three independent devices would give).
    g = make_graph([], [], m=9)
    inp = machine(np.ones((9, 3)), group=[0, 0, 1])
    res = optimize(g, inp, method=method)
    assert res.step_time_s == pytest.approx(5.0)
    assert res.info["estimated_makespan_s"] == pytest.approx(5.0)


@pytest.mark.parametrize("method", ("heft", "m_etf", "m_sct"))
def test_chain_with_expensive_links_stays_on_fastest_device(method):
    m = 12
    t = np.tile([3.0, 2.0, 1.0, 2.5], (m, 1))
    g = chain(m)
    inp = machine(t, latency=50.0, bandwidth=1e3)
    res = optimize(g, inp, method=method)
    np.testing.assert_array_equal(res.placement, np.full(m, 2))
    assert res.step_time_s == pytest.approx(m * 1.0)


@pytest.mark.parametrize("method", METHODS)
def test_chain_with_free_links_takes_its_critical_path(method):
    m = 9
    g = chain(m)
    inp = machine(np.ones((m, 3)))
    res = optimize(g, inp, method=method)
    assert res.step_time_s == pytest.approx(m)


def test_m_topo_fills_devices_in_turn():
    # 8 equal independent ops on 4 identical devices: a share of 2 ops each, in graph
    # order, on all 4 devices (fewer devices take longer).
    g = make_graph([], [], m=8)
    res = optimize(g, machine(np.ones((8, 4))), method="m_topo")
    np.testing.assert_array_equal(res.placement, [0, 0, 1, 1, 2, 2, 3, 3])
    assert res.info["devices_used"] == 4
    assert res.step_time_s == pytest.approx(2.0)
    # Heterogeneous: the fastest device (2, twice as fast) is filled first and gets twice
    # the ops of each other device.
    t = np.tile([2.0, 2.0, 1.0], (8, 1))
    res = optimize(g, machine(t), method="m_topo")
    np.testing.assert_array_equal(res.placement, [2, 2, 2, 2, 0, 0, 1, 1])
    assert res.info["device_order"] == [2, 0, 1]
    assert res.step_time_s == pytest.approx(4.0)


def test_m_topo_uses_fewer_devices_on_a_chain():
    # A chain gains nothing from more devices: the fill over the fastest device alone
    # wins (k = 1), where Baechi's fill over all devices would pay three transfers.
    g = chain(8)
    res = optimize(g, machine(np.ones((8, 4)), latency=1.0), method="m_topo")
    np.testing.assert_array_equal(res.placement, np.zeros(8))
    assert res.info["devices_used"] == 1
    assert [r["unit"] for r in res.info["runs"]] == [f"{k} devices" for k in (1, 2, 3, 4)]


def test_heft_bounds_with_free_links():
    rng = np.random.default_rng(5)
    for shape in ("random", "layered", "fan", "multi_output"):
        g = random_graph(rng, shape, 50)
        t = rng.uniform(0.5, 3.0, (50, 4))
        inp = machine(t)
        res = optimize(g, inp, method="heft")
        est = res.info["estimated_makespan_s"]
        lb = lower_bound(g, inp)
        # Appending on the fastest device after everything is always an option.
        assert lb * (1 - 1e-12) <= est <= t.min(axis=1).sum() * (1 + 1e-12)
        assert lb * (1 - 1e-12) <= res.step_time_s
        # Each device runs its ops back to back at worst.
        assert res.step_time_s <= t[np.arange(50), res.placement].sum() * (1 + 1e-12)


def test_heft_insertion_fills_gaps():
    tl = _Timeline()
    tl.insert(0.0, 2.0, 0)
    tl.insert(5.0, 8.0, 1)
    assert tl.earliest(1.0, 2.0) == (2.0, 1)  # the gap [2, 5)
    assert tl.earliest(3.5, 1.5) == (3.5, 1)
    assert tl.earliest(1.0, 4.0) == (8.0, 2)  # too long for the gap: after the end
    assert tl.earliest(0.0, 0.0) == (0.0, 0)
    assert tl.earliest(9.0, 1.0) == (9.0, 2)


def _earliest_by_scan(starts, ends, ready, dur, max_gaps):
    """HEFT's insertion search gap by gap (what ``_Timeline.earliest`` vectorises)."""
    k = next((i for i, e in enumerate(ends) if e > ready), len(ends))
    s = ready
    for _ in range(max_gaps):
        if k >= len(starts) or s + dur <= starts[k]:
            return s, k
        s = max(s, ends[k])
        k += 1
    return max(s, ends[-1]), len(starts)


@pytest.mark.parametrize("max_gaps", [2000, 40])
def test_heft_insertion_search_matches_a_gap_by_gap_scan(monkeypatch, max_gaps):
    # Timelines of hundreds of short gaps, so that searches run past the Python-scanned
    # first gaps into the vectorised part, and (max_gaps 40) past the search's bound.
    import simplace.placers.heft as heft_module

    monkeypatch.setattr(heft_module, "_MAX_GAPS", max_gaps)
    rng = np.random.default_rng(3)
    tl = _Timeline()
    # 400 intervals 0.1 apart, but 0.5 apart after every 37th: a 0.3 or 0.45 s op fits
    # only in those, often far past the first 16 gaps from where it is ready.
    for i in range(400):
        tl.insert(float(i), i + (0.5 if i % 37 == 36 else 0.9), i)
    for _ in range(300):
        ready, dur = float(rng.uniform(-1, 401)), float(rng.choice([0.05, 0.3, 0.45, 0.6]))
        assert tl.earliest(ready, dur) == _earliest_by_scan(tl.starts, tl.ends, ready, dur,
                                                            max_gaps)
    tl = _Timeline()
    for _ in range(600):
        ready, dur = float(rng.uniform(0, 200)), float(rng.choice([0.01, 0.05, 0.3, 2.0]))
        want = _earliest_by_scan(tl.starts, tl.ends, ready, dur, max_gaps)
        got = tl.earliest(ready, dur)
        assert got == want
        tl.insert(got[0], got[0] + dur, got[1])
    assert tl.starts == sorted(tl.starts) and all(
        e <= s for e, s in zip(tl.ends[:-1], tl.starts[1:], strict=True))
    np.testing.assert_array_equal(tl._np_starts[:len(tl.starts)], tl.starts)


def test_heft_uses_an_idle_gap():
    # 0 (dev 0) -> 1 (dev 1) -> 2 (dev 0) with 5 s links leaves device 0 idle in [1, 12).
    # Op 3 is independent with the lowest rank, so HEFT places it last: with insertion it
    # runs in that gap (finish 5) instead of after op 2 (finish 17).
    g = make_graph([0, 1], [1, 2], m=4, edge_bytes=[0.0, 0.0])
    t = np.array([[1.0, 100.0], [100.0, 1.0], [1.0, 100.0], [4.0, 40.0]])
    res = optimize(g, machine(t, latency=5.0), method="heft")
    np.testing.assert_array_equal(res.placement, [0, 1, 0, 0])
    assert res.info["heft_estimated_makespan_s"] == pytest.approx(13.0)
    # The program runs device 0's ops in graph order (op 3 after op 2), and so does the
    # schedule heft builds from HEFT's devices.
    assert res.step_time_s == pytest.approx(17.0)
    assert res.info["estimated_makespan_s"] == pytest.approx(17.0)


# --------------------------------------------------------------------------- memory
def tight_case():
    """12 ops in a chain, each reading its own 100-byte parameter; device 0 is the fastest
    but holds only 500 bytes, devices 1 and 2 are slower and hold plenty."""
    m = 12
    g = chain(m, nbytes=10.0, out_bytes=np.full(m, 10.0),
              params=(np.full(m, 100.0), [(i, i) for i in range(m)]))
    t = np.tile([1.0, 2.0, 3.0], (m, 1))
    inp = machine(t, latency=0.1, bandwidth=1e3, memory=[500.0, 1e6, 1e6])
    return g, inp


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("memory", ("conservative", "liveness"))
def test_memory_constrained_placements_fit(method, memory):
    g, inp = tight_case()
    assert simulate(g, inp, np.zeros(g.num_ops, np.int32)).oom  # all on the fastest: OOM
    res = optimize(g, inp, method=method, memory=memory)
    assert not res.oom
    assert res.info["unplaceable_ops"] == 0
    assert res.info["memory_model"] == memory
    used = np.bincount(res.placement, minlength=3)
    assert 1 <= used[0] <= 4  # device 0 takes what it can hold, and no more


@pytest.mark.parametrize("method", ("m_etf", "m_sct", "heft"))
def test_memory_blind_choice_would_oom(method):
    # Same machine with memory to spare: everything goes to the fastest device.
    g, inp = tight_case()
    roomy = make_sim_inputs(inp.op_time_s, inp.latency_s, inp.bandwidth_bytes_per_s,
                            np.full(3, 1e6))
    res = optimize(g, roomy, method=method)
    np.testing.assert_array_equal(res.placement, np.zeros(g.num_ops))


def test_parameters_counted_once_per_device():
    # Ten ops all reading one 300-byte parameter on a 400-byte device: it fits (the
    # parameter is resident once), outputs are 5 bytes each.
    m = 10
    g = chain(m, nbytes=5.0, out_bytes=np.full(m, 5.0),
              params=([300.0], [(i, 0) for i in range(m)]))
    inp = machine(np.tile([1.0, 5.0], (m, 1)), latency=1.0, bandwidth=1.0,
                  memory=[400.0, 1e6])
    for method in METHODS[1:]:
        res = optimize(g, inp, method=method)
        if method != "m_topo":
            np.testing.assert_array_equal(res.placement, np.zeros(m))
        assert not res.oom


# --------------------------------------------------------------------------- m-SCT
def fork():
    """0 fans out to 1, 2, 3, which join in 4; the tensors 0->2 and 2->4 are large."""
    src, dst = [0, 0, 0, 1, 2, 3], [1, 2, 3, 4, 4, 4]
    nbytes = [1.0, 100.0, 1.0, 1.0, 100.0, 1.0]
    return make_graph(src, dst, m=5, edge_bytes=nbytes)


def test_m_sct_lp_favourite_children():
    g = fork()
    inp = machine(np.full((5, 2), 10.0), latency=0.0, bandwidth=1.0)
    res = optimize(g, inp, method="m_sct")
    assert res.info["favourite_children"] == "lp"
    assert res.info["lp_status"] == 0
    assert list(res.info["favourite_parent"]) == [-1, -1, 0, -1, 2]
    # the favourite child runs on its parent's device
    assert res.placement[2] == res.placement[0] and res.placement[4] == res.placement[2]
    check_result(res, g, inp)


def test_m_sct_greedy_fallback():
    g = fork()
    inp = machine(np.full((5, 2), 10.0), latency=0.0, bandwidth=1.0)
    res = optimize(g, inp, method="m_sct", lp_max_edges=3)
    assert res.info["favourite_children"] == "greedy"
    assert "lp_max_edges=3" in res.info["note_lp"]
    assert list(res.info["favourite_parent"]) == [-1, -1, 0, -1, 2]


def test_m_sct_lp_on_random_graph():
    rng = np.random.default_rng(2)
    g = random_graph(rng, "layered", 60)
    cm = CostModel.synthetic(3, seed=1)
    res = optimize(g, cm, method="m_sct")
    assert res.info["favourite_children"] == "lp" and res.info["lp_status"] == 0
    fav = np.asarray(res.info["favourite_parent"])
    parents = fav[fav >= 0]
    assert len(parents) == len(np.unique(parents))  # at most one favourite child per op
    pairs = set(zip(g.src.tolist(), g.dst.tolist(), strict=True))
    assert all((int(q), j) in pairs for j, q in enumerate(fav) if q >= 0)


@pytest.mark.parametrize("method", METHODS)
def test_received_copies_count_against_memory(method):
    # Op 0 belongs on device 1, op 1 on device 0 by speed; but device 0 (80 bytes) cannot
    # hold op 1's output (30) plus the copy of op 0's output it would receive (60).
    g = make_graph([0], [1], m=2, edge_bytes=[60.0], out_bytes=[60.0, 30.0])
    inp = machine(np.array([[100.0, 1.0], [1.0, 100.0]]), memory=[80.0, 1e6])
    assert simulate(g, inp, np.array([1, 0])).oom
    res = optimize(g, inp, method=method)
    assert not res.oom
    if method != "m_topo":
        np.testing.assert_array_equal(res.placement, [1, 1])


def test_m_sct_keeps_favourite_child_with_its_parent():
    # 0 -> 1 carries 2 bytes (2 s over the link): 1 is 0's favourite child. Op 0 runs on
    # device 0 (1 s vs 5 s). Op 1 ends first on device 1 (4 s: 0's segment ends at 1,
    # the copy arrives at 3, then 1 s) rather than on device 0 (4.5 s): m_etf sends it
    # there; m_sct keeps it with its parent, since 4.5 <= 4 + the 2 s copy it avoids.
    g = make_graph([0], [1], m=2, edge_bytes=[2.0])
    inp = machine(np.array([[1.0, 5.0], [3.5, 1.0]]), bandwidth=1.0)
    sct = optimize(g, inp, method="m_sct")
    assert list(sct.info["favourite_parent"]) == [-1, 0]
    np.testing.assert_array_equal(sct.placement, [0, 0])
    assert sct.step_time_s == pytest.approx(4.5)
    etf = optimize(g, inp, method="m_etf")
    np.testing.assert_array_equal(etf.placement, [0, 1])
    assert etf.step_time_s == pytest.approx(4.0)


# --------------------------------------------------------------------------- the program
def segment_inputs(rng, inp, group=None):
    """inp with random segment launch, dispatch, put, pool launch (segments whose ops'
    whole-number pool work reaches 1-3) and unfused costs, and puts that hold the host
    between devices of two random "clients"."""
    m, d = inp.num_ops, inp.num_devices
    client = rng.integers(0, 2, d)
    return make_sim_inputs(inp.op_time_s, inp.latency_s, inp.bandwidth_bytes_per_s,
                           inp.memory_bytes, group, rng.uniform(0, 2e-3, d),
                           rng.uniform(0, 2e-3, d), rng.uniform(0, 1e-3, (d, d)),
                           rng.integers(0, 2, (m, d)), rng.integers(1, 4, d),
                           rng.uniform(0, 1e-3, d), rng.uniform(0, 1e-3, (m, d)),
                           client[:, None] != client[None, :])


def _random_programs(rng, shape):
    """Six (graph, inputs, program, devices) of ``shape``, with segment costs, every other
    one with devices paired in exclusive groups (drawn from ``rng``, which the caller
    goes on drawing from between them)."""
    for k in range(6):
        g = random_graph(rng, shape, 30)
        _, base = random_case(rng, max_ops=30, max_devices=4)
        d = base.num_devices
        t = rng.uniform(0, 3e-3, (g.num_ops, d))
        inp = segment_inputs(rng, make_sim_inputs(t, base.latency_s,
                                                  base.bandwidth_bytes_per_s,
                                                  np.full(d, 1e15)),
                             group=(np.arange(d) // 2) if k % 2 else None)
        yield g, inp, _Program(g, inp), d


@pytest.mark.parametrize("shape", ("chain", "fan", "layered", "random", "params"))
def test_program_estimate_is_the_reference_simulator(shape):
    # Op by op in graph order, the schedulers' estimate is the reference simulator's step
    # time (exact when every producer has one output, as here); end_on predicts the end
    # of the segment commit builds; a trial rolled back leaves no trace.
    rng = np.random.default_rng(21)
    for g, inp, prog, d in _random_programs(rng, shape):
        for p in (rng.integers(0, d, g.num_ops), np.repeat(rng.integers(0, d, 5), 6)):
            want = simulate(g, inp, p).step_time_s
            assert prog.replay(p) == pytest.approx(want, rel=1e-9, abs=1e-15)
            prog.reset()
            for i, dev in enumerate(p.tolist()):
                other = (dev + 1) % d
                prog.mark()  # try the op elsewhere, and the next one inside, roll back
                prog.commit(i, other)
                if i + 1 < g.num_ops:
                    prog.mark()
                    prog.commit(i + 1, dev)
                    prog.undo()
                prog.undo()
                end = prog.end_on(i, dev)
                prog.commit(i, dev)
                assert prog.open_end() == pytest.approx(end, rel=1e-12)
            assert prog.step_time() == pytest.approx(want, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("shape", ("chain", "fan", "layered", "random", "params"))
def test_a_units_trial_end_is_the_journals_bit_for_bit(shape):
    # unit_end (no journal) gives what committing the unit's ops and rolling back gives,
    # exactly, for units of 2-6 ops on every device, from every point of a placement
    # being built (open segments on the same device, another one of its group, none).
    rng = np.random.default_rng(22)
    for g, inp, prog, d in _random_programs(rng, shape):
        p = np.repeat(rng.integers(0, d, 8), 4)[:g.num_ops]
        checked = 0
        for i, dev in enumerate(p.tolist()):
            b = min(i + int(rng.integers(2, 7)), g.num_ops)
            for other in range(d):
                prog.mark()
                for op in range(i, b):
                    prog.commit(op, other)
                want = prog.open_end()
                prog.undo()
                assert prog.unit_end(i, b, other) == want
                checked += b > i + 1
            prog.commit(i, dev)
        assert checked and prog.step_time() == pytest.approx(
            simulate(g, inp, p).step_time_s, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("path", ("batched", "reference"))
@pytest.mark.parametrize("method", METHODS)
def test_falls_back_to_the_fastest_single_device(method, path, monkeypatch):
    # Op 0 is a hair faster on device 0, op 1 ten times faster on device 1, and op 0's
    # output takes 100 s to cross. Any schedule that starts op 0 on device 0 ends at 11
    # s; the whole graph on device 1 takes 2.1 s. Op units only, so that no coarser run
    # finds device 1 (m_topo has no units: its fill over device 1 alone finds it). The
    # final check simulates by the batched simulator (big graphs) or the reference one.
    from simplace.placers import context

    monkeypatch.setattr(context, "batched_pays", lambda m, k: path == "batched")
    if path == "batched":
        def no_reference(self, placement, **kw):
            raise AssertionError("the batched path called the reference simulator")
        monkeypatch.setattr(context.PlacerContext, "simulate", no_reference)
    g = make_graph([0], [1], m=2, edge_bytes=[100.0])
    inp = machine(np.array([[1.0, 1.1], [10.0, 1.0]]), bandwidth=1.0)
    opts = {} if method == "m_topo" else {"units": [0], "module_depths": [], "repasses": 0}
    raw = optimize(g, inp, method=method, fallback_single=False, **opts)
    res = optimize(g, inp, method=method, **opts)
    assert res.step_time_s == pytest.approx(2.1)
    np.testing.assert_array_equal(res.placement, [1, 1])
    if raw.step_time_s > 2.1:
        assert res.info["returned"] == "single"
        assert res.info["single_device"] == 1
        assert res.info["schedule_step_time_s"] == pytest.approx(raw.step_time_s)
        assert "device 1" in res.info["note_single"]
    else:
        assert res.info["returned"] == "schedule"
    if method == "m_etf":
        np.testing.assert_array_equal(raw.placement, [0, 0])
        assert raw.step_time_s == pytest.approx(11.0)
        assert raw.info["returned"] == "schedule"


def test_the_check_passes_runs_that_do_not_fit_until_one_that_does():
    # Six independent ops of 1 s (ops 3-5 take 2 s on device 0), memory for three outputs
    # a device. Five runs that put every op on one device do not fit; the sixth, a split
    # estimated faster than the conservative model's best (a slower split), does. The
    # check passes the five (a fixed number of checks settled for the conservative one).
    from simplace.placers import PlacerContext
    from simplace.placers._list_runs import Setup

    g = make_graph([], [], m=6)
    t = np.array([[1.0, 1.0]] * 3 + [[2.0, 1.0]] * 3)
    fast, slow = np.array([0, 0, 0, 1, 1, 1]), np.array([1, 1, 1, 0, 0, 0])
    crowded = simulate(g, machine(t), np.zeros(6, np.int32)).peak_memory_bytes[0]
    split = simulate(g, machine(t), fast).peak_memory_bytes.max()
    inp = machine(t, memory=(crowded + split) / 2)
    assert simulate(g, inp, fast).step_time_s < simulate(g, inp, slow).step_time_s
    runs = [{"placement": np.full(6, k % 2, np.int32), "estimated_s": 1.0 + k,
             "memory": "liveness", "unit": f"one device {k}", "unplaceable": []}
            for k in range(5)]
    runs += [{"placement": fast, "estimated_s": 6.0, "memory": "liveness",
              "unit": "the fast split", "unplaceable": []},
             {"placement": slow, "estimated_s": 7.0, "memory": "conservative",
              "unit": "the slow split", "unplaceable": []}]
    out = Setup(PlacerContext(g, inp)).finish(runs)
    np.testing.assert_array_equal(out.placement, fast)
    assert out.info["unit"] == "the fast split" and out.info["returned"] == "schedule"
    assert [c["oom"] for c in out.info["checked"]] == [True] * 5 + [False]


@pytest.mark.parametrize("option,value", [("units", "many"), ("units", [-1]),
                                          ("units", []), ("module_depths", [0]),
                                          ("module_depths", ["x"])])
def test_bad_unit_options(option, value):
    g, inp = corner_cases()["no_edges"]
    with pytest.raises(SimplaceError, match=option):
        optimize(g, inp, method="m_etf", **{option: value})


@pytest.fixture(scope="module")
def small_zoo():
    from simplace import trace, zoo

    graphs = {}
    for name in ("mlp", "tiny_cnn", "rnnlm"):
        fn, args = zoo.get(name, small=True)
        graphs[name] = trace(fn, *args, name=name)
    return graphs


@pytest.mark.parametrize("machine_name", ("haswell_k40x4", "cpu_h100x4_nvlink"))
def test_never_slower_than_single_and_deterministic(small_zoo, machine_name):
    cm = CostModel.load(machine_name)
    for name, g in small_zoo.items():
        single = optimize(g, cm, method="single")
        assert not single.oom
        for method in METHODS:
            res = optimize(g, cm, method=method)
            check_result(res, g, cm)
            assert not res.oom
            assert res.step_time_s <= single.step_time_s, (name, method)
            assert res.info["returned"] in ("schedule", "single")
            again = optimize(g, cm, method=method)
            np.testing.assert_array_equal(res.placement, again.placement)


@pytest.mark.parametrize("method", METHODS)
def test_auto_memory_takes_liveness_only_when_the_program_fits(method):
    # 10 independent 100-byte outputs; devices 0 and 1 are fast but hold 350 bytes,
    # device 2 is 3x slower. The conservative model keeps every output: 3 ops per fast
    # device, 4 on the slow one (12 s). Liveness frees outputs nobody reads, so op units
    # alternate over the fast devices in segments of two ops, which the program holds
    # (200 bytes at a time): 5 s. "auto" runs both and keeps liveness's since it fits.
    m = 10
    g = make_graph([], [], m=m, out_bytes=np.full(m, 100.0))
    inp = machine(np.tile([1.0, 1.0, 3.0], (m, 1)), memory=[350.0, 350.0, 1e6])
    cons = optimize(g, inp, method=method, memory="conservative")
    auto = optimize(g, inp, method=method)
    assert not cons.oom and not auto.oom
    assert auto.step_time_s <= cons.step_time_s
    assert cons.info["memory_model"] == "conservative"
    if method in ("m_etf", "m_sct", "heft"):
        assert cons.step_time_s == pytest.approx(12.0)
        assert auto.step_time_s == pytest.approx(5.0)
        assert auto.info["memory_model"] == "liveness"
        assert auto.info["memory"] == "auto"


@pytest.mark.parametrize("method", METHODS)
def test_auto_memory_rejects_liveness_schedules_the_program_cannot_hold(method):
    # A chain on a fast device that holds 350 bytes: liveness would keep 2 outputs live
    # and put the whole chain there, but one segment holds all ten outputs until it
    # ends: the reference simulator says OOM, and the conservative schedule is returned.
    m = 10
    g = chain(m, nbytes=100.0, out_bytes=np.full(m, 100.0))
    inp = machine(np.tile([1.0, 3.0], (m, 1)), latency=0.1, bandwidth=1e3,
                  memory=[350.0, 1e6])
    auto = optimize(g, inp, method=method)
    assert not auto.oom
    if method != "m_topo":
        rejected = [c for c in auto.info["checked"] if c["memory"] == "liveness"]
        assert rejected and all(c["oom"] for c in rejected)
        assert auto.info["memory_model"] == "conservative"


def two_layer_rnn(steps):
    """Two stacked recurrent layers, step-major in graph order as a traced loop is: each
    cell is two ops (``rnn/layer_<l>/gate`` then ``.../state``); layer 0's state feeds its
    next step and layer 1's cell of the same step."""
    names, edges, last = [], [], {}
    for _ in range(steps):
        for layer in (0, 1):
            a = len(names)
            names += [f"rnn/layer_{layer}/gate", f"rnn/layer_{layer}/state"]
            edges.append((a, a + 1))
            if layer in last:
                edges.append((last[layer], a))
            if layer == 1:
                edges.append((last[0], a))
            last[layer] = a + 1
    m, (src, dst) = len(names), np.array(sorted(edges)).T
    return OpGraph(op=["op"] * m, name_path=names, flops=np.ones(m), bytes_accessed=np.ones(m),
                   out_bytes=np.full(m, 10.0), signature=["sig"] * m, src=src, dst=dst,
                   edge_bytes=np.full(len(src), 10.0), param_names=[], param_sizes=[],
                   param_op=np.zeros(0, np.int64), param_index=np.zeros(0, np.int64))


@pytest.mark.parametrize("method", ("m_etf", "m_sct"))
def test_lookahead_pipelines_stacked_layers(method):
    # Each cell ends first on the device of the cell before it, so without lookahead
    # everything stays on one device (12 s). Looking one cell ahead, layer 1's cell goes
    # to the other device, which leaves device 0 free for layer 0's next step: the layers
    # pipeline, 6 steps of 1 s plus the last layer-1 cell and one copy.
    g = two_layer_rnn(6)
    inp = machine(np.full((g.num_ops, 2), 0.5), latency=0.1)
    plain = optimize(g, inp, method=method, lookahead=False)
    assert plain.step_time_s == pytest.approx(12.0)
    res = optimize(g, inp, method=method)
    assert res.step_time_s == pytest.approx(7.1)
    assert res.info["unit"] == "module depth 2 + lookahead"
    np.testing.assert_array_equal(res.placement, np.tile([0, 0, 1, 1], 6))


@pytest.mark.parametrize("method", METHODS)
def test_a_spent_budget_stops_new_runs(method):
    # With (almost) no time one run completes (and is still checked against single);
    # without a budget every run does.
    rng = np.random.default_rng(4)
    g = random_graph(rng, "layered", 40)
    cm = CostModel.synthetic(3, seed=0)
    full = optimize(g, cm, method=method)
    rushed = optimize(g, cm, method=method, budget_s=1e-9)
    check_result(rushed, g, cm)
    assert "runs_skipped" not in full.info
    assert len(rushed.info["runs"]) == 1
    assert rushed.info["runs_skipped"] >= 1 and "budget" in rushed.info["note_budget"]


@pytest.mark.parametrize("method", ("m_etf", "m_sct", "heft"))
def test_runs_are_made_in_the_order_a_budget_keeps(method):
    # Op units first, then every family with lookahead from the most units to the
    # fewest, then the re-passes, then the families without lookahead: a budget that
    # stops the runs keeps the kinds of run that won on the zoo's big graphs.
    g = two_layer_rnn(6)
    inp = machine(np.full((g.num_ops, 2), 0.5), latency=0.1)
    runs = optimize(g, inp, method=method).info["runs"]
    units = [r["unit"] for r in runs]
    assert units[0] == "ops"
    looked = [k for k, u in enumerate(units) if u.endswith("+ lookahead")]
    plain = [k for k, u in enumerate(units)
             if k and not u.endswith("+ lookahead") and not u.startswith("segments")]
    assert looked and plain and max(looked) < min(plain)
    # the two families that differ here, in both halves: module depth 2 (a cell, 24
    # units) before 8 blocks
    for half in (looked, plain):
        names = [units[k].removesuffix(" + lookahead") for k in half]
        assert names.index("module depth 2") < names.index("8 blocks")
    assert all(r["wall_s"] >= 0 for r in runs)


@pytest.mark.parametrize("method", ("m_etf", "m_sct", "heft"))
def test_auto_memory_runs_liveness_as_soon_as_memory_is_tight(method):
    # The machine of test_auto_memory_takes_liveness_only_when_the_program_fits: the
    # first (op-unit) conservative run already finds a device full, so every liveness
    # run comes before the rest of the conservative ones, and the same runs are made
    # as under each model alone.
    m = 10
    g = make_graph([], [], m=m, out_bytes=np.full(m, 100.0))
    inp = machine(np.tile([1.0, 1.0, 3.0], (m, 1)), memory=[350.0, 350.0, 1e6])
    runs = optimize(g, inp, method=method).info["runs"]
    models = [r["memory"] for r in runs]
    assert models[0] == "conservative" and models[1] == "liveness"
    first_rest = models.index("conservative", 1)
    assert "liveness" not in models[first_rest:]
    for model in ("conservative", "liveness"):
        alone = optimize(g, inp, method=method, memory=model).info["runs"]
        assert [r["unit"] for r in runs if r["memory"] == model] == \
            [r["unit"] for r in alone]


@pytest.mark.slow
def test_a_best_run_out_of_memory_is_repaired():
    # On the VM's CPU devices a segment's outputs live as long as it does, which neither
    # memory model counts: every checked run of m_topo on nmt_2layer is out of memory,
    # the conservative one too. Chains moved off the overfull devices make it fit.
    from simplace.models import load_graph

    g, cm = load_graph("nmt_2layer"), CostModel.load("cpu_vm2core_x4")
    res = optimize(g, cm, "m_topo")
    assert all(c["oom"] for c in res.info["checked"])
    assert not res.oom and res.info["repair_rounds"] >= 1
    assert "moved off the overfull devices" in res.info["note_memory"]
    assert res.step_time_s == pytest.approx(simulate(g, cm, res.placement).step_time_s)
    assert res.info["unrepaired_step_time_s"] < res.step_time_s  # fitting costs time

"""Profiles (issue 32): chunks timed on this host scale the cost model's op times, and
``CostModel.price`` is the one place a profile enters the simulators."""

import json
import warnings

import numpy as np
import pytest

import simplace.calibrate.harness as harness
from simplace import CostModel, Device, zoo
from simplace.cli import main
from simplace.cost_model import call_arguments
from simplace.errors import CostModelError
from simplace.profile import (
    Chunk,
    Profile,
    ProfileError,
    ProfileInterrupted,
    _anchored,
    _check_sums,
    _op_times,
    cut_chunks,
    find_profile,
    profile,
    segment_cost_s,
)
from simplace.scales import Scales
from simplace.sim import simulate
from simplace.sim.inputs import sim_inputs

MACHINE = "cpu_vm2core_x4"  # 4 virtual CPU devices, as tests/conftest.py gives JAX
FAST = {"warmup": 1, "min_repeats": 2, "max_repeats": 3, "budget_s": 0.01, "rel_tol": 0.5}


@pytest.fixture(scope="module")
def mlp():
    """(fn, real args, Program) of the small mlp's training step."""
    from simplace.validate.executor import prepare

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn, args = zoo.get("mlp", small=True, abstract=False)
        return fn, args, prepare(fn, args, name="mlp")


@pytest.fixture(scope="module")
def machine():
    return CostModel.load(MACHINE)


@pytest.fixture(scope="module")
def prof(mlp, machine):
    fn, args, program = mlp
    return profile(fn, args, machine, chunks=6, program=program, timing=FAST, progress=False)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMPLACE_HOME", str(tmp_path))
    return tmp_path


def _plain_estimate(machine, graph, k=0):
    base = machine.with_corrections(Scales.identity(machine.num_devices))
    est = base.op_times(graph)[:, k]
    arg = machine.devices[k].argument_s * call_arguments(graph)
    return np.maximum(est - arg, 0.0), arg


# --------------------------------------------------------------------------- chunks
@pytest.mark.parametrize("seed", [0, 1])
def test_cut_chunks_cover_the_ops_exactly_with_about_equal_work(seed):
    rng = np.random.default_rng(seed)
    work = rng.exponential(size=300) * (rng.random(300) < 0.7)  # some ops cost nothing
    bounds = cut_chunks(work, 12)
    assert bounds[0][0] == 0 and bounds[-1][1] == 300 and len(bounds) <= 12
    assert all(b > a for a, b in bounds)
    assert all(bounds[k][1] == bounds[k + 1][0] for k in range(len(bounds) - 1))
    share = work.sum() / 12
    assert max(work[a:b].sum() for a, b in bounds) <= share + work.max() + 1e-12
    assert cut_chunks(np.zeros(5), 3) == ((0, 2), (2, 3), (3, 5))  # no estimate: by count
    assert cut_chunks(np.ones(3), 10) == ((0, 1), (1, 2), (2, 3))


def test_profile_chunks_cover_the_graph_and_are_the_segments_timed(prof, mlp):
    graph = mlp[2].graph
    assert prof.complete and prof.graph_hash == graph.hash and prof.num_ops == graph.num_ops
    assert set(prof.chunks) == {"cpu"} and prof.cost_model == MACHINE
    assert 2 <= len(prof.bounds) <= 6
    assert prof.bounds[0][0] == 0 and prof.bounds[-1][1] == graph.num_ops
    assert [(c.first, c.stop) for c in prof.chunks["cpu"]] == list(prof.bounds)
    assert all(c.measured_s > 0 and c.fixed_s > 0 and not c.estimated
               for c in prof.chunks["cpu"])
    assert prof.op_time_s["cpu"].shape == (graph.num_ops,)


def test_scaled_op_times_add_up_to_the_chunks_times_with_one_factor(prof, mlp, machine):
    """Each chunk's ops (less their arguments) add up to its measured time less its
    fixed cost, times one factor for all chunks (1 unless the whole step scales them:
    the next test); within a chunk they keep the cost model's proportions."""
    graph = mlp[2].graph
    t = prof.op_time_s["cpu"]
    work, arg = _plain_estimate(machine, graph)
    whole = prof.whole["cpu"]
    assert (whole.first, whole.stop) == (0, graph.num_ops) and not whole.estimated
    assert whole.measured_s > 0 and whole.fixed_s > 0
    factors = []
    for c in prof.chunks["cpu"]:
        want = max(c.measured_s - c.fixed_s, 0.0)
        assert c.argument_s == pytest.approx(arg[c.first:c.stop].sum())
        if want > 0:
            factors.append((t[c.first:c.stop].sum() - c.argument_s) / want)
        w, scaled = work[c.first:c.stop], t[c.first:c.stop] - arg[c.first:c.stop]
        if w.sum() > 0:
            np.testing.assert_allclose(scaled, w * (scaled.sum() / w.sum()), rtol=1e-9,
                                       atol=1e-18)
    # (the small mlp's chunks are mostly fixed cost: some have no op part at all)
    assert not factors or np.ptp(factors) <= 1e-9 * max(max(factors), 1.0)
    if factors and not _anchored(whole):  # its whole step too, as a rule
        assert factors[0] == pytest.approx(1.0)


def test_the_whole_step_scales_every_op_and_the_rest_is_a_segment_cost():
    """Chunks whose op parts add up to 12 ms where the whole graph as one segment takes
    8 ms (fusion cut at the chunk bound): each segment costs the difference, 4 ms, on
    top of its launch, and every op's time but its arguments is scaled by one factor
    so that one segment adds up to 8 ms and two to 12; a whole step that is mostly
    fixed cost, or that failed, scales nothing; the file check holds both rules."""
    work = np.array([1.0, 3.0, 2.0, 2.0]) * 1e-3
    arg = np.array([1e-5, 0.0, 0.0, 2e-5])
    chunks = [Chunk(0, 2, 5e-3, 1e-3, 1e-5), Chunk(2, 4, 9e-3, 1e-3, 2e-5)]
    whole = Chunk(0, 4, 9e-3, 1e-3, 3e-5)  # op part 8 ms; the chunks' op parts add to 12
    assert segment_cost_s(chunks, whole) == pytest.approx(4e-3)
    t = _op_times(work, arg, chunks, whole)
    assert t.sum() - arg.sum() + 1 * 4e-3 == pytest.approx(8e-3)
    assert t.sum() - arg.sum() + 2 * 4e-3 == pytest.approx(12e-3)
    np.testing.assert_allclose(t - arg, np.array([1.0, 3.0, 4.0, 4.0]) * 1e-3 * 4 / 12)
    _check_sums(t, chunks, whole, "p")
    bumped = np.array(t)
    bumped[3] *= 1.2
    with pytest.raises(ProfileError, match="whole step"):
        _check_sums(bumped, chunks, whole, "p")
    for flat in (Chunk(0, 4, 1.2e-3, 1e-3, 3e-5), Chunk(0, 4, None, 1e-3, 3e-5, True, "OOM")):
        assert segment_cost_s(chunks, flat) == 0.0
        t1 = _op_times(work, arg, chunks, flat)
        np.testing.assert_allclose(t1, _op_times(work, arg, chunks))
        _check_sums(t1, chunks, flat, "p")
    # chunks that add up to less than the whole step: no segment cost, ops scaled up
    fast = [Chunk(0, 2, 3e-3, 1e-3, 1e-5), Chunk(2, 4, 4e-3, 1e-3, 2e-5)]
    assert segment_cost_s(fast, whole) == 0.0
    assert _op_times(work, arg, fast, whole).sum() == pytest.approx(8e-3 + arg.sum())


def test_price_adds_the_segment_cost_to_the_profiled_kinds_launch(mlp_graph):
    """``price`` with a profile whose chunks cost more than its whole step: the launch
    of every device of the profiled kind grows by ``segment_s``; other kinds keep theirs."""
    cm = _mixed_machine()
    m = mlp_graph.num_ops
    half = m // 2
    chunks = (Chunk(0, half, 5e-3, 1e-3), Chunk(half, m, 9e-3, 1e-3))
    whole = Chunk(0, m, 9e-3, 1e-3)
    t = _op_times(np.ones(m) * 1e-4, np.zeros(m), chunks, whole)
    prof = Profile(cost_model="mixed", graph_hash=mlp_graph.hash, graph_name="mlp",
                   num_ops=m, bounds=((0, half), (half, m)), chunks={"cpu": chunks},
                   op_time_s={"cpu": t}, devices={"cpu": ("cpu:0", "x")},
                   whole={"cpu": whole})
    assert prof.segment_s("cpu") == pytest.approx(4e-3) and prof.segment_s("gpu") == 0.0
    plain, priced = cm.price(mlp_graph), cm.price(mlp_graph, prof)
    np.testing.assert_allclose(priced.launch_s, plain.launch_s + [4e-3, 4e-3, 0.0])
    # one segment on cpu:0 takes the whole step's op part: its ops plus one segment cost
    one = simulate(mlp_graph, cm.with_profile(prof), np.zeros(m, np.int32))
    bare = simulate(mlp_graph, cm, np.zeros(m, np.int32))
    assert one.busy_s[0] - bare.busy_s[0] == pytest.approx(
        8e-3 - plain.op_time_s[:, 0].sum(), rel=1e-6)


def test_a_profile_without_a_whole_step_still_loads_and_prices_by_its_chunks(
        prof, mlp, machine, tmp_path):
    """Files written before the whole step was timed: the chunks' times as they are."""
    _, arg = _plain_estimate(machine, mlp[2].graph)
    d = prof.to_dict()
    del d["kinds"]["cpu"]["whole"]
    t = np.array(d["kinds"]["cpu"]["op_time_s"])
    for c in prof.chunks["cpu"]:  # undo the whole-step factor, as such a file holds them
        sl = slice(c.first, c.stop)
        spread = t[sl] - arg[sl]
        if spread.sum() > 0:
            t[sl] = spread * (max(c.measured_s - c.fixed_s, 0.0) / spread.sum()) + arg[sl]
    d["kinds"]["cpu"]["op_time_s"] = t.tolist()
    (tmp_path / "old.json").write_text(json.dumps(d))
    old = Profile.load(tmp_path / "old.json")
    assert old.complete and old.whole == {}
    for c in prof.chunks["cpu"]:
        assert old.op_time_s["cpu"][c.first:c.stop].sum() == pytest.approx(
            max(c.measured_s - c.fixed_s, 0.0) + c.argument_s, rel=1e-9, abs=1e-15)


# --------------------------------------------------------------------------- pricing
def _mixed_machine():
    devs = [Device(name=f"cpu:{k}", kind="cpu", memory_bytes=2 ** 34, peak_flops_per_s=1e11,
                   memory_bandwidth_bytes_per_s=2e10, launch_s=5e-6, dispatch_s=1e-5)
            for k in range(2)]
    devs.append(Device(name="gpu:0", kind="gpu", memory_bytes=2 ** 34, peak_flops_per_s=1e13,
                       memory_bandwidth_bytes_per_s=1e12, launch_s=8e-6, dispatch_s=1e-5))
    lat = np.full((3, 3), 1e-5)
    np.fill_diagonal(lat, 0)
    bw = np.full((3, 3), 1e10)
    np.fill_diagonal(bw, np.inf)
    return CostModel("mixed", tuple(devs), lat, bw)


def _hand_profile(graph, machine="mixed", kind="cpu"):
    t = np.arange(graph.num_ops, dtype=np.float64) * 1e-6
    return Profile(cost_model=machine, graph_hash=graph.hash, graph_name=graph.name,
                   num_ops=graph.num_ops, bounds=((0, graph.num_ops),),
                   chunks={kind: ()}, op_time_s={kind: t}, devices={kind: ("x", "y")})


def test_price_changes_exactly_the_profiled_kinds_columns(mlp_graph):
    cm = _mixed_machine()
    scale = np.array([2.0, 3.0, 1.5])
    cm = cm.with_corrections(Scales(scale, np.ones(3), np.ones((3, 3))))
    p = _hand_profile(mlp_graph)
    plain, priced = cm.price(mlp_graph), cm.price(mlp_graph, p)
    for k in (0, 1):  # the CPUs: the profile's times, drift-corrected
        np.testing.assert_allclose(priced.op_time_s[:, k], scale[k] * p.op_time_s["cpu"])
    np.testing.assert_array_equal(priced.op_time_s[:, 2], plain.op_time_s[:, 2])
    assert not np.allclose(priced.op_time_s[:, 0], plain.op_time_s[:, 0])
    for field in plain._fields:  # links, launch, dispatch, pool...: the model's
        if field != "op_time_s":
            np.testing.assert_array_equal(getattr(priced, field), getattr(plain, field))
    # every caller of sim_inputs(graph, model) picks up an attached profile
    attached = cm.with_profile(p)
    np.testing.assert_array_equal(sim_inputs(mlp_graph, attached).op_time_s, priced.op_time_s)
    assert simulate(mlp_graph, attached, np.zeros(mlp_graph.num_ops, int)).step_time_s != \
        simulate(mlp_graph, cm, np.zeros(mlp_graph.num_ops, int)).step_time_s


def test_an_attached_profile_survives_derived_models_and_is_never_saved(mlp_graph, tmp_path):
    cm = _mixed_machine()
    p = _hand_profile(mlp_graph)
    attached = cm.with_profile(p)
    assert attached.subset([0, 2]).profile is p
    assert attached.with_corrections(Scales.identity(3)).profile is p
    assert attached == cm  # equality ignores the profile
    assert attached.to_dict() == cm.to_dict()
    attached.save(tmp_path / "m.json")
    assert CostModel.load(tmp_path / "m.json").profile is None
    sub = attached.subset([2, 0])  # a subset prices with its own columns
    np.testing.assert_allclose(sub.price(mlp_graph).op_time_s[:, 1], p.op_time_s["cpu"])
    # another graph: the attached profile is not used, silently
    fn, args = zoo.get("tiny_cnn", small=True)
    from simplace import trace

    other = trace(fn, *args)
    np.testing.assert_array_equal(attached.price(other).op_time_s, cm.price(other).op_time_s)


def test_a_profile_of_another_graph_or_machine_is_refused(mlp_graph):
    cm = _mixed_machine()
    fn, args = zoo.get("tiny_cnn", small=True)
    from simplace import trace

    other = trace(fn, *args)
    p = _hand_profile(other)
    with pytest.raises(CostModelError, match="profile was made for graph .* not for this graph"):
        cm.price(mlp_graph, p)
    with pytest.raises(CostModelError, match="made on machine 'elsewhere'"):
        cm.with_profile(_hand_profile(mlp_graph, machine="elsewhere"))
    with pytest.raises(CostModelError, match="kind.*tpu"):
        cm.with_profile(_hand_profile(mlp_graph, kind="tpu"))
    partial = _hand_profile(mlp_graph)
    partial = Profile(**{**partial.__dict__, "op_time_s": {}})
    with pytest.raises(CostModelError, match="incomplete.*--resume"):
        cm.with_profile(partial)


# --------------------------------------------------------------------------- files
def test_profile_file_round_trips(prof, tmp_path):
    prof.save(tmp_path / "p.json")
    back = Profile.load(tmp_path / "p.json")
    np.testing.assert_array_equal(back.op_time_s["cpu"], prof.op_time_s["cpu"])
    assert back.chunks == prof.chunks and back.bounds == prof.bounds
    assert back.host and back.date and back.jax_version


@pytest.mark.parametrize("edit, message", [
    ("truncate", "not valid JSON"),
    ("short", "entries but the graph has"),
    ("nudge", "the file was edited"),
    ("negative", "must be finite and >= 0"),
    ("nan", "must be finite and >= 0"),
    ("version", "schema_version 99 is not supported"),
    ("bounds", "cover ops"),
    ("whole", "whole covers ops 0..1"),
])
def test_a_truncated_or_hand_edited_file_is_refused(prof, tmp_path, edit, message):
    path = tmp_path / "p.json"
    prof.save(path)
    text = path.read_text()
    d = json.loads(text)
    t = d["kinds"]["cpu"]["op_time_s"]
    if edit == "truncate":
        path.write_text(text[:len(text) // 2])
    else:
        if edit == "short":
            del t[-1]
        elif edit == "nudge":
            k = int(np.argmax(t))
            t[k] *= 1.5
        elif edit == "negative":
            t[0] = -1e-6
        elif edit == "nan":
            t[0] = float("nan")
        elif edit == "version":
            d["schema_version"] = 99
        elif edit == "bounds":
            del d["bounds"][-1]
        elif edit == "whole":
            d["kinds"]["cpu"]["whole"]["stop"] = 1
        path.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match=message):
        Profile.load(path)


def test_find_profile_refuses_a_file_of_another_graph(prof, mlp, machine, home):
    from simplace import paths

    graph = mlp[2].graph
    assert find_profile(machine, graph) == (None, paths.profile_path(MACHINE, graph.hash))
    d = prof.to_dict()
    d["graph_hash"] = "f" * 64
    path = paths.profile_path(MACHINE, graph.hash)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match="not of this graph.*--no-profile"):
        find_profile(machine, graph)
    prof.save(path)
    found, where = find_profile(machine, graph)
    assert where == path and found.graph_hash == graph.hash


# --------------------------------------------------------------------------- interrupts
def _timing_that(monkeypatch, fail_at: int, exc):
    """Patch the harness so that its ``fail_at``-th call (from 1) raises ``exc``; returns
    the list of calls made."""
    real, calls = harness.time_fn, []

    def time_fn(*a, **kw):
        calls.append(1)
        if len(calls) == fail_at:
            raise exc
        return real(*a, **kw)

    monkeypatch.setattr(harness, "time_fn", time_fn)
    return calls


def test_an_interrupt_keeps_the_chunks_timed_and_resume_goes_on(mlp, machine, home,
                                                                 monkeypatch, capsys):
    fn, args, program = mlp
    from simplace import paths

    _timing_that(monkeypatch, 3, KeyboardInterrupt())
    argv = ["profile", "mlp", "--small", "--cost-model", MACHINE, "--chunks", "5",
            "--repeats", "2", "--chunk-budget-s", "0.01"]
    assert main(argv) == 130
    err = capsys.readouterr().err
    path = paths.profile_path(MACHINE, program.graph.hash)
    assert f"kept 2 of 5 chunks timed in {path}" in err and "--resume" in err
    partial = Profile.load(path)
    assert not partial.complete and len(partial.chunks["cpu"]) == 2
    with pytest.raises(ProfileError, match="incomplete.*--resume"):
        find_profile(machine, program.graph)
    # simulate refuses it, with the way out
    assert main(["simulate", "mlp", "--small", "--cost-model", MACHINE, "--single",
                 "cpu:0"]) == 2
    assert "incomplete" in capsys.readouterr().err

    calls = _timing_that(monkeypatch, 0, None)
    assert main([*argv, "--resume"]) == 0
    assert len(calls) == 4  # only the chunks not timed before, and the whole step
    done = Profile.load(path)
    assert done.complete and done.chunks["cpu"][:2] == partial.chunks["cpu"]


def test_the_python_api_raises_profile_interrupted_with_the_partial_profile(mlp, machine,
                                                                            monkeypatch,
                                                                            tmp_path):
    fn, args, program = mlp
    _timing_that(monkeypatch, 2, KeyboardInterrupt())
    with pytest.raises(ProfileInterrupted) as info:
        profile(fn, args, machine, chunks=4, program=program, timing=FAST, progress=False,
                path=tmp_path / "p.json")
    assert len(info.value.profile.chunks["cpu"]) == 1
    assert Profile.load(tmp_path / "p.json").chunks == info.value.profile.chunks


def _chunks_take_10_s(monkeypatch):
    """A clock for ``simplace.profile`` that only the timing harness moves, 10 s a call
    (a chunk, or the whole step)."""
    import sys
    import types

    profile_module = sys.modules["simplace.profile"]  # simplace.profile: the function
    clock = [0.0]
    real = harness.time_fn

    def time_fn(*a, **kw):
        clock[0] += 10.0
        return real(*a, **kw)

    monkeypatch.setattr(harness, "time_fn", time_fn)
    monkeypatch.setattr(profile_module, "time",
                        types.SimpleNamespace(perf_counter=lambda: clock[0]))


def test_a_budget_begins_no_chunk_that_would_end_past_it(mlp, machine, monkeypatch,
                                                         tmp_path):
    fn, args, program = mlp
    _chunks_take_10_s(monkeypatch)
    path = tmp_path / "p.json"
    # 10 s a chunk: the third ends at 30 s, a fourth would end at 40 s
    p = profile(fn, args, machine, chunks=5, program=program, timing=FAST, progress=False,
                path=path, budget_s=35)
    assert len(p.chunks["cpu"]) == 3 and not p.complete and "INCOMPLETE" in p.summary()
    assert Profile.load(path).chunks == p.chunks
    # the whole step is foreseen to take what its chunks took: 30 s more is past 55 s
    p = profile(fn, args, machine, chunks=3, program=program, timing=FAST, progress=False,
                budget_s=55)
    assert len(p.chunks["cpu"]) == 3 and not p.whole and not p.complete
    p = profile(fn, args, machine, chunks=3, program=program, timing=FAST, progress=False,
                budget_s=65)
    assert p.complete
    # resumed without a budget, it completes
    done = profile(fn, args, machine, program=program, timing=FAST, progress=False,
                   resume=Profile.load(path))
    assert done.complete and done.chunks["cpu"][:3] == Profile.load(path).chunks["cpu"]


def test_the_command_stops_at_its_budget_and_says_how_to_go_on(mlp, home, monkeypatch,
                                                               capsys):
    from simplace import paths

    _chunks_take_10_s(monkeypatch)
    argv = ["profile", "mlp", "--small", "--cost-model", MACHINE, "--chunks", "8",
            "--repeats", "2", "--chunk-budget-s", "0.01"]
    assert main([*argv, "--budget-s", "40"]) == 0
    out = capsys.readouterr().out
    path = paths.profile_path(MACHINE, mlp[2].graph.hash)
    assert "stopped at the 40 s budget" in out and f"kept in {path}" in out
    assert "--resume" in out and not Profile.load(path).complete
    assert main([*argv, "--resume"]) == 0
    assert "profile written to" in capsys.readouterr().out and Profile.load(path).complete


def test_a_failing_chunk_is_estimated_from_the_calibration_and_marked(mlp, machine,
                                                                      monkeypatch):
    fn, args, program = mlp
    _timing_that(monkeypatch, 2, RuntimeError("RESOURCE_EXHAUSTED: out of memory"))
    p = profile(fn, args, machine, chunks=4, program=program, timing=FAST, progress=False)
    chunks = p.chunks["cpu"]
    assert [c.estimated for c in chunks] == [False, True] + [False] * (len(chunks) - 2)
    bad = chunks[1]
    assert bad.measured_s is None and "RESOURCE_EXHAUSTED" in bad.error
    work, arg = _plain_estimate(machine, program.graph)
    sl = slice(bad.first, bad.stop)
    # the calibration's estimate, scaled like every op to the whole step
    spread = p.op_time_s["cpu"] - arg
    factor = spread[sl].sum() / work[sl].sum()
    np.testing.assert_allclose(spread[sl], work[sl] * factor, rtol=1e-9)
    assert factor > 0
    assert p.complete and p.num_estimated == 1
    assert "1 estimated" in p.summary()


def test_chunks_after_one_that_cannot_be_stood_in_for_are_estimated(mlp, machine,
                                                                     monkeypatch):
    import jax

    fn, args, program = mlp
    _timing_that(monkeypatch, 2, RuntimeError("failed to compile"))

    def no_shapes(*a, **kw):
        raise TypeError("no zeros of this dtype")

    monkeypatch.setattr(jax, "eval_shape", no_shapes)
    p = profile(fn, args, machine, chunks=4, program=program, timing=FAST, progress=False)
    chunks = p.chunks["cpu"]
    assert not chunks[0].estimated and all(c.estimated for c in chunks[1:])
    assert "failed to compile" in chunks[1].error
    assert all(c.error.startswith(f"not run: chunk {chunks[1].first}..{chunks[1].stop} "
                                  "failed before it") for c in chunks[2:])


# --------------------------------------------------------------------------- commands
def test_simulate_and_optimize_use_the_profile_and_say_so(home, capsys):
    base = ["mlp", "--small", "--cost-model", MACHINE]
    opt = ["optimize", *base, "--method", "single"]
    assert main(["simulate", *base, "--single", "cpu:0"]) == 0
    assert "profile:" not in capsys.readouterr().out  # none yet
    assert main([*opt, "--profile", "never"]) == 0
    out, err = capsys.readouterr()
    assert "profile:" not in out and "profiling" not in err
    assert main(opt) == 0  # auto: the machine is this host, so one is made
    out, err = capsys.readouterr()
    assert "profiling mlp/train/small" in err
    line = next(x for x in out.splitlines() if x.startswith("profile: "))
    path = line.split()[1]
    assert path.startswith(str(home / "profiles" / MACHINE))
    assert main(["simulate", *base, "--single", "cpu:0"]) == 0
    out, err = capsys.readouterr()
    assert f"profile: {path} (cpu measured" in out and "profiling" not in err
    simulated = [x for x in out.splitlines() if x.startswith("step time")]
    assert main(["simulate", *base, "--single", "cpu:0", "--no-profile"]) == 0
    out = capsys.readouterr().out
    assert "profile:" not in out
    assert [x for x in out.splitlines() if x.startswith("step time")] != simulated
    assert main([*opt, "--no-profile"]) == 0
    assert "profile:" not in capsys.readouterr().out
    placement = str(home / "p.json")
    assert main(["simulate", *base, "--single", "cpu:0", "--out", placement]) == 0
    capsys.readouterr()
    validate = ["validate", *base, placement, "--repeats", "2", "--budget-s", "0.01",
                "--records-dir", str(home / "records")]
    assert main(validate) == 0
    assert f"profile: {path}" in capsys.readouterr().out
    assert main([*validate, "--no-profile"]) == 0
    assert "profile:" not in capsys.readouterr().out
    assert main(["profile", "--list"]) == 0
    out = capsys.readouterr().out
    assert MACHINE in out and "mlp/train/small" in out and "complete" in out


def test_optimize_under_a_budget_it_cannot_fit_makes_no_profile(home, capsys):
    from simplace.models import load_graph
    from simplace.profile import COMPILE_FLOOR_S_PER_OP, RUNS_PER_STEP, time_floor_s

    cm = CostModel.load(MACHINE)
    g = load_graph("mlp", small=True)
    floor = time_floor_s(cm, g)
    op_time = np.asarray(cm.price(g).op_time_s)[:, 0]  # one kind (cpu): device 0
    assert floor == pytest.approx(RUNS_PER_STEP * op_time.sum()
                                  + COMPILE_FLOOR_S_PER_OP * g.num_ops)
    opt = ["optimize", "mlp", "--small", "--cost-model", MACHINE, "--method", "single"]
    tight = f"{floor:.6f}"  # a budget under twice the floor: no profile is made
    assert main([*opt, "--budget-s", tight]) == 0
    out, err = capsys.readouterr()
    assert "profile:" not in out and "no profile of this model made" in err
    assert f"simplace profile mlp --cost-model {MACHINE}" in err
    assert not (home / "profiles").exists()
    assert main([*opt, "--budget-s", tight, "--profile", "always"]) == 0  # asked for
    assert "profiling mlp/train/small" in capsys.readouterr().err
    assert any((home / "profiles" / MACHINE).glob("*.json"))


def test_optimize_makes_no_profile_for_another_machine(home, capsys):
    assert main(["optimize", "mlp", "--small", "--cost-model", "haswell_k40x2", "--method",
                 "single"]) == 0
    out, err = capsys.readouterr()
    assert "profile:" not in out and "not all on this host" in err
    assert not (home / "profiles").exists()
    assert main(["optimize", "mlp", "--small", "--cost-model", "haswell_k40x2", "--method",
                 "single", "--profile", "always"]) == 2
    assert "Cannot profile haswell_k40x2" in capsys.readouterr().err


def test_a_bad_profile_is_refused_by_simulate_and_remade_by_optimize(home, capsys):
    base = ["mlp", "--small", "--cost-model", MACHINE]
    assert main(["profile", *base, "--chunks", "3", "--repeats", "2", "--chunk-budget-s",
                 "0.01"]) == 0
    path = next((home / "profiles" / MACHINE).glob("*.json"))
    capsys.readouterr()
    path.write_text(path.read_text()[:-40])  # truncated
    assert main(["simulate", *base, "--single", "cpu:0"]) == 2
    err = capsys.readouterr().err
    assert "not valid JSON" in err and "--no-profile" in err
    assert main(["simulate", *base, "--single", "cpu:0", "--no-profile"]) == 0
    capsys.readouterr()
    assert main(["optimize", *base, "--method", "single"]) == 0
    out, err = capsys.readouterr()
    assert "remaking the profile" in err and f"profile: {path}" in out
    assert Profile.load(path).complete


def test_a_search_prices_its_graph_once(mlp_graph, pricings):
    """``CostModel.price`` is the one place SimInputs are made, once per graph and
    model: a local search and a whole comparison on a fresh model build them once (an
    earlier simplace built them 32 times for one local search), and a profile attached
    later prices afresh."""
    import simplace

    built = pricings
    cm = CostModel.load(MACHINE)
    simplace.optimize(mlp_graph, cm, "local", budget_s=0.5, seed=0)
    assert len(built) == 1
    simplace.optimize(mlp_graph, cm, "m_etf", seed=0)
    assert len(built) == 1
    assert cm.price(mlp_graph) is cm.price(mlp_graph)
    t = np.full(mlp_graph.num_ops, 1e-6)
    prof = Profile(cost_model=MACHINE, graph_hash=mlp_graph.hash, graph_name="mlp",
                   num_ops=mlp_graph.num_ops, bounds=((0, mlp_graph.num_ops),),
                   chunks={"cpu": ()}, op_time_s={"cpu": t}, devices={"cpu": ("cpu:0", "x")})
    profiled = cm.with_profile(prof)
    assert profiled.price(mlp_graph) is not cm.price(mlp_graph)
    np.testing.assert_array_equal(profiled.price(mlp_graph).op_time_s[:, 0], t)

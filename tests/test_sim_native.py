"""The native simulator (simplace.sim.native, numba) against the reference: random DAGs of
every shape on machines with exclusive groups, host costs and one, two or many kinds of
link; all three memory modes; placement errors, empty batches, chunks; the backend
choice of ``batched_simulator``.

The native simulator computes in the reference's float64 operation order, so times,
bytes and counts are compared for equality, not to a tolerance. Its kernel compiles once
per install (numba's cache); a cold compile costs several seconds in the first test.
"""

import sys

import numpy as np
import pytest

import simplace.sim as sim
from simplace.errors import PlacementError
from simplace.sim import simulate
from simplace.sim.batched import BatchedSimulator
from tests import sim_cases
from tests.sim_cases import make_graph, simple_inputs

numba = pytest.importorskip("numba", reason="the native simulator needs numba "
                                            "(pip install 'simplace[fast]')")
native = pytest.importorskip("simplace.sim.native")
NativeSimulator = native.NativeSimulator


def assert_exact(graph, inp, placements, out, *, memory=True):
    """Row b of ``out`` is the reference's result for placements[b]: times, bytes and
    counts equal; peaks to 1e-12 (sums of whole byte counts: equal in practice)."""
    for b, q in enumerate(placements):
        ref = simulate(graph, inp, q)
        assert out.step_time_s[b] == ref.step_time_s, b
        np.testing.assert_array_equal(out.busy_s[b], ref.busy_s)
        assert out.bytes_moved[b] == ref.bytes_moved
        assert out.host_s[b] == ref.host_s
        assert out.num_segments[b] == ref.num_segments
        assert out.num_transfers[b] == ref.num_transfers
        if memory is True:
            np.testing.assert_allclose(out.peak_memory_bytes[b], ref.peak_memory_bytes,
                                       rtol=1e-12)
            assert bool(out.oom[b]) == ref.oom
        elif memory is False:
            assert np.all(np.isnan(out.peak_memory_bytes[b])) and not out.oom[b]
        else:  # "oom": exact flags; a peak, where given, is exact
            assert bool(out.oom[b]) == ref.oom
            if not np.isnan(out.peak_memory_bytes[b]).any():
                np.testing.assert_allclose(out.peak_memory_bytes[b], ref.peak_memory_bytes,
                                           rtol=1e-12)
            else:
                assert not ref.oom


@pytest.mark.parametrize("seed", range(2))
def test_native_matches_reference_on_random_graphs(seed):
    # Per seed, three machines (one, two or many kinds of link; exclusive groups on
    # some; whole-number times with ties on some; host costs), each running a union of
    # random graphs of four shapes, with random, one-device, blocky and long-run
    # placements, in every memory mode.
    rng = np.random.default_rng(100 + seed)
    for classes in (1, 2, None):
        graphs = [sim_cases.random_graph(rng, shape, int(rng.integers(1, 41)))
                  for shape in rng.permutation(sim_cases.SHAPES)[:4]]
        g = sim_cases.union_graph(graphs)
        d = int(rng.integers(2, 6))
        inp = sim_cases.random_inputs(
            rng, g.num_ops, d, exclusive=bool(rng.random() < 0.5),
            integer_times=bool(rng.random() < 0.5), host_costs=True, link_classes=classes)
        p = np.concatenate([sim_cases.random_placements(rng, 10, g.num_ops, d),
                            sim_cases.long_run_placements(rng, 6, g.num_ops, d)])
        # A capacity at the median peak: about half the placements are OOM.
        peaks = [simulate(g, inp, q).peak_memory_bytes.max() for q in p]
        inp = inp._replace(memory_bytes=np.full(d, float(np.median(peaks))))
        for memory in (True, False, "oom"):
            assert_exact(g, inp, p, NativeSimulator(g, inp, memory=memory)(p),
                         memory=memory)


def test_native_matches_reference_with_ties_and_exclusive_groups():
    # Whole-number times (zeros too: segments that end where they start), all devices
    # in two exclusive groups, two kinds of link, multi-output ops and parameters.
    rng = np.random.default_rng(11)
    g = sim_cases.union_graph([sim_cases.random_graph(rng, s, 30) for s in sim_cases.SHAPES])
    inp = sim_cases.random_inputs(rng, g.num_ops, 4, integer_times=True, host_costs=True,
                                  link_classes=2)
    inp = inp._replace(exclusive_group=np.array([0, 1, 0, 1], np.int32))
    p = np.concatenate([sim_cases.random_placements(rng, 8, g.num_ops, 4),
                        sim_cases.long_run_placements(rng, 8, g.num_ops, 4)])
    assert_exact(g, inp, p, NativeSimulator(g, inp)(p))


@pytest.mark.parametrize("d", [9, 17])
def test_native_matches_reference_on_many_devices(d):
    # Machines of many devices (no limit on the device count: no bit masks), some in
    # shared exclusive groups.
    rng = np.random.default_rng(200 + d)
    g = sim_cases.union_graph([sim_cases.random_graph(rng, s, 25) for s in sim_cases.SHAPES])
    inp = sim_cases.random_inputs(rng, g.num_ops, d, exclusive=True, host_costs=True,
                                  link_classes=3)
    p = np.concatenate([sim_cases.random_placements(rng, 10, g.num_ops, d),
                        sim_cases.long_run_placements(rng, 4, g.num_ops, d)])
    assert_exact(g, inp, p, NativeSimulator(g, inp)(p))


def test_native_matches_the_jax_simulator():
    # The two backends give the same results (times to the JAX one's float64 order).
    rng = np.random.default_rng(12)
    g, inp = sim_cases.random_case(rng, host_costs=True)
    p = sim_cases.random_placements(rng, 9, g.num_ops, inp.num_devices)
    a = NativeSimulator(g, inp)(p)
    b = BatchedSimulator(g, inp)(p)
    for name in sim.BatchResult._fields:
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-12,
                                   atol=1e-15, err_msg=name)


def test_peak_memory_exact_when_times_span_many_binades():
    # Times from 1e-300 s to seconds: the sweep's time buckets hold nearly everything
    # in one, so it sorts all of them (the merge sort behind the bucket sort).
    g, inp, p = sim_cases.binade_span_case()
    assert_exact(g, inp, p, NativeSimulator(g, inp)(p))


@pytest.mark.parametrize("kind", ["spread", "binades", "ties", "cluster"])
def test_sort_orders_event_times(kind):
    # The sweep's sort (buckets, then insertion, or a merge sort where buckets crowd).
    rng = np.random.default_rng(14)
    for n in (0, 1, 2, 9, 700):
        x = {"spread": rng.uniform(0, 1, n), "binades": np.geomspace(1e-300, 1, n),
             "ties": rng.integers(0, 3, n).astype(float),
             "cluster": np.concatenate([rng.uniform(0, 1e-12, n - n // 9),
                                        rng.uniform(0, 1, n // 9)])}[kind]
        rng.shuffle(x)
        perm = np.full(n, -1, np.int64)
        native._argsort_into(x, perm, np.empty(n + 1, np.int64), np.empty(n, np.int64))
        np.testing.assert_array_equal(np.sort(perm), np.arange(n))
        np.testing.assert_array_equal(x[perm], np.sort(x))


def test_corner_cases_and_empty_batches():
    for name, (g, inp) in sim_cases.corner_cases().items():
        f = NativeSimulator(g, inp)
        d = inp.num_devices
        p = sim_cases.random_placements(np.random.default_rng(3), 5, g.num_ops, d)
        out = f(p)
        assert out.step_time_s.shape == (5,) and out.busy_s.shape == (5, d), name
        assert_exact(g, inp, p, out)
        empty = f(np.zeros((0, g.num_ops), int))
        for field in sim.BatchResult._fields:
            assert len(getattr(empty, field)) == 0, (name, field)
    assert_exact(*sim_cases.corner_cases()["fits_nowhere"], np.array([[0, 1]]),
                 NativeSimulator(*sim_cases.corner_cases()["fits_nowhere"])([[0, 1]]))


def test_bad_placements_raise_the_jax_simulators_errors():
    g = make_graph([0], [1], m=2)
    inp = simple_inputs(2, 3)
    ours, theirs = NativeSimulator(g, inp), BatchedSimulator(g, inp)
    # (int32[B, M] placements are checked in the kernel, others by numpy first.)
    for bad in (np.array([[0, 1], [7, 0]]), np.zeros((2, 3), int), np.zeros(2, int),
                np.array([[0.5, 1.0]]), np.array([[-1, 0]]),
                np.array([[0, 1], [0, 1], [1, 3]], np.int32), np.array([[-1, 0]], np.int32),
                np.zeros((1, 3), np.int32), np.array([[2**33, 0]])):
        with pytest.raises(PlacementError) as want:
            theirs(bad)
        with pytest.raises(PlacementError, match="^" + _escape(str(want.value)) + "$"):
            ours(bad)
    # Whole-number floats are accepted.
    assert ours(np.array([[0.0, 1.0]])).step_time_s[0] == 1 + 0.5 + 10 + 1
    with pytest.raises(ValueError, match="memory must be"):
        NativeSimulator(g, inp, memory="peak")
    with pytest.raises(ValueError, match="max_batch"):
        NativeSimulator(g, inp, max_batch=0)


def _escape(text):
    import re

    return re.escape(text)


def test_chunks_and_threads_give_the_results_of_one_run():
    # max_batch=3 runs 40 placements in 14 calls; a batch of 40 runs in blocks on
    # threads; one placement at a time runs on the caller's thread.
    rng = np.random.default_rng(15)
    g = sim_cases.union_graph([sim_cases.random_graph(rng, s, 15) for s in sim_cases.SHAPES])
    inp = sim_cases.random_inputs(rng, g.num_ops, 3, exclusive=True, host_costs=True)
    p = sim_cases.random_placements(rng, 40, g.num_ops, 3)
    whole = NativeSimulator(g, inp)(p)
    chunked = NativeSimulator(g, inp, max_batch=3)(p)
    single = NativeSimulator(g, inp)
    rows = [single(q[None]) for q in p]
    for name in sim.BatchResult._fields:
        np.testing.assert_array_equal(getattr(chunked, name), getattr(whole, name),
                                      err_msg=name)
        np.testing.assert_array_equal(np.concatenate([getattr(r, name) for r in rows]),
                                      getattr(whole, name), err_msg=name)
    assert_exact(g, inp, p[:6], whole)
    # Copy ids running out (int32) clear the table of copies sent and start again.
    short = NativeSimulator(g, inp)
    short._sizes = short._sizes[:3] + (np.int64(short._sizes[2] * 3),)
    renumbered = short(p)
    for name in sim.BatchResult._fields:
        np.testing.assert_array_equal(getattr(renumbered, name), getattr(whole, name),
                                      err_msg=name)


def test_backend_choice(monkeypatch, capsys):
    g = make_graph([0], [1], m=2)
    inp = simple_inputs(2, 2)
    assert isinstance(sim.batched_simulator(g, inp), NativeSimulator)
    assert isinstance(sim.batched_simulator(g, inp, backend="numba", memory="oom"),
                      NativeSimulator)
    jax_sim = sim.batched_simulator(g, inp, backend="jax", memory=False)
    assert isinstance(jax_sim, BatchedSimulator) and jax_sim.memory is False
    with pytest.raises(ValueError, match="backend must be"):
        sim.batched_simulator(g, inp, backend="cuda")
    # Without numba: "auto" is the JAX simulator and says so once; "numba" says what to
    # install.
    from simplace.sim import batched

    monkeypatch.setitem(sys.modules, "simplace.sim.native", None)
    monkeypatch.setattr(batched, "_NO_NUMBA_SAID", [])
    capsys.readouterr()
    assert isinstance(sim.batched_simulator(g, inp), BatchedSimulator)
    assert isinstance(sim.batched_simulator(g, inp), BatchedSimulator)
    err = capsys.readouterr().err
    assert err.count("numba cannot be imported") == 1 and "runs on JAX" in err
    with pytest.raises(ImportError, match="pip install numba"):
        sim.batched_simulator(g, inp, backend="numba")


@pytest.mark.slow
def test_works_where_numba_cannot_cache(tmp_path):
    # With no place for numba's cache (a read-only install), the kernel compiles in
    # the process instead of failing at import. (A subprocess: it compiles cold.)
    import subprocess

    code = (
        "import numba.core.caching as c\n"
        "c.CacheImpl._locator_classes = []\n"
        "import numpy as np\n"
        "import simplace.sim.native as nat\n"
        "from simplace.sim import simulate\n"
        "from tests.sim_cases import make_graph, simple_inputs\n"
        "g, inp = make_graph([0], [1], m=2), simple_inputs(2, 2)\n"
        "assert type(nat._simulate_one._cache).__name__ == 'NullCache'\n"
        "got = nat.NativeSimulator(g, inp)(np.array([[0, 1]])).step_time_s[0]\n"
        "assert got == simulate(g, inp, [0, 1]).step_time_s == 12.5, got\n")
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=300)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # JAX's; the child uses none
def test_a_forked_child_simulates():
    # The worker threads do not survive a fork: the child starts its own (a stale pool
    # would wait forever for threads that are not there).
    import os

    rng = np.random.default_rng(16)
    g = sim_cases.random_graph(rng, "random", 30)
    inp = sim_cases.random_inputs(rng, 30, 3)
    f = NativeSimulator(g, inp)
    p = sim_cases.random_placements(rng, 64, 30, 3)
    want = f(p).step_time_s  # the parent's pool runs
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        ok = np.array_equal(f(p).step_time_s, want)
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0

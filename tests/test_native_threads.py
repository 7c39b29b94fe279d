"""The native simulator's ``threads`` option: results bit-identical on one thread and on
two (and to the reference simulator's), at most that many threads running blocks, and
bad values refused."""

import threading

import numpy as np
import pytest

import simplace.sim as sim
from simplace.errors import SimplaceError
from simplace.sim import simulate
from tests import sim_cases

pytest.importorskip("numba", reason="the native simulator needs numba")
native = pytest.importorskip("simplace.sim.native")


def _case(seed=31, n=64):
    rng = np.random.default_rng(seed)
    g = sim_cases.union_graph([sim_cases.random_graph(rng, s, 12) for s in sim_cases.SHAPES])
    inp = sim_cases.random_inputs(rng, g.num_ops, 3, exclusive=True, host_costs=True)
    # Memory at the median peak: some placements are OOM, so every mode sweeps some.
    p = sim_cases.random_placements(rng, n, g.num_ops, 3)
    peaks = [simulate(g, inp, q).peak_memory_bytes.max() for q in p[:16]]
    return g, inp._replace(memory_bytes=np.full(3, float(np.median(peaks)))), p


def _threads_used(monkeypatch):
    """The set of thread ids that run kernel blocks from now on."""
    used = set()
    kernel = native._simulate_block

    def spy(*args):
        used.add(threading.get_ident())
        return kernel(*args)

    monkeypatch.setattr(native, "_simulate_block", spy)
    return used


@pytest.mark.parametrize("memory", [True, "oom", False])
def test_one_and_two_threads_give_the_same_bits_as_the_reference(memory, monkeypatch):
    g, inp, p = _case()
    native._pool(3)  # a shared pool wider than two threads: still two at most
    used = _threads_used(monkeypatch)
    outs = {}
    for threads in (1, 2):
        used.clear()
        outs[threads] = native.NativeSimulator(g, inp, memory=memory, threads=threads)(p)
        assert 1 <= len(used) <= threads
    for name in sim.BatchResult._fields:
        np.testing.assert_array_equal(getattr(outs[2], name), getattr(outs[1], name),
                                      err_msg=name)
    for b in range(0, len(p), 7):  # every 7th row against the reference, bit for bit
        ref = simulate(g, inp, p[b])
        assert outs[2].step_time_s[b] == ref.step_time_s
        assert outs[2].host_s[b] == ref.host_s
        assert outs[2].bytes_moved[b] == ref.bytes_moved
        np.testing.assert_array_equal(outs[2].busy_s[b], ref.busy_s)
        if memory is True:
            np.testing.assert_array_equal(outs[2].peak_memory_bytes[b], ref.peak_memory_bytes)
        if memory is not False:
            assert bool(outs[2].oom[b]) == ref.oom


def test_default_threads_follow_numba_and_small_batches_stay_on_the_caller(monkeypatch):
    g, inp, p = _case(n=20)
    f = native.NativeSimulator(g, inp, memory=False)
    assert f.threads is None
    used = _threads_used(monkeypatch)
    f(p[:15])  # under two blocks' worth: the caller's thread alone
    assert used == {threading.get_ident()}
    monkeypatch.setattr(native, "_threads", lambda: 1)
    used.clear()
    f(p)
    assert used == {threading.get_ident()}


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2", np.float64(2.0)])
def test_bad_thread_counts_are_refused(bad):
    g, inp, _ = _case(n=16)
    with pytest.raises(SimplaceError, match="threads must be a positive whole number"):
        native.NativeSimulator(g, inp, threads=bad)


def test_numpy_integer_thread_counts_are_taken():
    g, inp, p = _case(n=16)
    f = native.NativeSimulator(g, inp, threads=np.int64(2))
    assert f.threads == 2 and type(f.threads) is int
    np.testing.assert_array_equal(f(p).step_time_s,
                                  native.NativeSimulator(g, inp, threads=1)(p).step_time_s)

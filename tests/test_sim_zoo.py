"""The simulators agree on real graphs from the zoo, on datasheet machines (whose
devices have segment launch and dispatch costs and whose links have device_put costs):
the batched simulator and the list schedulers' incremental program against the
reference."""

import dataclasses

import numpy as np
import pytest

import simplace
from simplace import groups as G
from simplace import zoo
from simplace.sim import batched_simulator, lower_bound, sim_inputs, simulate
from simplace.sim.incremental import IncrementalProgram


def zoo_graph(name, training=True):
    fn, args = zoo.get(name, training=training, small=True)
    return simplace.trace(fn, *args, name=name)


def placements(graph, num_devices, rng, count=6):
    """Random op placements, plus contiguous ranges (few transfers, like real ones)."""
    out = [rng.integers(0, num_devices, graph.num_ops) for _ in range(count // 2)]
    for k in range(count - count // 2):
        ranges = G.target_count(graph, num_devices + k)
        out.append(G.expand(ranges, rng.integers(0, num_devices, ranges.max() + 1)))
    out.append(np.zeros(graph.num_ops, dtype=np.int32))
    return np.stack(out).astype(np.int32)


def tight_memory(cost_model, graph, batch):
    """The same machine with a memory size between the smallest and the largest peak the
    placements reach, so that some of them do not fit and some do."""
    peaks = sorted(simulate(graph, cost_model, p).peak_memory_bytes.max() for p in batch)
    memory_bytes = (peaks[0] + peaks[-1]) / 2
    devices = tuple(dataclasses.replace(d, memory_bytes=memory_bytes)
                    for d in cost_model.devices)
    return dataclasses.replace(cost_model, devices=devices)


@pytest.mark.parametrize("name, machine", [
    ("mlp", "cpu_h100x4_nvlink"),
    ("tiny_cnn", "haswell_k40x4"),
    ("nmt_2layer", "haswell_k40x2"),
    ("transformer", "placeto_k80x2"),
    ("resnet50", "cpu_h100x4_nvlink"),
])
def test_batched_matches_reference_on_zoo_graphs(name, machine):
    graph = zoo_graph(name)
    rng = np.random.default_rng(0)
    roomy = simplace.CostModel.load(machine)
    batch = placements(graph, roomy.num_devices, rng)
    for cm in (roomy, tight_memory(roomy, graph, batch)):
        got = batched_simulator(graph, cm)(batch)
        bound_s = lower_bound(graph, cm)
        program = IncrementalProgram(graph, sim_inputs(graph, cm))
        for b, p in enumerate(batch):
            ref = simulate(graph, cm, p)
            # The incremental program, op by op, sums in the reference's order: equal.
            assert program.replay(p) == ref.step_time_s
            np.testing.assert_allclose(got.step_time_s[b], ref.step_time_s, rtol=1e-9)
            np.testing.assert_allclose(got.peak_memory_bytes[b], ref.peak_memory_bytes,
                                       rtol=1e-9)
            np.testing.assert_allclose(got.bytes_moved[b], ref.bytes_moved, rtol=1e-9)
            # Segment semantics: device time per device (launches included), segments
            # run, device_put calls and host time agree too.
            np.testing.assert_allclose(got.busy_s[b], ref.busy_s, rtol=1e-9)
            assert (int(got.num_segments[b]), int(got.num_transfers[b])) == \
                (ref.num_segments, ref.num_transfers)
            np.testing.assert_allclose(got.host_s[b], ref.host_s, rtol=1e-9)
            assert bool(got.oom[b]) == ref.oom
            assert ref.step_time_s >= bound_s * (1 - 1e-12)
    # The tight machine really exercised OOM, in both directions.
    assert got.oom.any() and not got.oom.all()


def test_batched_matches_reference_on_a_profiled_zoo_graph():
    """A profile's op times go through the same pricing step as a cost model's: the
    batched simulator (numba where installed, and JAX) still agrees with the reference
    on a profiled graph, and the profile changes what both predict."""
    from simplace.profile import Profile
    from simplace.sim.inputs import sim_inputs

    graph = zoo_graph("tiny_cnn")
    cm = simplace.CostModel.load("cpu_vm2core_x4")
    rng = np.random.default_rng(3)
    # per-op times of another shape than the roofline's: what a profile measures
    t = cm.op_times(graph)[:, 0] * rng.uniform(0.2, 5.0, graph.num_ops)
    prof = Profile(cost_model=cm.name, graph_hash=graph.hash, graph_name=graph.name,
                   num_ops=graph.num_ops, bounds=((0, graph.num_ops),), chunks={"cpu": ()},
                   op_time_s={"cpu": t}, devices={"cpu": ("cpu:0", "TFRT_CPU_0")})
    profiled = cm.with_profile(prof)
    np.testing.assert_array_equal(sim_inputs(graph, profiled).op_time_s[:, 2], t)
    batch = placements(graph, cm.num_devices, rng)
    for backend in ("auto", "jax"):
        got = batched_simulator(graph, profiled, backend=backend)(batch)
        for b, p in enumerate(batch):
            ref = simulate(graph, profiled, p)
            np.testing.assert_allclose(got.step_time_s[b], ref.step_time_s, rtol=1e-9)
            np.testing.assert_allclose(got.busy_s[b], ref.busy_s, rtol=1e-9)
    plain = [simulate(graph, cm, p).step_time_s for p in batch]
    assert not np.allclose(plain, got.step_time_s)

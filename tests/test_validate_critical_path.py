"""simplace.sim.critical: the critical path of a simulated schedule, which the drift fit
(simplace.validate.drift) takes its subgradient from, is a chain of the schedule's
events that adds up to the step time."""

import numpy as np
import pytest

from simplace.cost_model import CostModel
from simplace.sim.critical import schedule_critical_path
from simplace.sim.inputs import sim_inputs
from simplace.sim.reference import simulate
from tests.sim_cases import SHAPES, random_graph


def _path_time(sched, segs, trs, latency_s) -> float:
    """The time the path's events take: each segment and each copy waited for in full
    from its start to its end; a copy only waited on for its link time, to its end less
    the link's latency."""
    t = sum(float(sched.segment_end_s[s] - sched.segment_start_s[s]) for s in segs)
    for k, whole in trs:
        a, b = int(sched.transfer_from[k]), int(sched.transfer_to[k])
        end = float(sched.transfer_end_s[k]) - (0.0 if whole else float(latency_s[a, b]))
        t += end - float(sched.transfer_start_s[k])
    return t


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("waits", [False, True], ids=["async-puts", "puts-wait"])
def test_the_path_adds_up_to_the_step_from_a_host_call(shape, waits):
    rng = np.random.default_rng(len(shape))
    cm = CostModel.synthetic(3, seed=1, exclusive_pair=True)  # cpu, cpu, gpu
    checked, longest, link_waits, host_waits = 0, 0, 0, 0
    for k in range(6):
        graph = random_graph(rng, shape, int(rng.integers(8, 40)))
        inp = sim_inputs(graph, cm)
        # With waits, puts between the CPUs and the GPU hold the host (cm.put_waits);
        # without, every put is asynchronous.
        inp = inp._replace(put_waits=inp.put_waits & waits)
        if k:  # device-bound: ops of 10-100 us, slow links (k=0 stays host-bound)
            inp = inp._replace(
                op_time_s=inp.op_time_s + rng.uniform(1e-5, 1e-4, inp.op_time_s.shape),
                bandwidth_bytes_per_s=inp.bandwidth_bytes_per_s / 1e3)
        p = rng.integers(0, 3, graph.num_ops).astype(np.int32)
        res = simulate(graph, inp, p, schedule=True)
        sch = res.schedule
        segs, trs, host_s = schedule_critical_path(graph, inp.exclusive_group, p, sch,
                                                   res.step_time_s, inp.latency_s,
                                                   inp.put_waits)
        # The path's events, back to back, and its host time fill the step exactly.
        path = _path_time(sch, segs, trs, inp.latency_s)
        assert path + host_s == pytest.approx(res.step_time_s, rel=1e-12)
        assert len(set(segs)) == len(segs) and len({k for k, _ in trs}) == len(trs)
        last_device_event = max([*sch.segment_end_s, *sch.transfer_end_s])
        if res.step_time_s > last_device_event and not (segs or trs):
            assert host_s == res.step_time_s  # host-bound: nothing on the devices moves it
            continue
        if not waits:
            # it ends at the step's last event and starts at a host call
            ends = [sch.segment_end_s[s] for s in segs] + [sch.transfer_end_s[k]
                                                            for k, _ in trs]
            assert max(ends) == pytest.approx(res.step_time_s, rel=1e-12)
            host_calls = [sch.segment_dispatch_s[s] for s in segs] + [
                sch.transfer_issue_s[k] for k, _ in trs]
            assert min(abs(host_s - h) for h in host_calls) < 1e-12 * res.step_time_s + 1e-15
        checked += 1
        longest = max(longest, len(segs) + len(trs))
        link_waits += sum(not whole for _, whole in trs)
        # a host wait on the path: host time from a waited copy's arrival on
        host_waits += any(inp.put_waits[sch.transfer_from[k], sch.transfer_to[k]]
                          and sch.transfer_end_s[k] > sch.transfer_issue_s[k]
                          for k, _ in trs)
    assert checked >= 5 and longest >= 10
    assert link_waits > 0 or waits or shape in ("chain", "params")  # a copy waited for a link
    assert host_waits > 0 or not waits

"""Gantt charts draw what the simulator models: host calls, segments, copies."""

import numpy as np
import pytest

from simplace.errors import SimplaceError
from simplace.gantt import gantt_rows, plot_gantt
from simplace.sim import make_sim_inputs, simulate
from tests.sim_cases import make_graph


def chain_case():
    """Chain 0 -> 1 -> 2 placed [0, 1, 0]: three segments, two copies."""
    g = make_graph([0, 1], [1, 2], m=3, edge_bytes=[100.0, 100.0])
    inp = make_sim_inputs(np.ones((3, 2)), np.full((2, 2), 0.3), np.full((2, 2), 1000.0),
                          np.full(2, 1e9), None, [0.5, 0.25], [0.1, 0.2], np.full((2, 2), 0.05))
    return g, inp, simulate(g, inp, np.array([0, 1, 0]), schedule=True)


def test_rows_follow_the_segment_schedule():
    _, inp, res = chain_case()
    bars = gantt_rows(res, inp)
    assert bars.rows == ["host", "device 0", "device 1", "device 0 -> device 1",
                         "device 1 -> device 0"]
    # Host, back to back: dispatch S0 (0.1), put op 0 to device 1 (0.05), dispatch S1
    # (0.2), put op 1 to device 0 (0.05), dispatch S2 (0.1).
    want_host = [(0.0, 0.1, "dispatch", 0), (0.1, 0.15, "put", 0), (0.15, 0.35, "dispatch", 1),
                 (0.35, 0.4, "put", 1), (0.4, 0.5, "dispatch", 2)]
    assert [k for *_, k in bars.host] == [k for *_, k in want_host]
    assert [c[2] for c in bars.host] == [c[2] for c in want_host]
    np.testing.assert_allclose([c[:2] for c in bars.host], [c[:2] for c in want_host])
    assert bars.host[-1][1] == pytest.approx(res.host_s)
    # Segments: S0 on device 0 from its dispatch 0.1 to 0.1 + launch 0.5 + 1 = 1.6; the
    # copy of op 0 leaves at 1.6 and arrives 1.6 + 0.3 + 100 / 1000 = 2.0; S1 runs
    # 2.0 .. 2.0 + 0.25 + 1 = 3.25; op 1's copy 3.25 .. 3.65; S2 3.65 .. 3.65 + 0.5 + 1.
    np.testing.assert_allclose([s[1:4] for s in bars.segments],
                               [(0.1, 1.6, 0.6), (2.0, 3.25, 2.25), (3.65, 5.15, 4.15)])
    assert [s[0] for s in bars.segments] == [1, 2, 1]
    np.testing.assert_allclose([t[1:3] for t in bars.transfers], [(1.6, 2.0), (3.25, 3.65)])
    assert [t[0] for t in bars.transfers] == [3, 4]
    # Each op drawn inside its segment, after the launch.
    np.testing.assert_allclose([o[1:3] for o in bars.ops], [(0.6, 1.6), (2.25, 3.25),
                                                            (4.15, 5.15)])
    assert res.step_time_s == pytest.approx(5.15)


def test_plot_writes_an_image_and_needs_a_schedule(tmp_path):
    g, inp, res = chain_case()
    path = tmp_path / "chart.png"
    plot_gantt(res, inp, str(path), graph=g, title="chain")
    assert path.read_bytes()[1:4] == b"PNG"
    with pytest.raises(SimplaceError, match="schedule=True"):
        plot_gantt(simulate(g, inp, np.zeros(3, int)), inp, str(path))

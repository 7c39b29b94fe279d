"""Gantt charts draw what the simulator models: host calls, segments, copies."""

import numpy as np
import pytest

from simplace.errors import SimplaceError
from simplace.gantt import gantt_rows, plot_gantt
from simplace.sim import make_sim_inputs, simulate
from tests.sim_cases import make_graph


def chain_case(dispatch=(0.1, 0.2), put=0.05):
    """Chain 0 -> 1 -> 2 placed [0, 1, 0]: three segments, two copies."""
    g = make_graph([0, 1], [1, 2], m=3, edge_bytes=[100.0, 100.0])
    inp = make_sim_inputs(np.ones((3, 2)), np.full((2, 2), 0.3), np.full((2, 2), 1000.0),
                          np.full(2, 1e9), None, [0.5, 0.25], dispatch, np.full((2, 2), put))
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


@pytest.mark.parametrize("dispatch, put", [((0.1, 0.0), 0.05), ((0.1, 0.2), 0.0),
                                           ((0.0, 0.0), 0.05)])
def test_host_calls_take_their_cost_even_when_some_cost_nothing(dispatch, put):
    # Calls that cost nothing end when the call before them did: the chart must still
    # give each call its own length, in the host's order (a segment's puts, then it).
    _, inp, res = chain_case(dispatch, put)
    host = gantt_rows(res, inp).host
    assert [(c[2], c[3]) for c in host] == [("dispatch", 0), ("put", 0), ("dispatch", 1),
                                            ("put", 1), ("dispatch", 2)]
    devices = [0, 1, 0]
    widths = [dispatch[devices[k]] if kind == "dispatch" else put for _, _, kind, k in host]
    np.testing.assert_allclose([b - a for a, b, _, _ in host], widths, atol=1e-15)
    assert host[0][0] == 0 and all(host[k][0] == host[k - 1][1] for k in range(1, len(host)))
    # A host that costs nothing: every call at 0 (their order is then not drawn).
    free = gantt_rows(chain_case((0.0, 0.0), 0.0)[2], inp).host
    assert len(free) == 5 and all(a == b == 0 for a, b, _, _ in free)


def test_plot_writes_an_image_and_needs_a_schedule(tmp_path):
    g, inp, res = chain_case()
    path = tmp_path / "chart.png"
    plot_gantt(res, inp, str(path), graph=g, title="chain")
    assert path.read_bytes()[1:4] == b"PNG"
    with pytest.raises(SimplaceError, match="schedule=True"):
        plot_gantt(simulate(g, inp, np.zeros(3, int)), inp, str(path))

"""Gantt charts of simulated schedules: the host, each device's segments, each used link.

What the simulators model (``simplace.sim.reference``) is what is drawn:

* a ``host`` row: the one host thread's calls, back to back from 0 in the order it makes
  them: each segment's dispatch and each ``jax.device_put``;
* one row per device: its segments (one fused XLA computation each) as outlined boxes
  from start to end, the launch (and any thread-pool launch) first, then its ops in
  graph order, coloured by op class. Inside a segment XLA fuses the ops: their
  positions there are a drawing aid (the schedule's ``op_start_s``/``op_end_s``), only
  the segment's start and end are events;
* one row per used link: each copy from the moment the link starts carrying it to its
  arrival.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from simplace.errors import SimplaceError

# Colour by what an op does, so a chart shows at a glance where compute and data
# movement sit; classes come from the cost model's op_class.
_CLASS_COLOURS = {
    "matmul": "#1f77b4", "conv": "#2ca02c", "elementwise": "#ff7f0e",
    "reduction": "#9467bd", "data_movement": "#8c564b", "control": "#e377c2",
    "free": "#c7c7c7",
}
_TRANSFER_COLOUR = "#d62728"
_LAUNCH_COLOUR = "#eeeeee"
_DISPATCH_COLOUR = "#17becf"
_PUT_COLOUR = "#bcbd22"


@dataclasses.dataclass(frozen=True)
class GanttRows:
    """What a chart draws, in seconds (no drawing library needed).

    rows: row labels, top to bottom (``host``, the devices, then ``a -> b`` per used link).
    host: ``[(start, end, kind, index)]``: the host's calls in the order made, ``kind``
      ``"dispatch"`` (``index``: the segment) or ``"put"`` (``index``: the transfer).
    segments: ``[(row, start, end, launch_end, segment)]``, one per segment.
    ops: ``[(row, start, end, op)]``, one per op that takes time (inside its segment).
    transfers: ``[(row, start, end, transfer)]``.
    """

    rows: list[str]
    host: list[tuple[float, float, str, int]]
    segments: list[tuple[int, float, float, float, int]]
    ops: list[tuple[int, float, float, int]]
    transfers: list[tuple[int, float, float, int]]


def gantt_rows(result, cost_model) -> GanttRows:
    """The bars of ``result.schedule`` (from ``simulate(..., schedule=True)``) on the
    machine ``cost_model`` (a ``CostModel`` or ``SimInputs``; device names and
    ``dispatch_s`` are read)."""
    sched = result.schedule
    if sched is None:
        raise SimplaceError("This result has no schedule: simulate with schedule=True.")
    dispatch = np.asarray(cost_model.dispatch_s, dtype=np.float64)
    names = list(getattr(cost_model, "device_names", None)
                 or [f"device {k}" for k in range(len(dispatch))])
    links = sorted({(int(a), int(b)) for a, b in
                    zip(sched.transfer_from.tolist(), sched.transfer_to.tolist(), strict=True)})
    rows = ["host", *names, *(f"{names[a]} -> {names[b]}" for a, b in links)]
    link_row = {link: 1 + len(names) + k for k, link in enumerate(links)}

    # The schedule records when each host call was made (ended): a segment's dispatch,
    # a transfer's issue. The host makes them one after another from time 0, so each
    # starts where the one before ended. Calls ending at the same time: all but the
    # first took no time; a dispatch that takes time can only be the first of them,
    # puts come in issue order.
    calls = [(float(t), 0 if dispatch[d] > 0 else 2, k, "dispatch") for k, (t, d) in
             enumerate(zip(sched.segment_dispatch_s, sched.segment_device, strict=True))]
    calls += [(float(t), 1, k, "put") for k, t in enumerate(sched.transfer_issue_s)]
    calls.sort()
    host, prev = [], 0.0
    for end, _, k, kind in calls:
        host.append((prev, end, kind, k))
        prev = end

    segments, ops = [], []
    op_start, op_end = sched.op_start_s, sched.op_end_s
    for s, (a, b) in enumerate(zip(sched.segment_first.tolist(),
                                   sched.segment_stop.tolist(), strict=True)):
        row = 1 + int(sched.segment_device[s])
        start, end = float(sched.segment_start_s[s]), float(sched.segment_end_s[s])
        segments.append((row, start, end, float(op_start[a]), s))
        ops += [(row, float(op_start[i]), float(op_end[i]), i) for i in range(a, b)
                if op_end[i] > op_start[i]]
    transfers = [(link_row[(int(sched.transfer_from[k]), int(sched.transfer_to[k]))],
                  float(sched.transfer_start_s[k]), float(sched.transfer_end_s[k]), k)
                 for k in range(len(sched.transfer_op))]
    return GanttRows(rows, host, segments, ops, transfers)


def plot_gantt(result, cost_model, path: str, *, graph=None, title: str = "") -> None:
    """Draw ``result.schedule`` (from ``simulate(..., schedule=True)``) to an image file.

    Args:
      result: a SimResult whose ``schedule`` is set.
      cost_model: the machine it was simulated on (device names, host call costs).
      path: output file; the format follows the extension (png, pdf, svg).
      graph: the OpGraph, to colour ops by class (optional).
      title: chart title.
    """
    bars = gantt_rows(result, cost_model)

    # A Figure of its own, not pyplot: it writes files only, never opens a window, and
    # leaves the caller's backend alone (matplotlib.use would switch a notebook's inline
    # plots off).
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    if graph is not None:
        from simplace.cost_model import op_class

        colours = [_CLASS_COLOURS.get(op_class(p), "#7f7f7f") for p in graph.op.tolist()]
    else:
        colours = [_CLASS_COLOURS["matmul"]] * len(result.schedule.op_start_s)

    scale, unit = _time_unit(float(result.step_time_s))
    rows = bars.rows
    fig = Figure(figsize=(12, 1.0 + 0.45 * len(rows)))
    ax = fig.subplots()

    def draw(items, row, **kw):
        if items:
            ax.broken_barh([(a * scale, (b - a) * scale) for a, b in items],
                           (row - 0.4, 0.8), **kw)

    draw([(a, b) for a, b, _, _ in bars.host], 0, edgecolors="white", linewidth=0.5,
         facecolors=[_DISPATCH_COLOUR if k == "dispatch" else _PUT_COLOUR
                     for _, _, k, _ in bars.host])
    for row in range(1, len(rows)):
        segs = [x for x in bars.segments if x[0] == row]
        draw([(s, e) for _, s, e, _, _ in segs], row, facecolors=_LAUNCH_COLOUR,
             edgecolors="black", linewidth=0.6)
        on = [x for x in bars.ops if x[0] == row]
        draw([(s, e) for _, s, e, _ in on], row, facecolors=[colours[i] for *_, i in on],
             linewidth=0)
        draw([(s, e) for r, s, e, _ in bars.transfers if r == row], row,
             facecolors=_TRANSFER_COLOUR, edgecolors="white", linewidth=0.5)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, max(float(result.step_time_s) * scale, 1e-12))
    ax.set_title(title or "simulated schedule")
    legend = [Patch(color=c, label=k) for k, c in _CLASS_COLOURS.items()] if graph is not None \
        else []
    legend += [Patch(facecolor=_LAUNCH_COLOUR, edgecolor="black", label="segment (launch)"),
               Patch(color=_TRANSFER_COLOUR, label="transfer"),
               Patch(color=_DISPATCH_COLOUR, label="host: dispatch"),
               Patch(color=_PUT_COLOUR, label="host: device_put")]
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _time_unit(step_s: float) -> tuple[float, str]:
    if step_s >= 1:
        return 1.0, "s"
    if step_s >= 1e-3:
        return 1e3, "ms"
    return 1e6, "us"

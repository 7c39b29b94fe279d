"""Gantt charts of simulated schedules: one row per device and per used link."""

from __future__ import annotations

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


def plot_gantt(result, cost_model, path: str, *, graph=None, title: str = "") -> None:
    """Draw ``result.schedule`` (from ``simulate(..., schedule=True)``) to an image file.

    Args:
      result: a SimResult whose ``schedule`` is set.
      cost_model: the machine it was simulated on (device names).
      path: output file; the format follows the extension (png, pdf, svg).
      graph: the OpGraph, to colour ops by class (optional).
      title: chart title.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    sched = result.schedule
    if sched is None:
        raise SimplaceError("This result has no schedule: simulate with schedule=True.")
    names = list(cost_model.device_names)
    links = sorted({(int(a), int(b)) for a, b in
                    zip(sched.transfer_from.tolist(), sched.transfer_to.tolist(), strict=True)})
    rows = names + [f"{names[a]} -> {names[b]}" for a, b in links]
    link_row = {link: len(names) + k for k, link in enumerate(links)}

    if graph is not None:
        from simplace.cost_model import op_class

        colours = [_CLASS_COLOURS.get(op_class(p), "#7f7f7f") for p in graph.op.tolist()]
    else:
        colours = [_CLASS_COLOURS["matmul"]] * len(sched.op_start_s)

    scale, unit = _time_unit(float(result.step_time_s))
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.45 * len(rows)))
    for d in range(len(names)):
        on = np.flatnonzero(sched.op_device == d)
        if on.size:
            ax.broken_barh(
                list(zip(sched.op_start_s[on] * scale,
                         (sched.op_end_s[on] - sched.op_start_s[on]) * scale, strict=True)),
                (d - 0.4, 0.8), facecolors=[colours[i] for i in on], linewidth=0)
    for link, r in link_row.items():
        on = np.flatnonzero((sched.transfer_from == link[0]) & (sched.transfer_to == link[1]))
        ax.broken_barh(
            list(zip(sched.transfer_start_s[on] * scale,
                     (sched.transfer_end_s[on] - sched.transfer_start_s[on]) * scale,
                     strict=True)),
            (r - 0.4, 0.8), facecolors=_TRANSFER_COLOUR, linewidth=0)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, max(float(result.step_time_s) * scale, 1e-12))
    ax.set_title(title or "simulated schedule")
    legend = [Patch(color=c, label=k) for k, c in _CLASS_COLOURS.items()] if graph is not None \
        else []
    legend.append(Patch(color=_TRANSFER_COLOUR, label="transfer"))
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _time_unit(step_s: float) -> tuple[float, str]:
    if step_s >= 1:
        return 1.0, "s"
    if step_s >= 1e-3:
        return 1e3, "ms"
    return 1e6, "us"

"""The reward curve of a run: a JSON file of per-update rows and a plot of it."""

from __future__ import annotations

import math
import os

from simplace._jsonfile import write_json

SCHEMA = "simplace.rl.history"
SCHEMA_VERSION = 1


def save_history(path, rows: list[dict], meta: dict | None = None) -> None:
    """Write the per-update rows (``update, episodes, wall_s, mean_step_time_s,
    best_step_time_s, reward_mean, entropy, ...``) as JSON with a schema version."""
    clean = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
              for k, v in r.items()} for r in rows]
    write_json(os.fspath(path), {"schema": SCHEMA, "version": SCHEMA_VERSION,
                                 **(meta or {}), "rows": clean})


def plot_history(rows: list[dict], path, title: str = "",
                 references: dict[str, float] | None = None) -> None:
    """Plot mean and best step time (ms) and mean reward against episodes to ``path``,
    with ``references`` (label -> step time, seconds: e.g. ``single``, the best
    heuristic, the lower bound) as horizontal lines to judge the curve against."""
    # A Figure of its own, not pyplot: files only, and the caller's backend (a notebook's
    # inline plots) is left alone.
    from matplotlib.figure import Figure

    ep = [r["episodes"] for r in rows]

    def col(name, scale=1.0):
        return [r[name] * scale if r.get(name) is not None and r[name] < 1e5 else math.nan
                for r in rows]

    fig = Figure(figsize=(8, 6))
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    ax1.plot(ep, col("mean_step_time_s", 1e3), label="batch mean (fitting)", lw=1)
    ax1.plot(ep, col("best_step_time_s", 1e3), label="best so far", lw=2)
    lines = sorted((references or {}).items(), key=lambda kv: -kv[1])
    styles = [("--", "-.", ":", (0, (1, 3)))[i % 4] for i in range(len(lines))]
    for (name, seconds), style in zip(lines, styles, strict=True):
        if seconds is not None and math.isfinite(seconds) and seconds < 1e5:
            ax1.axhline(seconds * 1e3, ls=style, lw=1, color="gray",
                        label=f"{name} {seconds * 1e3:.3g} ms")
    ax1.set_ylabel("step time, ms")
    ax1.legend()
    ax2.plot(ep, col("reward_mean"), lw=1)
    ax2.set_ylabel("mean reward")
    ax2.set_xlabel("episodes (sampled placements)")
    if title:
        ax1.set_title(title)
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=100)

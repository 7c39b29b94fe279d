"""What the benchmark scripts share: the machine and its load (figures are quoted with
it), a transcript printed and saved, and the ``model:machine`` rows they run
(``python bench/<script>.py`` puts this folder on the path)."""

import os
import platform
import sys
import time


def load_average() -> str:
    """The 1, 5 and 15 minute load averages as ``"0.71 1.54 2.04"`` (``"unknown"`` where
    the platform has none)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def machine_line() -> str:
    """``machine: <host> <arch>, <N> cores, <date time>, load average <...>``."""
    return (f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
            f"{time.strftime('%Y-%m-%d %H:%M')}, load average {load_average()}")


class Transcript:
    """Lines printed as they come (a long benchmark shows progress) and kept, to be
    written to a results file at the end."""

    def __init__(self):
        self.lines: list[str] = []

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def save(self, path: str | None) -> None:
        """Write the lines to ``path`` (nothing when None)."""
        if path:
            with open(path, "w") as f:
                f.write("\n".join(self.lines) + "\n")

    def finish(self, script: str, argv: list[str] | None, path: str | None) -> None:
        """Say the command that ran (``python bench/<script's file name> <argv>``, argv
        defaulting to the process's), then ``save`` to ``path``."""
        args = argv if argv is not None else sys.argv[1:]
        self.say(" ".join(["command: python", f"bench/{os.path.basename(script)}", *args]))
        self.save(path)


def geometric_mean(ratios) -> float:
    """The geometric mean of positive ratios (how the benchmarks average speedups)."""
    import math

    ratios = list(ratios)
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


# The fast heuristics ``local`` takes as starts by default (and ``single``).
FAST_HEURISTICS = ("single", "expert", "heft", "m_etf", "m_sct", "m_topo")


def starts_then_local(graph, cost_model, starts, *, seed: int, budget_s: float):
    """``(found, local)``: each method of ``starts`` run on the graph and machine, then
    ``local`` for ``budget_s`` from all of them."""
    from simplace.placers import optimize

    found = [optimize(graph, cost_model, m, seed=seed) for m in starts]
    loc = optimize(graph, cost_model, "local", seed=seed, budget_s=budget_s,
                   starts=[r.placement for r in found])
    return found, loc


def problems(rows: str):
    """Each ``model:machine`` of the comma-separated ``rows``, as (model, machine, training
    graph, cost model)."""
    import simplace
    from simplace.models import load_graph

    for row in rows.split(","):
        model, machine = row.split(":")
        yield model, machine, load_graph(model), simplace.CostModel.load(machine)

"""What the commands print: aligned tables, a simulated placement's report, the
comparison of ``optimize --method all``, how a search used its time, and what an
interrupted search kept."""

from __future__ import annotations

from simplace.graph import format_bytes


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(
            str(c).rjust(w) if _numeric(c) else str(c).ljust(w)
            for c, w in zip(r, widths, strict=True)))
    return "\n".join(out)


def _numeric(c) -> bool:
    s = str(c).replace(",", "").replace(".", "", 1).replace(" ", "")
    return s[:1].isdigit()


def report_result(result, cost_model, bound_s: float) -> str:
    """Step time, gap to the lower bound, and where the time and memory go, per device."""
    from simplace.external._machine import NO_CAP_BYTES
    from simplace.sim.objective import Ruler, objective_name

    step_s = float(result.step_time_s)
    gap = f"{step_s / bound_s:.2f}x the lower bound" if bound_s > 0 else "lower bound 0"
    what = {"latency": "step time",
            "throughput": "time between pipelined steps"}[objective_name(cost_model.objective)]
    ruled = isinstance(cost_model.objective, Ruler)
    if ruled:
        what += f", by {cost_model.objective.describe()}"
    lines = [f"{what} {step_s * 1e3:.3f} ms   ({gap}: {bound_s * 1e3:.3f} ms)"]
    if not ruled:  # a ruler's rules have no segments, device_put calls or host thread
        lines += [f"bytes moved between devices {format_bytes(float(result.bytes_moved))} in "
                  f"{result.num_transfers} device_put calls"
                  + ("   OUT OF MEMORY" if result.oom else ""),
                  f"{result.num_segments} segment{'s' * (result.num_segments != 1)} (one "
                  f"jitted call each); the host thread's last call returns at "
                  f"{result.host_s * 1e3:.3f} ms"
                  + (" (its calls, and its waits for copies between the CPU and a GPU)"
                     if cost_model.put_waits.any() else "")]
    elif result.oom:
        lines.append("OUT OF MEMORY (or an op on a device that cannot run it)")
    rows = []
    for d, name in enumerate(cost_model.device_names):
        peak, cap = float(result.peak_memory_bytes[d]), float(cost_model.memory_bytes[d])
        busy = float(result.busy_s[d])
        capped = cap < NO_CAP_BYTES  # an imported device the file sets no cap for
        rows.append([name, f"{busy * 1e3:.3f}", f"{100 * busy / step_s:.0f}%" if step_s else "-",
                     format_bytes(peak), format_bytes(cap) if capped else "no cap",
                     "OOM" if peak > cap else f"{100 * peak / cap:.1f}%" if capped else "-"])
    lines.append(_table(rows, ["device", "busy ms", "busy", "peak memory", "capacity",
                               "used"]))
    return "\n".join(lines)


def _oom_devices(result, cost_model) -> str:
    names = cost_model.device_names
    return ", ".join(names[d] for d in range(len(names))
                     if float(result.peak_memory_bytes[d]) > float(cost_model.memory_bytes[d]))


def results_table(results, bound_s: float) -> str:
    """The comparison table of ``optimize --method all``: the winner (the fastest that
    fits, as ``best_of`` picks it) marked ``*``, each method's speedup over ``single``
    and its gap to the lower bound."""
    from simplace.placers import best_of

    winner = best_of(results).method if results else None
    single = next((r for r in results if r.method == "single"), None)
    rows = []
    for r in results:
        speedup = (f"{single.step_time_s / r.step_time_s:.2f}x"
                   if single is not None and r.step_time_s > 0 else "-")
        gap = f"{r.step_time_s / bound_s:.2f}x" if bound_s > 0 else "-"
        rows.append([("* " if r.method == winner else "  ") + r.method,
                     f"{r.step_time_s * 1e3:.3f}", speedup, gap,
                     format_bytes(float(max(r.peak_memory_bytes, default=0.0))),
                     "OOM" if r.oom else "fits", f"{r.wall_s:.2f}"])
    return _table(rows, ["  method", "step ms", "vs single", "vs bound", "max peak mem",
                         "memory", "wall s"]) + "\n(* the winner; vs bound: step time over " \
        "the lower bound, 1.00x is optimal)"


def _budget_line(best, budget_s, wall_s: float, compared: bool) -> str:
    """How the search used its time: the wall time the user waited for it (every method
    with --method all) against the budget, when the first batch was ready (the part of
    the time a budget cannot bound) and why it stopped."""
    from simplace.placers import COMPARE_DEFAULT_BUDGET_S

    info = best.info
    line = f"search time {wall_s:.2f} s"
    if budget_s is not None:
        line += f" of a {budget_s:g} s budget"
    elif compared:
        line += f" of the default {COMPARE_DEFAULT_BUDGET_S:g} s budget"
    if compared:
        line += " (every method)"
        if budget_s is not None and wall_s > 1.1 * budget_s + 1.0:
            line += (f"; {wall_s - budget_s:.1f} s over it: first batches (compilation) "
                     "come on top of the parts (see the messages above)")
        return line
    if info.get("first_batch_s") is not None:
        line += f"; first batch ready after {info['first_batch_s']:.2f} s"
        if info.get("first_batch_over_budget"):
            line += " (past the budget: compilation)"
    if info.get("stop"):
        line += f"; stopped: {info['stop']}"
    return line


def _annealer(method: str) -> bool:
    from simplace.placers import method_kind, methods

    return method in methods() and method_kind(method) == "annealer"


def _interrupted_line(signal_name: str, best, out: str | None) -> str:
    """What an interrupted optimize kept."""
    kept = [f"the best placement so far ({best.step_time_s * 1e3:.3f} ms) in {out}"
            + (f" (--start {out} resumes from it)" if _annealer(best.method) else "")]
    info = best.info
    if info.get("checkpoint_path"):
        kept.append(f"the checkpoint {info['checkpoint_path']} (update "
                    f"{info.get('updates')}; --checkpoint resumes it)")
    if info.get("history_path"):
        kept.append(f"the history {info['history_path']}")
    return f"interrupted ({signal_name}): kept " + ", ".join(kept) + "."

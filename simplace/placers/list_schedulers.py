"""List schedulers that schedule the program simplace runs: ``heft``, ``m_topo``, ``m_etf``,
``m_sct`` (Baechi's memory-constrained list schedulers, and HEFT).

The program (``simplace.apply``; the design notes, "Simulation semantics") runs ops in
graph order: a *segment* is a maximal run of consecutive ops on one device, one jitted
call; one host thread dispatches the segments and the ``device_put`` of their inputs in
graph order; each segment pays a launch; a producer's outputs reach another device once,
by one put, over a FIFO link; outputs appear when their segment ends. A classic list
scheduler picks its own op order, which the program does not follow, and places op by op,
which the program pays for in launches and host dispatches: both made these methods
slower than one device. Here every method schedules **in graph order, under the
program's semantics**:

* **The estimate is the program.** ``simplace.sim.incremental.IncrementalProgram``
  simulates the placement incrementally, op by op in graph order, as the reference
  simulator does (segment start = latest of its device group free, its inputs' arrival
  and its dispatch; launch, pool launch, fused and unfused op costs; host time of each
  put and dispatch, and the host's wait for a copy between PjRt clients
  (``put_waits``); FIFO links whose latencies overlap; one put per producer and
  device). Placing the next op (or run of ops) on a device gives the exact end of the
  segment it joins or opens; the only approximation is that a put carries the outputs
  its first reader needs (the program sends every output any reader on that device
  needs).
* **Units.** A unit is a run of consecutive ops placed together: one op; a block (ops of
  about equal work, ``sum_i min_d t[i, d]`` split into k parts, k in ``BLOCK_COUNTS``
  below M); or a module run (consecutive ops of one module path cut to a depth in
  ``MODULE_DEPTHS``, forward and backward apart: a layer, an LSTM cell step, an attention
  block, the pieces an expert places). Each method places units in graph order; a unit
  is tried on each device by simulating it there and rolling the trial back. Coarse
  units cannot fragment the program into many small segments; fine ones find parallel
  work. Each unit family runs once, and once more (but op units) with **one-unit
  lookahead**: a unit's end on a device counts as the later of that end and the
  earliest end of the next unit on any device after it, so that a unit may end a
  little later to leave its device free for what follows (this is how cell steps of
  stacked LSTM layers pipeline across devices, as the expert placement does). Then
  **segment re-passes**: the segments of the best placement so far become the units of
  a new run (units aligned with what the first runs found; up to ``repasses`` times,
  while it helps). The run whose simulated step time is lowest wins (``info["unit"]``;
  every run in ``info["runs"]``, in the order made, with its wall time). The order is
  what a time budget keeps: op units, the lookahead runs from the family with the most
  units to the fewest, the re-passes, then the runs without lookahead (which rarely
  win), and re-passes again if one of those became the best.
* **Device rules** (what tells the methods apart):
  - ``m_etf``: earliest task first in the program's order: the unit goes to the device
    that can hold it where its segment ends first (ties: the device of the open
    segment, which adds no segment; then the lower index).
  - ``m_sct``: ``m_etf``, plus SCT's favourite children (from the LP relaxation of
    Hanen & Munier, or by the largest tensor on big graphs, see
    ``favourite_children_lp``): a unit goes to the device of its ops' favourite parents
    when that device can hold it and its end there is no later than the best end plus
    the time the favourite tensors would take to cross over.
  - ``heft``: HEFT's own schedule (upward rank order, earliest finish with insertion,
    memory-aware, see ``heft``) proposes a device per op; in graph order a unit goes to
    its proposed device (the one holding most of its work under HEFT) or stays on the
    device of the open segment, whichever ends it first (ties: the proposed device).
  - ``m_topo``: Baechi's fill in topological (graph) order: the fastest k devices in
    turn, each up to its share of the work, for every k = 1..D; no unit runs (its
    placements are contiguous already).
* **Memory** (Baechi's model, every method): a device holds the parameters of the ops
  placed on it (each once), the output of each op placed there and the bytes of every
  tensor it receives (once per producer and device). A unit is eligible on a device only
  if what it adds fits. ``memory="conservative"`` (Baechi's choice) frees nothing, an
  upper bound on the program's peak; ``memory="liveness"`` frees an output and its
  copies once all its readers are placed (graph outputs never): it packs far more onto a
  device, without a guarantee (the program keeps a segment's outputs until the segment
  ends). ``memory="auto"`` (default) runs under the conservative model, and when memory
  kept some unit off a device (big training graphs on 12 GB GPUs), under liveness too:
  every liveness run as soon as that is seen, then the rest of the conservative ones.
  Whatever the model, the simulator has the last word (the reference one, or the
  batched one, whose numbers equal it, where that is cheaper: big graphs,
  ``PlacerContext.simulate_each``): runs are simulated in order of estimated step time
  until one fits (at the latest the best conservative one: it bounds the peak), and that
  one is the schedule (``info["checked"]``, ``info["memory_model"]``), unless the fastest
  run checked before it that does not fit, repaired (chains moved off its overfull
  devices, ``simplace.placers.memory_repair``), fits and is still faster: then that
  (``info["repaired_run"]``, ``info["note_memory"]``). A unit that fits
  nowhere goes to the device with the most free memory, op by op
  (``info["unplaceable_ops"]``, ``info["note"]``).
* **Never worse than one device.** The winning schedule's simulated step time is
  compared with the single-device placements ``single`` considers (devices by the step
  time of the whole graph alone, the first that fits memory); when one of
  them is faster (or the schedule runs out of memory and it does not), it is returned
  instead and ``info["returned"]`` says ``"single"`` (else ``"schedule"``), with both
  step times in ``info``.

Every method is a deterministic function of the graph and machine (no random choice)
unless given a time budget (``budget_s``, counted from the call of ``optimize``; ``local``
gives its starts one, ``compare`` its fast methods): then no new run starts once it is
spent, and a run under way is given up (``info["runs_skipped"]``, ``info["runs_stopped"]``);
the first run always completes, so a budget too short for one run is overrun by it
(``compare`` does not start a method whose cost estimate does not fit its time left).
Cost: O(M D) Python steps per run (O(M D^2) with lookahead), about 20
runs per memory model: seconds on graphs of a few thousand ops, longer on the zoo's
biggest graphs.

Options (``optimize(..., method=..., memory=..., ...)``):
  memory: ``"auto"`` (default), ``"conservative"`` or ``"liveness"``.
  lp_max_edges: m_sct solves its LP only for graphs with at most this many connected op
    pairs (default 20,000); larger graphs use the greedy favourite child.
  units: block counts of the unit runs, 0 meaning op units (default: 0 and
    ``BLOCK_COUNTS``); module_depths (default ``MODULE_DEPTHS``, [] for none); lookahead
    (default True); repasses (default ``REPASSES``). Not m_topo's.
  fallback_single: return the fastest single device that fits when it beats the
    schedule (default True; False returns the schedule whatever it costs).
  fifo_links: heft only, for HEFT's own schedule (default False: contention-free).

Where things are: ``m_topo`` and ``m_etf`` here; ``heft`` in ``simplace.placers.heft``,
``m_sct`` in ``simplace.placers.sct``; what they share (memory, units, runs, the final
check) in ``simplace.placers._list_runs``.
"""

from __future__ import annotations

import math

import numpy as np

from simplace.placers import Cost, PlacerContext, PlacerOutput, register
from simplace.placers import heft as _heft  # noqa: F401 (registers heft)
from simplace.placers import sct as _sct  # noqa: F401 (registers m_sct)
from simplace.placers._list_runs import COMMON_OPTIONS, Setup, blocks, earliest

# Their old home: tests/test_list_schedulers.py imports them from here.
from simplace.placers.heft import _Timeline  # noqa: F401
from simplace.sim.incremental import IncrementalProgram as _Program  # noqa: F401


# --------------------------------------------------------------------------- m-TOPO
@register("m_topo", cost=Cost(0.0, 1.2e-5), rank=6, options={"memory": COMMON_OPTIONS["memory"],
                             "fallback_single": COMMON_OPTIONS["fallback_single"]})
def m_topo(ctx: PlacerContext) -> PlacerOutput:
    """Baechi's m-TOPO: fill devices in turn, in graph order, under memory caps.

    Over the fastest k devices for every k, the best simulated.

    Devices are ranked fastest first (smallest total op time ``T_d = sum_i t[i, d]``,
    ties by index). For k = 1..D the first k take part: device ``d``'s share is
    ``cap_d = T* / n_g`` of its own time, with ``T* = 1 / sum_g (1 / T_g)`` the makespan
    of a perfect split over the exclusive groups among them (``T_g``: the group's
    fastest member, ``n_g``: its members taking part); on identical devices this is
    ``sum_i t_i / k``. Ops go in graph order to the current device until its load
    ``sum t[i, d]`` reaches ``cap_d``; then the next device takes over (the last one
    takes the rest). An op that does not fit the current device's memory moves the fill
    on to the next device that holds it (then any earlier one that does, then any device
    that does, else the device with the most free memory). ``info["devices_used"]``: the
    k that won, ``info["device_order"]`` its devices.
    """
    s = Setup(ctx)
    if s.m == 0:
        return s.finish([{"placement": np.zeros(0, np.int32), "estimated_s": 0.0,
                          "unplaceable": []}], {"device_order": [], "share_s": []})
    total = s.inp.op_time_s.sum(axis=0)
    ranked = [int(d) for d in np.argsort(total, kind="stable")]
    group = s.prog.group
    t = s.prog.t

    def runs_under(memory: str) -> list[dict]:
        runs = []
        for k in range(1, s.d + 1):
            if s.completed and s.late():
                s.skipped += 1
                continue
            order = ranked[:k]
            g_total: dict[int, float] = {}
            g_size: dict[int, int] = {}
            for d in order:
                g_total[group[d]] = min(g_total.get(group[d], math.inf), float(total[d]))
                g_size[group[d]] = g_size.get(group[d], 0) + 1
            t_star = (1.0 / sum(1.0 / v for v in g_total.values())
                      if all(v > 0 for v in g_total.values()) else 0.0)
            cap = {d: t_star / g_size[group[d]] for d in order}
            load = dict.fromkeys(order, 0.0)
            state = {"cur": 0}

            def choose(run, a, b, eligible, order=order, cap=cap, load=load, state=state):
                cur = state["cur"]
                while cur < len(order) - 1 and load[order[cur]] >= cap[order[cur]] and (
                        load[order[cur]] > 0 or cap[order[cur]] > 0):
                    cur += 1
                state["cur"] = cur
                d = order[cur]
                if d not in eligible:
                    ahead = [x for x in range(cur + 1, len(order)) if order[x] in eligible]
                    if ahead:
                        state["cur"] = cur = ahead[0]
                        d = order[cur]
                    else:
                        behind = [order[x] for x in range(cur) if order[x] in eligible]
                        d = behind[0] if behind else min(eligible, key=ranked.index)
                if d in load:
                    load[d] += sum(t[i][d] for i in range(a, b))
                return d

            r = s.run(blocks(s.work, 0), choose, memory=memory)
            if r is None:  # the budget ran out during the run
                continue
            r.update(unit=f"{k} devices", info={
                "devices_used": k, "device_order": order,
                "share_s": [float(cap[d]) for d in order]})
            runs.append(r)
        return runs

    return s.finish(s.memory_runs(runs_under))


# --------------------------------------------------------------------------- ETF family
@register("m_etf", cost=Cost(0.0, 1.5e-5), rank=7, options=COMMON_OPTIONS)
def m_etf(ctx: PlacerContext) -> PlacerOutput:
    """Baechi's m-ETF in the program's order: each unit to the device where it ends first.

    Each unit (op or block, in graph order) goes to the device that can hold it where its
    segment ends first, under the program's semantics (ties: the open segment's device,
    then the lower index); the best of the unit runs, never worse than ``single``
    (module docstring)."""
    s = Setup(ctx)
    if s.m == 0:
        return s.finish([{"placement": np.zeros(0, np.int32), "estimated_s": 0.0,
                          "unplaceable": []}])
    return s.finish(s.unit_runs(lambda run, a, b, eligible: earliest(run, a, b,
                                                                      eligible)[0]))

"""The critical path of a simulated schedule: the chain of events that set the step time.

``schedule_critical_path`` walks a ``Schedule`` of the reference simulator
(``simulate(..., schedule=True)``) back from its last event, following at each segment or
copy the event that let it start, by the reference simulator's rules (its module
docstring, "Segments", "Transfers"). It tells which segments and copies a change of
their duration moves the step time by: the drift fit (``simplace.validate.drift``) takes
the step time's subgradient in the corrections from it.

Not to be confused with ``simplace.sim.bounds.critical_path_s``: the longest dependency
chain of op times on the fastest device, a lower bound that needs no placement and no
schedule.
"""

from __future__ import annotations

import numpy as np

__all__ = ["schedule_critical_path"]


def schedule_critical_path(graph, group: np.ndarray, placement: np.ndarray, sched,
                           step_time_s: float | None = None,
                           latency_s: np.ndarray | None = None,
                           put_waits: np.ndarray | None = None
                           ) -> tuple[list[int], list[tuple[int, bool]], float]:
    """(segments, transfers, host_s) on one critical path of a simulated schedule ``sched``
    of ``graph`` under ``placement`` (``group``: the exclusive group of each device,
    ``SimInputs.exclusive_group``; ``step_time_s``: the simulated step time, whose host
    part may end after every device event; ``put_waits``: ``SimInputs.put_waits``, the
    links whose put holds the host until the copy arrives). Each transfer comes with
    whether its whole duration is on the path (True) or only the time it kept its link
    busy, its bytes (False: a later copy on the link waited). ``host_s``: the host time
    on the path, which moves with the host's call costs: the host call it starts from,
    plus, wherever the path went through the host's wait for a copy, the host calls
    made between that copy's arrival and the call the path came from.

    Walking back from the last event (``simplace.sim.reference``'s semantics): a segment
    started when its exclusive group's previous segment ended, when one of its input
    copies arrived, or when the host dispatched it; a copy started when its
    ``device_put`` call was made, when its producer's segment ended, or when the previous
    copy on its link freed the link (its arrival minus the link's ``latency_s``). Host
    calls cost fixed host time (``dispatch_s``, ``put_s``), so the host clock at a call is
    fixed host time after the last wait that moved it (a put with ``put_waits`` whose
    copy arrived after the call returned): the path goes on from that copy, whole, or
    ends at the call when no wait came before it. A step that ends with a host call
    (host-bound) starts its path the same way from the host's last call (an empty path
    when no wait moved the host). At ties a device event wins over a host call (the
    right derivative). Each step goes to an earlier segment, or to a copy issued no
    later, so the walk ends.
    """
    first = sched.segment_first.tolist()
    stop = sched.segment_stop.tolist()
    dev = sched.segment_device.tolist()
    s_disp, s_end = sched.segment_dispatch_s.tolist(), sched.segment_end_s.tolist()
    t_op, t_to = sched.transfer_op.tolist(), sched.transfer_to.tolist()
    t_from = sched.transfer_from.tolist()
    t_issue, t_end = sched.transfer_issue_s.tolist(), sched.transfer_end_s.tolist()
    lat = np.zeros((1, 1)) if latency_s is None else np.asarray(latency_s)
    t_free = [e - (float(lat[a, b]) if latency_s is not None else 0.0)
              for e, a, b in zip(t_end, t_from, t_to, strict=True)]
    n_seg = len(first)
    if n_seg == 0:
        return [], [], float(step_time_s or 0.0)
    p = np.asarray(placement).tolist()
    seg_of = sched.op_segment.tolist()
    prev_in_group = _previous_in_group(np.asarray(group)[sched.segment_device].tolist())
    tr_of, link_prev = _transfers_by_target_and_link(t_op, t_from, t_to)
    in_ptr, in_order = (a.tolist() for a in graph.in_edges)
    src = graph.src.tolist()
    wait_before_issue, wait_before_call, moved = _host_waits(
        sched.transfer_segment.tolist(), t_from, t_to, t_issue, t_end, put_waits, n_seg)
    host_s = 0.0

    def from_host(call_time: float, wait: int):
        # The host call bound the path: fixed host time after a wait's arrival, or
        # from the step's start.
        nonlocal host_s
        if wait < 0:
            host_s += call_time
            return None
        host_s += call_time - t_end[wait]
        return ("tr", wait)

    def copies_into(s: int) -> set[int]:
        a, d = first[s], dev[s]
        out = set()
        for i in range(a, stop[s]):
            for e in in_order[in_ptr[i]:in_ptr[i + 1]]:
                j = src[e]
                if j < a and p[j] != d:
                    out.add(tr_of[(j, d)])
        return out

    s_last = max(range(n_seg), key=s_end.__getitem__)
    t_last = max(range(len(t_end)), key=t_end.__getitem__) if t_end else -1
    if t_last >= 0 and t_end[t_last] > s_end[s_last]:
        cur, top = ("tr", t_last), t_end[t_last]
    else:
        cur, top = ("seg", s_last), s_end[s_last]
    if step_time_s is not None and step_time_s > top:
        # The host's last call ends the step: fixed host time after the last wait.
        cur = from_host(float(step_time_s), moved)
    segs: list[int] = []
    trs: list[tuple[int, bool]] = []
    whole = True  # the copy reached was waited for in full (not only its link time)
    while cur is not None:
        kind, k = cur
        if kind == "seg":
            segs.append(k)
            best, nxt = s_disp[k], None  # dispatched: the host chain, fixed time
            j = prev_in_group[k]
            if j >= 0 and s_end[j] >= best:
                best, nxt = s_end[j], ("seg", j)
            for t in sorted(copies_into(k)):
                if t_end[t] > best or (t_end[t] == best and nxt is None):
                    best, nxt = t_end[t], ("tr", t)
            if nxt is None:
                nxt = from_host(s_disp[k], wait_before_call[k])
            whole = True
        else:
            trs.append((k, whole))
            best, nxt = t_issue[k], None  # the put call: the host chain, fixed time
            s = seg_of[t_op[k]]
            if s_end[s] >= best:
                best, nxt = s_end[s], ("seg", s)
            j = link_prev[k]
            if j >= 0 and (t_free[j] > best or (t_free[j] == best and nxt is None)):
                best, nxt = t_free[j], ("tr", j)
            whole = nxt is None  # reached by the host's wait: its whole duration
            if nxt is None:
                nxt = from_host(t_issue[k], wait_before_issue[k])
        cur = nxt
    return segs, trs, host_s



def _previous_in_group(grp: list[int]) -> list[int]:
    """For each segment, the previous segment of its exclusive group (-1: none)."""
    prev, last = [-1] * len(grp), {}
    for s, g in enumerate(grp):
        prev[s] = last.get(g, -1)
        last[g] = s
    return prev


def _transfers_by_target_and_link(t_op: list[int], t_from: list[int], t_to: list[int]
                                  ) -> tuple[dict[tuple[int, int], int], list[int]]:
    """``({(op, to device): transfer}, previous transfer on each transfer's link (-1:
    none))``."""
    tr_of: dict[tuple[int, int], int] = {}
    link_prev, last_link = [], {}
    for t, (o, a, b) in enumerate(zip(t_op, t_from, t_to, strict=True)):
        tr_of[(o, b)] = t
        link_prev.append(last_link.get((a, b), -1))
        last_link[(a, b)] = t
    return tr_of, link_prev


def _host_waits(t_seg: list[int], t_from: list[int], t_to: list[int],
                t_issue: list[float], t_end: list[float], put_waits, n_seg: int
                ) -> tuple[list[int], list[int], int]:
    """The wait that last moved the host clock before each host call (-1: none), in the
    host's order (each segment's puts, then its call): ``(before each put, before each
    segment's call, before the step's end)``."""
    waits = None if put_waits is None else np.asarray(put_waits, dtype=bool)
    wait_before_issue, wait_before_call = [-1] * len(t_seg), [-1] * n_seg
    moved, t = -1, 0
    for s in range(n_seg):
        while t < len(t_seg) and t_seg[t] == s:
            wait_before_issue[t] = moved
            if waits is not None and waits[t_from[t], t_to[t]] and t_end[t] > t_issue[t]:
                moved = t
            t += 1
        wait_before_call[s] = moved
    return wait_before_issue, wait_before_call, moved

"""The native simulator: the reference semantics as one compiled loop (numba), for many
placements at once.

``NativeSimulator(graph, inputs)(placements int[B, M]) -> BatchResult`` has the
interface of the JAX ``BatchedSimulator`` (``num_ops``, ``num_devices``, ``memory``,
``max_batch``) and simulates exactly what ``simplace.sim.reference`` does: segments
(launch, the pool's launch when the ops' pool work reaches the minimum, fused op costs,
unfused costs of ops with no input from their segment), one host thread (``put_s`` per
``device_put``, ``dispatch_s`` per segment call), lazy transfers issued by the first
consumer segment on each device in ``graph.in_edges`` order, FIFO links whose latency
overlaps, exclusive groups, busy time, bytes moved, segment and transfer counts, host
time, and exact peak memory.

Why a loop and not a scan: each op's work is a few comparisons and additions. The JAX
scan on XLA:CPU pays many kernel launches per op slice, which dwarf that work; a
compiled loop over precomputed int/float arrays pays little more than the work itself.
Blocks of placements run on a thread per core, or on ``threads`` threads (the kernel
releases the GIL; numba's ``parallel=True`` compiled slower, and its OpenMP threads
spun on a loaded machine), each block with its own scratch arrays. A placement numbers
its copies from ids above every earlier placement's, so the table of copies sent (op x
device -> id) is never cleared between placements, and the copies' own records
(arrival, bytes, last reader) are short lists.

Precision: float64 in the reference's operation order (``launch + pool launch``, then
``work + (op time [+ unfused])`` op by op; ``max(host, producer's end, link free)``;
``(t0 + latency) + bytes / bandwidth``; ``start + work``), compiled without fastmath,
so times equal the reference's bit for bit on the same inputs: ties between one
segment's end and another's start are common, and they decide orders.

Peak memory (``memory=True``) is the reference's sweep, per placement and device, over
the live intervals (each activation from its segment's start to its last use, copy
arrival or the step end; each received copy from its arrival to its last reader's
end), frees first at equal times. Sorting every event costs more than the simulation
itself, so the sweep goes by time buckets first: the live bytes at bucket boundaries
(sums of the bytes allocated and freed in each bucket, no sort) bound the peak from
below, and only the few buckets whose live bytes could exceed that bound have their
events sorted and swept. ``memory="oom"`` first bounds each device's peak by
everything it ever holds (activations, received copies, parameters per reading op),
and sweeps only placements whose bound exceeds a capacity (the same screen as the JAX
simulator's): the others report NaN peaks and cannot be OOM.

The kernel compiles on first use, once for every graph and machine (all arguments have
one type); ``cache=True`` keeps the machine code in ``__pycache__`` for later processes,
which load it instead of compiling, or where numba finds no writable place, it compiles
once per process.
"""

from __future__ import annotations

import concurrent.futures
import operator
import os
import threading

import numba
import numpy as np

from simplace._numba import njit as _njit
from simplace.errors import SimplaceError
from simplace.sim.inputs import (
    SimInputs,
    check_placements,
    check_simulator_options,
    put_waits_of,
)
from simplace.sim.results import BatchResult

# Ops x placements per kernel call, at most: a larger batch runs in chunks of a power of
# two of placements (at least 64). The kernel's memory does not grow with the batch
# (scratch is per thread block); chunks bound the int32 copy of the placements.
_MAX_CELLS = 1 << 23
# Placements per block, at least: a block allocates its scratch arrays (a few MB on big
# graphs), and each block handed to a thread costs tens of microseconds.
_MIN_BLOCK = 8


# Compiling the kernel took 5-10 s on 2 cores; loading it from numba's cache about 0.5 s.


# ---------------------------------------------------------------------------- kernel
# Every index is cast to unsigned (``_u(i)``): numba wraps negative signed indices
# around, three instructions and a load per access that LLVM cannot drop where the
# index was loaded from an array; unsigned ones have no such path (20% of the loop).
# No index here is negative.
_u = np.uint64

@_njit(fastmath=False)
def _merge_argsort(x, perm, tmp):
    """perm[:n] = the indices of x (float64[n]) in ascending order: a bottom-up merge
    sort (O(n log n) in any case; numba's np.argsort costs seconds more to compile)."""
    n = x.shape[0]
    for i in range(n):
        perm[_u(i)] = i
    width = 1
    src, dst = perm, tmp
    in_tmp = False
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j, w = lo, mid, lo
            while i < mid and j < hi:
                if x[_u(src[_u(j)])] < x[_u(src[_u(i)])]:
                    dst[_u(w)] = src[_u(j)]
                    j += 1
                else:
                    dst[_u(w)] = src[_u(i)]
                    i += 1
                w += 1
            while i < mid:
                dst[_u(w)] = src[_u(i)]
                i += 1
                w += 1
            while j < hi:
                dst[_u(w)] = src[_u(j)]
                j += 1
                w += 1
        src, dst = dst, src
        in_tmp = not in_tmp
        width *= 2
    if in_tmp:
        for i in range(n):
            perm[_u(i)] = src[_u(i)]


@_njit(fastmath=False)
def _argsort_into(x, perm, cnt, bucket):
    """perm[:n] = the indices of x (float64[n], finite, >= 0) in ascending order.

    A bucket sort by value, then an insertion sort that puts equal-bucket values in
    order: event times spread over the step, so buckets hold a few values each and this
    costs a few ns per value. Where they do not (times spanning many binades, or
    clustered), a merge sort takes over once the insertion sort has done 16 moves per
    value (``cnt`` is its scratch then)."""
    n = x.shape[0]
    if n == 0:
        return
    lo = x[0]
    hi = x[0]
    for i in range(n):
        if x[_u(i)] < lo:
            lo = x[_u(i)]
        if x[_u(i)] > hi:
            hi = x[_u(i)]
    scale = (n - 1) / (hi - lo) if hi > lo else 0.0
    if not (scale < np.inf):  # hi - lo is subnormal
        _merge_argsort(x, perm, cnt)
        return
    for k in range(n + 1):
        cnt[_u(k)] = 0
    for i in range(n):
        k = min(max(int((x[_u(i)] - lo) * scale), 0), n - 1)
        bucket[_u(i)] = k
        cnt[_u(k + 1)] += 1
    for k in range(n):
        cnt[_u(k + 1)] += cnt[_u(k)]
    for i in range(n):
        k = bucket[_u(i)]
        perm[_u(cnt[_u(k)])] = i
        cnt[_u(k)] += 1
    budget = 16 * n + 64
    for i in range(1, n):
        v = perm[_u(i)]
        xv = x[_u(v)]
        j = i - 1
        while j >= 0 and x[_u(perm[_u(j)])] > xv:
            perm[_u(j + 1)] = perm[_u(j)]
            j -= 1
        perm[_u(j + 1)] = v
        budget -= i - 1 - j
        if budget < 0:
            _merge_argsort(x, perm, cnt)
            return


@_njit(fastmath=False)
def _add_interval(q, t_alloc, t_free, size, ev_off, ev_n, ev_cap, scl, e_at, e_ft, e_s,
                  e_ab, e_fb, b_al, b_fr):
    """Record a live interval of ``size`` bytes on device q, [t_alloc, t_free): the
    next event slot of q (times, size, time buckets) and its bucket sums (see
    ``_simulate_one``'s peak sweep)."""
    o = ev_off[_u(q)]
    w = o + ev_n[_u(q)]
    ev_n[_u(q)] += 1
    top = ev_cap[_u(q)] - 1
    ka = min(int(t_alloc * scl[_u(q)]), top)
    kf = min(int(t_free * scl[_u(q)]), top)
    e_at[_u(w)] = t_alloc
    e_ft[_u(w)] = t_free
    e_s[_u(w)] = size
    e_ab[_u(w)] = ka
    e_fb[_u(w)] = kf
    b_al[_u(o + ka)] += size
    b_fr[_u(o + kf)] += size


# Why a compiled loop: the JAX scan on XLA:CPU paid ~20 kernel launches per op slice; this
# loop pays ~20 ns per op (ResNet-50: 72 us per placement and core, 18.5 ns per op; 37 ns
# with exact memory).
# Why one function (a numba kernel, exempt from the 120-line limit, tests/test_layout.py):
# every phase of the step (segments, copies, host clock, memory sweep) reads and writes
# the same ~40 scratch arrays and a dozen running scalars; as numba helpers each would
# take most of them as arguments and hand the scalars back as tuples, which hides the
# data flow the reference's rules are checked against. What needs few of them is out
# (_merge_argsort, _add_interval).
@_njit(fastmath=False)
def _simulate_one(p, id0, mode, g_int, g_float, m_int, m_float, scratch, f_scratch,
                  out_busy, out_peak):
    """Simulate placement ``p`` (int32[M]); its copies get ids ``id0`` and up.

    Returns (step_time, bytes_moved, segments, transfers, host_s, oom); fills
    ``out_busy[D]`` and ``out_peak[D]`` (NaN where memory is not computed)."""
    (in_ptr, in_src, t_ptr, tc_ptr, t_cons, group, use_op, use_idx, is_output) = g_int
    (opc, single_bytes, t_bytes, out_bytes, param_sizes) = g_float
    (n_groups,) = m_int
    (launch, dispatch, link, cap) = m_float
    (seg_of, last_op, x_cp, sent, x_op, x_to, ops_on, ncopy, ev_off, ev_n,
     ev_cap, pflag, perm_a, perm_f, cnt, bucket, e_ab, e_fb, cflag) = scratch
    (seg_start, op_end, x_arr, x_sz, lu, group_free, link_free, bound, e_at,
     e_ft, e_s, b_al, b_fr, ca_t, ca_s, cf_t, cf_s, cbuf, scl) = f_scratch
    m = p.shape[0]
    d = out_busy.shape[0]

    host = 0.0
    moved = 0.0
    step = 0.0
    nseg = 0
    nxfer = 0
    for g in range(n_groups):
        group_free[_u(g)] = 0.0
    for k in range(d * d):
        link_free[_u(k)] = 0.0
    for q in range(d):
        out_busy[_u(q)] = 0.0
        ops_on[_u(q)] = 0
        ncopy[_u(q)] = 0
        bound[_u(q)] = 0.0

    # One pass over the ops; a segment closes where the next op is elsewhere. (With
    # mem, it notes what the memory pass needs.)
    mem = mode != 0
    i = 0
    prev_a = 0
    prev_end = 0.0
    while i < m:
        a = i
        dev = p[_u(a)]
        ready = group_free[_u(group[_u(dev)])]
        pw = 0.0  # the segment's pool work, added in op order
        n = 0
        while True:
            base = (i * d + dev) * 3
            c = opc[_u(base)]
            pw += opc[_u(base + 1)]
            fused = False
            for e in range(in_ptr[_u(i)], in_ptr[_u(i + 1)]):
                j = in_src[_u(e)]
                if j >= a:  # produced inside this segment: fused, no wait
                    fused = True
                    if mem:
                        last_op[_u(j)] = i
                    continue
                frm = p[_u(j)]
                if frm == dev:  # an earlier segment of this device: done before this one
                    if mem:
                        last_op[_u(j)] = i
                    continue
                # x: the copy of j on dev, if this placement sent it (ids below id0
                # are earlier placements').
                x = sent[_u(j * d + dev)] - id0
                if x < 0:  # the first reader on dev sends the copy
                    x = nxfer
                    lk = (frm * d + dev) * 4
                    host += link[_u(lk)]
                    # Bytes of the put: j's distinct tensors read on dev, in output order.
                    nb = single_bytes[_u(j)]
                    if nb < 0:  # several tensors
                        nb = 0.0
                        for t in range(t_ptr[_u(j)], t_ptr[_u(j + 1)]):
                            for q in range(tc_ptr[_u(t)], tc_ptr[_u(t + 1)]):
                                if p[_u(t_cons[_u(q)])] == dev:
                                    nb += t_bytes[_u(t)]
                                    break
                    t0 = host
                    # (The previous segment's end is at hand: no wait on the store.)
                    se = prev_end if j >= prev_a else op_end[_u(j)]
                    if se > t0:
                        t0 = se
                    lf = link_free[_u(frm * d + dev)]
                    if lf > t0:
                        t0 = lf
                    tb = nb / link[_u(lk + 2)]
                    arr = t0 + link[_u(lk + 1)] + tb
                    if link[_u(lk + 3)] > 0.0 and arr > host:  # put_waits: the host waits
                        host = arr
                    # The link is busy for the bytes; latency overlaps the next copy.
                    link_free[_u(frm * d + dev)] = t0 + tb
                    sent[_u(j * d + dev)] = id0 + x
                    x_arr[_u(x)] = arr
                    if mem:
                        x_sz[_u(x)] = nb
                        x_op[_u(x)] = j
                        x_to[_u(x)] = dev
                    moved += nb
                    nxfer += 1
                    ncopy[_u(dev)] += 1
                    if arr > step:
                        step = arr
                    if arr > ready:
                        ready = arr
                elif x_arr[_u(x)] > ready:
                    ready = x_arr[_u(x)]
                if mem:
                    x_cp[_u(x)] = i
            if not fused:
                c = c + opc[_u(base + 2)]
            cbuf[_u(n)] = c
            n += 1
            if mem:
                seg_of[_u(i)] = nseg
                last_op[_u(i)] = i
            i += 1
            if i >= m or p[_u(i)] != dev:
                break
        # The segment's work: launch and the pool's (if its pool work reaches the
        # device's min), then its ops in order.
        work = launch[_u(dev * 3)] + (launch[_u(dev * 3 + 2)]
                                      if pw >= launch[_u(dev * 3 + 1)] else 0.0)
        for k in range(n):
            work = work + cbuf[_u(k)]
        host += dispatch[_u(dev)]
        start = ready if ready > host else host
        end = start + work
        for k in range(a, i):
            op_end[_u(k)] = end
        prev_a = a
        prev_end = end
        seg_start[_u(nseg)] = start
        group_free[_u(group[_u(dev)])] = end
        out_busy[_u(dev)] += end - start
        if end > step:
            step = end
        ops_on[_u(dev)] += n
        nseg += 1
    if host > step:
        step = host

    oom = False
    if mode == 0:
        for q in range(d):
            out_peak[_u(q)] = np.nan
        return step, moved, nseg, nxfer, host, oom

    # ---- memory
    if mode == 2:
        # The screen: everything a device ever holds, held all step, bounds its peak.
        for i in range(m):
            bound[_u(p[_u(i)])] += out_bytes[_u(i)]
        for x in range(nxfer):
            bound[_u(x_to[_u(x)])] += x_sz[_u(x)]
        for u in range(use_op.shape[0]):
            bound[_u(p[_u(use_op[_u(u)])])] += param_sizes[_u(use_idx[_u(u)])]
        tight = False
        for q in range(d):
            if bound[_u(q)] * (1 + 1e-9) > cap[_u(q)]:
                tight = True
        if not tight:
            for q in range(d):
                out_peak[_u(q)] = np.nan
            return step, moved, nseg, nxfer, host, oom

    # Parameters: resident on every device running an op that reads them, once per
    # device (summed in parameter order, as the reference does).
    for u in range(use_op.shape[0]):
        pflag[_u(use_idx[_u(u)] * d + p[_u(use_op[_u(u)])])] = 1
    for q in range(d):
        out_peak[_u(q)] = 0.0
    for j in range(param_sizes.shape[0]):
        for q in range(d):
            if pflag[_u(j * d + q)]:
                pflag[_u(j * d + q)] = 0
                out_peak[_u(q)] += param_sizes[_u(j)]

    # Last uses (the main loop noted the last reader of each activation on its device,
    # last_op, and of each copy, cp_op: segment ends on a device grow in graph order).
    # lu[j]: the end of the last segment on j's device that reads j (its own at least),
    # then, with its copies' arrivals, the activation's free time.
    for i in range(m):
        lu[_u(i)] = op_end[_u(last_op[_u(i)])]
    # Live intervals per device q, at ev_off[q] + 0..ev_n[q]-1: allocation time e_at,
    # free time e_ft, bytes e_s, and the times' buckets e_ab, e_fb. The sweep's order puts
    # every event of a time bucket (ev_cap[q] equal slices of [0, step]: every event lies
    # there) before the next bucket's, so the live bytes after each bucket are states of
    # the sweep: their maximum is a lower bound of the peak. Inside a bucket, the live
    # bytes never exceed those before it plus the bucket's allocations: only buckets where
    # that exceeds the lower bound can hold the peak, and only their events are sorted
    # and swept.
    for q in range(d):
        ev_n[_u(q)] = 0
        if q:
            ev_off[_u(q)] = ev_off[_u(q - 1)] + ops_on[_u(q - 1)] + ncopy[_u(q - 1)]
        # ev_cap[q]: the device's buckets, one per two intervals it may hold (fewer
        # buckets stay in cache on big graphs; more leave more candidates).
        ev_cap[_u(q)] = max(1, (ops_on[_u(q)] + ncopy[_u(q)]) // 2)
        sc = ev_cap[_u(q)] / step if step > 0 else 0.0
        scl[_u(q)] = sc if sc < np.inf else 0.0
        for k in range(ev_off[_u(q)], ev_off[_u(q)] + ev_cap[_u(q)]):
            b_al[_u(k)] = 0.0
            b_fr[_u(k)] = 0.0
    for x in range(nxfer):
        j = x_op[_u(x)]
        q = x_to[_u(x)]
        av = x_arr[_u(x)]
        if av > lu[_u(j)]:
            lu[_u(j)] = av
        fr = op_end[_u(x_cp[_u(x)])]
        size = x_sz[_u(x)]
        if fr > av and size > 0:  # the received copy
            _add_interval(q, av, fr, size, ev_off, ev_n, ev_cap, scl, e_at, e_ft, e_s,
                          e_ab, e_fb, b_al, b_fr)
    for i in range(m):
        dev = p[_u(i)]
        fr = step if is_output[_u(i)] else lu[_u(i)]
        st = seg_start[_u(seg_of[_u(i)])]
        size = out_bytes[_u(i)]
        if fr > st and size > 0:  # the activation
            _add_interval(dev, st, fr, size, ev_off, ev_n, ev_cap, scl, e_at, e_ft, e_s,
                          e_ab, e_fb, b_al, b_fr)
    for q in range(d):
        o = ev_off[_u(q)]
        n = ev_n[_u(q)]
        best = 0.0
        if n:
            nbq = ev_cap[_u(q)]
            # The lower bound; b_fr becomes each bucket's live bytes before it.
            live = 0.0
            for k in range(o, o + nbq):
                before = live
                live = live + b_al[_u(k)] - b_fr[_u(k)]
                if live > best:
                    best = live
                b_fr[_u(k)] = before
            # Candidates: buckets whose live bytes could exceed the bound.
            any_c = False
            for k in range(o, o + nbq):
                c = b_fr[_u(k)] + b_al[_u(k)] > best
                cflag[_u(k)] = c
                any_c = any_c or c
            if any_c:
                na = 0
                nf = 0
                for w in range(o, o + n):
                    if cflag[_u(o + e_ab[_u(w)])]:
                        ca_t[_u(na)] = e_at[_u(w)]
                        ca_s[_u(na)] = e_s[_u(w)]
                        na += 1
                    if cflag[_u(o + e_fb[_u(w)])]:
                        cf_t[_u(nf)] = e_ft[_u(w)]
                        cf_s[_u(nf)] = e_s[_u(w)]
                        nf += 1
                _argsort_into(ca_t[:na], perm_a, cnt, bucket)
                _argsort_into(cf_t[:nf], perm_f, cnt, bucket)
                # Sweep each candidate bucket from its live bytes before it; frees come
                # before allocations at equal times.
                sc = scl[_u(q)]
                cur_b = -1
                fi = 0
                live = 0.0
                for r in range(na):
                    t = ca_t[_u(perm_a[_u(r)])]
                    kb = min(int(t * sc), nbq - 1)
                    if kb != cur_b:
                        cur_b = kb
                        live = b_fr[_u(o + kb)]
                        while fi < nf and min(int(cf_t[_u(perm_f[_u(fi)])] * sc), nbq - 1) < kb:
                            fi += 1
                    while fi < nf and cf_t[_u(perm_f[_u(fi)])] <= t:
                        live -= cf_s[_u(perm_f[_u(fi)])]
                        fi += 1
                    live += ca_s[_u(perm_a[_u(r)])]
                    if live > best:
                        best = live
        out_peak[_u(q)] += best
        if out_peak[_u(q)] > cap[_u(q)]:
            oom = True
    return step, moved, nseg, nxfer, host, oom


@_njit(fastmath=False, nogil=True)
def _simulate_block(placements, r0, r1, mode, g_int, g_float, m_int, m_float, sizes,
                    out_step, out_busy, out_peak, out_moved, out_nseg, out_nxfer,
                    out_host, out_oom):
    """Simulate rows ``r0..r1-1`` of ``placements`` int32[B, M] into the outputs' rows
    (one thread; without the GIL, so that threads run blocks side by side)."""
    m = placements.shape[1]
    d = out_busy.shape[1]
    n_groups, n_params, n_tx, max_id = sizes
    # Scratch of this block (see _simulate_one for the names). sent[j * D + d]: the id
    # of the copy of op j's outputs on device d; a placement numbers its copies from
    # its own id0 up, above every earlier placement's, so nothing needs clearing.
    n_ev = m + n_tx  # live intervals, at most: activations and copies
    i32, i64, f64 = np.int32, np.int64, np.float64
    sent = np.zeros(m * d, i32)
    id0 = 1
    scratch = (
        np.empty(m, i32), np.empty(m, i64), np.empty(n_tx, i64),  # seg_of, last_op, x_cp
        sent,
        np.empty(n_tx, i64), np.empty(n_tx, i64),  # x_op, x_to
        np.empty(d, i64), np.empty(d, i64),  # ops_on, ncopy
        np.zeros(d, i64), np.empty(d, i64), np.empty(d, i64),  # ev_off, ev_n, ev_cap
        np.zeros(n_params * d, np.uint8),  # pflag
        np.empty(n_ev, i64), np.empty(n_ev, i64),  # perm_a, perm_f
        np.empty(n_ev + 1, i64), np.empty(n_ev, i64),  # the sort's cnt, bucket
        np.empty(n_ev, i32), np.empty(n_ev, i32), np.empty(n_ev, np.bool_))  # e_ab, e_fb,
    # cflag
    f_scratch = (
        np.empty(m, f64), np.empty(m, f64),  # seg_start, op_end
        np.empty(n_tx, f64), np.empty(n_tx, f64), np.empty(m, f64),  # x_arr, x_sz, lu
        np.empty(max(n_groups, 1), f64), np.empty(d * d, f64), np.empty(d, f64),
        # group_free, link_free, bound; then e_at, e_ft, e_s, b_al, b_fr, ca_t, ca_s,
        # cf_t, cf_s; cbuf, scl
        np.empty(n_ev, f64), np.empty(n_ev, f64), np.empty(n_ev, f64), np.empty(n_ev, f64),
        np.empty(n_ev, f64), np.empty(n_ev, f64), np.empty(n_ev, f64), np.empty(n_ev, f64),
        np.empty(n_ev, f64), np.empty(m, f64), np.empty(d, f64))
    for r in range(r0, r1):
        # A device index out of range would read outside the tables: such a row is
        # skipped and marked (-1 segments) for the caller to raise on.
        row = placements[_u(r)]
        lo = row[0]
        hi = row[0]
        for i in range(m):
            lo = min(lo, row[_u(i)])
            hi = max(hi, row[_u(i)])
        if lo < 0 or hi >= d:
            out_nseg[_u(r)] = -1
            continue
        if id0 > max_id - n_tx:  # ids stay int32: start again from a clear table
            sent[:] = 0
            id0 = 1
        res = _simulate_one(row, id0, mode, g_int, g_float, m_int, m_float,
                            scratch, f_scratch, out_busy[_u(r)], out_peak[_u(r)])
        id0 += res[3]
        out_step[_u(r)] = res[0]
        out_moved[_u(r)] = res[1]
        out_nseg[_u(r)] = res[2]
        out_nxfer[_u(r)] = res[3]
        out_host[_u(r)] = res[4]
        out_oom[_u(r)] = res[5]


# ----------------------------------------------------------------------- the class
def _default_max_batch(m: int) -> int:
    return max(64, 1 << max(0, (_MAX_CELLS // max(1, m)).bit_length() - 1))


class NativeSimulator:
    """``f(placements int[B, M]) -> BatchResult`` by a compiled loop (numba); the
    interface and results of ``BatchedSimulator`` (see the module docstring).

    Attributes:
      num_ops, num_devices: M and D.
      memory: True (exact peaks), False (no peaks: NaN, never OOM) or "oom" (exact OOM
        flags; peaks only for placements whose memory bound exceeds a capacity).
      max_batch: placements per kernel call; a larger batch runs in chunks of this
        size, with the same results.
      threads: the most threads a call runs blocks of placements on (the caller's
        included), or None: numba's thread count (``NUMBA_NUM_THREADS``, by default
        the cores this process may use), read at each call. Results do not depend on
        it. A bad value raises ``SimplaceError``.
    """

    def __init__(self, graph, inputs: SimInputs, *, memory: bool | str = True,
                 max_batch: int | None = None, threads: int | None = None):
        check_simulator_options(memory, max_batch)
        self.threads = _check_threads(threads)
        self.num_ops = m = graph.num_ops
        self.num_devices = inputs.num_devices
        self.memory = memory if memory == "oom" else bool(memory)
        self.max_batch = int(max_batch) if max_batch else _default_max_batch(m)
        self._inputs = inputs
        self._mode = {False: 0, True: 1, "oom": 2}[self.memory]
        self._g_int, self._g_float, self._sizes = _graph_arrays(graph, inputs)
        f64 = np.float64
        self._m_int = (np.int64(inputs.num_groups),)
        # Per link (from, to): put, latency, bandwidth, and 1 where the host waits for the
        # copy (put_waits), side by side.
        link = np.stack([inputs.put_s, inputs.latency_s, inputs.bandwidth_bytes_per_s,
                         put_waits_of(inputs).astype(f64)], axis=2)
        # Per device: launch, pool min work, pool launch, side by side.
        launch = np.stack([inputs.launch_s, inputs.pool_min_work, inputs.pool_launch_s],
                          axis=1)
        self._m_float = (_own(launch, f64), _own(inputs.dispatch_s, f64),
                         _own(link, f64), _own(inputs.memory_bytes, f64))

    def __call__(self, placements) -> BatchResult:
        p = placements
        if not (isinstance(p, np.ndarray) and p.dtype == np.int32 and p.ndim == 2
                and p.shape[1] == self.num_ops):
            p = check_placements(p, self.num_ops, self.num_devices)
        # (int32[B, M] as given: the kernel checks the device indices, a tenth of the
        # cost of checking them with numpy first, and a bad one raises below.)
        b, d = p.shape[0], self.num_devices
        if b == 0 or self.num_ops == 0:
            # Nothing runs: memory holds no parameters either (no op reads them).
            return BatchResult(np.zeros(b), np.zeros((b, d)), np.zeros(b, dtype=bool),
                               np.zeros((b, d)), np.zeros(b), np.zeros(b, np.int32),
                               np.zeros(b, np.int32), np.zeros(b))
        out = BatchResult(np.empty(b), np.empty((b, d)), np.empty(b, dtype=bool),
                          np.empty((b, d)), np.empty(b), np.empty(b, np.int32),
                          np.empty(b, np.int32), np.empty(b))
        for c0 in range(0, b, self.max_batch):
            c1 = min(b, c0 + self.max_batch)
            chunk = np.ascontiguousarray(p[c0:c1], dtype=np.int32)
            outs = tuple(x[c0:c1] for x in (
                out.step_time_s, out.busy_s, out.peak_memory_bytes, out.bytes_moved,
                out.num_segments, out.num_transfers, out.host_s, out.oom))

            def block(r0, r1, chunk=chunk, outs=outs):
                _simulate_block(chunk, r0, r1, self._mode, self._g_int, self._g_float,
                                self._m_int, self._m_float, self._sizes, *outs)

            _run_blocks(block, c1 - c0, self.threads or _threads())
        if np.any(out.num_segments < 0):
            check_placements(p, self.num_ops, self.num_devices)  # raises PlacementError
            raise AssertionError("a placement was rejected but passes check_placements")
        return out


# Threads of our own rather than numba's ``parallel=True``, which doubled the compile time
# (and whose OpenMP threads spun on a loaded machine).
def _threads() -> int:
    """Threads to run blocks of placements on: numba's thread count (the cores this
    process may use, or NUMBA_NUM_THREADS)."""
    return max(1, int(numba.config.NUMBA_NUM_THREADS))


def _check_threads(threads) -> int | None:
    """``threads`` as a positive int (None stays None); else a SimplaceError."""
    if threads is None:
        return None
    try:
        n = operator.index(threads)
    except TypeError:
        n = None
    if n is None or isinstance(threads, bool) or n < 1:
        raise SimplaceError(
            f"threads must be a positive whole number of threads, or None for numba's "
            f"thread count ({_threads()} here), got {threads!r}")
    return int(n)


def _run_blocks(block, n: int, threads: int) -> None:
    """``block(r0, r1)`` over rows 0..n-1 in blocks, on at most ``threads`` threads: the
    caller's, and pool workers that take the next block as they finish one."""
    threads = min(threads, n // _MIN_BLOCK)
    if threads <= 1:
        block(0, n)
        return
    # Blocks smaller than a thread's share even out uneven placements and threads that
    # the machine's other work holds up; taken from a queue rather than dealt out, so
    # that a thread held up takes fewer. The caller works too: it would only wait.
    k = min(n // _MIN_BLOCK, 4 * threads)
    rows = iter([(i * n // k, (i + 1) * n // k) for i in range(k)])
    lock = threading.Lock()

    def work():
        while True:
            with lock:
                r = next(rows, None)
            if r is None:
                return
            block(*r)

    # (A pool shared with other callers may have more workers than ``threads``: only
    # threads - 1 of them are handed work.)
    helpers = [_pool(threads - 1).submit(work) for _ in range(threads - 1)]
    try:
        work()
    finally:
        for h in helpers:  # one not started yet (a busy shared pool) has nothing left
            if not h.cancel():
                h.result()


_POOL: list = [None]
_POOL_LOCK = threading.Lock()
# A forked child has none of the parent's worker threads: it starts its own pool.
os.register_at_fork(after_in_child=lambda: _POOL.__setitem__(0, None))


def _pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """A process-wide pool of worker threads, grown when more are asked for."""
    with _POOL_LOCK:
        pool = _POOL[0]
        if pool is None or pool._max_workers < threads:
            if pool is not None:
                pool.shutdown(wait=False)
            pool = _POOL[0] = concurrent.futures.ThreadPoolExecutor(
                threads, thread_name_prefix="simplace-native")
        return pool


def _own(x, dtype) -> np.ndarray:
    """A writable, contiguous, flat copy: numba compiles read-only and writable arrays
    apart, so every argument is one kind (one compile for every graph)."""
    return np.array(x, dtype=dtype, copy=True).reshape(-1)


def _graph_arrays(graph, inp: SimInputs):
    """The kernel's per-graph arrays: ``(ints, floats, sizes)`` tuples (numpy)."""
    m, d = graph.num_ops, inp.num_devices
    i64, f64 = np.int64, np.float64
    src = np.asarray(graph.src, i64)
    dst = np.asarray(graph.dst, i64)
    eo = np.asarray(graph.edge_output, i64)
    eb = np.asarray(graph.edge_bytes, f64)
    in_ptr, in_order = (np.asarray(a, i64) for a in graph.in_edges)
    # Distinct tensors (producer, output index), sorted; a tensor's size is the largest
    # edge_bytes among the edges carrying it (as in the reference).
    if len(src):
        keys, inv = np.unique(np.stack([src, eo], axis=1), axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        t_bytes = np.full(len(keys), -np.inf)
        np.maximum.at(t_bytes, inv, eb)
        t_op = keys[:, 0]
        # The distinct consumers of each tensor (CSR).
        pairs = np.unique(np.stack([inv, dst], axis=1), axis=0)
        tc_ptr = np.searchsorted(pairs[:, 0], np.arange(len(keys) + 1)).astype(i64)
        t_cons = pairs[:, 1].astype(i64)
    else:
        t_bytes, t_op = np.zeros(0), np.zeros(0, i64)
        tc_ptr, t_cons = np.zeros(1, i64), np.zeros(0, i64)
    t_ptr = np.searchsorted(t_op, np.arange(m + 1)).astype(i64)
    single = np.zeros(m)
    one = np.flatnonzero(np.diff(t_ptr) == 1)
    single[one] = t_bytes[t_ptr[one]]
    single[np.diff(t_ptr) > 1] = -1.0  # several tensors: summed per put
    n_tx = min(len(src), m * (d - 1))  # copies, at most: one per (producer, device)
    g_int = tuple(_own(x, i64) for x in (
        in_ptr, src[in_order], t_ptr, tc_ptr, t_cons, inp.exclusive_group, graph.param_op,
        graph.param_index)) + (_own(graph.is_output, np.uint8),)
    # Per op and device: fused time, pool work, unfused extra, side by side.
    opc = np.stack([inp.op_time_s, inp.op_pool_work, inp.op_unfused_s], axis=2)
    g_float = tuple(_own(x, f64) for x in (opc, single, t_bytes, graph.out_bytes,
                                           graph.param_sizes))
    # (max_id: the largest copy id; the table of ids is int32)
    sizes = (i64(inp.num_groups), i64(len(graph.param_sizes)), i64(n_tx), i64(2**31 - 1))
    return g_int, g_float, sizes

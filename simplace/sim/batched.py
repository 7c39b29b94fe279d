"""The batched simulator: the reference semantics in JAX, for many placements at once.

``batched_simulator(graph, cost_model)`` precomputes the graph's index arrays (numpy)
and returns a function ``f(placements int[B, M]) -> BatchResult`` that runs one
``jax.lax.scan`` over the ops in graph order, vectorised over the batch, with the
reference's semantics (``simplace.sim.reference``): segments (maximal runs of ops on
one device, one fused computation each: launch, the pool's launch when its ops' pool work
reaches the device's minimum, the ops' costs and
the unfused costs of ops with no input from the segment), one serial host thread
(``put_s`` per transfer call, ``dispatch_s`` per segment call), lazy transfers issued
by the first consumer segment on each device, FIFO links, exclusive groups.
The scan is exact for the reason the reference's single pass is: segments, host calls
and each link's transfers all happen in graph order.

Before the scan, vectorised over ``[.., B]``, from the placements alone:
  - where segments open and close, and how far each op's segment runs back (at most
    ``W`` = 8 ops) and on (8 or more ops, 16 or more);
  - "pairs" (a consumer op and one of its distinct producers, in ``graph.in_edges``
    order) and which of them send a transfer: those that cross devices and whose
    consumer is the producer's first consumer on that device (an exclusive running OR
    of device bits over each producer's consumers, one rank of consumers at a time).
    A read of a copy already sent never delays its segment: the segment that sent
    the copy waited for it, and later segments of the device start after that one
    ends. So the scan only looks at the reads that send;
  - the link class of each transfer: the distinct ``(latency, bandwidth, put)`` of the
    machine's links (one or two on the datasheet machines), so that a transfer's
    constants are a short chain of selects (machines with many classes pick each
    constant from a per-device column instead).

The scan runs over "slices": an op's pairs, at most ``K`` (2) per step; an op with
more takes several steps (the first opens its segment, the last adds its cost and may
close it). The carry holds, per placement (the batch is the minor axis): the host
clock, the open segment's start bound (its group's free time when it opened, then the
latest arrival of its transfers), its work so far and op-launch maximum, its first op
(an input from it or later is fused), the bytes moved; ``free[G]`` (each exclusive
group's last segment end), ``busy[D]``,
``link[to, from]`` (when each link is free); and ``etab``, segment ends by op. A
transfer starts no earlier than the end of its producer's segment, known only at that
segment's last op: there the scan writes the end into the rows of the segment's last
``W`` ops (one contiguous ``[W, B]`` block), and a transfer reads row ``j`` of its
producer ``j``, or row ``j + W`` when ``j``'s segment runs on 8 ops or more (op
``j + W`` is then in it). A producer whose segment runs on 16 ops or more (for some
placement of the batch; never in practice for random placements, often for blocky
ones) makes its step read ``etab[last_of[j]]`` by per-placement gathers, inside a
``lax.cond``: XLA:CPU's gathers are dear, so only such steps pay for them.

What makes the step fast on XLA:CPU (found with the profiler):
  - XLA:CPU has no multi-output fusion: an elementwise value read by several fusions
    is recomputed in each (a [D, B] consumer recomputes it D times). Values read
    several times are made buffers with ``_barrier`` (a reduction over a stacked
    runtime -inf, which XLA cannot simplify away). Everything a step carries on (host
    clock, start bound, work, bytes, link occupancies, arrivals) comes out of one
    variadic reduction (``_barrier_many``), so their shared chain of selects and maxima
    is evaluated once, and stays separate buffers (a stack would copy them);
  - fusions that read a big array at a dynamic index are not vectorised: each step
    reads its rows of the per-op and per-pair tables once, into small buffers;
  - per-device selections are chains of selects (``_pick``), never one-hot reductions
    or gathers;
  - the tables are updated in place: the previous slice's end comes through the carry
    and is written at the start of the next step (``finish``), and the link column is
    written back after this step's reads of ``link``;
  - the segment-end table (float64[M + 2W - 1, B], 32 MB for ResNet-50 at B = 1024) is
    kept between calls (the latest batch bucket's) and donated to each call: allocating
    and clearing it cost more than the scan spends on it. A row is only read after the
    call wrote it, so it needs no clearing;
  - reductions over the op axis are scans: XLA:CPU's reductions over a leading axis are
    tens of times slower.

Peak memory (``memory=True``) is exact: the scan also emits each slice's segment start
and end candidates and each transfer's arrival; after the scan a reverse scan gives
each op its segment's start and end. The live intervals (each op's activation, and one
received copy per pair that sends) are built batch-minor with static indices only: the
free times are running maxima along each producer's chain of pairs, the resident
parameters a running OR along each parameter's chain of uses (``_chain``). Each event
gets one uint64 sort key holding its device, its time (the bit pattern, less the
batch's smallest) and free-before-allocation (``_event_keys``), so one numpy
argsort per placement orders events by device and time; ``_sweep_peaks`` sums the
sizes in that order, in blocks of placements on a thread per core. ``memory="oom"``
gets the exact OOM flag at nearly the cost of ``memory=False``: every byte a device
ever holds is a bound of its peak; only placements whose bound exceeds a capacity are
re-run exactly; the others report NaN peaks.

Precision: times are float64 and computed in the reference's operation order (a
segment's work summed op by op from its launch, ``start + work``, ``(t0 + latency) +
bytes / bandwidth``): ties between a segment's end and another's start are common.
Only with a pool launch is that added after the ops' costs, not
before (a difference in the last bits). float64 is switched on only inside this
module's calls, with the ``jax.enable_x64`` context manager around tracing, compiling
and running; global JAX config is never changed.

Compilation: the jitted function is cached per simulator (graph x machine) and per
batch size. Batch sizes are padded up to a bucket (the next power of two up to 256,
then the next multiple of 256) with copies of the first placement, so a new B costs a
compile only when it reaches a new bucket. A batch larger than ``max_batch`` (by
default the largest power of two with at most 1M ops x placements, and at least 64)
runs in chunks of that size: memory stays bounded on big graphs (nmt_4layer, 22k ops:
64 placements per run), and each step's working set in cache (ResNet-50: 256).
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from simplace.sim.inputs import (
    SimInputs,
    check_placements,
    check_simulator_options,
    put_waits_of,
    sim_inputs,
)
from simplace.sim.results import BatchResult

# Rows of the segment-end table a segment's last op fills (see the module docstring;
# the doubling in _impl assumes 8).
_WINDOW = 8
# Pairs (distinct producers) per scan step, at most.
_WIDTH = 2
# Machines with more link classes pick transfer constants from per-device columns.
_MAX_CLASSES = 4
# Ops x placements per run, at most (larger batches run in chunks of a power of two,
# at least 64): ResNet-50 (3,889 ops) runs 256 placements at once, a 22k-op graph 64.
# Besides bounding memory, smaller runs are faster per placement on CPU (measured on
# ResNet-50, 2 cores: 256 at once 1.3x faster than 1,024, 512 in between): each
# step's working set (link table, group and busy times, the segment-end table's
# rows) stays in cache.
_MAX_CELLS = 1 << 20
# Ranks of a chain run one block at a time, later ones by doubling (see _chain).
_MAX_RANK_BLOCKS = 8


def _default_max_batch(m: int) -> int:
    """The largest power of two of placements with at most _MAX_CELLS ops x placements
    (at least 64)."""
    return max(64, 1 << max(0, (_MAX_CELLS // max(1, m)).bit_length() - 1))


def batch_bucket(b: int) -> int:
    """The padded batch size a batch of ``b`` placements is run at."""
    if b <= 256:
        return 1 << max(0, int(b) - 1).bit_length()
    return -(-int(b) // 256) * 256


class BatchedSimulator:
    """``f(placements int[B, M]) -> BatchResult``; see ``batched_simulator``.

    Attributes:
      num_ops, num_devices: M and D.
      num_traces: how many times the scan was traced (one per batch bucket used).
      max_batch: placements simulated at once; a larger batch runs in chunks of this
        size (the last one padded), which bounds memory on big graphs.
    """

    def __init__(self, graph, inputs: SimInputs, *, memory: bool | str = True,
                 max_batch: int | None = None):
        check_simulator_options(memory, max_batch)
        self.num_ops = graph.num_ops
        # Larger batches run in chunks, so that the per-op tables (a few bytes per op
        # and placement each) stay within a few hundred MB on big graphs.
        self.max_batch = int(max_batch) if max_batch else _default_max_batch(graph.num_ops)
        self.num_devices = inputs.num_devices
        self.memory = memory if memory == "oom" else bool(memory)
        self.num_traces = 0
        self._graph = graph
        self._inputs = inputs
        self._exact = None  # the memory=True simulator that "oom" mode defers to
        if self.num_devices > 64:  # the send masks are one unsigned integer per op
            raise ValueError(f"the batched simulator supports up to 64 devices, got "
                             f"{self.num_devices}")
        self._static, consts = _precompute(graph, inputs)
        with jax.enable_x64(True):
            self._consts = jax.device_put(consts)
        self._p_dtype = np.int8 if self.num_devices <= 127 else np.int32
        # The segment-end table, kept between calls (for the latest batch bucket) and
        # donated to each call.
        self._jit = jax.jit(lambda c, p, e: self._impl(c, p, extras=True, etab0=e),
                            donate_argnums=(2,))
        self._etab: dict[int, jax.Array] = {}

    def __call__(self, placements) -> BatchResult:
        p = check_placements(placements, self.num_ops, self.num_devices)
        b = p.shape[0]
        d = self.num_devices
        if b == 0 or self.num_ops == 0:
            # Nothing runs: memory holds no parameters either (no op reads them).
            return BatchResult(np.zeros(b), np.zeros((b, d)), np.zeros(b, dtype=bool),
                               np.zeros((b, d)), np.zeros(b), np.zeros(b, np.int32),
                               np.zeros(b, np.int32), np.zeros(b))
        chunk = self.max_batch
        if b <= chunk:
            return self._run(p)
        # Chunks of max_batch placements (the last one padded: one compile for all).
        pad = -b % chunk
        if pad:
            p = np.concatenate([p, np.repeat(p[:1], pad, axis=0)])
        parts = [self._run(p[i:i + chunk]) for i in range(0, b + pad, chunk)]
        return BatchResult(*(np.concatenate([getattr(r, f) for r in parts])[:b]
                             for f in BatchResult._fields))

    def _run(self, p: np.ndarray) -> BatchResult:
        """``__call__`` for a checked, non-empty batch of at most ``max_batch``."""
        b = p.shape[0]
        d = self.num_devices
        bucket = batch_bucket(b)
        if bucket > b:
            p = np.concatenate([p, np.repeat(p[:1], bucket - b, axis=0)])
        with jax.enable_x64(True):
            etab = self._etab.pop(bucket, None)
            if etab is None:
                etab = jnp.zeros((self._static["E"], bucket), jnp.float64)
            # Device indices travel as int8 when they fit: 4x less to copy and transpose.
            out = self._jit(self._consts, jnp.asarray(p, dtype=self._p_dtype), etab)
            self._etab = {bucket: out[-1]}  # the latest bucket's only: it can be big
            step_time, busy, moved, events, n_seg, n_xfer, host = jax.device_get(out[:-1])
        cap = self._inputs.memory_bytes
        if self.memory is False:
            peak = np.full((b, d), np.nan)
            oom = np.zeros(b, dtype=bool)
        elif self.memory == "oom":
            # events is an upper bound of each device's peak; only placements where it
            # exceeds a capacity can be OOM: simulate those exactly, report NaN peaks for
            # the others. (The bound is a sum of whole byte counts; the margin covers
            # rounding in sums of non-integral sizes.)
            bound = np.asarray(events)[:b]
            peak = np.full((b, d), np.nan)
            oom = np.zeros(b, dtype=bool)
            suspect = np.flatnonzero(np.any(bound * (1 + 1e-9) > cap[None, :], axis=1))
            if len(suspect):
                if self._exact is None:
                    self._exact = BatchedSimulator(self._graph, self._inputs, memory=True,
                                                   max_batch=self.max_batch)
                exact = self._exact(p[suspect])
                peak[suspect] = exact.peak_memory_bytes
                oom[suspect] = exact.oom
        else:
            params = np.asarray(events[0])[:b]
            key_free, key_alloc, dev, size = (np.asarray(x)[:, :b] for x in events[1:])
            peak = params + _sweep_peaks(key_free, key_alloc, dev, size, d)
            oom = np.any(peak > cap[None, :], axis=1)
        return BatchResult(*(np.asarray(x)[:b] for x in (step_time, peak, oom, busy, moved,
                                                         n_seg, n_xfer, host)))

    def traceable(self):
        """``(fn, consts)``: the pure function behind ``__call__``, for a caller's own jit.

        ``fn(consts, placements int32[B, M])`` (B > 0, M > 0, traced and run under
        ``jax.enable_x64(True)``) returns ``(step_time_s[B], busy_s[B, D], bytes_moved[B],
        memory)``, where ``memory`` is None (``memory=False``), the peak bound
        float64[B, D] (``"oom"``) or ``(params float64[B, D], key_free, key_alloc, dev,
        size)`` (``True``; the last four [N, B], batch-minor), where ``params +
        _sweep_peaks(key_free, key_alloc, dev, size, D)`` are the peaks.
        No batch padding or chunking, no host-side memory check."""
        return self._impl, self._consts

    # ------------------------------------------------------------------ traced code
    def _impl(self, c, placements, extras=False, etab0=None):
        self.num_traces += 1  # Python side effect: runs once per trace, not per call
        st = self._static
        m, d, g, k_w, w = st["M"], st["D"], st["G"], st["K"], st["W"]
        n_cls, table = st["NC"], st["TABLE"]
        b = placements.shape[0]
        f64 = jnp.float64
        it = _info_dtype(st)  # the packed rows' type
        sh, cb = it(st["SH"]), it(st["CB"])
        low = it((1 << st["SH"]) - 1)
        dev_ids = jnp.arange(d, dtype=it)
        lo_f = c["lowest"]  # -inf and the int type's lowest value, arguments: see _barrier
        lo_i = c["lowest_i"].astype(it)
        memory = self.memory

        # ---- placement-only facts, vectorised over [M, B]
        # Transposed once: a conditional's operand is a buffer (otherwise XLA fuses the
        # transpose, strided reads, into every consumer).
        p = placements.astype(jnp.int8 if d <= 127 else jnp.int32).T
        p = jax.lax.cond(lo_f < 0, lambda: p, lambda: -p)

        def down(a, s_):
            """a[i - s_] (False for i < s_)."""
            if s_ >= m:
                return jnp.zeros(a.shape, a.dtype)
            return jnp.concatenate([jnp.zeros((s_, b), a.dtype), a[:-s_]])

        def up(a, s_):
            """a[i + s_] (False past the end)."""
            if s_ >= m:
                return jnp.zeros(a.shape, a.dtype)
            return jnp.concatenate([a[s_:], jnp.zeros((s_, b), a.dtype)])

        same = jnp.concatenate([jnp.zeros((1, b), bool), p[1:] == p[:-1]])  # p[i-1] == p[i]
        new = ~same  # op i opens a segment
        last = jnp.concatenate([new[1:], jnp.ones((1, b), bool)])  # op i closes it
        # By doubling: a2[i]: ops i-2..i are in one segment, a4[i]: ops i-4..i, a8[i]:
        # ops i-8..i. run[i]: how many ops of its segment end at op i, at most W = 8.
        # far1[j]: op j's segment goes on W ops or more past it (its end is not in row
        # j of etab, but in row j + W), far2[j]: 2W ops or more (in neither).
        a2 = same & down(same, 1)
        a4 = a2 & down(a2, 2)
        a8 = a4 & down(a4, 4)
        a6 = a4 & down(a2, 4)
        run = (1 + same.astype(it) + a2.astype(it) + (a2 & down(same, 2)).astype(it)
               + a4.astype(it) + (a4 & down(same, 4)).astype(it) + a6.astype(it)
               + (a6 & down(same, 6)).astype(it))
        far1 = up(a8, w)
        far2 = far1 & up(far1, w)
        # Per op: device | flags << SH (flags: 1 opens a segment, 2 closes it, 4 * run).
        po = p.astype(it) | ((new.astype(it) + last.astype(it) * it(2) + run * it(4)) << sh)
        send, code, pj, ubits = _pairs(c, st, p, ubits=memory == "oom")
        fo = _rows(jnp.concatenate([far1.astype(jnp.int8) + 2 * far2.astype(jnp.int8),
                                    jnp.zeros((1, b), jnp.int8)]), c["pair_src_pad"])
        # Per pair: the producer's device | the transfer's link class << SH (0: none) |
        # far1 << CB.
        pc = (pj.astype(it) | (code.astype(it) << sh)
              | ((fo & jnp.int8(1)).astype(it) << cb))
        multi_bytes = _multi_bytes(c, p, d, st["Q"] + 1)  # [Q + 1, D, B]; row Q: zeros
        # Slices with a transfer from a segment going on 2W ops or more, for some
        # placement: they gather the segment's end at last_of (computed only then).
        far = jnp.any(send & (fo > 1), axis=1)  # [P + 1]
        x_far = jnp.any(_rows(far, c["slice_pair"]), axis=1)  # [S]
        last_of = jax.lax.cond(jnp.any(x_far), lambda: _last_of(last),
                               lambda: jnp.zeros((m, b), jnp.int32))

        launch = [float(v) for v in st["launch"]]
        dispatch = [float(v) for v in st["dispatch"]]
        has_pool, has_uf = st["has_pool"], st["has_op_unfused"]
        pool_min = [float(v) for v in st["pool_min"]]
        pool_launch = [float(v) for v in st["pool_launch"]]
        # Rows of the carried values past h, R, work, moved: only those the machine needs.
        iv = {n: 4 + k for k, n in enumerate((["pwork"] if has_pool else [])
                                             + (["seg_a", "fus"] if has_uf else []))}
        flat_ids = jnp.arange(b, dtype=jnp.int32 if st["E"] * b < 2**31 else jnp.int64)
        rows_w = jnp.asarray(w - 1 - np.arange(w), it)[:, None]  # [W, 1]

        def row(a, i):
            return jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False)

        def seg_times(vals, ons):
            """The segment's start and end (valid when it closes) from the carry."""
            start = jnp.maximum(vals[1], vals[0])
            work = vals[2]
            if has_pool:  # the pool's launch, when the segment's pool work reaches the min
                pool = jnp.where(vals[iv["pwork"]] >= _pick(ons, pool_min),
                                 _pick(ons, pool_launch), 0.0)
                work = (_pick(ons, launch) + pool) + work
            return start, start + work

        def finish(state, vals, info_p, blk_p):
            """Close the previous slice: if its segment closed, write its end (group free
            time, busy time, etab block). Its values come through the carry, so that
            XLA updates the tables in place instead of fusing this step's dynamic reads
            into their updates."""
            etab, free, busy = state
            dev_p = info_p[0] & low
            flags_p = info_p[0] >> sh
            last_p = (flags_p & it(2)) > 0
            on = dev_ids[:, None] == dev_p[None, :]  # [D, B]
            start_p, end_p = seg_times(vals, [dev_p == k for k in range(d)])
            closing = on & last_p[None, :]
            if st["G_ID"]:
                free = jnp.where(closing, end_p[None, :], free)
            else:
                g_p = _pick([dev_p == k for k in range(d)],
                            [jnp.int32(v) for v in st["group"]])
                g_ids = jnp.arange(g, dtype=jnp.int32)[:, None]
                free = jnp.where((g_ids == g_p[None, :]) & last_p[None, :], end_p[None, :],
                                 free)
            busy = busy + jnp.where(closing, (end_p - start_p)[None, :], 0.0)
            # Rows of the segment's last W ops (run of them are in the segment).
            old = jax.lax.dynamic_slice_in_dim(etab, blk_p, w, 0)
            fill = last_p[None, :] & ((flags_p >> it(2))[None, :] > rows_w)
            etab = jax.lax.dynamic_update_slice_in_dim(
                etab, jnp.where(fill, end_p[None, :], old), blk_p, 0)
            return etab, free, busy

        def step(carry, x):
            state, link, vals, info_p = carry
            # This slice's constants, read once: ints (op, flag mask, previous slice's
            # op, far, then per pair: pair, etab row of its producer, producer,
            # multi-tensor row) and floats (op times, op pool work and unfused costs
            # on each device, then per pair: its bytes and, per link class, transfer
            # time).
            xi, xf = _barrier(x[0], c["lowest_i"]), _barrier(x[1], lo_f)
            op, smask, blk_p, far_i = xi[0], xi[1].astype(it), xi[2], x[0][3] > 0
            first_slice = (xi[1] & 1) > 0
            pq = xi[4:]
            pq_valid = [pq[k] < st["NP"] for k in range(k_w)]
            h, big_r, big_c, moved = vals[0], vals[1], vals[2], vals[3]
            pwork = vals[iv["pwork"]] if has_pool else None
            seg_a = vals[iv["seg_a"]] if has_uf else None
            fus = vals[iv["fus"]] if has_uf else None
            etab, free, _ = state = finish(state, vals, info_p, blk_p)
            # This slice's rows of the per-op and per-pair tables, read once (flags
            # masked to the slice: only an op's first slice opens, only its last closes).
            info = _barrier(jnp.stack(
                [row(po, op) & ((smask << sh) | low)] + [row(pc, pq[k]) for k in range(k_w)]),
                lo_i)
            dev = info[0] & low
            flags = info[0] >> sh
            is_new = (flags & it(1)) > 0
            is_last = (flags & it(2)) > 0
            ons = [dev == k for k in range(d)]
            if st["G_ID"]:
                gfree = _pick(ons, [free[k] for k in range(d)])
            else:
                g_i = _pick(ons, [jnp.int32(v) for v in st["group"]])
                gfree = _pick([g_i == k for k in range(g)], [free[k] for k in range(g)])
            big_r = jnp.where(is_new, gfree, big_r)
            # The segment's work in the reference's order: launch (plus the pool's launch,
            # added at the end when there can be one), then each op's cost and,
            # when none of its inputs comes from the segment, its unfused cost.
            big_c = jnp.where(is_new, 0.0 if has_pool else _pick(ons, launch), big_c)
            big_c = big_c + _pick(ons, [xf[k] for k in range(d)])
            if has_pool:  # the segment's pool work so far, added in op order
                pwork = jnp.where(is_new, 0.0, pwork) + _pick(ons, [xf[d + k]
                                                                  for k in range(d)])
            if has_uf:
                seg_a = jnp.where(is_new, op.astype(f64), seg_a)
                fus = jnp.where(first_slice, False, fus > 0)
                for k in range(k_w):  # an input from the segment itself: the op fuses
                    fus = fus | ((pq[2 * k_w + k].astype(f64) >= seg_a) & pq_valid[k])
                big_c = big_c + jnp.where(fus, 0.0, _pick(ons, [xf[2 * d + k]
                                                                for k in range(d)]))
                fus = fus.astype(f64)
            # The link column into each placement's device: lcol[from, B].
            lcol = _barrier(_pick(ons, [link[t] for t in range(d)]), lo_f)
            if table:
                # Per-device columns of the link constants: col[from] (to: the device).
                cols = {name: [_pick(ons, [float(st[name][f][t]) for t in range(d)])
                               for f in range(d)] for name in ("lat", "put", "bw", "wait")}

            def by_gather():
                flat = etab.reshape(-1)
                out = []
                for k in range(k_w):
                    lo = row(last_of, pq[k + 2 * k_w])
                    ix = (lo.astype(flat_ids.dtype) + (w - 1)) * b + flat_ids
                    out.append(flat.at[ix].get(mode="promise_in_bounds"))
                return jnp.stack(out)

            # The producers' segment ends: row j of etab, or row j + W when j's segment
            # goes on W ops or more past it; gathered at last_of if 2W or more (inside a
            # cond: XLA:CPU's gathers cost ~4 ns per element, measured on one core).
            erows = _barrier(jnp.stack([row(etab, pq[k_w + k] + s_ * w) for s_ in (0, 1)
                                        for k in range(k_w)]), lo_f)
            ends = jax.lax.cond(far_i, by_gather, lambda: jnp.stack(
                [jnp.where((info[1 + k] >> cb) > 0, erows[k_w + k], erows[k])
                 for k in range(k_w)]))
            arrivals, sends, froms, occs = [], [], [], []
            for k in range(k_w):
                ck = (info[1 + k] >> sh) & it((1 << (st["CB"] - st["SH"])) - 1)
                fk = info[1 + k] & low
                fms = [fk == f for f in range(d)]
                snd = ck != 0
                base = 3 * d + k * (n_cls + 2)
                nb = xf[base]
                if table:
                    h = h + jnp.where(snd, _pick(fms, cols["put"]), 0.0)
                    lat = _pick(fms, cols["lat"])
                    bw = _pick(fms, cols["bw"])
                    wt = _pick(fms, cols["wait"]) if st["has_wait"] else None
                    t_x = nb / bw
                else:
                    cms = [ck == q for q in range(1, n_cls + 1)]

                    def chain(vals_, cms=cms):
                        r = vals_[0]
                        for q in range(1, n_cls + 1):
                            r = jnp.where(cms[q - 1], vals_[q], r)
                        return r

                    h = h + chain([float(v) for v in st["put_c"]])  # 0 if no transfer
                    lat = chain([float(v) for v in st["lat_c"]])
                    bw = chain([float(v) for v in st["bw_c"]])
                    wt = chain([float(v) for v in st["wait_c"]]) if st["has_wait"] else None
                    t_x = chain([xf[base + 1 + q] for q in range(n_cls + 1)])
                if st["Q"]:
                    mk = pq[3 * k_w + k] < st["Q"]
                    nb = jnp.where(mk, _pick(ons, [multi_bytes[pq[3 * k_w + k], q]
                                                   for q in range(d)]), nb)
                    t_x = jnp.where(mk, nb / bw, t_x)
                moved = moved + jnp.where(snd, nb, 0.0)
                link_free = _pick(fms, [lcol[f] for f in range(d)])
                for k2 in range(k):  # an earlier transfer of this slice on the same link
                    link_free = jnp.where(sends[k2] & (froms[k2] == fk), occs[k2],
                                          link_free)
                t0 = jnp.maximum(jnp.maximum(h, ends[k]), link_free)
                arrive = (t0 + lat) + t_x
                if wt is not None:  # put_waits: the host waits for the copy to arrive
                    h = jnp.where(snd & (wt > 0), jnp.maximum(h, arrive), h)
                occs.append(t0 + t_x)  # the link is busy for the bytes; latency overlaps
                big_r = jnp.where(snd, jnp.maximum(big_r, arrive), big_r)
                arrivals.append(arrive)
                sends.append(snd)
                froms.append(fk)
            h = jnp.where(is_last, h + _pick(ons, dispatch), h)
            rows = [h, big_r, big_c, moved] + ([pwork] if has_pool else []) + (
                [seg_a, fus] if has_uf else [])
            # Everything the step carries on, computed in one kernel (see _barrier_many).
            many = _barrier_many(rows + occs + arrivals, lo_f)
            rows, occs = many[:len(rows)], many[len(rows):len(rows) + k_w]
            arrivals = many[len(rows) + k_w:]
            # Write the column back (after this step's reads of link: XLA updates link
            # in place).
            for k in range(k_w):
                lcol = jnp.where((dev_ids[:, None] == froms[k][None, :]) & sends[k][None, :],
                                 occs[k][None, :], lcol)
            lcol = _barrier(lcol, lo_f)  # read D times below
            link = jnp.where((dev_ids[:, None] == dev[None, :])[:, None, :], lcol[None], link)
            vals = tuple(rows)  # separate buffers: a stack would copy them
            out = None
            if memory is True:
                start, end = seg_times(vals, ons)
                out = (start, end, tuple(arrivals))
            return (state, link, vals, info), out

        etab0 = jnp.zeros((st["E"], b), f64) if etab0 is None else etab0
        state0 = (etab0, jnp.zeros((g, b), f64), jnp.zeros((d, b), f64))
        # link[to, from]: when the link is free; -inf before its first copy, so that the
        # makespan below counts a latency only for links that carried something.
        carry0 = (state0, jnp.full((d, d, b), -jnp.inf, f64),
                  tuple(jnp.zeros(b, f64) for _ in range(len(iv) + 4)),
                  jnp.zeros((1 + k_w, b), it))
        x_int = c["slice_int"]
        xs = (jnp.concatenate([x_int[:, :3], x_far[:, None].astype(x_int.dtype),
                               x_int[:, 3:]], axis=1), c["slice_float"])
        carry, ys = jax.lax.scan(step, carry0, xs)
        state, link, vals, info = carry
        etab, free, busy = finish(state, vals, info, c["blk_last"])
        h, moved = vals[0], vals[3]
        # Ends in a group and copies on a link are increasing: the last ones are the
        # largest, so the makespan is the largest group end, last copy's arrival (its
        # link's free time plus the link's latency) or host time.
        lat_to_from = jnp.asarray(np.asarray(self._inputs.latency_s).T)[:, :, None]
        step_time = jnp.maximum(jnp.maximum(jnp.max(free, axis=0),
                                            jnp.max(link + lat_to_from, axis=(0, 1))), h)
        busy = busy.T  # [B, D]
        if memory is True:
            start_s, end_s, arr_s = ys
            ls = c["op_last_slice"]
            seg_start, seg_end = _segment_values(_rows(start_s, ls), _rows(end_s, ls), last)
            arr = _rows(jnp.stack(arr_s, axis=1).reshape(-1, b), c["pair_pos"])  # [P, B]
            mem = self._memory_events(c, p, seg_start, seg_end, arr, send[:-1], multi_bytes,
                                      step_time)
        elif memory == "oom":
            mem = self._peak_bound(c, p, ubits, multi_bytes)
        else:
            mem = None
        if not extras:
            return step_time, busy, moved, mem
        counts = _column_sums([new, send[:-1]])
        return step_time, busy, moved, mem, counts[0], counts[1], h, etab

    def _peak_bound(self, c, p, ubits, multi_bytes):
        """An upper bound of each device's peak memory, float64[B, D]: every activation
        and received copy on the device held for the whole step, plus every parameter
        read there (counted once per reading op). Summed by scans over the ops and the
        parameter uses: XLA:CPU's reductions over the leading axis are far slower."""
        st = self._static
        d, b = st["D"], p.shape[1]
        dev = jnp.arange(d, dtype=p.dtype)[:, None]
        bits = (ubits.dtype.type(1) << jnp.arange(d, dtype=ubits.dtype))[:, None]

        def add_op(acc, x):
            row, sent_to, out_b, sent_b = x
            acc = acc + jnp.where(row[None, :] == dev, out_b, 0.0)
            return acc + jnp.where((sent_to[None, :] & bits) != 0, sent_b, 0.0), None

        held = jax.lax.scan(add_op, jnp.zeros((d, b)),
                            (p, ubits, c["out_bytes"], c["single_bytes"]))[0]
        if st["Q"]:
            held = held + jnp.sum(multi_bytes, axis=0)
        if st["P"]:
            def add_param(acc, x):
                op, size = x
                row = jax.lax.dynamic_index_in_dim(p, op, 0, keepdims=False)
                return acc + jnp.where(row[None, :] == dev, size, 0.0), None

            held = jax.lax.scan(add_param, held, (
                c["param_op"].astype(jnp.int32), c["param_sizes"][c["param_index"]]))[0]
        return held.T  # [B, D]

    def _memory_events(self, c, p, seg_start, seg_end, arr, send, multi_bytes, step_time):
        """The live intervals of a batch as sort keys for ``_sweep_peaks``.

        Batch-minor, with static indices only (per-placement scatters are slow on CPU).
        Intervals: each op's activation (``[M]``) and one received copy per pair that
        sends (``[P]``; pairs that do not send are empty). Per producer, maxima over its
        pairs are running maxima along its chain of pairs (``_chain``): the activation
        is freed at the latest of its segment's end, the ends of the segments on its
        device that read it and the arrivals of its copies; a copy on device k at the
        end of the last segment on k that reads it.

        Returns ``(params float64[B, D], key_free uint64[N, B], key_alloc uint64[N, B],
        dev int8[N, B], size float64[N, B])`` (batch-minor, like the scan: XLA:CPU's
        transposes fused into other work are very slow; ``_sweep_peaks`` transposes);
        see ``_event_keys`` for the keys."""
        st = self._static
        d, b = st["D"], p.shape[1]
        ninf = jnp.asarray(-jnp.inf, jnp.float64)
        ps, pd = c["pair_src"], c["pair_dst"]
        pj, pi = _rows(p, ps), _rows(p, pd)  # [P, B]
        end_i = _rows(seg_end, pd)
        offs = st["rank_offsets"]
        prev = c["pair_prev"]
        lastp = c["op_last_pair"]  # row P (a pad row of -inf) for ops without consumers

        def at_last(v):
            """Per op, the running maximum at its last pair ([M, B])."""
            v = _chain(v, prev, offs, jnp.maximum, c["pair_tail"], -jnp.inf)
            return _rows(jnp.concatenate([v, jnp.full((1, b), -jnp.inf)]), lastp)

        # A pair that crosses devices without sending reads a copy sent for an earlier
        # pair: that pair's arrival already counts.
        act_free = jnp.maximum(seg_end, at_last(jnp.where(pj == pi, end_i,
                                                          jnp.where(send, arr, ninf))))
        act_free = jnp.where(c["is_output"][:, None], step_time[None, :], act_free)
        # Copies: the last use on the receiving device, per device then picked.
        on_k = [pi == k for k in range(d)]
        last_use = [_rows(at_last(jnp.where(on_k[k], end_i, ninf)), ps) for k in range(d)]
        cp_free = _pick(on_k, last_use)
        cp_bytes = jnp.broadcast_to(c["single_bytes"][ps][:, None], pi.shape)
        if st["Q"]:
            mi = c["multi_index"][ps]
            cp_bytes = jnp.where(c["is_multi"][ps][:, None],
                                 _pick(on_k, [multi_bytes[mi, k] for k in range(d)]), cp_bytes)
        cp_bytes = jnp.where(send, cp_bytes, 0.0)
        i_dev = jnp.concatenate([p, pi])
        i_alloc = jnp.concatenate([seg_start, arr])
        i_free = jnp.concatenate([act_free, cp_free])
        i_size = jnp.concatenate([jnp.broadcast_to(c["out_bytes"][:, None], p.shape),
                                  cp_bytes])
        live = (i_free > i_alloc) & (i_size > 0)
        i_size = jnp.where(live, i_size, 0.0)
        i_alloc = jnp.where(live, i_alloc, 0.0)
        i_free = jnp.where(live, i_free, 0.0)
        # Parameters: resident on every device that runs an op reading them, once each.
        if st["P"]:
            dt = _bits_dtype(d)
            use_bits = dt(1) << _rows(p, c["use_op"]).astype(dt)  # [U, B]
            bits = _rows(_chain(use_bits, c["use_prev"], st["use_offsets"],
                                jnp.bitwise_or, c["use_tail"], 0),
                         c["param_last_use"])  # [n_params, B]
            sizes = c["param_sizes"][c["param_used"]]
            params = jnp.stack([jnp.dot(sizes, ((bits >> dt(k)) & dt(1)).astype(jnp.float64))
                                for k in range(d)], axis=1)  # [B, D]
        else:
            params = jnp.zeros((b, d))
        kf, ka = _event_keys(i_free, i_alloc, i_dev, d)
        return params, kf, ka, i_dev.astype(jnp.int8), i_size


def _pick(on, rows):
    """rows[dev] per placement, by a chain of selects (on[k]: dev == k)."""
    r = rows[0]
    for k in range(1, len(rows)):
        r = jnp.where(on[k], rows[k], r)
    return r


def _rows(a, idx):
    """a[idx] along the first axis, for indices known to be in bounds (XLA:CPU's
    gathers are several times faster when told so)."""
    return a.at[idx].get(mode="promise_in_bounds")


def _chain(vals, prev, offsets, combine, tail=None, identity=None):
    """Running ``combine`` (max or or: idempotent) along chains of rows ([N, B]): rows
    are grouped in blocks by rank (``offsets``), and row q of rank r > 0 follows row
    ``prev[q]`` of rank r - 1. The first _MAX_RANK_BLOCKS ranks run one block at a
    time; the rows of later ranks (consumers of the few producers with tens of them)
    by doubling over ``tail = (jumps, anchor)`` (see ``_tail``), so that the program
    stays small."""
    n_rank = len(offsets) - 1
    if n_rank <= 1:
        return vals
    head_ranks = min(n_rank, _MAX_RANK_BLOCKS)
    out = [vals[:offsets[1]]]
    for r in range(1, head_ranks):
        pr = prev[offsets[r]:offsets[r + 1]] - offsets[r - 1]
        out.append(combine(vals[offsets[r]:offsets[r + 1]], _rows(out[r - 1], pr)))
    head = jnp.concatenate(out) if len(out) > 1 else out[0]
    if head_ranks == n_rank:
        return head
    jumps, anchor = tail
    tv = vals[offsets[head_ranks]:]
    pad = jnp.full((1,) + vals.shape[1:], identity, vals.dtype)
    for l_ in range(jumps.shape[0]):
        tv = combine(tv, _rows(jnp.concatenate([tv, pad]), jumps[l_]))
    tv = combine(tv, _rows(head, anchor))
    return jnp.concatenate([head, tv])


def _tail(prev: np.ndarray, offsets: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """For ``_chain``: the rows of rank >= _MAX_RANK_BLOCKS (the tail, T rows), each
    one's 2**l-th predecessor within the tail (int32[L, T], T for none) and its
    ancestor of rank _MAX_RANK_BLOCKS - 1 (int32[T], a head row)."""
    n_rank = len(offsets) - 1
    r0 = _MAX_RANK_BLOCKS
    if n_rank <= r0:
        return np.zeros((0, 0), np.int32), np.zeros(0, np.int32)
    start = offsets[r0]
    rows = np.arange(start, len(prev))
    t = len(rows)
    step = np.where(rows >= offsets[r0 + 1], prev[rows] - start, t).astype(np.int64)
    jumps = []
    for _ in range(max(1, (n_rank - r0 - 1).bit_length())):
        jumps.append(step)
        step = np.concatenate([step, [t]])[step]
    anchor = rows.copy()
    while np.any(anchor >= start):
        anchor = np.where(anchor >= start, prev[anchor], anchor)
    return np.asarray(jumps, np.int32).reshape(len(jumps), t), anchor.astype(np.int32)


def _event_keys(free, alloc, dev, d: int):
    """uint64 sort keys [N, B] of the frees and allocations of intervals [N, B].

    A key orders events by device, then time, then frees before allocations (so that
    half-open intervals that touch never overlap): ``dev << (T + 1) | rank << 1 |
    is_alloc``, where ``rank`` is 0 for time 0 and otherwise the time's bit pattern
    (which orders non-negative floats) less the batch's smallest positive pattern,
    plus one; T = 63 - bits(D - 1). A batch whose times span too many binades for T
    bits (a ratio over 2**255 between its largest and smallest positive time for
    D <= 8) gets keys without the device instead: ``bits << 1 | is_alloc``
    (``_sweep_peaks`` then groups events by device itself)."""
    u64 = jnp.uint64
    db = max(1, (d - 1).bit_length())
    tb = 63 - db
    fb = jax.lax.bitcast_convert_type(free, u64)
    ab = jax.lax.bitcast_convert_type(alloc, u64)
    big = u64(np.iinfo(np.uint64).max)
    # One range for the whole batch: whole-array reductions (XLA:CPU's reductions over
    # the leading axis alone are slow).
    lo = jnp.minimum(jnp.min(jnp.where(fb > 0, fb, big).reshape(-1)),
                     jnp.min(jnp.where(ab > 0, ab, big).reshape(-1)))
    hi = jnp.maximum(jnp.max(fb.reshape(-1)), jnp.max(ab.reshape(-1)))
    ok = (hi < lo) | (hi - lo < u64((1 << tb) - 1))  # (hi < lo: no positive time)
    top = dev.astype(u64) << u64(tb + 1)

    def key(bits_, flag):
        packed = top | (jnp.where(bits_ > 0, bits_ - lo + u64(1), u64(0)) << u64(1))
        return jnp.where(ok, packed, bits_ << u64(1)) | u64(flag)

    return key(fb, 0), key(ab, 1)


def _barrier(x, lowest):
    """x, computed once: a max with the lowest value (a runtime argument, so XLA cannot
    simplify it away) over a new leading axis is a reduction, whose result is a buffer
    that consumer fusions read instead of recomputing x (XLA:CPU has no multi-output
    fusion, and duplicates shared elementwise producers into every consumer)."""
    lowest = jnp.asarray(lowest, x.dtype)
    both = jnp.stack([x, jnp.broadcast_to(lowest, x.shape)])
    # A reduction XLA:CPU keeps as its own (a plain max would go to a library call).
    return jax.lax.reduce(both, lowest, lambda u, v: jnp.where(u >= v, u, v), (0,))


def _barrier_many(xs, lowest):
    """Several float64 values of one shape, computed together in one kernel: a variadic
    reduction over a stacked runtime -inf, so that values sharing a chain of
    computations evaluate it once (separate barriers, or a stack, each evaluate it
    again: XLA:CPU has no multi-output loop fusion)."""
    lowest = jnp.asarray(lowest, xs[0].dtype)
    n = len(xs)
    ops = tuple(jnp.stack([x, jnp.broadcast_to(lowest, x.shape)]) for x in xs)
    return list(jax.lax.reduce(ops, (lowest,) * n, lambda u, v: tuple(
        jnp.where(u[k] >= v[k], u[k], v[k]) for k in range(n)), (0,)))


def _info_dtype(st):
    """The int type of the packed rows: device | flags (6 bits) or link class << SH."""
    return jnp.int16 if max(st["SH"] + 6, st["CB"] + 1) <= 15 else jnp.int32


def _pairs(c, st, p, ubits=True):
    """Per pair (distinct producer j, consumer i), for a batch of placements [M, B]:
    ``send`` (the read issues a transfer: it crosses devices and i is j's first consumer
    on its device), ``code`` (the link class of that transfer, 0 for none), ``pj`` (the
    producer's device), each with a last row of zeros (the padding pair); and, per op,
    ``ubits`` (bit k set: the op sends to device k; None unless asked for)."""
    d = st["D"]
    dt = _bits_dtype(d)
    b = p.shape[1]
    pj, pi = _rows(p, c["pair_src"]), _rows(p, c["pair_dst"])  # [P, B]
    bit_i = dt(1) << pi.astype(dt)
    # seen[q]: devices of the consumers of q's producer before q's consumer. Pairs are
    # sorted by rank (position among their producer's consumers), so each rank is a
    # block whose predecessors are all in the block before.
    offs = st["rank_offsets"]
    seen = [jnp.zeros((offs[1] if len(offs) > 1 else 0, b), dt)]
    for r in range(1, len(offs) - 1):
        prev = c["pair_prev"][offs[r]:offs[r + 1]]
        seen.append(_rows(seen[r - 1], prev - offs[r - 1]) | _rows(bit_i, prev))
    seen = jnp.concatenate(seen) if len(seen) > 1 else seen[0]
    send = (pj != pi) & (((seen >> pi.astype(dt)) & dt(1)) == 0)
    code = send.astype(p.dtype)
    if not st["TABLE"] and st["NC"] > 1:
        # The link class of (from, to): the commonest class, then a select for each
        # link of another class.
        cm = np.asarray(st["classmap"])
        common = int(np.bincount(cm[~np.eye(d, dtype=bool)]).argmax())
        code = jnp.full(pj.shape, common, p.dtype)
        for f in range(d):
            for t in range(d):
                if f != t and cm[f, t] != common:
                    code = jnp.where((pj == f) & (pi == t), p.dtype.type(cm[f, t]), code)
        code = jnp.where(send, code, p.dtype.type(0))
    zero = jnp.zeros((1, b), p.dtype)
    ub = None
    if ubits:
        # Union of the consumers' devices per producer, without its own: from its last
        # pair.
        allbits = jnp.concatenate([seen | bit_i, jnp.zeros((1, b), dt)])
        ub = _rows(allbits, c["op_last_pair"]) & ~(dt(1) << p.astype(dt))
    return (jnp.concatenate([send, zero.astype(bool)]), jnp.concatenate([code, zero]),
            jnp.concatenate([pj, zero]), ub)


def _last_of(last):
    """int32[M, B]: the last op of each op's segment, from ``last`` (op i closes its
    segment): a reverse scan over blocks of 8 ops."""
    m, b = last.shape
    n_blk = -(-m // 8)
    pad = jnp.concatenate([last, jnp.ones((n_blk * 8 - m, b), bool)]).reshape(n_blk, 8, b)
    base = jnp.arange(n_blk, dtype=jnp.int32) * 8

    def body(lo, x):
        blk, i0 = x
        rows = []
        for r in range(7, -1, -1):
            lo = jnp.where(blk[r], i0 + r, lo)
            rows.append(lo)
        return lo, jnp.stack(rows[::-1])

    _, out = jax.lax.scan(body, jnp.full((b,), m - 1, jnp.int32), (pad, base), reverse=True)
    return out.reshape(n_blk * 8, b)[:m]


def _segment_values(start, end, last):
    """Each op's segment start and end [M, B], from the candidates at each op (valid
    at a segment's last op): a reverse scan carrying the values of the segment in
    progress."""
    def body(carry, x):
        s, e, is_last = x
        carry = (jnp.where(is_last, s, carry[0]), jnp.where(is_last, e, carry[1]))
        return carry, carry

    z = jnp.zeros(start.shape[1], start.dtype)
    return jax.lax.scan(body, (z, z), (start, end, last), reverse=True)[1]


def _column_sums(arrays):
    """int32[B] per bool array [N, B]: how many rows are True in each column."""
    return [jnp.sum(a, axis=0, dtype=jnp.int32) for a in arrays]


def _precompute(graph, inp: SimInputs) -> tuple[dict, dict]:
    """Static sizes (Python ints) and index/cost arrays (numpy) for the traced code."""
    m, d = graph.num_ops, inp.num_devices
    w = _WINDOW
    assert w == 8, "the run and far flags in _impl are computed by doubling up to 8"
    if m == 0:  # nothing to trace: __call__ answers without the scan
        return dict(M=0, D=d, E=2 * w - 1), {}
    src, dst = graph.src.astype(np.int64), graph.dst.astype(np.int64)
    ptr, order = graph.in_edges
    # Pairs: distinct producers of each op, in the order of its in-edges.
    raw_src, raw_dst = [], []
    for i in range(m):
        for j in dict.fromkeys(src[order[ptr[i]:ptr[i + 1]]].tolist()):
            raw_src.append(j)
            raw_dst.append(i)
    n_pairs = len(raw_src)
    raw_src = np.asarray(raw_src, np.int64)
    raw_dst = np.asarray(raw_dst, np.int64)
    # Rank of each pair among its producer's consumers (raw pairs come in consumer
    # order), and the pair of the previous consumer.
    rank = np.zeros(n_pairs, np.int64)
    raw_prev = np.full(n_pairs, -1, np.int64)
    last_seen: dict[int, int] = {}
    for q, j in enumerate(raw_src.tolist()):
        if j in last_seen:
            raw_prev[q] = last_seen[j]
            rank[q] = rank[last_seen[j]] + 1
        last_seen[j] = q
    perm = np.argsort(rank, kind="stable")  # pairs are numbered by rank
    inv = np.empty(n_pairs, np.int64)
    inv[perm] = np.arange(n_pairs)
    pair_src, pair_dst = raw_src[perm], raw_dst[perm]
    pair_prev = np.where(raw_prev[perm] >= 0, inv[np.maximum(raw_prev[perm], 0)], 0)
    n_rank = int(rank.max()) + 1 if n_pairs else 0
    rank_offsets = np.searchsorted(rank[perm], np.arange(n_rank + 1)).tolist()
    op_last_pair = np.full(m, n_pairs, np.int64)
    for j, q in last_seen.items():
        op_last_pair[j] = inv[q]
    # Slices: each op's pairs, K at a time (at least one slice per op).
    per_op = np.bincount(raw_dst, minlength=m) if m else np.zeros(0, np.int64)
    k_w = int(min(_WIDTH, max(1, per_op.max() if m else 1)))
    op_pairs: list[list[int]] = [[] for _ in range(m)]
    for q in range(n_pairs):
        op_pairs[raw_dst[q]].append(int(inv[q]))
    s_op, s_first, s_last, s_pair = [], [], [], []
    for i in range(m):
        qs = op_pairs[i]
        chunks = [qs[a:a + k_w] for a in range(0, len(qs), k_w)] or [[]]
        for n_, ch in enumerate(chunks):
            s_op.append(i)
            s_first.append(n_ == 0)
            s_last.append(n_ == len(chunks) - 1)
            s_pair.append(ch + [n_pairs] * (k_w - len(ch)))
    s_op = np.asarray(s_op, np.int64)
    s_first = np.asarray(s_first, bool)
    s_last = np.asarray(s_last, bool)
    s_pair = np.asarray(s_pair, np.int64).reshape(-1, k_w)
    n_slices = len(s_op)
    valid = s_pair < n_pairs
    pair_pos = np.zeros(n_pairs, np.int64)
    pair_pos[s_pair[valid]] = np.flatnonzero(valid.reshape(-1))
    # Distinct tensors (src, edge_output); each is sent to a device at most once.
    if len(src):
        keys = np.stack([src, graph.edge_output.astype(np.int64)], axis=1)
        tensors, edge_tensor = np.unique(keys, axis=0, return_inverse=True)
        edge_tensor = edge_tensor.reshape(-1)
        tensor_bytes = np.zeros(len(tensors))
        np.maximum.at(tensor_bytes, edge_tensor, graph.edge_bytes)
        tensor_op = tensors[:, 0]
        t_edges = np.unique(np.stack([edge_tensor, dst], axis=1), axis=0)
    else:
        tensor_bytes = np.zeros(0)
        tensor_op = np.zeros(0, np.int64)
        t_edges = np.zeros((0, 2), np.int64)
    # Ops with one tensor send it whole; ops with several send, to each device, the
    # sum of those consumed there (a per-batch table, _multi_bytes).
    n_tensors = np.bincount(tensor_op, minlength=m) if m else np.zeros(0, np.int64)
    is_multi = n_tensors > 1
    single_bytes = np.zeros(m)
    single_bytes[tensor_op] = tensor_bytes
    single_bytes[is_multi] = 0.0
    multi_ops = np.flatnonzero(is_multi)
    multi_index = np.full(m, len(multi_ops), np.int64)  # the zero row for the others
    multi_index[multi_ops] = np.arange(len(multi_ops))
    mt = np.flatnonzero(is_multi[tensor_op]) if len(tensor_op) else np.zeros(0, np.int64)
    mt_pos = np.full(len(tensor_op), -1, np.int64)
    mt_pos[mt] = np.arange(len(mt))
    me = t_edges[mt_pos[t_edges[:, 0]] >= 0] if len(t_edges) else t_edges
    # Link classes: the distinct (latency, bandwidth, put) of the off-diagonal links;
    # class 0 stands for "no transfer". With more than _MAX_CLASSES, code is 1 for a
    # transfer and the constants come from per-device columns (TABLE).
    lat, bw, put = inp.latency_s, inp.bandwidth_bytes_per_s, inp.put_s
    waits = put_waits_of(inp).astype(np.float64)
    off = ~np.eye(d, dtype=bool)
    classmap = np.zeros((d, d), np.int64)
    uniq = np.zeros((0, 4))
    if d > 1:
        uniq, cls_inv = np.unique(np.stack([lat[off], bw[off], put[off], waits[off]], axis=1),
                                  axis=0, return_inverse=True)
        classmap[off] = cls_inv.reshape(-1) + 1
    table = len(uniq) > _MAX_CLASSES
    n_cls = 1 if table else len(uniq)
    lat_c = np.concatenate([[0.0], uniq[:, 0]])
    bw_c = np.concatenate([[np.inf], uniq[:, 1]])
    put_c = np.concatenate([[0.0], uniq[:, 2]])
    wait_c = np.concatenate([[0.0], uniq[:, 3]])
    # Per slice and pair: the bytes of a single-tensor producer and its transfer time
    # on each link class.
    j_s = np.concatenate([pair_src, [0]])[s_pair]  # [S, K] producers
    nb_s = np.where(valid, single_bytes[j_s], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_s = nb_s[..., None] / (bw_c[None, None, :] if not table else np.ones((1, 1, 2)))
    t_s = np.where(np.isfinite(t_s), t_s, 0.0)
    t_s[..., 0] = 0.0
    pool_work = np.asarray(inp.op_pool_work, np.float64)
    pool_min = np.asarray(inp.pool_min_work, np.float64)
    pool_launch = np.asarray(inp.pool_launch_s, np.float64)
    unfused = getattr(inp, "op_unfused_s", None)
    unfused = np.zeros((m, d)) if unfused is None else np.asarray(unfused, np.float64)
    last_f = s_last[:, None].astype(np.float64)
    group = inp.exclusive_group
    sh = max(1, (d - 1).bit_length())
    uses, use_offsets = _param_uses(graph)
    static = dict(
        M=m, D=d, G=inp.num_groups, K=k_w, W=w, P=graph.num_params, S=n_slices,
        E=m + 2 * w - 1, SH=sh, CB=sh + max(1, n_cls.bit_length()),
        G_ID=bool(np.array_equal(group, np.arange(d))), Q=len(multi_ops), NC=n_cls,
        TABLE=table, group=group.tolist(), classmap=classmap.tolist(),
        lat_c=lat_c.tolist(), bw_c=bw_c.tolist(), put_c=put_c.tolist(),
        wait_c=wait_c.tolist(), lat=lat.tolist(), bw=bw.tolist(), put=put.tolist(),
        wait=waits.tolist(), has_wait=bool(np.any(waits[off] > 0)),
        launch=inp.launch_s.tolist(), dispatch=inp.dispatch_s.tolist(),
        rank_offsets=rank_offsets,
        has_pool=bool(np.any(np.isfinite(pool_min) & (pool_launch > 0))),
        pool_min=pool_min.tolist(), pool_launch=pool_launch.tolist(),
        has_op_unfused=bool(np.any(unfused != 0)), NP=n_pairs,
        use_offsets=use_offsets)
    consts = dict(
        pair_src=pair_src.astype(np.int32), pair_dst=pair_dst.astype(np.int32),
        pair_src_pad=np.concatenate([pair_src, [m]]).astype(np.int32),
        pair_prev=pair_prev.astype(np.int32),
        pair_tail=_tail(pair_prev, rank_offsets),
        use_tail=_tail(uses["use_prev"], use_offsets),
        op_last_pair=op_last_pair.astype(np.int32),
        pair_pos=pair_pos.astype(np.int32), slice_pair=s_pair.astype(np.int32),
        op_last_slice=np.flatnonzero(s_last).astype(np.int32),
        lowest=np.float64(-np.inf), lowest_i=np.int32(-128),
        # Per slice, ints: op, flag mask (the first slice opens, the last closes; run
        # bits kept), previous slice's op, then per pair: the pair, its producer's etab
        # row, the producer, its multi-tensor row. (_impl inserts "far" at column 3.)
        slice_int=np.concatenate(
            [s_op[:, None], (s_first * 1 + s_last * 2 + 0x3C)[:, None],
             np.concatenate([[0], s_op[:-1]])[:n_slices, None], s_pair, j_s + w - 1, j_s,
             multi_index[j_s]], axis=1).astype(np.int32),
        # Per slice, floats: op times, op pool work and unfused costs (on an op's
        # last slice only), then per pair: bytes and transfer time on each link class.
        slice_float=np.concatenate(
            [inp.op_time_s[s_op] * last_f, pool_work[s_op] * last_f, unfused[s_op] * last_f,
             np.concatenate([nb_s[..., None], t_s[..., :n_cls + 1]],
                            axis=2).reshape(n_slices, -1)], axis=1),
        blk_last=np.int32(s_op[-1] if n_slices else 0),
        single_bytes=single_bytes, is_multi=is_multi, multi_index=multi_index.astype(np.int32),
        mt_op=multi_index[tensor_op[mt]].astype(np.int32),
        mt_owner=tensor_op[mt].astype(np.int32),
        mt_bytes=tensor_bytes[mt], me_tensor=mt_pos[me[:, 0]].astype(np.int32),
        me_dst=me[:, 1].astype(np.int32),
        **uses,
        out_bytes=graph.out_bytes, is_output=graph.is_output,
        param_op=graph.param_op, param_index=graph.param_index,
        param_sizes=graph.param_sizes,
    )
    return static, consts


def _sweep_peaks(key_free, key_alloc, dev, size, d: int) -> np.ndarray:
    """Peak of live bytes per device, float64[B, D], from intervals [N, B] (numpy).

    Events are sorted per placement by their key (``_event_keys``: device, time, frees
    first at equal times), so each device's events form one time-ordered run; a
    placement whose keys do not hold the device is then sorted stably by device (a
    radix sort on int8). The running sum of +size/-size over a run is the device's
    live bytes, and its maximum (or 0) the peak. numpy's sorts are several times faster
    than XLA's CPU sort with payloads; placements are swept in blocks on a thread per
    core (numpy's sorts, gathers and sums release the GIL)."""
    n, bsz = np.shape(dev)
    if n == 0 or bsz == 0:
        return np.zeros((bsz, d))
    # Batch-major copies, transposed in blocks of rows (a plain .T copy misses the
    # cache on every element).
    key_free, key_alloc, dev, size = (_transposed(np.asarray(x))
                                      for x in (key_free, key_alloc, dev, size))
    rows = max(1, min(64, -(-bsz // (os.cpu_count() or 1))))
    blocks = [(r, min(r + rows, bsz)) for r in range(0, bsz, rows)]
    out = np.zeros((bsz, d))

    def sweep(block):
        r0, r1 = block
        out[r0:r1] = _sweep_rows(key_free[r0:r1], key_alloc[r0:r1], dev[r0:r1],
                                 size[r0:r1], d)

    if len(blocks) == 1 or (os.cpu_count() or 1) == 1:
        for blk in blocks:
            sweep(blk)
    else:
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
            list(pool.map(sweep, blocks))
    return out


def _transposed(x: np.ndarray, rows: int = 64) -> np.ndarray:
    out = np.empty(x.shape[::-1], x.dtype)
    for i in range(0, x.shape[0], rows):
        out[:, i:i + rows] = x[i:i + rows].T
    return out


def _sweep_rows(key_free, key_alloc, dev, size, d: int) -> np.ndarray:
    """``_sweep_peaks`` of batch-major intervals [b, N]."""
    bsz, n = dev.shape
    order = np.argsort(np.concatenate([key_free, key_alloc], axis=1), axis=1)
    ev_dev = np.take_along_axis(np.concatenate([dev, dev], axis=1), order, axis=1)
    delta = np.take_along_axis(np.concatenate([-size, size], axis=1), order, axis=1)
    loose = np.flatnonzero(np.any(ev_dev[:, 1:] < ev_dev[:, :-1], axis=1))
    if len(loose):
        by_dev = np.argsort(ev_dev[loose], axis=1, kind="stable")
        delta[loose] = np.take_along_axis(delta[loose], by_dev, axis=1)
    live = np.cumsum(delta, axis=1)
    counts = np.stack([np.count_nonzero(dev == k, axis=1) for k in range(d)], axis=1) * 2
    ends = np.cumsum(counts, axis=1)  # [b, D], exclusive run ends
    starts = ends - counts
    # A -inf column after each row keeps every run start inside the array.
    flat = np.concatenate([live, np.full((bsz, 1), -np.inf)], axis=1).reshape(-1)
    row0 = (np.arange(bsz) * (2 * n + 1))[:, None]
    run_max = np.maximum.reduceat(flat, (starts + row0).reshape(-1)).reshape(bsz, d)
    # Each run's running sum starts from the sum of the runs before it (zero in exact
    # arithmetic): subtract it, so rounding in other devices' sums cannot leak in.
    base = np.where(starts > 0, np.take_along_axis(live, np.maximum(starts - 1, 0), axis=1),
                    0.0)
    return np.where(counts > 0, np.maximum(run_max - base, 0.0), 0.0)


def _bits_dtype(d: int):
    return jnp.uint8 if d <= 8 else jnp.uint16 if d <= 16 else jnp.uint32 if d <= 32 \
        else jnp.uint64


def _multi_bytes(c, p, d: int, rows: int):
    """float64[rows, D, B]: bytes each multi-tensor op sends to each device (the sum of
    its distinct tensors consumed there, none to its own device); the last row is zeros.
    Byte counts are whole numbers, so the sums are exact in any order."""
    if rows == 1:  # no multi-tensor op
        return jnp.zeros((1, d, p.shape[1]))
    b = p.shape[1]
    owner_dev = p[c["mt_owner"]]  # [Tq, B]
    cons_dev = p[c["me_dst"]]  # [Eq, B]
    out = []
    for k in range(d):
        present = jnp.zeros((c["mt_owner"].shape[0], b), jnp.uint8).at[c["me_tensor"]].max(
            (cons_dev == k).astype(jnp.uint8))
        sent = (present > 0) & (owner_dev != k)
        out.append(jnp.zeros((rows, b)).at[c["mt_op"]].add(
            jnp.where(sent, c["mt_bytes"][:, None], 0.0)))
    return jnp.stack(out, axis=1)


def _param_uses(graph) -> tuple[dict, list[int]]:
    """Static chains of the parameter uses (op, parameter), for a running OR of the
    devices that read each parameter (``_chain``): uses grouped by rank among the uses
    of their parameter, each following the previous use of its parameter."""
    ops = np.asarray(graph.param_op, np.int64)
    idx = np.asarray(graph.param_index, np.int64)
    if len(ops) == 0:
        z = np.zeros(0, np.int32)
        return dict(use_op=z, use_prev=z, param_last_use=z, param_used=z), [0]
    uses = np.unique(np.stack([idx, ops], axis=1), axis=0)  # sorted by parameter
    first = np.searchsorted(uses[:, 0], uses[:, 0])
    rank = np.arange(len(uses)) - first
    perm = np.argsort(rank, kind="stable")
    inv = np.empty(len(uses), np.int64)
    inv[perm] = np.arange(len(uses))
    prev_raw = np.where(rank > 0, np.arange(len(uses)) - 1, 0)
    used = np.unique(uses[:, 0])
    last_raw = np.searchsorted(uses[:, 0], used, side="right") - 1
    offsets = np.searchsorted(rank[perm], np.arange(int(rank.max()) + 2)).tolist()
    return dict(use_op=uses[perm, 1].astype(np.int32),
                use_prev=inv[prev_raw[perm]].astype(np.int32),
                param_last_use=inv[last_raw].astype(np.int32),
                param_used=used.astype(np.int32)), offsets


_NO_NUMBA_SAID: list[bool] = []


def _notice_no_numba(err: ImportError) -> None:
    """Say once per process that the native simulator is missing, and what it costs."""
    if _NO_NUMBA_SAID:
        return
    _NO_NUMBA_SAID.append(True)
    print(f"simplace: numba cannot be imported ({err}); the batched simulator runs on JAX, "
          "several times slower (pip install numba)", file=sys.stderr)


def batched_simulator(graph, cost_model, *, memory: bool | str = True,
                      max_batch: int | None = None, backend: str = "auto") -> Callable:
    """A fast simulator of many placements of ``graph`` on one machine.

    Args:
      graph: an ``OpGraph``.
      cost_model: a ``CostModel`` (or its interface) or a ``SimInputs``.
      memory: True: exact peak memory and OOM (the event sweep costs several times the
        scan on CPU). False: ``peak_memory_bytes`` is NaN and ``oom`` False. "oom": the
        exact OOM flag at nearly the cost of False: an upper bound of each device's
        peak (everything it ever holds, held all step) screens the placements, and only
        those whose bound exceeds a capacity are simulated with memory; the others,
        which cannot be OOM, report NaN peaks.
      max_batch: placements simulated at once (default: a power of two that keeps ops
        x placements within 1M, at least 64: 256 for ResNet-50, 64 for a 22k-op graph;
        the native simulator's memory does not grow with it: 8M there); larger batches
        run in chunks, with the same results.
      backend: "auto" (the native simulator where numba is installed, else JAX),
        "numba" (``simplace.sim.native.NativeSimulator``: a compiled loop, several times
        faster on CPU; numba is a default dependency) or "jax" (``BatchedSimulator``:
        a jitted scan, whose pure function ``traceable()`` a caller can run inside its
        own jit, e.g. on a GPU).

    Returns:
      ``f(placements int[B, M]) -> BatchResult`` (numpy arrays), with the reference
      simulator's semantics; ``step_time_s`` is the inputs' objective (see
      ``simplace.sim.objective``: a throughput objective or a ruler wraps the
      simulator, and has no ``traceable``). The JAX ``f`` compiles once per batch-size bucket (see
      ``batch_bucket``) and reuses the compiled code across calls; ``f.num_traces``
      counts compilations. The native ``f`` compiles once per install (numba's cache).
      Raises ``PlacementError`` for placements that do not fit.
    """
    if backend not in ("auto", "numba", "jax"):
        raise ValueError(f"backend must be 'auto', 'numba' or 'jax', got {backend!r}")
    inputs = sim_inputs(graph, cost_model)
    from simplace.sim.objective import ObjectiveSimulator, Ruler

    if isinstance(inputs.objective, Ruler):  # another system's rules: no simulation
        return ObjectiveSimulator(graph, inputs)
    sim = None
    if backend != "jax":
        try:
            from simplace.sim.native import NativeSimulator
        except ImportError as err:
            if backend == "numba":
                raise ImportError(
                    f"backend='numba' needs numba ({err}): pip install numba, or use "
                    "backend='jax'.") from err
            _notice_no_numba(err)
        else:
            sim = NativeSimulator(graph, inputs, memory=memory, max_batch=max_batch)
    if sim is None:
        sim = BatchedSimulator(graph, inputs, memory=memory, max_batch=max_batch)
    return sim if inputs.objective == "latency" else ObjectiveSimulator(graph, inputs, sim)

"""The JAX scan simulator: the reference semantics in JAX, for many placements at once.

``BatchedSimulator(graph, inputs)`` (``batched_simulator(..., backend="jax")``)
precomputes the graph's index arrays (numpy, ``_scan_tables``) and is a function
``f(placements int[B, M]) -> BatchResult`` that runs one
``jax.lax.scan`` over the ops in graph order, vectorised over the batch, with the
reference's semantics (``simplace.sim.reference``): segments (maximal runs of ops on
one device, one fused computation each: launch, the pool's launch when its ops' pool work
reaches the device's minimum, the ops' costs and
the unfused costs of ops with no input from the segment), one serial host thread
(``put_s`` per transfer call, ``dispatch_s`` per segment call), lazy transfers issued
by the first consumer segment on each device, FIFO links, exclusive groups.
The scan is exact for the reason the reference's single pass is: segments, host calls
and each link's transfers all happen in graph order.

Before the scan (``_scan_facts``), vectorised over ``[.., B]``, from the placements alone:
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

The scan (its step: ``_scan_step``) runs over "slices": an op's pairs, at most ``K`` (2)
per step; an op with more takes several steps (the first opens its segment, the last
adds its cost and may close it). The carry holds, per placement (the batch is the minor
axis): the host clock, the open segment's start bound (its group's free time when it
opened, then the latest arrival of its transfers), its work so far and op-launch
maximum, its first op (an input from it or later is fused), the bytes moved; ``free[G]``
(each exclusive group's last segment end), ``busy[D]``, ``link[to, from]`` (when each
link is free); and ``etab``, segment ends by op. A transfer starts no earlier than the
end of its producer's segment, known only at that segment's last op: there the scan
writes the end into the rows of the segment's last ``W`` ops (one contiguous ``[W, B]``
block), and a transfer reads row ``j`` of its producer ``j``, or row ``j + W`` when
``j``'s segment runs on 8 ops or more (op ``j + W`` is then in it). A producer whose
segment runs on 16 ops or more (for some placement of the batch; never in practice for
random placements, often for blocky ones) makes its step read ``etab[last_of[j]]`` by
per-placement gathers, inside a ``lax.cond``: XLA:CPU's gathers are dear, so only such
steps pay for them.

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

Peak memory (``memory=True``, ``_scan_memory``) is exact: the scan also emits each
slice's segment start and end candidates and each transfer's arrival; after the scan a
reverse scan gives each op its segment's start and end. The live intervals (each op's
activation, and one received copy per pair that sends) are built batch-minor with static
indices only: the free times are running maxima along each producer's chain of pairs,
the resident parameters a running OR along each parameter's chain of uses (``_chain``).
Each event gets one uint64 sort key holding its device, its time (the bit pattern, less
the batch's smallest) and free-before-allocation (``_event_keys``), so one numpy argsort
per placement orders events by device and time; ``_sweep_peaks`` sums the sizes in that
order, in blocks of placements on a thread per core. ``memory="oom"`` gets the exact OOM
flag at nearly the cost of ``memory=False``: every byte a device ever holds is a bound
of its peak; only placements whose bound exceeds a capacity are re-run exactly; the
others report NaN peaks.

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

import jax
import jax.numpy as jnp
import numpy as np

from simplace.sim._scan_facts import placement_facts
from simplace.sim._scan_memory import _memory_events, _peak_bound, _segment_values, _sweep_peaks
from simplace.sim._scan_ops import _column_sums, _rows
from simplace.sim._scan_step import ScanStep
from simplace.sim._scan_tables import _precompute
from simplace.sim.inputs import SimInputs, check_placements, check_simulator_options
from simplace.sim.results import BatchResult

# Ops x placements per run, at most (larger batches run in chunks of a power of two,
# at least 64): ResNet-50 (3,889 ops) runs 256 placements at once, a 22k-op graph 64.
# Besides bounding memory, smaller runs are faster per placement on CPU (measured on
# ResNet-50, 2 cores: 256 at once 1.3x faster than 1,024, 512 in between): each
# step's working set (link table, group and busy times, the segment-end table's
# rows) stays in cache.
_MAX_CELLS = 1 << 20


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

    def _impl(self, c, placements, extras=False, etab0=None):
        """The traced simulation of ``placements`` int[B, M] (see ``traceable``); with
        ``extras``, also the segment and transfer counts, the host time and the
        segment-end table (to keep for the next call)."""
        self.num_traces += 1  # Python side effect: runs once per trace, not per call
        st = self._static
        memory = self.memory
        facts = placement_facts(st, c, placements, memory)
        step = ScanStep(st, c, facts, memory)
        x_int = c["slice_int"]
        xs = (jnp.concatenate([x_int[:, :3], facts.x_far[:, None].astype(x_int.dtype),
                               x_int[:, 3:]], axis=1), c["slice_float"])
        carry, ys = jax.lax.scan(step, step.init_carry(etab0), xs)
        state, link, vals, info = carry
        etab, free, busy = step.finish(state, vals, info, c["blk_last"])
        h, moved = vals[0], vals[3]
        # Ends in a group and copies on a link are increasing: the last ones are the
        # largest, so the makespan is the largest group end, last copy's arrival (its
        # link's free time plus the link's latency) or host time.
        lat_to_from = jnp.asarray(np.asarray(self._inputs.latency_s).T)[:, :, None]
        step_time = jnp.maximum(jnp.maximum(jnp.max(free, axis=0),
                                            jnp.max(link + lat_to_from, axis=(0, 1))), h)
        busy = busy.T  # [B, D]
        b, p = placements.shape[0], facts.p
        if memory is True:
            start_s, end_s, arr_s = ys
            ls = c["op_last_slice"]
            seg_start, seg_end = _segment_values(_rows(start_s, ls), _rows(end_s, ls),
                                                 facts.last)
            arr = _rows(jnp.stack(arr_s, axis=1).reshape(-1, b), c["pair_pos"])  # [P, B]
            mem = _memory_events(st, c, p, seg_start, seg_end, arr, facts.send[:-1],
                                 facts.multi_bytes, step_time)
        elif memory == "oom":
            mem = _peak_bound(st, c, p, facts.ubits, facts.multi_bytes)
        else:
            mem = None
        if not extras:
            return step_time, busy, moved, mem
        counts = _column_sums([facts.new, facts.send[:-1]])
        return step_time, busy, moved, mem, counts[0], counts[1], h, etab

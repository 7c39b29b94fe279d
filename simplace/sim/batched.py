"""The batched simulator: the reference semantics in JAX, for many placements at once.

``batched_simulator(graph, cost_model)`` precomputes the graph's index arrays (numpy,
jraph style: in-edges padded to the largest in-degree, with masks) and returns a
function ``f(placements int[B, M]) -> BatchResult`` that runs one ``jax.lax.scan`` over
the ops in graph order, vectorised over the batch. The scan is exact for the same
reason the reference's single pass is: each exclusive group runs its ops in graph
order, and every link is fed by one group, so links are FIFOs in graph order too.

Layout: the batch is the minor (last) axis of every array in the scan, so each step
works on contiguous ``[.., B]`` rows. The carry is
  ready[S, D, B]: row ``s`` holds, for the op that owns slot s, when its outputs are
    available on each device (its end on its own device, the transfer's arrival
    elsewhere). Slots are reused like registers (``_ready_slots``): S is the largest
    number of ops whose outputs are still to be read (532 for ResNet-50 training instead
    of M = 3,889), so the buffer stays in cache and costs little to allocate;
  free[G, B] (when each exclusive group is free), link[D, D, B] (when each link is
    free), busy[D, B] (op time per device, added in graph order as the reference does).
Per op, before the scan, only a bit mask of the devices each tensor goes to
(``_send_bits``, uint8 [M, TM, B] for D <= 8) is computed; bytes / bandwidth of each
transfer is a static [M, D, D] table when every op has at most one distinct tensor (the
common case), else it is divided inside the step in the reference's order. (The masks
limit machines to 64 devices.)

What makes the step fast on XLA:CPU (measured; each kernel launch costs ~1 us and
fusions with dynamic indexing are not vectorised):
  - the step is software-pipelined: step i first issues the transfers of op i-1 and
    writes its ready row (its end comes through the carry), then computes op i's start
    and end. Without this, XLA fuses the end computation (three dynamic reads of
    ``ready``) into every [D, D, B] link fusion and copies the carry;
  - every per-device selection is a chain of D elementwise selects (``pick``), never a
    one-hot reduce (an extra custom reduce kernel each) nor a gather;
  - no stack/concatenate inside the step (XLA:CPU emits them element by element);
  - the link update is one elementwise [D, D, B] fusion; the step time is the largest
    group end or link arrival after the scan (both are FIFOs), so no per-step max.

Peak memory (``memory=True``) is exact: the scan also emits each op's start and ready
row; all live intervals (activations, and received copies in static per-producer slots)
become +size/-size events with one integer sort key each (the time's bits, then
free-before-allocation), and ``_sweep_peaks`` sorts and sweeps them on the host with
numpy (about 3x faster than XLA's CPU sort with payloads, which dominated before); the
sort still costs several times the scan. ``memory="oom"`` gets the exact OOM flag at
nearly the cost of ``memory=False``: the scan also adds up every byte a device ever
holds (a bound of its peak), and only placements whose bound exceeds a capacity are
re-run exactly; the others report NaN peaks.

Precision: times are float64, so that the batched simulator makes the same comparisons
as the reference (ties between an op's end and the next op's start are common). float64
is switched on only inside this module's calls, with the ``jax.enable_x64`` context
manager around tracing, compiling and running; global JAX config is never changed.

Compilation: the jitted function is cached per simulator (graph x machine) and per
batch size. Batch sizes are padded up to a bucket (the next power of two up to 256,
then the next multiple of 256) with copies of the first placement, so a new B costs a
compile only when it reaches a new bucket.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from simplace.sim.inputs import SimInputs, check_placements, sim_inputs


class BatchResult(NamedTuple):
    """Results of a batch of placements (numpy arrays).

    step_time_s: float64[B]; peak_memory_bytes: float64[B, D]; oom: bool[B];
    busy_s: float64[B, D]; bytes_moved: float64[B]. Same meanings as ``SimResult``.
    """

    step_time_s: np.ndarray
    peak_memory_bytes: np.ndarray
    oom: np.ndarray
    busy_s: np.ndarray
    bytes_moved: np.ndarray


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
    """

    def __init__(self, graph, inputs: SimInputs, *, memory: bool | str = True):
        if memory not in (True, False, "oom"):
            raise ValueError(f"memory must be True, False or 'oom', got {memory!r}")
        self.num_ops = graph.num_ops
        self.num_devices = inputs.num_devices
        self.memory = memory if memory == "oom" else bool(memory)
        self.num_traces = 0
        self._graph = graph
        self._inputs = inputs
        self._exact = None  # the memory=True simulator that "oom" mode defers to
        self._static, consts = _precompute(graph, inputs)
        with jax.enable_x64(True):
            self._consts = jax.device_put(consts)
        if self.num_devices > 64:  # the send masks are one unsigned integer per op
            raise ValueError(f"the batched simulator supports up to 64 devices, got "
                             f"{self.num_devices}")
        self._p_dtype = np.int8 if self.num_devices <= 127 else np.int32
        self._jit = jax.jit(self._impl)

    def __call__(self, placements) -> BatchResult:
        p = check_placements(placements, self.num_ops, self.num_devices)
        b = p.shape[0]
        if b == 0 or self.num_ops == 0:
            d = self.num_devices
            # Nothing runs: memory holds no parameters either (no op reads them).
            return BatchResult(np.zeros(b), np.zeros((b, d)), np.zeros(b, dtype=bool),
                               np.zeros((b, d)), np.zeros(b))
        bucket = batch_bucket(b)
        if bucket > b:
            p = np.concatenate([p, np.repeat(p[:1], bucket - b, axis=0)])
        with jax.enable_x64(True):
            # Device indices travel as int8 when they fit: 4x less to copy and transpose.
            out = self._jit(self._consts, jnp.asarray(p, dtype=self._p_dtype))
            step_time, busy, moved, events = jax.device_get(out)
        d = self.num_devices
        cap = self._inputs.memory_bytes
        if self.memory is False:
            peak = np.full((len(step_time), d), np.nan)
            oom = np.zeros(len(step_time), dtype=bool)
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
                    self._exact = BatchedSimulator(self._graph, self._inputs, memory=True)
                exact = self._exact(p[suspect])
                peak[suspect] = exact.peak_memory_bytes
                oom[suspect] = exact.oom
        else:
            params, key_free, key_alloc, dev, size = (np.asarray(x)[:b] for x in events)
            peak = params + _sweep_peaks(key_free, key_alloc, dev, size, d)
            oom = np.any(peak > cap[None, :], axis=1)
        return BatchResult(*(np.asarray(x)[:b] for x in (step_time, peak, oom, busy, moved)))

    def traceable(self):
        """``(fn, consts)``: the pure function behind ``__call__``, for a caller's own jit.

        ``fn(consts, placements int32[B, M])`` (B > 0, M > 0, traced and run under
        ``jax.enable_x64(True)``) returns ``(step_time_s[B], busy_s[B, D], bytes_moved[B],
        memory)``, where ``memory`` is None (``memory=False``), the peak bound
        float64[B, D] (``"oom"``) or the event arrays ``(params, key_free, key_alloc,
        dev, size)`` that this module's ``_sweep_peaks`` turns into peaks (``True``).
        No batch padding, no host-side memory check."""
        return self._impl, self._consts

    # ------------------------------------------------------------------ traced code
    def _impl(self, c, placements):
        self.num_traces += 1  # Python side effect: runs once per trace, not per call
        st = self._static
        d, g, k_in = st["D"], st["G"], st["K"]
        p = placements.T  # [M, B]: the batch is the minor axis throughout (int8 or int32)
        b = p.shape[1]
        dev_ids = jnp.arange(d, dtype=jnp.int32)
        # ubits[i, b]: bit k set = op i sends something to device k. Ops with several
        # tensors (split, unstack...) are few; the bytes they send to each device come
        # from a small per-batch table, so that no per-op array is padded to the widest
        # op (an unstack of 40 tensors would make every scan step 40 times wider).
        ubits = _union_bits(c, p, d)  # [M, B]
        bit_t = ubits.dtype.type
        multi_bytes = _multi_bytes(c, p, d, st["Q"] + 1)  # [Q + 1, D, B]; row Q: zeros

        def pick(on, rows):
            """rows[dev] per placement, by a chain of selects (on[k]: dev == k)."""
            r = rows[0]
            for k in range(1, len(rows)):
                r = jnp.where(on[k], rows[k], r)
            return r

        def sends_of(bits_i):
            """bool[D, B] from the op's send masks [B]."""
            return ((bits_i[None, :] >> dev_ids.astype(ubits.dtype)[:, None]) & bit_t(1)) > 0

        lat = c["latency"][:, :, None]  # [from, to, 1]

        def finish(state, prev):
            """Issue the transfers of the previous op and write its ready row.

            The previous op's end comes through the scan carry, so that XLA materialises
            it once instead of recomputing it inside each [D, D, B] fusion."""
            ready, free, link, busy, held = state
            end_p, dev_p, bits_p, slot_p, xf_p, t_p, act_p, tb_p, q_p, multi_p = prev
            on = dev_ids[:, None] == dev_p[None, :]  # [D, B]
            busy = busy + jnp.where(on, t_p[None], 0.0)  # in graph order, as the reference
            if st["G_ID"]:
                free = jnp.where(on, end_p[None], free)
            else:
                g_p = pick([dev_p == k for k in range(d)],
                           [c["group"][k] for k in range(d)])
                free = jnp.where(jnp.arange(g, dtype=jnp.int32)[:, None] == g_p[None],
                                 end_p[None], free)
            send = sends_of(bits_p)
            if st["Q"]:
                # Bytes sent to each device: the op's one tensor, or (several tensors)
                # their sum from the table, then divided by the bandwidth of the op's row
                # (the reference's operation order); single tensors use the static
                # bytes / bandwidth.
                nbytes = jax.lax.dynamic_index_in_dim(multi_bytes, q_p, 0, keepdims=False)
                bw_row = pick([dev_p == k for k in range(d)],
                              [c["bandwidth"][k][:, None] for k in range(d)])
                xfer = jnp.where(multi_p, (nbytes / bw_row)[None], xf_p)
                received = jnp.where(multi_p, nbytes, jnp.where(send, tb_p, 0.0))
            else:
                xfer = xf_p  # [from, to, 1]
                received = jnp.where(send, tb_p, 0.0)
            if bound:
                # Bytes the device ever holds: the op's activation, its received copies.
                held = held + jnp.where(on, act_p, 0.0) + received
            upd = on[:, None, :] & send[None, :, :]
            link = jnp.where(upd, jnp.maximum(end_p[None, None], link) + lat + xfer, link)
            arrive = pick([dev_p == k for k in range(d)], [link[k] for k in range(d)])
            row = jnp.where(on, end_p[None], arrive)  # [D, B]
            ready = jax.lax.dynamic_update_index_in_dim(ready, row, slot_p, 0)
            return (ready, free, link, busy, held), row

        def step(carry, x):
            state, prev = carry
            state, row_p = finish(state, prev)
            ready, free = state[:2]
            dev, bits_i, t_row, src_slot, mask, slot, xf, act, tb, q, multi = x
            dev = dev.astype(jnp.int32)
            ons = [dev == k for k in range(d)]
            t_i = jnp.broadcast_to(pick(ons, [t_row[k] for k in range(d)]), (b,))
            if st["G_ID"]:
                ready_at = pick(ons, [free[k] for k in range(d)])
            else:
                g_i = pick(ons, [c["group"][k] for k in range(d)])
                ready_at = pick([g_i == k for k in range(g)], [free[k] for k in range(g)])
            for k in range(k_in):
                blk = jax.lax.dynamic_index_in_dim(ready, src_slot[k], 0, keepdims=False)
                ready_at = jnp.maximum(ready_at, jnp.where(mask[k], pick(ons, blk), 0.0))
            start = ready_at
            end = start + t_i
            out = (start, row_p) if self.memory is True else None
            return (state, (end, dev, bits_i, slot, xf, t_i, act, tb, q, multi)), out

        bound = self.memory == "oom"
        state0 = (jnp.zeros((st["S"], d, b)), jnp.zeros((g, b)), jnp.zeros((d, d, b)),
                  jnp.zeros((d, b)), jnp.zeros((d, b) if bound else (0,)))
        prev0 = (jnp.zeros(b), jnp.full((b,), -1, jnp.int32), jnp.zeros((b,), ubits.dtype),
                 jnp.int32(st["S"] - 1), jnp.zeros((d, d, 1)), jnp.zeros(b), jnp.zeros(()),
                 jnp.zeros(()), jnp.int32(st["Q"]), jnp.zeros((), bool))
        xs = (p, ubits, c["op_time_s"], c["in_slot"], c["in_mask"], c["out_slot"], c["xf"],
              c["out_bytes"], c["single_bytes"], c["multi_index"], c["is_multi"])
        (state, prev), ys = jax.lax.scan(step, (state0, prev0), xs)
        (_, free, link, busy, held), row_last = finish(state, prev)
        # Ends in a group and arrivals on a link are increasing: the last ones are the
        # largest, so the makespan is the largest group end or link arrival.
        step_time = jnp.maximum(jnp.max(free, axis=0), jnp.max(link, axis=(0, 1)))
        busy = busy.T  # [B, D]
        counts = jax.lax.population_count(ubits).astype(jnp.float64)  # [M, B]
        bytes_moved = jnp.sum(jnp.where(c["is_multi"][:, None], 0.0,
                                        counts * c["single_bytes"][:, None]), axis=0)
        bytes_moved = bytes_moved + jnp.sum(multi_bytes, axis=(0, 1))
        if self.memory is True:

            start, rows = ys
            p = p.astype(jnp.int32)
            ready = jnp.concatenate([rows[1:], row_last[None]])  # [M, D, B]
            end = start + jnp.take_along_axis(c["op_time_s"], p, axis=1)
            events = jax.vmap(self._peak_memory, in_axes=(None, 1, 1, 1, 2, 1, 2, 0))(
                c, p, start, end, ready, ubits, multi_bytes, step_time)
            return step_time, busy, bytes_moved, events
        if self.memory == "oom":
            return step_time, busy, bytes_moved, self._peak_bound(c, p, held)
        return step_time, busy, bytes_moved, None

    def _peak_bound(self, c, p, held):
        """An upper bound of each device's peak memory, float64[B, D]: every activation
        and received copy on the device held for the whole step, plus every parameter
        read there (counted once per reading op)."""
        st = self._static
        if st["P"]:
            p_par = p[c["param_op"]].astype(jnp.int32)  # [U, B]
            par = c["param_sizes"][c["param_index"]][:, None]
            held = held + jnp.stack([jnp.sum(jnp.where(p_par == k, par, 0.0), axis=0)
                                     for k in range(st["D"])])
        return held.T  # [B, D]

    def _peak_memory(self, c, p, start, end, ready, ubits, multi_bytes, step_time):
        """Peak memory of one placement: float64[D] (vmapped over the batch)."""
        st = self._static
        m, d = st["M"], st["D"]
        need = ((ubits[:, None] >> jnp.arange(d, dtype=ubits.dtype)[None, :])
                & ubits.dtype.type(1)) > 0  # [M, D]
        nbytes = jnp.where(c["is_multi"][:, None], multi_bytes[c["multi_index"]],
                           jnp.where(need, c["single_bytes"][:, None], 0.0))
        # last_use[i, d]: latest end of a consumer of op i on device d (-inf: none).
        last_use = jnp.full((m, d), -jnp.inf).at[c["pair_src"], p[c["pair_dst"]]].max(
            end[c["pair_dst"]])
        own_last = jnp.take_along_axis(last_use, p[:, None], axis=1)[:, 0]
        sent_last = jnp.max(jnp.where(need, ready, -jnp.inf), axis=1)
        free = jnp.maximum(jnp.maximum(end, own_last), sent_last)
        free = jnp.where(c["is_output"], step_time, free)
        # Received copies: one slot per (producer, candidate destination), see
        # _copy_slots. A slot is live when the producer sends to its device.
        op_ = c["slot_op"]
        rot = c["slot_rot"]
        c_dev = jnp.where(rot > 0, (p[op_] + rot) % d, p[jnp.maximum(c["slot_cons"], 0)])
        prev = c["slot_prev"]
        dup = jnp.any((prev >= 0) & (p[jnp.maximum(prev, 0)] == c_dev[:, None]), axis=1)
        c_need = need[op_, c_dev] & ~dup
        c_alloc = ready[op_, c_dev]
        c_free = last_use[op_, c_dev]
        c_size = jnp.where(c_need, nbytes[op_, c_dev], 0.0)
        i_dev = jnp.concatenate([p, c_dev])
        i_alloc = jnp.concatenate([start, c_alloc])
        i_free = jnp.concatenate([free, c_free])
        i_size = jnp.concatenate([c["out_bytes"], c_size])
        live_iv = (i_free > i_alloc) & (i_size > 0)
        i_size = jnp.where(live_iv, i_size, 0.0)
        i_alloc = jnp.where(live_iv, i_alloc, 0.0)
        i_free = jnp.where(live_iv, i_free, 0.0)
        # Parameters: resident on every device that runs an op reading them, once each.
        if st["P"]:
            resident = jnp.zeros((st["P"], d), bool).at[
                c["param_index"], p[c["param_op"]]].set(True)
            params = jnp.sum(jnp.where(resident, c["param_sizes"][:, None], 0.0), axis=0)
        else:
            params = jnp.zeros(d)
        # One integer sort key per event: the bits of its time (times are >= 0, so their
        # bit patterns sort like the times) and a last bit that puts frees (0) before
        # allocations (1) at equal times, so half-open intervals that touch never overlap.
        def key(time, is_alloc):
            bits = jax.lax.bitcast_convert_type(time, jnp.uint64)
            return (bits << 1) | jnp.uint64(is_alloc)

        return params, key(i_free, 0), key(i_alloc, 1), i_dev.astype(jnp.int8), i_size


def _precompute(graph, inp: SimInputs) -> tuple[dict, dict]:
    """Static sizes (Python ints) and index/cost arrays (numpy) for the traced code."""
    m, d = graph.num_ops, inp.num_devices
    src, dst = graph.src.astype(np.int64), graph.dst.astype(np.int64)
    # In-edges padded to the largest in-degree (at least 1), with a mask.
    indeg = np.bincount(dst, minlength=m) if m else np.zeros(0, np.int64)
    k = max(1, int(indeg.max()) if m else 1)
    in_src = np.zeros((m, k), np.int32)
    in_mask = np.zeros((m, k), bool)
    ptr, order = graph.in_edges
    for i in range(m):
        e = order[ptr[i]:ptr[i + 1]]
        in_src[i, :len(e)] = src[e]
        in_mask[i, :len(e)] = True
    # Distinct tensors (src, edge_output); each is sent to a device at most once.
    if len(src):
        keys = np.stack([src, graph.edge_output.astype(np.int64)], axis=1)
        tensors, edge_tensor = np.unique(keys, axis=0, return_inverse=True)
        edge_tensor = edge_tensor.reshape(-1)
        tensor_bytes = np.zeros(len(tensors))
        np.maximum.at(tensor_bytes, edge_tensor, graph.edge_bytes)
        tensor_op = tensors[:, 0]
        pairs = np.unique(np.stack([src, dst], axis=1), axis=0)
    else:
        edge_tensor = np.zeros(0, np.int64)
        tensor_bytes = np.zeros(0)
        tensor_op = np.zeros(0, np.int64)
        pairs = np.zeros((0, 2), np.int64)
    slots = _copy_slots(graph, d)
    # (tensor, consumer op) pairs: a tensor goes once to each device that consumes it.
    if len(src):
        t_edges = np.unique(np.stack([edge_tensor, dst], axis=1), axis=0)
    else:
        t_edges = np.zeros((0, 2), np.int64)
    # Ops with one tensor: static bytes / bandwidth of their transfer on each link.
    # Ops with several: indices into the per-batch table of _multi_bytes.
    n_tensors = np.bincount(tensor_op, minlength=m) if m else np.zeros(0, np.int64)
    is_multi = n_tensors > 1
    single_bytes = np.zeros(m)
    single_bytes[tensor_op] = tensor_bytes
    single_bytes[is_multi] = 0.0
    multi_ops = np.flatnonzero(is_multi)
    multi_index = np.full(m, len(multi_ops), np.int32)  # the zero row for the others
    multi_index[multi_ops] = np.arange(len(multi_ops))
    bw = inp.bandwidth_bytes_per_s
    with np.errstate(divide="ignore", invalid="ignore"):
        xf = single_bytes[:, None, None] / bw[None]
    xf = np.where(np.isfinite(xf), xf, 0.0)[..., None]  # [M, from, to, 1]
    # Edges of the tensors of multi-tensor ops: (tensor, consumer op).
    mt = np.flatnonzero(is_multi[tensor_op]) if len(tensor_op) else np.zeros(0, np.int64)
    mt_pos = np.full(len(tensor_op), -1, np.int64)
    mt_pos[mt] = np.arange(len(mt))
    me = t_edges[mt_pos[t_edges[:, 0]] >= 0] if len(t_edges) else t_edges
    out_slot, n_slots = _ready_slots(m, src, dst)
    group = inp.exclusive_group
    static = dict(M=m, D=d, G=inp.num_groups, K=k, P=graph.num_params,
                  S=n_slots, G_ID=bool(np.array_equal(group, np.arange(d))),
                  Q=len(multi_ops))
    consts = dict(
        op_time_s=inp.op_time_s, latency=inp.latency_s, bandwidth=bw,
        group=group, in_mask=in_mask, in_slot=out_slot[in_src].astype(np.int32),
        out_slot=out_slot, xf=xf,
        single_bytes=single_bytes, is_multi=is_multi, multi_index=multi_index,
        mt_op=multi_index[tensor_op[mt]].astype(np.int32), mt_owner=tensor_op[mt].astype(np.int32),
        mt_bytes=tensor_bytes[mt], me_tensor=mt_pos[me[:, 0]].astype(np.int32),
        me_dst=me[:, 1].astype(np.int32),
        pair_src=pairs[:, 0].astype(np.int32), pair_dst=pairs[:, 1].astype(np.int32),
        **slots,
        out_bytes=graph.out_bytes, is_output=graph.is_output,
        param_op=graph.param_op, param_index=graph.param_index,
        param_sizes=graph.param_sizes,
    )
    return static, consts


def _sweep_peaks(key_free, key_alloc, dev, size, d: int) -> np.ndarray:
    """Peak of live bytes per device, float64[B, D], from intervals [B, N] (numpy).

    Events are sorted per placement by their key (time, frees first at equal times),
    then stably by device (a radix sort on int8), so each device's events form one
    time-ordered segment; the running sum of +size/-size over a segment is the device's
    live bytes, and its maximum (or 0) the peak. numpy's sorts are several times faster
    than XLA's CPU sort with payloads."""
    bsz, n = dev.shape
    if n == 0:
        return np.zeros((bsz, d))
    keys = np.concatenate([key_free, key_alloc], axis=1)
    order = np.argsort(keys, axis=1)
    ev_dev = np.take_along_axis(np.concatenate([dev, dev], axis=1), order, axis=1)
    delta = np.take_along_axis(np.concatenate([-size, size], axis=1), order, axis=1)
    by_dev = np.argsort(ev_dev, axis=1, kind="stable")
    delta = np.take_along_axis(delta, by_dev, axis=1)
    live = np.cumsum(delta, axis=1)
    counts = np.stack([np.count_nonzero(dev == k, axis=1) for k in range(d)], axis=1) * 2
    ends = np.cumsum(counts, axis=1)  # [B, D], exclusive segment ends
    starts = ends - counts
    # A -inf column after each row keeps every segment start inside the array.
    flat = np.concatenate([live, np.full((bsz, 1), -np.inf)], axis=1).reshape(-1)
    row0 = (np.arange(bsz) * (2 * n + 1))[:, None]
    seg_max = np.maximum.reduceat(flat, (starts + row0).reshape(-1))
    seg_max = seg_max.reshape(bsz, d)
    # Each segment's running sum starts from the sum of the segments before it (zero in
    # exact arithmetic): subtract it, so rounding in other devices' sums cannot leak in.
    base = np.where(starts > 0, np.take_along_axis(live, np.maximum(starts - 1, 0), axis=1),
                    0.0)
    return np.where(counts > 0, np.maximum(seg_max - base, 0.0), 0.0)


def _ready_slots(m: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, int]:
    """Rows of the scan's ``ready`` buffer: op i's row lives from step i + 1 (the scan
    writes it one step late) until its last consumer's step, so rows are reused like
    registers (greedy interval colouring, optimal for intervals). Ops that nobody reads
    share a scratch row, the last one. Returns (slot of each op, number of rows)."""
    last = np.full(m, -1, np.int64)
    np.maximum.at(last, src, dst)
    slot = np.zeros(m, np.int32)
    free: list[int] = []
    active: list[tuple[int, int]] = []  # (last reader, slot)
    n = 0
    for i in range(m):
        while active and active[0][0] <= i:
            heapq.heappush(free, heapq.heappop(active)[1])
        if last[i] > i:
            if free:
                s = heapq.heappop(free)
            else:
                s, n = n, n + 1
            slot[i] = s
            heapq.heappush(active, (int(last[i]), s))
        else:
            slot[i] = -1
    slot[slot < 0] = n
    return slot, n + 1


def _bits_dtype(d: int):
    return jnp.uint8 if d <= 8 else jnp.uint16 if d <= 16 else jnp.uint32 if d <= 32 \
        else jnp.uint64


def _union_bits(c, p, d: int):
    """ubits[i, b]: bit k set when op i sends at least one tensor to device k != p[i, b]."""
    dt = _bits_dtype(d)
    pu = p.astype(dt)
    m = p.shape[0]
    bits = jnp.zeros(p.shape, dt)
    cons_dev = p[c["pair_dst"]]  # [pairs, B]
    for k in range(d):
        has = jnp.zeros(p.shape, jnp.uint8).at[c["pair_src"]].max(
            (cons_dev == k).astype(jnp.uint8)) if m else jnp.zeros(p.shape, jnp.uint8)
        bits = bits | (has.astype(dt) << dt(k))
    return bits & ~(dt(1) << pu)


def _multi_bytes(c, p, d: int, rows: int):
    """float64[rows, D, B]: bytes each multi-tensor op sends to each device (the sum of
    its distinct tensors consumed there, none to its own device); the last row is zeros.
    Byte counts are whole numbers, so the sums are exact in any order."""
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


def _copy_slots(graph, d: int) -> dict:
    """Static slots for received copies, so that memory sorts few empty intervals.

    Op i with ``n`` distinct consumer ops can have a copy on at most ``min(n, D-1)``
    devices. If ``n <= D-1`` slot k stands for the device of its k-th consumer (a slot
    whose device repeats an earlier slot's, listed in ``slot_prev``, or is the
    producer's own, stays empty); otherwise the D-1 slots stand for the devices
    ``(p_i + 1..D-1) % D``.
    """
    op, cons, rot, prev = [], [], [], []
    if graph.num_edges and d > 1:
        pairs = np.unique(np.stack([graph.src, graph.dst], axis=1).astype(np.int64), axis=0)
        starts = np.searchsorted(pairs[:, 0], np.arange(graph.num_ops + 1))
        for i in range(graph.num_ops):
            consumers = pairs[starts[i]:starts[i + 1], 1]
            if len(consumers) == 0:
                continue
            if len(consumers) <= d - 1:
                for k, c in enumerate(consumers):
                    op.append(i)
                    cons.append(c)
                    rot.append(0)
                    prev.append(list(consumers[:k]) + [-1] * (d - 2 - k))
            else:
                for k in range(d - 1):
                    op.append(i)
                    cons.append(-1)
                    rot.append(k + 1)
                    prev.append([-1] * (d - 2))
    w = max(d - 2, 1)
    prev_arr = np.full((len(op), w), -1, np.int32)
    for r, row in enumerate(prev):
        prev_arr[r, :len(row)] = row
    return dict(slot_op=np.asarray(op, np.int32), slot_cons=np.asarray(cons, np.int32),
                slot_rot=np.asarray(rot, np.int32), slot_prev=prev_arr)


def batched_simulator(graph, cost_model, *, memory: bool | str = True) -> Callable:
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

    Returns:
      ``f(placements int[B, M]) -> BatchResult`` (numpy arrays), with the reference
      simulator's semantics. ``f`` compiles once per batch-size bucket (see
      ``batch_bucket``) and reuses the compiled code across calls; ``f.num_traces``
      counts compilations. Raises ``PlacementError`` for placements that do not fit.
    """
    return BatchedSimulator(graph, sim_inputs(graph, cost_model), memory=memory)

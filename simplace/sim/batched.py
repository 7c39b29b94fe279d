"""The batched simulator: the reference semantics in JAX, for many placements at once.

``batched_simulator(graph, cost_model)`` precomputes the graph's index arrays (numpy,
jraph style: in-edges padded to the largest in-degree, with masks) and returns a
function ``f(placements int[B, M]) -> BatchResult`` that runs one ``jax.lax.scan`` over
the ops in graph order, vectorised over the batch. The scan is exact for the same
reason the reference's single pass is: each exclusive group runs its ops in graph
order, and every link is fed by one group, so links are FIFOs in graph order too.

Layout: the batch is the minor (last) axis of every array in the scan, so each step
works on contiguous ``[.., B]`` rows. Before the scan, the bytes each op sends to each
device (``[M, D, B]``) are computed for the whole batch at once. The carry is
  ready[M * D, B]: row ``i * D + d`` is when op i's outputs are available on device d
    (its end on its own device, the transfer's arrival elsewhere); one ``[D, B]`` block
    is written per step with ``dynamic_update_slice`` and inputs are read back with one
    gather through the padded in-edge table;
  group_free[G, B], link_free[D, D, B].
Memory: O(B * M * D) float64 for ``ready`` and the transfer tables (about 160 MB for a
4k-op graph, 5 devices and B = 1024).

Peak memory is computed after the scan, exactly: all live intervals (activations, and
received copies in static per-producer slots) become +size/-size events with one
integer sort key each (the time's bits, then free-before-allocation), are sorted per
placement and swept with a cumulative sum per device. On CPU this sort costs several
times the scan (XLA's CPU sort is slow); ``memory=False`` skips it for searches that
only need step times.

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

    def __init__(self, graph, inputs: SimInputs, *, memory: bool = True):
        self.num_ops = graph.num_ops
        self.num_devices = inputs.num_devices
        self.memory = bool(memory)
        self.num_traces = 0
        self._inputs = inputs
        self._static, consts = _precompute(graph, inputs)
        with jax.enable_x64(True):
            self._consts = jax.device_put(consts)
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
            out = self._jit(self._consts, jnp.asarray(p, dtype=jnp.int32))
            out = jax.device_get(out)
        return BatchResult(*(np.asarray(x)[:b] for x in out))

    # ------------------------------------------------------------------ traced code
    def _impl(self, c, placements):
        self.num_traces += 1  # Python side effect: runs once per trace, not per call
        st = self._static
        m, d, g = st["M"], st["D"], st["G"]
        p = placements.T  # [M, B]: the batch is the minor axis throughout
        b = p.shape[1]
        dev_ids = jnp.arange(d, dtype=jnp.int32)
        op_time = jnp.take_along_axis(c["op_time_s"], p, axis=1)  # [M, B]
        grp = c["group"][p]  # [M, B]

        # Transfer bytes per (op, destination): each distinct tensor consumed on a device
        # is sent once. need[i, d]: op i sends to device d.
        cons_dev = p[c["edge_dst"]]  # [E, B]
        on_dev = cons_dev[:, None, :] == dev_ids[None, :, None]  # [E, D, B]
        t_need = jnp.zeros((st["T"], d, b), jnp.int8).at[c["edge_tensor"]].max(
            on_dev.astype(jnp.int8))
        own = dev_ids[None, :, None] == p[:, None, :]  # [M, D, B]
        need = jnp.zeros((m, d, b), jnp.int8).at[c["tensor_op"]].max(t_need)
        need = (need > 0) & ~own
        nbytes = jnp.zeros((m, d, b)).at[c["tensor_op"]].add(
            t_need * c["tensor_bytes"][:, None, None])
        nbytes = jnp.where(need, nbytes, 0.0)
        bw_row = jnp.moveaxis(c["bandwidth"][p], 2, 1)  # [M, D(to), B]
        # The bytes / bandwidth term, precomputed with the same operands and operation
        # as the reference so that the sums below round identically; -1 = no transfer.
        xfer = jnp.where(need, nbytes / bw_row, -1.0)
        lat_t = c["latency"].T  # [to, from]

        def step(carry, x):
            ready, group_free, link_free = carry
            i, dev, t_i, g_i, xfer_i, src_i, mask_i = x
            on = dev_ids[:, None] == dev[None, :]  # [D, B]
            # ready is [M * D, B]: row i * D + d is op i's availability on device d.
            arrived = jnp.take_along_axis(ready, src_i[:, None] * d + dev[None, :], axis=0)
            inputs_ready = jnp.max(jnp.where(mask_i[:, None], arrived, 0.0), axis=0)
            g_on = jnp.arange(g, dtype=jnp.int32)[:, None] == g_i[None, :]  # [G, B]
            g_free = jnp.max(jnp.where(g_on, group_free, -jnp.inf), axis=0)
            start = jnp.maximum(g_free, inputs_ready)
            end = start + t_i
            group_free = jnp.where(g_on, end[None], group_free)
            l_free = jnp.max(jnp.where(on[:, None, :], link_free, -jnp.inf), axis=0)  # [to, B]
            sends = xfer_i >= 0
            lat = jnp.take(lat_t, dev, axis=1)  # [to, B]
            arrive = jnp.maximum(end[None], l_free) + lat + xfer_i
            arrive = jnp.where(sends, arrive, l_free)
            link_free = jnp.where(on[:, None, :], arrive[None], link_free)
            row = jnp.where(on, end[None], arrive)
            ready = jax.lax.dynamic_update_slice(ready, row, (i * d, jnp.zeros((), i.dtype)))
            return (ready, group_free, link_free), start

        init = (jnp.zeros((m * d, b)), jnp.zeros((g, b)), jnp.zeros((d, d, b)))
        xs = (jnp.arange(m, dtype=jnp.int32), p, op_time, grp, xfer, c["in_src"],
              c["in_mask"])
        (ready, _, _), start = jax.lax.scan(step, init, xs)
        ready = ready.reshape(m, d, b)
        end = start + op_time  # the same addition as in the scan: bitwise equal
        arrival_max = jnp.max(jnp.where(need, ready, 0.0), axis=(0, 1))
        step_time = jnp.maximum(jnp.max(end, axis=0), arrival_max)
        busy = jnp.stack([jnp.sum(jnp.where(p == k, op_time, 0.0), axis=0)
                          for k in range(d)], axis=1)  # [B, D]
        bytes_moved = jnp.sum(nbytes, axis=(0, 1))
        if self.memory:
            peak = jax.vmap(self._peak_memory, in_axes=(None, 1, 1, 1, 2, 2, 2, 0))(
                c, p, start, end, ready, need, nbytes, step_time)
            oom = jnp.any(peak > c["memory_bytes"][None, :], axis=1)
        else:
            peak = jnp.full((b, d), jnp.nan)
            oom = jnp.zeros(b, dtype=bool)
        return step_time, peak, oom, busy, bytes_moved

    def _peak_memory(self, c, p, start, end, ready, need, nbytes, step_time):
        """Peak memory of one placement: float64[D] (vmapped over the batch)."""
        st = self._static
        m, d = st["M"], st["D"]
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
        # One integer sort key per event: the bits of its time (times are >= 0, so their
        # bit patterns sort like the times) and a last bit that puts frees (0) before
        # allocations (1) at equal times, so half-open intervals that touch never overlap.
        def key(time, is_alloc):
            bits = jax.lax.bitcast_convert_type(time, jnp.uint64)
            return (bits << 1) | jnp.uint64(is_alloc)

        ev_key = jnp.concatenate([key(i_free, 0), key(i_alloc, 1)])
        ev_dev = jnp.concatenate([i_dev, i_dev])
        ev_delta = jnp.concatenate([-i_size, i_size])
        _, ev_dev, ev_delta = jax.lax.sort((ev_key, ev_dev, ev_delta), num_keys=1)
        peak_live = jnp.stack([
            jnp.max(jnp.cumsum(jnp.where(ev_dev == k, ev_delta, 0.0)), initial=0.0)
            for k in range(d)])
        # Parameters: resident on every device that runs an op reading them, once each.
        if st["P"]:
            resident = jnp.zeros((st["P"], d), bool).at[
                c["param_index"], p[c["param_op"]]].set(True)
            params = jnp.sum(jnp.where(resident, c["param_sizes"][:, None], 0.0), axis=0)
        else:
            params = jnp.zeros(d)
        return params + peak_live


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
    static = dict(M=m, D=d, G=inp.num_groups, K=k, T=len(tensor_op), P=graph.num_params)
    consts = dict(
        op_time_s=inp.op_time_s, latency=inp.latency_s, bandwidth=inp.bandwidth_bytes_per_s,
        memory_bytes=inp.memory_bytes, group=inp.exclusive_group,
        in_src=in_src, in_mask=in_mask,
        edge_dst=dst.astype(np.int32), edge_tensor=edge_tensor.astype(np.int32),
        tensor_op=tensor_op.astype(np.int32), tensor_bytes=tensor_bytes,
        pair_src=pairs[:, 0].astype(np.int32), pair_dst=pairs[:, 1].astype(np.int32),
        **slots,
        out_bytes=graph.out_bytes, is_output=graph.is_output,
        param_op=graph.param_op, param_index=graph.param_index,
        param_sizes=graph.param_sizes,
    )
    return static, consts


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


def batched_simulator(graph, cost_model, *, memory: bool = True) -> Callable:
    """A fast simulator of many placements of ``graph`` on one machine.

    Args:
      graph: an ``OpGraph``.
      cost_model: a ``CostModel`` (or its interface) or a ``SimInputs``.
      memory: compute peak memory and OOM (the post-scan sort costs about as much as
        the scan on CPU); with False, ``peak_memory_bytes`` is NaN and ``oom`` False.

    Returns:
      ``f(placements int[B, M]) -> BatchResult`` (numpy arrays), with the reference
      simulator's semantics. ``f`` compiles once per batch-size bucket (see
      ``batch_bucket``) and reuses the compiled code across calls; ``f.num_traces``
      counts compilations. Raises ``PlacementError`` for placements that do not fit.
    """
    return BatchedSimulator(graph, sim_inputs(graph, cost_model), memory=memory)

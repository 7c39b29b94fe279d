"""Peak memory of the JAX scan simulator: the exact peaks from the live intervals of a
batch (built batch-minor with static indices, sorted by one key per event, swept in
numpy) and the upper bound that ``memory="oom"`` screens placements with.

The live intervals (each op's activation, and one received copy per pair that sends)
are built batch-minor with static indices only: the free times are running maxima
along each producer's chain of pairs, the resident parameters a running OR along each
parameter's chain of uses (``_chain``). Each event gets one uint64 sort key holding its
device, its time (the bit pattern, less the batch's smallest) and free-before-allocation
(``_event_keys``), so one numpy argsort per placement orders events by device and time;
``_sweep_peaks`` sums the sizes in that order, in blocks of placements on a thread per
core.
"""

from __future__ import annotations

import concurrent.futures
import os

import jax
import jax.numpy as jnp
import numpy as np

from simplace.sim._scan_ops import _bits_dtype, _pick, _rows

# Ranks of a chain run one block at a time, later ones by doubling (see _chain).
_MAX_RANK_BLOCKS = 8


def _peak_bound(st, c, p, ubits, multi_bytes):
    """An upper bound of each device's peak memory, float64[B, D]: every activation
    and received copy on the device held for the whole step, plus every parameter
    read there (counted once per reading op). Summed by scans over the ops and the
    parameter uses: XLA:CPU's reductions over the leading axis are far slower."""
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


def _memory_events(st, c, p, seg_start, seg_end, arr, send, multi_bytes, step_time):
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

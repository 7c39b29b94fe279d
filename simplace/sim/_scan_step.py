"""The step of the JAX scan simulator: one slice (an op's pairs, at most ``K``) for
every placement of the batch, in the reference's order: the slice's segment opens or
goes on, its transfers start once the host, their producers' segments and their links
allow, and the segment closes at the op's last slice (written into the tables at the
start of the next step, by ``finish``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simplace.sim._scan_facts import Facts
from simplace.sim._scan_ops import _barrier, _barrier_many, _info_dtype, _pick


def _row(a, i):
    return jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False)


class ScanStep:
    """``step(carry, x)`` for ``jax.lax.scan``, and ``finish`` (the closing of a slice),
    with the machine's constants and the batch's per-op and per-pair rows (``Facts``)
    bound at trace time.

    The carry is ``(state, link, vals, info)``: ``state = (etab, free, busy)`` (the
    segment-end table [E, B], each exclusive group's last segment end [G, B], each
    device's busy time [D, B]), ``link[to, from, B]`` (when each link is free), ``vals``
    (host clock, start bound, work, bytes moved, then the pool's work and the unfused
    bookkeeping where the machine has them: one [B] buffer each) and the previous
    slice's packed rows ``info`` [1 + K, B]."""

    def __init__(self, st: dict, c: dict, facts: Facts, memory):
        self.st, self.c, self.memory = st, c, memory
        self.d, self.g, self.k_w, self.w = st["D"], st["G"], st["K"], st["W"]
        b = self.b = facts.p.shape[1]
        it = self.it = _info_dtype(st)
        self.sh, self.cb = it(st["SH"]), it(st["CB"])
        self.low = it((1 << st["SH"]) - 1)
        self.dev_ids = jnp.arange(self.d, dtype=it)
        self.lo_f = c["lowest"]  # -inf and the int type's lowest value: see _barrier
        self.lo_i = c["lowest_i"].astype(it)
        self.po, self.pc = facts.po, facts.pc
        self.multi_bytes, self.last_of = facts.multi_bytes, facts.last_of
        self.launch = [float(v) for v in st["launch"]]
        self.dispatch = [float(v) for v in st["dispatch"]]
        self.has_pool, self.has_uf = st["has_pool"], st["has_op_unfused"]
        self.pool_min = [float(v) for v in st["pool_min"]]
        self.pool_launch = [float(v) for v in st["pool_launch"]]
        # Rows of the carried values past h, R, work, moved: only those the machine needs.
        self.iv = {n: 4 + k for k, n in enumerate(
            (["pwork"] if self.has_pool else []) + (["seg_a", "fus"] if self.has_uf else []))}
        self.flat_ids = jnp.arange(b, dtype=jnp.int32 if st["E"] * b < 2**31 else jnp.int64)
        self.rows_w = jnp.asarray(self.w - 1 - np.arange(self.w), it)[:, None]  # [W, 1]

    def init_carry(self, etab0):
        """The carry before the first slice (``etab0``: a table to reuse, or None)."""
        d, g, b, f64 = self.d, self.g, self.b, jnp.float64
        etab0 = jnp.zeros((self.st["E"], b), f64) if etab0 is None else etab0
        state0 = (etab0, jnp.zeros((g, b), f64), jnp.zeros((d, b), f64))
        # link[to, from]: when the link is free; -inf before its first copy, so that the
        # makespan counts a latency only for links that carried something.
        return (state0, jnp.full((d, d, b), -jnp.inf, f64),
                tuple(jnp.zeros(b, f64) for _ in range(len(self.iv) + 4)),
                jnp.zeros((1 + self.k_w, b), self.it))

    def seg_times(self, vals, ons):
        """The segment's start and end (valid when it closes) from the carry."""
        start = jnp.maximum(vals[1], vals[0])
        work = vals[2]
        if self.has_pool:  # the pool's launch, when the segment's pool work reaches the min
            pool = jnp.where(vals[self.iv["pwork"]] >= _pick(ons, self.pool_min),
                             _pick(ons, self.pool_launch), 0.0)
            work = (_pick(ons, self.launch) + pool) + work
        return start, start + work

    def finish(self, state, vals, info_p, blk_p):
        """Close the previous slice: if its segment closed, write its end (group free
        time, busy time, etab block). Its values come through the carry, so that
        XLA updates the tables in place instead of fusing this step's dynamic reads
        into their updates."""
        st, d, g, w, it, sh = self.st, self.d, self.g, self.w, self.it, self.sh
        etab, free, busy = state
        dev_p = info_p[0] & self.low
        flags_p = info_p[0] >> sh
        last_p = (flags_p & it(2)) > 0
        on = self.dev_ids[:, None] == dev_p[None, :]  # [D, B]
        start_p, end_p = self.seg_times(vals, [dev_p == k for k in range(d)])
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
        fill = last_p[None, :] & ((flags_p >> it(2))[None, :] > self.rows_w)
        etab = jax.lax.dynamic_update_slice_in_dim(
            etab, jnp.where(fill, end_p[None, :], old), blk_p, 0)
        return etab, free, busy

    def __call__(self, carry, x):
        st, d, g, k_w, it, sh = self.st, self.d, self.g, self.k_w, self.it, self.sh
        iv, has_pool, has_uf, lo_f = self.iv, self.has_pool, self.has_uf, self.lo_f
        state, link, vals, info_p = carry
        # This slice's constants, read once: ints (op, flag mask, previous slice's
        # op, far, then per pair: pair, etab row of its producer, producer,
        # multi-tensor row) and floats (op times, op pool work and unfused costs
        # on each device, then per pair: its bytes and, per link class, transfer
        # time).
        xi, xf = _barrier(x[0], self.c["lowest_i"]), _barrier(x[1], lo_f)
        op, smask, blk_p, far_i = xi[0], xi[1].astype(it), xi[2], x[0][3] > 0
        first_slice = (xi[1] & 1) > 0
        pq = xi[4:]
        h, big_r, big_c, moved = vals[0], vals[1], vals[2], vals[3]
        pwork = vals[iv["pwork"]] if has_pool else None
        seg_a = vals[iv["seg_a"]] if has_uf else None
        fus = vals[iv["fus"]] if has_uf else None
        etab, free, _ = state = self.finish(state, vals, info_p, blk_p)
        # This slice's rows of the per-op and per-pair tables, read once (flags
        # masked to the slice: only an op's first slice opens, only its last closes).
        info = _barrier(jnp.stack(
            [_row(self.po, op) & ((smask << sh) | self.low)]
            + [_row(self.pc, pq[k]) for k in range(k_w)]), self.lo_i)
        dev = info[0] & self.low
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
        big_c, pwork, seg_a, fus = self._work(xf, op, pq, ons, is_new, first_slice,
                                              big_c, pwork, seg_a, fus)
        # The link column into each placement's device: lcol[from, B].
        lcol = _barrier(_pick(ons, [link[t] for t in range(d)]), lo_f)
        ends = self._producer_ends(etab, pq, info, far_i)
        h, big_r, moved, arrivals, sends, froms, occs = self._transfers(
            xf, pq, info, ons, lcol, ends, h, big_r, moved)
        h = jnp.where(is_last, h + _pick(ons, self.dispatch), h)
        rows = [h, big_r, big_c, moved] + ([pwork] if has_pool else []) + (
            [seg_a, fus] if has_uf else [])
        # Everything the step carries on, computed in one kernel (see _barrier_many).
        many = _barrier_many(rows + occs + arrivals, lo_f)
        rows, occs = many[:len(rows)], many[len(rows):len(rows) + k_w]
        arrivals = many[len(rows) + k_w:]
        # Write the column back (after this step's reads of link: XLA updates link
        # in place).
        for k in range(k_w):
            lcol = jnp.where(
                (self.dev_ids[:, None] == froms[k][None, :]) & sends[k][None, :],
                occs[k][None, :], lcol)
        lcol = _barrier(lcol, lo_f)  # read D times below
        link = jnp.where((self.dev_ids[:, None] == dev[None, :])[:, None, :], lcol[None],
                         link)
        vals = tuple(rows)  # separate buffers: a stack would copy them
        out = None
        if self.memory is True:
            start, end = self.seg_times(vals, ons)
            out = (start, end, tuple(arrivals))
        return (state, link, vals, info), out

    def _work(self, xf, op, pq, ons, is_new, first_slice, big_c, pwork, seg_a, fus):
        """The segment's work in the reference's order: launch (plus the pool's launch,
        added at the end when there can be one), then each op's cost and, when none of
        its inputs comes from the segment, its unfused cost. Returns the carried
        ``(work, pool work, first op, fused)``."""
        d, k_w, f64 = self.d, self.k_w, jnp.float64
        big_c = jnp.where(is_new, 0.0 if self.has_pool else _pick(ons, self.launch), big_c)
        big_c = big_c + _pick(ons, [xf[k] for k in range(d)])
        if self.has_pool:  # the segment's pool work so far, added in op order
            pwork = jnp.where(is_new, 0.0, pwork) + _pick(ons, [xf[d + k]
                                                              for k in range(d)])
        if self.has_uf:
            pq_valid = [pq[k] < self.st["NP"] for k in range(k_w)]
            seg_a = jnp.where(is_new, op.astype(f64), seg_a)
            fus = jnp.where(first_slice, False, fus > 0)
            for k in range(k_w):  # an input from the segment itself: the op fuses
                fus = fus | ((pq[2 * k_w + k].astype(f64) >= seg_a) & pq_valid[k])
            big_c = big_c + jnp.where(fus, 0.0, _pick(ons, [xf[2 * d + k]
                                                            for k in range(d)]))
            fus = fus.astype(f64)
        return big_c, pwork, seg_a, fus

    def _producer_ends(self, etab, pq, info, far_i):
        """The producers' segment ends [K, B]: row j of etab, or row j + W when j's
        segment goes on W ops or more past it; gathered at last_of if 2W or more (inside
        a cond: XLA:CPU's gathers cost ~4 ns per element, measured on one core)."""
        k_w, w, b = self.k_w, self.w, self.b

        def by_gather():
            flat = etab.reshape(-1)
            out = []
            for k in range(k_w):
                lo = _row(self.last_of, pq[k + 2 * k_w])
                ix = (lo.astype(self.flat_ids.dtype) + (w - 1)) * b + self.flat_ids
                out.append(flat.at[ix].get(mode="promise_in_bounds"))
            return jnp.stack(out)

        erows = _barrier(jnp.stack([_row(etab, pq[k_w + k] + s_ * w) for s_ in (0, 1)
                                    for k in range(k_w)]), self.lo_f)
        return jax.lax.cond(far_i, by_gather, lambda: jnp.stack(
            [jnp.where((info[1 + k] >> self.cb) > 0, erows[k_w + k], erows[k])
             for k in range(k_w)]))

    def _transfers(self, xf, pq, info, ons, lcol, ends, h, big_r, moved):
        """The slice's transfers, in pair order: each starts once the host has issued it,
        its producer's segment has ended and its link is free. Returns the host clock,
        start bound and bytes moved after them, and per pair its arrival, whether it
        sends, from which device and until when its link is busy."""
        st, d, k_w, n_cls, it = self.st, self.d, self.k_w, self.st["NC"], self.it
        low, sh = self.low, self.sh
        if self.st["TABLE"]:
            # Per-device columns of the link constants: col[from] (to: the device).
            cols = {name: [_pick(ons, [float(st[name][f][t]) for t in range(d)])
                           for f in range(d)] for name in ("lat", "put", "bw", "wait")}
        arrivals, sends, froms, occs = [], [], [], []
        for k in range(k_w):
            ck = (info[1 + k] >> sh) & it((1 << (st["CB"] - st["SH"])) - 1)
            fk = info[1 + k] & low
            fms = [fk == f for f in range(d)]
            snd = ck != 0
            base = 3 * d + k * (n_cls + 2)
            nb = xf[base]
            if st["TABLE"]:
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
                nb = jnp.where(mk, _pick(ons, [self.multi_bytes[pq[3 * k_w + k], q]
                                               for q in range(d)]), nb)
                t_x = jnp.where(mk, nb / bw, t_x)
            moved = moved + jnp.where(snd, nb, 0.0)
            link_free = _pick(fms, [lcol[f] for f in range(d)])
            for k2 in range(k):  # an earlier transfer of this slice on the same link
                link_free = jnp.where(sends[k2] & (froms[k2] == fk), occs[k2], link_free)
            t0 = jnp.maximum(jnp.maximum(h, ends[k]), link_free)
            arrive = (t0 + lat) + t_x
            if wt is not None:  # put_waits: the host waits for the copy to arrive
                h = jnp.where(snd & (wt > 0), jnp.maximum(h, arrive), h)
            occs.append(t0 + t_x)  # the link is busy for the bytes; latency overlaps
            big_r = jnp.where(snd, jnp.maximum(big_r, arrive), big_r)
            arrivals.append(arrive)
            sends.append(snd)
            froms.append(fk)
        return h, big_r, moved, arrivals, sends, froms, occs

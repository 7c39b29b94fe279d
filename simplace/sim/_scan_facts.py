"""What the placements alone decide, computed for a whole batch before the JAX scan
(vectorised over ``[M, B]``, the batch minor): where segments open and close and how
far each runs back and on, which pairs send a transfer and on which link class, the
bytes multi-tensor ops send to each device, and (when needed) each op's segment's last
op."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from simplace.sim._scan_ops import _bits_dtype, _info_dtype, _rows


class Facts(NamedTuple):
    """The placement-only facts of a batch of B placements (see ``placement_facts``).

    p: int8 (or int32) [M, B], each op's device.
    new, last: bool[M, B], the op opens / closes its segment.
    po: [M, B] packed per op: device | flags << SH (1 opens, 2 closes, 4 * run: how many
      ops of its segment end at it, at most W).
    pc: [P + 1, B] packed per pair: producer's device | link class << SH | far1 << CB.
    send: bool[P + 1, B], the pair sends a transfer (last row: the padding pair).
    ubits: per op, the devices it sends to as bits (None unless ``memory == "oom"``).
    multi_bytes: float64[Q + 1, D, B], bytes each multi-tensor op sends to each device.
    x_far: bool[S], slices reading a producer whose segment goes on 2W ops or more.
    last_of: int32[M, B], each op's segment's last op (zeros when no slice needs it).
    """

    p: jax.Array
    new: jax.Array
    last: jax.Array
    po: jax.Array
    pc: jax.Array
    send: jax.Array
    ubits: jax.Array | None
    multi_bytes: jax.Array
    x_far: jax.Array
    last_of: jax.Array


def placement_facts(st: dict, c: dict, placements, memory) -> Facts:
    """The ``Facts`` of ``placements`` int[B, M], from the static sizes ``st`` and the
    tables ``c`` of ``_scan_tables._precompute``."""
    m, d, w = st["M"], st["D"], st["W"]
    b = placements.shape[0]
    it = _info_dtype(st)  # the packed rows' type
    sh, cb = it(st["SH"]), it(st["CB"])
    lo_f = c["lowest"]  # -inf, an argument: see _barrier
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
    return Facts(p, new, last, po, pc, send, ubits, multi_bytes, x_far, last_of)


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

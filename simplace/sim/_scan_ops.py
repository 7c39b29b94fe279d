"""Small pieces of the JAX scan simulator's traced code, each shaped by what XLA:CPU
does fast: selects instead of gathers, in-bounds gathers, barriers that make a shared
value one buffer, sums over columns."""

from __future__ import annotations

import jax
import jax.numpy as jnp


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


def _column_sums(arrays):
    """int32[B] per bool array [N, B]: how many rows are True in each column."""
    return [jnp.sum(a, axis=0, dtype=jnp.int32) for a in arrays]


def _bits_dtype(d: int):
    return jnp.uint8 if d <= 8 else jnp.uint16 if d <= 16 else jnp.uint32 if d <= 32 \
        else jnp.uint64


def _info_dtype(st):
    """The int type of the packed rows: device | flags (6 bits) or link class << SH."""
    return jnp.int16 if max(st["SH"] + 6, st["CB"] + 1) <= 15 else jnp.int32

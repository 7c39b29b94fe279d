"""Finding devices that share compute (virtual CPU devices of one socket).

The same work is timed on two devices alone and on both at once. Devices that run in
parallel finish both in about the time of one; devices that share compute take about
the sum. ``overlap`` measures where a pair sits between the two.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import networkx as nx

from simplace.hardware.timing import Timing, time_fn

# overlap = (alone_a + alone_b - together) / min(alone_a, alone_b): 1 for devices that
# run fully in parallel, 0 for devices that take turns. Halfway decides.
EXCLUSIVE_BELOW = 0.5


def make_work(size: int, steps: int):
    """A jitted chain of ``steps`` ``size`` x ``size`` matmuls (with tanh, so nothing
    folds away): enough work to use every core a device can use."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def work(a):
        return jax.lax.fori_loop(0, steps, lambda _, c: jnp.tanh(c @ a), a)

    return work, jnp.full((size, size), 0.01, dtype=jnp.float32)


def time_pair(work, x, dev_a, dev_b, **harness_kw) -> tuple[Timing, Timing, Timing]:
    """Timings of ``work`` on ``dev_a`` alone, on ``dev_b`` alone, and on both at once
    (dispatched together, JAX dispatch being asynchronous, then both waited for)."""
    import jax

    xa, xb = jax.device_put(x, dev_a), jax.device_put(x, dev_b)
    alone_a = time_fn(work, xa, **harness_kw)
    alone_b = time_fn(work, xb, **harness_kw)
    together = time_fn(lambda: (work(xa), work(xb)), **harness_kw)
    return alone_a, alone_b, together


def overlap(alone_a_s: float, alone_b_s: float, together_s: float) -> float:
    """How much two devices ran in parallel: 1 fully, 0 not at all (see module doc)."""
    return (alone_a_s + alone_b_s - together_s) / max(min(alone_a_s, alone_b_s), 1e-12)


def exclusive_groups(devices: Sequence[str], pairs: Mapping[tuple[str, str], float]
                     ) -> dict[str, str]:
    """Group name of each device from pair overlaps: devices joined by pairs with
    ``overlap < EXCLUSIVE_BELOW`` form one group (connected components), named after its
    first device (``shared:cpu:0``); a device alone keeps its own name."""
    g = nx.Graph()
    g.add_nodes_from(devices)
    g.add_edges_from(pair for pair, ov in pairs.items()
                     if pair[0] in g and pair[1] in g and ov < EXCLUSIVE_BELOW)
    position: dict[str, int] = {}
    for k, d in enumerate(devices):
        position.setdefault(d, k)
    name = {}
    for members in nx.connected_components(g):
        first = min(members, key=position.__getitem__)
        for d in members:
            name[d] = f"shared:{first}" if len(members) > 1 else d
    return {d: name[d] for d in devices}

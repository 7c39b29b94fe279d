"""Finding devices that share compute (virtual CPU devices of one socket).

The same work is timed on two devices alone and on both at once. Devices that run in
parallel finish both in about the time of one; devices that share compute take about
the sum. ``overlap`` measures where a pair sits between the two.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simplace.calibrate.harness import Timing, time_fn

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
    parent = {d: d for d in devices}

    def root(d):
        while parent[d] != d:
            parent[d] = parent[parent[d]]
            d = parent[d]
        return d

    for (a, b), ov in sorted(pairs.items()):
        if a in parent and b in parent and ov < EXCLUSIVE_BELOW:
            ra, rb = root(a), root(b)
            if ra != rb:
                # keep the root the earlier device so the group is named after it
                first, second = sorted((ra, rb), key=list(devices).index)
                parent[second] = first
    members: dict[str, list[str]] = {}
    for d in devices:
        members.setdefault(root(d), []).append(d)
    return {d: (f"shared:{root(d)}" if len(members[root(d)]) > 1 else d) for d in devices}

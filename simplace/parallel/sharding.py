"""Strategies as JAX shardings: one device ``Mesh`` and a ``PartitionSpec`` per tensor.

The p devices form a mesh with one axis per prime factor of p (``d0, d1, ...``; 8 ->
2 x 2 x 2), so every configuration (split factors dividing p, product dividing p) is a
choice of mesh axes per split dimension: the batch dimension takes axes first, then the
others in order. A parameter's spec follows the layer that reads it (the first such
layer in the graph's order when several do); an activation's, the layer that produces
it. A tensor axis whose size the split does not divide stays unsplit.

``shard`` jits a model function with the parameters and inputs placed by those specs
(``in_shardings``) and, for flax models, constrains the output of every module whose
path is a layer (``jax.lax.with_sharding_constraint`` through
``flax.linen.intercept_methods``) where the output has the layer's shape; XLA's SPMD
partitioner inserts the communication. Sharding changes where data lives, never the
result: the sharded function computes what the unsharded one does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported where a spec is made: importing JAX costs every command
    from jax.sharding import PartitionSpec

__all__ = ["config_axes", "mesh_axes", "tensor_spec"]


def _primes(n: int) -> list[int]:
    out, f = [], 2
    while f * f <= n:
        while n % f == 0:
            out.append(f)
            n //= f
        f += 1
    if n > 1:
        out.append(n)
    return out


def mesh_axes(p: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(mesh shape, axis names) of ``p`` devices: one axis per prime factor."""
    shape = tuple(_primes(p)) or (1,)
    return shape, tuple(f"d{k}" for k in range(len(shape)))


def config_axes(config, batch_dim: int, p: int) -> list[tuple[str, ...]]:
    """Per layer dim, the mesh axes it is split over."""
    shape, names = mesh_axes(p)
    free = list(range(len(shape)))
    out: list[tuple[str, ...]] = [() for _ in config]
    order = ([batch_dim] if batch_dim >= 0 else []) + [
        d for d in range(len(config)) if d != batch_dim]
    for d in order:
        f = int(config[d])
        if f <= 1:
            continue
        axes = []
        for q in _primes(f):
            k = next((k for k in free if shape[k] == q), None)
            if k is None:  # cannot happen for factors dividing p; replicate then
                axes = []
                break
            free.remove(k)
            axes.append(names[k])
        out[d] = tuple(axes)
    return out


def tensor_spec(shape, axis_dims, dim_axes, p: int) -> PartitionSpec:
    """The PartitionSpec of a tensor whose axes follow ``axis_dims`` (layer dims)."""
    from jax.sharding import PartitionSpec

    mshape, names = mesh_axes(p)
    size = dict(zip(names, mshape, strict=True))
    entries = []
    used: set[int] = set()
    for n, d in zip(shape, axis_dims, strict=True):
        axes = dim_axes[d] if d >= 0 and d not in used else ()
        if axes and n % int(np.prod([size[a] for a in axes])) == 0:
            used.add(d)
            entries.append(axes[0] if len(axes) == 1 else tuple(axes))
        else:
            entries.append(None)
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)

"""Configurations: one split factor per dimension of a layer's iteration space.

A configuration of a layer on p devices is a tuple of split factors, one per dimension,
whose product is at most p (with ``exact=True``, exactly p wherever the layer's sizes
allow it; otherwise the largest product they allow). Factors are divisors of p (so the
devices form a mesh in which every split is a set of mesh axes), at most the dimension's
size, and leave at least ``min_part_elements`` elements per part (the cut-off that drops
splits too fine to pay off). Unsplittable dimensions keep factor 1.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["divisors", "enumerate_configs"]


def divisors(p: int) -> list[int]:
    """The divisors of ``p`` in increasing order."""
    return [d for d in range(1, p + 1) if p % d == 0]


def enumerate_configs(sizes, splittable, p: int, *, exact: bool = True,
                      min_part_elements: int = 1) -> np.ndarray:
    """int64[C, len(sizes)]: the configurations of a layer, in lexicographic order.

    Always at least one row (all ones when nothing can be split).
    """
    sizes = [int(s) for s in sizes]
    divs = divisors(p)
    choices = []
    for n, ok in zip(sizes, splittable, strict=True):
        if not ok:
            choices.append([1])
            continue
        # ceil(n / f) >= min_part_elements and f <= n: no empty parts
        choices.append([f for f in divs if f <= n and math.ceil(n / f) >= min_part_elements])
    rows: list[tuple[int, ...]] = []

    def rec(k: int, prod: int, acc: list[int]):
        if k == len(sizes):
            rows.append(tuple(acc))
            return
        for f in choices[k]:
            q = prod * f
            if p % q:
                continue
            acc.append(f)
            rec(k + 1, q, acc)
            acc.pop()

    rec(0, 1, [])
    arr = np.array(rows, dtype=np.int64).reshape(len(rows), len(sizes))
    if exact and len(arr):
        prods = arr.prod(axis=1) if arr.shape[1] else np.ones(len(arr), dtype=np.int64)
        arr = arr[prods == prods.max()]
    if not len(arr):
        arr = np.ones((1, len(sizes)), dtype=np.int64)
    return arr

"""Exact search over configurations: vertex ordering and dynamic programming.

The problem: vertices ``v`` with a choice ``x_v`` among ``n_v`` configurations, a cost
``unary[v][x_v]`` per vertex and ``pair[(u, v)][x_u, x_v]`` per edge; minimise the sum.

``vertex_order`` is PaSE's GENERATESEQ: repeatedly take the vertex whose *dependent set*
(its current neighbours) is smallest, ties to the smaller table then the lower index, and
merge its neighbour sets (its neighbours become pairwise adjacent). ``solve`` runs the
dynamic programming along that order (bucket elimination): eliminating ``v`` builds the
table ``min over x_v`` of every cost term touching ``v``, indexed by the configurations
of its dependent set, and remembers the argmin; a backward pass reads the optimum off.
Exact under the cost model. Its memory and time are the product of the configuration
counts of ``v`` and its dependent set; ``plan`` computes that before any work, and
``solve`` raises ``SearchTooLargeError`` when a table would exceed ``max_table_entries``
rather than approximating.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from simplace.parallel.layers import ParallelizeError

__all__ = ["Plan", "SearchTooLargeError", "brute_force", "plan", "solve", "total_cost",
           "vertex_order"]


class SearchTooLargeError(ParallelizeError):
    """The dynamic programming would need a table larger than allowed."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """order: vertices in elimination order; dependent: the dependent set of each
    (as eliminated); table_entries: the joint table size of each elimination step
    (configurations of the vertex times those of its dependent set)."""

    order: tuple[int, ...]
    dependent: tuple[tuple[int, ...], ...]
    table_entries: tuple[int, ...]

    @property
    def max_dependent(self) -> int:
        """Size of the largest dependent set (0 for no vertices)."""
        return max((len(d) for d in self.dependent), default=0)

    @property
    def max_table_entries(self) -> int:
        """Size of the largest table of any elimination step (0 for no vertices)."""
        return max(self.table_entries, default=0)


def vertex_order(neighbours: list[set[int]], sizes=None) -> Plan:
    """GENERATESEQ on an undirected graph given as neighbour sets (not modified)."""
    n = len(neighbours)
    sizes = [1] * n if sizes is None else [int(s) for s in sizes]
    nb = [set(x) - {i} for i, x in enumerate(neighbours)]
    alive = set(range(n))
    order, dep, tables = [], [], []
    while alive:
        def key(v):
            return (len(nb[v]), sizes[v] * math.prod(sizes[u] for u in nb[v]), v)
        v = min(alive, key=key)
        d = tuple(sorted(nb[v]))
        order.append(v)
        dep.append(d)
        tables.append(sizes[v] * math.prod(sizes[u] for u in d))
        for u in d:
            nb[u].discard(v)
            nb[u].update(x for x in d if x != u)
        alive.discard(v)
        nb[v] = set()
    return Plan(tuple(order), tuple(dep), tuple(tables))


def plan(n_configs: list[int], pair_keys, max_table_entries: int) -> Plan:
    """The elimination order (``vertex_order``) of vertices with ``n_configs`` configurations and
    edges ``pair_keys``; raises ``SearchTooLargeError`` when a table would exceed
    ``max_table_entries``."""
    nb = [set() for _ in n_configs]
    for u, v in pair_keys:
        nb[u].add(v)
        nb[v].add(u)
    pl = vertex_order(nb, n_configs)
    if pl.max_table_entries > max_table_entries:
        k = int(np.argmax(pl.table_entries))
        raise SearchTooLargeError(
            f"The exact search needs a table of {pl.table_entries[k]:,} entries (vertex "
            f"{pl.order[k]} with a dependent set of {len(pl.dependent[k])} vertices "
            f"{list(pl.dependent[k])}), more than max_table_entries={max_table_entries:,}. "
            "Use fewer devices, exact=True (products of exactly p), a larger "
            "min_part_elements, or raise max_table_entries if the memory is there.")
    return pl


def _expand(arr: np.ndarray, vars_: tuple[int, ...], target: tuple[int, ...]) -> np.ndarray:
    """Broadcast a factor over ``vars_`` (sorted) to the axes of ``target`` (sorted)."""
    shape = [1] * len(target)
    pos = {v: k for k, v in enumerate(target)}
    for v, n in zip(vars_, arr.shape, strict=True):
        shape[pos[v]] = n
    return arr.reshape(shape)


def solve(unary: list[np.ndarray], pair: dict[tuple[int, int], np.ndarray], *,
          max_table_entries: int = 1 << 24) -> tuple[np.ndarray, float, Plan]:
    """``(choice int64[n], optimal cost, plan)`` minimising
    ``sum unary[v][x_v] + sum pair[(u, v)][x_u, x_v]``. Exact."""
    n = len(unary)
    if n == 0:
        return np.zeros(0, dtype=np.int64), 0.0, Plan((), (), ())
    sizes = [len(u) for u in unary]
    factors: list[tuple[tuple[int, ...], np.ndarray]] = []
    for v, u in enumerate(unary):
        factors.append(((v,), np.asarray(u, dtype=np.float64)))
    for (u, v), m in pair.items():
        m = np.asarray(m, dtype=np.float64)
        if u == v:
            factors.append(((u,), np.diagonal(m).copy()))
        elif u < v:
            factors.append(((u, v), m))
        else:
            factors.append(((v, u), m.T))
    pl = plan(sizes, [k for k in pair if k[0] != k[1]], max_table_entries)
    by_var: dict[int, list[int]] = {v: [] for v in range(n)}
    for k, (vs, _) in enumerate(factors):
        for v in vs:
            by_var[v].append(k)
    live = [True] * len(factors)
    argmins: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
    total = 0.0
    for v in pl.order:
        ks = [k for k in by_var[v] if live[k]]
        scope = tuple(sorted(set().union(*(factors[k][0] for k in ks))))
        joint = np.zeros([sizes[x] for x in scope])
        for k in ks:
            joint = joint + _expand(factors[k][1], factors[k][0], scope)
            live[k] = False
        ax = scope.index(v)
        rest = tuple(x for x in scope if x != v)
        best = joint.min(axis=ax)
        argmins[v] = (rest, joint.argmin(axis=ax))
        if rest:
            factors.append((rest, best))
            live.append(True)
            for x in rest:
                by_var[x].append(len(factors) - 1)
        else:
            total += float(best)
    choice = np.zeros(n, dtype=np.int64)
    for v in reversed(pl.order):
        rest, am = argmins[v]
        choice[v] = int(am[tuple(choice[x] for x in rest)]) if rest else int(am)
    return choice, total, pl


def total_cost(choice, unary, pair) -> float:
    """The objective at one assignment."""
    c = sum(float(u[choice[v]]) for v, u in enumerate(unary))
    for (u, v), m in pair.items():
        c += float(m[choice[u], choice[v]])
    return c


def brute_force(unary, pair, *, limit: int = 2_000_000) -> tuple[np.ndarray, float]:
    """Every assignment tried (the test oracle for ``solve``); refuses more than
    ``limit`` assignments."""
    sizes = [len(u) for u in unary]
    if math.prod(sizes) > limit:
        raise ParallelizeError(f"brute force over {math.prod(sizes):,} assignments is more "
                               f"than its limit of {limit:,}; use it on tiny graphs only.")
    best, best_c = None, math.inf
    for combo in itertools.product(*(range(s) for s in sizes)):
        c = total_cost(combo, unary, pair)
        if c < best_c - 1e-15:
            best, best_c = combo, c
    return np.asarray(best, dtype=np.int64), best_c

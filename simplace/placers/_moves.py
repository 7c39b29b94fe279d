"""The neighbourhood of ``local``'s annealing: the moves that make a neighbour of a
placement (``Mover``) and the op sets they move.

A neighbour is one move, or a few in a row (``Mover.propose``):

* op: one op to another device, either a random op to a random device or an op at a cut
  (an edge between two devices) to the device of the op across the cut;
* group: every op of one group to one device; groupings are
  ``chain_collapse(colocate_free_ops(g))``, ``target_count`` of it (a few sizes),
  ``by_module`` at the given depths, and a ruler's colocation classes;
* swap: two groups of one grouping that sit on different devices exchange devices;
* subtree: every op whose module path starts with a prefix (forward ops, backward ops,
  or both) to one device.

Under a ruler with colocation classes (``simplace.sim.objective``) an op or cut move
takes the op's whole class along.
"""

from __future__ import annotations

import numpy as np

from simplace._per_graph import per_graph
from simplace.graph import split_name_path
from simplace.groups import (
    by_module,
    chain_collapse,
    colocate_free_ops,
    distinct_groupings,
    members,
    target_count,
)
from simplace.placers import PlacerContext
from simplace.sim.objective import Ruler


def _groupings(ctx: PlacerContext, module_depths) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """[(name, order, ptr)] of the groupings whose groups are moved and swapped (module
    groupings at ``module_depths``)."""
    g = ctx.graph
    m, d = g.num_ops, ctx.cost_model.num_devices
    cands = []
    chains = chain_collapse(g, colocate_free_ops(g))
    cands.append(("chains", chains))
    mates = _colocation_mates(ctx)
    if mates is not None:  # a ruler's colocation classes: each a group (the rest apart)
        cls = mates[2]
        apart = np.where(cls >= 0, cls, cls.max() + 1 + np.arange(m))
        cands.append(("colocation", np.unique(apart, return_inverse=True)[1].reshape(-1)))
    n_chains = int(chains.max()) + 1
    for k in (4 * d, 16 * d, 64 * d):
        if k < n_chains:
            cands.append((f"ranges{k}", target_count(g, k, chains)))
    for depth in module_depths:
        cands.append((f"module{depth}", by_module(g, int(depth))))
    return [(name, *members(labels)) for name, labels in distinct_groupings(cands, m)]


def _colocation_mates(ctx: PlacerContext):
    """``(order, ptr, class_of_op)`` of the colocation classes of the objective's ruler
    (the ops of class c: ``order[ptr[c]:ptr[c + 1]]``; class -1: none), or None."""
    objective = ctx.inputs.objective
    colocation = objective.colocation if isinstance(objective, Ruler) else None
    if colocation is None or not (np.asarray(colocation) >= 0).any():
        return None
    col = np.asarray(colocation, dtype=np.int64)
    classes, cls = np.unique(col, return_inverse=True)
    cls = cls.reshape(-1)
    if classes[0] < 0:  # ops in no class: -1, the rest renumbered from 0
        cls = cls - 1
    order, ptr = members(np.where(cls >= 0, cls, cls.max() + 1))
    return order, ptr, cls


def _subtrees(ctx: PlacerContext) -> list[np.ndarray]:
    """Op sets of module subtrees: every op whose path starts with a prefix, for forward
    ops, backward ops and both; sets of all ops or of one op are left out (computed once
    per graph: not to be modified)."""
    return per_graph(ctx.graph, "module_subtrees", lambda: _module_subtrees(ctx.graph))


def _module_subtrees(graph) -> list[np.ndarray]:
    m = graph.num_ops
    sets: dict[tuple, list[int]] = {}
    for i, path in enumerate(graph.name_path.tolist()):
        backward, parts = split_name_path(path)
        for k in range(1, len(parts) + 1):
            sets.setdefault(("bwd" if backward else "fwd", parts[:k]), []).append(i)
            sets.setdefault(("any", parts[:k]), []).append(i)
    out, seen = [], set()
    for key in sorted(sets):
        ops = np.asarray(sets[key], dtype=np.int64)
        if 1 < len(ops) < m and ops.tobytes() not in seen:
            seen.add(ops.tobytes())
            ops.setflags(write=False)
            out.append(ops)
    return out


class Mover:
    """Proposes neighbours of a placement (see the module docstring)."""

    KINDS = ("op", "cut", "group", "swap", "subtree")

    def __init__(self, ctx: PlacerContext, module_depths=(1, 2, 3, 4)):
        g = ctx.graph
        self.m, self.d = g.num_ops, int(ctx.cost_model.num_devices)
        self.src, self.dst = np.asarray(g.src, np.int64), np.asarray(g.dst, np.int64)
        self.groupings = _groupings(ctx, module_depths)
        self.subtrees = _subtrees(ctx)
        # A ruler's colocation classes (simplace.sim.objective) run where their first op
        # does: an op or cut move takes the op's whole class along, or it would change
        # nothing for every op but the first.
        self.mates = _colocation_mates(ctx)
        w = np.array([0.2, 0.2 if len(self.src) else 0.0, 0.3 if self.groupings else 0.0,
                      0.15 if self.groupings else 0.0, 0.15 if self.subtrees else 0.0])
        self.kind_p = w / w.sum()

    def _mates(self, i: int):
        """Op ``i`` and the ops of its colocation class (an index or an array)."""
        if self.mates is None:
            return i
        order, ptr, cls = self.mates
        c = cls[i]
        return i if c < 0 else order[ptr[c]:ptr[c + 1]]

    def _other_device(self, rng, dev: int) -> int:
        return int((dev + 1 + rng.integers(self.d - 1)) % self.d)

    def _set(self, rng, p: np.ndarray, ops: np.ndarray) -> None:
        """Put ``ops`` on one random device, one where not all of them are already."""
        dev = int(rng.integers(self.d))
        if np.all(p[ops] == dev):
            dev = self._other_device(rng, dev)
        p[ops] = dev

    def _group(self, rng):
        order, ptr = self.groupings[int(rng.integers(len(self.groupings)))][1:]
        k = int(rng.integers(len(ptr) - 1))
        return order, ptr, k

    def move(self, rng, p: np.ndarray, cut: np.ndarray) -> None:
        """Apply one random move to ``p`` in place; ``cut``: edges across devices of the
        current placement."""
        kind = self.KINDS[int(rng.choice(len(self.KINDS), p=self.kind_p))]
        if kind == "cut" and len(cut):
            e = int(cut[int(rng.integers(len(cut)))])
            a, b = int(self.src[e]), int(self.dst[e])
            if rng.random() < 0.5:
                a, b = b, a
            if p[a] != p[b]:
                p[self._mates(a)] = p[b]
                return
            kind = "op"
        if kind in ("op", "cut"):
            i = int(rng.integers(self.m))
            p[self._mates(i)] = self._other_device(rng, int(p[i]))
        elif kind == "group":
            order, ptr, k = self._group(rng)
            self._set(rng, p, order[ptr[k]:ptr[k + 1]])
        elif kind == "swap":
            order, ptr, k = self._group(rng)
            a = order[ptr[k]:ptr[k + 1]]
            k2 = int(rng.integers(len(ptr) - 1))
            b = order[ptr[k2]:ptr[k2 + 1]]
            da = int(np.bincount(p[a], minlength=self.d).argmax())
            db = int(np.bincount(p[b], minlength=self.d).argmax())
            if da == db or k == k2:
                self._set(rng, p, a)
            else:
                p[a], p[b] = db, da
        else:
            self._set(rng, p, self.subtrees[int(rng.integers(len(self.subtrees)))])

    def propose(self, rng, current: np.ndarray, batch: int) -> np.ndarray:
        """int[batch, M]: ``batch`` neighbours of ``current``, each one or a few moves
        away."""
        cut = np.flatnonzero(current[self.src] != current[self.dst])
        out = np.repeat(current[None], batch, axis=0)
        # Most neighbours are one move away; some two, some a kick of 3-6 moves, so that
        # every batch also samples a wider ring around the current placement.
        n_moves = rng.choice([1, 2, 3, 4, 5, 6], size=batch,
                             p=[0.6, 0.2, 0.05, 0.05, 0.05, 0.05])
        for b in range(batch):
            p = out[b]
            for _ in range(int(n_moves[b])):
                self.move(rng, p, cut)
        return out

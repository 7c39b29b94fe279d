"""What a policy sees: the placed units (groups of ops) and their features.

Policies never act on single ops of a big graph: ops are first merged into *units*
(``groups.py`` rules: free ops with their producer, chains collapsed, then contiguous
ranges of a topological order by ``target_count``), and a unit placement is expanded to
ops by one gather (``unit_of_op``) inside the jitted step.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from simplace.errors import SimplaceError
from simplace.groups import (
    chain_collapse,
    check_groups,
    colocate_free_ops,
    normalize,
    target_count,
)

# Op types with their own feature column; the rest share an "other" column.
NUM_OP_TYPES = 12


@dataclasses.dataclass(frozen=True, eq=False)
class Units:
    """The placed units of one graph on one machine (numpy arrays).

    unit_of_op: int32[M], the unit of each op; units are numbered in a topological order
      of their quotient graph, so unit order is a valid execution order.
    features: float32[U, F], standardised per column: log sums of flops, bytes,
      activation and parameter bytes, op-type histogram, log op time on each device,
      topological position, in/out degree and log bytes in/out of the quotient graph.
    src, dst: int32[E'], edges of the quotient graph (one per connected unit pair).
    edge_feat: float32[E'], standardised log bytes of each quotient edge.
    op_weight: float64[M], each op's mean time over devices (for majority votes).
    """

    unit_of_op: np.ndarray
    features: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    edge_feat: np.ndarray
    op_weight: np.ndarray

    @property
    def num_units(self) -> int:
        """Number of units (U)."""
        return int(self.features.shape[0])

    def unit_placement(self, placement) -> np.ndarray:
        """int32[U]: each unit's device by a time-weighted majority of its ops' devices
        in an op placement (how a heuristic's placement becomes a policy target)."""
        p = np.asarray(placement, dtype=np.int64)
        d = int(p.max()) + 1 if p.size else 1
        votes = np.zeros((self.num_units, d))
        np.add.at(votes, (self.unit_of_op, p), self.op_weight + 1e-12)
        return votes.argmax(axis=1).astype(np.int32)


def _unit_grouping(graph, num_units, max_units: int) -> np.ndarray:
    m = graph.num_ops
    if isinstance(num_units, str):
        if num_units == "ops":
            return np.arange(m, dtype=np.int32)
        if num_units != "auto":
            raise SimplaceError(f"units must be 'auto', 'ops', an int or an int[M] grouping, "
                                f"got {num_units!r}.")
        num_units = max_units
    if isinstance(num_units, np.ndarray | list | tuple):
        return normalize(check_groups(graph, np.asarray(num_units)))
    k = int(num_units)
    if k < 1:
        raise SimplaceError(f"units must be >= 1, got {k}.")
    chains = chain_collapse(graph, colocate_free_ops(graph))
    if int(chains.max(initial=-1)) + 1 <= k:
        return chains
    return target_count(graph, k, chains)


def split_by_placement(groups, placement) -> np.ndarray:
    """int32[M]: ``groups`` with every group cut where ``placement`` changes device along
    its ops (in graph order), so that the placement is exactly a unit placement.

    A warm start whose ops a unit splits across devices cannot be represented by the
    units otherwise: its majority vote can be several times slower than the warm start
    itself (a list scheduler's placement of a training graph). The pieces of a group are
    ranges of its ops in graph order, so the quotient graph stays acyclic (an edge
    between pieces of one group runs forward; any other cycle would be one between
    groups)."""
    g = np.asarray(groups, np.int64)
    p = np.asarray(placement, np.int64)
    if len(g) != len(p):
        raise SimplaceError(f"The placement to split units by has {len(p)} entries for "
                            f"{len(g)} ops.")
    if not len(g):
        return g.astype(np.int32)
    # Ops of each group in graph order; a piece starts where the group's previous op
    # is on another device.
    order = np.lexsort((np.arange(len(g)), g))
    go, po = g[order], p[order]
    start = np.ones(len(g), bool)
    start[1:] = (go[1:] != go[:-1]) | (po[1:] != po[:-1])
    piece = np.empty(len(g), np.int64)
    piece[order] = np.cumsum(start) - 1
    return normalize(piece)


def unit_grouping(graph, num_units: int | str | np.ndarray = "auto",
                  max_units: int = 256, split_by=None) -> np.ndarray:
    """int32[M] unit of each op: ``"ops"`` (every op), an int32[M] grouping, an int
    (chains cut to at most that many ranges) or ``"auto"`` (the same with ``max_units``);
    with ``split_by`` (an op placement, the warm start) units are then cut where it
    changes device (``split_by_placement``)."""
    units = _unit_grouping(graph, num_units, max_units)
    return units if split_by is None else split_by_placement(units, split_by)


def _standardise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    mu = x.mean(axis=0, keepdims=True) if len(x) else 0.0
    sd = x.std(axis=0, keepdims=True) if len(x) else 1.0
    return ((x - mu) / np.where(sd > 1e-9, sd, 1.0)).astype(np.float32)


def build_units(graph, op_time_s: np.ndarray, grouping: np.ndarray) -> Units:
    """Features of the units of ``grouping`` (int32[M]); ``op_time_s`` float[M, D]."""
    from simplace.graph import topological_order

    grouping = normalize(grouping)
    m = graph.num_ops
    u = int(grouping.max()) + 1 if m else 0
    # Renumber units in a topological order of the quotient graph (ties by first op).
    cross = grouping[graph.src] != grouping[graph.dst]
    qs, qd = grouping[graph.src[cross]], grouping[graph.dst[cross]]
    order = topological_order(u, qs, qd)
    if order is None:
        raise SimplaceError("The unit grouping has a cyclic quotient graph: use groupings "
                            "from chain_collapse / colocate_free_ops / target_count.")
    rank = np.empty(u, dtype=np.int64)
    rank[order] = np.arange(u)
    unit = rank[grouping].astype(np.int32)
    qs, qd = rank[qs], rank[qd]

    def usum(w):
        return np.bincount(unit, weights=np.asarray(w, np.float64), minlength=u)

    cols = [np.log1p(usum(graph.flops)), np.log1p(usum(graph.bytes_accessed)),
            np.log1p(usum(graph.out_bytes)), np.log1p(usum(graph.param_bytes)),
            np.log1p(np.bincount(unit, minlength=u))]
    # Op-type histogram (fractions of the unit's ops) over the most common primitives.
    types, inv, counts = np.unique(graph.op, return_inverse=True, return_counts=True)
    top = np.argsort(-counts, kind="stable")[:NUM_OP_TYPES]
    col_of_type = np.full(len(types), len(top), dtype=np.int64)
    col_of_type[top] = np.arange(len(top))
    hist = np.zeros((u, len(top) + 1))
    np.add.at(hist, (unit, col_of_type[inv.reshape(-1)]), 1.0)
    hist /= np.maximum(hist.sum(axis=1, keepdims=True), 1.0)
    t = np.asarray(op_time_s, np.float64)
    times = np.stack([np.log(usum(t[:, k]) + 1e-9) for k in range(t.shape[1])], axis=1)
    pos = (np.arange(u) / max(u - 1, 1))[:, None]
    pairs = np.unique(np.stack([qs, qd], axis=1), axis=0) if len(qs) else np.zeros((0, 2),
                                                                                   np.int64)
    eb = np.zeros(len(pairs))
    if len(pairs):
        key = qs * u + qd
        pkey = pairs[:, 0] * u + pairs[:, 1]
        np.add.at(eb, np.searchsorted(pkey, key), graph.edge_bytes[cross])
    deg = [np.log1p(np.bincount(pairs[:, 1], minlength=u)),
           np.log1p(np.bincount(pairs[:, 0], minlength=u)),
           np.log1p(np.bincount(pairs[:, 1], weights=eb, minlength=u)),
           np.log1p(np.bincount(pairs[:, 0], weights=eb, minlength=u))]
    feats = np.concatenate([np.stack(cols, 1), hist, times, pos, np.stack(deg, 1)], axis=1)
    return Units(unit_of_op=unit, features=_standardise(feats),
                 src=pairs[:, 0].astype(np.int32), dst=pairs[:, 1].astype(np.int32),
                 edge_feat=_standardise(np.log1p(eb)[:, None])[:, 0],
                 op_weight=t.mean(axis=1))

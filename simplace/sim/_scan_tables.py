"""The static tables of the JAX scan simulator, from the graph and the machine alone
(numpy, once per simulator): the pairs (a consumer and one of its distinct producers)
ranked among their producer's consumers, the scan's slices (an op's pairs, ``K`` at a
time), the tensors ops send, the machine's link classes, and the chains of parameter
uses."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simplace.sim._scan_memory import _tail
from simplace.sim.inputs import SimInputs, put_waits_of

# Rows of the segment-end table a segment's last op fills (see ``simplace.sim._scan``;
# the doubling in the placement facts assumes 8).
_WINDOW = 8
# Pairs (distinct producers) per scan step, at most.
_WIDTH = 2
# Machines with more link classes pick transfer constants from per-device columns.
_MAX_CLASSES = 4


class _Pairs(NamedTuple):
    """Pairs (a consumer and one of its distinct producers), numbered by rank (position
    among the producer's consumers); ``raw_dst`` and ``inv`` (pair number of each raw
    pair) keep the consumer order the pairs were found in."""

    n: int
    raw_dst: np.ndarray
    inv: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    prev: np.ndarray
    rank_offsets: list[int]
    op_last_pair: np.ndarray


def _pairs_by_rank(graph) -> _Pairs:
    """The graph's pairs, each following the pair of its producer's previous consumer."""
    m = graph.num_ops
    src = graph.src.astype(np.int64)
    ptr, order = graph.in_edges
    # Pairs: distinct producers of each op, in the order of its in-edges.
    raw_src, raw_dst = [], []
    for i in range(m):
        for j in dict.fromkeys(src[order[ptr[i]:ptr[i + 1]]].tolist()):
            raw_src.append(j)
            raw_dst.append(i)
    n_pairs = len(raw_src)
    raw_src = np.asarray(raw_src, np.int64)
    raw_dst = np.asarray(raw_dst, np.int64)
    # Rank of each pair among its producer's consumers (raw pairs come in consumer
    # order), and the pair of the previous consumer.
    rank = np.zeros(n_pairs, np.int64)
    raw_prev = np.full(n_pairs, -1, np.int64)
    last_seen: dict[int, int] = {}
    for q, j in enumerate(raw_src.tolist()):
        if j in last_seen:
            raw_prev[q] = last_seen[j]
            rank[q] = rank[last_seen[j]] + 1
        last_seen[j] = q
    perm = np.argsort(rank, kind="stable")  # pairs are numbered by rank
    inv = np.empty(n_pairs, np.int64)
    inv[perm] = np.arange(n_pairs)
    pair_prev = np.where(raw_prev[perm] >= 0, inv[np.maximum(raw_prev[perm], 0)], 0)
    n_rank = int(rank.max()) + 1 if n_pairs else 0
    rank_offsets = np.searchsorted(rank[perm], np.arange(n_rank + 1)).tolist()
    op_last_pair = np.full(m, n_pairs, np.int64)
    for j, q in last_seen.items():
        op_last_pair[j] = inv[q]
    return _Pairs(n_pairs, raw_dst, inv, raw_src[perm], raw_dst[perm], pair_prev,
                  rank_offsets, op_last_pair)


class _Slices(NamedTuple):
    """The scan's steps: slice s runs op ``op[s]`` with pairs ``pair[s]`` (``[S, K]``,
    ``n`` pairs for none), the op's first and/or last slice; ``pair_pos``: where each
    pair sits in the flattened ``[S * K]``."""

    k_w: int
    op: np.ndarray
    first: np.ndarray
    last: np.ndarray
    pair: np.ndarray
    valid: np.ndarray
    pair_pos: np.ndarray


def _slices(m: int, pairs: _Pairs) -> _Slices:
    """Each op's pairs, K at a time (at least one slice per op)."""
    n_pairs = pairs.n
    per_op = np.bincount(pairs.raw_dst, minlength=m) if m else np.zeros(0, np.int64)
    k_w = int(min(_WIDTH, max(1, per_op.max() if m else 1)))
    op_pairs: list[list[int]] = [[] for _ in range(m)]
    for q in range(n_pairs):
        op_pairs[pairs.raw_dst[q]].append(int(pairs.inv[q]))
    s_op, s_first, s_last, s_pair = [], [], [], []
    for i in range(m):
        qs = op_pairs[i]
        chunks = [qs[a:a + k_w] for a in range(0, len(qs), k_w)] or [[]]
        for n_, ch in enumerate(chunks):
            s_op.append(i)
            s_first.append(n_ == 0)
            s_last.append(n_ == len(chunks) - 1)
            s_pair.append(ch + [n_pairs] * (k_w - len(ch)))
    s_pair = np.asarray(s_pair, np.int64).reshape(-1, k_w)
    valid = s_pair < n_pairs
    pair_pos = np.zeros(n_pairs, np.int64)
    pair_pos[s_pair[valid]] = np.flatnonzero(valid.reshape(-1))
    return _Slices(k_w, np.asarray(s_op, np.int64), np.asarray(s_first, bool),
                   np.asarray(s_last, bool), s_pair, valid, pair_pos)


def _tensors(graph) -> tuple[np.ndarray, dict]:
    """What ops send: ``single_bytes[M]`` (the tensor an op with one tensor sends whole;
    0 for the others) and the tables ``_multi_bytes`` sums per device for ops with
    several, each of whose tensors is sent to a device at most once."""
    m = graph.num_ops
    src, dst = graph.src.astype(np.int64), graph.dst.astype(np.int64)
    # Distinct tensors (src, edge_output); each is sent to a device at most once.
    if len(src):
        keys = np.stack([src, graph.edge_output.astype(np.int64)], axis=1)
        tensors, edge_tensor = np.unique(keys, axis=0, return_inverse=True)
        edge_tensor = edge_tensor.reshape(-1)
        tensor_bytes = np.zeros(len(tensors))
        np.maximum.at(tensor_bytes, edge_tensor, graph.edge_bytes)
        tensor_op = tensors[:, 0]
        t_edges = np.unique(np.stack([edge_tensor, dst], axis=1), axis=0)
    else:
        tensor_bytes = np.zeros(0)
        tensor_op = np.zeros(0, np.int64)
        t_edges = np.zeros((0, 2), np.int64)
    # Ops with one tensor send it whole; ops with several send, to each device, the
    # sum of those consumed there (a per-batch table, _multi_bytes).
    n_tensors = np.bincount(tensor_op, minlength=m) if m else np.zeros(0, np.int64)
    is_multi = n_tensors > 1
    single_bytes = np.zeros(m)
    single_bytes[tensor_op] = tensor_bytes
    single_bytes[is_multi] = 0.0
    multi_ops = np.flatnonzero(is_multi)
    multi_index = np.full(m, len(multi_ops), np.int64)  # the zero row for the others
    multi_index[multi_ops] = np.arange(len(multi_ops))
    mt = np.flatnonzero(is_multi[tensor_op]) if len(tensor_op) else np.zeros(0, np.int64)
    mt_pos = np.full(len(tensor_op), -1, np.int64)
    mt_pos[mt] = np.arange(len(mt))
    me = t_edges[mt_pos[t_edges[:, 0]] >= 0] if len(t_edges) else t_edges
    return single_bytes, dict(
        is_multi=is_multi, multi_index=multi_index,
        mt_op=multi_index[tensor_op[mt]].astype(np.int32),
        mt_owner=tensor_op[mt].astype(np.int32),
        mt_bytes=tensor_bytes[mt], me_tensor=mt_pos[me[:, 0]].astype(np.int32),
        me_dst=me[:, 1].astype(np.int32))


def _link_classes(inp: SimInputs) -> dict:
    """The distinct (latency, bandwidth, put, put wait) of the off-diagonal links, as
    static entries: class 0 stands for "no transfer". With more than _MAX_CLASSES,
    ``TABLE`` is set, code is 1 for a transfer and the constants come from per-device
    columns (``lat``, ``bw``, ``put``, ``wait``)."""
    d = inp.num_devices
    lat, bw, put = inp.latency_s, inp.bandwidth_bytes_per_s, inp.put_s
    waits = put_waits_of(inp).astype(np.float64)
    off = ~np.eye(d, dtype=bool)
    classmap = np.zeros((d, d), np.int64)
    uniq = np.zeros((0, 4))
    if d > 1:
        uniq, cls_inv = np.unique(np.stack([lat[off], bw[off], put[off], waits[off]], axis=1),
                                  axis=0, return_inverse=True)
        classmap[off] = cls_inv.reshape(-1) + 1
    table = len(uniq) > _MAX_CLASSES
    return dict(
        NC=1 if table else len(uniq), TABLE=table, classmap=classmap.tolist(),
        lat_c=[0.0] + uniq[:, 0].tolist(), bw_c=[np.inf] + uniq[:, 1].tolist(),
        put_c=[0.0] + uniq[:, 2].tolist(), wait_c=[0.0] + uniq[:, 3].tolist(),
        lat=lat.tolist(), bw=bw.tolist(), put=put.tolist(), wait=waits.tolist(),
        has_wait=bool(np.any(waits[off] > 0)))


def _precompute(graph, inp: SimInputs) -> tuple[dict, dict]:
    """Static sizes (Python ints) and index/cost arrays (numpy) for the traced code."""
    m, d = graph.num_ops, inp.num_devices
    w = _WINDOW
    assert w == 8, "the run and far flags of the placement facts are computed by doubling"
    if m == 0:  # nothing to trace: __call__ answers without the scan
        return dict(M=0, D=d, E=2 * w - 1), {}
    pairs = _pairs_by_rank(graph)
    sl = _slices(m, pairs)
    n_pairs, k_w, n_slices = pairs.n, sl.k_w, len(sl.op)
    single_bytes, multi = _tensors(graph)
    links = _link_classes(inp)
    n_cls, table = links["NC"], links["TABLE"]
    bw_c = np.asarray(links["bw_c"])
    # Per slice and pair: the bytes of a single-tensor producer and its transfer time
    # on each link class.
    j_s = np.concatenate([pairs.src, [0]])[sl.pair]  # [S, K] producers
    nb_s = np.where(sl.valid, single_bytes[j_s], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_s = nb_s[..., None] / (bw_c[None, None, :] if not table else np.ones((1, 1, 2)))
    t_s = np.where(np.isfinite(t_s), t_s, 0.0)
    t_s[..., 0] = 0.0
    pool_work = np.asarray(inp.op_pool_work, np.float64)
    pool_min = np.asarray(inp.pool_min_work, np.float64)
    pool_launch = np.asarray(inp.pool_launch_s, np.float64)
    unfused = getattr(inp, "op_unfused_s", None)
    unfused = np.zeros((m, d)) if unfused is None else np.asarray(unfused, np.float64)
    last_f = sl.last[:, None].astype(np.float64)
    group = inp.exclusive_group
    sh = max(1, (d - 1).bit_length())
    uses, use_offsets = _param_uses(graph)
    multi_index = multi["multi_index"]
    static = dict(
        M=m, D=d, G=inp.num_groups, K=k_w, W=w, P=graph.num_params, S=n_slices,
        E=m + 2 * w - 1, SH=sh, CB=sh + max(1, n_cls.bit_length()),
        G_ID=bool(np.array_equal(group, np.arange(d))), Q=int(np.sum(multi["is_multi"])),
        group=group.tolist(), **links,
        launch=inp.launch_s.tolist(), dispatch=inp.dispatch_s.tolist(),
        rank_offsets=pairs.rank_offsets,
        has_pool=bool(np.any(np.isfinite(pool_min) & (pool_launch > 0))),
        pool_min=pool_min.tolist(), pool_launch=pool_launch.tolist(),
        has_op_unfused=bool(np.any(unfused != 0)), NP=n_pairs,
        use_offsets=use_offsets)
    s_op = sl.op
    consts = dict(
        pair_src=pairs.src.astype(np.int32), pair_dst=pairs.dst.astype(np.int32),
        pair_src_pad=np.concatenate([pairs.src, [m]]).astype(np.int32),
        pair_prev=pairs.prev.astype(np.int32),
        pair_tail=_tail(pairs.prev, pairs.rank_offsets),
        use_tail=_tail(uses["use_prev"], use_offsets),
        op_last_pair=pairs.op_last_pair.astype(np.int32),
        pair_pos=sl.pair_pos.astype(np.int32), slice_pair=sl.pair.astype(np.int32),
        op_last_slice=np.flatnonzero(sl.last).astype(np.int32),
        lowest=np.float64(-np.inf), lowest_i=np.int32(-128),
        # Per slice, ints: op, flag mask (the first slice opens, the last closes; run
        # bits kept), previous slice's op, then per pair: the pair, its producer's etab
        # row, the producer, its multi-tensor row. (The scan inserts "far" at column 3.)
        slice_int=np.concatenate(
            [s_op[:, None], (sl.first * 1 + sl.last * 2 + 0x3C)[:, None],
             np.concatenate([[0], s_op[:-1]])[:n_slices, None], sl.pair, j_s + w - 1, j_s,
             multi_index[j_s]], axis=1).astype(np.int32),
        # Per slice, floats: op times, op pool work and unfused costs (on an op's
        # last slice only), then per pair: bytes and transfer time on each link class.
        slice_float=np.concatenate(
            [inp.op_time_s[s_op] * last_f, pool_work[s_op] * last_f, unfused[s_op] * last_f,
             np.concatenate([nb_s[..., None], t_s[..., :n_cls + 1]],
                            axis=2).reshape(n_slices, -1)], axis=1),
        blk_last=np.int32(s_op[-1] if n_slices else 0),
        single_bytes=single_bytes, **dict(multi, multi_index=multi_index.astype(np.int32)),
        **uses,
        out_bytes=graph.out_bytes, is_output=graph.is_output,
        param_op=graph.param_op, param_index=graph.param_index,
        param_sizes=graph.param_sizes,
    )
    return static, consts


def _param_uses(graph) -> tuple[dict, list[int]]:
    """Static chains of the parameter uses (op, parameter), for a running OR of the
    devices that read each parameter (``_chain``): uses grouped by rank among the uses
    of their parameter, each following the previous use of its parameter."""
    ops = np.asarray(graph.param_op, np.int64)
    idx = np.asarray(graph.param_index, np.int64)
    if len(ops) == 0:
        z = np.zeros(0, np.int32)
        return dict(use_op=z, use_prev=z, param_last_use=z, param_used=z), [0]
    uses = np.unique(np.stack([idx, ops], axis=1), axis=0)  # sorted by parameter
    first = np.searchsorted(uses[:, 0], uses[:, 0])
    rank = np.arange(len(uses)) - first
    perm = np.argsort(rank, kind="stable")
    inv = np.empty(len(uses), np.int64)
    inv[perm] = np.arange(len(uses))
    prev_raw = np.where(rank > 0, np.arange(len(uses)) - 1, 0)
    used = np.unique(uses[:, 0])
    last_raw = np.searchsorted(uses[:, 0], used, side="right") - 1
    offsets = np.searchsorted(rank[perm], np.arange(int(rank.max()) + 2)).tolist()
    return dict(use_op=uses[perm, 1].astype(np.int32),
                use_prev=inv[prev_raw[perm]].astype(np.int32),
                param_last_use=inv[last_raw].astype(np.int32),
                param_used=used.astype(np.int32)), offsets

"""What the pretrained policy sees of one graph on one machine, in arrays whose meaning
does not depend on the graph's size, its op names or the number of devices.

The per-graph policies (``simplace.rl.features``) see columns that only mean something
for the graph they train on: an op-type histogram over that graph's most common
primitives and one time column per device. A policy that places graphs it never saw
needs fixed columns instead:

* **units**: the ops themselves, or for a graph of more than ``MAX_UNITS`` ops groups of
  them (free ops with their producer, then balanced ranges of a topological order:
  ``groups.target_count``), each with sizes
  standardised within the graph, its share of the graph's time, a histogram over a
  fixed vocabulary of op classes (``OP_CLASSES``; a primitive not in the vocabulary
  counts as ``other``), its position and degrees, and what moving its inputs and outputs
  costs next to its compute;
* **devices**, each with its speed next to the fastest device, the graph's memory next
  to its capacity, its links' bandwidths, its launch and dispatch costs;
* **unit x device pairs**: how much slower the unit runs there than on its fastest
  device, and how much of the device's memory it needs.

Times are taken relative to the graph's time on its fastest device, bytes relative to
the machine's typical link and the smallest memory, so the same features describe a
graph at any batch size on any machine. Each unit also has a **parent**: the
predecessor it receives the most bytes from (itself for a unit without one), which the
policy may follow onto its device. ``padded`` lays the arrays out in fixed buckets
(units, quotient edges, devices), so that one compiled program serves every problem of
a bucket.

Why ops and not a few hundred coarse units: a coarse unit takes one device, and the
placements that beat a single device interleave parallel branches op by op. The
placements of ``m_etf`` and ``local`` voted onto 150-600 contiguous ranges were 1.2 to 4
times slower than themselves (transformer, inception_v3, rnnlm and a Doppler graph on
their machines); on ops nothing is lost.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from simplace.errors import SimplaceError

MAX_UNITS = 8192
UNIT_BUCKETS = (2048, MAX_UNITS)
# Device buckets: a machine with more devices than the last is refused (policy_problem).
# One bucket up to 16 devices: a compile per bucket costs seconds, the padding little.
DEVICE_BUCKETS = (16, 32)
MAX_DEVICES = DEVICE_BUCKETS[-1]

# The op classes of the vocabulary, each with the primitives it holds; every other
# primitive (and every op of an imported graph, which carries no primitive) is "other".
OP_CLASSES = {
    "matmul": ("dot_general",),
    "conv": ("conv_general_dilated", "reduce_window_max", "reduce_window_sum",
             "select_and_scatter_add", "reduce_window"),
    "arith": ("add", "add_any", "sub", "mul", "div", "neg", "max", "min", "square",
              "integer_pow", "abs", "pow", "sign", "rem", "floor", "ceil", "round",
              "clamp"),
    "transcendental": ("exp", "log", "tanh", "logistic", "rsqrt", "sqrt", "erf",
                       "log1p", "expm1", "sin", "cos", "erf_inv", "cbrt"),
    "reduce": ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax",
               "argmin", "cumsum", "cumprod", "cummax", "reduce_and", "reduce_or"),
    "layout": ("reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims",
               "slice", "concatenate", "split", "pad", "rev", "convert_element_type",
               "copy", "copy_p", "iota", "dynamic_slice", "dynamic_update_slice"),
    "select": ("gather", "scatter", "scatter-add", "select_n", "eq", "ne", "lt", "le",
               "gt", "ge", "is_finite", "stop_gradient", "and", "or", "not"),
}
CLASS_NAMES = (*OP_CLASSES, "other")
_CLASS_OF = {prim: k for k, names in enumerate(OP_CLASSES.values()) for prim in names}
OTHER_CLASS = len(OP_CLASSES)

UNIT_FEATURES = 5 + 1 + len(CLASS_NAMES) + 1 + 2 + 2 + 1
DEVICE_FEATURES = 10
PAIR_FEATURES = 2


def op_classes(ops) -> np.ndarray:
    """int64[M]: the class (index into ``CLASS_NAMES``) of each op name; a name outside
    the vocabulary is ``other``."""
    return np.array([_CLASS_OF.get(str(o), OTHER_CLASS) for o in ops], np.int64)


def _bucket(n: int, smallest: int) -> int:
    size = smallest
    while size < n:
        size *= 2
    return size


def _log_ratio(num, den, lo=-12.0, hi=12.0):
    num = np.asarray(num, np.float64)
    den = np.asarray(den, np.float64)
    return np.clip(np.log(np.maximum(num, 1e-30) / np.maximum(den, 1e-30)), lo, hi)


def _zscore(x: np.ndarray) -> np.ndarray:
    sd = x.std(axis=0, keepdims=True)
    return (x - x.mean(axis=0, keepdims=True)) / np.where(sd > 1e-9, sd, 1.0)


@dataclasses.dataclass(frozen=True, eq=False)
class PolicyProblem:
    """One graph on one machine as the pretrained policy sees it (numpy arrays).

    unit_of_op: int32[M], the unit of each op (units in a topological order).
    unit_feat: float32[U, UNIT_FEATURES]; device_feat: float32[D, DEVICE_FEATURES];
    pair_feat: float32[U, D, PAIR_FEATURES] (see the module docstring).
    src, dst: int32[E], the quotient graph's edges; edge_feat: float32[E], their
      log bytes next to the graph's time scale.
    parent: int32[U], the predecessor each unit receives the most bytes from (itself
      for a unit with no predecessor); always lower than the unit.
    device_class: int64[D], devices of one class are interchangeable (``device_classes``).
    unit_time_s: float64[U, D], each unit's compute time on each device.
    """

    unit_of_op: np.ndarray
    unit_feat: np.ndarray
    device_feat: np.ndarray
    pair_feat: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    edge_feat: np.ndarray
    unit_time_s: np.ndarray
    parent: np.ndarray
    device_class: np.ndarray

    @property
    def num_units(self) -> int:
        """Number of units (U)."""
        return int(self.unit_feat.shape[0])

    @property
    def num_devices(self) -> int:
        """Number of devices (D)."""
        return int(self.device_feat.shape[0])

    def shape_key(self) -> tuple[int, int, int]:
        """The bucket ``(units, edges, devices)`` this problem is padded to."""
        units = next(b for b in UNIT_BUCKETS if b >= self.num_units)
        return (units, _bucket(max(len(self.src), 1), 2 * units),
                next(b for b in DEVICE_BUCKETS if b >= self.num_devices))

    def padded(self, at_least: tuple[int, int, int] | None = None) -> dict[str, np.ndarray]:
        """The arrays padded to ``shape_key()`` (or to the larger ``at_least``, another
        problem's, so that one compiled program serves both), with masks: what the
        policy's compiled functions take (padded units and edges are inert; padded
        devices are never drawn)."""
        u_pad, e_pad, d_pad = (self.shape_key() if at_least is None else
                               tuple(max(a, b) for a, b in zip(self.shape_key(), at_least,
                                                               strict=True)))
        u, e, d = self.num_units, len(self.src), self.num_devices
        unit_feat = np.zeros((u_pad, UNIT_FEATURES), np.float32)
        unit_feat[:u] = self.unit_feat
        dev_feat = np.zeros((d_pad, DEVICE_FEATURES), np.float32)
        dev_feat[:d] = self.device_feat
        pair = np.zeros((u_pad, d_pad, PAIR_FEATURES), np.float32)
        pair[:u, :d] = self.pair_feat
        # Padded edges join the last padded unit to itself with zero weight.
        src = np.full(e_pad, u_pad - 1, np.int32)
        dst = np.full(e_pad, u_pad - 1, np.int32)
        src[:e], dst[:e] = self.src, self.dst
        edge_w = np.zeros(e_pad, np.float32)
        edge_w[:e] = 1.0
        edge_feat = np.zeros(e_pad, np.float32)
        edge_feat[:e] = self.edge_feat
        parent = np.arange(u_pad, dtype=np.int32)
        parent[:u] = self.parent
        return {"unit_feat": unit_feat, "device_feat": dev_feat, "pair_feat": pair,
                "src": src, "dst": dst, "edge_w": edge_w, "edge_feat": edge_feat,
                "parent": parent,
                "has_parent": (parent != np.arange(u_pad)).astype(np.float32),
                "unit_mask": (np.arange(u_pad) < u).astype(np.float32),
                "device_mask": (np.arange(d_pad) < d).astype(np.float32)}

    def expand(self, unit_devices) -> np.ndarray:
        """int32[..., M]: op placements of unit placements int[..., U or padded U]."""
        ud = np.asarray(unit_devices)[..., :self.num_units]
        return ud[..., self.unit_of_op].astype(np.int32)


def device_classes(op_time_s, memory_bytes) -> np.ndarray:
    """int64[D]: a class per device, shared by devices with the same op times and memory
    (interchangeable as far as a placement's compute goes), numbered by first member."""
    keys: dict = {}
    t = np.asarray(op_time_s, np.float64)
    mem = np.asarray(memory_bytes, np.float64)
    return np.array([keys.setdefault((t[:, k].tobytes(), float(mem[k])), len(keys))
                     for k in range(t.shape[1])], np.int64)


def canonical(unit_devices, device_class) -> np.ndarray:
    """int32[..., U]: unit placements with the devices of each class relabelled in the
    order the placement first uses them (its lowest-ranked member first), so that
    placements that differ by a permutation of interchangeable devices read the same."""
    ud = np.array(unit_devices, np.int64, copy=True)
    flat = ud.reshape(-1, ud.shape[-1])
    cls = np.asarray(device_class)
    for row in flat:
        new = np.arange(len(cls))
        for c in np.unique(cls):
            members = np.flatnonzero(cls == c)
            if len(members) < 2:
                continue
            seen = [int(x) for x in dict.fromkeys(row[np.isin(row, members)])]
            order = seen + [int(m) for m in members if m not in seen]
            new[order] = members
        row[:] = new[row]
    return flat.reshape(ud.shape).astype(np.int32)


def _unit_sums(unit, u, w):
    return np.bincount(unit, weights=np.asarray(w, np.float64), minlength=u)


def policy_problem(graph, inputs, *, max_units: int = MAX_UNITS,
                   grouping=None) -> PolicyProblem:
    """The ``PolicyProblem`` of ``graph`` on the machine of ``inputs`` (``SimInputs``):
    its ops as units, or groups of them for a graph of more than ``max_units`` ops (see
    the module docstring), or the groups of ``grouping`` (int[M], an acyclic grouping
    such as ``simplace.groups``' rules make) when given.

    SimplaceError when the machine has more devices than ``MAX_DEVICES`` (the largest
    machine the policy's compiled functions take)."""
    from simplace.rl.features import build_units

    d = int(inputs.num_devices)
    if d > MAX_DEVICES:
        raise SimplaceError(f"The pretrained policy places on at most {MAX_DEVICES} "
                            f"devices; this machine has {d}. Use another method (local, "
                            f"heft) or a machine file with fewer devices.")
    if graph.num_ops == 0:
        raise SimplaceError("The graph has no ops: there is nothing to place.")
    if grouping is None:
        from simplace.groups import colocate_free_ops, singletons, target_count

        k = min(int(max_units), MAX_UNITS)
        grouping = (singletons(graph) if graph.num_ops <= k
                    else target_count(graph, k, colocate_free_ops(graph)))
    # build_units numbers units in a topological order of the quotient graph and gives
    # its edges; its graph-specific features are not used.
    t = np.asarray(inputs.op_time_s, np.float64)
    base = build_units(graph, t, grouping)
    unit, src, dst = base.unit_of_op, base.src, base.dst
    u = base.num_units
    ut = np.stack([_unit_sums(unit, u, t[:, k]) for k in range(d)], axis=1)  # [U, D]
    t_min = ut.min(axis=1)
    # The time scale: the whole graph on its fastest device.
    t_graph = max(float(ut.sum(axis=0).min()), 1e-12)
    bw = np.asarray(inputs.bandwidth_bytes_per_s, np.float64)
    off = ~np.eye(d, dtype=bool)
    bw_ref = float(np.median(bw[off])) if d > 1 else 1e12
    mem = np.asarray(inputs.memory_bytes, np.float64)
    mem_ref = max(float(mem.min()), 1.0)

    cross = unit[graph.src] != unit[graph.dst]
    eb = np.asarray(graph.edge_bytes, np.float64)
    bytes_in = _unit_sums(unit[graph.dst[cross]], u, eb[cross])
    bytes_out = _unit_sums(unit[graph.src[cross]], u, eb[cross])
    resident = _unit_sums(unit, u, np.asarray(graph.out_bytes, np.float64)
                          + np.asarray(graph.param_bytes, np.float64))
    sizes = np.stack([np.log1p(_unit_sums(unit, u, graph.flops)),
                      np.log1p(_unit_sums(unit, u, graph.bytes_accessed)),
                      np.log1p(_unit_sums(unit, u, graph.out_bytes)),
                      np.log1p(_unit_sums(unit, u, graph.param_bytes)),
                      np.log1p(np.bincount(unit, minlength=u))], axis=1)
    hist = np.zeros((u, len(CLASS_NAMES)))
    np.add.at(hist, (unit, op_classes(graph.op)), 1.0)
    hist /= np.maximum(hist.sum(axis=1, keepdims=True), 1.0)
    deg_in = np.bincount(dst, minlength=u)
    deg_out = np.bincount(src, minlength=u)
    unit_feat = np.concatenate([
        _zscore(sizes),
        _log_ratio(t_min * u, t_graph)[:, None] / 4.0,
        hist,
        (np.arange(u) / max(u - 1, 1))[:, None],
        np.log1p(np.stack([deg_in, deg_out], axis=1)),
        np.stack([_log_ratio(bytes_in / bw_ref * u, t_graph),
                  _log_ratio(bytes_out / bw_ref * u, t_graph)], axis=1) / 4.0,
        _log_ratio(resident, mem_ref)[:, None] / 4.0], axis=1)

    graph_time = ut.sum(axis=0)  # [D]
    graph_mem = float(resident.sum())
    bw_d = np.where(off, bw, np.nan)
    bw_out = np.nanmean(bw_d, axis=1) if d > 1 else np.full(d, bw_ref)
    bw_in = np.nanmean(bw_d, axis=0) if d > 1 else np.full(d, bw_ref)
    comm = float(eb.sum()) / bw_ref
    overhead = (np.asarray(inputs.launch_s, np.float64)
                + np.asarray(inputs.dispatch_s, np.float64))
    groups = np.asarray(inputs.exclusive_group)
    shared = np.array([np.sum(groups == groups[k]) > 1 for k in range(d)], np.float64)
    device_class = device_classes(t, mem)
    # Identical devices would have identical features, and a policy that scores devices
    # by their features could not send two branches to two of them but by chance: each
    # device's rank within its class breaks the tie (targets are relabelled to match:
    # ``canonical``).
    rank = np.zeros(d)
    size = np.zeros(d)
    for c in np.unique(device_class):
        members = np.flatnonzero(device_class == c)
        rank[members] = np.arange(len(members)) / max(len(members) - 1, 1)
        size[members] = len(members) / d
    device_feat = np.stack([
        _log_ratio(t_graph, graph_time) / 4.0,
        (graph_time <= t_graph * (1 + 1e-9)).astype(np.float64),
        _log_ratio(graph_mem, mem) / 4.0,
        _log_ratio(bw_out, bw_ref) / 4.0,
        _log_ratio(bw_in, bw_ref) / 4.0,
        np.full(d, float(_log_ratio(comm, t_graph)) / 4.0),
        np.log1p(u * overhead / t_graph),
        shared, rank, size], axis=1)
    pair_feat = np.stack([
        np.minimum(_log_ratio(ut, t_min[:, None], lo=0.0), 10.0) / 4.0,
        _log_ratio(resident[:, None], mem[None, :]) / 4.0], axis=2)
    edge_bytes = np.zeros(len(src))
    if len(src):
        key = src.astype(np.int64) * u + dst
        order = np.argsort(key)
        cross_key = unit[graph.src[cross]].astype(np.int64) * u + unit[graph.dst[cross]]
        np.add.at(edge_bytes, order[np.searchsorted(key[order], cross_key)], eb[cross])
    edge_feat = _log_ratio(edge_bytes / bw_ref * u, t_graph) / 4.0
    # Each unit's heaviest in-edge (ties: the earliest source) names its parent.
    parent = np.arange(u, dtype=np.int64)
    if len(src):
        order = np.lexsort((src, -edge_bytes, dst))
        first = np.ones(len(order), bool)
        first[1:] = dst[order][1:] != dst[order][:-1]
        parent[dst[order][first]] = src[order][first]
    f32 = np.float32
    return PolicyProblem(unit_of_op=unit.astype(np.int32),
                         unit_feat=unit_feat.astype(f32), device_feat=device_feat.astype(f32),
                         pair_feat=pair_feat.astype(f32), src=src.astype(np.int32),
                         dst=dst.astype(np.int32), edge_feat=edge_feat.astype(f32),
                         unit_time_s=ut, parent=parent.astype(np.int32),
                         device_class=device_class)

"""Lower bounds on the step time of any placement of a graph on a machine."""

from __future__ import annotations

import numpy as np

from simplace.sim.inputs import put_waits_of, sim_inputs


def lower_bound(graph, cost_model) -> float:
    """A step time no placement can beat, in seconds (0 for an empty graph).

    The largest of three bounds, each valid for any placement, any link contention and
    any memory under the simulators' segment semantics (``simplace.sim.reference``:
    communication and the host only ever delay a segment's start):
      * critical path with communication (``chain_bound_s``): along any dependency
        chain the ops run one after another, and where the chain changes device it
        waits for its copy and pays a new segment's launch. A dynamic programme over
        (op, device) bounds each op's end on each device (``chain_tables``); the bound
        is the largest, over ops, of its least end over devices. It is never below the
        critical path with each op at its fastest and free communication, plus the
        least first dispatch and launch (``critical_path_s``): it takes the same
        minima, with more added;
      * total work (``work_bound_s``): an exclusive group runs one segment at a time,
        starting no earlier than the first dispatch, ``min_d dispatch_s[d]``, so the
        step lasts at least that plus ``work_g``, the busy time of any group g, hence
        at least that plus any weighted mean ``sum_g w_g work_g`` (weights ``w >= 0``
        summing to 1). Each op i adds at least ``min_d w_g(d) t_i[d]`` to that mean
        wherever it runs, and the segment holding op i adds at least ``min_d w_g(d)
        (launch_s[d] + _pool_launch_lb[i, d])`` for its launch (for any one i). Equal
        weights give the balanced bound ``(sum_i f_i + launches) / G``; the weights
        that maximise the op term (a small linear program over distinct rows of
        per-group op times) account for slow groups: a CPU beside four GPUs takes far
        less than a fifth of the work. (Dividing by the number of devices instead would
        be wrong when devices share compute.) Here ``t_i[d]`` is ``op_time_s[i, d]``,
        plus ``op_unfused_s[i, d]`` for an op with no in-edges (it never fuses);
      * busy windows (``window_bound_s``): the work bound for the ops that cannot run
        early nor late. Op i runs (its in-segment cost, back to back after its
        segment's launch) no earlier than its head ``h_i = min_d (end_s[i, d] -
        op_time_s[i, d] - op_unfused_s[i, d])`` (``chain_tables``) and ends at least
        ``q_i = min_d tail_s[i, d]`` (``tail_table``) before the step does. For a
        non-empty set A of ops with ``h_i >= h`` and ``q_i >= q``, each group runs its
        share of A inside ``[h, step - q]``, one op at a time (segments of a group do
        not overlap, nor ops inside one), so ``step >= h + q + sum_{i in A} min_d
        w_g(d) op_time_s[i, d]`` for weights w as above. Tried at 128 head quantiles
        and every op's tail.
    The work bound is tight on one device: one segment, ``dispatch + launch + its ops``.

    Under the throughput objective (``simplace.sim.objective``) the bound is on the
    busiest resource instead (``throughput_bound_s``); under a ruler, the ruler's own.

    Args:
      graph: an ``OpGraph``.
      cost_model: a ``CostModel`` (or its interface) or a ``SimInputs``.
    """
    inp = sim_inputs(graph, cost_model)
    if inp.objective != "latency":
        return throughput_bound_s(graph, inp)
    if graph.num_ops == 0:
        return 0.0
    end_s, _ = chain_tables(graph, inp)
    weights = _group_weights(graph, inp)
    return max(float(end_s.min(axis=1).max()), _work(graph, inp, weights),
               _window(graph, inp, end_s, weights))


def throughput_bound_s(graph, cost_model) -> float:
    """A lower bound on the objective that is not the step time: a ruler's own bound,
    or for the throughput objective the busiest group's least possible busy time (the
    total-work bound without the first dispatch: with pipelined steps a group is busy
    all the time between steps at most) and the longest op with its launch."""
    from simplace.sim.objective import Ruler

    inp = sim_inputs(graph, cost_model)
    if isinstance(inp.objective, Ruler):
        return float(inp.objective.lower_bound_s())
    if graph.num_ops == 0:
        return 0.0
    times = _source_times(graph, inp)
    launch = np.asarray(inp.launch_s, dtype=np.float64)
    group = np.asarray(inp.exclusive_group, dtype=np.int64)
    seg = launch[None, :] + _pool_launch_lb(inp)
    work = max(_weighted_work(times, seg, group, w) for w in _group_weights(graph, inp))
    return max(work, float((times + seg).min(axis=1).max()))


def work_bound_s(graph, cost_model) -> float:
    """The total-work bound of ``lower_bound`` (see there), in seconds (0 for an empty
    graph).

    Args:
      graph: an ``OpGraph``.
      cost_model: a ``CostModel`` (or its interface) or a ``SimInputs``.
    """
    inp = sim_inputs(graph, cost_model)
    if graph.num_ops == 0:
        return 0.0
    return _work(graph, inp, _group_weights(graph, inp))


def window_bound_s(graph, cost_model) -> float:
    """The busy-window bound of ``lower_bound`` (see there), in seconds (0 for an empty
    graph).

    Args:
      graph: an ``OpGraph`` (ops in a topological order).
      cost_model: a ``CostModel`` (or its interface) or a ``SimInputs``.
    """
    inp = sim_inputs(graph, cost_model)
    if graph.num_ops == 0:
        return 0.0
    end_s, _ = chain_tables(graph, inp)
    return _window(graph, inp, end_s, _group_weights(graph, inp))


def _source_times(graph, inp) -> np.ndarray:
    """float64[M, D]: ``op_time_s``, plus ``op_unfused_s`` for ops with no in-edges."""
    no_inputs = np.diff(graph.in_edges[0]) == 0
    return np.asarray(inp.op_time_s, dtype=np.float64) + inp.op_unfused_s * no_inputs[:, None]


def _group_weights(graph, inp) -> list[np.ndarray]:
    """The group weights the work and window bounds try: equal, and the LP's."""
    group = np.asarray(inp.exclusive_group, dtype=np.int64)
    g = inp.num_groups
    return [np.full(g, 1.0 / g), _best_weights(_source_times(graph, inp), group, g)]


def _work(graph, inp, weights) -> float:
    times = _source_times(graph, inp)
    launch = np.asarray(inp.launch_s, dtype=np.float64)
    group = np.asarray(inp.exclusive_group, dtype=np.int64)
    seg = launch[None, :] + _pool_launch_lb(inp)  # [M, D]
    work = max(_weighted_work(times, seg, group, w) for w in weights)
    return float(np.min(inp.dispatch_s)) + work


def _pool_launch_lb(inp) -> np.ndarray:
    """float64[M, D]: at most the pool launch of any segment holding op i on device d:
    what op i's pool work alone earns (work only adds up), or, on a machine of one
    device, where every placement is one segment, what the whole graph's earns."""
    if inp.num_devices == 1:
        pays = inp.op_pool_work.sum(axis=0) >= inp.pool_min_work
        return np.broadcast_to(np.where(pays, inp.pool_launch_s, 0.0), inp.op_pool_work.shape)
    return np.where(inp.op_pool_work >= inp.pool_min_work[None, :],
                    inp.pool_launch_s[None, :], 0.0)


# Head thresholds the window bound tries (quantiles of the heads); the tail threshold
# is tried at every op's tail.
_WINDOW_HEADS = 128


def _window(graph, inp, end_s, weights) -> float:
    m = graph.num_ops
    t = np.asarray(inp.op_time_s, dtype=np.float64)
    head = (end_s - t - inp.op_unfused_s).min(axis=1)
    tail = tail_table(graph, inp).min(axis=1)
    group = np.asarray(inp.exclusive_group, dtype=np.int64)
    order = np.argsort(-tail, kind="stable")  # tails from the largest down
    tail_o, head_o = tail[order], head[order]
    hs = np.unique(np.quantile(head, np.linspace(0.0, 1.0, min(m, _WINDOW_HEADS))))
    shares = [(t * w[group][None, :]).min(axis=1)[order] for w in weights]
    best = 0.0
    for k in range(0, len(hs), 32):  # 32 thresholds at a time: [32, M] arrays
        h = hs[k:k + 32, None]
        inside = head_o[None, :] >= h  # op j in the window of threshold h
        for share in shares:
            # Position j: the ops of tail >= tail_o[j] (and head >= h), counted only
            # where op j itself is in (the set is then not empty, and j's tail the least).
            work = np.cumsum(np.where(inside, share[None, :], 0.0), axis=1)
            total = np.where(inside, h + tail_o[None, :] + work, -np.inf)
            best = max(best, float(total.max()))
    return best


def chain_bound_s(graph, cost_model) -> float:
    """The critical path with communication: a step time no placement can beat.

    ``max_i min_d end_s[i, d]`` for the table ``end_s`` of ``chain_tables`` (see there
    for the proof); 0 for an empty graph.

    Args:
      graph: an ``OpGraph`` (ops in a topological order).
      cost_model: a ``CostModel`` (or its interface) or a ``SimInputs``.
    """
    if graph.num_ops == 0:
        return 0.0
    end_s, _ = chain_tables(graph, cost_model)
    return float(end_s.min(axis=1).max())


def chain_tables(graph, cost_model) -> tuple[np.ndarray, np.ndarray]:
    """Per op and device, lower bounds on when the op ends and when its segment's call
    is made, if the op runs on that device, whatever the other ops do.

    Returns ``(end_s, call_s)``, both ``float64[M, D]``:
      * ``end_s[v, d] <= `` the *virtual end* of op v in any placement ``p`` with ``p[v]
        = d``: its segment's start, plus ``launch_s[d]`` and the segment's pool launch
        (at least ``_pool_launch_lb`` of any of its ops), plus the in-segment costs of
        its ops up to v (the segment's first op to v), as ``Schedule.op_end_s``. The
        segment ends at or after it, so the step does too;
      * ``call_s[v, d] <= `` the host time at which v's segment is dispatched (the host
        clock after that call, as ``Schedule.segment_dispatch_s``).

    Notation: ``t = op_time_s``, ``ol = _pool_launch_lb(inp)``, ``uf =
    op_unfused_s``; ``enter[v, d] = launch_s[d] + ol[v, d] + t[v, d]``; ``S[u, v, d] =
    sum_{u < i <= v} t[i, d]``;
    ``B[u, v]`` the bytes of the distinct outputs of u that v reads (u's put to v's
    device carries at least these; an output's size is its largest ``edge_bytes``, as the
    simulators take it); ``arrive[u, d', d] = max(end_s[u, d'], call_s[u, d'] + put_s[d',
    d]) + latency_s[d', d] + B[u, v] / bandwidth_bytes_per_s[d', d]``; ``after[u, d', d]
    = call_s[u, d'] + put_s[d', d] + dispatch_s[d]``.

    The tables are built in topological order. A source v (no in-edges) never fuses,
    and the host clock reads at least one call when it dispatches v's segment:
    ``call_s[v, d] = dispatch_s[d]``, ``end_s[v, d] = dispatch_s[d] + enter[v, d]
    + uf[v, d]``. For any other v on d, each producer u of v (u < v) is, in any
    placement, in one of three places:
      1. **v's segment** (on d): then the ops u+1..v all run in it (segments are runs of
         consecutive ops), so ``end(v) >= end(u) + S[u, v, d]``; same call as u's;
      2. **an earlier segment of d**: that segment ends before v's starts (a group runs
         its segments one at a time in graph order), and v's segment's call is a later
         call on the same host thread: start ``>= max(end_s[u, d], call_s[u, d] +
         dispatch_s[d])``, and ``end(v) >= start + enter[v, d]``;
      3. **another device d'**: v's segment starts only once u's outputs arrived by a
         ``device_put`` issued after u's segment was dispatched (the host issues puts
         just before the first segment on d reading them, later in graph order), which
         starts no earlier than the put call returned and u's segment ended, and lasts
         at least ``latency + B / bandwidth``; v's segment's call comes after that put:
         ``end(v) >= max(arrive[u, d', d], after[u, d', d]) + enter[v, d]`` and
         ``call(v) >= after[u, d', d]``; on a link with ``put_waits`` the host waits for
         the copy, so ``after[u, d', d]`` is at least ``arrive[u, d', d] +
         dispatch_s[d]`` too.
    Let ``same_u`` (case 1), ``new_u`` (the least of case 2 and case 3 over d') and
    ``any_u = min(same_u, new_u)`` be these bounds on ``end(v)``. Always ``end(v) >=
    call(v) + enter[v, d]`` (v's segment starts after its call) and ``end(v) >= max_u
    any_u``. If v shares its segment with some producer (it fuses), ``end(v) >= min_u
    same_u`` too; if not, every producer is in case 2 or 3 and v pays ``uf[v, d]``:
    ``end(v) >= max_u new_u + uf[v, d]``. ``end_s[v, d]`` is the smaller of those two
    cases' bounds, and ``call_s[v, d]`` the largest over u of the least call over the
    three cases (at least ``dispatch_s[d]``). Every step uses only lower bounds of the earlier ops
    (induction over the topological order), and ignores memory, link queues and the
    host's other calls, which only delay.

    Args:
      graph: an ``OpGraph`` (ops in a topological order).
      cost_model: a ``CostModel`` (or its interface) or a ``SimInputs``.
    """
    inp = sim_inputs(graph, cost_model)
    m, d = inp.num_ops, inp.num_devices
    t = np.asarray(inp.op_time_s, dtype=np.float64)
    launch = np.asarray(inp.launch_s, dtype=np.float64)
    dispatch = np.asarray(inp.dispatch_s, dtype=np.float64)
    put = np.asarray(inp.put_s, dtype=np.float64)
    lat = np.asarray(inp.latency_s, dtype=np.float64)
    inv_bw = 1.0 / np.asarray(inp.bandwidth_bytes_per_s, dtype=np.float64)  # 0 for inf
    unfused = np.asarray(inp.op_unfused_s, dtype=np.float64)
    enter = launch[None, :] + _pool_launch_lb(inp) + t  # [M, D]
    # prefix[i] = sum of t over ops < i: S[u, v] = prefix[v + 1] - prefix[u + 1].
    prefix = np.zeros((m + 1, d))
    np.cumsum(t, axis=0, out=prefix[1:])
    # Another device only: the diagonal (the same device) is cases 1 and 2.
    other = np.where(np.eye(d, dtype=bool), np.inf, 0.0)
    put_then_call = put + dispatch[None, :]  # [d', d]
    waits = put_waits_of(inp)
    waits = waits if waits.any() else None  # (most machines: no wait to add)

    end_s = dispatch[None, :] + enter + unfused  # the sources' values; others overwritten
    call_s = np.broadcast_to(dispatch, (m, d)).copy()
    ps, pd, nbytes = _producer_pairs(graph)
    if len(ps) == 0:
        return end_s, call_s
    level = _levels(m, ps, pd)
    order = np.lexsort((pd, level[pd]))  # pairs by their consumer's level, then consumer
    ps, pd, nbytes = ps[order], pd[order], nbytes[order]
    cuts = np.searchsorted(level[pd], np.arange(1, int(level.max()) + 2))
    starts, at = _group_starts(pd, cuts)
    for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):  # one level
        u, v = ps[a:b], pd[a:b]
        end_u, call_u = end_s[u], call_s[u]  # [k, D]
        ent = enter[v]
        same = end_u + (prefix[v + 1] - prefix[u + 1])  # case 1
        later = np.maximum(end_u, call_u + dispatch[None, :]) + ent  # case 2
        after = call_u[:, :, None] + put_then_call[None] + other  # [k, d', d]
        arrive = (np.maximum(end_u[:, :, None], call_u[:, :, None] + put[None])
                  + lat[None] + nbytes[a:b, None, None] * inv_bw[None])
        if waits is not None:  # the host waits for such a copy, then makes v's call
            after = np.where(waits[None], np.maximum(after, arrive + dispatch[None, None, :]),
                             after)
        moved = (np.maximum(arrive, after) + other).min(axis=1) + ent  # case 3, [k, D]
        new = np.minimum(later, moved)
        any_ = np.minimum(same, new)
        call = np.minimum(call_u, after.min(axis=1))
        first = starts[at[k]:at[k + 1]] - a  # each consumer's first pair
        ops = v[first]
        call_v = np.maximum(dispatch[None, :], np.maximum.reduceat(call, first, axis=0))
        floor = call_v + enter[ops]
        fused = np.maximum(np.maximum(np.maximum.reduceat(any_, first, axis=0),
                                      np.minimum.reduceat(same, first, axis=0)), floor)
        alone = np.maximum(np.maximum.reduceat(new, first, axis=0), floor) + unfused[ops]
        end_s[ops] = np.minimum(fused, alone)
        call_s[ops] = call_v
    return end_s, call_s


def tail_table(graph, cost_model) -> np.ndarray:
    """float64[M, D]: ``tail_s[v, d] <= `` the step time less the virtual end of op v
    (``chain_tables``) in any placement with ``p[v] = d``.

    Built in reverse topological order, ``tail_s = 0`` for an op nobody reads (its
    segment ends after it, the step after that). For each consumer w of v (notation of
    ``chain_tables``), in any placement w is 1. in v's segment: ``end(w) >= end(v) +
    S[v, w, d]``; 2. in a later segment of d, which starts after v's segment ended:
    ``end(w) >= end(v) + enter[w, d]``; 3. on another device d'', whose segment starts
    after v's segment ended and the copy crossed the link: ``end(w) >= end(v) +
    latency_s[d, d''] + B[v, w] / bandwidth_bytes_per_s[d, d''] + enter[w, d'']``. Then
    the step lasts at least ``tail_s[w, p[w]]`` more; ``tail_s[v, d]`` is the largest,
    over consumers, of the least of these cases.

    Args:
      graph: an ``OpGraph`` (ops in a topological order).
      cost_model: a ``CostModel`` (or its interface) or a ``SimInputs``.
    """
    inp = sim_inputs(graph, cost_model)
    m, d = inp.num_ops, inp.num_devices
    t = np.asarray(inp.op_time_s, dtype=np.float64)
    enter = (np.asarray(inp.launch_s, dtype=np.float64)[None, :]
             + _pool_launch_lb(inp) + t)
    prefix = np.zeros((m + 1, d))
    np.cumsum(t, axis=0, out=prefix[1:])
    other = np.where(np.eye(d, dtype=bool), np.inf, 0.0)
    lat = np.asarray(inp.latency_s, dtype=np.float64)
    inv_bw = 1.0 / np.asarray(inp.bandwidth_bytes_per_s, dtype=np.float64)
    tail_s = np.zeros((m, d))
    ps, pd, nbytes = _producer_pairs(graph)
    if len(ps) == 0:
        return tail_s
    # Levels of the reversed graph (op i is op m-1-i there): consumers come first.
    level = _levels(m, m - 1 - pd, m - 1 - ps)[::-1]
    order = np.lexsort((ps, level[ps]))  # pairs by their producer's level, then producer
    ps, pd, nbytes = ps[order], pd[order], nbytes[order]
    cuts = np.searchsorted(level[ps], np.arange(1, int(level.max()) + 2))
    starts, at = _group_starts(ps, cuts)
    for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
        u, w = ps[a:b], pd[a:b]
        after_w = enter[w] + tail_s[w]  # [k, D]
        same = np.minimum(prefix[w + 1] - prefix[u + 1] + tail_s[w], after_w)  # 1, 2
        moved = (lat[None] + nbytes[a:b, None, None] * inv_bw[None] + after_w[:, None, :]
                 + other).min(axis=2)  # case 3, [k, D]: from u's device, over w's
        first = starts[at[k]:at[k + 1]] - a  # each producer's first pair
        tail_s[u[first]] = np.maximum.reduceat(np.minimum(same, moved), first, axis=0)
    return tail_s


def _producer_pairs(graph):
    """``(src, dst, bytes)`` per distinct producer-consumer pair, by producer then
    consumer: the bytes of the outputs of src that dst reads (each output's size its
    largest ``edge_bytes``, as the simulators take it). An ``OpGraph`` has one edge per
    (src, dst, output), so each edge is one output read once."""
    src = np.asarray(graph.src, dtype=np.int64)
    dst = np.asarray(graph.dst, dtype=np.int64)
    if len(src) == 0:
        return src, dst, np.zeros(0)
    m = int(graph.num_ops)
    out = np.asarray(graph.edge_output, dtype=np.int64)
    eb = np.asarray(graph.edge_bytes, dtype=np.float64)
    _, tensor_of = np.unique(src * (int(out.max()) + 1) + out, return_inverse=True)
    tensor_of = tensor_of.reshape(-1)
    size = np.zeros(int(tensor_of.max()) + 1)
    np.maximum.at(size, tensor_of, eb)
    pairs, pair_of = np.unique(src * m + dst, return_inverse=True)
    nbytes = np.bincount(pair_of.reshape(-1), weights=size[tensor_of], minlength=len(pairs))
    return pairs // m, pairs % m, nbytes


def _group_starts(key: np.ndarray, cuts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of equal ``key`` starts, and for each cut, the first run at or after
    it (cuts fall on run starts): the runs of cut range k are ``starts[at[k]:at[k+1]]``."""
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    return starts, np.searchsorted(starts, cuts)


def _levels(m: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """int[M]: the number of ops on the longest path into each op (sources 0); ops at one
    level do not depend on each other. Needs ``src < dst`` (a topological order)."""
    if np.any(src >= dst):
        raise ValueError("graph ops are not in a topological order (an edge goes from op "
                         f"{int(src[src >= dst][0])} to an earlier or the same op); "
                         "build the OpGraph with simplace.trace, which orders them.")
    level = [0] * m
    order = np.argsort(dst, kind="stable")
    for u, v in zip(src[order].tolist(), dst[order].tolist(), strict=True):
        if level[u] >= level[v]:
            level[v] = level[u] + 1
    return np.asarray(level, dtype=np.int64)


def _weighted_work(times, seg, group, w) -> float:
    """``sum_g w_g work_g`` is at least this for any placement (``lower_bound``)."""
    wd = w[group]  # [D]
    ops = (times * wd[None, :]).min(axis=1).sum()
    return float(ops + (seg * wd[None, :]).min(axis=1).max())


def _best_weights(times, group, g: int) -> np.ndarray:
    """Group weights (summing to 1) maximising ``sum_i min_d w_g(d) t_i[d]``, by a linear
    program over the distinct rows of per-group op times; equal weights if it fails."""
    equal = np.full(g, 1.0 / g)
    if g == 1:
        return equal
    per_group = np.full((times.shape[0], g), np.inf)
    for k in range(g):  # the fastest device of each group
        per_group[:, k] = times[:, group == k].min(axis=1)
    scale = float(np.max(per_group[np.isfinite(per_group)], initial=0.0))
    if not scale > 0:
        return equal
    rows, counts = np.unique(per_group / scale, axis=0, return_counts=True)
    u = len(rows)
    # Variables: w (g), then y (u); maximise sum counts * y, i.e. minimise its negative,
    # subject to y_r <= w_k rows[r, k] for each finite entry and sum w = 1.
    r_idx, k_idx = np.nonzero(np.isfinite(rows))
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    n = len(r_idx)
    a_ub = coo_matrix((np.concatenate([np.ones(n), -rows[r_idx, k_idx]]),
                       (np.concatenate([np.arange(n), np.arange(n)]),
                        np.concatenate([g + r_idx, k_idx]))), shape=(n, g + u))
    res = linprog(np.concatenate([np.zeros(g), -counts.astype(np.float64)]),
                  A_ub=a_ub.tocsr(), b_ub=np.zeros(n),
                  A_eq=np.concatenate([np.ones(g), np.zeros(u)])[None, :], b_eq=[1.0],
                  bounds=[(0, None)] * g + [(0, None)] * u, method="highs")
    if res.status != 0:
        return equal
    w = np.clip(res.x[:g], 0.0, None)
    return w / w.sum() if w.sum() > 0 else equal


def critical_path_s(graph, op_time_s: np.ndarray) -> float:
    """The longest path through ``graph`` when op i takes ``op_time_s[i]`` seconds and
    communication is free (ops are in a topological order, so one pass suffices)."""
    m = graph.num_ops
    if m == 0:
        return 0.0
    finish = np.zeros(m)
    ptr, order = graph.in_edges
    src = graph.src[order]
    for i in range(m):
        lo, hi = ptr[i], ptr[i + 1]
        ready = finish[src[lo:hi]].max() if hi > lo else 0.0
        finish[i] = ready + op_time_s[i]
    return float(finish.max())

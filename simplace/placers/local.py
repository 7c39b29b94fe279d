"""``local``: simulated annealing over the batched simulator, racing the best heuristics.

Starts: the placements given by the methods named in option ``starts`` (a list, or one
string of comma-separated names; default: every method of kind heuristic, in
registered ``rank``; methods that fail are skipped
and reported in ``info["starts"]``) and by ``single`` (unless a given placement puts
every op on one device: ``compare`` passes single's among those it found). ``starts``
may also hold placements (int[M] arrays) to start from.

The race (option ``race``, default 3): the search anneals from the ``race`` best
(lowest score, see below) distinct starts at once, one lane each, taking rounds in turn.
It runs in rungs of equal progress (1 + ceil(log2 lanes) of them); at the end of each, the
lanes whose best placement is in the slower half stop, so the last rung is one lane's
alone. The best-scoring start is not always where annealing ends best on rugged
problems, hence the race. ``info["lanes"]``: each lane's start, best score, rounds and
where it ended. ``race=1`` anneals from the best start alone.

Each round proposes a batch of ``batch`` neighbours of the current placement and scores
them in one call of the batched simulator (``ctx.batched``, the call behind
``ctx.score``). The score is ``ctx.score``'s (step time; OOM placements behind every
placement that fits) plus, for OOM placements, ``OOM_PENALTY`` times their relative memory
excess, so that from an OOM start the search is led to placements that fit. A neighbour
is one move, or (40%) a few moves in a row (2, or a kick of 3-6):
  * op: one op to another device, either a random op to a random device or an op at a
    cut (an edge between two devices) to the device of the op across the cut;
  * group: every op of one group to one device; groupings are
    ``chain_collapse(colocate_free_ops(g))``, ``target_count`` of it (a few sizes) and
    ``by_module`` at depths 1..4;
  * swap: two groups of one grouping that sit on different devices exchange devices;
  * subtree: every op whose module path starts with a prefix (forward ops, backward ops,
    or both) to one device.
Under a ruler with colocation classes (``simplace.sim.objective``) an op or cut move
takes the op's whole class along, and the classes are one more grouping.
Screening (option ``screen``, default "auto": on when most starts needed the
simulator's exact memory check, i.e. its cheap memory bound says little on this graph and
machine, as for big training graphs on GPUs): the batch is scored by a batched simulator
without memory (``memory=False``, far cheaper there), and only the ``screen_checks``
(default 2) fastest neighbours are checked for memory, and only in rounds where the
fastest would be accepted (neighbours whose parameters alone overflow a device are
left out); if all of them are OOM, the next ``screen_checks`` (up to 4 times); the best
of those that fit is the batch's best. While the
current placement is OOM, the ``REPAIR_CHECKS`` neighbours with the least parameter
memory excess (then the fastest) are checked instead, every round.

Acceptance is simulated annealing on the batch's best neighbour: it becomes the current
placement if it is no worse, else with probability ``exp(-delta / T)``. The temperature
falls geometrically from ``t0`` to ``t1`` (fractions of the step time of the start, or
of the first placement found that fits; while none fits the search is greedy) over the
budget (the fraction of ``max_evaluations`` used, or of the time budget, whichever is
further along); every lane follows the same schedule. After ``patience // 4`` of its
rounds without a new best a lane returns to its best placement; after ``patience`` it
stops if other lanes run. The last lane stops then too (the search has converged, stop
reason ``"patience"``), unless the caller gave a time budget (``budget_s``) with at least
a tenth of the search's time left: then it restarts (iterated local search) from the
best placement a few random moves away, the temperature falling again from ``t0`` over
the time left (``info["restarts"]``). Without ``budget_s`` the default budget is only a
cap: a converged search does not restart to fill it. The best placement ever scored
is returned, so an OOM placement is returned only if every placement scored was OOM.

Stopping and determinism: option ``max_evaluations`` caps the number of placements
scored; with it and no ``budget_s`` the search is deterministic for a fixed seed (the
same placement on any machine). With a time budget (``budget_s``, default 30 s when no
``max_evaluations`` is given) the number of rounds, hence the result, depends on the
machine's speed. The budget runs from the call of ``optimize``: start heuristics (no more
are started once half of it is spent, nor one whose estimated cost does not fit what is
left of that half; each gets at most a quarter of the budget and stops there if it
takes one; ``single`` always runs) and compilation count against it, and a round is
started only when it is expected to end in time (see ``simplace.search``).
``request_stop()`` (Ctrl-C in the CLI) ends the search at the next round with the best
placement so far (stop reason ``"interrupted"``).

The clock, the best placement, the kept candidates, history, progress and validation are
a ``simplace.search.SearchSession``: with option ``validate`` (a hook ``(round,
candidates, cost_model) -> CostModel | None``, e.g.
``simplace.validate.make_validation_callback``), called every ``validate_every`` rounds
(0, the default: only at the end, with round -1) with the ``top_k`` best distinct
placements scored so far, best first, a returned cost model is what the search goes on
against: a new context (simulators) for it, the kept placements re-scored, and the
result is the best under the last model (``PlacerOutput.cost_model``;
``info["validation"]`` counts calls and corrections).
"""

from __future__ import annotations

import math
import time

import numpy as np

from simplace.errors import OptionError, SimplaceError
from simplace.graph import split_name_path
from simplace.groups import by_module, chain_collapse, colocate_free_ops, target_count
from simplace.placers import Option, PlacerContext, PlacerOutput, float_option, int_option, register
from simplace.placers._list_runs import int_list_option
from simplace.placers.registry import option_values
from simplace.search import OOM_PENALTY, SESSION_OPTIONS, penalised, stop_requested
from simplace.sim.objective import Ruler

DEFAULT_BUDGET_S = 30.0
SCREEN_ROUNDS = 4  # screened rounds: at most this many calls of screen_checks checks
REPAIR_CHECKS = 16  # screened rounds from an OOM placement: exact memory checks per round
# A stalled search under a time budget restarts from its best placement, this many
# random neighbour steps away, if at least RESTART_SHARE of the budget is left.
RESTART_KICKS = 3
RESTART_SHARE = 0.1
# Start heuristics are run until this share of the budget is spent (``single`` always).
STARTS_SHARE = 0.5
# Several starts race because the best-scoring start is not where annealing ends best on
# rugged problems: on nmt_4layer x haswell_k40x4, from m_etf's 452 ms start two runs ended
# at 394 and 407 ms, from single's 5,168 ms at 346 and 382 ms
# (bench/results/headroom_2026-11-24_vm.txt).
DEFAULT_RACE = 3
_BIG = 2**31 - 1  # counts that become array sizes


def _screen(value):
    if isinstance(value, str) and value == "auto":
        return value
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise OptionError(f"value must be 'auto', True or False, got {value!r}.")


OPTIONS = {
    "starts": Option("method names and/or int[M] placements to start from (default: every "
                     "fast heuristic, and single)"),
    "max_evaluations": int_option("stop after this many placements scored (deterministic "
                                  "without budget_s)", None, 1, 2**62),
    "patience": int_option("rounds without a new best before stopping, or before a restart "
                           "while a time budget has time left (default 200)", 200, 1, _BIG),
    "batch": int_option("neighbours proposed and scored per round (default 256; fewer on "
                        "big graphs without screening)", None, 1, _BIG),
    "screen": Option("'auto' (default), True or False: rank neighbours without memory, check "
                     "the fastest", "auto", _screen),
    "screen_checks": int_option("neighbours checked for memory per screened call (default 2)",
                                2, 1, _BIG),
    "t0": float_option("start temperature, a fraction of the start's step time (default "
                       "0.01)", 0.01, 0.0, lo_open=True),
    "t1": float_option("final temperature, a fraction of it (default 1e-4)", 1e-4, 0.0,
                       lo_open=True),
    "module_depths": int_list_option("module-path depths whose groups are moved (default "
                                     "(1, 2, 3, 4))", (1, 2, 3, 4), 0),
    "race": int_option(f"anneal from this many of the best distinct starts at once, halving "
                       f"them as the search goes (default {DEFAULT_RACE}; 1: the best start "
                       f"only)", DEFAULT_RACE, 1, _BIG),
    **{name: Option(*spec) for name, spec in SESSION_OPTIONS.items()},
}


def _restart_worth_it(t_search: float, deadline: float) -> bool:
    """At least RESTART_SHARE of the search's time is left for a restart."""
    now = time.perf_counter()
    return deadline > now and deadline - now >= RESTART_SHARE * (deadline - t_search)


# ---------------------------------------------------------------- scoring
def _objective(ctx: PlacerContext, placements: np.ndarray):
    """(float64[B], bool[B]): ``ctx.score`` (the penalised step time) plus, for OOM
    placements, ``OOM_PENALTY`` times their memory excess (sum over devices of
    (peak - capacity) / capacity), so that among OOM placements the search heads for
    ones that fit; and which placements the simulator had to check exactly for memory.

    Same simulator call as ``ctx.score``: in ``memory="oom"`` mode the peaks of
    placements that may be OOM are exact, the others' are NaN (and they fit)."""
    res = ctx.batched(placements)
    score = penalised(res.step_time_s, res.oom)
    suspect = ~np.all(np.isnan(res.peak_memory_bytes), axis=1)
    if res.oom.any():
        cap = np.maximum(np.asarray(ctx.cost_model.memory_bytes, dtype=np.float64), 1.0)
        over = np.nan_to_num(res.peak_memory_bytes - cap[None, :], nan=0.0)
        excess = np.sum(np.maximum(over, 0.0) / cap[None, :], axis=1)
        score = np.where(res.oom, score + OOM_PENALTY * excess, score)
    return score, suspect


def _param_excess(ctx: PlacerContext, placements: np.ndarray) -> np.ndarray:
    """float64[B]: a lower bound of each placement's memory excess (as in
    ``_objective``) from the parameters alone, which stay resident all step."""
    g = ctx.graph
    b, d = len(placements), int(ctx.cost_model.num_devices)
    if g.num_params == 0 or len(g.param_op) == 0:
        return np.zeros(b)
    held = np.zeros((b, g.num_params, d), dtype=bool)
    rows = np.repeat(np.arange(b), len(g.param_op))
    held[rows, np.tile(g.param_index, b), placements[:, g.param_op].reshape(-1)] = True
    resident = np.einsum("bpd,p->bd", held, np.asarray(g.param_sizes, dtype=np.float64))
    cap = np.maximum(np.asarray(ctx.cost_model.memory_bytes, dtype=np.float64), 1.0)
    return np.sum(np.maximum(resident - cap[None, :], 0.0) / cap[None, :], axis=1)


def _pad(placements: np.ndarray, batch: int) -> np.ndarray:
    k = len(placements)
    if k >= batch:
        return placements
    return np.concatenate([placements, np.repeat(placements[:1], batch - k, axis=0)])


def _score_fixed(ctx: PlacerContext, placements: np.ndarray, batch: int):
    """``_objective`` of any number of placements, always in calls of exactly ``batch``
    rows (the last chunk padded with copies), so the simulator compiles one batch size."""
    n = len(placements)
    out, suspect = np.empty(n), np.zeros(n, dtype=bool)
    for s in range(0, n, batch):
        chunk = placements[s:s + batch]
        k = len(chunk)
        o, sus = _objective(ctx, _pad(chunk, batch))
        out[s:s + k], suspect[s:s + k] = o[:k], sus[:k]
    return out, suspect


# ---------------------------------------------------------------- starts


def _start_list(ctx: PlacerContext) -> list:
    starts = ctx.options.get("starts")
    if starts is None:
        from simplace.placers import methods_of_kind
        from simplace.placers.registry import fast_rank

        # Policies train for a minute each: usable as starts only when named. Starts stop
        # being begun at half the budget, so they go in their registered ``rank``: the
        # cheapest, then the pretrained policy (the best start on big graphs at equal
        # wall time: bench/results/pretrained_2026-11-27_vm_equal-time.txt), then the
        # partitioners and the list schedulers best first, ideals last.
        starts = sorted(methods_of_kind("heuristic"), key=fast_rank)
    elif isinstance(starts, str):  # one method name or several, comma-separated
        starts = [name.strip() for name in starts.split(",") if name.strip()]
    elif isinstance(starts, np.ndarray):
        starts = [starts] if starts.ndim == 1 else list(starts)
    else:
        starts = list(starts)
        if starts and all(isinstance(x, int | np.integer) for x in starts):
            starts = [np.asarray(starts)]  # one placement given as a list of ints
    # ``single`` always, unless named or given: a placement of every op on one device
    # stands for it (``compare`` passes single's placement among those it found, and a
    # list scheduler that fell back to one device returned single's).
    if not any((isinstance(x, str) and x == "single")
               or (not isinstance(x, str) and _one_device(x)) for x in starts):
        starts.append("single")
    return starts


def _one_device(placement) -> bool:
    p = np.asarray(placement)
    return p.ndim == 1 and p.size > 0 and bool(np.all(p == p.flat[0]))


def _run_starts(ctx: PlacerContext, starts_until: float, sub_budget: float | None):
    """[(label, placement)] and a report row per start. Heuristics are not started after
    ``starts_until`` (perf_counter time), nor when their estimated cost
    (``simplace.placers.registry.fast_cost_s``) does not fit the time left until then, nor
    once a stop is requested (``single`` is); each is given ``sub_budget`` or the time
    left until ``starts_until``, whichever is less, but at least its estimate."""
    from simplace.placement import check_placement
    from simplace.placers import method_kind, methods, run_method
    from simplace.placers.registry import fast_cost_s

    m, d = ctx.graph.num_ops, ctx.cost_model.num_devices
    found, report = [], []
    known = methods()
    for i, s in enumerate(_start_list(ctx)):
        if isinstance(s, str):
            if s == "all" or (s in known and method_kind(s) in ("annealer", "exhaustive")):
                report.append({"start": s, "error": "not usable as a start"})
                continue
            left_s = starts_until - time.perf_counter()
            need_s = fast_cost_s(s, m, d)
            if s != "single" and (left_s <= 0 or stop_requested()):
                report.append({"start": s, "error": "skipped: time budget spent" if
                               not stop_requested() else "skipped: interrupted"})
                continue
            if s != "single" and need_s > left_s:
                report.append({"start": s, "error": f"skipped: it takes about {need_s:.1f} s "
                               f"here, {left_s:.1f} s of the starts' time left"})
                continue
            t = time.perf_counter()
            try:
                # The raw placement: the search scores every start itself, in one batch.
                out, _ = run_method(ctx.graph, ctx.cost_model, s, seed=ctx.seed,
                                    budget_s=None if sub_budget is None else
                                    max(min(sub_budget, left_s), need_s))
                p = check_placement(out.placement, m, d)
            except Exception as err:  # a failing heuristic must not sink the search
                report.append({"start": s, "error": f"{type(err).__name__}: {err}"})
                continue
            found.append((s, p))
            report.append({"start": s, "wall_s": time.perf_counter() - t})
        else:
            try:
                p = check_placement(s, m, d)
            except SimplaceError as err:
                raise SimplaceError(f"local: start placement {i} is invalid: {err}") from None
            found.append((f"placement[{i}]", p))
            report.append({"start": f"placement[{i}]"})
    return found, report


def _race_starts(placements: np.ndarray, scores: np.ndarray, race: int) -> list[int]:
    """Indices of the ``race`` best distinct placements, best first."""
    picked: list[int] = []
    for k in np.argsort(scores, kind="stable"):
        if len(picked) == race:
            break
        if not any(np.array_equal(placements[k], placements[i]) for i in picked):
            picked.append(int(k))
    return picked


class _Lane:
    """One annealing run of the race: its current placement and its best."""

    def __init__(self, label: str, p: np.ndarray, score: float):
        self.label = label
        self.cur, self.cur_s = p.copy(), score
        self.best, self.best_s = p.copy(), score
        self.start_s = score
        self.stale = self.rounds = 0
        self.end: str | None = None

    def row(self) -> dict:
        return {"start": self.label, "start_score": self.start_s, "score": self.best_s,
                "rounds": self.rounds, "end": self.end}


# ---------------------------------------------------------------- move structures
def _csr(labels: np.ndarray):
    """(order, ptr): members of group g are order[ptr[g]:ptr[g+1]]."""
    order = np.argsort(labels, kind="stable")
    ptr = np.zeros(int(labels.max()) + 2, dtype=np.int64)
    np.cumsum(np.bincount(labels), out=ptr[1:])
    return order.astype(np.int64), ptr


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
    out, seen = [], set()
    for name, labels in cands:
        labels = np.asarray(labels, dtype=np.int64)
        n = int(labels.max()) + 1
        key = labels.tobytes()
        if n < 2 or n >= m or key in seen:  # one group, or no coarser than single ops
            continue
        seen.add(key)
        order, ptr = _csr(labels)
        out.append((name, order, ptr))
    return out


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
    order, ptr = _csr(np.where(cls >= 0, cls, cls.max() + 1))
    return order, ptr, cls


def _subtrees(ctx: PlacerContext) -> list[np.ndarray]:
    """Op sets of module subtrees: every op whose path starts with a prefix, for forward
    ops, backward ops and both; sets of all ops or of one op are left out."""
    m = ctx.graph.num_ops
    sets: dict[tuple, list[int]] = {}
    for i, path in enumerate(ctx.graph.name_path.tolist()):
        backward, parts = split_name_path(path)
        for k in range(1, len(parts) + 1):
            sets.setdefault(("bwd" if backward else "fwd", parts[:k]), []).append(i)
            sets.setdefault(("any", parts[:k]), []).append(i)
    out, seen = [], set()
    for key in sorted(sets):
        ops = np.asarray(sets[key], dtype=np.int64)
        if 1 < len(ops) < m and ops.tobytes() not in seen:
            seen.add(ops.tobytes())
            out.append(ops)
    return out


class _Mover:
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


# ---------------------------------------------------------------- the search
def _default_batch(m: int, screen: bool) -> int:
    # The simulator's cost per call grows with B * M. Without screening many
    # placements go through the exact memory simulation, which is slow and needs much
    # memory on big graphs: keep B * M near a million there.
    if screen or m <= 4000:
        return 256
    return int(max(32, 2 ** int(math.log2(max(1.0, 1e6 / m)))))


def _accepts(delta: float, u: float, temp: float) -> bool:
    return delta <= 0 or u < math.exp(-delta / temp)



def _reference_scores(ctx: PlacerContext, placements: np.ndarray) -> np.ndarray:
    """Penalised step times by the reference simulator, one placement at a time: when a
    stop is requested before the batched simulator has compiled."""
    return np.array([float(penalised(r.step_time_s, r.oom)) for r in
                     (ctx.simulate(p) for p in placements)])


@register("local", kind="annealer", options=OPTIONS)
def place(ctx: PlacerContext) -> PlacerOutput:
    """``local``: simulated annealing over the batched simulator, from the best heuristic."""
    g, opts = ctx.graph, option_values("local", ctx.options)
    m, d = g.num_ops, int(ctx.cost_model.num_devices)
    max_evals = opts["max_evaluations"]
    session = ctx.session("local", default_budget_s=DEFAULT_BUDGET_S if max_evals is None
                          else None)
    budget = session.budget_s
    patience, checks = opts["patience"], opts["screen_checks"]
    t0_rel, t1_rel = opts["t0"], opts["t1"]
    screen, race = opts["screen"], opts["race"]

    found, start_report = _run_starts(
        ctx, session.t_begin + (math.inf if budget is None else STARTS_SHARE * budget),
        None if budget is None else 0.25 * budget)
    if m == 0 or d == 1 or not found:
        p = found[0][1] if found else np.zeros(m, dtype=np.int32)
        return PlacerOutput(p.astype(np.int32), info={"starts": start_report,
                                                      "note": "nothing to search",
                                                      **session.finish("nothing to search")})
    start_p = np.stack([p for _, p in found]).astype(np.int32)
    t_score = time.perf_counter()
    if stop_requested():  # interrupted before anything compiled: the reference simulator
        start_s, suspect = _reference_scores(ctx, start_p), np.zeros(len(start_p), bool)
    else:
        # Starts are scored in the same small fixed batch as the screened rounds' checks.
        start_s, suspect = _score_fixed(ctx, start_p, checks)
    session.first_batch_ready()
    score_s = time.perf_counter() - t_score
    if screen == "auto":
        screen = bool(suspect.mean() >= 0.5)
    batch = _default_batch(m, screen) if opts["batch"] is None else opts["batch"]
    for row, s in zip((r for r in start_report if "error" not in r), start_s, strict=True):
        row["score"] = float(s)
    j = int(np.argmin(start_s))
    for k in np.argsort(start_s, kind="stable"):
        session.offer(start_p[k], float(start_s[k]))
    lanes = [_Lane(found[k][0], start_p[k], float(start_s[k]))
             for k in _race_starts(start_p, start_s, race)]
    alive = list(lanes)
    # Successive halving: the race runs in rungs of equal progress; at the end of each,
    # the lanes whose best is in the slower half stop (the search's progress, as for the
    # temperature, is the share of evaluations or of time used).
    rungs = max(1, math.ceil(math.log2(len(lanes))) + 1)
    rung = 1  # the rung running now; it ends at progress rung / rungs
    evals, memory_checks = len(start_p), len(start_p)
    # Temperatures are fractions of the first fitting best's step time; while nothing
    # fits the search is greedy (uphill steps would only add memory excess).
    ref = session.best_score if session.best_score < OOM_PENALTY else None
    mover = _Mover(ctx, opts["module_depths"])
    rng = ctx.rng
    # The first round compiles the screening simulator (or the bigger batch): expect it
    # to take about as long as scoring the starts (their compilation) did.
    session.expect_compile(score_s)

    def fast_simulator(c: PlacerContext):
        from simplace.sim import batched_simulator

        return batched_simulator(g, c.cost_model, memory=False) if screen else None

    fast = fast_simulator(ctx)
    t_search = time.perf_counter()
    session.record({"evaluations": evals, "best_step_time_s": session.best_score,
                    "current_step_time_s": alive[0].cur_s})
    rounds = accepted = 0
    deadline = session.deadline

    def validate(round_index: int):
        """Call the hook; on a new model: a new context, the lanes re-scored."""
        nonlocal ctx, fast, ref
        made = {}

        def rescore(model, placements):
            made["ctx"] = ctx.with_cost_model(model)  # never changes the context in use
            return _score_fixed(made["ctx"], placements, checks)[0]

        new = session.validate(round_index, rescore)
        if new is None:
            return
        ctx = made["ctx"]
        fast = fast_simulator(ctx)
        scores = _score_fixed(ctx, np.stack([p for x in lanes for p in (x.cur, x.best)]),
                              checks)[0]
        for i, x in enumerate(lanes):
            x.cur_s, x.best_s = float(scores[2 * i]), float(scores[2 * i + 1])
        ref = session.best_score if session.best_score < OOM_PENALTY else None

    def progress(since: float) -> float:
        """Share of the search used: of evaluations, or of the time from ``since``."""
        frac = 0.0 if max_evals is None else evals / max_evals
        if budget is not None and deadline > since:
            frac = max(frac, (time.perf_counter() - since) / (deadline - since))
        return frac

    stop = "budget"
    restarts = 0
    t_phase = t_search  # the temperature schedule's start: the search's, or a restart's
    lane = alive[0]
    while True:
        if max_evals is not None and evals >= max_evals:
            stop = "max_evaluations"
            break
        while len(alive) > 1 and progress(t_search) >= rung / rungs:
            keep = sorted(alive, key=lambda x: x.best_s)[:(len(alive) + 1) // 2]
            for x in alive:
                if x not in keep:
                    x.end = f"rung {rung}"
            alive = [x for x in alive if x in keep]
            rung += 1
        # Round robin: the lane that has run the fewest rounds goes next.
        lane = min(alive, key=lambda x: x.rounds)
        if lane.stale >= patience and len(alive) > 1:
            lane.end = "stalled"  # its time goes to the others
            alive.remove(lane)
            continue
        if lane.stale >= patience:
            # Without a budget of the caller's (the default one is a cap, not a promise),
            # a converged search stops.
            if ctx.budget_s is None or not _restart_worth_it(t_search, deadline):
                stop = "patience"
                break
            # Iterated local search: the budget is a promise of time, and a stalled
            # search that stops early leaves it unused. Kick the best placement a few
            # random moves away and anneal again over the time left.
            restarts += 1
            lane.stale = 0
            cur = session.best.copy()
            for _ in range(RESTART_KICKS):
                cur = mover.propose(rng, cur, 1)[0]
            lane.cur, lane.cur_s = cur, float(_score_fixed(ctx, cur[None], checks)[0][0])
            evals += 1
            t_phase = time.perf_counter()
        if session.should_stop():
            stop = session.stop
            break
        session.step_started()
        if ref is None and session.best_score < OOM_PENALTY:
            ref = session.best_score
        temp = 1e-300 if ref is None else max(
            t0_rel * ref * (t1_rel / t0_rel) ** min(1.0, progress(t_phase)), 1e-300)

        cur, cur_s = lane.cur, lane.cur_s
        cand = mover.propose(rng, cur, batch)
        # A neighbour whose moves cancelled out is the current placement: never pick it,
        # or the search could not take an uphill step.
        same = np.all(cand == cur[None], axis=1)
        evals += batch
        rounds += 1
        lane.rounds += 1
        pick = None
        if screen and cur_s >= OOM_PENALTY:
            # Repair: the current placement is OOM, and the fastest neighbours tend to be
            # too. Rank by the parameters' memory excess (a lower bound of the excess),
            # then step time, and check the first few exactly.
            steps = np.where(same, np.inf, fast(cand).step_time_s)
            u = rng.random()
            first = np.lexsort((steps, _param_excess(ctx, cand)))[:REPAIR_CHECKS]
            obj, _ = _objective(ctx, _pad(cand[first], REPAIR_CHECKS))
            obj = obj[:len(first)]
            memory_checks += len(first)
            pick = int(first[int(np.argmin(obj))]), float(obj.min())
        elif screen:
            # Step times of the whole batch without memory; the exact memory check only
            # for the few fastest, and only when the fastest would be accepted.
            steps = np.where(same, np.inf, fast(cand).step_time_s)
            # Neighbours whose parameters alone overflow a device are surely OOM.
            steps = np.where(_param_excess(ctx, cand) > 0, np.inf, steps)
            u = rng.random()
            ranked = np.argsort(steps, kind="stable")
            ranked = ranked[np.isfinite(steps[ranked])][:checks * SCREEN_ROUNDS]
            if len(ranked) and _accepts(float(steps[ranked[0]]) - cur_s, u, temp):
                # Check the fastest few; if all are OOM, the next few (at a memory
                # frontier the fastest neighbours are often the ones that overflow).
                for c in range(0, len(ranked), checks):
                    few = ranked[c:c + checks]
                    obj, _ = _objective(ctx, _pad(cand[few], checks))
                    obj = obj[:len(few)]
                    memory_checks += len(few)
                    k = int(np.argmin(obj))
                    if pick is None or obj[k] < pick[1]:
                        pick = int(few[k]), float(obj[k])
                    if pick[1] < OOM_PENALTY:
                        break
        else:
            obj, _ = _objective(ctx, cand)
            obj = np.where(same, np.inf, obj)
            u = rng.random()
            k = int(np.argmin(obj))
            pick = k, float(obj[k])
        if pick is not None and _accepts(pick[1] - cur_s, u, temp):
            lane.cur, lane.cur_s = cand[pick[0]].copy(), pick[1]
            accepted += 1
        improved = False
        if pick is not None and math.isfinite(pick[1]):
            # A pick better than the lane's best is always accepted (its current
            # placement is never better than its best).
            session.offer(cand[pick[0]], pick[1])
            if pick[1] < lane.best_s:
                lane.best, lane.best_s = cand[pick[0]].copy(), pick[1]
                improved = True
        if improved:
            lane.stale = 0
        else:
            lane.stale += 1
            if lane.stale % max(1, patience // 4) == 0:
                # back to the lane's best, from a new angle
                lane.cur, lane.cur_s = lane.best.copy(), lane.best_s
        session.step_done()
        if session.validation_due(rounds):
            validate(rounds)  # after the step: a new model's compilation is expected next
        if improved or rounds % 10 == 0:  # rows by round count: deterministic
            session.record({"evaluations": evals, "best_step_time_s": session.best_score,
                            "current_step_time_s": lane.cur_s})
        elapsed = time.perf_counter() - t_search
        session.show(evals, (evals - len(start_p)) / elapsed if elapsed > 0 else 0.0,
                     lane.cur_s)
    if session.hook is not None and stop != "interrupted":
        validate(-1)
    session.record({"evaluations": evals, "best_step_time_s": session.best_score,
                    "current_step_time_s": lane.cur_s})
    search_s = time.perf_counter() - t_search
    best, best_s = session.best, session.best_score
    for lane in alive:
        lane.end = "ran to the end"
    info = {
        "starts": start_report, "start": found[j][0], "start_score": float(start_s[j]),
        "score": best_s, "fits": bool(best_s < OOM_PENALTY), "evaluations": evals,
        "memory_checks": memory_checks if screen else evals, "screen": screen,
        "rounds": rounds, "accepted": accepted, "restarts": restarts, "batch": batch,
        "lanes": [x.row() for x in lanes],
        "search_s": search_s,
        "evaluations_per_s": (evals - len(start_p)) / search_s if search_s > 0 else None,
        "groupings": {name: len(ptr) - 1 for name, _, ptr in mover.groupings},
        "subtrees": len(mover.subtrees),
        **session.finish(stop),
    }
    return PlacerOutput(best.astype(np.int32), history=session.history, info=info,
                        cost_model=session.cost_model if session.validation["corrections"]
                        else None)

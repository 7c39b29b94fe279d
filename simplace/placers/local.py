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
from simplace.placers import Option, PlacerContext, PlacerOutput, float_option, int_option, register
from simplace.placers._list_runs import int_list_option
from simplace.placers._moves import Mover
from simplace.placers.registry import option_values
from simplace.search import OOM_PENALTY, SESSION_OPTIONS, penalised, stop_requested

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


def _start_list(ctx: PlacerContext, add_single: bool = True) -> list:
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
    if add_single and not any((isinstance(x, str) and x == "single")
               or (not isinstance(x, str) and _one_device(x)) for x in starts):
        starts.append("single")
    return starts


def _one_device(placement) -> bool:
    p = np.asarray(placement)
    return p.ndim == 1 and p.size > 0 and bool(np.all(p == p.flat[0]))


def run_starts(ctx: PlacerContext, starts_until: float, sub_budget: float | None,
               add_single: bool = True, always_first: bool = False):
    """[(label, placement)] and a report row per start (``single``'s among them unless
    named or given, or ``add_single`` is False). Heuristics are not started after
    ``starts_until`` (perf_counter time), nor when their estimated cost
    (``simplace.placers.registry.fast_cost_s``) does not fit the time left until then, nor
    once a stop is requested (``single`` is, and with ``always_first`` the first method
    named); each is given ``sub_budget`` or the time left until ``starts_until``,
    whichever is less, but at least its estimate. A method that fails is reported, not
    raised."""
    from simplace.placement import check_placement
    from simplace.placers import method_kind, methods, run_method
    from simplace.placers.registry import fast_cost_s, method

    m, d = ctx.graph.num_ops, ctx.cost_model.num_devices
    found, report = [], []
    known = methods()
    for i, s in enumerate(_start_list(ctx, add_single)):
        if isinstance(s, str):
            if s == "all" or (s in known and method_kind(s) in ("annealer", "exhaustive")):
                report.append({"start": s, "error": "not usable as a start"})
                continue
            left_s = starts_until - time.perf_counter()
            need_s = fast_cost_s(s, m, d)
            forced = s == "single" or (always_first and not report)
            if not forced and (left_s <= 0 or stop_requested()):
                report.append({"start": s, "error": "skipped: time budget spent" if
                               not stop_requested() else "skipped: interrupted"})
                continue
            if not forced and need_s > left_s:
                report.append({"start": s, "error": f"skipped: it takes about {need_s:.1f} s "
                               f"here, {left_s:.1f} s of the starts' time left"})
                continue
            t = time.perf_counter()
            try:
                # The raw placement: the search scores every start itself, in one batch.
                out, _ = run_method(ctx.graph, ctx.cost_model, s, seed=ctx.seed,
                                    budget_s=None if sub_budget is None else
                                    max(min(sub_budget, left_s), need_s, 1e-3),
                                    options=method(s).start_options)
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


def _score_starts(ctx: PlacerContext, session, found: list, checks: int):
    """(int32[S, M] start placements, their scores, which needed the exact memory check,
    seconds the scoring took, compilation included)."""
    start_p = np.stack([p for _, p in found]).astype(np.int32)
    t_score = time.perf_counter()
    if stop_requested():  # interrupted before anything compiled: the reference simulator
        start_s, suspect = _reference_scores(ctx, start_p), np.zeros(len(start_p), bool)
    else:
        # Starts are scored in the same small fixed batch as the screened rounds' checks.
        start_s, suspect = _score_fixed(ctx, start_p, checks)
    session.first_batch_ready()
    return start_p, start_s, suspect, time.perf_counter() - t_score


@register("local", kind="annealer", options=OPTIONS)
def place(ctx: PlacerContext) -> PlacerOutput:
    """``local``: simulated annealing over the batched simulator, from the best heuristic."""
    opts = option_values("local", ctx.options)
    m, d = ctx.graph.num_ops, int(ctx.cost_model.num_devices)
    session = ctx.session("local", default_budget_s=DEFAULT_BUDGET_S
                          if opts["max_evaluations"] is None else None)
    budget = session.budget_s
    found, start_report = run_starts(
        ctx, session.t_begin + (math.inf if budget is None else STARTS_SHARE * budget),
        None if budget is None else 0.25 * budget)
    if m == 0 or d == 1 or not found:
        p = found[0][1] if found else np.zeros(m, dtype=np.int32)
        return PlacerOutput(p.astype(np.int32), info={"starts": start_report,
                                                      "note": "nothing to search",
                                                      **session.finish("nothing to search")})
    start_p, start_s, suspect, score_s = _score_starts(ctx, session, found,
                                                       opts["screen_checks"])
    screen = opts["screen"]
    if screen == "auto":
        screen = bool(suspect.mean() >= 0.5)
    for row, s in zip((r for r in start_report if "error" not in r), start_s, strict=True):
        row["score"] = float(s)
    for k in np.argsort(start_s, kind="stable"):
        session.offer(start_p[k], float(start_s[k]))
    lanes = [_Lane(found[k][0], start_p[k], float(start_s[k]))
             for k in _race_starts(start_p, start_s, opts["race"])]
    search = _Search(ctx, session, opts, screen, lanes, len(start_p))
    # The first round compiles the screening simulator (or the bigger batch): expect it
    # to take about as long as scoring the starts (their compilation) did.
    session.expect_compile(score_s)
    stop = search.run()
    if session.hook is not None and stop != "interrupted":
        search.validate(-1)
    j = int(np.argmin(start_s))
    return search.output(stop, {"starts": start_report, "start": found[j][0],
                                "start_score": float(start_s[j])})


class _Search:
    """The annealing race from its lanes' starts (see the module docstring): its
    context (a new one after a validation's new model), session, counters and the
    temperature schedule."""

    def __init__(self, ctx: PlacerContext, session, opts: dict, screen: bool, lanes: list,
                 num_starts: int):
        self.ctx, self.session, self.screen = ctx, session, screen
        self.batch = _default_batch(ctx.graph.num_ops, screen) if opts["batch"] is None \
            else opts["batch"]
        self.checks, self.patience = opts["screen_checks"], opts["patience"]
        self.t0_rel, self.t1_rel = opts["t0"], opts["t1"]
        self.max_evals = opts["max_evaluations"]
        self.lanes, self.alive = lanes, list(lanes)
        self.lane = lanes[0]  # the lane of the last round
        # Successive halving: the race runs in rungs of equal progress; at the end of
        # each, the lanes whose best is in the slower half stop (the search's progress,
        # as for the temperature, is the share of evaluations or of time used).
        self.rungs = max(1, math.ceil(math.log2(len(lanes))) + 1)
        self.rung = 1  # the rung running now; it ends at progress rung / rungs
        self.num_starts = num_starts
        self.evals = self.memory_checks = num_starts
        self.rounds = self.accepted = self.restarts = 0
        # Temperatures are fractions of the first fitting best's step time; while nothing
        # fits the search is greedy (uphill steps would only add memory excess).
        self.ref = session.best_score if session.best_score < OOM_PENALTY else None
        self.mover = Mover(ctx, opts["module_depths"])
        self.rng = ctx.rng
        self.deadline = session.deadline
        self.fast = None
        self.t_search = self.t_phase = math.nan  # set when the search starts

    def _fast_simulator(self):
        return self.ctx.screen if self.screen else None

    def progress(self, since: float) -> float:
        """Share of the search used: of evaluations, or of the time from ``since``."""
        frac = 0.0 if self.max_evals is None else self.evals / self.max_evals
        if self.session.budget_s is not None and self.deadline > since:
            frac = max(frac, (time.perf_counter() - since) / (self.deadline - since))
        return frac

    def _record(self, cur_s: float) -> None:
        self.session.record({"evaluations": self.evals,
                             "best_step_time_s": self.session.best_score,
                             "current_step_time_s": cur_s})

    def run(self) -> str:
        """Anneal round by round until a stop; the stop reason."""
        session = self.session
        self.fast = self._fast_simulator()
        self.t_search = self.t_phase = time.perf_counter()
        self._record(self.alive[0].cur_s)
        while True:
            if self.max_evals is not None and self.evals >= self.max_evals:
                return "max_evaluations"
            self._halve()
            # Round robin: the lane that has run the fewest rounds goes next.
            lane = self.lane = min(self.alive, key=lambda x: x.rounds)
            if lane.stale >= self.patience and len(self.alive) > 1:
                lane.end = "stalled"  # its time goes to the others
                self.alive.remove(lane)
                continue
            if lane.stale >= self.patience:
                # Without a budget of the caller's (the default one is a cap, not a
                # promise), a converged search stops.
                if self.ctx.budget_s is None or not _restart_worth_it(self.t_search,
                                                                       self.deadline):
                    return "patience"
                self._restart(lane)
            if session.should_stop():
                return session.stop
            self._round(lane)

    def _halve(self) -> None:
        """End the rungs the search's progress has passed: the slower half stops."""
        while len(self.alive) > 1 and self.progress(self.t_search) >= self.rung / self.rungs:
            keep = sorted(self.alive, key=lambda x: x.best_s)[:(len(self.alive) + 1) // 2]
            for x in self.alive:
                if x not in keep:
                    x.end = f"rung {self.rung}"
            self.alive = [x for x in self.alive if x in keep]
            self.rung += 1

    def _restart(self, lane: _Lane) -> None:
        # Iterated local search: the budget is a promise of time, and a stalled search
        # that stops early leaves it unused. Kick the best placement a few random moves
        # away and anneal again over the time left.
        self.restarts += 1
        lane.stale = 0
        cur = self.session.best.copy()
        for _ in range(RESTART_KICKS):
            cur = self.mover.propose(self.rng, cur, 1)[0]
        lane.cur, lane.cur_s = cur, float(_score_fixed(self.ctx, cur[None], self.checks)[0][0])
        self.evals += 1
        self.t_phase = time.perf_counter()

    def _round(self, lane: _Lane) -> None:
        """One round of ``lane``: a batch of neighbours proposed, scored, one picked."""
        session = self.session
        session.step_started()
        if self.ref is None and session.best_score < OOM_PENALTY:
            self.ref = session.best_score
        temp = 1e-300 if self.ref is None else max(
            self.t0_rel * self.ref * (self.t1_rel / self.t0_rel)
            ** min(1.0, self.progress(self.t_phase)), 1e-300)
        cand = self.mover.propose(self.rng, lane.cur, self.batch)
        # A neighbour whose moves cancelled out is the current placement: never pick it,
        # or the search could not take an uphill step.
        same = np.all(cand == lane.cur[None], axis=1)
        self.evals += self.batch
        self.rounds += 1
        lane.rounds += 1
        if self.screen and lane.cur_s >= OOM_PENALTY:
            pick, u = self._pick_repair(cand, same)
        elif self.screen:
            pick, u = self._pick_screened(cand, same, lane.cur_s, temp)
        else:
            obj = np.where(same, np.inf, _objective(self.ctx, cand)[0])
            u = self.rng.random()
            k = int(np.argmin(obj))
            pick = k, float(obj[k])
        improved = self._settle(lane, cand, pick, u, temp)
        session.step_done()
        if session.validation_due(self.rounds):
            self.validate(self.rounds)  # after the step: a new model compiles next
        if improved or self.rounds % 10 == 0:  # rows by round count: deterministic
            self._record(lane.cur_s)
        elapsed = time.perf_counter() - self.t_search
        session.show(self.evals, (self.evals - self.num_starts) / elapsed if elapsed > 0
                     else 0.0, lane.cur_s)

    def _pick_repair(self, cand: np.ndarray, same: np.ndarray):
        """(index, score) of the neighbour picked while the current placement is OOM,
        and the acceptance draw."""
        # The fastest neighbours tend to be OOM too. Rank by the parameters' memory
        # excess (a lower bound of the excess), then step time, and check the first few
        # exactly.
        steps = np.where(same, np.inf, self.fast(cand).step_time_s)
        u = self.rng.random()
        first = np.lexsort((steps, _param_excess(self.ctx, cand)))[:REPAIR_CHECKS]
        obj = _objective(self.ctx, _pad(cand[first], REPAIR_CHECKS))[0][:len(first)]
        self.memory_checks += len(first)
        return (int(first[int(np.argmin(obj))]), float(obj.min())), u

    def _pick_screened(self, cand: np.ndarray, same: np.ndarray, cur_s: float, temp: float):
        """(index, score) of the neighbour picked by screening (None: the fastest would
        not be accepted, or none is left), and the acceptance draw."""
        # Step times of the whole batch without memory; the exact memory check only for
        # the few fastest, and only when the fastest would be accepted.
        steps = np.where(same, np.inf, self.fast(cand).step_time_s)
        # Neighbours whose parameters alone overflow a device are surely OOM.
        steps = np.where(_param_excess(self.ctx, cand) > 0, np.inf, steps)
        u = self.rng.random()
        ranked = np.argsort(steps, kind="stable")
        ranked = ranked[np.isfinite(steps[ranked])][:self.checks * SCREEN_ROUNDS]
        pick = None
        if len(ranked) and _accepts(float(steps[ranked[0]]) - cur_s, u, temp):
            # Check the fastest few; if all are OOM, the next few (at a memory frontier
            # the fastest neighbours are often the ones that overflow).
            for c in range(0, len(ranked), self.checks):
                few = ranked[c:c + self.checks]
                obj = _objective(self.ctx, _pad(cand[few], self.checks))[0][:len(few)]
                self.memory_checks += len(few)
                k = int(np.argmin(obj))
                if pick is None or obj[k] < pick[1]:
                    pick = int(few[k]), float(obj[k])
                if pick[1] < OOM_PENALTY:
                    break
        return pick, u

    def _settle(self, lane: _Lane, cand: np.ndarray, pick, u: float, temp: float) -> bool:
        """Accept the pick or not, offer it to the session, count the lane's stale
        rounds; whether it is a new best of the lane."""
        if pick is not None and _accepts(pick[1] - lane.cur_s, u, temp):
            lane.cur, lane.cur_s = cand[pick[0]].copy(), pick[1]
            self.accepted += 1
        improved = False
        if pick is not None and math.isfinite(pick[1]):
            # A pick better than the lane's best is always accepted (its current
            # placement is never better than its best).
            self.session.offer(cand[pick[0]], pick[1])
            if pick[1] < lane.best_s:
                lane.best, lane.best_s = cand[pick[0]].copy(), pick[1]
                improved = True
        if improved:
            lane.stale = 0
        else:
            lane.stale += 1
            if lane.stale % max(1, self.patience // 4) == 0:
                # back to the lane's best, from a new angle
                lane.cur, lane.cur_s = lane.best.copy(), lane.best_s
        return improved

    def validate(self, round_index: int) -> None:
        """Call the hook; on a new model: a new context, the lanes re-scored."""
        made = {}

        def rescore(model, placements):
            made["ctx"] = self.ctx.with_cost_model(model)  # never the context in use
            return _score_fixed(made["ctx"], placements, self.checks)[0]

        if self.session.validate(round_index, rescore) is None:
            return
        self.ctx = made["ctx"]
        self.fast = self._fast_simulator()
        scores = _score_fixed(self.ctx, np.stack([p for x in self.lanes
                                                  for p in (x.cur, x.best)]), self.checks)[0]
        for i, x in enumerate(self.lanes):
            x.cur_s, x.best_s = float(scores[2 * i]), float(scores[2 * i + 1])
        best = self.session.best_score
        self.ref = best if best < OOM_PENALTY else None

    def output(self, stop: str, start_info: dict) -> PlacerOutput:
        """The best placement ever scored, the history and ``info`` (``start_info``: the
        starts' report, the best start and its score)."""
        session = self.session
        self._record(self.lane.cur_s)
        search_s = time.perf_counter() - self.t_search
        best, best_s = session.best, session.best_score
        for lane in self.alive:
            lane.end = "ran to the end"
        info = {
            **start_info,
            "score": best_s, "fits": bool(best_s < OOM_PENALTY), "evaluations": self.evals,
            "memory_checks": self.memory_checks if self.screen else self.evals,
            "screen": self.screen, "rounds": self.rounds, "accepted": self.accepted,
            "restarts": self.restarts, "batch": self.batch,
            "lanes": [x.row() for x in self.lanes],
            "search_s": search_s,
            "evaluations_per_s": (self.evals - self.num_starts) / search_s if search_s > 0
            else None,
            "groupings": {name: len(ptr) - 1 for name, _, ptr in self.mover.groupings},
            "subtrees": len(self.mover.subtrees),
            **session.finish(stop),
        }
        return PlacerOutput(best.astype(np.int32), history=session.history, info=info,
                            cost_model=session.cost_model
                            if session.validation["corrections"] else None)

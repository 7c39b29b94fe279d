"""What the list schedulers (``simplace.placers.list_schedulers``) share: the machine
and graph as plain lists (``Problem``), Baechi's memory accounting, units (blocks,
module runs), one run of a device rule over units on an ``IncrementalProgram``, the
unit families and re-passes every method tries, and the last word of the reference
simulator and of ``single`` (``Setup``). The module docstring of
``simplace.placers.list_schedulers`` describes them."""

from __future__ import annotations

import math
import numbers
import time

import numpy as np

from simplace.errors import OptionError
from simplace.graph import split_name_path
from simplace.placers import PlacerContext, PlacerOutput, penalised
from simplace.placers.context import simulate_each_s
from simplace.placers.registry import (
    Option,
    bool_option,
    choice_option,
    int_option,
)
from simplace.sim.incremental import IncrementalProgram
from simplace.sim.reference import segments_of

MEMORY_MODELS = ("auto", "conservative", "liveness")
# Block counts tried besides op units: from a few big blocks (close to one device per
# phase of the model) to many small ones.
BLOCK_COUNTS = (8, 32, 128, 512, 1024, 2048)
# Module-path depths whose runs of consecutive ops are tried as units (a layer, a cell
# step, an attention block...: the pieces an expert would place).
MODULE_DEPTHS = (1, 2, 3, 4)
# Re-runs over the segments of the best placement so far (each one only while it helps).
REPASSES = 3
# A run checks the clock every this many units (a unit costs microseconds per device).
_CLOCK_UNITS = 16


def int_list_option(doc: str, default, lo: int, *, nonempty: bool = False) -> Option:
    """An option that takes a list of integers ``>= lo`` (any iterable of them but a
    string; ``nonempty``: at least one), read as a tuple in the order given."""
    def parse(value):
        try:
            items = None if isinstance(value, str | bytes) else list(value)
        except TypeError:  # not iterable
            items = None
        if items is None or (nonempty and not items) or not all(
                isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= lo
                for v in items):
            raise OptionError(f"value must be a {'non-empty ' * nonempty}list of integers "
                              f">= {lo}, got {value!r}.")
        return tuple(int(v) for v in items)

    return Option(doc, default, parse)


# The keyword options every list scheduler takes (``optimize`` refuses others).
COMMON_OPTIONS = {
    "memory": choice_option("memory model: 'auto' (default: conservative, then liveness if "
                            "memory was tight), 'conservative' (nothing freed) or "
                            "'liveness'", "auto", MEMORY_MODELS),
    "units": int_list_option("block counts of the unit runs, 0 for op units (default [0, 8, "
                             "32, 128, 512, 1024, 2048], those below the number of ops)",
                             None, 0, nonempty=True),
    "module_depths": int_list_option("module-path depths whose runs are tried as units "
                                     "(default [1, 2, 3, 4]; [] for none)", MODULE_DEPTHS, 1),
    "repasses": int_option(f"re-runs over the best placement's segments (default {REPASSES})",
                           REPASSES, 0),
    "lookahead": bool_option("also run each unit family (but op units) looking one unit "
                             "ahead (default True)", True),
    "fallback_single": bool_option("return the fastest single device that fits when it is "
                                   "faster (default True)", True),
}


def common_option(ctx: PlacerContext, name: str):
    """List-scheduler option ``name`` as ``COMMON_OPTIONS`` parses it (``optimize`` has
    checked it), or its default."""
    opt = COMMON_OPTIONS[name]
    return opt.check("list scheduler", name, ctx.options[name]) if name in ctx.options \
        else opt.default


# --------------------------------------------------------------------------- problem data
class Problem:
    """Graph structure and machine figures as plain Python lists (fast in loops)."""

    def __init__(self, ctx: PlacerContext):
        g = ctx.graph
        inp = ctx.inputs  # the context's cached arrays (the program estimate uses them too)
        m, d = inp.num_ops, inp.num_devices
        self.m, self.d = m, d
        self.t_np = inp.op_time_s
        self.t = inp.op_time_s.tolist()
        self.lat = inp.latency_s.tolist()
        self.bw = inp.bandwidth_bytes_per_s.tolist()
        self.mem = inp.memory_bytes.tolist()
        self.group = inp.exclusive_group.tolist()
        self.num_groups = inp.num_groups
        self.out_bytes = g.out_bytes.tolist()
        self.is_output = g.is_output.tolist()

        # Connected op pairs: bytes summed over the tensors an edge pair carries.
        src = g.src.astype(np.int64)
        dst = g.dst.astype(np.int64)
        if len(src):
            key, inv = np.unique(src * max(m, 1) + dst, return_inverse=True)
            pair_bytes = np.bincount(inv.reshape(-1), weights=g.edge_bytes,
                                     minlength=len(key))
            ps, pd = (key // max(m, 1)).astype(np.int64), (key % max(m, 1)).astype(np.int64)
        else:
            ps = pd = np.zeros(0, np.int64)
            pair_bytes = np.zeros(0)
        self.pair_src, self.pair_dst, self.pair_bytes = ps, pd, pair_bytes
        self.preds: list[list[tuple[int, float]]] = [[] for _ in range(m)]
        self.succs: list[list[tuple[int, float]]] = [[] for _ in range(m)]
        for p, j, b in zip(ps.tolist(), pd.tolist(), pair_bytes.tolist(), strict=True):
            self.preds[j].append((p, b))
            self.succs[p].append((j, b))

        params: list[list[int]] = [[] for _ in range(m)]
        for op, k in sorted(set(zip(g.param_op.tolist(), g.param_index.tolist(),
                                    strict=True))):
            params[op].append(k)
        self.params = params
        self.param_sizes = g.param_sizes.tolist()

        # Mean costs.
        self.mean_t = inp.op_time_s.mean(axis=1) if d else np.zeros(m)
        if d > 1:
            off = ~np.eye(d, dtype=bool)
            self.mean_lat = float(inp.latency_s[off].mean())
            self.mean_bw = float(inp.bandwidth_bytes_per_s[off].mean())
        else:
            self.mean_lat, self.mean_bw = 0.0, math.inf

    def mean_comm(self, nbytes: float) -> float:
        """Time to move ``nbytes`` over a mean link (mean latency and bandwidth)."""
        if self.d <= 1:
            return 0.0
        return self.mean_lat + nbytes / self.mean_bw

    def upward_rank(self) -> list[float]:
        """HEFT's upward rank of each op: its mean time plus the longest mean path
        (communication and ops) from it to a sink."""
        w = self.mean_t.tolist()
        rank = [0.0] * self.m
        for i in range(self.m - 1, -1, -1):
            best = 0.0
            for j, b in self.succs[i]:
                v = self.mean_comm(b) + rank[j]
                if v > best:
                    best = v
            rank[i] = w[i] + best
        return rank

    def comm(self, nbytes: float, a: int, d: int) -> float:
        """Time to move ``nbytes`` from device a to device d (0 on one device)."""
        return 0.0 if a == d else self.lat[a][d] + nbytes / self.bw[a][d]


class _Memory:
    """Baechi's memory accounting for placements built in graph order (module docstring).

    ``used[d]``: bytes charged to device d; ``sent[j]``: device -> bytes of op j's put
    there (received copies, charged to the receiver)."""

    def __init__(self, graph, inp, prog: IncrementalProgram, *, liveness: bool):
        m, d = inp.num_ops, inp.num_devices
        self.prog = prog
        self.cap = inp.memory_bytes.tolist()
        self.used = [0.0] * d
        self.resident: list[set[int]] = [set() for _ in range(d)]
        self.out = graph.out_bytes.tolist()
        self.is_output = graph.is_output.tolist()
        params: list[list[int]] = [[] for _ in range(m)]
        for op, k in sorted(set(zip(graph.param_op.tolist(), graph.param_index.tolist(),
                                    strict=True))):
            params[op].append(k)
        self.params = params
        self.param_sizes = graph.param_sizes.tolist()
        self.sent: list[dict[int, float] | None] = [None] * m
        self.liveness = liveness
        readers = [0] * m
        for ins in prog.ins:
            for j, _ in ins:
                readers[j] += 1
        self.remaining = readers

    def need(self, a: int, b: int, d: int) -> float:
        """Bytes that ops a..b-1 (the next ops) would add to device d."""
        p, sent, res = self.prog.p, self.sent, self.resident[d]
        n = 0.0
        new: set[int] = set()
        got: set[int] = set()
        for i in range(a, b):
            n += self.out[i]
            for j, nb in self.prog.ins[i]:
                if j >= a or p[j] == d or j in got:
                    continue
                sj = sent[j]
                if sj is None or d not in sj:
                    n += nb
                    got.add(j)
            for k in self.params[i]:
                if k not in res and k not in new:
                    new.add(k)
                    n += self.param_sizes[k]
        return n

    def fits(self, d: int, nbytes: float) -> bool:
        return self.used[d] + nbytes <= self.cap[d]

    def most_free(self) -> int:
        return max(range(len(self.cap)), key=lambda d: (self.cap[d] - self.used[d], -d))

    def commit(self, i: int, d: int) -> None:
        """Charge op i on device d (call before ``IncrementalProgram.commit`` of the same op)."""
        p, used = self.prog.p, self.used
        used[d] += self.out[i]
        for j, nb in self.prog.ins[i]:
            if p[j] != d:
                sj = self.sent[j]
                if sj is None:
                    sj = self.sent[j] = {}
                if d not in sj:
                    sj[d] = nb
                    used[d] += nb
        res = self.resident[d]
        for k in self.params[i]:
            if k not in res:
                res.add(k)
                used[d] += self.param_sizes[k]
        if self.liveness:
            for j, _ in self.prog.ins[i]:
                self.remaining[j] -= 1
                if self.remaining[j] == 0:
                    self._free(j, p[j])
            if self.remaining[i] == 0:
                self._free(i, d)

    def _free(self, j: int, dev: int) -> None:
        if self.is_output[j]:
            return
        self.used[dev] -= self.out[j]
        for to, nb in (self.sent[j] or {}).items():
            self.used[to] -= nb
        self.sent[j] = None


# --------------------------------------------------------------------------- one run
def blocks(work: np.ndarray, k: int) -> list[tuple[int, int]]:
    """Ops 0..M-1 cut into at most k runs of about equal ``work`` (0: one op per run)."""
    m = len(work)
    if k <= 0 or k >= m:
        return [(i, i + 1) for i in range(m)]
    # A tiny floor so that runs of zero-work ops are still split by count.
    c = np.cumsum(work + 1e-9 * (float(work.max()) + 1e-9))
    cuts = np.searchsorted(c, c[-1] * np.arange(1, k) / k, side="right")
    cuts = sorted({0, m, *(int(x) for x in cuts)})
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=False) if b > a]


class _Late(Exception):
    """A run given up because the time budget is spent (another run had completed)."""


class _Run:
    """One pass of a device rule over units in graph order: the placement it builds, the
    simulated step time, the ops that fit nowhere."""

    def __init__(self, graph, inp, prog: IncrementalProgram, *, liveness: bool):
        prog.reset()
        self.prog = prog
        self.mem = _Memory(graph, inp, prog, liveness=liveness)
        self.unplaceable: list[int] = []
        self.constrained = False  # some unit could not go to every device for memory
        self.next_unit: dict[int, tuple[int, int]] = {}  # lookahead: unit start -> next unit
        self.plain: dict[int, float] = {}  # the last ``ends`` call's ends without lookahead

    def ends(self, a: int, b: int, devices) -> dict[int, float]:
        """Per device: the end of the segment that ops a..b-1 (the next ops) would end in,
        all placed there. With lookahead (a unit followed by the next one in the run), the
        later of that end and the earliest end of the next unit on any device after it:
        a unit that ends a little later but leaves its device free for what follows can
        win (pipelines of cell steps across devices)."""
        nxt = self.next_unit.get(a)
        if nxt is None or nxt[0] != b:
            self.plain = out = {d: self.prog.unit_end(a, b, d) for d in devices}
            return out
        prog = self.prog
        out, self.plain = {}, {}
        for d in devices:
            prog.mark()
            for i in range(a, b):
                prog.commit(i, d)
            end = self.plain[d] = prog.open_end()
            after = min(prog.unit_end(nxt[0], nxt[1], e) for e in range(prog.d))
            prog.undo()
            out[d] = max(end, after)
        return out

    def place(self, a: int, b: int, d: int) -> None:
        for i in range(a, b):
            self.mem.commit(i, d)
            self.prog.commit(i, d)

    def run(self, units, choose, *, lookahead: bool = False, late=None) -> None:
        """``choose(a, b, eligible) -> device`` for each unit that fits somewhere; units
        that fit nowhere as a whole go op by op (an op that fits nowhere: the device with
        the most free memory). ``lookahead``: ``ends`` looks one unit ahead. ``late``: a
        clock (``() -> bool``) read every ``_CLOCK_UNITS`` units; ``_Late`` once it says
        the budget is spent."""
        if lookahead:
            self.next_unit = {a: nxt for (a, _), nxt in zip(units, units[1:], strict=False)}
        mem = self.mem
        alldev = range(self.prog.d)
        for n, (a, b) in enumerate(units):
            if late is not None and n % _CLOCK_UNITS == 0 and late():
                raise _Late
            eligible = [d for d in alldev if mem.fits(d, mem.need(a, b, d))]
            if len(eligible) < len(alldev):
                self.constrained = True
            if eligible:
                self.place(a, b, choose(a, b, eligible))
                continue
            for i in range(a, b):
                eligible = [d for d in alldev if mem.fits(d, mem.need(i, i + 1, d))]
                if eligible:
                    d = choose(i, i + 1, eligible)
                else:
                    self.unplaceable.append(i)
                    d = mem.most_free()
                self.place(i, i + 1, d)


def earliest(run: _Run, a: int, b: int, eligible) -> tuple[int, dict[int, float]]:
    """The eligible device where the unit ends first (ties: the open segment's device,
    then the lower index), and every eligible device's end."""
    ends = run.ends(a, b, eligible)
    cur, plain = run.prog.cur, run.plain
    return min(eligible, key=lambda d: (ends[d], plain[d], d != cur, d)), ends


# --------------------------------------------------------------------------- runs and result
def _unit_counts(ctx: PlacerContext, m: int) -> list[int]:
    units = common_option(ctx, "units")
    if units is None:
        return [0] + [k for k in BLOCK_COUNTS if k < m]
    return sorted(set(units))


def _module_runs(graph, depth: int) -> list[tuple[int, int]]:
    """Ops 0..M-1 cut where the module path, cut to ``depth`` parts, or the forward /
    backward flag changes: one unit per run of consecutive ops of one module."""
    # Each distinct path split once (the ops of a layer's cell steps share theirs).
    distinct, index = np.unique(graph.name_path, return_inverse=True)
    key_of = [(bw, parts[:depth]) for bw, parts in map(split_name_path, distinct.tolist())]
    keys = [key_of[k] for k in index.reshape(-1).tolist()]
    cuts = [0] + [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]] + [len(keys)]
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b > a]


def _unit_label(k: int, m: int) -> str:
    return "ops" if k <= 0 or k >= m else f"{k} blocks"


class _Pass:
    """The unit runs under one memory model (``Setup.unit_runs``), in the order of
    ``plan``: (label, units, lookahead) runs one unit family; None re-runs over the
    segments of the best placement so far while that helps (``repasses`` runs in all
    per pass). Runs are skipped once the budget is spent (but a method's first run)."""

    def __init__(self, setup: Setup, choose, memory: str, plan: list, keys: set,
                 repasses: int):
        self.setup, self.choose, self.memory = setup, choose, memory
        self.plan = list(plan)
        self.seen = set(keys)  # the unit lists run (as their start ops)
        self.repasses_left = repasses
        self.runs: list[dict] = []

    def constrained(self) -> bool:
        """Memory kept some unit of a run so far off a device."""
        return any(r["constrained"] for r in self.runs)

    def go(self, stop=None) -> None:
        """Take the plan's steps in order, until it is done or ``stop()`` is true."""
        s = self.setup
        while self.plan:
            step = self.plan.pop(0)
            if step is None:
                self._repass()
            elif s.completed and s.late():
                s.skipped += 1
            else:
                label, units, look = step
                r = s.run(units, self.choose, lookahead=look, memory=self.memory)
                if r is not None:
                    r["unit"] = label + (" + lookahead" if look else "")
                    self.runs.append(r)
            if stop is not None and stop():
                return

    def _repass(self) -> None:
        s = self.setup
        while self.repasses_left > 0 and self.runs and not s.late():
            best = min(self.runs, key=lambda r: r["estimated_s"])
            units = segments_of(best["placement"])
            key = tuple(a for a, _ in units)
            if key in self.seen:
                return
            self.seen.add(key)
            self.repasses_left -= 1
            r = s.run(units, self.choose, lookahead=best["lookahead"], memory=self.memory)
            if r is None:
                return
            r["unit"] = f"segments of {best['unit']}"
            self.runs.append(r)
            if r["estimated_s"] >= best["estimated_s"]:
                return


class Setup:
    """What every method shares: inputs, the program simulator, memory model."""

    def __init__(self, ctx: PlacerContext):
        self.ctx = ctx
        self.memory = common_option(ctx, "memory")
        self.inp = ctx.inputs
        self.graph = ctx.graph
        self.m, self.d = self.inp.num_ops, self.inp.num_devices
        self.prog = IncrementalProgram(ctx.graph, self.inp)
        self.work = self.inp.op_time_s.min(axis=1) if self.m else np.zeros(0)
        # A time budget (``budget_s``, e.g. when ``local`` runs this as a start or
        # ``compare`` gives it a part) stops new runs once spent and gives up the run under
        # way (but the first); without one the method is deterministic. A whole call took
        # 1-10 s on graphs of a few thousand ops, 20-60 s on nmt_2layer and nmt_4layer (13k,
        # 22k ops) on a 2-core VM at load 10
        # (bench/results/placers_2026-11-23_list-schedulers_vm-2core-loaded.txt). The
        # budget runs from the call of ``optimize`` (``ctx.t_begin``): pricing and m_sct's
        # LP count against it, and the runs stop early by what ``finish`` likely takes
        # (a check of the best run and one of a single device).
        self.deadline = (ctx.t_begin + float(ctx.budget_s) - simulate_each_s(self.m, 2)
                         if ctx.budget_s is not None else None)
        self.skipped = 0  # runs not started: the budget was spent
        self.stopped = 0  # runs given up half way: the budget was spent
        self.completed = 0

    def late(self) -> bool:
        """True once the time budget is spent (never without one)."""
        return self.deadline is not None and time.perf_counter() > self.deadline

    def run(self, units, choose, *, lookahead: bool = False,
            memory: str = "conservative") -> dict | None:
        """One run of ``choose(run, a, b, eligible) -> device`` over ``units``: its
        placement, simulated step time, unplaceable ops, and how it was made. None when
        the time budget ran out during the run (never the first run: a method always
        has one schedule)."""
        t0 = time.perf_counter()
        r = _Run(self.graph, self.inp, self.prog, liveness=memory == "liveness")
        try:
            r.run(units, lambda a, b, eligible: choose(r, a, b, eligible),
                  lookahead=lookahead, late=self.late if self.completed else None)
        except _Late:
            self.stopped += 1
            return None
        self.completed += 1
        return {"placement": np.asarray(self.prog.p, dtype=np.int32),
                "estimated_s": self.prog.step_time(), "unplaceable": r.unplaceable,
                "lookahead": lookahead, "memory": memory, "constrained": r.constrained,
                "wall_s": time.perf_counter() - t0, "made": self.completed}

    def memory_runs(self, runs_under) -> list[dict]:
        """``runs_under(memory model)`` under the model asked for; with ``"auto"``,
        under the conservative model, then under liveness as well if memory kept some
        unit off a device."""
        if self.memory != "auto":
            return runs_under(self.memory)
        runs = runs_under("conservative")
        if any(r["constrained"] for r in runs):
            if self.late():
                self.skipped += 1
            else:
                runs += runs_under("liveness")
        return runs

    def unit_runs(self, choose) -> list[dict]:
        """One run per unit family (ops, blocks, module runs; identical unit lists run
        once), each family but op units once more with lookahead (option ``lookahead``),
        and re-runs over the segments of the best placement so far while that helps (at
        most ``repasses`` times); per memory model (under ``"auto"``: conservative, and
        liveness as well once memory kept some unit off a device).

        The order is what a time budget keeps: op units, the lookahead runs, the
        re-passes, then the runs without lookahead; under ``"auto"``, once memory kept a
        conservative run's unit off a device, every liveness run before the rest of the
        conservative ones. Without a budget every run is made, whatever the order."""
        ctx, m = self.ctx, self.m
        families = [(_unit_label(k, m), blocks(self.work, k))
                    for k in _unit_counts(ctx, m)]
        for depth in sorted(set(common_option(ctx, "module_depths"))):
            families.append((f"module depth {depth}", _module_runs(self.graph, depth)))
        unique, keys = [], set()
        for label, units in families:
            key = tuple(a for a, _ in units)
            if key not in keys:
                keys.add(key)
                unique.append((label, units))
        # Finest first (stable: op units, then the most units): where a budget stopped
        # the runs on the zoo's big graphs, the winners were op units and the finer
        # families with lookahead (bench/results/list_families_2026-11-29_vm.txt).
        unique.sort(key=lambda f: -len(f[1]))
        ops = [(label, units, False) for label, units in unique if len(units) >= m]
        plain = [(label, units, False) for label, units in unique if len(units) < m]
        looked = ([(label, units, True) for label, units, _ in plain]
                  if common_option(ctx, "lookahead") else [])
        # A re-pass (None) follows the lookahead runs, and again the runs without (it
        # only runs if one of them became the best).
        plan = ops + looked + [None] + plain + [None]
        repasses = common_option(ctx, "repasses")

        def new_pass(memory: str) -> _Pass:
            return _Pass(self, choose, memory, plan, keys, repasses)

        if self.memory != "auto":
            p = new_pass(self.memory)
            p.go()
            return p.runs
        cons = new_pass("conservative")
        cons.go(stop=cons.constrained)
        if not cons.constrained():
            return cons.runs
        # Memory is tight: the liveness runs first (they won on such machines), then the
        # rest of the conservative ones (whose best is the fallback that surely fits).
        live = new_pass("liveness")
        if self.late():
            self.skipped += 1
        else:
            live.go()
        cons.go()
        # In the order they were made (info["runs"]: what a budget would have kept).
        return sorted(cons.runs + live.runs, key=lambda r: r["made"])

    def _repair_faster(self, runs: list[dict], scored: list, fits: tuple):
        """The fastest run checked that does not fit, where it is faster than ``fits``
        (the best run that does: step time, False), repaired (``repair_answer``): ``(run
        index, placement, (step time, False), repair info)`` where the repaired placement
        fits and is still faster, else None."""
        from simplace.placers.memory_repair import repair_answer

        over = [(t, k) for _, k, (t, oom) in scored if oom and t < fits[0]]
        if not over:
            return None
        t, k = min(over)
        info: dict = {}
        fixed, t_fixed, oom = repair_answer(self.ctx, runs[k]["placement"], t, info,
                                            what="faster schedule")
        if oom or t_fixed >= fits[0]:
            return None
        return k, fixed, (t_fixed, False), info

    def finish(self, runs: list[dict], info: dict | None = None) -> PlacerOutput:
        """The best run that fits, checked by the simulator (``simulate_each``), against
        ``single``'s candidates (module docstring)."""
        from simplace.placers.memory_repair import repair_answer
        from simplace.placers.single import faster_single

        ctx, m = self.ctx, self.m
        for r in runs:  # (the empty graph's placeholder run)
            r.setdefault("memory", "liveness" if self.memory == "liveness" else "conservative")
            r.setdefault("unit", None)
        order = sorted(range(len(runs)), key=lambda k: (runs[k]["estimated_s"], k))
        best, res, checked, repaired = runs[order[0]], None, [], None
        if m:
            # The memory models only estimate the program's peak: the simulator
            # decides. Runs in order of estimated step time until one fits, up to the
            # conservative model's best (an upper bound on the peak: it fits). Not a
            # fixed number of them: where many liveness runs do not fit, a faster one that
            # does sits behind them (heft on inception_v3 on 4 K40s: four checks found
            # none, and the conservative best was 4% slower than the fifth).
            last = next((i for i, k in enumerate(order)
                         if runs[k]["memory"] == "conservative"), len(order) - 1)
            tries = order[:last + 1]
            scored = []
            sims = ctx.simulate_each(np.stack([runs[k]["placement"] for k in tries]))
            for k, (t, oom) in zip(tries, sims, strict=False):
                checked.append({"unit": runs[k]["unit"], "memory": runs[k]["memory"],
                                "step_time_s": t, "oom": oom})
                scored.append((float(penalised(t, oom)), k, (t, oom)))
                if not oom:
                    break
            _, k, res = min(scored, key=lambda x: (x[0], x[1]))
            best = runs[k]
            # A faster run that does not fit often fits once a few chains move off its
            # overfull device (a liveness run on 12 GB GPUs or the VM's CPU devices):
            # repaired, it is kept where it beats the best run that fits.
            repaired = self._repair_faster(runs, scored, res) if not res[1] else None
            if repaired is not None:
                k, placement_fixed, res, repair_info = repaired
                best = dict(runs[k], placement=placement_fixed)
        out = {"memory": self.memory, "memory_model": best["memory"],
               "unit": best.get("unit"), "estimated_makespan_s": float(best["estimated_s"]),
               "unplaceable_ops": len(best["unplaceable"]),
               "runs": [{"unit": r.get("unit"), "memory": r["memory"],
                         "estimated_step_s": float(r["estimated_s"]),
                         "wall_s": float(r.get("wall_s", 0.0))} for r in runs],
               "checked": checked}
        out.update(info or {})
        out.update(best.get("info", {}))
        if repaired is not None:
            out.update(repair_info, repaired_run=best.get("unit"))
        if self.skipped or self.stopped:
            out["runs_skipped"] = self.skipped
            out["runs_stopped"] = self.stopped
            out["note_budget"] = (f"the time budget ({ctx.budget_s:g} s) was spent: "
                                  f"{self.skipped} runs were not started"
                                  + (f", {self.stopped} given up half way" if self.stopped
                                     else ""))
        if best["unplaceable"]:
            i = best["unplaceable"][0]
            more = len(best["unplaceable"]) - 1
            out["note"] = (
                f"no device can hold op {i} ({self.graph.out_bytes[i]:.0f} output bytes "
                f"plus its parameters and inputs, under the {best['memory']} memory model)"
                + (f" nor {more} more ops" if more else "")
                + "; placed on the device with the most free memory")
        placement = best["placement"]
        if m == 0:
            out["returned"] = "schedule"
            return PlacerOutput(placement, info=out)
        res_s, res_oom = res
        if res_oom and repaired is None:
            # The memory models only estimate the simulator's peak; where a segment's
            # outputs live as long as it does (the VM's CPU devices) even the
            # conservative run can be over: m_topo on nmt_2layer on cpu_vm2core_x4 was
            # returned out of memory, and 7 rounds of moves made it fit.
            placement, res_s, res_oom = repair_answer(ctx, placement, res_s, out)
        score = float(penalised(res_s, res_oom))
        out["returned"] = "schedule"
        out["schedule_step_time_s"] = res_s
        if not common_option(ctx, "fallback_single"):
            return PlacerOutput(placement, info=out)
        faster = faster_single(ctx, score)
        if faster is not None:
            d, t1 = faster
            out.update(returned="single", single_device=d, single_step_time_s=t1,
                       note_single=(
                           f"the schedule ({res_s * 1e3:.3f} ms"
                           f"{', out of memory' if res_oom else ''}) is slower than the "
                           f"whole graph on device {d} ({t1 * 1e3:.3f} ms): "
                           "returned that"))
            out.pop("note", None)
            out["unplaceable_ops"] = 0
            return PlacerOutput(np.full(m, d, dtype=np.int32), info=out)
        return PlacerOutput(placement, info=out)

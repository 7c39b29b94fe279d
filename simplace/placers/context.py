"""What a placement method is given and what it returns: ``PlacerContext``,
``PlacerOutput``, and ``OptimizeResult`` (what ``optimize`` makes of it)."""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from simplace.errors import OptionError
from simplace.search import SearchSession, penalised


@dataclasses.dataclass
class PlacerOutput:
    """What a method returns: ``placement`` int32[M], and optionally a ``history`` of
    ``{"wall_s", "step_time_s", ...}`` rows (for search curves), ``info`` (free form) and
    ``cost_model``: the model the placement was judged under when it is not the one
    ``optimize`` was given (a search that switched to a drift-corrected model)."""

    placement: np.ndarray
    history: list[dict] = dataclasses.field(default_factory=list)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    cost_model: Any = None


@dataclasses.dataclass(frozen=True, eq=False)
class OptimizeResult:
    """The result of ``optimize``.

    placement: int32[M], device index per op.
    step_time_s, oom, peak_memory_bytes [D], busy_s [D], bytes_moved, num_segments,
      num_transfers, host_s: the reference simulator's verdict on ``placement`` (see
      ``SimResult``: segments run, ``device_put`` calls, host time spent dispatching).
    wall_s: the method's own wall time (seconds), simulation of the result excluded.
    method, seed: what produced it.
    history: search curve rows (method-specific; may be empty).
    info: method-specific details (search methods: ``stop``, ``first_batch_s``,
      ``budget_s``, ...).
    cost_model: the cost model the figures above were simulated under: the one given to
      ``optimize``, or the drift-corrected one a validating search switched to. Compare
      results (and lower bounds) under the same model.
    """

    placement: np.ndarray
    step_time_s: float
    oom: bool
    peak_memory_bytes: np.ndarray
    busy_s: np.ndarray
    bytes_moved: float
    wall_s: float
    method: str
    seed: int
    history: list[dict]
    info: dict[str, Any]
    num_segments: int = 0
    num_transfers: int = 0
    host_s: float = 0.0
    cost_model: Any = None


class PlacerContext:
    """Everything a method may use; costly pieces are built on first use and cached.

    A context is never changed: ``with_cost_model`` gives a new one for another cost
    model (with its own simulators), sharing the rest (the random generator included),
    and ``with_options`` one with other method options.

    Attributes:
      graph, cost_model, seed, budget_s (None: the method's default), options (dict of
      method-specific keyword options), rng (``np.random.Generator`` from ``seed``),
      t_begin (``time.perf_counter()`` when the work began: budgets run from it).
    """

    def __init__(self, graph, cost_model, *, seed: int = 0, budget_s: float | None = None,
                 options: dict | None = None, progress: Callable[[str], None] | None = None,
                 t_begin: float | None = None, rng: np.random.Generator | None = None):
        self.graph = graph
        self.cost_model = cost_model
        self.seed = int(seed)
        self.budget_s = budget_s
        self.options = dict(options or {})
        self.rng = np.random.default_rng(self.seed) if rng is None else rng
        self.t_begin = time.perf_counter() if t_begin is None else t_begin
        self._progress = progress

    def with_cost_model(self, cost_model) -> PlacerContext:
        """A new context for ``cost_model`` (fresh simulators), the rest shared."""
        return PlacerContext(self.graph, cost_model, seed=self.seed, budget_s=self.budget_s,
                             options=self.options, progress=self._progress,
                             t_begin=self.t_begin, rng=self.rng)

    def with_options(self, options: dict) -> PlacerContext:
        """This context with other method ``options``, sharing the rest (what it has built
        so far included): for a method that runs another on the same problem."""
        import copy

        new = copy.copy(self)
        new.options = dict(options)
        return new

    @property
    def deadline(self) -> float:
        """``time.perf_counter()`` when the budget is spent (inf without one)."""
        return math.inf if self.budget_s is None else self.t_begin + float(self.budget_s)

    def session(self, label: str, *, default_budget_s: float | None = None, **kw
                ) -> SearchSession:
        """A ``SearchSession`` for this problem: its clock runs from ``t_begin`` with
        ``budget_s`` (or ``default_budget_s``), its hook and top-k from the options
        ``validate``, ``validate_every`` and ``top_k``; ``kw`` go to the session."""
        budget = self.budget_s if self.budget_s is not None else default_budget_s
        return SearchSession(label, self.cost_model, budget_s=budget, t_begin=self.t_begin,
                             hook=self.options.get("validate"),
                             validate_every=_int_option(self.options, "validate_every", 0),
                             top_k=_int_option(self.options, "top_k", 5),
                             progress=self._progress, **kw)

    @functools.cached_property
    def inputs(self):
        """The simulator's arrays for this problem (``SimInputs``): op times, corrected
        latency and bandwidth, memory, exclusive groups; works for a SimInputs too."""
        from simplace.sim import sim_inputs

        return sim_inputs(self.graph, self.cost_model)

    @functools.cached_property
    def op_times(self) -> np.ndarray:
        """float64[M, D] seconds of each op on each device."""
        return self.inputs.op_time_s

    @functools.cached_property
    def lower_bound_s(self) -> float:
        """A lower bound on the step time of any placement (``simplace.sim.lower_bound``)."""
        from simplace.sim import lower_bound

        return lower_bound(self.graph, self.cost_model)

    @functools.cached_property
    def batched(self):
        """The batched simulator (exact OOM flags; peaks only where memory is tight)."""
        from simplace.sim import batched_simulator

        return batched_simulator(self.graph, self.cost_model, memory="oom")

    @functools.cached_property
    def screen(self):
        """The batched simulator without memory (``memory=False``: never OOM, far cheaper
        where memory is tight): what searches rank neighbours by before checking the
        fastest with ``batched``."""
        from simplace.sim import batched_simulator

        return batched_simulator(self.graph, self.cost_model, memory=False)

    def simulate(self, placement, **kw):
        """The reference simulator on one placement."""
        from simplace.sim import simulate

        return simulate(self.graph, self.cost_model, placement, **kw)

    def simulate_each(self, placements):
        """(step time, OOM) of each of ``placements`` (int32[K, M]), in order, lazily: all
        in one call of the batched simulator where that costs less than the reference
        simulator's calls (``batched_pays``), else one at a time by the reference one."""
        placements = np.atleast_2d(np.asarray(placements, np.int32))
        if not len(placements):
            return
        if batched_pays(self.graph.num_ops, len(placements)):
            res = self.batched(placements)
            yield from zip(np.asarray(res.step_time_s).tolist(),
                           np.asarray(res.oom).tolist(), strict=True)
            return
        for p in placements:
            res = self.simulate(p)
            yield float(res.step_time_s), bool(res.oom)

    def score(self, placements) -> np.ndarray:
        """float64[B]: each placement's step time, OOM ones pushed behind every placement
        that fits (see ``penalised``); the batched simulator, many placements per call."""
        res = self.batched(np.atleast_2d(placements))
        return penalised(res.step_time_s, res.oom)

    def progress(self, message: str) -> None:
        """Report one line of progress, if the caller asked for it."""
        if self._progress is not None:
            self._progress(message)


# The reference simulator's seconds per op of one placement (4-28 us on the zoo's big
# graphs on the 2-core VM, 12 on nmt_4layer's single devices), and the seconds a process
# takes to load the batched simulator's compiled kernels from numba's cache on its first
# call (0.5-0.55 s there): a few checks of a small graph cost less by the reference
# simulator than that load; on nmt_4layer (22k ops) a list scheduler's final checks took
# 1.7 s by it, past a 3 s budget by half.
REFERENCE_S_PER_OP = 12e-6
BATCHED_LOAD_S = 0.5


def batched_pays(num_ops: int, count: int) -> bool:
    """Whether ``count`` placements of ``num_ops`` ops are cheaper to simulate in one call of
    the batched simulator than one by one by the reference one: its kernels compiled, and
    loaded in this process or the reference calls would cost more than loading them."""
    from simplace.kernels import cached, loaded

    if not cached("simulator"):  # compiling takes tens of seconds on a fresh install
        return False
    return loaded("simulator") or count * num_ops * REFERENCE_S_PER_OP > BATCHED_LOAD_S


def simulate_each_s(num_ops: int, count: int) -> float:
    """About how many seconds ``PlacerContext.simulate_each`` takes on ``count`` placements
    of ``num_ops`` ops (the batched simulator's own milliseconds left out)."""
    from simplace.kernels import loaded

    if not batched_pays(num_ops, count):
        return count * num_ops * REFERENCE_S_PER_OP
    return 0.0 if loaded("simulator") else BATCHED_LOAD_S


def _int_option(options: dict, name: str, default: int) -> int:
    val = options.get(name, default)
    if isinstance(val, bool) or not isinstance(val, int | np.integer):
        raise OptionError(f"Option {name} must be an integer, got {val!r}.")
    return int(val)

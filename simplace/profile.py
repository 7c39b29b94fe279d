"""Profiles: a model's own ops timed at their real shapes, on the machine it runs on.

A cost model prices an op from a generic fit (roofline, efficiencies, per-op costs);
on a model it never saw that fit can be several times off. A profile measures instead:
the traced graph is cut into a few dozen contiguous **chunks** of about equal
estimated work, each chunk runs as one jitted computation on one device of each kind
the machine has (one CPU, one GPU...), on the inputs it has in a real step, and the cost
model's op times inside each chunk are scaled so that they add up to the chunk's
measured time less its fixed cost (as calibration takes it out of a segment: the
device's launch plus the host time of the chunk's own call, and what the simulator
adds to a segment besides its ops: a worker thread's wake-up, unfused loops; never
below 0). The host time of the parameters a chunk reads stays priced by the cost model
(``Device.argument_s``), on top. The scaled op times then price any placement
(``CostModel.price``).

A chunk that fails (does not fit the device's memory, does not compile) keeps the cost
model's op times and is marked ``estimated``. A profile is a JSON file in the user
directory (``simplace.paths.profile_path``), keyed by machine and graph hash; a file
that does not match its graph, or was truncated or edited by hand, is refused.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simplace._jsonfile import check_fields, check_schema, read_json, write_json
from simplace.errors import CostModelError

__all__ = ["Chunk", "Profile", "ProfileError", "ProfileInterrupted", "cut_chunks",
           "find_profile", "list_profiles", "profile", "time_floor_s"]

SCHEMA = "simplace.profile"
SCHEMA_VERSION = 1
DEFAULT_CHUNKS = 24
# Each chunk is timed like a segment in calibration, with a small budget: a profile of
# a few dozen chunks should take seconds to a minute, not the calibration's minutes.
# No warm-up run: the chunk's first run (which compiles it and makes the next chunk's
# inputs) is one.
DEFAULT_TIMING = {"warmup": 0, "min_repeats": 3, "max_repeats": 30, "budget_s": 0.3,
                  "rel_tol": 0.02}
# A profile runs each chunk once (compiling it) and at least ``min_repeats`` more times,
# and the whole step the same: about this many steps' run time, before compilation.
RUNS_PER_STEP = 2 * (1 + DEFAULT_TIMING["min_repeats"])
# A floor under its compilations, per op of the graph: the VM's profiles of resnet50 and
# transformer at batch 2 took 28.0 and 17.5 s, 21.0 and 13.2 s of it past their runs
# (RUNS_PER_STEP whole steps), 5.4 and 3.6 ms an op, nmt_2layer 12.6 ms
# (bench/results/profile_time_2026-11-29_vm_host-time-from-runs.txt); a floor under all of
# them leaves room for a faster host.
COMPILE_FLOOR_S_PER_OP = 2e-3
# How far the scaled op times of a chunk may be from its measured time less its fixed
# cost in a file (rounding of the JSON floats); more means an edited file.
_SUM_RTOL = 1e-6
# The whole step scales the op times only where its op part is at least this share of
# it (see ``Profile.whole``).
ANCHOR_MIN_OP_SHARE = 0.25


class ProfileError(CostModelError):
    """A profile that cannot be used: another graph, a bad or incomplete file."""


class ProfileInterrupted(KeyboardInterrupt):
    """Profiling was interrupted; ``profile`` holds the chunks timed so far (written to
    ``path`` when one was given)."""

    def __init__(self, profile: Profile, path: Path | None):
        super().__init__("profiling interrupted")
        self.profile, self.path = profile, path


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One chunk of one device kind: ops ``first..stop-1``.

    measured_s: the chunk timed alone (blocking, median), or None where ``estimated``.
    fixed_s: its fixed cost: launch, the host time of its call (its arguments
      included), worker-thread wake-up and unfused loops as the simulator charges them.
    argument_s: the cost model's price of the parameters and graph outputs its ops
      handle (``Device.argument_s``), kept on top of the scaled times.
    estimated: the chunk could not be run; its ops keep the cost model's times.
    error: why it could not (one line), or None.
    """

    first: int
    stop: int
    measured_s: float | None
    fixed_s: float
    argument_s: float = 0.0
    estimated: bool = False
    error: str | None = None

    def to_dict(self) -> dict:
        """The chunk as a JSON-able dict, as in a profile file."""
        return {"first": self.first, "stop": self.stop, "measured_s": self.measured_s,
                "fixed_s": self.fixed_s, "argument_s": self.argument_s,
                "estimated": self.estimated, "error": self.error}


@dataclasses.dataclass(frozen=True, eq=False)
class Profile:
    """Measured in-segment op times of one graph on one machine.

    Attributes:
      cost_model: the machine's name (the cost model profiled with).
      graph_hash, graph_name, num_ops: the graph profiled (M ops).
      bounds: the chunks, ``(first, stop)`` in graph order, covering ``0..M``.
      chunks: per device kind (``"cpu"``, ``"gpu"``), the ``Chunk`` records done, in
        order (all of ``bounds`` once that kind is complete).
      op_time_s: per complete device kind, float64[M] seconds each op adds to a segment.
      devices: per device kind, the device profiled (cost-model name, JAX name).
      host, date, jax_version: where and when it was measured.
      whole: per device kind, the whole graph timed as one segment (a ``Chunk`` of ops
        ``0..M``; estimated where it could not run): the op times are scaled so that
        the single-segment step adds up to it. Chunks cut XLA's fusion at their bounds
        and materialise what crosses them, so their times add up to more than the
        step; the chunks say where in the graph the time goes, the whole step how much
        there is, and the difference what each segment adds (``segment_s``). Empty in
        profiles made before it.
    """

    cost_model: str
    graph_hash: str
    graph_name: str
    num_ops: int
    bounds: tuple[tuple[int, int], ...]
    chunks: Mapping[str, tuple[Chunk, ...]]
    op_time_s: Mapping[str, np.ndarray]
    devices: Mapping[str, tuple[str, str]]
    host: str = ""
    date: str = ""
    jax_version: str = ""
    whole: Mapping[str, Chunk] = dataclasses.field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Every kind has every chunk done (a partial profile prices nothing)."""
        return bool(self.chunks) and all(k in self.op_time_s for k in self.chunks)

    def segment_s(self, kind: str) -> float:
        """Seconds each segment on a device of ``kind`` costs this graph beyond the
        cost model's launch (``segment_cost_s``; ``CostModel.price`` adds it)."""
        if kind not in self.op_time_s:
            return 0.0
        return segment_cost_s(self.chunks[kind], self.whole.get(kind))

    def mismatch(self, graph, machine: str) -> str | None:
        """Why this profile cannot price ``graph`` on the machine called ``machine``
        (another graph, another machine), or None when it can."""
        if self.graph_hash != graph.hash or self.num_ops != graph.num_ops:
            return (f"is a profile of graph {self.graph_hash[:12]}... ({self.num_ops} ops), "
                    f"not of this graph {graph.hash[:12]}... ({graph.num_ops} ops)")
        if self.cost_model != machine:
            return f"is a profile made on machine {self.cost_model!r}, not {machine!r}"
        return None

    @property
    def num_estimated(self) -> int:
        """Number of chunks, over all kinds, that could not be run."""
        return sum(c.estimated for cs in self.chunks.values() for c in cs)

    def summary(self) -> str:
        """One line: machine, graph, kinds, chunks (estimated ones counted)."""
        done = sum(len(cs) for cs in self.chunks.values())
        total = len(self.bounds) * len(self.chunks)
        est = self.num_estimated
        return (f"{self.graph_name or 'unnamed'} ({self.num_ops} ops, graph "
                f"{self.graph_hash[:12]}) on {self.cost_model}: "
                f"{', '.join(sorted(self.chunks))}, {done}/{total} chunks"
                + (f", {est} estimated" if est else "")
                + ("" if self.complete else ", INCOMPLETE")
                + (f"; {self.host} {self.date}" if self.host or self.date else ""))

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict:
        """The profile as a JSON-able dict with its schema and version, as a profile file
        holds it."""
        return {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
            "cost_model": self.cost_model, "graph_hash": self.graph_hash,
            "graph_name": self.graph_name, "num_ops": self.num_ops,
            "host": self.host, "date": self.date, "jax_version": self.jax_version,
            "bounds": [list(b) for b in self.bounds],
            "kinds": {k: {"device": self.devices[k][0], "jax_device": self.devices[k][1],
                          "chunks": [c.to_dict() for c in cs],
                          "op_time_s": (self.op_time_s[k].tolist() if k in self.op_time_s
                                        else None)}
                      | ({"whole": self.whole[k].to_dict()} if k in self.whole else {})
                      for k, cs in self.chunks.items()},
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the profile as JSON, atomically; creates the folder."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Profile:
        """A profile from its file; ``ProfileError`` naming the file and what is wrong
        (bad schema, wrong lengths, chunks that do not cover the graph, non-finite or
        negative times, op times that no longer add up to their chunk's time)."""
        d = read_json(path, ProfileError, "Profile file")
        return cls.from_dict(d, where=str(path))

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "profile") -> Profile:
        """Inverse of ``to_dict``, every field checked (see ``load``)."""
        err = ProfileError
        check_schema(d, SCHEMA, SCHEMA_VERSION, err, where, "profile")
        check_fields(d, {"cost_model": str, "graph_hash": str, "graph_name": str,
                         "num_ops": int, "bounds": list, "kinds": dict}, err, where,
                     what="a profile", optional={"host": str, "date": str,
                                                 "jax_version": str, "schema": str,
                                                 "schema_version": int}, closed=True)
        m = d["num_ops"]
        if m < 1:
            raise err(f"{where}: num_ops must be >= 1, got {m}.")
        bounds = []
        prev = 0
        for k, b in enumerate(d["bounds"]):
            if (not isinstance(b, list) or len(b) != 2
                    or not all(type(x) is int for x in b) or b[0] != prev or b[1] <= b[0]):
                raise err(f"{where}: bounds[{k}] is {b!r}; the chunks must be [first, stop] "
                          f"pairs that follow each other from op 0 (this one from {prev}).")
            bounds.append((b[0], b[1]))
            prev = b[1]
        if prev != m:
            raise err(f"{where}: the chunks cover ops 0..{prev} but the graph has {m} ops "
                      "(a truncated or edited file).")
        chunks, times, devices, wholes = {}, {}, {}, {}
        for kind, kd in d["kinds"].items():
            w = f"{where}: kinds.{kind}"
            check_fields(kd, {"device": str, "jax_device": str, "chunks": list,
                              "op_time_s": (list, type(None))}, err, w, what="a device kind",
                         optional={"whole": dict}, closed=True)
            if len(kd["chunks"]) > len(bounds):
                raise err(f"{w} has {len(kd['chunks'])} chunks but the profile has "
                          f"{len(bounds)}.")
            cs = []
            entries = [(f"{w}.chunks[{k}]", c, bounds[k] if k < len(bounds) else None)
                       for k, c in enumerate(kd["chunks"])]
            if "whole" in kd:
                entries.append((f"{w}.whole", kd["whole"], (0, m)))
            for wc, c, bound in entries:
                check_fields(c, {"first": int, "stop": int, "measured_s": (float, type(None)),
                                 "fixed_s": float, "argument_s": float, "estimated": bool,
                                 "error": (str, type(None))}, err, wc, what="a chunk",
                             closed=True)
                if (c["first"], c["stop"]) != bound:
                    raise err(f"{wc} covers ops {c['first']}..{c['stop']}, not "
                              f"{bound[0]}..{bound[1]} as the bounds say.")
                for f in ("measured_s", "fixed_s", "argument_s"):
                    v = c[f]
                    if v is not None and not (math.isfinite(v) and v >= 0):
                        raise err(f"{wc}.{f} is {v!r}; times must be finite and >= 0 s.")
                if (c["measured_s"] is None) != c["estimated"]:
                    raise err(f"{wc}: a chunk has a measured_s exactly when it is not "
                              "estimated.")
                cs.append(Chunk(c["first"], c["stop"], c["measured_s"], c["fixed_s"],
                                c["argument_s"], c["estimated"], c["error"]))
            whole_c = cs.pop() if "whole" in kd else None
            ot = kd["op_time_s"]
            if ot is not None:
                if len(cs) != len(bounds):
                    raise err(f"{w} has op times but only {len(cs)} of {len(bounds)} chunks.")
                if len(ot) != m:
                    raise err(f"{w}.op_time_s has {len(ot)} entries but the graph has {m} "
                              "ops (a truncated or edited file).")
                if not all(isinstance(x, int | float) and not isinstance(x, bool)
                           for x in ot):
                    raise err(f"{w}.op_time_s must hold numbers of seconds.")
                t = np.asarray(ot, dtype=np.float64)
                if not np.all(np.isfinite(t) & (t >= 0)):
                    i = int(np.flatnonzero(~(np.isfinite(t) & (t >= 0)))[0])
                    raise err(f"{w}.op_time_s[{i}] is {t[i]!r}; op times must be finite and "
                              ">= 0 s.")
                _check_sums(t, cs, whole_c, w)
                t.flags.writeable = False
                times[kind] = t
            chunks[kind] = tuple(cs)
            devices[kind] = (kd["device"], kd["jax_device"])
            if whole_c is not None:
                wholes[kind] = whole_c
        if not chunks:
            raise err(f"{where}: the profile measured no device kind.")
        return cls(cost_model=d["cost_model"], graph_hash=d["graph_hash"],
                   graph_name=d["graph_name"], num_ops=m, bounds=tuple(bounds),
                   chunks=chunks, op_time_s=times, devices=devices,
                   host=d.get("host", ""), date=d.get("date", ""),
                   jax_version=d.get("jax_version", ""), whole=wholes)


# --------------------------------------------------------------------------- chunks
def cut_chunks(work: np.ndarray, num_chunks: int) -> tuple[tuple[int, int], ...]:
    """At most ``num_chunks`` contiguous ``(first, stop)`` runs covering ``0..len(work)``,
    cut where the running sum of ``work`` (float[M] >= 0, e.g. estimated op seconds)
    crosses each ``k / num_chunks`` of the total: chunks of about equal work (an op
    heavier than a share is a chunk alone)."""
    w = np.asarray(work, dtype=np.float64)
    m = len(w)
    if m == 0:
        return ()
    if num_chunks < 1:
        raise ProfileError(f"The number of chunks must be >= 1, got {num_chunks}.")
    total = float(w.sum())
    if total <= 0:  # nothing estimated: equal op counts
        cuts = np.linspace(0, m, min(num_chunks, m) + 1).round().astype(int)[1:-1]
    else:
        cum = np.cumsum(w)
        targets = total * np.arange(1, num_chunks) / num_chunks
        # a cut after the op whose running sum first reaches the target
        cuts = np.searchsorted(cum, targets, side="left") + 1
    cuts = np.unique(np.clip(cuts, 1, m - 1)) if m > 1 else np.array([], int)
    edges = [0, *cuts.tolist(), m]
    return tuple((a, b) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a)


def _fixed_costs(graph, inp, bounds, d: int) -> np.ndarray:
    """float[C]: what each chunk alone costs on device ``d`` besides its ops and its
    call: launch, a worker thread's wake-up where the chunk has the work, the loops of
    elementwise ops none of whose inputs come from the chunk (``simplace.sim.reference``,
    rule 1). The host time of the chunk's call is measured and added when it runs."""
    from simplace.calibrate.segments import segment_features
    from simplace.sim.reference import segment_pool_launch

    out = np.empty(len(bounds))
    for c, (a, b) in enumerate(bounds):
        local = np.asarray(segment_features(graph, a, b)["local_input"], bool)
        out[c] = (float(inp.launch_s[d]) + segment_pool_launch(inp, a, b, d)
                  + float(inp.op_unfused_s[a:b, d][~local].sum()))
    return out


def _scaled(work: np.ndarray, argument: np.ndarray, chunk: Chunk) -> np.ndarray:
    """The op times of one chunk: the cost model's work estimate scaled to add up to the
    measured time less the fixed cost (spread evenly where nothing is estimated), plus
    the cost model's argument costs; the model's own times where ``estimated``."""
    if chunk.estimated:
        return work + argument
    target = max(chunk.measured_s - chunk.fixed_s, 0.0)
    total = float(work.sum())
    if total > 0:
        return work * (target / total) + argument
    return np.full(len(work), target / len(work)) + argument


def _anchored(whole: Chunk | None) -> bool:
    """Whether the whole step's op part stands out of its fixed cost enough to scale by
    (a small model's step is mostly launch and call: nothing to learn there)."""
    return (whole is not None and not whole.estimated
            and whole.measured_s - whole.fixed_s >= ANCHOR_MIN_OP_SHARE * whole.measured_s)


def segment_cost_s(chunks: Sequence[Chunk], whole: Chunk | None) -> float:
    """What one more segment costs this graph on the kind of device profiled, besides
    the launch the cost model charges: the chunks' op parts add up to more than the
    whole step's by that much per chunk bound (fusion cut at a bound, tensors written
    out and read back). 0 where the whole step does not scale the times, a chunk was
    estimated, or the chunks add up to less."""
    if not _anchored(whole) or len(chunks) < 2 or any(c.estimated for c in chunks):
        return 0.0
    spread = sum(max(c.measured_s - c.fixed_s, 0.0) for c in chunks)
    total = whole.measured_s - whole.fixed_s
    return float(min(max(spread - total, 0.0) / (len(chunks) - 1), total))


def _anchor_factor(spread: np.ndarray, whole: Chunk | None,
                   segment_s: float = 0.0) -> float:
    """What the chunks' scaled op times (less arguments) are multiplied by so that they
    add up to the whole step less its fixed cost and its one ``segment_s`` (1 where it
    is not ``_anchored``)."""
    total = float(spread.sum())
    if not _anchored(whole) or total <= 0:
        return 1.0
    return (whole.measured_s - whole.fixed_s - segment_s) / total


def _op_times(work: np.ndarray, argument: np.ndarray, chunks: Sequence[Chunk],
              whole: Chunk | None = None) -> np.ndarray:
    """float[M]: each chunk's ops scaled to its time (``_scaled``), then every op's time
    but its arguments scaled to the whole step's less one ``segment_cost_s``
    (``Profile.whole``)."""
    out = np.empty(len(work))
    for c in chunks:
        sl = slice(c.first, c.stop)
        out[sl] = _scaled(work[sl], argument[sl], c)
    # The chunks add up to more than the whole step (1.4x on the 2-core VM's
    # transformer): fusion is cut at their bounds. Scale them to it.
    spread = out - argument
    out = spread * _anchor_factor(spread, whole, segment_cost_s(chunks, whole)) + argument
    out.flags.writeable = False
    return out


def _check_sums(t: np.ndarray, chunks: Sequence[Chunk], whole: Chunk | None,
                where: str) -> None:
    """ProfileError unless the op times ``t`` are what ``_op_times`` makes of these
    chunks: each measured chunk's ops (less arguments) add up to its time less its fixed
    cost, times one factor for all, and with a measured whole step they add up to it."""
    factors = []
    for c in chunks:
        if c.estimated:
            continue
        want = max(c.measured_s - c.fixed_s, 0.0)
        got = float(t[c.first:c.stop].sum()) - c.argument_s
        if want > 0:
            factors.append((c, got / want))
        elif abs(got) > 1e-12:
            factors.append((c, math.inf))
    ref = 1.0
    if _anchored(whole) and float(t.sum()) - whole.argument_s > 1e-15:
        want = (whole.measured_s - whole.fixed_s - segment_cost_s(chunks, whole)
                + whole.argument_s)
        got = float(t.sum())
        if abs(got - want) > _SUM_RTOL * max(want, whole.measured_s) + 1e-12:
            raise ProfileError(f"{where}: the op times add up to {got:.6g} s, not the whole "
                               f"step's measured time less its fixed cost plus its arguments "
                               f"({want:.6g} s): the file was edited; profile again.")
        ref = factors[0][1] if factors else 1.0
    for c, f in factors:
        if abs(f - ref) > _SUM_RTOL * max(1.0, abs(ref)):
            raise ProfileError(
                f"{where}: the op times of chunk {c.first}..{c.stop} do not add up to its "
                "measured time less its fixed cost plus its arguments (scaled like the "
                "others): the file was edited; profile again.")


def _one_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip().splitlines()
    return text[0][:300] if text else type(err).__name__


# --------------------------------------------------------------------------- timing
class _BudgetSpent(Exception):
    """The next chunk would end past ``profile``'s budget."""


def _time_kind(program, args, bounds, device, done: list[Chunk], fixed: np.ndarray,
               argument: np.ndarray, timing: Mapping, on_chunk, deadline: float = math.inf,
               ) -> None:
    """Run every chunk once on ``device``, in order (each on the outputs of those before
    it), timing those not in ``done``; ``on_chunk(Chunk)`` after each new one. Raises
    ``_BudgetSpent`` before a new chunk that would end past ``deadline``
    (``time.perf_counter()`` seconds), foreseen by the time the one before it took (the
    chunks are cut to about equal work)."""
    import jax

    from simplace.calibrate.harness import time_fn

    m = program.graph.num_ops
    # The same device at indices 0 and 1, the chunks alternating between them: each
    # chunk is a segment of its own, and the puts between them move nothing.
    assignment = np.zeros(m, dtype=np.int32)
    for c, (a, b) in enumerate(bounds):
        assignment[a:b] = c % 2
    placed = program.place(assignment, devices=[device, device])
    if [(s.start, s.stop) for s in placed.segments] != list(bounds):
        raise ProfileError("The placed program's segments are not the chunks; please "
                           "report this model.")
    vals = list(placed.place_args(*args).slots)
    broken = None  # why later chunks have no inputs (an earlier one failed)
    c = 0
    last_s = 0.0  # what the last new chunk took, compilation included
    for st in placed.steps:
        if st[0] == "put":
            if broken is None:
                _, src, dst, dev = st
                for k, v in zip(dst, jax.device_put([vals[i] for i in src], dev),
                                strict=True):
                    vals[k] = v
            continue
        _, fn, ins, outs = st
        a, b = bounds[c]
        new = c >= len(done)
        began = time.perf_counter()
        if new and began + last_s > deadline:
            raise _BudgetSpent
        chunk = None
        if broken is not None:
            chunk = Chunk(a, b, None, float(fixed[c]), float(argument[c]), True, broken)
        else:
            inputs = [vals[i] for i in ins]
            try:
                res = jax.block_until_ready(fn(*inputs))  # compiles; the next chunks' inputs
                if new:
                    # The host time of the call is taken from the timed runs themselves
                    # (each made on an idle device): more runs only for it cost a
                    # 10 s step of a big model minutes.
                    host: list[float] = []
                    t = time_fn(fn, *inputs, dispatch_s=host, **timing)
                    chunk = Chunk(a, b, float(t.median_s), float(fixed[c] + np.median(host)),
                                  float(argument[c]))
            except Exception as err:  # noqa: BLE001 - out of memory, compile errors...
                why = _one_line(err)
                chunk = Chunk(a, b, None, float(fixed[c]), float(argument[c]), True, why)
                try:  # zeros of the right shapes keep the later chunks running
                    shapes = jax.eval_shape(fn, *inputs)
                    res = [jax.device_put(np.zeros(s.shape, s.dtype), device) for s in shapes]
                except Exception:  # noqa: BLE001 - e.g. PRNG keys: no zeros of them
                    broken = f"not run: chunk {a}..{b} failed before it ({why})"
            if broken is None:
                for k, v in zip(outs, res, strict=True):
                    vals[k] = v
        if new:
            last_s = time.perf_counter() - began
            on_chunk(chunk)
        c += 1


def _time_whole(program, args, device, fixed_s: float, argument_s: float,
                timing: Mapping, deadline: float = math.inf) -> Chunk:
    """The whole graph as one segment on ``device``, timed alone like a chunk (estimated,
    with the reason, where it cannot run: out of memory, a compile error); raises
    ``_BudgetSpent`` when it is begun past ``deadline``."""
    m = program.graph.num_ops
    out: list[Chunk] = []
    try:
        _time_kind(program, args, ((0, m),), device, [], np.array([fixed_s]),
                   np.array([argument_s]), timing, out.append, deadline)
    except _BudgetSpent:
        raise
    except Exception as err:  # noqa: BLE001 - placing its arguments can fail too (memory)
        return Chunk(0, m, None, fixed_s, argument_s, True, _one_line(err))
    return out[0]


def profile(fn, args: Sequence, cost_model, *, chunks: int = DEFAULT_CHUNKS,
            program=None, name: str = "", resume: Profile | None = None,
            path: str | os.PathLike | None = None, timing: Mapping | None = None,
            progress: bool | Any = True, budget_s: float | None = None) -> Profile:
    """Profile ``fn(*args)`` (real arrays) on the machine ``cost_model`` describes, which
    must be this host: each chunk of the traced graph is timed on the first device of
    each kind of the model, and the model's op times scaled to the times measured.

    Args:
      fn, args: the function and its arguments, as for ``simplace.apply`` (``fn`` may
        be None when ``program`` is given).
      cost_model: the machine; its devices must exist here.
      chunks: how many chunks to cut the graph into (about equal estimated work).
      program: a ``simplace.validate.executor.Program`` already prepared for them.
      resume: a partial profile of the same graph and machine: its chunks are kept and
        the others timed.
      path: where to write the profile, also when interrupted (then partial).
      timing: options of ``simplace.calibrate.harness.time_fn`` per chunk.
      progress: a progress line on stderr (False: none; or a stream).
      budget_s: seconds from this call after which no chunk is begun, nor one that
        would end past them (foreseen by the time the chunk before it took; the whole
        step by its kind's chunks' time): the profile returned is then incomplete
        (``complete`` False, written to ``path``), and ``resume`` goes on from it.

    Returns the ``Profile``. On KeyboardInterrupt raises ``ProfileInterrupted`` with the
    partial profile (written to ``path``). Raises ProfileError when ``resume`` is for
    another graph or machine, PlacementError when the model's devices are not here.
    """
    import jax

    from simplace.progress import Progress
    from simplace.scales import Scales
    from simplace.validate.executor import prepare, resolve_devices

    deadline = math.inf if budget_s is None else time.perf_counter() + float(budget_s)
    if program is None:
        program = prepare(fn, args, name=name)
    graph = program.graph
    if graph.num_ops == 0:
        raise ProfileError("The graph has no ops: there is nothing to profile.")
    # Op times and fixed costs without drift corrections: ``price`` applies those.
    base = cost_model.with_corrections(Scales.identity(cost_model.num_devices))
    base = base.with_profile(None)
    inp = base.price(graph)
    estimate = inp.op_time_s
    # The host time of parameters and graph outputs stays the model's (argument_s):
    # only the rest is scaled to what the chunks measure.
    argument = inp.op_argument_s
    work = inp.op_time_s - argument
    kinds = _kind_devices(cost_model)
    jax_devs = resolve_devices([cost_model.device_names[k] for k in kinds.values()])
    machine = cost_model.name.split("[", 1)[0]
    if resume is not None:
        why = resume.mismatch(graph, machine)
        if why:
            raise ProfileError(f"Cannot resume: the partial profile {why}.")
        bounds = resume.bounds
    else:
        share = sum(estimate[:, k] / max(float(estimate[:, k].sum()), 1e-300)
                    for k in kinds.values())
        bounds = cut_chunks(share, chunks)
    done = {kind: list(resume.chunks.get(kind, ())) if resume is not None else []
            for kind in kinds}
    meta = {"host": socket.gethostname(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "jax_version": jax.__version__}
    devices = {kind: (cost_model.device_names[k], str(jd))
               for (kind, k), jd in zip(kinds.items(), jax_devs, strict=True)}

    wholes = dict(resume.whole) if resume is not None else {}

    def current() -> Profile:
        times = {kind: _op_times(work[:, kinds[kind]], argument[:, kinds[kind]], cs,
                                 wholes[kind])
                 for kind, cs in done.items() if len(cs) == len(bounds) and kind in wholes}
        return Profile(cost_model=machine, graph_hash=graph.hash, graph_name=graph.name,
                       num_ops=graph.num_ops, bounds=tuple(bounds),
                       chunks={k: tuple(v) for k, v in done.items()}, op_time_s=times,
                       devices=devices, whole=dict(wholes), **meta)

    timing = dict(DEFAULT_TIMING if timing is None else timing)
    stream = None if progress is False else sys.stderr if progress is True else progress
    todo = sum(len(bounds) - len(cs) + (kind not in wholes) for kind, cs in done.items())
    bar = Progress(max(todo, 1), stream=stream)
    try:
        for (kind, k), jd in zip(kinds.items(), jax_devs, strict=True):
            t_kind, took = time.perf_counter(), 0.0
            if len(done[kind]) < len(bounds):
                fixed = _fixed_costs(graph, inp, bounds, k)
                arg_c = np.array([argument[a:b, k].sum() for a, b in bounds])

                def on_chunk(ch, kind=kind):
                    done[kind].append(ch)
                    bar.step(1, f"{kind} chunk {len(done[kind])}/{len(bounds)}"
                             + (" (estimated)" if ch.estimated else ""))

                _time_kind(program, args, bounds, jd, done[kind], fixed, arg_c, timing,
                           on_chunk, deadline)
                took = time.perf_counter() - t_kind
            if kind not in wholes:
                # foreseen to take what its chunks took (when this call timed them)
                whole_fixed = _fixed_costs(graph, inp, ((0, graph.num_ops),), k)[0]
                wholes[kind] = _time_whole(program, args, jd, whole_fixed,
                                           float(argument[:, k].sum()), timing,
                                           deadline - took)
                bar.step(1, f"{kind} whole step"
                         + (" (estimated)" if wholes[kind].estimated else ""))
    except KeyboardInterrupt:
        bar.close()
        partial = current()
        if path is not None:
            partial.save(path)
        raise ProfileInterrupted(partial, None if path is None else Path(path)) from None
    except _BudgetSpent:
        pass  # the chunks timed so far, kept: an incomplete profile to resume
    bar.close()
    out = current()
    if path is not None:
        out.save(path)
    return out


def _kind_devices(cost_model) -> dict[str, int]:
    """{device kind: its first device}: the device a profile times each kind on."""
    kinds: dict[str, int] = {}
    for k, dev in enumerate(cost_model.devices):
        kinds.setdefault(dev.kind, k)
    return kinds


def time_floor_s(cost_model, graph) -> float:
    """A floor under the seconds ``profile`` takes on ``graph`` with the default timing:
    on one device of each kind of ``cost_model``, the model's (unprofiled) time of every
    op there ``RUNS_PER_STEP`` times, plus ``COMPILE_FLOOR_S_PER_OP`` an op. What
    ``optimize --profile auto`` weighs against a time budget before it profiles."""
    op_time = np.asarray(cost_model.price(graph).op_time_s)
    return sum(RUNS_PER_STEP * float(op_time[:, k].sum())
               + COMPILE_FLOOR_S_PER_OP * graph.num_ops
               for k in _kind_devices(cost_model).values())


# --------------------------------------------------------------------------- lookup
def find_profile(cost_model, graph) -> tuple[Profile | None, Path]:
    """``(profile, path)``: the profile of ``graph`` on ``cost_model`` in the user
    directory, or None when there is none. Raises ProfileError when the file there is
    bad, is for another graph or machine, or is incomplete (the message says how to
    remake or resume it)."""
    from simplace import paths

    machine = cost_model.name.split("[", 1)[0]
    path = paths.profile_path(machine, graph.hash)
    if not path.exists():
        return None, path
    how = (f"profile again (`simplace profile MODEL --cost-model {machine}`), or pass "
           "--no-profile")
    try:
        prof = Profile.load(path)
    except ProfileError as err:
        raise ProfileError(f"{err} Refusing this profile: {how}.") from None
    why = prof.mismatch(graph, machine)
    if why:
        raise ProfileError(f"{path} {why}: {how}.")
    if not prof.complete:
        raise ProfileError(f"{path} is incomplete (interrupted: {prof.summary()}): go on "
                           f"with `simplace profile MODEL --cost-model {machine} --resume`, "
                           "or pass --no-profile.")
    return prof, path


def list_profiles() -> list[tuple[Path, Profile | str]]:
    """Every profile file in the user directory, with its ``Profile`` or, for a file
    that cannot be read, the reason."""
    from simplace import paths

    out: list[tuple[Path, Profile | str]] = []
    root = paths.profile_dir()
    for p in sorted(root.glob("*/*.json")) if root.is_dir() else []:
        try:
            out.append((p, Profile.load(p)))
        except ProfileError as err:
            out.append((p, str(err)))
    return out

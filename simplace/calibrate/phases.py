"""The phases of a calibration, each writing its typed records as it measures.

``measure`` runs them in order: launch and dispatch (``runtime``, ``put_host``,
``put_wait``), op-class rates, the zoo models' segments and host steps, links, copies
in context (``link_chain``), then exclusive pairs, each followed by its ``phase``
record. ``Done`` is what an interrupted calibration already measured (``--resume``):
every phase skips it.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from simplace.calibrate import exclusive as excl_mod
from simplace.calibrate import links as links_mod
from simplace.calibrate import ops as ops_mod
from simplace.calibrate import rates as rates_mod
from simplace.calibrate import segments as seg_mod
from simplace.calibrate.records import RecordWriter
from simplace.errors import CalibrationError
from simplace.hardware.devices import all_devices, device_name, memory_bytes
from simplace.hardware.records import (
    ExclusiveRecord,
    HostRecord,
    LinkChainRecord,
    LinkRecord,
    OpRecord,
    PhaseRecord,
    PutHostRecord,
    PutWaitRecord,
    RateRecord,
    Record,
    RuntimeRecord,
    SegmentErrorRecord,
    SegmentRecord,
)
from simplace.progress import Progress

# Sizes of the copies timed in context (``links.time_link_chain``), capped by the
# settings' largest link size: the smallest sets the latency, the others check it.
CHAIN_SIZES = (256, 2 ** 16, 2 ** 20)


@dataclasses.dataclass
class Done:
    """What a calibration already measured, by phase: ``ops`` (models, op signatures,
    rates, runtime and put probes), ``links``, ``excl`` (exclusive pairs), ``chains``."""

    ops: set = dataclasses.field(default_factory=set)
    links: set = dataclasses.field(default_factory=set)
    excl: set = dataclasses.field(default_factory=set)
    chains: set = dataclasses.field(default_factory=set)

    @classmethod
    def of(cls, records: Sequence[Record]) -> Done:
        """What ``records`` (a calibration's, typed) hold measured."""
        done = cls()
        for r in records:
            if isinstance(r, SegmentErrorRecord):
                done.ops.add(r.model)
            elif isinstance(r, PhaseRecord) and r.phase.startswith("model:"):
                done.ops.add(r.phase[len("model:"):])
            elif isinstance(r, OpRecord):
                done.ops.add((r.device, r.signature))
            elif isinstance(r, RateRecord):
                done.ops.add(("rate", (r.device, r.op_class)))
            elif isinstance(r, RuntimeRecord):
                done.ops.add(("runtime", r.device))
            elif isinstance(r, PutHostRecord | PutWaitRecord):
                done.ops.add((r.kind, (r.src, r.dst)))
            elif isinstance(r, LinkRecord):
                done.links.add((r.src, r.dst, int(r.nbytes)))
            elif isinstance(r, ExclusiveRecord):
                done.excl.add((r.a, r.b))
            elif isinstance(r, LinkChainRecord):
                done.chains.add((r.a, r.b, int(r.nbytes)))
        return done


@dataclasses.dataclass
class _Run:
    """What every phase of one calibration shares."""

    out: RecordWriter
    devs: list
    settings: Any  # core.Settings
    done: Done
    bar: Progress
    over: Callable[[float], bool]  # whether that fraction of the budget is spent
    mem: dict[str, float]
    probe_devs: list  # one device per kind of hardware

    @property
    def seg_kw(self) -> dict[str, Any]:
        s = self.settings
        return dict(min_repeats=s.op_min_repeats, max_repeats=s.op_max_repeats,
                    budget_s=s.op_budget_s, rel_tol=s.op_rel_tol)

    def phase(self, name: str, t0: float, measured: int, skipped: int = 0) -> None:
        self.out.write(PhaseRecord(phase=name, wall_s=time.perf_counter() - t0,
                                   measured=measured, skipped_for_budget=skipped))


def measure(rec_path, devs, settings, budget_s: float | None, done: Done,
            show: bool) -> None:
    """Measure what ``done`` lacks on ``devs`` under ``settings``, appending the records
    to ``rec_path``; ``budget_s``: wall time after which models, then links, are left
    out; ``show``: a progress line on stderr."""
    start = time.perf_counter()
    n_cpu = sum(d.platform == "cpu" for d in all_devices())
    kinds: dict = {}
    for dev in devs:
        kinds.setdefault((dev.platform, str(dev.device_kind)), dev)

    def over(frac: float) -> bool:
        """Whether ``frac`` of the budget is spent (segments stop at 0.7, links 0.9)."""
        return budget_s is not None and time.perf_counter() > start + frac * budget_s

    mem = {device_name(d): memory_bytes(d, n_cpu) for d in devs}
    todo = _todo(devs, settings, done, mem, list(kinds.values()))
    # Weights in rough seconds, so the ETA is sensible from the first step on.
    total = sum(w * len(items) for w, items in todo.values()) + 0.5 * len(devs)
    with RecordWriter(rec_path) as out:
        run = _Run(out, devs, settings, done,
                   Progress(total, stream=sys.stderr if show else None), over, mem,
                   list(kinds.values()))
        _runtime(run)
        _rates(run, todo["rates"])
        _models(run, todo["models"])
        _links(run, todo["links"])
        _chains(run, todo["chains"])
        _exclusive(run, todo["excl"])
    run.bar.step(0, "done", force=True)
    run.bar.close()


def _todo(devs, settings, done: Done, mem, probe_devs) -> dict[str, tuple[float, list]]:
    """Per phase, its weight per item (rough seconds) and the items ``done`` lacks."""
    sizes = links_mod.link_sizes(min(settings.link_max_nbytes, int(min(mem.values()) / 16)),
                                 settings.link_factor)
    links = []
    for a, b in itertools.permutations(devs, 2):
        left = [n for n in sizes if (*_pair(a, b), n) not in done.links]
        if left:
            links.append((a, b, left))
    chain_sizes = sorted({min(n, settings.link_max_nbytes) for n in CHAIN_SIZES})
    chains = []
    for a, b in itertools.combinations(devs, 2):
        left = [n for n in chain_sizes if (*_pair(a, b), n) not in done.chains]
        if left:
            chains.append((a, b, left))
    return {
        "rates": (2.0 if settings.quick else 4.0,
                  [(dev, c) for dev in probe_devs for c in rates_mod.RATE_CLASSES
                   if ("rate", (device_name(dev), c)) not in done.ops]),
        "models": (4.0 + 20 * settings.op_budget_s,
                   [m for m in settings.models if m not in done.ops]),
        "links": (settings.link_budget_s, links),
        "chains": (settings.chain_budget_s + 0.5, chains),
        "excl": (3 * settings.excl_budget_s + 1.0,
                 [(a, b) for a, b in itertools.combinations(devs, 2)
                  if _pair(a, b) not in done.excl]),
    }


def _pair(a, b) -> tuple[str, str]:
    return device_name(a), device_name(b)


def _runtime(run: _Run) -> None:
    """Each device's launch and dispatch, and each link's put call and whether it
    holds the host."""
    t0, out = time.perf_counter(), run.out
    for dev in run.devs:
        dn = device_name(dev)
        if ("runtime", dn) not in run.done.ops:
            rt = seg_mod.time_runtime(dev, **run.seg_kw)
            out.write(RuntimeRecord(device=dn, block=rt["block"], host=rt["host"]))
        run.bar.step(0.5, f"launch/dispatch {dn}")
    for a, b in itertools.permutations(run.devs, 2):
        if ("put_host", (device_name(a), device_name(b))) not in run.done.ops:
            out.write(PutHostRecord(src=device_name(a), dst=device_name(b),
                                    timing=seg_mod.time_put_host(a, b)))
    for a, b in _put_wait_pairs(run.devs):
        if ("put_wait", (device_name(a), device_name(b))) not in run.done.ops:
            out.write(PutWaitRecord(src=device_name(a), dst=device_name(b),
                                    **links_mod.probe_put_wait(a, b)))
    run.phase("runtime", t0, len(run.devs))


def _rates(run: _Run, todo: tuple[float, list]) -> None:
    """Each device's rates, grown until they saturate: small segments cannot pin them
    (one device per kind of hardware; always measured, whatever the budget)."""
    t0, (w, items) = time.perf_counter(), todo
    for dev, c in items:
        dn = device_name(dev)
        res = rates_mod.measure_rate(c, dev, kind=dev.platform, memory_bytes=run.mem[dn],
                                     quick=run.settings.quick,
                                     budget_s=3.0 if run.settings.quick else 8.0)
        run.out.write(rates_mod.rate_record(dn, c, res))
        run.bar.step(w, f"{c} rate {dn}")
    run.phase("rates", t0, len(items))


def _models(run: _Run, todo: tuple[float, list]) -> None:
    """Each model's whole steps, segments and op signatures (``_model``), until 70% of
    the budget is spent; a model that fails is recorded as a ``segment_error``."""
    import jax

    t0, n_done, n_cut, (w, models) = time.perf_counter(), 0, 0, todo
    rng = np.random.default_rng(run.settings.seed)
    for m in models:
        if run.over(0.7) and n_done:
            n_cut += 1
            continue
        try:
            _model(run, m, rng)
            run.out.write(PhaseRecord(phase=f"model:{m}"))
        except Exception as err:  # noqa: BLE001 - one model that fails is reported
            run.out.write(SegmentErrorRecord(model=m,
                                             error=f"{type(err).__name__}: {err}"[:500]))
        n_done += 1
        jax.clear_caches()
        run.bar.step(w, f"segments {m}")
    run.phase("segments", t0, n_done, n_cut)


def _model(run: _Run, m: str, rng) -> None:
    """One model's records: whole steps, timed as validation times them, with each
    call's host time in context: placements that scatter a window of ops (the host
    dispatches a segment and a put or so per op), then random runs of ops (the first
    one the whole graph as one segment), whose segments are also timed alone for the
    op-cost fit; then its op signatures alone."""
    from simplace.hardware.executor import prepare
    from simplace.models import load_function

    devs, out, kw = run.devs, run.out, run.seg_kw
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trace notes do not matter here
        fn, args = load_function(m, small=True, abstract=False, training=True)
        program = prepare(fn, args, name=m)
    graph = program.graph
    for p in seg_mod.host_placements(graph.num_ops, len(devs), rng):
        out.write(_host_record(m, graph, p, seg_mod.time_host(program, args, p, devs, **kw)))
    for p in seg_mod.cut_placements(graph.num_ops, len(devs), rng,
                                    count=3 if run.settings.quick else 6):
        out.write(_host_record(m, graph, p, seg_mod.time_host(program, args, p, devs, **kw)))
        for dev_i, first, stop, tm, call in seg_mod.time_segments(program, args, p, devs,
                                                                 **kw):
            out.write(SegmentRecord(device=device_name(devs[dev_i]), model=m, first=first,
                                    stop=stop, **seg_mod.segment_features(graph, first, stop),
                                    call_host_s=call["host_s"], inputs=call["inputs"],
                                    outputs=call["outputs"], timing=tm))
    # Single ops last, after the host steps: hundreds of one-op executables may slow
    # the dispatch of what runs after them in this process. Each op signature alone, on
    # one device of each kind of hardware: which ops the runtime spreads over a thread
    # pool (a launch cost of its own).
    for spec in seg_mod.model_specs(fn, args):
        for dev in run.probe_devs:
            key = (device_name(dev), spec.signature)
            if key in run.done.ops:
                continue
            run.done.ops.add(key)
            try:
                tm = ops_mod.time_spec(spec, dev, seed=run.settings.seed, **kw)
            except CalibrationError:
                continue  # cannot run alone: the segment fit covers it
            out.write(OpRecord(device=device_name(dev), signature=spec.signature,
                               primitive=spec.primitive_name, op_class=spec.op_class,
                               flops=spec.flops, bytes_accessed=spec.bytes_accessed,
                               set="model", timing=tm))


def _host_record(model: str, graph, placement, h: dict) -> HostRecord:
    """The ``host`` record of a whole step (``segments.time_host``'s ``h``) of
    ``placement`` of ``model``'s ``graph``: what the step fit simulates again."""
    return HostRecord(model=model, graph_hash=graph.hash,
                      assignment=[int(x) for x in placement], segments=h["segments"],
                      puts=h["puts"], segment_calls=h["segment_calls"],
                      put_links=h["put_links"], call_host_s=h["call_host_s"],
                      put_host_s=h["put_host_s"], loop_s=h["loop_s"], timing=h["host"])


def _links(run: _Run, todo: tuple[float, list]) -> None:
    """Each link's copy times per size, until 90% of the budget is spent (the links
    left out take the median of those measured)."""
    t0, n_done, n_cut, (w, items), s = time.perf_counter(), 0, 0, todo, run.settings
    for k, (a, b, sizes) in enumerate(items):
        if run.over(0.9) and k:
            n_cut += 1
            continue
        timings = links_mod.time_link(a, b, sizes, rounds=s.link_rounds,
                                      repeats=s.link_repeats, budget_s=s.link_budget_s)
        for n, (tm, after) in timings.items():
            run.out.write(LinkRecord(src=device_name(a), dst=device_name(b), nbytes=n,
                                     timing=tm, after_call=after))
        n_done += 1
        run.bar.step(w, f"link {device_name(a)}->{device_name(b)}")
    run.phase("links", t0, n_done, n_cut)


def _chains(run: _Run, todo: tuple[float, list]) -> None:
    """Copies in context for each pair of devices, until 90% of the budget is spent
    (the pairs left out take the median factor)."""
    t0, n_done, n_cut, (w, items), s = time.perf_counter(), 0, 0, todo, run.settings
    for k, (a, b, sizes) in enumerate(items):
        if run.over(0.9) and k:
            n_cut += 1
            continue
        try:
            res = links_mod.time_link_chain(a, b, sizes, hops=s.chain_hops,
                                            rounds=s.chain_rounds, repeats=s.chain_repeats,
                                            budget_s=s.chain_budget_s,
                                            same_loop=_same_hardware(a, b))
        except CalibrationError as err:  # host-bound: the copies alone are kept
            print(f"simplace calibrate: {err}", file=sys.stderr)
            continue
        for n, tm in res["sizes"].items():
            run.out.write(LinkChainRecord(a=device_name(a), b=device_name(b), nbytes=n,
                                          hops=s.chain_hops, loop=res["loop"], **tm))
        n_done += 1
        run.bar.step(w, f"copies in context {device_name(a)}<->{device_name(b)}")
    run.phase("link_chains", t0, n_done, n_cut)


def _exclusive(run: _Run, todo: tuple[float, list]) -> None:
    """Each pair of devices: the same work alone on each and on both together."""
    t0, (w, items), s = time.perf_counter(), todo, run.settings
    if items:
        work, x = excl_mod.make_work(s.excl_size, s.excl_steps)
        kw = dict(warmup=2, min_repeats=3, max_repeats=20, budget_s=s.excl_budget_s,
                  rel_tol=0.02)
        for a, b in items:
            ta, tb, tt = excl_mod.time_pair(work, x, a, b, **kw)
            run.out.write(ExclusiveRecord(a=device_name(a), b=device_name(b), alone_a=ta,
                                          alone_b=tb, together=tt))
            run.bar.step(w, f"shared? {device_name(a)}+{device_name(b)}")
    run.phase("exclusive", t0, len(items))


def _put_wait_pairs(devs) -> list:
    """One ordered pair of devices per ordered pair of kinds of hardware (two devices of
    one kind where there are two): whether a put holds the host depends on the PjRt
    clients, which go by platform."""
    kinds: dict = {}
    for dev in devs:
        kinds.setdefault((dev.platform, str(dev.device_kind)), []).append(dev)
    pairs = []
    for ka, a in kinds.items():
        for kb, b in kinds.items():
            if ka != kb:
                pairs.append((a[0], b[0]))
            elif len(a) > 1:
                pairs.append((a[0], a[1]))
    return pairs


def _same_hardware(a, b) -> bool:
    """Whether two JAX devices are the same hardware (virtual CPUs of one host, or
    identical accelerators)."""
    return (a.platform, str(a.device_kind)) == (b.platform, str(b.device_kind))

"""``calibrate``: measure a machine and write its records and cost model; ``refit``."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import os
import platform
import socket
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simplace import paths as data_paths
from simplace.calibrate import exclusive as excl_mod
from simplace.calibrate import links as links_mod
from simplace.calibrate import ops as ops_mod
from simplace.calibrate import rates as rates_mod
from simplace.calibrate.build import build_cost_model
from simplace.calibrate.records import (
    SCHEMA,
    SCHEMA_VERSION,
    RecordWriter,
    read_records,
    write_records,
)
from simplace.cost_model import CostModel
from simplace.errors import CalibrationError
from simplace.hardware.devices import all_devices, device_name, memory_bytes, select_devices
from simplace.progress import Progress

# Zoo models calibrated by default (small presets: they run on a laptop). The models
# bench/fidelity.py validates on are left out on purpose, so that its figures are for
# graphs the calibration never saw (nothing of them is fitted).
FIDELITY_MODELS = ("mlp", "tiny_cnn", "rnnlm")
DEFAULT_MODELS_QUICK = ("alexnet", "transformer")
# Sizes of the copies timed in context (``links.time_link_chain``), capped by the
# settings' largest link size: the smallest sets the latency, the others check it.
CHAIN_SIZES = (256, 2 ** 16, 2 ** 20)
# The largest zoo graphs take minutes to compile segment by segment: left out by default.
_DEFAULT_SKIP = FIDELITY_MODELS + ("inception_v3", "resnet50", "nmt_8layer")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a calibration measures and how hard it tries (stored in the header)."""

    quick: bool = False
    models: tuple[str, ...] = ()
    op_min_repeats: int = 5
    op_max_repeats: int = 50
    op_budget_s: float = 0.2
    op_rel_tol: float = 0.02
    link_max_nbytes: int = 256 * 2 ** 20
    link_factor: int = 4
    link_budget_s: float = 5.0
    link_rounds: int = 5
    link_repeats: int = 5
    chain_hops: int = 15
    chain_rounds: int = 5
    chain_repeats: int = 5
    chain_budget_s: float = 1.5
    excl_size: int = 384
    excl_steps: int = 20
    excl_budget_s: float = 1.0
    seed: int = 0

    @classmethod
    def make(cls, *, quick: bool, models: Sequence[str] | None) -> Settings:
        if models is None:
            from simplace import zoo
            models = DEFAULT_MODELS_QUICK if quick else tuple(
                m for m in zoo.names() if m not in _DEFAULT_SKIP)
        base = cls(quick=quick, models=tuple(models))
        if not quick:
            return base
        return dataclasses.replace(base, op_min_repeats=3, op_max_repeats=30, op_budget_s=0.03,
                                   op_rel_tol=0.05, link_max_nbytes=8 * 2 ** 20,
                                   link_factor=4, link_budget_s=1.0, link_rounds=3,
                                   link_repeats=3, chain_rounds=3, chain_repeats=3,
                                   chain_budget_s=0.5, excl_size=256, excl_steps=10,
                                   excl_budget_s=0.3)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["models"] = list(self.models)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Settings:
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in fields}
        kw["models"] = tuple(kw.get("models", ()))
        return cls(**kw)


def _header(name: str, devices: list, settings: Settings) -> dict[str, Any]:
    import jax
    import jaxlib

    # virtual CPU devices share the host's memory, calibrated or not
    n_cpu = sum(d.platform == "cpu" for d in all_devices())
    return {
        "kind": "header", "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "name": name,
        "host": socket.gethostname(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "jax_version": jax.__version__, "jaxlib_version": jaxlib.__version__,
        "python": sys.version.split()[0], "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        # Host times inflate on a busy machine (other jobs take the cores): the fit
        # reports the load the calibration started under.
        "load_average": list(os.getloadavg()),
        "devices": [{"name": device_name(d), "kind": d.platform, "id": int(d.id),
                     "device_kind": str(d.device_kind),
                     "memory_bytes": memory_bytes(d, n_cpu)} for d in devices],
        "settings": settings.to_dict(),
    }


def paths(name: str, records_dir=None, cost_model_dir=None) -> tuple[Path, Path]:
    """``(records file, cost-model file)`` a calibration of ``name`` writes; the
    directories default to the user directory's ``calibration/`` and ``cost_models/``
    (``simplace.paths``), never the installed package."""
    if not name or os.sep in name or name.startswith("."):
        raise CalibrationError(f"--name must be a plain file name, got {name!r}.")
    return (data_paths.records_path(name, "records.jsonl", records_dir),
            data_paths.cost_model_write_path(name, cost_model_dir))


def _check_writable(folder: Path, given, option: str) -> None:
    """Refuse, before anything is measured, a destination folder that cannot be written
    (``OutputError`` naming the option, or ``$SIMPLACE_HOME`` for the default)."""
    from simplace._jsonfile import check_output_dir

    check_output_dir(folder, option if given is not None else
                     f"the user directory (${data_paths.ENV_HOME}; or pass {option})")


def calibrate(name: str, *, models: Sequence[str] | None = None,
              devices: Sequence[str] | None = None, quick: bool = False,
              budget_s: float | None = None, resume: bool = False, overwrite: bool = False,
              records_dir: str | os.PathLike | None = None,
              cost_model_dir: str | os.PathLike | None = None,
              progress: bool = True) -> tuple[CostModel, dict[str, Any]]:
    """Measure this machine's devices and write ``NAME``'s records and cost model.

    Args:
      name: machine name: records go to ``calibration/NAME/records.jsonl`` and the
        model to ``cost_models/NAME.json`` under ``records_dir`` / ``cost_model_dir``,
        by default under the user directory (``$SIMPLACE_HOME``, see ``simplace.paths``).
      models: zoo names (small presets) or ``file.py:factory`` whose op signatures are
        timed; default: the zoo but the models bench/fidelity.py validates on and the
        largest ones (``--quick``: alexnet and transformer).
      devices: device names (``cpu:0``...) to calibrate; default: all JAX sees.
      quick: fewer sizes and repeats: about a minute on a 2-core machine.
      budget_s: stop measuring model signatures (then links) when this much wall time
        is spent; unmeasured signatures are costed by the fitted roofline.
      resume: continue an interrupted calibration of ``name`` with the settings it
        started with; only what is missing is measured.
      overwrite: start again even if ``name`` has records.
      progress: print a progress line with the time left on stderr.

    Returns:
      ``(cost_model, report)``; the report has per-device held-out op errors, per-link
      fit errors, exclusive-pair overlaps and the wall time.
    """
    rec_path, cm_path = paths(name, records_dir, cost_model_dir)
    _check_writable(rec_path.parent.parent, records_dir, "--records-dir")
    _check_writable(cm_path.parent, cost_model_dir, "--cost-model-dir")
    if budget_s is not None and not budget_s > 0:
        raise CalibrationError(f"--budget-s must be > 0 seconds, got {budget_s!r}.")
    if resume and overwrite:
        raise CalibrationError("--resume and --overwrite contradict each other; pick one.")
    done_ops: set = set()
    done_links: set = set()
    done_excl: set = set()
    done_chains: set = set()
    if resume:
        if not rec_path.exists():
            raise CalibrationError(f"Nothing to resume: {rec_path} does not exist. Run "
                                   "without --resume to start a calibration.")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            old = read_records(rec_path)
        for w in caught:
            print(f"simplace calibrate: {w.message}", file=sys.stderr)
        # A model counts as done once its phase record is written; the segments and host
        # steps of a model cut short are measured again, so theirs are dropped.
        finished = {r["phase"][len("model:"):] for r in old
                    if r["kind"] == "phase" and r["phase"].startswith("model:")}
        kept = [r for r in old if not (r["kind"] in ("segment", "host")
                                       and r["model"] not in finished)]
        if caught or len(kept) != len(old):  # rewrite the file without what was dropped
            old = kept
            write_records(rec_path, old)
        head = old[0]
        settings = Settings.from_dict(head["settings"])
        devs = select_devices([d["name"] for d in head["devices"]])
        if devices and list(devices) != [d["name"] for d in head["devices"]]:
            raise CalibrationError(f"--devices {','.join(devices)} differs from the devices "
                                   f"of the calibration being resumed "
                                   f"({', '.join(d['name'] for d in head['devices'])}).")
        for r in old:
            if r["kind"] == "segment_error" or (r["kind"] == "phase"
                                                and r["phase"].startswith("model:")):
                done_ops.add(r.get("model") or r["phase"][len("model:"):])
            elif r["kind"] == "op":
                done_ops.add((r["device"], r["signature"]))
            elif r["kind"] == "rate":
                done_ops.add(("rate", (r["device"], r["op_class"])))
            elif r["kind"] in ("runtime", "put_host", "put_wait"):
                done_ops.add((r["kind"], r.get("device") or (r["src"], r["dst"])))
            elif r["kind"] == "link":
                done_links.add((r["src"], r["dst"], int(r["nbytes"])))
            elif r["kind"] == "exclusive":
                done_excl.add((r["a"], r["b"]))
            elif r["kind"] == "link_chain":
                done_chains.add((r["a"], r["b"], int(r["nbytes"])))
    else:
        if rec_path.exists() and not overwrite:
            raise CalibrationError(
                f"{rec_path} already holds a calibration called {name!r}. Pass --resume to "
                "continue it, --refit to refit it, --overwrite to measure it again, or "
                "another --name.")
        settings = Settings.make(quick=quick, models=models)
        devs = select_devices(devices)
        _check_models(settings.models)
        write_records(rec_path, [_header(name, devs, settings)])

    _measure(rec_path, devs, settings, budget_s, done_ops, done_links, done_excl,
             done_chains, progress)
    return _fit_and_save(rec_path, cm_path, name)


def _check_models(models: Sequence[str]) -> None:
    """Refuse unknown zoo names before anything is measured (a factory spec is only
    checked when it runs)."""
    from simplace import zoo

    bad = [m for m in models if ":" not in m and m not in zoo.names()]
    if bad:
        raise CalibrationError(f"Unknown model {bad[0]!r} in --models; the zoo has "
                               f"{', '.join(zoo.names())} (or give file.py:factory).")


def _measure(rec_path, devs, settings: Settings, budget_s, done_ops, done_links, done_excl,
             done_chains, show: bool) -> None:
    import jax
    import numpy as np

    from simplace.calibrate import segments as seg_mod
    from simplace.hardware.executor import prepare
    from simplace.models import load_function

    start = time.perf_counter()
    n_cpu = sum(d.platform == "cpu" for d in all_devices())
    mem = {device_name(d): memory_bytes(d, n_cpu) for d in devs}
    models = [m for m in settings.models if m not in done_ops]
    sizes = links_mod.link_sizes(min(settings.link_max_nbytes, int(min(mem.values()) / 16)),
                                 settings.link_factor)
    link_todo = []
    for a, b in itertools.permutations(devs, 2):
        todo = [n for n in sizes if (device_name(a), device_name(b), n) not in done_links]
        if todo:
            link_todo.append((a, b, todo))
    excl_todo = [(a, b) for a, b in itertools.combinations(devs, 2)
                 if (device_name(a), device_name(b)) not in done_excl]
    chain_sizes = sorted({min(n, settings.link_max_nbytes) for n in CHAIN_SIZES})
    chain_todo = []
    for a, b in itertools.combinations(devs, 2):
        todo = [n for n in chain_sizes if (device_name(a), device_name(b), n) not in done_chains]
        if todo:
            chain_todo.append((a, b, todo))
    kinds: dict = {}
    for dev in devs:  # one device per kind of hardware
        kinds.setdefault((dev.platform, str(dev.device_kind)), dev)
    probe_devs = list(kinds.values())
    rate_todo = [(dev, c) for dev in probe_devs for c in rates_mod.RATE_CLASSES
                 if ("rate", (device_name(dev), c)) not in done_ops]
    # Weights in rough seconds, so the ETA is sensible from the first step on.
    w_rt = 0.5
    w_rate = 2.0 if settings.quick else 4.0
    w_model = 4.0 + 20 * settings.op_budget_s
    w_link = settings.link_budget_s
    w_excl = 3 * settings.excl_budget_s + 1.0
    w_chain = settings.chain_budget_s + 0.5
    bar = Progress(w_rt * len(devs) + w_rate * len(rate_todo) + w_model * len(models)
                   + w_link * len(link_todo) + w_chain * len(chain_todo) + w_excl * len(excl_todo),
                   stream=sys.stderr if show else None)
    seg_kw = dict(min_repeats=settings.op_min_repeats, max_repeats=settings.op_max_repeats,
                  budget_s=settings.op_budget_s, rel_tol=settings.op_rel_tol)

    def over(frac: float) -> bool:
        """Whether ``frac`` of the budget is spent (segments stop at 0.7, links 0.9)."""
        return budget_s is not None and time.perf_counter() > start + frac * budget_s

    with RecordWriter(rec_path) as out:
        t0 = time.perf_counter()
        for dev in devs:
            dn = device_name(dev)
            if ("runtime", dn) not in done_ops:
                rt = seg_mod.time_runtime(dev, **seg_kw)
                out.write({"kind": "runtime", "device": dn, "block": rt["block"].to_dict(),
                           "host": rt["host"].to_dict()})
            bar.step(w_rt, f"launch/dispatch {dn}")
        for a, b in itertools.permutations(devs, 2):
            key = ("put_host", (device_name(a), device_name(b)))
            if key not in done_ops:
                out.write({"kind": "put_host", "src": device_name(a), "dst": device_name(b),
                           "timing": seg_mod.time_put_host(a, b).to_dict()})
        for a, b in _put_wait_pairs(devs):
            key = ("put_wait", (device_name(a), device_name(b)))
            if key not in done_ops:
                out.write({"kind": "put_wait", "src": device_name(a), "dst": device_name(b),
                           **links_mod.probe_put_wait(a, b)})
        out.write({"kind": "phase", "phase": "runtime", "wall_s": time.perf_counter() - t0,
                   "measured": len(devs), "skipped_for_budget": 0})

        # Each device's rates, grown until they saturate: small segments cannot pin
        # them (one device per kind of hardware; always measured, whatever the budget).
        t0 = time.perf_counter()
        for dev, c in rate_todo:
            dn = device_name(dev)
            res = rates_mod.measure_rate(c, dev, kind=dev.platform, memory_bytes=mem[dn],
                                         quick=settings.quick,
                                         budget_s=3.0 if settings.quick else 8.0)
            out.write(rates_mod.rate_record(dn, c, res))
            bar.step(w_rate, f"{c} rate {dn}")
        out.write({"kind": "phase", "phase": "rates", "wall_s": time.perf_counter() - t0,
                   "measured": len(rate_todo), "skipped_for_budget": 0})

        t0, n_done, n_cut = time.perf_counter(), 0, 0
        rng = np.random.default_rng(settings.seed)
        for m in models:
            if over(0.7) and n_done:
                n_cut += 1
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # trace notes do not matter here
                    fn, args = load_function(m, small=True, abstract=False, training=True)
                    program = prepare(fn, args, name=m)
                graph = program.graph
                # Whole steps, timed as validation times them, with each call's host
                # time in context: placements that scatter a window of ops (the host
                # dispatches a segment and a put or so per op), then random runs of ops
                # (the first one the whole graph as one segment), whose segments are
                # also timed alone for the op-cost fit.
                for p in seg_mod.host_placements(graph.num_ops, len(devs), rng):
                    out.write(_host_record(m, graph, p, seg_mod.time_host(
                        program, args, p, devs, **seg_kw)))
                for p in seg_mod.cut_placements(graph.num_ops, len(devs), rng,
                                                count=3 if settings.quick else 6):
                    out.write(_host_record(m, graph, p, seg_mod.time_host(
                        program, args, p, devs, **seg_kw)))
                    for dev_i, first, stop, tm, call in seg_mod.time_segments(
                            program, args, p, devs, **seg_kw):
                        out.write({"kind": "segment", "device": device_name(devs[dev_i]),
                                   "model": m, "first": first, "stop": stop,
                                   **seg_mod.segment_features(graph, first, stop),
                                   "call_host_s": call["host_s"], "inputs": call["inputs"],
                                   "outputs": call["outputs"], "timing": tm.to_dict()})
                # Single ops last, after the host steps: hundreds of one-op executables
                # may slow the dispatch of what runs after them in this process.
                # Each op signature alone, on one device of each kind of hardware: which
                # ops the runtime spreads over a thread pool (a launch cost of its own).
                for spec in seg_mod.model_specs(fn, args):
                    for dev in probe_devs:
                        key = (device_name(dev), spec.signature)
                        if key in done_ops:
                            continue
                        done_ops.add(key)
                        try:
                            tm = ops_mod.time_spec(spec, dev, seed=settings.seed, **seg_kw)
                        except CalibrationError:
                            continue  # cannot run alone: the segment fit covers it
                        out.write({"kind": "op", "device": device_name(dev),
                                   "signature": spec.signature,
                                   "primitive": spec.primitive_name, "op_class": spec.op_class,
                                   "flops": spec.flops, "bytes_accessed": spec.bytes_accessed,
                                   "set": "model", "timing": tm.to_dict()})
                out.write({"kind": "phase", "phase": f"model:{m}"})
            except Exception as err:  # noqa: BLE001 - one model that fails is reported
                out.write({"kind": "segment_error", "model": m,
                           "error": f"{type(err).__name__}: {err}"[:500]})
            n_done += 1
            jax.clear_caches()
            bar.step(w_model, f"segments {m}")
        out.write({"kind": "phase", "phase": "segments", "wall_s": time.perf_counter() - t0,
                   "measured": n_done, "skipped_for_budget": n_cut})

        t0, n_done, n_cut = time.perf_counter(), 0, 0
        for k, (a, b, todo) in enumerate(link_todo):
            if over(0.9) and k:  # past the budget: other links take the median of these
                n_cut += 1
                continue
            timings = links_mod.time_link(a, b, todo, rounds=settings.link_rounds,
                                          repeats=settings.link_repeats,
                                          budget_s=settings.link_budget_s)
            for n, (tm, after) in timings.items():
                out.write({"kind": "link", "src": device_name(a), "dst": device_name(b),
                           "nbytes": n, "timing": tm.to_dict(),
                           "after_call": after.to_dict()})
            n_done += 1
            bar.step(w_link, f"link {device_name(a)}->{device_name(b)}")
        out.write({"kind": "phase", "phase": "links", "wall_s": time.perf_counter() - t0,
                   "measured": n_done, "skipped_for_budget": n_cut})

        t0, n_done, n_cut = time.perf_counter(), 0, 0
        for k, (a, b, todo) in enumerate(chain_todo):
            if over(0.9) and k:  # past the budget: other pairs take the median factor
                n_cut += 1
                continue
            try:
                res = links_mod.time_link_chain(a, b, todo, hops=settings.chain_hops,
                                                rounds=settings.chain_rounds,
                                                repeats=settings.chain_repeats,
                                                budget_s=settings.chain_budget_s,
                                                same_loop=_same_hardware(a, b))
            except CalibrationError as err:  # host-bound: the copies alone are kept
                print(f"simplace calibrate: {err}", file=sys.stderr)
                continue
            for n, tm in res["sizes"].items():
                out.write({"kind": "link_chain", "a": device_name(a), "b": device_name(b),
                           "nbytes": n, "hops": settings.chain_hops, "loop": res["loop"],
                           **{key: t.to_dict() for key, t in tm.items()}})
            n_done += 1
            bar.step(w_chain, f"copies in context {device_name(a)}<->{device_name(b)}")
        out.write({"kind": "phase", "phase": "link_chains",
                   "wall_s": time.perf_counter() - t0, "measured": n_done,
                   "skipped_for_budget": n_cut})

        t0 = time.perf_counter()
        if excl_todo:
            work, x = excl_mod.make_work(settings.excl_size, settings.excl_steps)
            excl_kw = dict(warmup=2, min_repeats=3, max_repeats=20,
                           budget_s=settings.excl_budget_s, rel_tol=0.02)
            for a, b in excl_todo:
                ta, tb, tt = excl_mod.time_pair(work, x, a, b, **excl_kw)
                out.write({"kind": "exclusive", "a": device_name(a), "b": device_name(b),
                           "alone_a": ta.to_dict(), "alone_b": tb.to_dict(),
                           "together": tt.to_dict()})
                bar.step(w_excl, f"shared? {device_name(a)}+{device_name(b)}")
        out.write({"kind": "phase", "phase": "exclusive", "wall_s": time.perf_counter() - t0,
                   "measured": len(excl_todo), "skipped_for_budget": 0})
    bar.step(0, "done", force=True)
    bar.close()


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


def _host_record(model: str, graph, placement, h: dict) -> dict:
    """The ``host`` record of a whole step (``segments.time_host``'s ``h``) of
    ``placement`` of ``model``'s ``graph``: what the step fit simulates again."""
    return {"kind": "host", "model": model, "graph_hash": graph.hash,
            "assignment": [int(x) for x in placement], "segments": h["segments"],
            "puts": h["puts"], "segment_calls": h["segment_calls"],
            "put_links": h["put_links"], "call_host_s": h["call_host_s"],
            "put_host_s": h["put_host_s"], "loop_s": h["loop_s"],
            "timing": h["host"].to_dict()}


def _fit_and_save(rec_path: Path, cm_path: Path, name: str):
    records = read_records(rec_path)
    model, report = build_cost_model(records, name=name)
    cm_path.parent.mkdir(parents=True, exist_ok=True)
    model.save(cm_path)
    return model, report


def refit(name: str, *, records_dir: str | os.PathLike | None = None,
          cost_model_dir: str | os.PathLike | None = None) -> tuple[CostModel, dict[str, Any]]:
    """Rebuild ``cost_models/NAME.json`` from ``calibration/NAME/records.jsonl`` without
    touching hardware; returns ``(cost_model, report)`` like ``calibrate``. The records
    are read from ``records_dir``, else the user directory, else a source checkout's
    ``calibration/`` (``simplace.paths.find_records``); the model is written like
    ``calibrate``'s."""
    _, cm_path = paths(name, records_dir, cost_model_dir)
    _check_writable(cm_path.parent, cost_model_dir, "--cost-model-dir")
    rec_path = data_paths.find_records(name, "records.jsonl", records_dir)
    return _fit_and_save(rec_path, cm_path, name)

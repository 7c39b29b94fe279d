"""``calibrate``: measure a machine and write its records and cost model; ``refit``."""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import socket
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simplace import paths as data_paths
from simplace.calibrate import phases
from simplace.calibrate.build import build_cost_model
from simplace.calibrate.records import load_records, read_records, write_records
from simplace.cost_model import CostModel
from simplace.errors import CalibrationError
from simplace.hardware.devices import all_devices, device_name, memory_bytes, select_devices
from simplace.hardware.records import HeaderRecord, HostRecord, PhaseRecord, SegmentRecord

# Zoo models calibrated by default (small presets: they run on a laptop). The models
# bench/fidelity.py validates on are left out on purpose, so that its figures are for
# graphs the calibration never saw (nothing of them is fitted).
FIDELITY_MODELS = ("mlp", "tiny_cnn", "rnnlm")
DEFAULT_MODELS_QUICK = ("alexnet", "transformer")
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
        """The settings of a run: ``models`` (default: the quick set or the whole zoo)
        and, with ``quick``, the lighter timing."""
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
        """JSON-able fields (models as a list)."""
        d = dataclasses.asdict(self)
        d["models"] = list(self.models)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Settings:
        """Settings from ``to_dict``'s output; unknown keys are ignored."""
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in fields}
        kw["models"] = tuple(kw.get("models", ()))
        return cls(**kw)


def _header(name: str, devices: list, settings: Settings) -> HeaderRecord:
    import jax
    import jaxlib

    # virtual CPU devices share the host's memory, calibrated or not
    n_cpu = sum(d.platform == "cpu" for d in all_devices())
    return HeaderRecord(
        name=name, host=socket.gethostname(),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        jax_version=jax.__version__, jaxlib_version=jaxlib.__version__,
        python=sys.version.split()[0], machine=platform.machine(), cpu_count=os.cpu_count(),
        # Host times inflate on a busy machine (other jobs take the cores): the fit
        # reports the load the calibration started under.
        load_average=list(os.getloadavg()),
        devices=[{"name": device_name(d), "kind": d.platform, "id": int(d.id),
                  "device_kind": str(d.device_kind),
                  "memory_bytes": memory_bytes(d, n_cpu)} for d in devices],
        settings=settings.to_dict())


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
    if resume:
        devs, settings, done = _resume(rec_path, devices)
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
        done = phases.Done()
    phases.measure(rec_path, devs, settings, budget_s, done, progress)
    return _fit_and_save(rec_path, cm_path, name)


def _resume(rec_path: Path, devices: Sequence[str] | None
            ) -> tuple[list, Settings, phases.Done]:
    """The devices, settings and measurements of the interrupted calibration at
    ``rec_path``; its records file rewritten without the segments and host steps of
    models cut short (they are measured again)."""
    if not rec_path.exists():
        raise CalibrationError(f"Nothing to resume: {rec_path} does not exist. Run "
                               "without --resume to start a calibration.")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = load_records(rec_path)
    for w in caught:
        print(f"simplace calibrate: {w.message}", file=sys.stderr)
    # A model counts as done once its phase record is written.
    finished = {r.phase[len("model:"):] for r in old
                if isinstance(r, PhaseRecord) and r.phase.startswith("model:")}
    kept = [r for r in old if not (isinstance(r, SegmentRecord | HostRecord)
                                   and r.model not in finished)]
    if caught or len(kept) != len(old):  # rewrite the file without what was dropped
        old = kept
        write_records(rec_path, old)
    head = old[0]
    names = [d["name"] for d in head.devices]
    devs = select_devices(names)
    if devices and list(devices) != names:
        raise CalibrationError(f"--devices {','.join(devices)} differs from the devices "
                               f"of the calibration being resumed ({', '.join(names)}).")
    return devs, Settings.from_dict(head.settings), phases.Done.of(old)


def _check_models(models: Sequence[str]) -> None:
    """Refuse unknown zoo names before anything is measured (a factory spec is only
    checked when it runs)."""
    from simplace import zoo

    bad = [m for m in models if ":" not in m and m not in zoo.names()]
    if bad:
        raise CalibrationError(f"Unknown model {bad[0]!r} in --models; the zoo has "
                               f"{', '.join(zoo.names())} (or give file.py:factory).")


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

"""Where simplace finds and keeps its data: cost models and calibration records.

This module is the one place that resolves data directories. Three kinds of place:

- **the user directory** (``user_dir()``): ``$SIMPLACE_HOME`` if set, else the
  platform's user data directory (``~/.local/share/simplace`` on Linux). What the user
  makes goes there: ``cost_models/NAME.json`` written by ``simplace calibrate`` and
  ``simplace validate --update``, ``calibration/NAME/`` with the raw calibration and
  validation records, and ``profiles/NAME/`` with the profiles ``simplace profile``
  measures of models on machine NAME.
- **a source checkout** (``checkout_dir()``), when simplace is imported from one: its
  ``cost_models/`` and ``calibration/`` hold what the project itself measured (e.g.
  ``cpu_vm2core_x4``). Read, never written unless a ``--cost-model-dir`` or
  ``--records-dir`` points there.
- **the installed package** (``package_cost_model_dir()``): the datasheet machines
  shipped with simplace (``simplace/machines/``). Read only: nothing is ever written
  into the install tree.

A cost model given by name is looked up, first match wins, in
``cost_model_search_dirs()``: ``--cost-model-dir``, the directories of
``$SIMPLACE_COST_MODELS``, the user directory, the checkout's ``cost_models/``, the
shipped machines. A name that is an existing file path is read as is.
"""

from __future__ import annotations

import os
from pathlib import Path

from simplace.errors import CalibrationError, CostModelError, OutputError

__all__ = ["ENV_COST_MODELS", "ENV_HOME", "available_cost_models", "checkout_dir",
           "cost_model_search_dirs", "cost_model_write_path", "find_cost_model",
           "find_records", "package_cost_model_dir", "profile_dir", "profile_path",
           "records_path", "user_cost_model_dir", "user_dir", "user_records_dir"]

ENV_HOME = "SIMPLACE_HOME"
# Extra directories of cost models (os.pathsep-separated), searched after
# --cost-model-dir: the environment's way to share a folder of machines.
ENV_COST_MODELS = "SIMPLACE_COST_MODELS"

_PACKAGE = Path(__file__).resolve().parent

# Help of the command-line options that name these places, kept beside the lookup they
# describe so that the two stay in step.
CLI_COST_MODEL_HELP = ("a cost model: a NAME, looked up in --cost-model-dir, the user "
                       "directory ($SIMPLACE_HOME), a source checkout's cost_models/ and the "
                       "machines shipped with simplace; or a path to a .json file")
CLI_COST_MODEL_DIR_HELP = ("a folder of cost models (NAME.json), searched first for "
                           "--cost-model NAME")
CLI_RECORDS_DIR_HELP = ("the folder of records: NAME/records.jsonl, NAME/validation.jsonl "
                        "(default: calibration/ in the user directory, $SIMPLACE_HOME)")


# --------------------------------------------------------------------------- places
def user_dir() -> Path:
    """The user's simplace directory: ``$SIMPLACE_HOME``, else platformdirs' user data
    directory for simplace. Not created here (writers create what they write into)."""
    env = os.environ.get(ENV_HOME, "").strip()
    if env:
        return Path(env).expanduser().absolute()
    import platformdirs

    return Path(platformdirs.user_data_dir("simplace", appauthor=False))


def user_cost_model_dir() -> Path:
    """``<user_dir>/cost_models``: where calibrations and corrected models are written."""
    return user_dir() / "cost_models"


def user_records_dir() -> Path:
    """``<user_dir>/calibration``: where calibration and validation records are written."""
    return user_dir() / "calibration"


def profile_dir() -> Path:
    """``<user_dir>/profiles``: where ``simplace profile`` writes what it measures."""
    return user_dir() / "profiles"


def profile_path(cost_model_name: str, graph_hash: str) -> Path:
    """The profile of graph ``graph_hash`` on machine ``cost_model_name``:
    ``<profile_dir>/NAME/HASH16.json`` (the first 16 hex digits of the graph hash).

    Raises:
      CostModelError: the machine name is not a plain file name.
    """
    if not _is_plain_name(cost_model_name) or cost_model_name.startswith("."):
        raise CostModelError(f"A machine name must be a plain file name to key its profiles "
                             f"(no folders, no leading dot), got {cost_model_name!r}.")
    return profile_dir() / cost_model_name / f"{graph_hash[:16]}.json"


def package_cost_model_dir() -> Path:
    """The datasheet machines shipped inside the installed package (read only)."""
    return _PACKAGE / "machines"


def checkout_dir() -> Path | None:
    """The source checkout simplace is imported from (its ``pyproject.toml`` sits beside
    the ``simplace/`` package and it has ``cost_models/``), or None for an installed
    wheel, whose parent folder is ``site-packages``."""
    root = _PACKAGE.parent
    if (root / "pyproject.toml").is_file() and (root / "cost_models").is_dir():
        return root
    return None


def _env_dirs() -> list[Path]:
    env = os.environ.get(ENV_COST_MODELS, "")
    return [Path(p).expanduser() for p in env.split(os.pathsep) if p]


def _inside_package(path: Path) -> bool:
    return path.resolve().is_relative_to(_PACKAGE)


# --------------------------------------------------------------------------- cost models
def cost_model_search_dirs(cost_model_dir: str | os.PathLike | None = None) -> list[Path]:
    """The folders a cost-model name is looked up in, first match wins:
    ``cost_model_dir`` (``--cost-model-dir``), the folders of ``$SIMPLACE_COST_MODELS``,
    the user directory's ``cost_models/``, the checkout's ``cost_models/`` (when running
    from one), the machines shipped in the package."""
    dirs = [] if cost_model_dir is None else [Path(cost_model_dir)]
    dirs += _env_dirs()
    dirs.append(user_cost_model_dir())
    root = checkout_dir()
    if root is not None:
        dirs.append(root / "cost_models")
    dirs.append(package_cost_model_dir())
    out: list[Path] = []
    for d in dirs:  # one folder named twice (SIMPLACE_HOME inside the repo...) is one
        if all(d.absolute() != o.absolute() for o in out):
            out.append(d)
    return out


def available_cost_models(cost_model_dir: str | os.PathLike | None = None
                          ) -> dict[str, Path]:
    """Name -> file of every cost model found by name (first one wins, in the order of
    ``cost_model_search_dirs``), sorted by name."""
    out: dict[str, Path] = {}
    for d in cost_model_search_dirs(cost_model_dir):
        if d.is_dir():
            for p in sorted(d.glob("*.json")):
                out.setdefault(p.stem, p)
    return dict(sorted(out.items()))


def _is_plain_name(name: str) -> bool:
    return bool(name) and os.sep not in name and (os.altsep is None or os.altsep not in name)


def find_cost_model(name_or_path: str | os.PathLike,
                    cost_model_dir: str | os.PathLike | None = None) -> Path:
    """The file of a cost model: ``name_or_path`` itself if it is a file, else
    ``NAME.json`` (a trailing ``.json`` may be given) in the first of
    ``cost_model_search_dirs(cost_model_dir)`` that has it.

    Raises:
      CostModelError: ``cost_model_dir`` is not a folder, or no such model; the message
        lists the folders searched and the names available.
    """
    if cost_model_dir is not None and not Path(cost_model_dir).is_dir():
        raise CostModelError(f"--cost-model-dir {os.fspath(cost_model_dir)} is not a folder: "
                             "give the folder that holds NAME.json.")
    p = Path(name_or_path)
    if p.is_file():
        return p
    name = os.fspath(name_or_path)
    dirs = cost_model_search_dirs(cost_model_dir)
    if _is_plain_name(name):
        stem = name[:-5] if name.endswith(".json") else name
        for d in dirs:
            cand = d / f"{stem}.json"
            if cand.is_file():
                return cand
    avail = available_cost_models(cost_model_dir)
    raise CostModelError(
        f"No cost model {name!r}: not a file, and not a name in any of "
        f"{', '.join(str(d) for d in dirs)}. Available: "
        f"{', '.join(avail) if avail else '(none)'}. Measure this machine with "
        f"`simplace calibrate`, or give a file path or --cost-model-dir DIR.")


def cost_model_write_path(name: str, cost_model_dir: str | os.PathLike | None = None, *,
                          read_from: str | os.PathLike | None = None) -> Path:
    """Where a cost model called ``name`` is written: ``cost_model_dir`` if given, else
    ``read_from`` (the file it was loaded from) when that is the user's own file (not in
    the checkout's ``cost_models/`` nor shipped in the package), else the user
    directory's ``cost_models/NAME.json``, which is looked up before the checkout and the
    package, so the written model is the one found by name next time.

    Raises:
      OutputError: the place is inside the installed package.
    """
    if cost_model_dir is not None:
        path = Path(cost_model_dir) / f"{name}.json"
    elif read_from is not None and not _project_file(Path(read_from)):
        path = Path(read_from)
    else:
        path = user_cost_model_dir() / f"{name}.json"
    if _inside_package(path):
        raise OutputError(f"{path} is inside the installed simplace package, which is never "
                          "written to: pass --cost-model-dir DIR, or set $SIMPLACE_HOME.")
    return path


def _project_file(path: Path) -> bool:
    """Whether ``path`` is one of the project's own models (shipped, or committed in the
    checkout), which a calibration or correction must not overwrite."""
    if _inside_package(path):
        return True
    root = checkout_dir()
    return root is not None and path.resolve().is_relative_to((root / "cost_models").resolve())


# --------------------------------------------------------------------------- records
def _check_name(name: str) -> None:
    if not _is_plain_name(name) or name.startswith("."):
        raise CalibrationError(f"A machine name must be a plain file name (no folders, no "
                               f"leading dot), got {name!r}.")


def records_path(name: str, filename: str = "records.jsonl",
                 records_dir: str | os.PathLike | None = None) -> Path:
    """Where records of machine ``name`` are written: ``<records_dir>/NAME/filename``,
    ``records_dir`` defaulting to the user directory's ``calibration/``.

    Raises:
      CalibrationError: ``name`` is not a plain file name.
      OutputError: the place is inside the installed package.
    """
    _check_name(name)
    base = Path(records_dir) if records_dir is not None else user_records_dir()
    path = base / name / filename
    if _inside_package(path):
        raise OutputError(f"{path} is inside the installed simplace package, which is never "
                          "written to: pass --records-dir DIR, or set $SIMPLACE_HOME.")
    return path


def find_records(name: str, filename: str = "records.jsonl",
                 records_dir: str | os.PathLike | None = None) -> Path:
    """Records of machine ``name`` to read (``calibrate --refit``): in ``records_dir`` if
    given, else the user directory's ``calibration/``, else the checkout's
    ``calibration/`` (the records behind the project's measured models). A file found
    nowhere gives the path it would be written to, so the caller's "does not exist"
    message names the place to look."""
    _check_name(name)
    if records_dir is not None:
        return Path(records_dir) / name / filename
    bases = [user_records_dir()]
    root = checkout_dir()
    if root is not None:
        bases.append(root / "calibration")
    for base in bases:
        if (base / name / filename).is_file():
            return base / name / filename
    return bases[0] / name / filename

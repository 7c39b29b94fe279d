"""JSON files people keep (graphs, placements, cost models): atomic writes, clear errors.

Output paths are checked before the work that fills them starts (``check_output_path``),
so that a long search never ends in an unwritable path; writes go to a temporary file
that replaces the old one only once complete, so a failed write never damages it.
``check_fields`` checks a parsed JSON object's fields and their types, with messages
naming the field (records files, ``simplace._jsonl``, use it too).
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simplace.errors import OutputError


def _is_special(path: Path) -> bool:
    """A device or FIFO (``/dev/null``, ``/dev/stdout``): written in place, never renamed
    over (as root a rename would replace the device node itself)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _probe_folder(folder: Path) -> str | None:
    """None if a file can be created in ``folder``, else the reason. Creating one is the
    only test that also holds for root and for read-only file systems."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".simplace-probe-"):
            pass
    except OSError as err:
        return err.strerror or str(err)
    return None


def check_output_path(path: str | os.PathLike, option: str) -> None:
    """Raise ``OutputError`` at once when ``path`` (given as ``option``, e.g. ``--out``)
    cannot be written: its folder is missing or not a folder, it is a directory, or the
    place is read-only. Call it before the work whose result goes there."""
    text = os.fspath(path)
    if not text:
        raise OutputError(f"{option} is empty: give a file name.")
    p = Path(text)
    if p.is_dir():
        raise OutputError(f"{option} {text} is a directory: give a file name, e.g. "
                          f"{p / ('result' + (p.suffix or '.json'))}.")
    if _is_special(p):
        if not os.access(p, os.W_OK):
            raise OutputError(f"{option} {text} cannot be written (permission denied).")
        return
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"{option} {text} is read-only: make it writable (chmod u+w) or "
                          "choose another path.")
    folder = p.parent
    if not folder.exists():
        raise OutputError(f"{option} {text}: folder {folder} does not exist. Create it first "
                          f"(mkdir -p {folder}) or choose another path.")
    if not folder.is_dir():
        raise OutputError(f"{option} {text}: {folder} is not a folder.")
    why = _probe_folder(folder)
    if why is not None:
        raise OutputError(f"{option} {text}: cannot write in folder {folder} ({why}). Choose "
                          "a writable place.")


def check_output_dir(path: str | os.PathLike, option: str) -> None:
    """Like ``check_output_path`` for a folder that is created if missing: it (or, if
    missing, the nearest folder above it that exists) must be a writable folder."""
    text = os.fspath(path)
    if not text:
        raise OutputError(f"{option} is empty: give a folder.")
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{option} {text} is a file, not a folder.")
    existing = p
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise OutputError(f"{option} {text}: {existing} is a file, not a folder.")
    why = _probe_folder(existing)
    if why is not None:
        raise OutputError(f"{option} {text}: cannot write in folder {existing} ({why}). "
                          "Choose a writable place.")


def _readable(obj: Any, level: int = 0) -> str:
    """JSON indented by one space per level, except that a list of plain values (numbers,
    strings) stays on one line: a placement's assignment is one line, not one per op."""
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        pad = " " * (level + 1)
        items = [f"{pad}{json.dumps(k if isinstance(k, str) else json.dumps(k))}: "
                 f"{_readable(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * level + "}"
    if isinstance(obj, list | tuple):
        if not any(isinstance(x, dict | list | tuple) for x in obj):
            numbers = all(isinstance(x, int | float) for x in obj)
            return json.dumps(list(obj), allow_nan=False,
                              separators=(",", ":") if numbers else (", ", ": "))
        pad = " " * (level + 1)
        return ("[\n" + ",\n".join(pad + _readable(x, level + 1) for x in obj) + "\n"
                + " " * level + "]")
    return json.dumps(obj, allow_nan=False)


def write_json(path: str | os.PathLike, data: Any, *, compact: bool = False,
               inline_lists: bool = False) -> None:
    """Write ``data`` as JSON atomically: a temporary file, then a rename, so that an
    interrupted or failed write never leaves a half-written file where a good one was.

    compact: no whitespace at all (large graphs). inline_lists: indented, but lists of
    plain values on one line (placements). Default: indented by one space.
    Raises ``OutputError`` naming ``path`` when it cannot be written.
    """
    if compact:
        text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    elif inline_lists:
        text = _readable(data)
    else:
        text = json.dumps(data, indent=1, allow_nan=False)
    text += "\n"
    path = Path(path)
    if path.is_symlink():  # replace what the link points to, and keep the link
        path = Path(os.path.realpath(path))
    if _is_special(path):
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError as err:
            raise OutputError(f"Cannot write {path}: {err.strerror or err}.") from None
        return
    if path.is_dir():
        raise OutputError(f"Cannot write {path}: it is a directory.")
    # A fresh name next to the target (same file system, so the rename is atomic),
    # created with open() so that the file gets the usual umask permissions.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "x") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        # Name the user's path, never the hidden temporary file.
        raise OutputError(f"Cannot write {path}: {err.strerror or err}. The file there, if "
                          "any, is unchanged.") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_json(path: str | os.PathLike, error: type[Exception], what: str) -> Any:
    """Parse a JSON file; a missing, unreadable or malformed file raises ``error`` with a
    message naming ``what`` it should have been (``"Graph file"``...)."""
    if not os.fspath(path):
        raise error(f"{what}: the path is empty; give a file name.")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist.") from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a directory, not a file.") from None
    except PermissionError:
        raise error(f"{what} {path} cannot be read (permission denied).") from None
    except json.JSONDecodeError as err:
        raise error(f"{what} {path} is not valid JSON ({err}).") from None
    except UnicodeDecodeError as err:
        raise error(f"{what} {path} is not a text file ({err}).") from None
    except RecursionError:
        raise error(f"{what} {path} is nested too deeply to be a simplace file.") from None
    except OSError as err:
        raise error(f"{what} {path} cannot be read ({err.strerror or err}).") from None


# --------------------------------------------------------------------------- field checks
_JSON_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", list: "a list",
                    dict: "an object", bool: "true or false", type(None): "null"}


def _json_type_name(value: Any) -> str:
    """What a JSON value is, in JSON's words (``a string``, ``a number``, ``null``...)."""
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    for t, name in _JSON_TYPE_NAMES.items():
        if isinstance(value, t):
            return name
    return type(value).__name__


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _is_json_type(value: Any, types: tuple[type, ...]) -> bool:
    """``value`` is one of ``types`` as JSON types go: ``float`` means any number, and
    true/false are never numbers (Python's bool is an int)."""
    if isinstance(value, bool):
        return bool in types
    if float in types and isinstance(value, int | float):
        return True
    return isinstance(value, types)


def check_schema(obj: Any, schema: str, version: int, error: type[Exception], where: str,
                 what: str, *, older: Mapping[int, str] | None = None) -> dict:
    """``obj`` checked as a JSON object whose ``schema`` field is ``schema`` and whose
    ``schema_version`` is ``version``; ``error`` naming ``where`` otherwise.

    what: the kind of document (``"placement file"``, ``"validation record"``).
    older: per older version, what to do about a document of that version (how to
    make it again), said after the version error.
    """
    if not isinstance(obj, dict) or obj.get("schema") != schema:
        got = obj.get("schema") if isinstance(obj, dict) else None
        its = (f"its 'schema' is {_short(got)}, not {_short(schema)}" if got is not None
               else f"it has no 'schema' field {_short(schema)}" if isinstance(obj, dict)
               else f"it is {_json_type_name(obj)}, not an object")
        raise error(f"{where}: not a simplace {what} ({its}).")
    got = obj.get("schema_version")
    if got != version:
        hint = (older or {}).get(got) if type(got) is int else None
        raise error(f"{where}: {what} schema_version {_short(got)} is not supported; this "
                    f"simplace reads {version}" + (f": {hint}" if hint else "."))
    return obj


def check_fields(obj: Any, fields: Mapping[str, type | tuple[type, ...]],
                 error: type[Exception], where: str, *, what: str = "the object",
                 optional: Mapping[str, type | tuple[type, ...]] | None = None,
                 closed: bool = False, hints: Mapping[str, str] | None = None) -> dict:
    """``obj`` checked as a JSON object with ``fields``; ``error`` otherwise.

    Args:
      obj: a parsed JSON value.
      fields: each required field and its JSON type(s): ``str``, ``int`` (integers
        only), ``float`` (any number), ``bool``, ``list``, ``dict``, ``type(None)``.
        True and false never count as numbers.
      error: the exception to raise (``CalibrationError``, ``SimplaceError``...).
      where: where ``obj`` comes from, first in every message (``"path, line 3"``).
      what: what ``obj`` is, for the messages (``"a validation record"``).
      optional: fields that may be absent, and their types when present.
      closed: a field in neither ``fields`` nor ``optional`` is an error.
      hints: what a field must be, said in full in place of its JSON type(s) when it
        has the wrong type (``{"assignment": "a list of device indices, one per op"}``).

    Returns ``obj``. The message names the field, what it must be and what it is.
    """
    optional = optional or {}
    if not isinstance(obj, dict):
        raise error(f"{where}: {what} must be a JSON object, got {_json_type_name(obj)}.")
    for name in fields:
        if name not in obj:
            raise error(f"{where}: field {name!r} is missing ({what} needs "
                        f"{', '.join(fields)}).")
    for name, types in (*fields.items(), *optional.items()):
        if name not in obj:
            continue
        types = types if isinstance(types, tuple) else (types,)
        if not _is_json_type(obj[name], types):
            want = [_JSON_TYPE_NAMES.get(t, t.__name__) for t in types
                    if not (t is int and float in types)]
            want_text = (hints or {}).get(name) or " or ".join(want)
            raise error(f"{where}: field {name!r} of {what} must be {want_text}, got "
                        f"{_short(obj[name])}.")
    if closed:
        unknown = sorted(set(obj) - set(fields) - set(optional))
        if unknown:
            raise error(f"{where}: {what} has an unknown field {unknown[0]!r}; it takes "
                        f"{', '.join([*fields, *optional])}.")
    return obj

"""JSON Lines record files (calibration and validation records): one policy for all.

A records file holds one JSON object per line, and grows by appending: each record is
written as one line and flushed at once, so an interrupted run loses at most the line
it was writing. That line, cut short, is the file's last one and has no final newline.
The policy for it, here and nowhere else:

* **reading** (``read``): a last line without its newline that is not valid JSON is
  such a torn write: it is skipped with a warning naming the file and line. Any other
  line that is not valid JSON is an error naming the file and line and how to mend it
  (a torn write never leaves one there, so something else damaged the file). Blank
  lines carry nothing and are skipped.
* **appending** (``Appender``, ``append``): a torn last line is cut off first (with a
  warning naming the file), so that the next record does not end up glued to it; a
  last line that is whole JSON but lacks its newline gets one.

Callers check each record's fields themselves (``simplace._jsonfile.check_fields``):
this module knows lines and JSON, not schemas.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["Appender", "append", "dumps", "read"]


def dumps(record: Mapping[str, Any]) -> str:
    """``record`` as one compact JSON line, newline included. NaN and infinity (which
    JSON lacks) raise ``ValueError``."""
    return json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"


def _parses(raw: bytes) -> bool:
    try:
        json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return True


def _last_line_start(f, end: int, chunk_bytes: int = 1 << 16) -> int:
    """The offset just after the last newline before ``end`` in the binary file ``f``
    (0 if there is none). Reads backwards in chunks: only the tail is read."""
    pos = end
    while pos > 0:
        start = max(0, pos - chunk_bytes)
        f.seek(start)
        k = f.read(pos - start).rfind(b"\n")
        if k >= 0:
            return start + k + 1
        pos = start
    return 0


def _mend_tail(path: Path, chunk_bytes: int = 1 << 16) -> None:
    """Make ``path`` end with a newline before anything is appended: a last line that is
    whole JSON gets its newline; a torn one (not JSON: an interrupted write) is cut off,
    with a warning."""
    with open(path, "r+b") as f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return
        start = _last_line_start(f, end, chunk_bytes)
        f.seek(start)
        tail = f.read(end - start)
        if _parses(tail):
            f.seek(end)
            f.write(b"\n")
            return
        if tail.strip():
            warnings.warn(f"{path}: dropped a truncated last record (a line cut short by an "
                          "interrupted write) before appending.", stacklevel=4)
        f.truncate(start)


class Appender:
    """Appends records to a JSON Lines file, one flushed line each, so that an
    interrupted run loses at most the record being written. Opening it mends a torn
    last line first (see the module docstring). Use as a context manager, or ``close``.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            _mend_tail(self.path)
        self._f = open(self.path, "a")  # noqa: SIM115 - closed in close()

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record (checked by the caller) and flush it."""
        self.write_line(dumps(record))

    def write_line(self, line: str) -> None:
        """Append one line already encoded by ``dumps`` and flush it."""
        self._f.write(line)
        self._f.flush()

    def close(self) -> None:
        """Close the file (every record written is already flushed)."""
        self._f.close()

    def __enter__(self) -> Appender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def append(path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> None:
    """Append ``records`` (checked by the caller) to a JSON Lines file, one flushed line
    each. All are encoded first, so one that is not JSON appends nothing."""
    lines = [dumps(r) for r in records]
    with Appender(path) as out:
        for line in lines:
            out.write_line(line)


def read(path: str | os.PathLike, error: type[Exception], *, missing: str,
         mend: str = "") -> list[tuple[int, Any]]:
    """``[(line number, JSON value)]`` of each non-blank line of a JSON Lines file.

    A torn last line (no final newline, not JSON) is skipped with a warning naming the
    file and line. Any other line that is not JSON raises ``error`` naming the file and
    line; its message ends with how to mend it: delete or repair the line, then
    ``mend`` (what to do about the record it held). A missing file raises ``error`` with
    the message ``missing``; an unreadable one, ``error`` saying why.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(missing) from None
    except IsADirectoryError:
        raise error(f"{path} is a directory, not a records file.") from None
    except OSError as err:
        raise error(f"{path} cannot be read ({err.strerror or err}).") from None
    lines = data.split(b"\n")
    torn = lines[-1] != b""  # the last line lacks its newline (it may still be whole)
    if not torn:
        lines.pop()
    out: list[tuple[int, Any]] = []
    for n, raw in enumerate(lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            why = f"not UTF-8 text: {err.reason} at byte {err.start}"
        else:
            if not text.strip():
                continue
            try:
                out.append((n, json.loads(text)))
                continue
            except json.JSONDecodeError as err:
                why = f"{err.msg} at column {err.colno}"
            except RecursionError:
                why = "nested too deeply"
        if torn and n == len(lines):
            warnings.warn(f"{path}, line {n}: skipped a truncated last record (a line cut "
                          "short by an interrupted write).", stacklevel=3)
            break
        raise error(f"{path}, line {n} is not valid JSON ({why}). A records file holds one "
                    "JSON object per line and an interrupted write only cuts the last "
                    f"one: delete or repair this line{'; ' + mend if mend else '.'}")
    return out

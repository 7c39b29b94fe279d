"""JSON files people keep (graphs, placements, cost models): atomic writes, clear errors."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any


def write_json(path: str | os.PathLike, data: Any, *, compact: bool = False) -> None:
    """Write ``data`` as JSON atomically: a temporary file, then a rename, so that an
    interrupted write never leaves a half-written file where a good one was."""
    path = Path(path)
    text = (json.dumps(data, separators=(",", ":"), allow_nan=False) if compact
            else json.dumps(data, indent=1, allow_nan=False)) + "\n"
    # A fresh name next to the target (same file system, so the rename is atomic),
    # created with open() so that the file gets the usual umask permissions.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "x") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_json(path: str | os.PathLike, error: type[Exception], what: str) -> Any:
    """Parse a JSON file; a missing, unreadable or malformed file raises ``error`` with a
    message naming ``what`` it should have been (``"Graph file"``...)."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist.") from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a directory, not a file.") from None
    except json.JSONDecodeError as err:
        raise error(f"{what} {path} is not valid JSON ({err}).") from None
    except UnicodeDecodeError as err:
        raise error(f"{what} {path} is not a text file ({err}).") from None

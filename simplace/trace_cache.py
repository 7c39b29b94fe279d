"""Traced zoo graphs kept in the user directory: a command run again on the same zoo
model at the same sizes loads its graph instead of tracing it again (seconds on the
zoo's big models, which a ``--budget-s`` pays for).

An entry is keyed by the model, its mode and sizes, and a digest of what its trace
depends on: simplace's own source files (the zoo and the tracer among them), the
versions of jax, jaxlib and flax, and ``JAX_ENABLE_X64``. So an upgrade or an edit of
simplace traces anew; an entry of an older key is replaced. Only zoo models are kept: a
model file of the user's can import code that the key cannot see. A file that does not
load (truncated or edited: a saved graph's content hash is checked) is traced again and
replaced. ``SIMPLACE_TRACE_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from importlib import metadata
from pathlib import Path

from simplace import paths

__all__ = ["ENV_SWITCH", "cached_graph", "entry_path", "keep"]

ENV_SWITCH = "SIMPLACE_TRACE_CACHE"
_PACKAGES = ("jax", "jaxlib", "flax")


def trace_dir() -> Path:
    """``<user dir>/traces``: where traced zoo graphs are kept."""
    return paths.user_dir() / "traces"


@functools.cache
def _source_digest() -> str:
    """sha256 over simplace's Python sources (their paths and bytes), read once."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


def _key(spec: str, training: bool, batch: int | None, small: bool) -> str:
    h = hashlib.sha256(_source_digest().encode())
    for part in (spec, training, batch, small, os.environ.get("JAX_ENABLE_X64", ""),
                 *(f"{p}={_version(p)}" for p in _PACKAGES)):
        h.update(repr(part).encode())
    return h.hexdigest()[:16]


def _stem(spec: str, training: bool, batch: int | None, small: bool) -> str:
    return (f"{spec}-{'train' if training else 'inference'}{'-small' if small else ''}"
            f"{f'-b{batch}' if batch is not None else ''}")


def entry_path(spec: str, *, training: bool, batch: int | None, small: bool) -> Path | None:
    """Where the trace of zoo model ``spec`` at these sizes is kept, or None where it is
    not kept: not a zoo name (a saved graph, ``file.py:factory``, ``module:factory``), or
    the cache is off (``SIMPLACE_TRACE_CACHE=0``)."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    if not spec or any(c in spec for c in ":/\\") or spec.endswith(".json") \
            or spec.startswith("."):
        return None
    stem = _stem(spec, training, batch, small)
    return trace_dir() / f"{stem}-{_key(spec, training, batch, small)}.json"


def cached_graph(path: Path):
    """``(graph, None)`` read from ``path``; ``(None, None)`` when there is no entry;
    ``(None, why)`` when the file cannot be read (it is traced again and replaced)."""
    from simplace.errors import SimplaceError
    from simplace.graph import OpGraph

    if not path.is_file():
        return None, None
    try:
        return OpGraph.load(path), None
    except (SimplaceError, OSError, ValueError) as err:
        return None, str(err).splitlines()[0][:200]


def keep(graph, path: Path) -> str | None:
    """Write ``graph`` to ``path`` and remove the entries of the same model and sizes
    under other keys; None, or why it could not be written (the command goes on)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        graph.save(path)
        prefix = path.name[:-len("-0123456789abcdef.json")]
        for old in path.parent.glob(f"{prefix}-*.json"):
            if old != path and re.fullmatch(re.escape(prefix) + r"-[0-9a-f]{16}\.json",
                                            old.name):
                old.unlink(missing_ok=True)
    except OSError as err:
        return str(err)
    return None

"""Checkpoints of a REINFORCE run: one ``.npz`` file (no pickle).

Array trees (parameters, optimizer state) are flattened with
``flax.serialization.to_state_dict`` into ``"tree/path/to/leaf"`` entries; everything
else (counters, best step time, history rows, the run's fingerprint) is one JSON string
stored under ``"meta"``. Loading restores the trees into templates of the same structure
(a fresh policy's parameters and optimizer state).
"""

from __future__ import annotations

import json
import os

import flax.serialization
import numpy as np

from simplace.errors import SimplaceError

SCHEMA = "simplace.rl.checkpoint"
SCHEMA_VERSION = 1


def _flatten(tree, prefix: str, out: dict) -> None:
    if isinstance(tree, dict):
        if not tree:
            out[prefix + "/__empty__"] = np.zeros(0)
        for k, v in tree.items():
            _flatten(v, f"{prefix}/{k}", out)
    else:
        out[prefix] = np.asarray(tree)


def _unflatten(flat: dict, prefix: str) -> dict:
    root: dict = {}
    for key, val in flat.items():
        if not key.startswith(prefix + "/"):
            continue
        parts = key[len(prefix) + 1:].split("/")
        node = root
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        if parts[-1] != "__empty__":
            node[parts[-1]] = val
    return root


def save(path, trees: dict, meta: dict) -> None:
    """Write ``trees`` ({name: pytree}) and ``meta`` (JSON-able) to ``path`` atomically."""
    flat: dict = {}
    for name, tree in trees.items():
        _flatten(flax.serialization.to_state_dict(tree), name, flat)
    flat["meta"] = np.array(json.dumps({"schema": SCHEMA, "version": SCHEMA_VERSION, **meta}))
    path = os.fspath(path)
    tmp = path + ".tmp.npz"
    np.savez(tmp, **flat)
    os.replace(tmp, path)  # a run stopped mid-write keeps the previous checkpoint


def check(path) -> None:
    """Refuse, before any work, a file at ``path`` that is not a checkpoint this simplace
    reads (an empty file, another format); no file there is fine (a run writes one)."""
    if path is not None and os.path.isfile(path):
        _read(path)


def load(path, templates: dict) -> tuple[dict, dict]:
    """(trees restored into ``templates`` {name: pytree}, meta) from ``path``."""
    flat, meta = _read(path)
    trees = {}
    for name, tmpl in templates.items():
        state = _unflatten(flat, name)
        try:
            trees[name] = flax.serialization.from_state_dict(tmpl, state)
        except (KeyError, ValueError, TypeError) as err:
            raise SimplaceError(f"Checkpoint {path} does not match this policy ({name}: "
                                f"{err}); delete it or use another path.") from None
    return trees, meta


def _read(path) -> tuple[dict, dict]:
    """(arrays, meta) of a checkpoint file, or SimplaceError saying why it is none."""
    try:
        if os.path.getsize(path) == 0:
            raise SimplaceError(f"Checkpoint {path} is an empty file, not a checkpoint: "
                                "delete it to start afresh, or pass another path.")
        with np.load(os.fspath(path), allow_pickle=False) as f:
            flat = {k: f[k] for k in f.files}
    except SimplaceError:
        raise
    except Exception as err:  # noqa: BLE001 - numpy, zipfile and pickle errors alike
        raise SimplaceError(f"Cannot read checkpoint {path}: it is not a simplace RL "
                            f"checkpoint (numpy cannot read it as one: {type(err).__name__})."
                            " Delete it to start afresh, or pass another path.") from None
    try:
        meta = json.loads(str(flat.pop("meta")))
    except (KeyError, json.JSONDecodeError):
        meta = {}
    if meta.get("schema") != SCHEMA or meta.get("version") != SCHEMA_VERSION:
        raise SimplaceError(f"{path} is not a simplace RL checkpoint of version "
                            f"{SCHEMA_VERSION}; delete it to start afresh.")
    return flat, meta

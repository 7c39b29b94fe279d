"""Placements on disk: which device each op of a graph runs on, for which machine.

A placement in memory is ``int32[M]``; on disk it is JSON that also names the graph
(content hash), the cost model and its device names, the method that found it and the
step time it was predicted to take, so that a placement is never applied to a graph or
machine it was not made for.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from typing import Any

import numpy as np

from simplace._jsonfile import check_fields, check_schema, read_json, write_json
from simplace.errors import PlacementError

SCHEMA = "simplace.placement"
SCHEMA_VERSION = 1


def check_placement(placement, num_ops: int, num_devices: int) -> np.ndarray:
    """Validate one placement (one device index per op) and return it as int32[M].

    Raises ``PlacementError`` saying what is wrong: not 1-D, wrong length, not integers,
    or a device index outside ``0..D-1``.
    """
    arr = np.asarray(placement)
    if arr.ndim != 1:
        raise PlacementError(f"A placement is a 1-D array with one device index per op; got "
                             f"shape {arr.shape}. (For many placements use "
                             "batched_simulator.)")
    return check_placements(arr[None], num_ops, num_devices)[0]


def check_placements(placements, num_ops: int, num_devices: int) -> np.ndarray:
    """Validate a batch of placements int[B, M]; return int32[B, M] (see check_placement)."""
    arr = np.asarray(placements)
    if arr.ndim != 2:
        raise PlacementError(f"Placements must be int[B, M] (one row per placement); got "
                             f"shape {arr.shape}.")
    if arr.shape[1] != num_ops:
        raise PlacementError(f"A placement has {arr.shape[1]} entries but the graph has "
                             f"{num_ops} ops: give exactly one device index per op.")
    if arr.size and arr.dtype.kind not in "iu":
        if arr.dtype.kind == "b":
            raise PlacementError("Device indices must be integers, got booleans.")
        try:
            whole = np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))
        except TypeError:
            whole = False
        if not whole:
            raise PlacementError(f"Device indices must be integers; got dtype {arr.dtype} "
                                 "with non-integral values. Round or cast the placement "
                                 "(np.asarray(p).astype(np.int32)).")
        arr = arr.astype(np.int64)
    if arr.size:
        bad = np.argwhere((arr < 0) | (arr >= num_devices))
        if len(bad):
            b, i = (int(x) for x in bad[0])
            row = f"placement {b}, " if arr.shape[0] > 1 else ""
            raise PlacementError(
                f"{row}op {i} is placed on device {int(arr[b, i])}, but the machine has "
                f"{num_devices} devices (indices 0..{num_devices - 1}); {len(bad)} entries "
                "are out of range. Use a device index of this machine for every op."
            )
    return arr.astype(np.int32)


@dataclasses.dataclass(frozen=True, eq=False)
class Placement:
    """A placement with the context it was made for.

    assignment: int32[M], device index of each op.
    graph_hash: ``OpGraph.hash`` of the graph it places.
    cost_model: name of the cost model (machine) it was made for.
    device_names: the names of that machine's devices, in index order.
    method: what produced it (``single``, ``heft``, ``rl-gnn``...).
    predicted_step_time_s: the simulator's step time for it (None if not simulated).
    meta: anything else worth keeping (seed, budget, wall time...).
    oom: True when the placement does not fit the machine's memory (the simulator's peak
      memory exceeds a device's capacity); kept so that such a file is never mistaken
      for a usable placement.

    On disk the assignment is one line of JSON; older files with one index per line load
    the same.
    """

    assignment: np.ndarray
    graph_hash: str
    cost_model: str
    device_names: tuple[str, ...]
    method: str = ""
    predicted_step_time_s: float | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    oom: bool = False

    def __post_init__(self):
        for f in ("graph_hash", "cost_model", "method"):
            if not isinstance(getattr(self, f), str):
                raise PlacementError(f"Placement.{f} must be a string, got "
                                     f"{getattr(self, f)!r}.")
        if isinstance(self.device_names, str) or not all(
                isinstance(n, str) and n for n in self.device_names):
            raise PlacementError(f"Placement.device_names must be a list of device names "
                                 f"(non-empty strings), got {self.device_names!r}.")
        t = self.predicted_step_time_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real)
                              or not math.isfinite(t) or t < 0):
            raise PlacementError(f"Placement.predicted_step_time_s must be a finite number "
                                 f"of seconds >= 0 or None, got {t!r}.")
        if not isinstance(self.oom, bool | np.bool_):
            raise PlacementError(f"Placement.oom must be True or False, got {self.oom!r}.")
        if not isinstance(self.meta, dict):
            raise PlacementError(f"Placement.meta must be a dict, got {self.meta!r}.")
        a = check_placement(self.assignment, len(np.asarray(self.assignment).reshape(-1)),
                             max(len(self.device_names), 1))
        a.flags.writeable = False
        object.__setattr__(self, "assignment", a)
        object.__setattr__(self, "device_names", tuple(self.device_names))
        object.__setattr__(self, "oom", bool(self.oom))

    def check(self, graph, cost_model, *, force: bool = False) -> np.ndarray:
        """Refuse a placement made for another graph or machine; returns the assignment.

        A machine of another size is always refused. One of the same size but another
        name or other device names (the same indices may mean other hardware) is refused
        unless ``force`` (the command line's ``--force``).
        """
        if self.graph_hash != graph.hash:
            raise PlacementError(
                f"This placement was made for graph {self.graph_hash[:12]}..., but the graph "
                f"given is {graph.hash[:12]}... ({graph.name or 'unnamed'}): trace the same "
                "model with the same sizes (batch, training/inference) it was made for."
            )
        if len(self.assignment) != graph.num_ops:
            raise PlacementError(f"The placement has {len(self.assignment)} entries but the "
                                 f"graph has {graph.num_ops} ops.")
        names = list(cost_model.device_names)
        if len(self.device_names) != len(names):
            raise PlacementError(
                f"The placement uses a machine of {len(self.device_names)} devices "
                f"({', '.join(self.device_names)}) but cost model '{cost_model.name}' has "
                f"{len(names)} ({', '.join(names)}): use the cost model it was made for "
                f"('{self.cost_model}')."
            )
        if not force and (self.cost_model != cost_model.name
                          or list(self.device_names) != names):
            raise PlacementError(
                f"The placement was made for machine '{self.cost_model}' (devices "
                f"{', '.join(self.device_names)}), not for cost model '{cost_model.name}' "
                f"(devices {', '.join(names)}): use --cost-model {self.cost_model}, or "
                "--force to apply it to this machine anyway (device k of one becomes "
                "device k of the other)."
            )
        return check_placement(self.assignment, graph.num_ops, len(names))

    def to_dict(self) -> dict:
        """The placement as a JSON-able dict with its schema and version, as a placement file holds
        it."""
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "graph_hash": self.graph_hash,
            "cost_model": self.cost_model,
            "device_names": list(self.device_names),
            "method": self.method,
            "predicted_step_time_s": self.predicted_step_time_s,
            "meta": self.meta,
            "oom": self.oom,
            "assignment": self.assignment.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "<dict>") -> Placement:
        """A Placement read from its dict, checked; ``source`` names it in error messages
        (``PlacementError``)."""
        check_schema(d, SCHEMA, SCHEMA_VERSION, PlacementError, source, "placement file")
        _check_fields(d, source)
        try:
            return cls(assignment=np.asarray(d["assignment"], dtype=np.int64),
                       graph_hash=d["graph_hash"], cost_model=d["cost_model"],
                       device_names=tuple(d["device_names"]), method=d.get("method") or "",
                       predicted_step_time_s=d.get("predicted_step_time_s"),
                       meta=dict(d.get("meta") or {}), oom=bool(d.get("oom", False)))
        except PlacementError as err:
            raise PlacementError(f"{source}: {err}") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write the placement as JSON, atomically; the assignment on one line."""
        write_json(path, self.to_dict(), inline_lists=True)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Placement:
        """Read a placement file; use ``check`` before applying it to a graph."""
        return cls.from_dict(read_json(path, PlacementError, "Placement file"),
                             source=str(path))


# Fields of a placement file and their JSON types (float: any number).
_FIELDS = {"graph_hash": str, "cost_model": str, "device_names": list, "assignment": list}
_OPTIONAL_FIELDS = {"method": (str, type(None)), "predicted_step_time_s": (float, type(None)),
                    "meta": (dict, type(None)), "oom": bool}
_HINTS = {"assignment": "a list of device indices (integers), one per op",
          "device_names": "a list of device names, one per device index",
          "predicted_step_time_s": "a number of seconds or null"}


def _check_fields(d: dict, source: str) -> None:
    """Strict JSON types: JSON has no integer type of its own, and numpy would turn 2.7
    into 2 and ``true`` into device 1, so each field is checked before conversion."""
    def bad(field: str, want: str, value) -> PlacementError:
        return PlacementError(f"{source}: field '{field}' must be {want}, got "
                              f"{json.dumps(value)[:60]}.")

    check_fields(d, _FIELDS, PlacementError, source, what="a placement",
                 optional=_OPTIONAL_FIELDS, hints=_HINTS)
    a = d["assignment"]
    for i, x in enumerate(a):
        if type(x) is not int:
            raise PlacementError(
                f"{source}: field 'assignment' entry {i} is {json.dumps(x)[:40]}, not an "
                "integer: each entry is the index of the device op i runs on (0, 1, ...).")
        if not -(2**31) <= x < 2**31:
            raise PlacementError(f"{source}: field 'assignment' entry {i} is {str(x)[:40]}, "
                                 "not a device index.")
    names = d["device_names"]
    if not all(isinstance(n, str) and n for n in names):
        raise bad("device_names", "a list of device names (non-empty strings)", names)
    for f in ("graph_hash", "cost_model"):
        if not d[f]:
            raise bad(f, "a non-empty string", d[f])
    t = d.get("predicted_step_time_s")
    if t is not None and (not math.isfinite(t) or t < 0):
        raise bad("predicted_step_time_s", "a finite number of seconds >= 0 or null", t)

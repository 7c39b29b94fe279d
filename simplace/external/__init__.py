"""Placement instances from other systems: import them, score placements their way.

``load_instance(path, fmt)`` reads a file of another placement system into an
``Instance``: an ``OpGraph`` (op i is the file's i-th node, its id kept in
``node_ids``), the machine the file implies as a ``CostModel`` whose op times come
from the file (a profile attached; no host dispatch or launch costs), the colocation
classes, and the system's own scorers (``rulers``: objective name -> ``Ruler``), so
that a placement can be handed back to that system and is compared with its
placements on its own terms.

Formats: ``doppler`` (Doppler, ICLR 2026: ``compute_graph/*.txt``) and ``msr``
(Tarnawski et al., NeurIPS 2020, ``msr-fiddle/dnn-partitioning``: the JSON instances).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from simplace.errors import SimplaceError

FORMATS = ("doppler", "msr")


class ExternalFormatError(SimplaceError):
    """An instance file that cannot be read: it names the file, line or node."""


@dataclasses.dataclass(frozen=True, eq=False)
class Instance:
    """One imported placement instance.

    graph: the OpGraph (op i is the file's node i in the format's order).
    cost_model: the machine the file implies, op times from the file attached as a
      profile, objective: the format's own ruler for its default objective.
    fmt, path: the format and file it came from.
    node_ids: int64[M], the file's id of op i.
    colocation: int32[M], colocation class of op i (-1: none); ops of one class run on
      one device under every method.
    rulers: objective name (``"latency"``, ``"throughput"``) -> the format's own
      ``Ruler`` for it.
    default_objective: the objective the format's instances are scored by.
    info: format details (device counts, memory caps, what was left out).
    """

    graph: Any
    cost_model: Any
    fmt: str
    path: str
    node_ids: np.ndarray
    colocation: np.ndarray
    rulers: Mapping[str, Any]
    default_objective: str = "latency"
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def by_node(self, placement) -> dict[int, int]:
        """``{file node id: device}`` of an int[M] placement in op order (to hand back)."""
        p = np.asarray(placement)
        return {int(n): int(d) for n, d in zip(self.node_ids.tolist(), p.tolist(), strict=True)}

    def from_nodes(self, devices_by_node) -> np.ndarray:
        """int32[M] in op order from ``{file node id: device}`` (every node given)."""
        missing = [int(n) for n in self.node_ids.tolist() if int(n) not in devices_by_node]
        if missing:
            raise ExternalFormatError(f"{self.path}: the placement gives no device for "
                                      f"node(s) {missing[:5]}{' ...' if len(missing) > 5 else ''}.")
        return np.array([devices_by_node[int(n)] for n in self.node_ids.tolist()], np.int32)

    def ruler(self, objective: str | None = None):
        """The format's own ruler for ``objective`` (default: ``default_objective``);
        ``ExternalFormatError`` when the format has none for it."""
        name = objective or self.default_objective
        if name not in self.rulers:
            raise ExternalFormatError(
                f"{self.fmt} instances have no own scorer for objective {name!r} (they "
                f"have: {', '.join(sorted(self.rulers))}); simplace's simulator scores "
                f"it instead (--ruler simplace).")
        return self.rulers[name]


def load_instance(path, fmt: str, *, devices: int | None = None) -> Instance:
    """Read ``path`` in format ``fmt`` (one of ``FORMATS``). ``devices``: the device
    count where the format leaves it open (Doppler: the file's 4 or 8 GPUs by default)."""
    if fmt not in FORMATS:
        raise ExternalFormatError(f"Unknown instance format {fmt!r}: use one of "
                                  f"{', '.join(FORMATS)}.")
    mod = importlib.import_module(f"simplace.external.{fmt}")
    return mod.load(path, devices=devices)

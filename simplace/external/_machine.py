"""The machine an imported instance implies: devices whose op times come from the file.

Both formats give each node a time per device kind and each cut edge a transfer time;
neither has host dispatch, segment launches or a roofline. The machine here is a
``CostModel`` with those costs at zero, the file's op times attached as a profile (so
that ``CostModel.price`` takes them, as for a measured model), and links of
``TRANSFER_BANDWIDTH_BYTES_PER_S`` with no latency: an edge whose file cost is ``c``
seconds carries ``c * TRANSFER_BANDWIDTH_BYTES_PER_S`` bytes, so simplace's simulator
charges exactly ``c`` per copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from simplace.cost_model import CostModel, Device, Provenance

# Bytes per second of an imported machine's links: edge bytes are file seconds times it.
TRANSFER_BANDWIDTH_BYTES_PER_S = 1e9
# The memory of a device the file sets no cap for (a device's memory must be finite).
NO_CAP_BYTES = 1e30


def imported_machine(name: str, graph, kinds: Sequence[str], memory_bytes: Sequence[float],
                     op_time_s: Mapping[str, np.ndarray], *,
                     notes: Sequence[str] = ()) -> CostModel:
    """A ``CostModel`` named ``name`` with one device per entry of ``kinds`` (``"cpu"``,
    ``"gpu"``) and ``memory_bytes`` (inf: no cap, ``NO_CAP_BYTES``), every op's time on
    a device of kind k being ``op_time_s[k][i]`` (float64[M]; a profile of ``graph`` attached), no
    launch, dispatch or put costs, links as the module says; ``notes`` (the file, what
    was left out) go into its provenance."""
    from simplace.profile import Chunk, Profile

    count: dict[str, int] = {}
    devices = []
    for kind, mem in zip(kinds, memory_bytes, strict=True):
        k = count.get(kind, 0)
        count[kind] = k + 1
        devices.append(Device(name=f"{kind}:{k}", kind=kind,
                              memory_bytes=min(float(mem), NO_CAP_BYTES),
                              peak_flops_per_s=1e12, memory_bandwidth_bytes_per_s=1e12))
    model = CostModel.from_devices(
        name, devices, 0.0, TRANSFER_BANDWIDTH_BYTES_PER_S,
        provenance=Provenance(source="imported", notes=tuple(notes)))
    m = graph.num_ops
    first = {kind: next(d.name for d in devices if d.kind == kind) for kind in op_time_s}
    profile = Profile(
        cost_model=name, graph_hash=graph.hash, graph_name=graph.name, num_ops=m,
        bounds=((0, m),),
        chunks={kind: (Chunk(0, m, measured_s=None, fixed_s=0.0),) for kind in op_time_s},
        op_time_s={kind: np.asarray(t, dtype=np.float64) for kind, t in op_time_s.items()},
        devices={kind: (first[kind], "") for kind in op_time_s})
    return model.with_profile(profile)

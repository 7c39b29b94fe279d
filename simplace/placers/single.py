"""``single``: every op on the fastest single device whose memory holds the model."""

from __future__ import annotations

import numpy as np

from simplace.placers import PlacerContext, PlacerOutput, register


def single_device_candidates(ctx: PlacerContext) -> list[int]:
    """Devices ordered by total op time, fastest first."""
    return [int(d) for d in np.argsort(ctx.op_times.sum(axis=0), kind="stable")]


@register("single")
def place(ctx: PlacerContext) -> PlacerOutput:
    m = ctx.graph.num_ops
    tried = []
    for d in single_device_candidates(ctx):
        p = np.full(m, d, dtype=np.int32)
        res = ctx.simulate(p)
        tried.append({"device": d,
                      "step_time_s": float(res.step_time_s), "oom": bool(res.oom)})
        if not res.oom:
            return PlacerOutput(p, history=tried, info={"device": d})
    # Nothing fits on one device: say so, and return the one with the most memory.
    d = int(np.argmax(ctx.inputs.memory_bytes))
    return PlacerOutput(np.full(m, d, dtype=np.int32), history=tried,
                        info={"device": d, "fits": False,
                              "note": "the model fits on no single device"})

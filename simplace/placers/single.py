"""``single``: every op on the fastest single device whose memory holds the model."""

from __future__ import annotations

import numpy as np

from simplace.placers import Cost, PlacerContext, PlacerOutput, register


def single_device_step_s(ctx: PlacerContext) -> np.ndarray:
    """float64[D]: the step time of the whole graph on each device alone: one segment,
    so its dispatch, its launch (and the pool's, if the graph's pool work reaches the
    minimum), every op's fused cost, and the unfused cost of the ops with no inputs
    (nothing to fuse into); no transfer."""
    inp = ctx.inputs
    if inp.num_ops == 0:
        return np.zeros(inp.num_devices)
    no_inputs = np.diff(ctx.graph.in_edges[0]) == 0
    pool = np.where(inp.op_pool_work.sum(axis=0) >= inp.pool_min_work, inp.pool_launch_s, 0.0)
    return (inp.dispatch_s + inp.launch_s + pool
            + inp.op_time_s.sum(axis=0) + inp.op_unfused_s[no_inputs].sum(axis=0))


def single_device_candidates(ctx: PlacerContext) -> list[int]:
    """Devices ordered by the step time of the whole graph on each alone, fastest first
    (ties: the lower index)."""
    return [int(d) for d in np.argsort(single_device_step_s(ctx), kind="stable")]


def single_device_trials(ctx: PlacerContext) -> list[dict]:
    """``{"device", "step_time_s", "oom"}`` of every op on one device, for the devices in
    ``single_device_candidates``' order up to the first that holds the model (all of them
    if none does)."""
    devices = single_device_candidates(ctx)
    tried = []
    for d, (t, oom) in zip(devices, _single_device_results(ctx, devices), strict=True):
        tried.append({"device": d, "step_time_s": float(t), "oom": bool(oom)})
        if not oom:
            break
    return tried


def _single_device_results(ctx: PlacerContext, devices: list[int]):
    """(step time, OOM) of every op on each of ``devices``, in order, lazily
    (``PlacerContext.simulate_each``: one call of the batched simulator where that pays,
    else the reference simulator's, which stop at the first device that fits)."""
    m = ctx.graph.num_ops
    yield from ctx.simulate_each(np.repeat(np.asarray(devices, np.int32)[:, None], m, 1))


def faster_single(ctx: PlacerContext, score: float) -> tuple[int, float] | None:
    """``(device, step time)`` of the fastest single device that holds the model, when
    it beats ``score`` (a penalised step time: OOM placements are ``OOM_PENALTY``
    behind); None otherwise. Only the devices that could beat ``score`` alone are
    simulated (for their memory), fastest first, up to the first that fits: what a
    method's result is checked against, so that no method loses to ``single``."""
    alone = single_device_step_s(ctx)
    devices = [d for d in single_device_candidates(ctx) if alone[d] < score]
    for d, (t1, oom1) in zip(devices, _single_device_results(ctx, devices), strict=False):
        if oom1:
            continue  # single skips it as well
        return (d, float(t1)) if t1 < score else None
    return None


@register("single", cost=Cost(0.0, 1e-5, paces=True), rank=0)
def place(ctx: PlacerContext) -> PlacerOutput:
    """Every op on the fastest device that holds the model; if none does, on the device with the
    most memory (``info['fits']`` False)."""
    m = ctx.graph.num_ops
    tried = single_device_trials(ctx)
    if tried and not tried[-1]["oom"]:
        d = tried[-1]["device"]
        return PlacerOutput(np.full(m, d, dtype=np.int32), history=tried, info={"device": d})
    # Nothing fits on one device: say so, and return the one with the most memory.
    d = int(np.argmax(ctx.inputs.memory_bytes))
    return PlacerOutput(np.full(m, d, dtype=np.int32), history=tried,
                        info={"device": d, "fits": False,
                              "note": "the model fits on no single device"})

"""``exact``: brute force over every placement, for tiny graphs (the placers' test oracle).

Enumerates all ``D**M`` placements (or ``D**G`` placements of the groups of a grouping
given as option ``groups=``) in a fixed order and scores them with the batched
simulator, a fixed batch size at a time. Enumeration order: placement number ``k`` puts
op (or group) ``i`` on digit ``i`` of ``k`` written in base ``D``, the first op being the
most significant digit, so ``k = 0`` is everything on device 0 and the last op changes
fastest. Of the placements with the lowest score the one with the lowest ``k`` wins.
Placements that run out of memory lose to every placement that fits (``ctx.score``).

Options:
  groups: int[M] group id per op (optional); ops of a group share a device.
  max_placements: refuse (``SimplaceError``) when the space is larger (default 2**20).
  batch: placements per simulator call (default 1024; smaller for small spaces).
"""

from __future__ import annotations

import math
import time

import numpy as np

from simplace._argtypes import MAX_BATCH
from simplace.errors import SimplaceError
from simplace.groups import check_groups, expand, normalize
from simplace.placers import OOM_PENALTY, PlacerContext, PlacerOutput, register
from simplace.placers.registry import Option, int_option, option_values

DEFAULT_MAX_PLACEMENTS = 2**20


def _space(ctx: PlacerContext):
    """(grouping int32[M] or None, number of placed units, D)."""
    groups = ctx.options.get("groups")
    d = int(ctx.cost_model.num_devices)
    if groups is None:
        return None, int(ctx.graph.num_ops), d
    groups = normalize(check_groups(ctx.graph, groups))
    return groups, (int(groups.max()) + 1 if groups.size else 0), d


def placements_of(indices, num_units: int, num_devices: int) -> np.ndarray:
    """int32[len(indices), num_units]: the placements with these enumeration numbers."""
    idx = np.asarray(indices, dtype=np.int64)
    powers = num_devices ** np.arange(num_units - 1, -1, -1, dtype=np.int64)
    return ((idx[:, None] // powers[None, :]) % num_devices).astype(np.int32)


def _count_text(d: int, n: int) -> str:
    """``d ** n`` as text: every digit up to ten of them, then as a float, then as a power
    of ten (a float cannot hold 5 ** 22000)."""
    total = d ** n
    if total < 10**10:
        return str(total)
    if n * math.log10(d) < 300:
        return f"{float(total):.4g}"
    return f"about 10^{n * math.log10(d):.0f}"


@register("exact", kind="exhaustive", options={
    # Checked against the graph (simplace.groups.check_groups), which the option lacks.
    "groups": Option("int[M] group id per op; ops of a group share a device"),
    "max_placements": int_option("refuse a larger space (default 2**20)",
                                 DEFAULT_MAX_PLACEMENTS, 1),
    "batch": int_option("placements per simulator call (default 1024)", 1024, 1, MAX_BATCH)})
def place(ctx: PlacerContext) -> PlacerOutput:
    """The best placement of all ``D**M`` (or ``D**G`` with ``groups``), found by enumeration; see
    the module docstring."""
    groups, n, d = _space(ctx)
    opts = option_values("exact", ctx.options)
    limit = opts["max_placements"]
    total = d ** n  # a Python int: exact however large
    what = "groups" if groups is not None else "ops"
    if total > limit:
        raise SimplaceError(
            f"exact: {d} devices ** {n} {what} = {_count_text(d, n)} placements, more than "
            f"max_placements={limit}. Brute force is for tiny graphs: group the ops "
            "(groups=...), raise max_placements, or use a search method such as 'local'.")
    batch = min(opts["batch"], total)
    t0 = time.perf_counter()
    best_k, best_score = 0, np.inf
    history = []
    last_progress = t0
    for start in range(0, total, batch):
        k = np.arange(start, start + batch, dtype=np.int64)
        k = np.minimum(k, total - 1)  # pad the last batch (same size: no recompile)
        units = placements_of(k, n, d)
        p = units if groups is None else units[:, groups]
        scores = ctx.score(p)
        j = int(np.argmin(scores))  # first of the lowest: lowest enumeration number
        if scores[j] < best_score:
            best_k, best_score = int(k[j]), float(scores[j])
        done = min(start + batch, total)
        now = time.perf_counter()
        if now - last_progress > 2.0:
            last_progress = now
            ctx.progress(f"exact: {done}/{total} placements, best {best_score:.6g} s")
        history.append({"wall_s": now - t0, "evaluations": done,
                        "best_step_time_s": best_score})
    units = placements_of([best_k], n, d)[0]
    placement = units if groups is None else expand(groups, units)
    info = {"placements": total, "best_index": best_k, "score": best_score,
            "fits": bool(best_score < OOM_PENALTY)}
    if groups is not None:
        info["num_groups"] = n
    return PlacerOutput(placement.astype(np.int32), history=history, info=info)

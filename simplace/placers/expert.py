"""``expert``: the placements people write by hand, read off the ops' module paths.

* **LSTM models** (a module path ``.../layer_<l>/recurrent`` marks an LSTM layer; NMT and
  RNNLM in the zoo): one LSTM layer per GPU, as GNMT (Wu et al. 2016) and the seed
  papers' NMT expert: encoder layer l and decoder layer l on GPU ``l mod #GPUs``;
  attention and softmax on the next GPU after the last layer (``L mod #GPUs``);
  embeddings on the first GPU. The background notes record no CPU placement for the
  embeddings, so the first GPU is the default; ``embed="cpu"`` puts them on the first
  CPU instead. Backward ops go with the forward ops of their module path. Ops of no
  recognised module (glue: residual adds, concatenations, loss sums) join the producer
  that sends them the most bytes; ops with no producer join their earliest consumer.
* **Everything else** (CNNs, transformers, MLPs): the whole model on the fastest device
  that holds it (``single``'s choice; on a small graph that can be the CPU). When no
  device does, a layer-balanced split across the GPUs: modules (forward and backward ops
  of a module path together) in the order their forward ops run, cut into #GPUs
  contiguous ranges of balanced compute or of balanced memory, whichever simulates
  faster.

GPUs are the devices of kind ``gpu`` (all devices when there is none). A placement that
runs out of memory is repaired by moving module groups off the overfull device, or
reported in ``info["note_memory"]``. Deterministic: no random choice is made.
"""

from __future__ import annotations

import re

import numpy as np

from simplace.graph import split_name_path
from simplace.placers import PlacerContext, PlacerOutput, register
from simplace.placers.memory_repair import repair_memory
from simplace.placers.partitioners import (
    device_kinds,
    device_names,
    evaluate,
    gpu_devices,
)
from simplace.placers.registry import Cost, choice_option, option_values
from simplace.placers.single import single_device_trials

_LAYER = re.compile(r"^layer_(\d+)$")


def _forward_parts(graph) -> list[tuple[str, ...]]:
    return [split_name_path(p)[1] for p in graph.name_path.tolist()]


def is_lstm_model(graph) -> bool:
    """True when some module path has an LSTM layer (``layer_<l>/recurrent``)."""
    for parts in set(_forward_parts(graph)):
        for a, b in zip(parts, parts[1:], strict=False):
            if _LAYER.match(a) and b == "recurrent":
                return True
    return False


def lstm_roles(graph) -> list[tuple[str, int] | None]:
    """Per op: ``("layer", l)``, ``("attention", 0)``, ``("softmax", 0)``,
    ``("embed", 0)`` or None (no recognised module), from its forward module path."""
    cache: dict[tuple[str, ...], tuple[str, int] | None] = {}
    out = []
    for parts in _forward_parts(graph):
        if parts not in cache:
            role = None
            for c in parts:
                m = _LAYER.match(c)
                if m:
                    role = ("layer", int(m.group(1)))
                    break
            if role is None:
                for name in ("attention", "softmax", "embed"):
                    if name in parts:
                        role = (name, 0)
                        break
            cache[parts] = role
        out.append(cache[parts])
    return out


def follow_neighbours(graph, placement: np.ndarray) -> np.ndarray:
    """Fill ``-1`` entries: an op joins the placed producer that sends it the most bytes
    (the earliest on ties); an op with no placed producer joins its earliest placed
    consumer; what is left (isolated ops) goes where op 0's neighbours went, device 0
    if nothing is placed."""
    p = np.asarray(placement, dtype=np.int64).copy()
    in_ptr, in_order = graph.in_edges
    out_ptr, out_order = graph.out_edges
    m = graph.num_ops

    def forward_pass():
        for i in range(m):
            if p[i] >= 0:
                continue
            edges = in_order[in_ptr[i]:in_ptr[i + 1]]
            best, best_bytes = -1, -1.0
            for e in edges.tolist():
                s = int(graph.src[e])
                if p[s] >= 0 and graph.edge_bytes[e] > best_bytes:
                    best, best_bytes = s, float(graph.edge_bytes[e])
            if best >= 0:
                p[i] = p[best]

    def backward_pass():
        for i in range(m - 1, -1, -1):
            if p[i] >= 0:
                continue
            consumers = graph.dst[out_order[out_ptr[i]:out_ptr[i + 1]]]
            placed = consumers[p[consumers] >= 0] if consumers.size else consumers
            if placed.size:
                p[i] = p[int(placed.min())]

    for _ in range(3):  # each pass can unblock the other; three covers chains of both
        forward_pass()
        backward_pass()
        if (p >= 0).all():
            break
    fallback = int(p[p >= 0][0]) if (p >= 0).any() else 0
    p[p < 0] = fallback
    return p.astype(np.int32)


def lstm_placement(ctx: PlacerContext, *, embed: str = "gpu") -> tuple[np.ndarray, dict]:
    """(int[M] placement, info) of an LSTM model: one layer per GPU, attention and softmax after the
    last, embeddings on ``embed`` (``gpu`` or ``cpu``); no memory repair."""
    g, cm = ctx.graph, ctx.cost_model
    names = device_names(cm)
    gpus = gpu_devices(cm)
    roles = lstm_roles(g)
    layers = [r[1] for r in roles if r is not None and r[0] == "layer"]
    num_layers = max(layers) + 1 if layers else 0
    if embed == "cpu":
        cpus = [d for d, kind in enumerate(device_kinds(cm)) if kind == "cpu"]
        embed_device = cpus[0] if cpus else gpus[0]
    elif embed == "gpu":
        embed_device = gpus[0]
    else:
        raise ValueError(f"expert: embed must be 'gpu' or 'cpu', got {embed!r}.")
    head_device = gpus[num_layers % len(gpus)]
    device_of = {"attention": head_device, "softmax": head_device, "embed": embed_device}
    p = np.full(g.num_ops, -1, dtype=np.int64)
    for i, r in enumerate(roles):
        if r is None:
            continue
        p[i] = gpus[r[1] % len(gpus)] if r[0] == "layer" else device_of[r[0]]
    p = follow_neighbours(g, p)
    info = {"rule": "lstm_layer_per_gpu", "num_layers": num_layers,
            "layer_devices": [names[gpus[k % len(gpus)]] for k in range(num_layers)],
            "head_device": names[head_device],
            "embed_device": names[embed_device]}
    return p, info


def module_groups(graph, num_parts: int) -> tuple[np.ndarray, int]:
    """Group ops by module path (backward ops with their forward module) cut at the
    smallest depth that gives at least ``4 * num_parts`` modules; ops with an empty path
    get -1. Returns (group per op, depth)."""
    parts = _forward_parts(graph)
    max_depth = max((len(x) for x in parts), default=0)
    depth = max_depth
    for d in range(1, max_depth + 1):
        if len({x[:d] for x in parts if x}) >= 4 * num_parts:
            depth = d
            break
    index: dict[tuple[str, ...], int] = {}
    groups = np.array([index.setdefault(x[:depth], len(index)) if x else -1 for x in parts],
                      dtype=np.int64)
    return groups, depth


def layer_split(ctx: PlacerContext, devices: list[int], weights: np.ndarray) -> np.ndarray:
    """Contiguous module ranges of balanced ``weights`` (float[M]) over ``devices``."""
    g = ctx.graph
    groups, _ = module_groups(g, len(devices))
    n = int(groups.max()) + 1 if (groups >= 0).any() else 0
    if n == 0:
        return np.full(g.num_ops, devices[0], dtype=np.int32)
    backward = np.array([split_name_path(x)[0] for x in g.name_path.tolist()])
    idx = np.arange(g.num_ops)
    # A module's place in the sequence: its first forward op (backward-only modules
    # after every forward op, in their own order).
    key = np.where(backward, g.num_ops + idx, idx)
    first = np.full(n, np.iinfo(np.int64).max)
    ok = groups >= 0
    np.minimum.at(first, groups[ok], key[ok])
    order = np.argsort(first, kind="stable")
    w = np.bincount(groups[ok], weights=weights[ok], minlength=n)[order]
    cum = np.cumsum(w)
    total = cum[-1] if cum[-1] > 0 else 1.0
    # Range r takes the modules whose cumulative weight midpoint falls in its share.
    mid = (cum - w / 2) / total
    rng = np.minimum((mid * len(devices)).astype(np.int64), len(devices) - 1)
    dev_of_group = np.empty(n, dtype=np.int64)
    dev_of_group[order] = np.asarray(devices)[rng]
    p = np.where(ok, dev_of_group[np.maximum(groups, 0)], -1)
    return follow_neighbours(g, p)


def _dense_or_none(groups: np.ndarray) -> np.ndarray:
    """Module groups with each unnamed op as its own group (for ``repair_memory``)."""
    out = groups.copy()
    missing = np.flatnonzero(out < 0)
    out[missing] = (out.max() + 1 if out.size else 0) + np.arange(missing.size)
    return out


@register("expert", cost=Cost(0.0, 5e-6, paces=True), rank=1, options={"embed": choice_option(
    "LSTM models: the embedding's device, 'gpu' or 'cpu'", "gpu", ("gpu", "cpu"))})
def place(ctx: PlacerContext) -> PlacerOutput:
    """The hand-written placement for the model (see the module docstring)."""
    g, cm = ctx.graph, ctx.cost_model
    names = device_names(cm)
    m = g.num_ops
    gpus = gpu_devices(cm)
    history: list[dict] = []
    if m == 0:
        return PlacerOutput(np.zeros(0, dtype=np.int32), info={"rule": "empty"})

    if is_lstm_model(g):
        p, info = lstm_placement(ctx, embed=option_values("expert", ctx.options)["embed"])
        groups, _ = module_groups(g, len(gpus))
        p, rep = repair_memory(ctx, p, _dense_or_none(groups))
        if rep.get("repair_rounds"):
            info["repair_rounds"] = rep["repair_rounds"]
            info["note_memory"] = ("the layer-per-GPU placement ran out of memory; module "
                                   "groups were moved off the overfull device"
                                   + ("" if not rep["oom"] else ", and it still does not fit"))
        return PlacerOutput(p, history=history, info=info)

    # The fastest device that holds the whole model (``single``'s choice).
    for t in single_device_trials(ctx):
        d = t["device"]
        history.append({"candidate": f"single {names[d]}",
                        "step_time_s": t["step_time_s"], "oom": t["oom"]})
        if not t["oom"]:
            return PlacerOutput(np.full(m, d, dtype=np.int32), history=history,
                                info={"rule": "single_device", "device": names[d]})

    # No device holds it: a layer-balanced split across the GPUs.
    if len(gpus) > 1:
        ref = min(gpus, key=lambda d: (ctx.op_times[:, d].sum(), d))
        by_compute = layer_split(ctx, gpus, ctx.op_times[:, ref])
        by_memory = layer_split(ctx, gpus, g.param_bytes + g.out_bytes)
        cands = {"compute": by_compute, "memory": by_memory}
        scores = evaluate(ctx, list(cands.values()))
        for (name, _), s in zip(cands.items(), scores, strict=True):
            history.append({"candidate": f"layer split balanced by {name}",
                            "step_time_s": float(s)})
        name, p = list(cands.items())[int(np.argmin(scores))]
        groups, depth = module_groups(g, len(gpus))
        p, rep = repair_memory(ctx, p, _dense_or_none(groups))
        if not rep["oom"]:
            info = {"rule": "layer_split", "balanced_by": name, "module_depth": depth,
                    "devices": [names[d] for d in gpus]}
            if rep.get("repair_rounds"):
                info["repair_rounds"] = rep["repair_rounds"]
            return PlacerOutput(p, history=history, info=info)
        history.append({"candidate": "layer split after repair", "oom": True})

    # Nothing fits: say so, and return the split (or the largest memory) anyway.
    if len(gpus) > 1:
        return PlacerOutput(p, history=history,
                            info={"rule": "layer_split", "balanced_by": name,
                                  "module_depth": depth,
                                  "note": "the model fits on no single device and the "
                                          "layer split across the GPUs runs out of memory"})
    d = int(np.argmax(cm.memory_bytes))
    return PlacerOutput(np.full(m, d, dtype=np.int32), history=history,
                        info={"rule": "single_device", "device": names[d],
                              "note": "the model fits on no single device"})

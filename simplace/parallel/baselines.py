"""Baseline strategies PaSE is compared with: data parallelism and expert strategies.

* ``data_parallel``: every layer splits its batch dimension over as many of the p
  devices as the batch allows (the largest divisor of p not above the batch), nothing
  else; layers without a batch dimension are replicated.
* ``expert``, by model family (read off the layer kinds):
  - CNNs (a ``conv`` layer): Krizhevsky's "one weird trick": convolutions, pools and
    the elementwise layers before the first fully-connected layer data-parallel; the
    fully-connected layers model-parallel (output features split over p devices), and
    the elementwise layers after them split along the features the same way.
  - Transformers (an ``attention`` layer): Megatron-LM tensor parallelism of degree
    t = the largest divisor of p not above the number of heads, data parallelism of
    degree p / t: attention split by heads; query/key/value and the first MLP matmul
    split by output features (columns); the attention output and the second MLP matmul
    by input features (rows, followed by an all-reduce); embedding and tied output
    projection split by vocabulary; the MLP activation split by features as its
    matmuls; norms and residual adds data-parallel.
  - LSTM models (an ``lstm`` layer): data-parallel LSTM layers and embedding; the softmax
    projection split by vocabulary (its weight is the largest).
  - Anything else: data parallelism.
"""

from __future__ import annotations

import numpy as np

from simplace.parallel.configs import divisors
from simplace.parallel.layers import Layer, LayerGraph

__all__ = ["data_parallel_configs", "expert_configs", "family"]


def _largest_divisor(p: int, limit: int) -> int:
    return max(d for d in divisors(p) if d <= max(1, limit))


def _fit(layer: Layer, p: int, wanted: dict[str, int]) -> np.ndarray:
    """A configuration as close to ``wanted`` (dim name -> factor) as the layer's sizes
    and p allow; dims are filled in the given order."""
    cfg = np.ones(len(layer.dim_sizes), dtype=np.int64)
    used = 1
    for name, f in wanted.items():
        d = layer.dim(name)
        if d < 0 or not layer.splittable[d] or f <= 1:
            continue
        rest = p // used
        g = max(x for x in divisors(rest) if x <= min(f, layer.dim_sizes[d]))
        cfg[d] = g
        used *= g
    return cfg


def family(lg: LayerGraph) -> str:
    """``cnn``, ``transformer``, ``rnn`` or ``other``, from the layer kinds."""
    kinds = {lay.kind for lay in lg.layers}
    if "attention" in kinds:
        return "transformer"
    if "conv" in kinds:
        return "cnn"
    if "lstm" in kinds:
        return "rnn"
    return "other"


def _batch_name(layer: Layer) -> str:
    return layer.dim_names[layer.batch_dim] if layer.batch_dim >= 0 else "b"


def data_parallel_configs(lg: LayerGraph, p: int) -> list[np.ndarray]:
    """One configuration per layer: the batch split over as many devices as it allows."""
    return [_fit(lay, p, {_batch_name(lay): p}) for lay in lg.layers]


def expert_configs(lg: LayerGraph, p: int) -> list[np.ndarray]:
    """One configuration per layer: the expert strategy of the model's family."""
    fam = family(lg)
    out = []
    if fam == "cnn":
        seen_fc = False
        feat = 1
        for lay in lg.layers:
            if lay.kind == "matmul":
                seen_fc = True
                cfg = _fit(lay, p, {"n": p, _batch_name(lay): p})
                feat = int(cfg[lay.dim("n")]) if lay.dim("n") >= 0 else 1
            elif seen_fc and lay.kind == "elementwise" and lay.dim_names:
                cfg = _fit(lay, p, {lay.dim_names[-1]: feat, _batch_name(lay): p})
            else:
                cfg = _fit(lay, p, {_batch_name(lay): p})
            out.append(cfg)
        return out
    if fam == "transformer":
        heads = next(lay.dim_sizes[lay.dim("h")] for lay in lg.layers
                     if lay.kind == "attention")
        t = _largest_divisor(p, heads)
        d = p // t
        for lay in lg.layers:
            last = lay.name.rsplit("/", 1)[-1]
            b = _batch_name(lay)
            if lay.kind == "attention":
                cfg = _fit(lay, p, {"h": t, b: d})
            elif lay.kind == "matmul" and last in ("query", "key", "value", "intermediate"):
                cfg = _fit(lay, p, {"n": t, b: d})
            elif lay.kind == "matmul" and last in ("out", "output"):
                cfg = _fit(lay, p, {"k": t, b: d})
            elif lay.kind == "matmul":  # the tied output projection: vocabulary split
                cfg = _fit(lay, p, {"n": t, b: d})
            elif lay.kind == "embedding":
                cfg = _fit(lay, p, {"v": t, b: d})
            elif lay.kind == "elementwise" and last.split("#")[0] == "ffn" and lay.dim_names:
                # the MLP activation between the column- and row-split matmuls stays split
                cfg = _fit(lay, p, {lay.dim_names[-1]: t, b: d})
            else:
                cfg = _fit(lay, p, {b: d})
            out.append(cfg)
        return out
    if fam == "rnn":
        for lay in lg.layers:
            if lay.kind == "matmul":
                cfg = _fit(lay, p, {"n": p, _batch_name(lay): p})
            else:
                cfg = _fit(lay, p, {_batch_name(lay): p})
            out.append(cfg)
        return out
    return data_parallel_configs(lg, p)

"""Op classes: the cost class of each JAX primitive and per-graph class arrays.

Part of ``simplace.cost_model`` (which re-exports these names): the classes a device's
efficiency and in-segment overheads are given per, the default efficiencies, and the
cached per-graph arrays ``CostModel.op_times`` prices from.
"""

from __future__ import annotations

import contextlib
import functools
import types
import weakref

import numpy as np

OP_CLASSES = ("matmul", "conv", "elementwise", "reduction", "data_movement", "control", "free")
# Classes whose ops do work and so carry their own efficiency. ``free`` ops that do work
# anyway (a convert_element_type that copies) are charged like data_movement.
WORK_CLASSES = OP_CLASSES[:-1]
_CLASS_INDEX = {c: k for k, c in enumerate(OP_CLASSES)}
_FREE = _CLASS_INDEX["free"]
_DATA_MOVEMENT = _CLASS_INDEX["data_movement"]

# Fraction of the roofline a device reaches per op class when a model does not say.
# Typical of vendor-library kernels (cuBLAS/MKL GEMM ~70%, convolutions lower, streaming
# kernels ~60% of peak memory bandwidth); datasheet models set their own, calibration fits them.
DEFAULT_EFFICIENCY = types.MappingProxyType({
    "matmul": 0.7,
    "conv": 0.6,
    "elementwise": 0.6,
    "reduction": 0.5,
    "data_movement": 0.5,
    "control": 0.3,
})

# --------------------------------------------------------------------------- op classes
_MATMUL_OPS = frozenset({
    "dot_general", "ragged_dot", "ragged_dot_general",
    # dense linear algebra runs as BLAS-3-like kernels
    "triangular_solve", "cholesky", "lu", "qr", "householder_product", "eigh", "eig", "svd",
    "schur", "hessenberg", "tridiagonal", "tridiagonal_solve",
})
_CONV_OPS = frozenset({"conv_general_dilated", "fft"})
_REDUCTION_OPS = frozenset({
    "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp",
    "reduce", "reduce_window", "top_k", "psum", "pmax", "pmin",
})
_DATA_MOVEMENT_OPS = frozenset({
    "transpose", "concatenate", "gather", "scatter", "pad", "slice", "dynamic_slice",
    "dynamic_update_slice", "rev", "sort", "split", "tile", "roll", "stack", "unstack",
    "select_and_scatter",
    "select_and_scatter_add", "select_and_gather_add", "device_put", "all_gather",
    "all_to_all", "ppermute", "reduce_scatter", "psum_scatter",
})
_CONTROL_OPS = frozenset({
    "scan", "while", "cond", "pjit", "jit", "closed_call", "core_call", "remat", "checkpoint",
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin",
    "custom_linear_solve", "linear_solve", "shard_map", "xla_call", "xla_pmap",
})
# Ops that do no work: XLA turns them into views or fuses them into their consumers.
_FREE_OPS = frozenset({
    "reshape", "squeeze", "expand_dims", "broadcast_in_dim", "broadcast_to", "zeros_like",
    "convert_element_type", "bitcast_convert_type", "iota", "copy", "copy_p",
    # annotations and key wrappers: the tracer gives them no flops and no bytes
    "stop_gradient", "optimization_barrier", "random_wrap", "random_unwrap",
    "sharding_constraint", "name", "pvary", "layout_constraint", "reshard", "mesh_cast",
    "empty", "empty2", "create_token", "after_all",
})


@functools.lru_cache(maxsize=4096)
def op_class(primitive: str) -> str:
    """The cost class (one of ``OP_CLASSES``) of a JAX primitive name; unknown ones are
    ``elementwise``."""
    p = str(primitive)
    if p in _FREE_OPS:
        return "free"
    if p in _MATMUL_OPS:
        return "matmul"
    if p in _CONV_OPS:
        return "conv"
    if p in _DATA_MOVEMENT_OPS or p.startswith("scatter"):  # scatter-add, scatter_mul...
        return "data_movement"
    if p in _CONTROL_OPS:
        return "control"
    if p in _REDUCTION_OPS or p.startswith("reduce_window") or (
            p.startswith("reduce_") and p != "reduce_precision"):  # reduce_precision rounds
        return "reduction"
    return "elementwise"


# Per-graph derived arrays (class index per op, signatures as a list): computing them is
# most of op_times' cost on big graphs, and a graph is immutable, so they are cached.
_GRAPH_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _graph_arrays(graph) -> tuple[np.ndarray, list[str]]:
    try:
        return _GRAPH_CACHE[graph]
    except (KeyError, TypeError):
        pass
    ops = graph.op.tolist()
    classes = {p: _CLASS_INDEX[op_class(p)] for p in set(ops)}
    cls = np.fromiter((classes[p] for p in ops), dtype=np.int8, count=len(ops))
    out = (cls, graph.signature.tolist())
    with contextlib.suppress(TypeError):  # not weak-referenceable: just do not cache
        _GRAPH_CACHE[graph] = out
    return out


def call_arguments(graph) -> np.ndarray:
    """float64[M]: the call arguments charged to each op: for each parameter it reads,
    1 / (number of ops reading it), plus 1 if it returns an output of the graph."""
    m = graph.num_ops
    out = graph.is_output.astype(np.float64)
    if len(graph.param_op):
        readers = np.bincount(graph.param_index, minlength=len(graph.param_sizes))
        out = out + np.bincount(graph.param_op, weights=1.0 / readers[graph.param_index],
                                minlength=m)
    return out


def op_classes(graph) -> np.ndarray:
    """int8[M]: index into ``OP_CLASSES`` of each op of ``graph``."""
    return _graph_arrays(graph)[0].copy()

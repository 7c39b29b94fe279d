"""FLOP rules for JAX primitives, used by ``simplace.trace``.

Conventions (kept deliberately simple; a cost model calibrates real op times by
signature, so these numbers only have to rank ops sensibly and drive roofline guesses):

- ``dot_general``: 2 x output elements x contracted size (= 2 x batch x M x N x K).
- ``conv_general_dilated``: 2 x output elements x kernel input features x kernel
  spatial size. Strides, padding and lhs/rhs dilation act through the output shape;
  ``feature_group_count`` and ``batch_group_count`` through the kernel's input-feature
  dimension (already divided by the group count) and the output shape.
- Elementwise ops, transcendentals included: one FLOP per output element.
- Reductions and cumulative ops: one FLOP per input element.
- Windowed reductions (pooling) and their gradients: window positions x window size.
- Ops that only move or re-describe data: 0 FLOPs. Pure views (reshape, squeeze,
  bitcast...) also access no bytes; see ``VIEW_PRIMITIVES``.
- Anything else is *unknown*: ``flops`` returns None and the tracer applies a generic
  cost (one FLOP per output element) and warns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

# No work and no memory traffic: a new description of the same buffer, or an annotation.
VIEW_PRIMITIVES = frozenset({
    "reshape", "squeeze", "expand_dims", "bitcast_convert_type", "random_wrap",
    "random_unwrap", "stop_gradient", "optimization_barrier", "sharding_constraint",
    "name", "pvary", "layout_constraint", "reshard", "mesh_cast", "empty", "empty2",
    "create_token", "after_all",
})

# No arithmetic, but the data is read and written (copies, layout changes, indexing).
MOVE_PRIMITIVES = frozenset({
    "broadcast_in_dim", "convert_element_type", "copy", "copy_p", "device_put",
    "transpose", "iota", "slice", "dynamic_slice", "dynamic_update_slice", "concatenate",
    "pad", "gather", "scatter", "rev", "split", "tile", "roll", "stack", "unstack",
    "zeros_like", "broadcast_to",
})

ELEMENTWISE_PRIMITIVES = frozenset({
    # arithmetic
    "add", "sub", "mul", "div", "rem", "pow", "integer_pow", "max", "min", "neg", "sign",
    "abs", "floor", "ceil", "round", "add_any", "square", "reciprocal", "clamp",
    "nextafter", "mulhi", "conj", "real", "imag", "complex", "reduce_precision",
    "stochastic_round", "_copysign", "copysign",
    # transcendentals and special functions (one FLOP each: keep it simple)
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan",
    "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "sqrt",
    "rsqrt", "cbrt", "erf", "erfc", "erf_inv", "lgamma", "digamma", "polygamma", "zeta",
    "igamma", "igammac", "igamma_grad_a", "random_gamma_grad", "bessel_i0e", "bessel_i1e",
    "regularized_incomplete_beta", "is_finite",
    # logic, comparison, selection, bit twiddling
    "and", "or", "xor", "not", "eq", "ne", "lt", "le", "gt", "ge", "eq_to", "lt_to",
    "le_to", "select_n", "shift_left", "shift_right_logical", "shift_right_arithmetic",
    "population_count", "clz",
    # random numbers (per output element; threefry really does ~20 integer ops each)
    "threefry2x32", "random_bits", "random_seed", "random_split", "random_fold_in",
    "random_clone", "rng_bit_generator", "rng_uniform", "random_gamma",
})

REDUCTION_PRIMITIVES = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
    "reduce_xor", "argmax", "argmin", "reduce", "cumsum", "cumprod", "cummax", "cummin",
    "cumlogsumexp", "top_k", "approx_top_k",
})


def num_elements(aval: Any) -> int:
    """Number of elements of an abstract value (0 for tokens and other non-arrays)."""
    shape = getattr(aval, "shape", None)
    return math.prod(shape) if shape is not None else 0


def _dot_general(params, ins, outs) -> float:
    (lhs_contract, _), _ = params["dimension_numbers"]
    k = math.prod(ins[0].shape[d] for d in lhs_contract)
    return 2.0 * num_elements(outs[0]) * k


def _conv(params, ins, outs) -> float:
    rhs = ins[1]
    dn = params["dimension_numbers"]
    if dn is None:  # lax default: rhs is OIHW...
        in_feature_dim, spatial = 1, range(2, len(rhs.shape))
    else:
        in_feature_dim, spatial = dn.rhs_spec[1], dn.rhs_spec[2:]
    # The kernel's input-feature dim is already C_in / feature_group_count; with
    # batch_group_count the output holds N / groups batch rows, so out elements carry it.
    window = math.prod(rhs.shape[d] for d in spatial)
    return 2.0 * num_elements(outs[0]) * rhs.shape[in_feature_dim] * window


def _window(params) -> int:
    return math.prod(params["window_dimensions"])


def _reduce_window(params, ins, outs) -> float:
    return float(num_elements(outs[0]) * _window(params))


def _select_and_scatter_add(params, ins, outs) -> float:
    # operands (source, operand): one window per source element
    return float(num_elements(ins[0]) * _window(params))


def _select_and_scatter(params, ins, outs) -> float:
    # operands (operand, source, init_value)
    return float(num_elements(ins[1]) * _window(params))


def _select_and_gather_add(params, ins, outs) -> float:
    return float(num_elements(outs[0]) * _window(params))


def _reduction(params, ins, outs) -> float:
    return float(sum(num_elements(a) for a in ins))


def _elementwise(params, ins, outs) -> float:
    return float(sum(num_elements(a) for a in outs))


def _zero(params, ins, outs) -> float:
    return 0.0


def _scatter_combine(params, ins, outs) -> float:
    # scatter-add & co: one combine per update element (operands: operand, indices, updates)
    return float(num_elements(ins[2])) if len(ins) > 2 else 0.0


def _sort(params, ins, outs) -> float:
    shape = ins[0].shape
    n = shape[params.get("dimension", len(shape) - 1)] if shape else 1
    return float(num_elements(ins[0]) * max(1.0, math.log2(max(n, 1))))


def _fft(params, ins, outs) -> float:
    n = math.prod(params["fft_lengths"])
    return 5.0 * num_elements(ins[0]) * max(1.0, math.log2(max(n, 1)))


def _cholesky(params, ins, outs) -> float:
    shape = ins[0].shape
    n = shape[-1]
    return math.prod(shape[:-2]) * n ** 3 / 3.0


def _triangular_solve(params, ins, outs) -> float:
    a, b = ins[0].shape, ins[1].shape
    m = a[-1]
    return float(math.prod(b) * m)  # batch x m x m x n (b is [..., m, n] or [..., n, m])


def _lu(params, ins, outs) -> float:
    shape = ins[0].shape
    n = min(shape[-2:])
    return math.prod(shape[:-2]) * 2.0 * n ** 3 / 3.0


Rule = Callable[[dict, Sequence[Any], Sequence[Any]], float]

_RULES: dict[str, Rule] = {
    "dot_general": _dot_general,
    "conv_general_dilated": _conv,
    "reduce_window_sum": _reduce_window,
    "reduce_window_max": _reduce_window,
    "reduce_window_min": _reduce_window,
    "reduce_window": _reduce_window,
    "select_and_scatter_add": _select_and_scatter_add,
    "select_and_scatter": _select_and_scatter,
    "select_and_gather_add": _select_and_gather_add,
    "scatter-add": _scatter_combine,
    "scatter-sub": _scatter_combine,
    "scatter-mul": _scatter_combine,
    "scatter-min": _scatter_combine,
    "scatter-max": _scatter_combine,
    "scatter_add": _scatter_combine,
    "sort": _sort,
    "fft": _fft,
    "cholesky": _cholesky,
    "triangular_solve": _triangular_solve,
    "lu": _lu,
}
_RULES.update({p: _zero for p in VIEW_PRIMITIVES | MOVE_PRIMITIVES})
_RULES.update({p: _elementwise for p in ELEMENTWISE_PRIMITIVES})
_RULES.update({p: _reduction for p in REDUCTION_PRIMITIVES})


def flops(primitive: str, params: dict, in_avals: Sequence[Any],
          out_avals: Sequence[Any]) -> float | None:
    """FLOPs of one execution of ``primitive``, or None when there is no rule for it."""
    rule = _RULES.get(primitive)
    if rule is None:
        return None
    return float(rule(params, in_avals, out_avals))


def generic_flops(out_avals: Sequence[Any]) -> float:
    """The stand-in cost of a primitive without a rule: one FLOP per output element."""
    return float(sum(num_elements(a) for a in out_avals))


def is_view(primitive: str) -> bool:
    """True for ops that access no memory (reshape-like views and annotations)."""
    return primitive in VIEW_PRIMITIVES

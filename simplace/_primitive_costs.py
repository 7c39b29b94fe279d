"""FLOP rules for JAX primitives, used by ``simplace.trace``.

The rules count what XLA's cost analysis counts on CPU for the op compiled alone
(``jax.jit(f).lower(*args).compile().cost_analysis()``), with one deliberate difference:
a transcendental (exp, log, tanh...) is one FLOP here, where XLA lists it apart under
``transcendentals``; so a rule gives XLA's ``flops + transcendentals``. A cost model
calibrates real op times by signature, so these numbers mainly rank ops and drive
roofline guesses; matching XLA keeps them comparable with what JAX users see.

- ``dot_general``: 2 x output elements x contracted size (= 2 x batch x M x N x K); a
  product with nothing to sum (K = 1) is one multiply per output element.
- ``conv_general_dilated``: 2 x the multiply-adds that read a real input element:
  per spatial dimension, the (output position, kernel tap) pairs that land on an input
  element rather than on padding or on a zero inserted by lhs (input) dilation, times
  batch / ``batch_group_count``, input features / ``feature_group_count`` and output
  features. A transposed convolution thus costs its input size x kernel size, not the
  size of its dilated input.
- Elementwise ops: one FLOP per output element; ops that XLA expands into several
  (erfc, lgamma, logistic, ``integer_pow``...) cost their expansion.
- Reductions: input elements - output elements (n - 1 combines for n values);
  cumulative ops: one FLOP per input element.
- Windowed reductions (pooling): (window size - 1) per output element; the max-pool
  gradient ``select_and_scatter_add`` as XLA's CPU expansion of it (see its rule).
- Ops that only move or re-describe data: 0 FLOPs (a ``gather`` in fill mode does a
  bounds check per index and a select per output element). Pure views (reshape,
  squeeze, bitcast...) also access no bytes; see ``VIEW_PRIMITIVES``.
- Anything else is *unknown*: ``flops`` returns None and the tracer applies a generic
  cost (one FLOP per output element) and warns.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Rule = Callable[[dict, Sequence[Any], Sequence[Any]], float]

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
    "stochastic_round", "_copysign", "copysign", "one_minus_square",
    # transcendentals and special functions
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan",
    "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "sqrt",
    "rsqrt", "cbrt", "erf", "erfc", "erf_inv", "lgamma", "digamma", "polygamma", "zeta",
    "igamma", "igammac", "igamma_grad_a", "random_gamma_grad", "bessel_i0e", "bessel_i1e",
    "regularized_incomplete_beta", "is_finite",
    # logic, comparison, selection, bit twiddling
    "and", "or", "xor", "not", "eq", "ne", "lt", "le", "gt", "ge", "eq_to", "lt_to",
    "le_to", "select_n", "shift_left", "shift_right_logical", "shift_right_arithmetic",
    "population_count", "clz",
    # random numbers
    "threefry2x32", "random_bits", "random_seed", "random_split", "random_fold_in",
    "random_clone", "rng_bit_generator", "rng_uniform", "random_gamma",
})

# FLOPs per output element of elementwise ops that are more than one arithmetic op:
# XLA's flops + transcendentals for the op compiled alone on CPU (measured with jax
# 0.10), where XLA expands it into a polynomial approximation or a few simpler ops.
# Every other elementwise op is one FLOP per output element.
FLOPS_PER_ELEMENT: dict[str, float] = {
    "one_minus_square": 2,  # 1 - x * x: a multiply and a subtract
    "logistic": 4, "exp2": 2, "asin": 7, "acos": 5, "sinh": 13, "cosh": 5, "asinh": 14,
    "acosh": 11, "atanh": 8, "erfc": 61, "erf_inv": 39, "lgamma": 56, "digamma": 76,
    "polygamma": 82, "zeta": 133, "igamma": 274, "igammac": 274, "igamma_grad_a": 550,
    "random_gamma_grad": 532, "regularized_incomplete_beta": 274, "bessel_i0e": 84,
    "bessel_i1e": 84, "nextafter": 23,
    # threefry's rounds of add, rotate and xor: 43 integer ops per pair of outputs
    "threefry2x32": 21.5, "random_bits": 45,
}

# Transcendentals per output element (XLA's ``transcendentals`` for the op compiled
# alone on CPU, measured with jax 0.10): the part of the op's FLOPs here that XLA does
# not count as flops. Elementwise ops not listed have none.
TRANSCENDENTALS_PER_ELEMENT: dict[str, float] = {
    "exp": 1, "exp2": 1, "log": 1, "log1p": 1, "expm1": 1, "tanh": 1, "logistic": 1,
    "sin": 1, "cos": 1, "tan": 1, "asin": 2, "acos": 2, "atan": 1, "atan2": 1, "sinh": 3,
    "cosh": 2, "asinh": 3, "acosh": 4, "atanh": 2, "sqrt": 1, "rsqrt": 1, "cbrt": 1,
    "erf": 1, "erfc": 1, "erf_inv": 2, "lgamma": 4, "digamma": 3, "pow": 1,
    "bessel_i0e": 1, "bessel_i1e": 1,
}


def xla_flops_fraction(primitive: str) -> float:
    """The part of a ``primitive`` op's FLOPs (as traced) that XLA counts as flops rather
    than transcendentals: 0 for exp, tanh, sqrt..., 3/4 for logistic, 1 for most ops."""
    t = TRANSCENDENTALS_PER_ELEMENT.get(primitive, 0.0)
    return 1.0 - t / FLOPS_PER_ELEMENT.get(primitive, 1.0) if t else 1.0


def xla_flops(primitives: Sequence[str], flops) -> np.ndarray:
    """float64[N]: the flops XLA counts for ops of these primitives with these traced
    FLOPs (transcendentals apart: ``xla_flops_fraction``)."""
    frac = {p: xla_flops_fraction(p) for p in set(primitives)}
    return np.asarray(flops, dtype=np.float64) * np.fromiter(
        (frac[p] for p in primitives), dtype=np.float64, count=len(primitives))


REDUCTION_PRIMITIVES = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
    "reduce_xor", "argmax", "argmin", "reduce",
})

CUMULATIVE_PRIMITIVES = frozenset({
    "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "top_k", "approx_top_k",
})


def num_elements(aval: Any) -> int:
    """Number of elements of an abstract value (0 for tokens and other non-arrays)."""
    shape = getattr(aval, "shape", None)
    return math.prod(shape) if shape is not None else 0


def _dot_general(params, ins, outs) -> float:
    (lhs_contract, _), _ = params["dimension_numbers"]
    k = math.prod(ins[0].shape[d] for d in lhs_contract)
    # Nothing to sum when k == 1 (an outer or elementwise product): XLA rewrites such a
    # dot into a multiply, one FLOP per output element.
    return (2.0 * k if k > 1 else 1.0) * num_elements(outs[0])


@functools.lru_cache(maxsize=4096)
def conv_taps(in_size: int, out_size: int, kernel_size: int, stride: int, pad_low: int,
              lhs_dilation: int, rhs_dilation: int) -> int:
    """(output position, kernel tap) pairs of one spatial dimension of a convolution
    whose tap reads a real input element: not padding, not a zero inserted by lhs
    dilation. As XLA's ``HloCostAnalysis::GetConvolutionFlops`` counts them."""
    out_pos = np.arange(out_size, dtype=np.int64)[:, None]
    taps = np.arange(kernel_size, dtype=np.int64)[None, :]
    # index into the padded, lhs-dilated input, shifted so that 0 is the first element
    dilated = out_pos * stride - pad_low + taps * rhs_dilation
    real = (dilated >= 0) & (dilated < in_size * lhs_dilation) & (dilated % lhs_dilation == 0)
    return int(real.sum())


def _conv(params, ins, outs) -> float:
    lhs, rhs, out = ins[0].shape, ins[1].shape, outs[0].shape
    dn = params["dimension_numbers"]
    if dn is None:  # lax's default: NCHW, OIHW, NCHW
        lhs_spec = rhs_spec = out_spec = tuple(range(len(lhs)))
    else:
        lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    spatial = len(lhs) - 2
    ones = (1,) * spatial
    strides = params.get("window_strides") or ones
    padding = params.get("padding") or ((0, 0),) * spatial
    lhs_dil = params.get("lhs_dilation") or ones
    rhs_dil = params.get("rhs_dilation") or ones
    positions = math.prod(
        conv_taps(lhs[lhs_spec[2 + i]], out[out_spec[2 + i]], rhs[rhs_spec[2 + i]],
                  int(strides[i]), int(padding[i][0]), int(lhs_dil[i]), int(rhs_dil[i]))
        for i in range(spatial))
    # The kernel's input-feature dim is already C_in / feature_group_count, and the
    # output's batch dim already N / batch_group_count.
    in_features = rhs[rhs_spec[1]]
    return 2.0 * out[out_spec[0]] * out[out_spec[1]] * in_features * positions


def _window(params) -> int:
    return math.prod(params["window_dimensions"])


def _reduce_window(params, ins, outs) -> float:
    return float(num_elements(outs[0]) * (_window(params) - 1))


def _select_and_scatter_add(params, ins, outs) -> float:
    # operands (source, operand). XLA's CPU backend expands select-and-scatter into a
    # reduce-window that tracks the selected element (per window element after the
    # first: 7 + rank ops, for the value and its index) and a scatter-add per source
    # element.
    rank = len(ins[1].shape)
    return float(num_elements(ins[0]) * ((7 + rank) * (_window(params) - 1) + 1))


def _select_and_scatter(params, ins, outs) -> float:
    # operands (operand, source, init_value)
    return float(num_elements(ins[1]) * _window(params))


def _select_and_gather_add(params, ins, outs) -> float:
    return float(num_elements(outs[0]) * _window(params))


def _reduction(params, ins, outs) -> float:
    # operands first, then init values (variadic reduce): n - 1 combines per result
    return float(max(num_elements(ins[0]) - num_elements(outs[0]), 0))


def _cumulative(params, ins, outs) -> float:
    return float(sum(num_elements(a) for a in ins))


def _elementwise(params, ins, outs) -> float:
    return float(sum(num_elements(a) for a in outs))


def _expanded(per_element: float) -> Rule:
    def rule(params, ins, outs) -> float:
        return per_element * sum(num_elements(a) for a in outs)
    return rule


def _integer_pow(params, ins, outs) -> float:
    # square-and-multiply: x ** 5 = (x * x) ** 2 * x is 3 multiplies; a negative
    # exponent adds one division
    y = int(params["y"])
    n = abs(y)
    muls = n.bit_length() - 1 + n.bit_count() - 1 if n else 0
    return float(num_elements(outs[0]) * (muls + (y < 0)))


def _gather(params, ins, outs) -> float:
    # Fill mode (jnp's default for reads) masks out-of-bounds indices: per index vector
    # of k components, 2k compares and 2k - 1 ands; then one select per output element.
    if getattr(params.get("mode"), "name", None) != "FILL_OR_DROP":
        return 0.0
    indices = ins[1].shape
    k = indices[-1] if indices else 1
    vectors = math.prod(indices[:-1]) if indices else 1
    return float(num_elements(outs[0]) + vectors * (4 * k - 1))


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


_RULES: dict[str, Rule] = {}
_RULES.update({p: _zero for p in VIEW_PRIMITIVES | MOVE_PRIMITIVES})
_RULES.update({p: _elementwise for p in ELEMENTWISE_PRIMITIVES})
_RULES.update({p: _expanded(v) for p, v in FLOPS_PER_ELEMENT.items()})
_RULES.update({p: _reduction for p in REDUCTION_PRIMITIVES})
_RULES.update({p: _cumulative for p in CUMULATIVE_PRIMITIVES})
_RULES.update({  # specific rules last: they override the families above
    "dot_general": _dot_general,
    "conv_general_dilated": _conv,
    "integer_pow": _integer_pow,
    "gather": _gather,
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
})


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

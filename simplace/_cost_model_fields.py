"""Field checks for cost-model files and objects: numbers, strings, matrices, keys.

Part of ``simplace.cost_model``: every check raises ``CostModelError`` naming the
offending field (``devices[1].peak_flops_per_s``), as a cost-model file spells it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from simplace.errors import CostModelError


def _where(where: str, field: str) -> str:
    return f"{where}.{field}" if where else field


def _number(value: Any, name: str, *, min_value: float | None = None, strict: bool = False,
            max_value: float | None = None, allow_inf: bool = False) -> float:
    """``value`` as a float, or CostModelError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise CostModelError(f"{name} must be a number, got {value!r}.")
    x = float(value)
    if math.isnan(x) or (math.isinf(x) and not allow_inf):
        raise CostModelError(f"{name} must be finite, got {value!r}.")
    if min_value is not None and (x <= min_value if strict else x < min_value):
        raise CostModelError(f"{name} must be {'>' if strict else '>='} {min_value:g}, "
                             f"got {value!r}.")
    if max_value is not None and x > max_value:
        raise CostModelError(f"{name} must be <= {max_value:g}, got {value!r}.")
    return x


def _string(value: Any, name: str, *, choices: Sequence[str] | None = None,
            nonempty: bool = True) -> str:
    if not isinstance(value, str):
        raise CostModelError(f"{name} must be a string, got {value!r}.")
    if nonempty and not value:
        raise CostModelError(f"{name} must not be empty.")
    if choices is not None and value not in choices:
        raise CostModelError(f"{name} must be one of {', '.join(map(repr, choices))}, "
                             f"got {value!r}.")
    return value


def _matrix(value: Any, name: str, d: int, *, inf_on_diagonal: bool = False) -> np.ndarray:
    """A DxD float64 matrix from nested lists or an array. With ``inf_on_diagonal``,
    diagonal entries may be null / "inf" (JSON has no infinity) and become inf."""
    rows = value.tolist() if isinstance(value, np.ndarray) else value
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in rows):
        raise CostModelError(f"{name} must be a {d}x{d} matrix (a list of {d} lists), "
                             f"got {type(value).__name__}.")
    shape = f"{len(rows)}x{len(rows[0]) if rows else 0}"
    if len(rows) != d or any(len(r) != d for r in rows):
        if rows and any(len(r) != len(rows[0]) for r in rows):
            shape = f"{len(rows)} rows of lengths {sorted({len(r) for r in rows})}"
        raise CostModelError(f"{name} must be {d}x{d} for {d} devices, got {shape}.")
    out = np.empty((d, d), dtype=np.float64)
    for i, row in enumerate(rows):
        for j, v in enumerate(row):
            if i == j and inf_on_diagonal and (v is None or v == "inf"):
                out[i, j] = math.inf
            else:
                out[i, j] = _number(v, f"{name}[{i}][{j}]", allow_inf=i == j and inf_on_diagonal)
    return out


def _vector(value: Any, name: str, d: int) -> np.ndarray:
    vals = value.tolist() if isinstance(value, np.ndarray) else value
    if not isinstance(vals, (list, tuple)):
        raise CostModelError(f"{name} must be a list of {d} numbers, got {type(value).__name__}.")
    if len(vals) != d:
        raise CostModelError(f"{name} must have {d} entries for {d} devices, got {len(vals)}.")
    return np.array([_number(v, f"{name}[{i}]") for i, v in enumerate(vals)], dtype=np.float64)


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr = np.array(arr, dtype=np.float64, copy=True)
    arr.flags.writeable = False
    return arr


def _json_float(x: float) -> float | str:
    return "inf" if math.isinf(x) else float(x)


def _check_keys(d: Mapping, where: str, required: Iterable[str], optional: Iterable[str]):
    if not isinstance(d, Mapping):
        raise CostModelError(f"{where} must be an object, got {type(d).__name__}.")
    required, optional = tuple(required), tuple(optional)
    for k in required:
        if k not in d:
            raise CostModelError(f"{_where(where, k)} is missing.")
    unknown = sorted(set(d) - set(required) - set(optional))
    if unknown:
        raise CostModelError(
            f"{_where(where, unknown[0])} is not a known field; {where or 'the top level'} "
            f"takes {', '.join(required + optional)}.")

"""How the trace describes what an op reads, writes and is configured by: a JAX abstract
value as the graph's ``Aval`` and its bytes, and a primitive's parameters as the text of
the op's signature and as its ``attrs`` data."""

from __future__ import annotations

import enum
import math
from typing import Any

import numpy as np

from simplace._lazy import LazyModule
from simplace.errors import TraceError
from simplace.graph import Aval

jcore = LazyModule("jax.extend.core")  # imported on first use (see simplace.trace)

# Params that never change an op's cost (shardings are placement, not work) or that
# carry objects without a stable text form.
_SKIP_PARAMS = frozenset({"out_sharding", "sharding", "name", "debug_info", "ctx_mesh",
                          "in_shardings", "out_shardings", "in_layouts", "out_layouts"})


def _dtype_bytes(dtype) -> int:
    """Bytes per element: numpy's itemsize (JAX's dtypes, bfloat16 and float8 included, are
    numpy dtypes); an extended dtype (PRNG keys) counts its physical representation."""
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        pass
    try:
        phys = dtype._rules.physical_element_aval(dtype)
        return math.prod(phys.shape) * np.dtype(phys.dtype).itemsize
    except Exception as err:  # noqa: BLE001 - re-raised with what to do
        # A guessed size would silently skew every memory and transfer figure.
        raise TraceError(
            f"simplace.trace cannot size dtype {dtype!r}: it is not a numpy dtype and has "
            f"no physical representation ({type(err).__name__}: {err}). Cast such values to "
            "a numpy dtype inside the traced function, or report the dtype.") from None


def _dtype_name(dtype) -> str:
    """numpy's name of a dtype (``float32``, ``bfloat16``); an extended dtype's text."""
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def _make_aval(aval) -> Aval:
    """The graph's ``Aval`` of a JAX abstract value; a value that is not an array (a
    token) gets its type's name, shape () and itemsize 0."""
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return Aval((), type(aval).__name__, 0)
    try:
        dims = tuple(int(d) for d in shape)
    except Exception:  # noqa: BLE001 - symbolic dims raise their own error types
        raise TraceError(f"simplace.trace needs static shapes; got {shape} (symbolic "
                         "dimensions). Trace with concrete sizes.") from None
    return Aval(dims, _dtype_name(dtype), _dtype_bytes(dtype))


def aval_nbytes(aval) -> int:
    """Bytes of an abstract value (shape x itemsize); 0 for tokens, refs and other
    non-array values."""
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0  # tokens, refs and other non-array values
    return math.prod(shape) * _dtype_bytes(dtype)


_DTYPE_SHORT: dict[Any, str] = {}


def _short_dtype(dtype) -> str:
    """``f32``, ``bf16``, ``i32``, ``bool``...: jaxpr-style dtype names for signatures."""
    s = _DTYPE_SHORT.get(dtype)
    if s is None:
        try:
            d = np.dtype(dtype)
        except TypeError:
            s = str(dtype)  # extended dtypes, e.g. key<fry>
        else:
            bits = d.itemsize * 8
            s = {f"float{bits}": f"f{bits}", f"int{bits}": f"i{bits}",
                 f"uint{bits}": f"u{bits}", f"complex{bits}": f"c{bits}",
                 "bfloat16": "bf16"}.get(d.name, d.name)  # float8 variants keep full names
        _DTYPE_SHORT[dtype] = s
    return s


def _aval_str(aval) -> str:
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return type(aval).__name__
    return f"{_short_dtype(dtype)}[{','.join(str(d) for d in shape)}]"


_OMIT = object()  # a parameter with no stable text or data form (a sub-jaxpr, a function)


def _param(v) -> tuple[str | None, Any]:
    """A primitive parameter as (text, data): the text goes into the op's signature (it
    must be deterministic: np.int64(1) and 1 print alike), the data into its ``attrs``
    (JSON-like: named tuples and dataclasses become mappings, sequences tuples, enums and
    dtypes their names). (None, ``_OMIT``) for values with neither (sub-jaxprs, functions).

    One function for both, so that the signature and the data cannot drift apart; the
    text cannot be derived from the data, which drops type names and the quotes that
    tell the string 'CLIP' from the enum CLIP.
    """
    if v is None or isinstance(v, (bool, int, str)):
        return repr(v), v
    if isinstance(v, float):
        return repr(v), (v if math.isfinite(v) else repr(v))  # JSON has no inf or nan
    if isinstance(v, np.generic) and np.ndim(v) == 0 and not isinstance(v, np.void):
        return _param(v.item())
    if isinstance(v, enum.Enum):
        return v.name, v.name
    if isinstance(v, (jcore.Jaxpr, jcore.ClosedJaxpr)) or callable(v) and not isinstance(
            v, type):
        return None, _OMIT
    if isinstance(v, (np.dtype, type)):
        try:
            name = np.dtype(v).name
        except TypeError:
            name = str(v)
        return name, name
    if isinstance(v, tuple) and hasattr(v, "_fields"):  # NamedTuple: ConvDimensionNumbers
        return _record(type(v).__name__, zip(v._fields, v, strict=True))
    if isinstance(v, (tuple, list)):
        items = [_param(x) for x in v]
        if any(t is None for t, _ in items):
            return None, _OMIT  # holds jaxprs or functions (cond branches): no stable text
        text = ", ".join(t for t, _ in items) + ("," if len(items) == 1 else "")
        return f"({text})", tuple(d for _, d in items)
    if isinstance(v, np.ndarray):
        return _param(v.tolist())
    if hasattr(v, "__dataclass_fields__"):  # GatherDimensionNumbers and friends
        return _record(type(v).__name__, ((k, getattr(v, k)) for k in v.__dataclass_fields__))
    text = repr(v)
    text = type(v).__name__ if " at 0x" in text else text
    return text, text


def _record(type_name: str, fields) -> tuple[str, dict]:
    """``Name(k=text, ...)`` and ``{k: data}`` of a named tuple's or dataclass's fields; a
    field with no form prints as ``k=None`` (signatures have always said so) and is left
    out of the data."""
    texts, data = [], {}
    for k, x in fields:
        t, d = _param(x)
        texts.append(f"{k}={t}")
        if d is not _OMIT:
            data[k] = d
    return f"{type_name}({', '.join(texts)})", data


def _params(params: dict) -> tuple[str, dict]:
    """An equation's parameters as the signature's text (``k=v;...`` by name) and as
    data, both leaving out ``_SKIP_PARAMS`` and values with no form."""
    texts, data = [], {}
    for k in sorted(params):
        if k in _SKIP_PARAMS:
            continue
        t, d = _param(params[k])
        if t is not None:
            texts.append(f"{k}={t}")
            data[k] = d
    return ";".join(texts), data

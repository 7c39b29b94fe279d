"""The fields of an OpGraph: the ``Aval`` type, the field names and bounds, and the
checked conversion of user-given values (indices, sizes, flags, shapes, parameters) into
the graph's read-only arrays and tuples."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from simplace.errors import GraphError


class Aval(NamedTuple):
    """The abstract value of one tensor: what an op reads or writes, without the data.

    shape: sizes of the axes (``()`` for a scalar).
    dtype: numpy name of the element type (``float32``, ``bfloat16``, ``int8``, ``bool``),
      an extended dtype's name (``key<fry>``), or for a value that is not an array (a
      token) its abstract type's name, with shape ``()`` and itemsize 0.
    itemsize: bytes per element, as the trace sized it (numpy's itemsize; an extended
      dtype counts its physical representation).
    """

    shape: tuple[int, ...]
    dtype: str
    itemsize: int

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tensor."""
        return math.prod(self.shape) * self.itemsize

    @property
    def is_inexact(self) -> bool:
        """Floating point or complex: a value that has a gradient (integer ids do not)."""
        return self.dtype.startswith(("float", "bfloat", "complex"))


_OP_STR_FIELDS = ("op", "name_path", "signature")
_OP_FLOAT_FIELDS = ("flops", "bytes_accessed", "out_bytes")
_EDGE_FIELDS = ("src", "dst", "edge_bytes", "edge_output")
_PARAM_FIELDS = ("param_names", "param_sizes", "param_op", "param_index")
_OP_SHAPE_FIELDS = ("in_avals", "out_avals", "attrs")
# Bounds of an op's work and of any tensor's bytes: far beyond any real model (a
# zettaFLOP op takes 11 days at a PFLOP/s; an exbibyte tensor fits no machine), so a value
# past them is a unit error or garbage, never a graph to price.
MAX_FLOPS = 1e21
MAX_BYTES = float(2**60)


def _str_array(values) -> np.ndarray:
    arr = np.asarray(list(values), dtype=object)
    return arr.astype(str) if arr.size else np.zeros(0, dtype=str)


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr = np.array(arr, copy=True)
    arr.flags.writeable = False
    return arr


def _rows(values, field: str) -> Sequence:
    """A per-op (or per-parameter) sequence; numpy object arrays are taken as lists."""
    if isinstance(values, np.ndarray):
        return values.tolist() if values.ndim else []
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
        raise GraphError(f"OpGraph field '{field}' must be a sequence with one entry per "
                         f"op (or parameter), got {type(values).__name__}.")
    return values


def _aval_rows(values, field: str, cache: dict[int, Aval]) -> tuple[tuple[Aval, ...], ...]:
    """Per op, its values as a tuple of checked ``Aval``. Rows and Avals are checked once
    per distinct object (the trace and the loader share them among ops)."""
    done: dict[int, tuple[Aval, ...]] = {}
    out = []
    for i, row in enumerate(_rows(values, field)):
        r = done.get(id(row))
        if r is None:
            if isinstance(row, (str, bytes, Mapping)) or not isinstance(row, (
                    Sequence, np.ndarray)):
                raise GraphError(f"'{field}' of op {i} must be a sequence of Avals, got "
                                 f"{type(row).__name__}.")
            r = done[id(row)] = tuple(cache.get(id(a)) or _to_aval(a, field, i, cache)
                                      for a in row)
        out.append(r)
    return tuple(out)


def _to_aval(x, field: str, i: int, cache: dict[int, Aval]) -> Aval:
    """``x`` as an ``Aval`` (from an Aval or a ``(shape, dtype, itemsize)`` triple), checked:
    sizes and itemsize are integers >= 0, dtype a non-empty name; errors name ``field``
    of op (or parameter) ``i``. ``cache`` maps ids of values already checked (the trace
    shares one Aval among many ops)."""
    hit = cache.get(id(x))
    if hit is not None:
        return hit
    where = f"'{field}' entry {i}" if field == "param_avals" else f"'{field}' of op {i}"
    try:
        shape, dtype, itemsize = x
        dims = tuple(shape)
    except (TypeError, ValueError):
        raise GraphError(f"{where} must be a (shape, dtype, itemsize) Aval, got "
                         f"{x!r:.60}.") from None
    for n in dims:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise GraphError(f"{where}: shape {dims!r:.60} must hold integer sizes >= 0.")
    if not isinstance(dtype, str) or not dtype:
        raise GraphError(f"{where}: dtype must be a dtype name (float32, bfloat16...), got "
                         f"{dtype!r:.40}.")
    if isinstance(itemsize, bool) or not isinstance(itemsize, (int, np.integer)) or (
            itemsize < 0):
        raise GraphError(f"{where}: itemsize must be an integer >= 0 (bytes per element), "
                         f"got {itemsize!r:.40}.")
    out = Aval(tuple(int(n) for n in dims), dtype, int(itemsize))
    if type(x) is Aval and x == out:
        out = x
    cache[id(x)] = out
    return out


class _FrozenDict(dict):
    """A read-only dict: an op's ``attrs``. A dict (not a MappingProxyType) so that graphs
    pickle (process pools) and the mapping serialises as it is."""

    __slots__ = ()

    def _read_only(self, *args, **kwargs):
        raise TypeError("OpGraph attrs are read-only; build a new graph to change them.")

    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only

    def __reduce__(self):
        return (_FrozenDict, (dict(self),))

    def __repr__(self) -> str:
        return f"attrs({dict.__repr__(self)})"


def _freeze(v, where: str):
    """JSON-like ``v`` made read-only: mappings become read-only dicts, lists tuples."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        if not math.isfinite(v):
            raise GraphError(f"{where}: {v!r} is not a finite number (JSON has none).")
        return float(v)
    if isinstance(v, Mapping):
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise GraphError(f"{where}: keys must be strings, got {k!r:.40}.")
            out[k] = _freeze(x, f"{where}.{k}")
        return _FrozenDict(out)
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x, f"{where}[{k}]") for k, x in enumerate(v))
    raise GraphError(f"{where}: {type(v).__name__} is not JSON-like data (mappings, lists, "
                     "numbers, strings, booleans, null).")


def _freeze_attrs(a, i: int, cache: dict[int, Mapping], what: str = "'attrs' of op") -> Mapping:
    """Op ``i``'s parameters, frozen once per distinct mapping object (``cache``)."""
    hit = cache.get(id(a))
    if hit is not None:
        return hit
    if not isinstance(a, Mapping):
        raise GraphError(f"{what} {i} must be a mapping of parameter names to values, got "
                         f"{type(a).__name__}.")
    out = cache[id(a)] = _freeze(a, f"{what} {i}")
    return out


def _thaw(v):
    """The JSON form of a frozen value: mappings to dicts, tuples to lists."""
    if isinstance(v, Mapping):
        return {k: _thaw(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return [_thaw(x) for x in v]
    return v


def _index_array(values, field: str) -> np.ndarray:
    """int32[N] of op, output or parameter indices; booleans and non-integral numbers are
    refused rather than truncated, and values beyond int32 (how indices are stored)
    rather than wrapped."""
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind == "O" and all(
            isinstance(x, numbers.Integral) and not isinstance(x, bool | np.bool_)
            for x in arr.reshape(-1)):
        arr = np.array([int(x) for x in arr.reshape(-1)], dtype=object)  # big Python ints
    elif arr.size and arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f":
            frac = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
            if frac.size:
                k = int(frac[0])
                raise GraphError(f"OpGraph field '{field}' holds indices, which must be "
                                 f"integers; entry {k} is {arr.reshape(-1)[k]!r}.")
        else:
            raise GraphError(f"OpGraph field '{field}' holds indices, which must be integers; "
                             f"got values of type {arr.dtype}.")
    flat = arr.reshape(-1)
    if flat.size:
        lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
        out = [k for k in (int(np.argmin(flat)), int(np.argmax(flat)))
               if not lo <= flat[k] <= hi]
        if out:
            k = out[0]
            raise GraphError(f"OpGraph field '{field}' entry {k} is {int(flat[k])}, beyond "
                             f"the int32 range indices are stored in ({lo}..{hi}): not a "
                             "valid index.")
    return flat.astype(np.int64).astype(np.int32)


def _float_array(values, field: str) -> np.ndarray:
    """float64[N] of sizes or counts; strings, booleans and None are refused rather than
    converted."""
    arr = np.asarray(values)
    # numpy reads [True, 2] as integers: look at the entries of a list themselves.
    if arr.size and (arr.dtype.kind not in "iuf" or (
            isinstance(values, list | tuple) and any(isinstance(x, bool) for x in values))):
        flat = arr.reshape(-1) if arr.dtype.kind not in "iuf" else list(values)
        for k, x in enumerate(flat):
            if not isinstance(x, numbers.Real) or isinstance(x, bool | np.bool_):
                x = x.item() if isinstance(x, np.generic) else x
                raise GraphError(f"OpGraph field '{field}' holds numbers; entry {k} is "
                                 f"{x!r} ({type(x).__name__}).")
        try:
            return np.array([float(x) for x in flat], dtype=np.float64)
        except OverflowError:
            raise GraphError(f"OpGraph field '{field}' has a number too large for a "
                             "float64.") from None
    return arr.astype(np.float64).reshape(-1)


def _bool_array(values, field: str) -> np.ndarray:
    """bool[N]; integers 0/1 are taken as booleans, anything else is refused."""
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind != "b" and (
            arr.dtype.kind not in "iu" or not np.all((arr == 0) | (arr == 1))):
        raise GraphError(f"OpGraph field '{field}' must hold booleans (True/False); got "
                         f"values of type {arr.dtype}.")
    return arr.astype(bool).reshape(-1)

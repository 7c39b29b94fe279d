"""Golden test: the op signatures and parameter data that ``trace`` records.

Signatures key the calibration records (an op's measured time is looked up by its
signature), so a change in how a parameter prints silently orphans every stored record.
The fingerprints below pin the signatures and attrs of three small zoo graphs; the table
test pins each kind of parameter value, as text and as data, side by side.

If a JAX or flax upgrade changes the traced programs themselves, the fingerprints change
for a good reason: check the new signatures (``_fingerprint``) and update them here.
"""

import dataclasses
import hashlib
import importlib
from collections.abc import Mapping

import jax
import numpy as np
import pytest
from jax import lax

from simplace.models import load_graph

trace_mod = importlib.import_module("simplace.trace")  # the package exports trace()


def _canon(v) -> str:
    """Exact text of attrs data: mappings in their order, tuples kept apart from lists,
    every leaf with its type (so 1, 1.0, True and '1' differ)."""
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k!r}: {_canon(x)}" for k, x in v.items()) + "}"
    if isinstance(v, tuple):
        return "(" + ", ".join(_canon(x) for x in v) + ",)"
    return f"{type(v).__name__}:{v!r}"


def _fingerprint(graph) -> tuple[int, int, str, str]:
    """(ops, distinct signatures, hash of the sorted distinct signatures, hash of the
    attrs in op order)."""
    sigs = sorted(set(graph.signature.tolist()))
    sig_hash = hashlib.sha256("\n".join(sigs).encode()).hexdigest()[:16]
    attrs_hash = hashlib.sha256("\n".join(_canon(a) for a in graph.attrs).encode())
    return graph.num_ops, len(sigs), sig_hash, attrs_hash.hexdigest()[:16]


@pytest.mark.parametrize("model,expected", [
    ("mlp", (78, 58, "7ba57b393a4b7f0c", "3bc96c6a2f8037da")),
    ("tiny_cnn", (203, 133, "3c2b76fc07d8c668", "46f470ae8418220b")),
    # embedding gather and its scatter-add gradient: dataclasses, an enum, a NaN fill
    ("rnnlm", (670, 83, "b0c1cc4304bd9b04", "a408e43502e95ef9")),
])
def test_zoo_signatures_and_attrs_are_unchanged(model, expected):
    assert _fingerprint(load_graph(model, small=True)) == expected


def test_a_gather_prints_and_records_its_parameters():
    g = load_graph("rnnlm", small=True)
    i = next(i for i, op in enumerate(g.op) if op == "gather")
    assert g.signature[i] == (
        "gather|f32[32,8],i32[2,4,1]|dimension_numbers=GatherDimensionNumbers("
        "offset_dims=(2,), collapsed_slice_dims=(0,), start_index_map=(0,), "
        "operand_batching_dims=(), start_indices_batching_dims=());fill_value=nan;"
        "indices_are_sorted=False;mode=FILL_OR_DROP;slice_sizes=(1, 8);unique_indices=False")
    assert _canon(g.attrs[i]) == _canon({
        "dimension_numbers": {"offset_dims": (2,), "collapsed_slice_dims": (0,),
                              "start_index_map": (0,), "operand_batching_dims": (),
                              "start_indices_batching_dims": ()},
        "fill_value": "nan", "indices_are_sorted": False, "mode": "FILL_OR_DROP",
        "slice_sizes": (1, 8), "unique_indices": False})


class _Opaque:
    pass


@dataclasses.dataclass(frozen=True)
class _Numbers:
    a: int
    f: object


_JAXPR = jax.make_jaxpr(lambda x: x)(1.0)

# parameter value -> (its text in a signature, its attrs data); None: left out of both
_CASES = {
    "float": (0.5, "0.5", 0.5),
    "inf": (float("inf"), "inf", "inf"),  # JSON has no infinity: data keeps the text
    "neg_inf": (-float("inf"), "-inf", "-inf"),
    "numpy_int": (np.int64(3), "3", 3),  # np.int64(3) and 3 give one signature
    "bool": (True, "True", True),
    "str": ("x", "'x'", "x"),
    "none": (None, "None", None),
    "enum": (lax.GatherScatterMode.CLIP, "CLIP", "CLIP"),
    "dtype": (np.float32, "float32", "float32"),
    "jax_dtype": (jax.numpy.bfloat16, "bfloat16", "bfloat16"),
    "named_tuple": (lax.ConvDimensionNumbers((0, 1), (1, 0), (0, 1)),
                    "ConvDimensionNumbers(lhs_spec=(0, 1), rhs_spec=(1, 0), out_spec=(0, 1))",
                    {"lhs_spec": (0, 1), "rhs_spec": (1, 0), "out_spec": (0, 1)}),
    # a field with no stable text prints as None and is left out of the data
    "dataclass": (_Numbers(2, lambda: 0), "_Numbers(a=2, f=None)", {"a": 2}),
    "one_tuple": ((1,), "(1,)", (1,)),
    "nested": (((1, 2), (3,)), "((1, 2), (3,))", ((1, 2), (3,))),
    "array": (np.arange(3), "(0, 1, 2)", (0, 1, 2)),
    "opaque": (_Opaque(), "_Opaque", "_Opaque"),  # a repr with an address: the type name
    "jaxpr": (_JAXPR, None, None),
    "branches": ((_JAXPR, _JAXPR), None, None),
    "function": (print, None, None),
}


def test_each_kind_of_parameter_as_text_and_as_data():
    params = {name: v for name, (v, _, _) in _CASES.items()}
    params["name"] = "skipped"  # in _SKIP_PARAMS: in neither
    text, data = trace_mod._params(params)
    want_text = ";".join(f"{k}={t}" for k, (_, t, _) in sorted(_CASES.items())
                         if t is not None)
    assert text == want_text
    want_data = {k: d for k, (_, t, d) in sorted(_CASES.items()) if t is not None}
    assert _canon(data) == _canon(want_data)

"""Which op signatures to time, and timing one signature alone on one device.

The distinct signatures of the graphs named with ``--models`` are timed alone (one jit
each) only to find which ops the runtime runs on a thread pool: a single-op time holds
a launch and a dispatch, so it is never used as an op's cost inside a segment.

Each signature is rebuilt from ``simplace.trace.op_specs`` as a jitted single-op
function (``primitive.bind(*inputs, **params)``) on inputs committed to the device.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from simplace.cost_model import op_class
from simplace.errors import CalibrationError
from simplace.hardware.timing import Timing, time_fn


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One op signature, enough to run it alone and to cost it with the roofline.

    Attributes:
      signature: the key under which op times are measured (``OpGraph.signature``).
      primitive: the JAX ``Primitive`` object.
      params: its parameters (``primitive.bind(*inputs, **params)``).
      inputs: ``jax.ShapeDtypeStruct`` of each input.
      flops, bytes_accessed: the tracer's cost of the op.
      set: ``"micro"`` or ``"model"``.
    """

    signature: str
    primitive: Any
    params: dict
    inputs: tuple
    flops: float
    bytes_accessed: float
    set: str

    @property
    def primitive_name(self) -> str:
        """The JAX primitive's name."""
        return str(self.primitive.name)

    @property
    def op_class(self) -> str:
        """The op class of the primitive (``simplace.cost_model.op_class``)."""
        return op_class(self.primitive_name)

    @property
    def does_work(self) -> bool:
        """False for ops the cost model charges nothing (``free`` with no flops and no
        bytes: views); measuring them would charge a launch overhead per reshape."""
        return not (self.op_class == "free" and self.flops == 0 and self.bytes_accessed == 0)


def specs_of(fn: Callable, args: Sequence[Any], set_: str) -> dict[str, OpSpec]:
    """The distinct op signatures of ``fn(*args)`` (traced with ``param_argnums=()``)."""
    import warnings

    from simplace.trace import op_specs, trace

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unknown-primitive notes do not matter here
        g = trace(fn, *args, param_argnums=())
        specs = op_specs(fn, *args, param_argnums=())
    cost = {}
    for sig, f, b in zip(g.signature.tolist(), g.flops.tolist(), g.bytes_accessed.tolist(),
                         strict=True):
        cost.setdefault(sig, (f, b))
    out = {}
    for sig, (prim, params, inputs) in specs.items():
        f, b = cost[sig]
        out[sig] = OpSpec(sig, prim, dict(params), tuple(inputs), float(f), float(b), set_)
    return out


def _example_value(struct, rng: np.random.Generator):
    """A host value for one input: floats in [0.5, 1.5) (safe for log, sqrt and
    division), integers 1 (valid indices, no division by zero), booleans False."""
    import jax
    import jax.numpy as jnp

    dtype, shape = struct.dtype, tuple(struct.shape)
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        phys = dtype._rules.physical_element_aval(dtype)
        data = np.zeros(shape + tuple(phys.shape), dtype=phys.dtype)
        return jax.random.wrap_key_data(data, impl=dtype._impl)
    if jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating):
        return rng.uniform(0.5, 1.5, shape).astype(dtype)
    if jnp.issubdtype(dtype, jnp.bool_):
        return np.zeros(shape, dtype=dtype)
    return np.ones(shape, dtype=dtype)


def time_spec(spec: OpSpec, device, *, seed: int = 0, **harness_kw) -> Timing:
    """Time ``spec`` alone on ``device`` (a ``jax.Device``): a jitted single-op function
    on inputs committed to the device. ``harness_kw`` go to ``time_fn`` (its first
    warm-up run compiles). Raises CalibrationError if the op cannot run alone."""
    import jax

    prim, params = spec.primitive, spec.params

    def one_op(*xs):
        return prim.bind(*xs, **params)

    rng = np.random.default_rng([seed, zlib.crc32(spec.signature.encode())])
    try:
        args = [jax.device_put(_example_value(x, rng), device) for x in spec.inputs]
        fn = jax.jit(one_op)
        return time_fn(fn, *args, **harness_kw)
    except CalibrationError:
        raise
    except Exception as err:  # noqa: BLE001 - any failure means "cannot time it alone"
        msg = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        raise CalibrationError(f"Cannot time {spec.signature[:120]} alone on {device}: "
                               f"{msg[:300]}") from err


def spec_nbytes(spec: OpSpec) -> float:
    """Bytes of the op's inputs (what must fit in memory to time it)."""
    total = 0.0
    for x in spec.inputs:
        try:
            total += math.prod(x.shape) * np.dtype(x.dtype).itemsize
        except TypeError:
            total += math.prod(x.shape) * 8  # PRNG keys: two uint32 words
    return total

"""Device rates pinned by saturating microbenchmarks, one per op class.

Small segments cut from small models cannot tell a device's peak rate from its
efficiency: their times are launch and per-op costs, so a fit on them extrapolates
wildly to real sizes (an H200 fitted at 9,423 TFLOP/s peak and 0.001 matmul efficiency).
The rates are therefore measured directly, each with one kernel grown until its
throughput stops changing:

* ``matmul``: a square f32 ``a @ b`` at JAX's default precision (flop/s);
* ``conv``: a 3x3 NHWC f32 convolution, channels in = out, with both its gradients, as
  a training step runs it (flop/s);
* ``elementwise``: ``x * a + b`` over a vector (bytes read and written per second);
* ``reduction``: a row sum of a matrix (bytes read per second);
* ``data_movement``: a transpose of a square matrix (bytes read and written per second).

The rate kept is the one at the largest sizes, once two successive sizes agree: the
regime of real models' ops (a CPU's caches make mid-size vectors look faster than the
memory a real activation lives in). ``rate_record`` is what ``calibrate`` writes; the
segment fit takes the rates as they are (``simplace.calibrate.fit.fit_segments``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from simplace.errors import CalibrationError
from simplace.hardware.timing import time_fn

# What each class's rate counts: floating-point operations or bytes of memory traffic.
RATE_UNITS = {"matmul": "flop", "conv": "flop", "elementwise": "byte", "reduction": "byte",
              "data_movement": "byte"}
RATE_CLASSES = tuple(RATE_UNITS)
# Two successive sizes whose rates agree within this fraction: the throughput has
# stopped changing.
PLATEAU_REL_TOL = 0.10
# A class this far below its unit's best rate is a failed measurement, not a device.
EFFICIENCY_FLOOR = 0.01


def _sizes(kind: str, quick: bool) -> dict[str, dict[str, Any]]:
    """Per class: the first size, the growth factor, the smallest size that may end the
    series (past the caches of a CPU, into the saturating sizes of a GPU) and the
    largest one tried."""
    gpu = kind != "cpu"
    mib = 2 ** 20
    return {
        "matmul": {"start": 256, "factor": 2, "min": 4096 if gpu else 1024,
                   "max": 8192 if gpu else 2048},
        "conv": {"start": 32, "factor": 2, "min": 256 if gpu else 64,
                 "max": 512 if gpu else (128 if quick else 256)},
        # A CPU's memory classes start past its caches and end past the first-touch
        # cost of fresh output buffers, which swings mid-size timings by 5x.
        **{c: {"start": 16 * mib, "factor": 4, "min": (1024 if gpu else 256) * mib,
               "max": (2048 if gpu else 1024) * mib}
           for c in ("elementwise", "reduction", "data_movement")},
    }


def _kernel(op_class: str, size: int, kind: str, device):
    """``(fn, args, work)``: one jitted kernel of ``op_class`` at ``size`` (matmul: the
    side; conv: the channels; memory classes: bytes of the input) on ``device``, and
    the work it does (flops or bytes)."""
    import jax
    import jax.numpy as jnp

    def put(shape):
        return jax.device_put(jnp.full(shape, 0.5, jnp.float32), device)

    if op_class == "matmul":
        a, b = put((size, size)), put((size, size))
        return jax.jit(jnp.matmul), (a, b), 2.0 * size ** 3
    if op_class == "conv":
        n, hw = (64, 56) if kind != "cpu" else (4, 28)
        x, w = put((n, hw, hw, size)), put((3, 3, size, size))

        def conv(x, w):
            return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                                dimension_numbers=("NHWC", "HWIO", "NHWC"))

        # The forward convolution and both of its gradients, as a training step runs
        # them: XLA:CPU's gradient convolutions run 1.5-3x slower than the forward one
        # (256 channels on the 2-core VM: 86 against 258 GFLOP/s), and they are two
        # thirds of a CNN's convolution flops.
        def step(x, w):
            y, pull = jax.vjp(conv, x, w)
            return y, pull(y)

        return jax.jit(step), (x, w), 3 * 2.0 * n * hw * hw * size * size * 9
    elems = size // 4
    if op_class == "elementwise":
        return jax.jit(lambda x: x * 1.5 + 0.5), (put((elems,)),), 2.0 * size
    if op_class == "reduction":
        return jax.jit(lambda x: jnp.sum(x, axis=1)), (put((elems // 1024, 1024)),), 1.0 * size
    if op_class == "data_movement":
        side = int(np.sqrt(elems))
        return jax.jit(jnp.transpose), (put((side, side)),), 8.0 * side * side
    raise CalibrationError(f"No microbenchmark for op class {op_class!r}; the classes are "
                           f"{', '.join(RATE_CLASSES)}.")


def _input_bytes(op_class: str, size: int, kind: str) -> float:
    """Device memory the kernel at ``size`` holds (inputs and output)."""
    if op_class == "matmul":
        return 3 * 4.0 * size * size
    if op_class == "conv":
        n, hw = (64, 56) if kind != "cpu" else (4, 28)
        return 2 * 4.0 * n * hw * hw * size + 4.0 * 9 * size * size
    return 1.0 * size if op_class == "reduction" else 2.0 * size


def measure_rate(op_class: str, device, *, kind: str, memory_bytes: float,
                 quick: bool = False, budget_s: float = 10.0,
                 timer: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Grow ``op_class``'s microbenchmark on ``device`` until its rate stops changing.

    Returns ``{"points": [{"size", "work", "time_s", "rate"}], "rate", "saturated",
    "why"}``: ``rate`` is the mean of the last two sizes once they agree within
    ``PLATEAU_REL_TOL`` past the class's saturating size (``saturated`` true), else the
    rate of the last size reached when the budget, the device's memory or the
    largest size stopped the series (``saturated`` false, ``why`` says which). A size
    that fails to run (out of memory) ends the series.
    """
    import jax

    plan = _sizes(kind, quick)[op_class]
    points: list[dict[str, float]] = []
    start = timer()
    size, why, saturated = plan["start"], "", False
    while True:
        if _input_bytes(op_class, size, kind) > memory_bytes / 4:
            why = f"size {size} would take over a quarter of the device's memory"
            break
        try:
            fn, args, work = _kernel(op_class, size, kind, device)
            tm = time_fn(fn, *args, warmup=2, min_repeats=5, max_repeats=15,
                         budget_s=min(1.0, budget_s / 4), rel_tol=0.03)
        except Exception as err:  # noqa: BLE001 - an allocation failure ends the growth
            if not points:
                raise CalibrationError(f"The {op_class} microbenchmark failed on its "
                                       f"smallest size ({size}): {type(err).__name__}: "
                                       f"{str(err)[:200]}") from None
            why = f"size {size} failed ({type(err).__name__})"
            break
        finally:
            jax.clear_caches()
        points.append({"size": int(size), "work": float(work), "time_s": tm.median_s,
                       "rate": float(work / tm.median_s)})
        if (len(points) >= 2 and size >= plan["min"]
                and abs(points[-1]["rate"] / points[-2]["rate"] - 1) <= PLATEAU_REL_TOL):
            saturated = True
            break
        if size * plan["factor"] > plan["max"]:
            why = f"the largest size ({size}) was reached before the rate settled"
            break
        if timer() - start > budget_s:
            why = f"the {budget_s:g} s budget ran out at size {size}"
            break
        size *= plan["factor"]
    # The largest sizes' rate: the mean of the two that agree, else the last one.
    rate = (points[-1]["rate"] + points[-2]["rate"]) / 2 if saturated else points[-1]["rate"]
    return {"points": points, "rate": rate, "saturated": saturated, "why": why}


def rate_record(device_name: str, op_class: str, result: Mapping[str, Any]) -> dict:
    """The ``rate`` record ``calibrate`` writes for one microbenchmark's result."""
    return {"kind": "rate", "device": device_name, "op_class": op_class,
            "unit": RATE_UNITS[op_class], "rate": float(result["rate"]),
            "saturated": bool(result["saturated"]), "why": str(result.get("why", "")),
            "points": [dict(p) for p in result["points"]]}


def rates_of(records: Sequence[Mapping], members: Sequence[str]) -> dict[str, float]:
    """``{op class: rate}`` measured on any of the devices ``members`` (one kind of
    hardware): the highest of their rate records per class (empty: none measured)."""
    out: dict[str, float] = {}
    for r in records:
        if r["kind"] == "rate" and r["device"] in members:
            c = r["op_class"]
            out[c] = max(out.get(c, 0.0), float(r["rate"]))
    return out


def device_rates(rates: Mapping[str, float]) -> tuple[float, float, dict[str, float]]:
    """``(peak_flops_per_s, memory_bandwidth_bytes_per_s, efficiency)`` of a device whose
    per-class rates are ``rates`` (all of ``RATE_CLASSES``): the peaks are the best
    compute and memory rates, each class's efficiency its rate over its unit's peak.
    Raises CalibrationError naming a missing class, a rate that is not a positive
    number, or an efficiency below ``EFFICIENCY_FLOOR``."""
    missing = [c for c in RATE_CLASSES if c not in rates]
    if missing:
        raise CalibrationError(
            f"No saturating microbenchmark for {', '.join(missing)}: the device's rates "
            "cannot be pinned. Calibrate again (`simplace calibrate --resume` measures "
            "what is missing).")
    for c in RATE_CLASSES:
        r = rates[c]
        if not (isinstance(r, int | float) and np.isfinite(r) and r > 0):
            raise CalibrationError(f"The {c} rate must be a positive number, got {r!r}.")
    peak = max(rates[c] for c in RATE_CLASSES if RATE_UNITS[c] == "flop")
    bw = max(rates[c] for c in RATE_CLASSES if RATE_UNITS[c] == "byte")
    eff = {c: float(rates[c] / (peak if RATE_UNITS[c] == "flop" else bw)) for c in RATE_CLASSES}
    low = [c for c in RATE_CLASSES if eff[c] < EFFICIENCY_FLOOR]
    if low:
        raise CalibrationError(
            f"The {low[0]} microbenchmark ran at {eff[low[0]]:.2g} of the device's best "
            f"{RATE_UNITS[low[0]]} rate: no kernel is that slow on working hardware; "
            "measure it again on an idle machine (`simplace calibrate --overwrite`).")
    return float(peak), float(bw), eff

"""Finding JAX devices: by name, all of them, and virtual CPU devices.

Cost models, placements and calibration records name devices ``platform:id``
(``cpu:0``, ``gpu:1``; ``device_name``). ``find_devices`` is the one lookup from such
names (and JAX's own, ``cuda:1``) to JAX devices, on every backend JAX started;
``resolve_devices`` (running placements) and ``select_devices`` (calibrating) are its
two callers' views. ``all_devices`` is what a calibration measures by default.

A cost model measured on N virtual CPU devices (``cpu:0`` ... ``cpu:N-1``) can only be
run again in a process whose JAX has N CPU devices; JAX fixes that count when its
backend starts, so ``use_cpu_devices`` must come first.

Importing this module does not import JAX.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

from simplace.errors import CalibrationError, PlacementError, SimplaceError

__all__ = ["accelerator_plugin_installed", "all_devices", "device_name", "find_devices",
           "match_cpu_cost_model", "memory_bytes", "resolve_devices", "select_devices",
           "use_cpu_devices"]


def accelerator_plugin_installed() -> bool:
    """Whether JAX could see a device other than the CPU here, without importing JAX:
    JAX gets GPUs (and other accelerators) only from PJRT plugins, found in the
    ``jax_plugins`` namespace package or the ``jax_plugins`` entry points. False means
    no such device can exist; True only that one may."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("jax_plugins") is not None:
        return True
    return bool(importlib.metadata.entry_points(group="jax_plugins"))


def device_name(dev) -> str:
    """``platform:id`` (``cpu:0``, ``gpu:1``): the name a device gets in cost models."""
    return f"{dev.platform}:{dev.id}"


def all_devices() -> list:
    """Every device of JAX's default backend, then the host CPU's where the default is
    an accelerator (when JAX has a CPU backend)."""
    import jax

    devs = list(jax.devices())
    if devs and devs[0].platform != "cpu":
        with contextlib.suppress(RuntimeError):  # no CPU backend: the others alone
            devs += jax.devices("cpu")
    return devs


def memory_bytes(dev, n_cpu: int) -> float:
    """The memory of ``dev`` in bytes: what its backend reports, else the host's (split
    over the ``n_cpu`` virtual CPU devices, which share it)."""
    stats = None
    try:
        stats = dev.memory_stats()
    except Exception:  # noqa: BLE001 - not every backend reports memory
        stats = None
    if stats and stats.get("bytes_limit"):
        return float(stats["bytes_limit"])
    host = float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return host / max(n_cpu, 1) if dev.platform == "cpu" else host


def _backends() -> dict[str, list]:
    """Platform -> its devices, for the backends JAX started (never starts one)."""
    try:
        from jax.extend.backend import backends

        return {p: list(c.local_devices()) for p, c in backends().items()}
    except ImportError:  # an older JAX: ask each platform, skipping those it lacks
        import jax

        have = {}
        for p in ("cpu", "gpu", "tpu"):
            with contextlib.suppress(RuntimeError):
                have[p] = list(jax.devices(p))
        return have


def find_devices(names: Sequence[str], backends: dict[str, Sequence], hint: str, *,
                 error: type[SimplaceError] = PlacementError,
                 subject: str = "The placement names") -> list:
    """The devices named ``names`` among ``backends`` (platform -> its devices, in JAX's
    order): by ``str(device)`` (``cuda:1``), ``platform:k`` (the k-th device of that
    platform: ``gpu:1`` as cost models name it), ``platform:id`` or ``device_kind:id``.

    Raises ``error`` (starting ``subject``) listing every backend's devices when a name
    is missing, ending with ``hint`` (what to do), or when a name fits two devices.
    ``backends`` is injectable so that hosts we lack can be tested.
    """
    table: dict[str, list[tuple[str, Any]]] = {}
    listing = []
    for plat in sorted(backends):
        shown = []
        for k, dev in enumerate(backends[plat]):
            # Cost models call the k-th GPU 'gpu:k' (platform 'gpu') where JAX says
            # 'cuda:k'; keep JAX's own names and the older platform:id, kind:id too.
            rank = f"{dev.platform}:{k}"
            for key in (str(dev), rank, f"{plat}:{k}", f"{dev.platform}:{dev.id}",
                        f"{dev.device_kind}:{dev.id}"):
                hits = table.setdefault(key.lower(), [])
                if all(d is not dev for _, d in hits):
                    hits.append((plat, dev))
            shown.append(str(dev) if str(dev).lower() == rank else f"{dev} ({rank})")
        listing.append(f"{plat} backend: {', '.join(shown) or 'no devices'}")
    out, missing = [], []
    for n in names:
        hits = table.get(str(n).lower(), [])
        if len(hits) > 1:
            both = " and ".join(f"{d} ({p} backend)" for p, d in hits)
            plats = list(dict.fromkeys(p for p, _ in hits))
            # Hiding the other platforms only helps when the devices are on several.
            hide = (", or hide all but one of their platforms from JAX (e.g. JAX_PLATFORMS="
                    f"{','.join(p for p in sorted(backends) if p not in plats[1:])})"
                    if len(plats) > 1 else "")
            raise error(
                f"The device name {str(n)!r} fits {len(hits)} JAX devices here: {both}. "
                f"Name the one meant by its JAX name{hide}.")
        if hits:
            out.append(hits[0][1])
        else:
            missing.append(n)
    if missing:
        raise error(
            f"{subject} device(s) {', '.join(map(repr, missing))}, which JAX does "
            f"not have here (it has {'; '.join(listing) or 'no devices'}). {hint}")
    return out


def resolve_devices(names: Sequence[str], *, hint: str | None = None) -> list:
    """The JAX devices named ``names`` (see ``find_devices``), looked up on every backend
    JAX has (the host CPU too where a GPU is the default).

    Raises ``PlacementError`` listing every backend's devices when a name is missing
    (ending with ``hint``: what to do; the default speaks of Python arguments), or when a
    name fits two devices.
    """
    if hint is None:
        hint = ("Run on the machine the placement was made for, or pass devices=[...] (one "
                "JAX device per index).")
    return find_devices(names, _backends(), hint)


def select_devices(names: Sequence[str] | None) -> list:
    """The JAX devices to calibrate: ``all_devices()``, or those named (``cpu:0``...;
    see ``find_devices``). Raises ``CalibrationError`` for a name JAX lacks or one
    given twice."""
    devs = all_devices()  # starts the backends the lookup then sees
    if not names:
        return devs
    if len(set(names)) != len(names):
        raise CalibrationError(f"--devices repeats a device: {', '.join(names)}.")
    return find_devices(
        names, _backends(), "For several virtual CPU devices pass --cpu-devices N (or set "
        "XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts).",
        error=CalibrationError, subject="--devices names")


def use_cpu_devices(n: int, error: type[SimplaceError] = SimplaceError, *,
                    at_least: bool = False) -> None:
    """Make JAX see ``n`` CPU devices (``at_least``: ``n`` or more); raises ``error`` if
    its backend already started with another count."""
    import jax

    if n < 1:
        raise error(f"The number of CPU devices must be >= 1, got {n}.")
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except Exception as err:  # noqa: BLE001 - JAX refuses once its backend started
        have = len(jax.devices("cpu"))
        if have == n or (at_least and have > n):
            return
        raise error(f"Cannot split the CPU into {n} devices now ({err}); start a fresh "
                    "process, or set XLA_FLAGS="
                    f"--xla_force_host_platform_device_count={n}.") from None
    have = len(jax.devices("cpu"))
    if have != n and not (at_least and have > n):
        raise error(f"Asked for {n} CPU devices but JAX has {have} (its backend started "
                    "before, or XLA_FLAGS sets another count). Run in a fresh process with "
                    f"XLA_FLAGS=--xla_force_host_platform_device_count={n}.")


def match_cpu_cost_model(cost_model) -> None:
    """If every device of ``cost_model`` is a CPU device (a model calibrated on virtual
    CPU devices), give JAX at least as many CPU devices; otherwise leave JAX alone."""
    if cost_model.num_devices > 1 and all(d.kind == "cpu" for d in cost_model.devices):
        use_cpu_devices(cost_model.num_devices, at_least=True)

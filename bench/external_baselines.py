"""Read the other systems' baselines (``bench/data/external/*/baselines.json``) for
``bench/external.py``: ``read(fmt, data, path, folder) -> {name: {"time_s", "note"}}``
with times in seconds, as simplace's rulers report them."""

from __future__ import annotations

from pathlib import Path


def read(fmt: str, data: dict, path: Path, folder: Path) -> dict[str, dict]:
    return {"doppler": _doppler, "msr": _msr}[fmt](data, path, folder)


def _doppler(data: dict, path: Path, folder: Path) -> dict[str, dict]:
    """Doppler's times are in its own unit (file units / 1e10), which is what the ruler
    reports as seconds. Runs with several seeds: the best run is the baseline."""
    ours = set(data.get("ours", ()))
    mine = [g for g in data["graphs"] if g["file"] == path.name]
    if not mine:
        return {}
    g = mine[0]
    out = {}
    for key, label in (("critical_path", "critical_path"), ("heft", "heft_doppler"),
                       ("heft_sa", "heft+sa3000")):
        v = g.get(key)
        if v is None:
            continue
        best = v["min"] if isinstance(v, dict) else v
        runs = f", best of {len(v['runs'])} seeds (mean {v['mean']:.2f})" \
            if isinstance(v, dict) else ""
        who = ("ours, scored by Doppler's rules" if key in ours
               else "theirs, re-implemented from their code")
        out[label] = {"time_s": float(best), "note": f"{who}{runs}"}
    return out


def _msr(data: dict, path: Path, folder: Path) -> dict[str, dict]:
    raise NotImplementedError

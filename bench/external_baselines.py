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
    """Their programs' results on this file (milliseconds in the file, seconds here).
    A split that breaks a memory cap or the colour classes by simplace's ruler is kept
    but marked ``"feasible": False`` (not a target): their local search ignores the
    caps, and keeps no split to check."""
    import numpy as np

    from simplace.external import load_instance

    rel = str(path.relative_to(folder))
    names = {("dp", ""): "dp", ("dp", "-localSearch"): "local_search",
             ("dp", "-pipeDream"): "pipedream", ("dp", "-oneFpga"): "one_accelerator",
             ("dp", "-expert"): "expert", ("greedy", ""): "greedy"}
    inst = None
    out = {}
    for run in data.get("runs", []):
        if run["instance"] != rel:
            continue
        key = (run["program"], run["option"])
        name = names.get(key)
        if key == ("greedy", "-computeLatency"):
            name = "expert" if "expert" in (run.get("split_note") or "") else "dp_split"
        if name is None:
            continue
        note = f"{run['program']} {run['option']}".strip() + f", {run['wall_s']:.1f} s"
        if run.get("timed_out"):
            note += f", TIMED OUT (limit {data.get('timeout_s')} s)"
        if run.get("fail"):
            note += f", {run['fail']}"
        value = run.get("value")
        feasible = None
        if run.get("placement") is not None and value is not None:
            inst = inst or load_instance(path, "msr")
            if run.get("accelerators", inst.info.get("accelerators")) \
                    == inst.info.get("accelerators"):
                ruler = inst.ruler()
                p = np.asarray(run["placement"], dtype=np.int32)
                feasible = bool(not ruler(p[None]).oom[0]
                                and (ruler.project(p) == p).all())
            else:
                feasible = False
                note += f", uses {run['accelerators']} accelerators"
        if feasible is False:
            note += ", breaks a memory cap, a colour class or the device count"
        if key == ("dp", "-localSearch"):
            note += ", ignores memory caps, keeps no split"
        out[name] = {"time_s": None if value is None or run.get("timed_out")
                     else float(value) * 1e-3,
                     "note": note, "feasible": feasible, "wall_s": run["wall_s"]}
    return out

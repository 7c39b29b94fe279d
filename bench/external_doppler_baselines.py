"""Baselines on Doppler's six graphs, scored by Doppler's rules (``DopplerMakespan``).

    python bench/external_doppler_baselines.py [--seeds 5] [--sa-steps 3000]
                                               [--out bench/data/external/doppler/baselines.json]

``DopplerMakespan`` equals Doppler's own simulator on every placement tried
(``bench/external_doppler_reference.py``, ``tests/test_external_doppler.py``), so the
makespans here are what Doppler's ``env/cost.py`` reports. Per graph:

* ``critical_path``: Doppler's critical-path heuristic (``run_critical_path.json``:
  both policy networks off) as its ``env/env.py`` and ``scheduler/rl_agent.py`` run it,
  re-implemented here because they need torch and DGL: b-levels as ``cp_utils.py``
  computes them (compute + communication + the largest child's), node choice as
  ``cp_node_selection`` (which indexes the legal list with a position among the
  maximal ones: ``legal[randint(#max)]``, kept as written), device choice as
  ``cp_device_selection`` (a random one among those with the least earliest start, the
  start being ``_update_device_info``'s: the device's summed compute so far), times in
  float32 as its tensors. Its ties are broken by torch's RNG there and numpy's here, so
  ``--seeds`` runs are reported (min, mean, each).
* ``critical_path_max_blevel``: the same with the node of largest b-level chosen
  (what the heuristic describes), ties by the same RNG.
* ``heft_sa``: OURS, not in Doppler's repository: HEFT (upward ranks with the mean
  copy cost ``comm * (D - 1) / D``, each op to the device of earliest finish, no
  insertion), then ``--sa-steps`` steps of simulated annealing from it (move one random
  op to a random other device; accept worse by ``exp(-delta / T)``, T falling
  geometrically from 5% to 0.01% of HEFT's makespan), each step scored by
  ``DopplerMakespan``; ``--seeds`` seeds.

Doppler's README and code state no per-graph figures (the paper's tables are not in the
repository), so none are recorded. Makespans are ``get_cost``'s unit (file units / 1e10).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from simplace.external import load_instance

DATA = Path(__file__).parent / "data/external/doppler"
GRAPHS = ("chain_mm_112nodes.txt", "ffnn_192nodes.txt", "transformer_block_215nodes.txt",
          "full_transformer_layer_261nodes.txt", "8gpu_transformer_block.txt",
          "8gpu_full_transformer.txt")


def _file_graph(ruler):
    """(comp, comm, src, dst) in file numbering (the ruler's own arrays)."""
    return ruler._comp, ruler._comm, ruler._src, ruler._dst


def b_levels(comp, comm, src, dst):
    """cp_utils.py's longest_path_value: leaf = compute; else compute + comm + the
    largest child's."""
    n = comp.shape[0]
    children = [[] for _ in range(n)]
    for s, d in zip(src.tolist(), dst.tolist(), strict=True):
        children[s].append(d)
    value = np.zeros(n, dtype=np.int64)
    for u in range(n - 1, -1, -1):  # files are topological: children come later
        kids = children[u]
        value[u] = comp[u] if not kids else (
            max(value[k] for k in kids) + comp[u] + comm[u])
    return value


def critical_path(comp, comm, src, dst, devices, rng, *, as_written=True):
    """Doppler's critical-path placement (file numbering); see the module docstring."""
    n = comp.shape[0]
    preds = [[] for _ in range(n)]
    succ = [[] for _ in range(n)]
    for s, d in zip(src.tolist(), dst.tolist(), strict=True):
        if s not in preds[d]:
            preds[d].append(s)
        succ[s].append(d)
    blevel = b_levels(comp, comm, src, dst)
    legal = [v for v in range(n) if not preds[v]]
    visited = set()
    loc = np.full(n, -1)
    end = np.zeros(n, dtype=np.float32)
    load = np.zeros(devices, dtype=np.float32)
    avail = np.zeros(devices, dtype=np.float32)
    for _ in range(n):
        levels = blevel[legal]
        best = np.flatnonzero(levels == levels.max())
        pick = int(rng.integers(best.size))
        v = legal[pick] if as_written else legal[int(best[pick])]
        est = np.empty(devices, dtype=np.float32)
        for d in range(devices):
            due = np.float32(-np.inf) if preds[v] else np.float32(0)
            for u in preds[v]:
                t = end[u] + np.float32(comm[u]) if loc[u] != d else end[u]
                due = max(due, np.float32(t))
            est[d] = max(due, avail[d])
        choices = np.flatnonzero(est == est.min())
        d = int(choices[rng.integers(choices.size)])
        # _update_device_info: the op "starts" at the device's summed compute so far.
        start = load[d]
        loc[v] = d
        load[d] = np.float32(load[d] + np.float32(comp[v]))
        end[v] = avail[d] = np.float32(start + np.float32(comp[v]))
        visited.add(v)
        legal.remove(v)
        for w in succ[v]:
            if w not in legal and all(u in visited for u in preds[w]):
                legal.append(w)
    return loc


def heft(comp, comm, src, dst, devices):
    """HEFT without insertion (ours): file-numbered placement."""
    n = comp.shape[0]
    succ = [[] for _ in range(n)]
    preds = [[] for _ in range(n)]
    for s, d in zip(src.tolist(), dst.tolist(), strict=True):
        succ[s].append(d)
        preds[d].append(s)
    mean_copy = comm * (devices - 1) / devices
    rank = np.zeros(n)
    for u in range(n - 1, -1, -1):
        rank[u] = comp[u] + max((mean_copy[u] + rank[w] for w in succ[u]), default=0.0)
    free = np.zeros(devices)
    end = np.zeros(n)
    loc = np.zeros(n, dtype=np.int64)
    # Decreasing rank is a topological order (ranks strictly exceed successors' when
    # compute costs are positive; ties broken by file order, which is topological).
    for v in sorted(range(n), key=lambda i: (-rank[i], i)):
        ready = np.array([max((end[u] + (comm[u] if loc[u] != d else 0) for u in preds[v]),
                              default=0.0) for d in range(devices)])
        finish = np.maximum(ready, free) + comp[v]
        d = int(np.argmin(finish))
        loc[v], end[v], free[d] = d, finish[d], finish[d]
    return loc


def anneal(ruler, start, steps, rng):
    """(best placement, its makespan): simulated annealing from ``start`` (ours)."""
    n, devices = ruler.num_ops, ruler.num_devices
    cur = np.asarray(start, dtype=np.int32).copy()
    cur_s = float(ruler(cur).step_time_s[0])
    best, best_s = cur.copy(), cur_s
    t0, t1 = 0.05 * cur_s, 1e-4 * cur_s
    for k in range(steps):
        temp = t0 * (t1 / t0) ** (k / max(1, steps - 1))
        cand = cur.copy()
        i = int(rng.integers(n))
        cand[i] = (cand[i] + 1 + int(rng.integers(devices - 1))) % devices
        s = float(ruler(cand).step_time_s[0])
        if s <= cur_s or rng.random() < math.exp(-(s - cur_s) / temp):
            cur, cur_s = cand, s
            if s < best_s:
                best, best_s = cand.copy(), s
    return best, best_s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--sa-steps", type=int, default=3000)
    ap.add_argument("--out", type=Path, default=DATA / "baselines.json")
    args = ap.parse_args(argv)
    commit = json.loads((DATA / "reference.json").read_text())["commit"]
    rows = []
    for name in GRAPHS:
        inst = load_instance(DATA / name, "doppler")
        ruler = inst.ruler()
        comp, comm, src, dst = _file_graph(ruler)
        devices = ruler.num_devices

        def score(p, ruler=ruler, ids=inst.node_ids):
            # Placements here are in file numbering; op i is file node ids[i].
            return float(ruler(np.asarray(p, dtype=np.int32)[ids]).step_time_s[0])

        row = {"file": name, "devices": devices,
               "lower_bound": ruler.lower_bound_s(),
               "all_on_one_device": score(np.zeros(comp.size))}
        for key, written in (("critical_path", True), ("critical_path_max_blevel", False)):
            runs = [score(critical_path(comp, comm, src, dst, devices,
                                        np.random.default_rng(s), as_written=written))
                    for s in range(args.seeds)]
            row[key] = {"min": min(runs), "mean": float(np.mean(runs)), "runs": runs}
        start = heft(comp, comm, src, dst, devices)[inst.node_ids]
        row["heft"] = score(start[np.argsort(inst.node_ids)])
        sa = [anneal(ruler, start, args.sa_steps, np.random.default_rng(s))[1]
              for s in range(args.seeds)]
        row["heft_sa"] = {"min": min(sa), "mean": float(np.mean(sa)), "runs": sa,
                          "steps": args.sa_steps}
        rows.append(row)
        print(name, {k: (v["min"] if isinstance(v, dict) else v) for k, v in row.items()
                     if k not in ("file", "devices")}, flush=True)
    doc = {"schema": 1, "source": "github.com/xinyuyao/Doppler", "commit": commit,
           "scored_by": "simplace.external.doppler.DopplerMakespan (== Doppler's env/cost.py)",
           "unit": "Doppler get_cost (file units / 1e10)",
           "ours": ["heft", "heft_sa"],
           "reimplemented_from_theirs": ["critical_path", "critical_path_max_blevel"],
           "paper_figures": None, "seeds": args.seeds, "graphs": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

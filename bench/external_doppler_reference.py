"""Makespans by Doppler's own simulator (``env/cost.py``) on its published graphs.

    python bench/external_doppler_reference.py CHECKOUT VENV_PYTHON [--out PATH]
                                               [--random 8] [--seed 0]

CHECKOUT is an extracted copy of github.com/xinyuyao/Doppler (e.g. ``git
--git-dir=MIRROR archive HEAD | tar -x -C /tmp/doppler``; its commit is read from
``CHECKOUT/.commit`` if present, else given by ``--commit``). VENV_PYTHON is a Python
with ``simpy``, ``networkx``, ``pexpect`` and ``python-dotenv`` (what ``env/cost.py``
imports besides torch and DGL), e.g. ``python3 -m venv /tmp/dopplerenv &&
/tmp/dopplerenv/bin/pip install simpy networkx pexpect python-dotenv``.

For each of the six graphs (the 4-GPU and 8-GPU ones, not the ``gdp_`` copies, which
have the same costs) it builds placements: every op on device 0, every op on the last
device, round robin, contiguous blocks, ``--random`` seeded uniform ones and as many
seeded ones over two devices only (ties between equal costs abound there), and scores
each with Doppler's ``Simulator.get_cost`` run unchanged in VENV_PYTHON.

Two stand-ins, because torch and DGL are not installable offline and only feed the
simulator data: costs are Python ints with torch's ``item``/``clone``/``detach``
(Doppler's costs are int64 tensors: the same exact integer sums), and the graph's
``to_networkx`` builds what DGL's does (an ``nx.MultiDiGraph`` with nodes ``range(n)``
and edges added in edge-id order). The file is read with the rules of Doppler's
``utils._read_compute_graph`` (nodes = first line minus the number of input ids).

Output (JSON, ``schema`` 1): per graph the file, devices, placements (file node order),
``makespan_units`` (Doppler's ``env.now`` at the end, exact) and ``makespan`` (what
``get_cost`` returns: ``env.now / 1e10``; a float32 tensor in Doppler, a float here).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

GRAPHS = (
    ("chain_mm_112nodes.txt", 4),
    ("ffnn_192nodes.txt", 4),
    ("transformer_block_215nodes.txt", 4),
    ("full_transformer_layer_261nodes.txt", 4),
    ("8gpu_transformer_block.txt", 8),
    ("8gpu_full_transformer.txt", 8),
)


def read_graph(path):
    """(n, src, dst, comp, comm) by the rules of Doppler's ``_read_compute_graph``."""
    data = Path(path).read_text().splitlines(keepends=True)
    inputs = list(map(int, re.findall(r"\d+", data[1])))
    src = list(map(int, re.findall(r"\d+", data[2])))
    dst = list(map(int, re.findall(r"\d+", data[3])))
    n = int(data[0]) - len(inputs)
    rows = [list(map(int, re.findall(r"\d+", data[4 + i]))) for i in range(n)]
    return n, src, dst, [r[0] for r in rows], [r[1] for r in rows]


def placements_for(n, devices, n_random, seed):
    """(label, placement) pairs: see the module docstring."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = [("all_on_0", [0] * n), (f"all_on_{devices - 1}", [devices - 1] * n),
           ("round_robin", [i % devices for i in range(n)]),
           ("blocks", [i * devices // n for i in range(n)])]
    out += [(f"random_{k}", rng.integers(0, devices, n).tolist()) for k in range(n_random)]
    out += [(f"random2_{k}", rng.choice(rng.permutation(devices)[:2], n).tolist())
            for k in range(n_random)]
    return out


def worker(checkout, job):
    """Runs in VENV_PYTHON: Doppler's Simulator on each placement of ``job``."""
    import types

    import networkx as nx

    class Quotient(float):
        """What get_cost returns, with the exact ``env.now`` it divided."""

    class Cost(int):
        """An int with the tensor methods cost.py calls; sums stay Cost."""

        def __add__(self, other):
            return Cost(int(self) + int(other))

        __radd__ = __add__

        def __truediv__(self, other):
            q = Quotient(int(self) / other)
            q.units = int(self)
            return q

        def item(self):
            return int(self)

        def clone(self):
            return self

        def detach(self):
            return self

    try:
        import torch  # noqa: F401  (the real one where installed)
    except ImportError:
        sys.modules["torch"] = types.ModuleType("torch")
    sys.path.insert(0, str(checkout))
    from env.cost import Simulator

    class Graph:
        def __init__(self, n, src, dst):
            self.n, self.src, self.dst = n, src, dst

        def to_networkx(self):
            g = nx.MultiDiGraph()
            g.add_nodes_from(range(self.n))
            for eid, (u, v) in enumerate(zip(self.src, self.dst, strict=True)):
                g.add_edge(u, v, id=eid)
            return g

    results = []
    for item in job:
        n, src, dst, comp, comm = read_graph(Path(checkout) / "compute_graph" / item["file"])
        sim = Simulator(Graph(n, src, dst), [Cost(c) for c in comm], [Cost(c) for c in comp])
        units, returned = [], []
        for p in item["placements"]:
            r = sim.get_cost(p)
            returned.append(float(r))
            units.append(r.units)
        results.append({"makespan": returned, "makespan_units": units})
    import simpy

    return {"simpy": simpy.__version__, "results": results}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", type=Path)
    ap.add_argument("python", nargs="?")
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).parent / "data/external/doppler/reference.json")
    ap.add_argument("--random", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        job = json.load(sys.stdin)
        json.dump(worker(args.checkout, job), sys.stdout)
        return
    commit = args.commit or (args.checkout / ".commit").read_text().strip()
    job = []
    for k, (name, devices) in enumerate(GRAPHS):
        n = read_graph(args.checkout / "compute_graph" / name)[0]
        labelled = placements_for(n, devices, args.random, args.seed + k)
        job.append({"file": name, "devices": devices,
                    "labels": [lbl for lbl, _ in labelled],
                    "placements": [p for _, p in labelled]})
    run = subprocess.run([args.python, __file__, str(args.checkout), "--worker"],
                         input=json.dumps(job), capture_output=True, text=True, check=True)
    reply = json.loads(run.stdout)
    results = reply["results"]
    graphs = []
    for item, res in zip(job, results, strict=True):
        graphs.append({**item, "makespan": res["makespan"],
                       "makespan_units": res["makespan_units"]})
    doc = {"schema": 1, "source": "github.com/xinyuyao/Doppler", "commit": commit,
           "simulator": (f"env/cost.py Simulator.get_cost, unchanged, simpy {reply['simpy']}; "
                         "int costs for torch's int64 tensors, DGL's to_networkx rebuilt "
                         "(bench/external_doppler_reference.py)"),
           "graphs": graphs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # One line per graph: the placements dominate the file.
    body = ",\n".join(json.dumps(g, separators=(",", ":")) for g in graphs)
    head = json.dumps({k: v for k, v in doc.items() if k != "graphs"}, indent=1)[:-2]
    args.out.write_text(f'{head},\n "graphs": [\n{body}\n]}}\n')
    print(f"wrote {args.out}: {sum(len(g['placements']) for g in graphs)} placements")


if __name__ == "__main__":
    main()

"""Write the worked-example notebooks of this folder from the cells below.

    python notebooks/make_notebooks.py          # (re)write notebooks/*.ipynb
    python notebooks/make_notebooks.py --check  # exit 1 if a committed notebook differs

The notebooks are kept in git without outputs (execution counts, outputs and cell ids
fixed), so a diff shows only what a person changed; the source of truth is this file.
Each runs in at most about two minutes on 2 CPU cores; ``tests/test_notebooks.py``
executes them (``--runslow``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

# Every notebook starts here: JAX gets 4 CPU devices before it starts (a multi-device
# machine out of one CPU), unless the environment already fixed a device count.
SETUP_4_CPU = '''\
import os

# JAX fixes its devices when it starts: split this CPU into 4 devices first, unless the
# environment already chose a count, and keep JAX on the CPU.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=4").strip()
if "JAX_PLATFORMS" not in os.environ:
    os.environ["JAX_PLATFORMS"] = "cpu"'''

QUICKSTART = [
    ("md", """\
# simplace quickstart: trace, simulate, optimize

simplace finds fast *device placements* (which op of a JAX program runs on which
device) with a simulator calibrated to a machine. This notebook takes AlexNet's training
step, places it on the seed papers' machine (a Haswell CPU and 4 Tesla K40 GPUs, a
*datasheet* cost model shipped with simplace), draws the simulated schedule, and
compares every placement method.

The command-line equivalents:

```bash
simplace simulate alexnet --cost-model haswell_k40x4 --single fastest --gantt single.png
simplace optimize alexnet --cost-model haswell_k40x4 --method all --budget-s 2
```"""),
    ("code", SETUP_4_CPU),
    ("code", """\
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Image

import simplace
from simplace import paths, zoo
from simplace.gantt import plot_gantt"""),
    ("md", """\
## Trace a model into an op graph

`zoo.get` returns a function and *abstract* arguments (shapes only: nothing is
allocated); `simplace.trace` turns it into an `OpGraph`, arrays of ops and edges with
flops, bytes and parameter sizes per op."""),
    ("code", """\
fn, args = zoo.get("alexnet", training=True)
graph = simplace.trace(fn, *args)
print(graph.summary(top=5))"""),
    ("md", """\
## A machine: the cost model

`CostModel.load(NAME)` looks the name up in `--cost-model-dir` (the `cost_model_dir`
argument), the user directory (`$SIMPLACE_HOME`), a source checkout's `cost_models/`
and the machines shipped with simplace, in that order (`simplace.paths`)."""),
    ("code", """\
machine = simplace.CostModel.load("haswell_k40x4")
print(paths.find_cost_model("haswell_k40x4"))
print(machine.summary())
print("machines found by name:", ", ".join(paths.available_cost_models()))"""),
    ("md", """\
## Simulate one placement and draw its schedule

A placement is `int32[M]`, a device index per op. Here every op goes on the fastest
device that fits (what `--single fastest` does). The reference simulator returns the
step time, the busy time and peak memory of each device, and with `schedule=True` the
start and end of every segment, op and transfer, which `plot_gantt` draws."""),
    ("code", """\
single = simplace.optimize(graph, machine, "single")
res = simplace.simulate(graph, machine, single.placement, schedule=True)
bound_s = simplace.lower_bound(graph, machine)
print(f"all on {machine.device_names[single.placement[0]]}: step {res.step_time_s * 1e3:.1f} ms "
      f"(lower bound {bound_s * 1e3:.1f} ms), OOM: {res.oom}")
for name, peak, cap in zip(machine.device_names, res.peak_memory_bytes, machine.memory_bytes,
                           strict=True):
    print(f"  {name:<7} peak memory {peak / 2**30:6.2f} GiB of {cap / 2**30:6.1f} GiB")
plot_gantt(res, machine, "gantt_single.png", graph=graph, title="AlexNet on one K40")
Image("gantt_single.png")"""),
    ("md", """\
## Every method at once (`optimize --method all`)

`optimize(..., "all")` runs every placement method but `exact` within one shared
wall-time budget: the fast methods first, then `local` starting from their placements,
then the `rl-*` policies warm-started from the best so far (each search's compilation
comes on top of its share). It returns the fastest placement that fits, with each
method's figures in `info["compared"]`. Step times always come from the reference
simulator."""),
    ("code", """\
best = simplace.optimize(graph, machine, "all", budget_s=8, seed=0)
compared = best.info["compared"]
single_s = next(c["step_time_s"] for c in compared if c["method"] == "single")
print(f"{'method':<10} {'step ms':>9} {'vs single':>9} {'vs bound':>9} {'wall s':>7}")
for c in sorted(compared, key=lambda c: c["step_time_s"]):
    print(f"{c['method']:<10} {c['step_time_s'] * 1e3:9.1f} {single_s / c['step_time_s']:8.2f}x "
          f"{c['step_time_s'] / bound_s:8.2f}x {c['wall_s']:7.2f}" + ("  OOM" if c["oom"] else ""))
print(f"best: {best.method}, {best.step_time_s * 1e3:.1f} ms")"""),
    ("code", """\
order = sorted(compared, key=lambda c: c["step_time_s"])
fig, ax = plt.subplots(figsize=(8, 3.5))
ax.bar([c["method"] for c in order], [c["step_time_s"] * 1e3 for c in order],
       color=["tab:red" if c["oom"] else "tab:blue" for c in order])
ax.axhline(bound_s * 1e3, color="black", ls="--", label="lower bound")
ax.axhline(single_s * 1e3, color="tab:orange", ls=":", label="single device")
ax.set_ylabel("simulated step time (ms)")
ax.set_title("AlexNet training step on haswell_k40x4")
ax.legend()
plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
fig.tight_layout()
plt.show()"""),
    ("md", """\
The best placement's schedule, and how many ops each device got:"""),
    ("code", """\
res_best = simplace.simulate(graph, machine, best.placement, schedule=True)
print({name: int(np.sum(best.placement == d)) for d, name in enumerate(machine.device_names)})
plot_gantt(res_best, machine, "gantt_best.png", graph=graph,
           title=f"AlexNet, {best.method}: {res_best.step_time_s * 1e3:.1f} ms")
Image("gantt_best.png")"""),
    ("md", """\
Next: `02_calibrate_validate` measures *this* machine and checks the simulator against
it; `03_rl` trains placement policies; `04_pase` splits layers over many devices."""),
]

CALIBRATE_VALIDATE = [
    ("md", """\
# Calibrate this machine, then check the simulator against it

A datasheet model is a guess; `simplace calibrate` *measures* a machine: segment launch
and host dispatch per device, the in-segment cost of ops on real segments cut from zoo
graphs, and `jax.device_put` time, latency and bandwidth per link. Here a quick, small
calibration of this machine's CPU split into 4 JAX devices (about 30 s), then a
validation: real runs of placements of a model the calibration never saw, predicted
against measured step times, before and after drift correction.

Command line: `simplace calibrate --quick`, `simplace validate ... --update`. The model
is written to the user directory (`$SIMPLACE_HOME`, else the platform's user data
folder), never into the installed package."""),
    ("code", SETUP_4_CPU),
    ("code", """\
import matplotlib.pyplot as plt
import numpy as np

import simplace
from simplace import paths, zoo
from simplace.calibrate import calibrate
from simplace.validate import fit_drift, split_records"""),
    ("md", """\
## Calibrate (quick)

Only `mlp`'s segments are timed, within a 25 s budget; what is left unmeasured is costed
by the fits. `overwrite=True` measures again when the notebook is run again."""),
    ("code", """\
machine, report = calibrate("notebook_cpu", quick=True, models=["mlp"], budget_s=25,
                            overwrite=True, progress=False)
print(machine.summary())
print("written to", paths.find_cost_model("notebook_cpu"))
for name, r in report["devices"].items():
    h = r["held_out"]
    if h["median_rel_error"] is not None:
        print(f"{name}: held-out segments n={h['n']}, "
              f"median error {100 * h['median_rel_error']:.1f}%")"""),
    ("md", """\
## Candidates of a model the calibration never saw

`tiny_cnn`'s training step (real arrays this time: it will run). The candidates: each
device alone, the heuristics and partitioners, and a few random 4-stage pipelines
(seeded), so that the step times spread."""),
    ("code", """\
fn, args = zoo.get("tiny_cnn", small=True, abstract=False)
graph = simplace.trace(fn, *args)
cands, labels = [], []
for d, name in enumerate(machine.device_names):
    cands.append(np.full(graph.num_ops, d, np.int32))
    labels.append(f"single {name}")
for method in ["heft", "m_etf", "m_sct", "m_topo", "metis", "scotch"]:
    cands.append(simplace.optimize(graph, machine, method).placement)
    labels.append(method)
rng = np.random.default_rng(0)
for k in range(5):
    cuts = np.sort(rng.choice(np.arange(1, graph.num_ops), 3, replace=False))
    cands.append(np.searchsorted(cuts, np.arange(graph.num_ops), side="right").astype(np.int32))
    labels.append(f"4 stages #{k}")
print(len(cands), "candidates of", graph.num_ops, "ops")"""),
    ("md", """\
## Validate: run them for real

Each candidate runs as `simplace.apply` runs it (one jitted computation per run of
consecutive ops on one device, `device_put` between them), timed in interleaved
rounds."""),
    ("code", """\
rep = simplace.validate(graph, machine, cands, fn=fn, args=args, labels=labels,
                        timing={"min_repeats": 3, "budget_s": 0.3})
print(rep.table())"""),
    ("md", """\
A 25-second calibration of one small model on a machine that may be busy is rough:
expect errors of tens of percent, more for placements with many segments and copies.
A full `simplace calibrate` measures every zoo model's segments and the links at
several sizes (the committed `cpu_vm2core_x4`, 4 devices of a 2-core VM: held-out MAPE
9.1% raw, 9.1% drift-corrected, fidelity_2026-11-24g; see the README)."""),
    ("md", """\
## Drift correction

`fit_drift` fits per-device compute scales, extra launch overheads and link scales so
that simulated step times match the measured ones. It is fitted on half of the records
and judged on the other, held-out half."""),
    ("code", """\
fit, held = split_records(list(rep.records), 0.5, seed=0)
drift = fit_drift(fit, [graph], machine, held_out=held)
print(drift.summary())
corrected = drift.cost_model"""),
    ("code", """\
measured = np.array([r["measured_step_time_s"] for r in held]) * 1e3
raw = np.array([simplace.simulate(graph, machine, np.asarray(r["assignment"])).step_time_s
                for r in held]) * 1e3
corr = np.array([simplace.simulate(graph, corrected, np.asarray(r["assignment"])).step_time_s
                 for r in held]) * 1e3
fig, axes = plt.subplots(1, 2, figsize=(9, 4), sharex=True, sharey=True)
everything = np.concatenate([measured, raw, corr])
lo, hi = 0.8 * everything.min(), 1.2 * everything.max()
for ax, pred, title, s in ((axes[0], raw, "raw cost model", drift.held_out["mape_raw"]),
                           (axes[1], corr, "drift-corrected", drift.held_out["mape_corrected"])):
    ax.scatter(measured, pred)
    ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (ms)")
    ax.set_title(f"{title}: held-out MAPE {100 * s:.0f}%")
axes[0].set_ylabel("predicted step time (ms)")
fig.tight_layout()
plt.show()"""),
    ("md", """\
`simplace validate --update` does the same from the command line and writes the
corrected model back (a copy in the user directory when the machine is one shipped
with simplace). From Python:"""),
    ("code", """\
path = paths.cost_model_write_path(
    corrected.name, read_from=paths.find_cost_model(corrected.name))
corrected.save(path)
print("corrected model written to", path)
assert simplace.CostModel.load("notebook_cpu") == corrected"""),
]

RL = [
    ("md", """\
# Reinforcement learning: placement policies trained against the simulator

simplace's REINFORCE placers (`rl-seq2seq` as in Mirhoseini et al. 2017,
`rl-hierarchical` as in 2018, `rl-gnn` a graph network) sample placements, score them
with the batched simulator, and push the policy towards the faster ones. Here a short
run of two of them on AlexNet's training step on the 1 CPU + 4 K40 machine, with the single
device, the best heuristic and the lower bound as reference lines.

Command line: `simplace optimize alexnet --cost-model haswell_k40x4 --method rl-gnn
--episodes 7680 --history h.json`."""),
    ("code", SETUP_4_CPU),
    ("code", """\
import matplotlib.pyplot as plt
import numpy as np

import simplace
from simplace import zoo
from simplace.placers import compare

fn, args = zoo.get("alexnet", training=True)
graph = simplace.trace(fn, *args)
machine = simplace.CostModel.load("haswell_k40x4")
print(graph.num_ops, "ops on", machine.name)"""),
    ("md", "## The reference lines"),
    ("code", """\
heuristics = compare(graph, machine,
                     ["single", "heft", "m_etf", "m_sct", "m_topo", "metis", "scotch"])
single_s = next(r.step_time_s for r in heuristics if r.method == "single")
best_h = min((r for r in heuristics if not r.oom), key=lambda r: r.step_time_s)
bound_s = simplace.lower_bound(graph, machine)
print(f"single {single_s * 1e3:.1f} ms, best heuristic {best_h.method} "
      f"{best_h.step_time_s * 1e3:.1f} ms, lower bound {bound_s * 1e3:.1f} ms")"""),
    ("md", """\
## Train

120 updates of 64 sampled placements each (seeded); most of the time is compiling the
policy and the simulator once. `history` holds one row per update: the mean and the
best step time of its samples. (`rl-seq2seq` trains the same way; it is left out here
to keep the notebook short.)"""),
    ("code", """\
runs = {}
for method in ["rl-gnn", "rl-hierarchical"]:
    runs[method] = simplace.optimize(graph, machine, method, seed=0, episodes=64 * 120)
    r = runs[method]
    print(f"{method:<16} best {r.step_time_s * 1e3:7.1f} ms   {r.wall_s:5.1f} s   "
          f"{len(r.history)} updates")"""),
    ("code", """\
fig, ax = plt.subplots(figsize=(8, 4.5))
for (method, r), colour in zip(runs.items(), ["tab:blue", "tab:green"], strict=True):
    ep = np.array([h["episodes"] for h in r.history])
    mean = np.array([h["mean_step_time_s"] for h in r.history]) * 1e3
    best = np.minimum.accumulate(np.array([h["min_step_time_s"] for h in r.history])) * 1e3
    ax.plot(ep, mean, color=colour, alpha=0.45, label=f"{method}: mean of samples")
    ax.plot(ep, best, color=colour, label=f"{method}: best so far")
ax.axhline(single_s * 1e3, color="tab:orange", ls=":", label="single device")
ax.axhline(best_h.step_time_s * 1e3, color="tab:red", ls="-.",
           label=f"best heuristic ({best_h.method})")
ax.axhline(bound_s * 1e3, color="black", ls="--", label="lower bound")
ax.set_xlabel("sampled placements")
ax.set_ylabel("simulated step time (ms)")
ax.set_title("REINFORCE on AlexNet, haswell_k40x4")
ax.legend(fontsize=7)
fig.tight_layout()
plt.show()"""),
    ("md", """\
Each policy's best placement, re-simulated by the reference simulator (what
`optimize` reports), against the heuristics:"""),
    ("code", """\
for method, r in runs.items():
    print(f"{method:<16} {r.step_time_s * 1e3:7.1f} ms  {single_s / r.step_time_s:5.2f}x single  "
          f"{best_h.step_time_s / r.step_time_s:5.2f}x best heuristic  "
          f"{r.step_time_s / bound_s:5.2f}x the bound")"""),
]

PASE = [
    ("md", """\
# PaSE: split every layer over many devices

`simplace.parallelize` finds a parallelization strategy by PaSE's dynamic programming
(Elango 2021): per layer, how to split its iteration space (batch, channels, ...) over
P identical devices, minimising compute plus the cost of redistributing tensors between
layers. Here AlexNet's training step on H100s of the `cpu_h100x4_nvlink` datasheet
machine (its GPU and NVLink stand for all P), against data parallelism and the expert
strategy (data parallel convolutions, model parallel dense layers, as in Krizhevsky's
"one weird trick").

Command line: `simplace parallelize alexnet --cost-model cpu_h100x4_nvlink --devices 8`."""),
    ("code", SETUP_4_CPU),
    ("code", """\
import warnings

import matplotlib.pyplot as plt

import simplace
from simplace import zoo

fn, args = zoo.get("alexnet", training=True)
graph = simplace.trace(fn, *args)
machine = simplace.CostModel.load("cpu_h100x4_nvlink")"""),
    ("md", "## The strategy on 8 devices, layer by layer"),
    ("code", """\
strategy = simplace.parallelize(graph, machine, devices=8)
print(strategy)
print(f"predicted step {strategy.step_time_s * 1e3:.2f} ms; data parallel "
      f"{strategy.baselines_s['data_parallel'] * 1e3:.2f} ms "
      f"({strategy.speedup_over('data_parallel'):.2f}x), expert "
      f"{strategy.baselines_s['expert'] * 1e3:.2f} ms ({strategy.speedup_over('expert'):.2f}x); "
      f"search {strategy.search_time_s:.2f} s")
print(strategy.table())"""),
    ("md", """\
## Speedup against the number of devices

Speedup over the same model on one device, for P = 1 ... 64."""),
    ("code", """\
counts = [1, 2, 4, 8, 16, 32, 64]
rows = []
for p in counts:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # layers PaSE replicates are named in a warning
        st = simplace.parallelize(graph, machine, devices=p)
    rows.append((p, st.step_time_s, st.baselines_s["data_parallel"], st.baselines_s["expert"],
                 st.search_time_s))
one = rows[0][1]
print(f"{'P':>3} {'PaSE ms':>8} {'data par.':>9} {'expert':>8} {'search s':>8}")
for p, s, dp, ex, t in rows:
    print(f"{p:>3} {s * 1e3:8.2f} {dp * 1e3:9.2f} {ex * 1e3:8.2f} {t:8.2f}")

fig, ax = plt.subplots(figsize=(6.5, 4))
ax.plot(counts, [one / r[1] for r in rows], "o-", label="PaSE")
ax.plot(counts, [one / r[2] for r in rows], "s--", label="data parallel")
ax.plot(counts, [one / r[3] for r in rows], "^:", label="expert")
ax.plot(counts, counts, color="grey", lw=0.8, label="linear")
ax.set_xscale("log", base=2)
ax.set_yscale("log", base=2)
ax.set_xlabel("devices P")
ax.set_ylabel("speedup over 1 device")
ax.set_title("AlexNet training step, H100 + NVLink")
ax.legend()
fig.tight_layout()
plt.show()"""),
    ("md", """\
What each convolution and dense layer splits as P grows (a convolution's `n` is the
batch; a dense layer's `b` is the batch, `n` its output features, `k` the reduction,
whose split needs a sum across devices afterwards). The convolutions stay
data parallel; the dense layers, whose weights are large and activations small, split
their weights too: a mix no single fixed strategy gives."""),
    ("code", """\
plans = {}
for p in (2, 8, 32):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plans[p] = simplace.parallelize(graph, machine, devices=p)
names = [lp.name for lp in plans[2].layers if lp.kind in ("conv", "matmul")]
print(f"{'layer':<18}" + "".join(f"{'P=' + str(p):<18}" for p in plans))
for name in names:
    row = []
    for st in plans.values():
        lp = next(x for x in st.layers if x.name == name)
        row.append(" ".join(f"{k}={v}" for k, v in lp.splits.items() if v > 1) or "replicated")
    print(f"{name:<18}" + "".join(f"{c:<18}" for c in row))"""),
]

NOTEBOOKS = {
    "01_quickstart": QUICKSTART,
    "02_calibrate_validate": CALIBRATE_VALIDATE,
    "03_rl": RL,
    "04_pase": PASE,
}


def build(stem: str, cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """A notebook without outputs; cell ids are fixed so that rebuilding changes nothing."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                  "language": "python"},
                   "language_info": {"name": "python"}}
    for k, (kind, source) in enumerate(cells):
        cell = (nbformat.v4.new_markdown_cell(source) if kind == "md"
                else nbformat.v4.new_code_cell(source))
        cell.id = f"{stem}-{k:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def text(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed notebooks instead of writing them")
    args = parser.parse_args(argv)
    stale = []
    for stem, cells in NOTEBOOKS.items():
        path = HERE / f"{stem}.ipynb"
        new = text(build(stem, cells))
        if args.check:
            if not path.is_file() or path.read_text() != new:
                stale.append(path.name)
        else:
            path.write_text(new)
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python notebooks/make_notebooks.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

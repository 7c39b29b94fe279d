"""Score the simulator on GPU ground truth without a GPU: the 48 placements an H100 host
ran on 2026-11-23 (``../shared/measurements/h100_2026-11-23``), predicted again.

That run (``fidelity_quick_calibration.json``: mlp, tiny_cnn and rnnlm, small, 16
placements each over gpu:0 and cpu:0, measured step times) was taken with the
simulator of the time, which summed per-op times with dispatch included (522% MAPE,
tau 0.44). Its placements are simulated here with today's semantics (segments, one host
thread, ``device_put`` calls) under two cost models, neither fitted to those steps:

* ``cpu_h100_pcie``: the shipped datasheet model of a CPU + one H100 (its GPU dispatch
  and launch already come from the probe below);
* ``h100_host_probe``: built here from what the probe measured on that host
  (``runtime_probe.json``, medians): each device's dispatch (a tiny jitted call, host
  time until it returns) and launch (blocking minus dispatch), and each direction's
  ``device_put`` latency and bandwidth (blocking copies of 1 KiB and the slope between
  16 and 64 MiB, less an assumed 20 us host call); the CPU's roofline rates from the
  host's quick calibration (``h100_x1_quick.json``: peak, bandwidth and efficiency per
  op class, fitted to single ops; its per-op overheads held dispatch and are not
  used); the rest (GPU rates, in-segment per-op costs) from the datasheet model.

The simulators hold the host during a device_put between the CPU and the GPU until
the copy arrives (``CostModel.put_waits``: JAX cannot copy between PjRt clients
directly, it fetches the value to the host and uploads it again); each model is also
scored with those puts asynchronous, as the simulators had them before 2026-11-24.

The graphs must be the ones that host ran: ``bench/data/h100_2026-11-23/*.json``, traced
by today's tracer under JAX 0.11.2 as that host had (this VM's JAX 0.10.2 traces
tiny_cnn and rnnlm to other graphs); their ops and edges were checked equal to those
of the graphs the run measured (traced again with simplace 47a1191 under JAX 0.11.2: the
same graph hashes as the records). Only flops differ (today's tracer counts them
better).

    python bench/h100_host_rescore.py [--out bench/results/h100_host_rescore_DATE_vm.txt]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
from fidelity import per_model_correction, per_model_line
from report import Transcript, machine_line

from simplace.cost_model import CostModel, Provenance
from simplace.graph import OpGraph
from simplace.sim import simulate
from simplace.sim.inputs import sim_inputs
from simplace.validate import fit_drift, kendall_tau, mape, raw_model, split_records

HERE = Path(__file__).resolve().parent
MEASURED = HERE.parent.parent / "shared" / "measurements" / "h100_2026-11-23"
GRAPHS = HERE / "data" / "h100_2026-11-23"
MODELS = ("mlp", "tiny_cnn", "rnnlm")
# The host time of one device_put call: not in the probe (it timed copies blocking);
# the datasheet models' figure.
PUT_HOST_S = 20e-6


def probe_model(probe: dict, quick: dict, datasheet: CostModel) -> CostModel:
    """``h100_host_probe`` (see the module docstring)."""
    devs = {d.name: d for d in datasheet.devices}
    qcpu = next(d for d in quick["devices"] if d["name"] == "cpu:0")
    gpu = dataclasses.replace(
        devs["gpu:0"], dispatch_s=probe["gpu_tiny_jit_dispatch_only_s"],
        launch_s=probe["gpu_tiny_jit_blocking_s"] - probe["gpu_tiny_jit_dispatch_only_s"])
    cpu = dataclasses.replace(
        devs["cpu:0"], dispatch_s=probe["cpu_tiny_jit_dispatch_only_s"],
        launch_s=probe["cpu_tiny_jit_blocking_s"] - probe["cpu_tiny_jit_dispatch_only_s"],
        peak_flops_per_s=qcpu["peak_flops_per_s"],
        memory_bandwidth_bytes_per_s=qcpu["memory_bandwidth_bytes_per_s"],
        efficiency=dict(qcpu["efficiency"]),
        memory_bytes=qcpu["memory_bytes"])
    names = [d.name for d in datasheet.devices]
    lat = np.array(datasheet.latency_s, dtype=np.float64)
    bw = np.array(datasheet.bandwidth_bytes_per_s, dtype=np.float64)
    for key, (a, b) in {"device_put_cpu_to_gpu": ("cpu:0", "gpu:0"),
                        "device_put_gpu_to_cpu": ("gpu:0", "cpu:0")}.items():
        pts = dict((int(n), float(t)) for n, t in probe[key])
        i, j = names.index(a), names.index(b)
        bw[i, j] = (64 * 2**20 - 16 * 2**20) / (pts[64 * 2**20] - pts[16 * 2**20])
        lat[i, j] = max(pts[1024] - 1024 / bw[i, j] - PUT_HOST_S, 0.0)
    put = np.where(np.eye(len(names), dtype=bool), 0.0, PUT_HOST_S)
    notes = (
        "Built by bench/h100_host_rescore.py from the H100 host's runtime probe "
        "(../shared/measurements/h100_2026-11-23/runtime_probe.json, medians): dispatch "
        "(tiny jitted call, host time) and launch (blocking minus dispatch) per device; "
        "device_put latency (1 KiB, blocking, less the host call) and bandwidth (16-64 MiB "
        "slope) per direction; the host call of a device_put assumed 20 us.",
        "CPU roofline rates from that host's quick calibration (h100_x1_quick.json); GPU "
        "rates and in-segment per-op costs from the datasheet model cpu_h100_pcie.",
    )
    return CostModel(name="h100_host_probe", devices=tuple(cpu if d.name == "cpu:0" else gpu
                                                             for d in datasheet.devices),
                     latency_s=lat, bandwidth_bytes_per_s=bw, put_s=put,
                     provenance=Provenance(source="datasheet", host="", date="2026-11-23",
                                           notes=notes))


def records_for(model: CostModel, recs: list[dict], graphs: dict[str, OpGraph]) -> list[dict]:
    """The run's records with each assignment in ``model``'s device order and its graph
    hash that of the graph here."""
    out = []
    for r in recs:
        g = graphs[r["graph_name"].split("/")[0]]
        if len(r["assignment"]) != g.num_ops:
            raise SystemExit(f"{r['graph_name']}: {len(r['assignment'])} ops in the record, "
                             f"{g.num_ops} in {GRAPHS}: not the graph that host ran")
        to_here = np.array([[d.name for d in model.devices].index(n) for n in r["device_names"]])
        out.append({**r, "graph_hash": g.hash, "assignment": to_here[r["assignment"]].tolist(),
                    "device_names": [d.name for d in model.devices]})
    return out


def _table(out, pred, meas, model_of) -> None:
    out.say(f"    {'model':<10} {'n':>3} {'raw MAPE':>9} {'tau':>6}  predicted / measured "
            "(median, min-max)")
    for m in (*MODELS, "all"):
        k = model_of == m if m != "all" else np.ones(len(meas), bool)
        ratio = pred[k] / meas[k]
        out.say(f"    {m:<10} {k.sum():>3} {100 * mape(pred[k], meas[k]):>8.1f}% "
                f"{kendall_tau(pred[k], meas[k]):>6.2f}  {np.median(ratio):.2f}x "
                f"({ratio.min():.2f}-{ratio.max():.2f})")


def _in_context_costs(out, recs, by_hash, cm, meas) -> None:
    """What a segment and a put cost in those steps, by a free fit: step time = const +
    per GPU and CPU segment + per put in each direction (the simulator's counts), non-
    negative least squares on relative errors."""
    from scipy.optimize import nnls

    rows = []
    for r in recs:
        s = simulate(by_hash[r["graph_hash"]], cm, np.asarray(r["assignment"]),
                     schedule=True).schedule
        rows.append([1.0, np.sum(s.segment_device == 1), np.sum(s.segment_device == 0),
                     np.sum((s.transfer_from == 0) & (s.transfer_to == 1)),
                     np.sum((s.transfer_from == 1) & (s.transfer_to == 0))])
    x = np.asarray(rows, dtype=np.float64)
    coef, _ = nnls(x / meas[:, None], np.ones(len(meas)))
    err = np.abs(x @ coef / meas - 1)
    out.say("\nin-context costs, a free linear fit to the 48 steps (not a cost model): "
            f"{coef[0] * 1e6:.0f} us per step, {coef[1] * 1e6:.0f} us per GPU segment, "
            f"{coef[2] * 1e6:.0f} us per CPU segment, {coef[3] * 1e6:.0f} us per put "
            f"cpu->gpu, {coef[4] * 1e6:.0f} us per put gpu->cpu; MAPE of the fit "
            f"{100 * err.mean():.1f}%. Alone, the probe measured a GPU segment at "
            "75 us blocking and a small put at 125 us (cpu->gpu) and 43 us (gpu->cpu)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", default=str(MEASURED),
                    help="the folder of the H100 host's measurements")
    ap.add_argument("--out", help="write the table here (.txt)")
    args = ap.parse_args(argv)
    folder = Path(args.measured)
    with open(folder / "fidelity_quick_calibration.json") as f:
        run = json.load(f)
    with open(folder / "runtime_probe.json") as f:
        probe = json.load(f)
    with open(folder / "h100_x1_quick.json") as f:
        quick = json.load(f)
    graphs = {m: OpGraph.load(GRAPHS / f"{m}.json") for m in MODELS}
    by_hash = {g.hash: g for g in graphs.values()}
    datasheet = CostModel.load("cpu_h100_pcie")
    out = Transcript()
    out.say(f"H100 host placements predicted again; {machine_line()}")
    out.say(f"{len(run['records'])} placements measured on {run['host']} (H100 + 16-core host, "
            "JAX 0.11.2) on 2026-11-23; the simulator of that day, with the host's quick "
            "calibration: held-out MAPE 522.1%, tau 0.44 (fidelity_quick_calibration.txt)")
    for cm in (datasheet, probe_model(probe, quick, datasheet)):
        cm = raw_model(cm)
        recs = records_for(cm, run["records"], graphs)
        meas = np.array([r["measured_step_time_s"] for r in recs])
        model_of = np.array([r["graph_name"].split("/")[0] for r in recs])
        out.say(f"\n{cm.name}: gpu dispatch {cm.devices[1].dispatch_s * 1e6:.1f} us, launch "
                f"{cm.devices[1].launch_s * 1e6:.1f} us; cpu dispatch "
                f"{cm.devices[0].dispatch_s * 1e6:.1f} us, launch "
                f"{cm.devices[0].launch_s * 1e6:.1f} us; cpu->gpu "
                f"{cm.latency_s[0, 1] * 1e6:.0f} us + {cm.bandwidth_bytes_per_s[0, 1] / 1e9:.2f}"
                f" GB/s, gpu->cpu {cm.latency_s[1, 0] * 1e6:.0f} us + "
                f"{cm.bandwidth_bytes_per_s[1, 0] / 1e9:.2f} GB/s")
        inputs = {h: sim_inputs(g, cm) for h, g in by_hash.items()}
        for label, waits in (("cpu<->gpu puts hold the host (the simulators)", True),
                             ("every put asynchronous (before 2026-11-24)", False)):
            pred = []
            for r in recs:
                inp = inputs[r["graph_hash"]]
                inp = inp._replace(put_waits=inp.put_waits & waits)
                pred.append(simulate(by_hash[r["graph_hash"]], inp,
                                     np.asarray(r["assignment"])).step_time_s)
            out.say(f"  {label}:")
            _table(out, np.array(pred), meas, model_of)
        fit, held = split_records(recs, 0.5, seed=0)
        res = fit_drift(fit, by_hash, cm, held_out=held, note="bench/h100_host_rescore.py")
        pm = per_model_correction(fit, held, by_hash, cm)
        out.say(f"  held-out half (bench/fidelity.py's split), the simulators: raw "
                f"{100 * res.held_out['mape_raw']:.1f}%, corrected on all models "
                f"{100 * res.held_out['mape_corrected']:.1f}%; " + per_model_line(pm))
    _in_context_costs(out, recs, by_hash, cm, meas)
    out.finish(__file__, argv, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

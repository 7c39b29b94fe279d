"""Shared by the offline what-ifs of simulation semantics (``step_free_rescore.py``,
``wait_wakeup_rescore.py``): refit the calibration's records under a variant of the
reference simulator and score saved ``bench/fidelity.py`` runs with the refit model."""

from __future__ import annotations

import argparse
import json
import os
import warnings

import numpy as np
from fidelity import predictions
from fidelity_rescore import _graphs
from report import Transcript, machine_line

from simplace.calibrate.build import build_cost_model
from simplace.sim import reference
from simplace.validate import kendall_tau, raw_model

MODELS = ("mlp", "tiny_cnn", "rnnlm")


def parser(doc: str) -> argparse.ArgumentParser:
    """The what-ifs' command line: saved runs, ``--records``, ``--out``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("results", nargs="+", help="bench/fidelity.py JSON files")
    ap.add_argument("--records", default="calibration/cpu_vm2core_x4/records.jsonl")
    ap.add_argument("--out", help="write the table here (.txt)")
    return ap


def begin(args, title: str, legend: str):
    """``(transcript, records, runs)``: the calibration records and saved runs named on
    the command line, and a transcript headed by ``title`` and ``legend``."""
    with open(args.records) as f:
        records = [json.loads(line) for line in f]
    runs = load_runs(args.results)
    out = Transcript()
    out.say(f"{title}; {machine_line()}; records {args.records}")
    out.say(legend + "; then raw MAPE and tau on all records of each run, and per model "
            "(mlp / tiny_cnn / rnnlm) MAPE with the median predicted / measured")
    return out, records, runs


def load_runs(paths) -> list[tuple[str, dict, list]]:
    """``[(file name, {hash: OpGraph}, records)]`` of saved ``bench/fidelity.py`` runs."""
    runs = []
    for path in paths:
        with open(path) as f:
            recs = json.load(f)["records"]
        runs.append((os.path.basename(path), _graphs(recs), recs))
    return runs


def refit_and_score(out, label: str, records: list, runs: list, simulate) -> None:
    """With ``simulate`` in place of the reference simulator's ``_simulate`` (the one
    every simulation in calibration and scoring goes through): refit ``records``, say
    the whole-step fit's scales and held-out error, then each run's raw MAPE and tau
    on all its records, and per model its MAPE and median predicted / measured."""
    plain = reference._simulate
    reference._simulate = simulate
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, report = build_cost_model([dict(r) for r in records])
        steps = report.get("steps", {})
        scales = " ".join(f"{k} {v:.3f}" for k, v in steps.get("scales", {}).items())
        held = steps.get("held_out", {}).get("median_rel_error", float("nan"))
        out.say(f"{label}: steps {scales}; held out {100 * held:.1f}%")
        cm = raw_model(model)
        for name, graphs, recs in runs:
            pred = predictions(recs, graphs, cm)
            meas = np.array([r["measured_step_time_s"] for r in recs])
            err = np.abs(pred / meas - 1)
            model_of = np.array([r["graph_name"].split("/")[0] for r in recs])
            per = " / ".join(
                f"{100 * err[model_of == m].mean():.1f}% "
                f"({np.median(pred[model_of == m] / meas[model_of == m]):.2f}x)"
                for m in MODELS)
            out.say(f"  {name:<30} {100 * err.mean():5.1f}%  tau "
                    f"{kendall_tau(pred, meas):.3f}  ({per})")
    finally:
        reference._simulate = plain

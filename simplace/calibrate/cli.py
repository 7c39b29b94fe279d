"""``simplace calibrate``: the command line of calibration (wired into ``simplace.cli``)."""

from __future__ import annotations

import argparse
import sys

from simplace import paths
from simplace._argtypes import int_range, positive_seconds
from simplace.errors import CalibrationError


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``calibrate`` command to ``subparsers`` (from ``add_subparsers``); its
    ``func`` default is ``run``."""
    sp = subparsers.add_parser(
        "calibrate", help="time this machine's ops and links and fit a cost model",
        description="Time the ops and links of the JAX devices this machine has and fit a "
                    "cost model: raw records to calibration/NAME/records.jsonl, the model "
                    "to cost_models/NAME.json, both in the user directory ($SIMPLACE_HOME, "
                    "else the platform's user data folder) unless --records-dir and "
                    "--cost-model-dir say otherwise; never into the installed package.")
    sp.add_argument("--name", default=None,
                    help="machine name (default: the host name, or the records' name with "
                         "--refit/--resume)")
    sp.add_argument("--models", default=None,
                    help="comma-separated zoo names (small sizes) or file.py:factory whose "
                         "op signatures are timed (default: the zoo but mlp, tiny_cnn and "
                         "rnnlm, on which bench/fidelity.py validates, and the largest "
                         "graphs; --quick: alexnet,transformer)")
    sp.add_argument("--devices", default=None,
                    help="comma-separated device names to calibrate, e.g. cpu:0,cpu:1 "
                         "(default: all devices JAX sees)")
    sp.add_argument("--cpu-devices", type=int_range(1, 256), default=None, metavar="N",
                    help="split the host CPU into N virtual JAX devices (sets "
                         "jax_num_cpu_devices before JAX starts); default with --quick on "
                         f"a host without accelerators: {QUICK_CPU_DEVICES}")
    sp.add_argument("--quick", action="store_true",
                    help="fewer sizes and repeats: about a minute on a 2-core machine")
    sp.add_argument("--budget-s", type=positive_seconds, default=None,
                    help="wall-time budget, seconds: model signatures, then link sizes, "
                         "left unmeasured past it are costed by the fits")
    sp.add_argument("--refit", action="store_true",
                    help="refit cost_models/NAME.json from the records (--records-dir, "
                         "else the user directory, else a checkout's calibration/); no "
                         "hardware touched")
    sp.add_argument("--resume", action="store_true",
                    help="continue an interrupted calibration of NAME")
    sp.add_argument("--overwrite", action="store_true",
                    help="measure NAME again, replacing its records")
    sp.add_argument("--records-dir", default=None, metavar="DIR",
                    help=paths.CLI_RECORDS_DIR_HELP)
    sp.add_argument("--cost-model-dir", default=None, metavar="DIR",
                    help="where NAME.json is written (default: cost_models/ in the user "
                         "directory, $SIMPLACE_HOME)")
    sp.add_argument("--no-progress", action="store_true", help="no progress line")
    sp.set_defaults(func=run)
    return sp


def _split(s: str | None) -> list[str] | None:
    if s is None:
        return None
    out = [x.strip() for x in s.split(",") if x.strip()]
    return out or None


# --quick on a host without accelerators splits its CPU into this many devices, so that the
# model has devices for placements to choose from (one device is a model no placement uses).
QUICK_CPU_DEVICES = 4


def _cpu_only_host(environ) -> bool:
    """Whether JAX can use no accelerator here, decided without starting JAX (once it
    starts, its CPU device count is fixed): JAX_PLATFORMS names only cpu, or no GPU/TPU
    plugin of JAX is installed."""
    platforms = {p.strip() for p in environ.get("JAX_PLATFORMS", "").split(",") if p.strip()}
    if platforms:
        return platforms <= {"cpu"}
    import importlib.metadata

    names = {(d.metadata["Name"] or "").lower().replace("_", "-")
             for d in importlib.metadata.distributions()}
    return not any(n.startswith(("jax-cuda", "jax-rocm", "libtpu", "jax-metal"))
                   for n in names)


def quick_cpu_devices(args, environ=None) -> int | None:
    """How many CPU devices ``calibrate`` splits the CPU into without --cpu-devices: None
    (leave JAX alone) unless --quick on a CPU-only host with no --devices and no device
    count set in XLA_FLAGS."""
    import os

    environ = os.environ if environ is None else environ
    if (args.refit or not args.quick or args.cpu_devices is not None
            or args.devices is not None
            or "xla_force_host_platform_device_count" in environ.get("XLA_FLAGS", "")):
        return None
    return QUICK_CPU_DEVICES if _cpu_only_host(environ) else None


def _resumed_cpu_devices(name: str, args) -> int | None:
    """How many virtual CPU devices the calibration being resumed measured (its header
    names cpu:0..cpu:N-1 and no other device), or None: leave JAX alone (accelerators,
    one CPU device, a device count already in XLA_FLAGS, records that cannot be read:
    the resume itself then says what is wrong)."""
    import json
    import os

    from simplace.calibrate import core

    if (args.devices is not None
            or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")):
        return None
    try:  # the header (first line) only: the resume reads and checks the whole file
        rec, _ = core.paths(name, args.records_dir, args.cost_model_dir)
        with open(rec) as f:
            head = json.loads(f.readline())
        names = [d.get("name") for d in head.get("devices", [])]
    except (CalibrationError, OSError, ValueError, AttributeError, TypeError):
        return None
    if len(names) > 1 and names == [f"cpu:{k}" for k in range(len(names))]:
        return len(names)
    return None


def _set_cpu_devices(n: int) -> None:
    from simplace._devices import use_cpu_devices

    if n < 1:
        raise CalibrationError(f"--cpu-devices must be >= 1, got {n}.")
    use_cpu_devices(n, CalibrationError)


def _worker_thread_lines(report: dict) -> list[str]:
    """One line per kind of device: from how many flops a segment pays a worker thread's
    wake-up, and how much of the ops timed alone that rule explains."""
    out, seen = [], set()
    for name, r in report["devices"].items():
        members = tuple(r.get("shared_with", [name]))
        if members in seen or "parallel_rule_ops" not in r:
            continue
        seen.add(members)
        share = f"{100 * r['parallel_rule_agreement']:.1f}%"
        who = ", ".join(members)
        if not r["parallel_rule_ops"]:
            out.append(f"worker-thread wake-up ({who}): none charged (no CPU op timed "
                       "alone)")
        elif r.get("parallel_min_segment_flops") is None:
            out.append(f"worker-thread wake-up ({who}): none charged (the best flops split "
                       f"explains only {share} of the {r['parallel_rule_ops']} ops timed "
                       "alone)")
        else:
            out.append(f"worker-thread wake-up ({who}): segments of "
                       f"{r['parallel_min_segment_flops']:.4g} flops or more pay "
                       f"{r['parallel_launch_s'] * 1e6:.1f} us (the rule explains {share} "
                       f"of the {r['parallel_rule_ops']} ops timed alone)")
    return out


def _put_wait_lines(report: dict) -> list[str]:
    """What the probe of each pair of kinds of device found: does a device_put of an
    array still being computed return at once, or hold the host until the copy is in?"""
    probes = report.get("put_waits", {}).get("probes", {})
    out = []
    for pair, r in probes.items():
        if r.get("waits") is None:
            what = ("cannot tell (the computation ran before its call returned); the "
                    "default for these kinds of device is kept")
        else:
            what = "holds the host until the copy is in" if r["waits"] else "returns at once"
        out.append(f"device_put {pair}: {what} (the call took {r['call_s'] * 1e3:.2f} ms; "
                   f"its source {r['compute_s'] * 1e3:.1f} ms to compute)")
    return out


def _rate_lines(report: dict) -> list[str]:
    """The rates each kind of device was pinned at (saturating microbenchmarks)."""
    lines, seen = [], set()
    for name, r in report["devices"].items():
        rates = r.get("rates")
        if not isinstance(rates, dict) or tuple(r.get("shared_with", [name])) in seen:
            continue
        seen.add(tuple(r.get("shared_with", [name])))
        parts = [f"{c} {v['rate'] / 1e12:.3g} TFLOP/s" if v["unit"] == "flop"
                 else f"{c} {v['rate'] / 1e9:.3g} GB/s" for c, v in rates.items()]
        lines.append(f"rates ({', '.join(r.get('shared_with', [name]))}; saturating "
                     f"microbenchmarks): {', '.join(parts)}")
    return lines


def format_report(model, report: dict) -> str:
    """A short human-readable summary of a calibration report."""
    def pct(x):
        return "   -" if x is None else f"{100 * x:6.1f}%"

    from simplace.calibrate.build import OP_PART_MIN_S

    lines = [model.summary(), "", "in-segment op costs, on held-out segments (never fitted "
             "on): relative error of segment times, and of their op part where over "
             f"{OP_PART_MIN_S * 1e6:g} us:",
             f"  {'device':<8} {'segments':>8} {'held-out n':>10} {'median':>7} {'p90':>7} "
             f"{'ops part median':>15} {'p90':>7}"]
    for name, r in report["devices"].items():
        h, o = r["held_out"], r["held_out_op_part"]
        lines.append(f"  {name:<8} {r['segments_measured']:>8} {h['n']:>10} "
                     f"{pct(h['median_rel_error'])} {pct(h['p90_rel_error'])} "
                     f"{pct(o['median_rel_error']):>15} {pct(o['p90_rel_error'])}")
    lines += _rate_lines(report)
    lines += _worker_thread_lines(report)
    lines += _put_wait_lines(report)
    lines.append("links (put host time, latency, bandwidth, median fit error):")
    for key, r in report["links"].items():
        if r.get("measured") and not r.get("error"):
            lines.append(f"  {key:<14} {r['put_s'] * 1e6:7.1f} us {r['latency_s'] * 1e6:8.1f} us "
                         f"{r['bandwidth_bytes_per_s'] / 1e9:8.2f} GB/s "
                         f"{100 * r['median_rel_error']:6.1f}%")
        elif r.get("error"):
            lines.append(f"  {key:<14} NOT FITTED, took the median of the others: "
                         f"{r['error']} Re-measure it: `simplace calibrate --name "
                         f"{model.name} --overwrite` on an idle machine.")
        else:
            lines.append(f"  {key:<14} not measured (median of the others)")
    lc = report.get("link_context")
    if lc:
        n_used = sum(bool(r.get("used")) for r in lc["pairs"].values())
        factors = ", ".join(f"{k} {v:.3f}" for k, v in lc["factor"].items()) or "none"
        lines.append(
            f"copies in context (chains of segments alternating between two devices, "
            f"{n_used} of {len(lc['pairs'])} pairs device-bound): latency "
            f"{1e6 * lc['latency_in_context_s']:.1f} us (timed alone: "
            f"{1e6 * lc['latency_alone_s']:.1f} us); factor per kind of pair: "
            f"{factors}")
    groups: dict[str, list[str]] = {}
    for dev in model.devices:
        groups.setdefault(dev.exclusive_group, []).append(dev.name)
    shared = [f"{g}: {', '.join(m)}" for g, m in groups.items() if len(m) > 1]
    lines.append("exclusive groups: " + ("; ".join(shared) if shared else "none (all "
                                          "devices run in parallel)"))
    hc = report.get("host_calls")
    if hc:
        ar = hc["arity"]
        lines.append(f"host calls in context: {hc['segment_calls']} segment calls, "
                     f"{hc['puts']} device_puts" + (
                         f"; a call costs {ar['base_s'] * 1e6:.1f} us + "
                         f"{ar['per_input_s'] * 1e6:.2f} us per input + "
                         f"{ar['per_output_s'] * 1e6:.2f} us per output"
                         if "base_s" in ar else ""))
    st = report.get("steps")
    if st:
        lines.append(
            f"whole steps in context: {st['steps']} steps of {st['graphs']} graphs; scales "
            + ", ".join(f"{k} {v:.3g}" for k, v in st["scales"].items())
            + f"; error before {pct(st['before']['median_rel_error']).strip()}, fitted "
            f"{pct(st['fitted']['median_rel_error']).strip()}, held out "
            f"{pct(st['held_out']['median_rel_error']).strip()} (median)")
        if "rejected" in st:
            lines.append("  fit not kept (" + ", ".join(
                f"{k} {v:.3g}" for k, v in st["rejected_scales"].items())
                + f"): {st['rejected']}.")
        for k, why in st.get("not_pinned", {}).items():
            lines.append(f"  {k} scale not pinned (kept at 1): {why}.")
        for note in st.get("notes", []):
            lines.append(f"  {note}")
    for w in report.get("warnings", []):
        lines.append(f"WARNING: {w}")
    load = report.get("load_average")
    if load:
        cores = report.get("cpu_count") or 1
        lines.append(f"load average at the start: {load[0]:.2f} (1 min), {load[1]:.2f} (5 min)"
                     + (f": other work shared the {cores} cores, and host times inflate under "
                        "load; calibrate again on an idle machine (--overwrite) for figures "
                        "of an idle one" if load[0] > 0.5 * cores else ""))
    lines.append(f"calibration wall time: {report['wall_s']:.1f} s")
    return "\n".join(lines)


def run(args) -> int:
    """Run ``simplace calibrate`` with parsed ``args``; returns the exit status."""
    from simplace.calibrate import core

    if args.refit and (args.resume or args.overwrite or args.quick):
        raise CalibrationError("--refit only refits the records: it takes no --resume, "
                               "--overwrite or --quick.")
    name = args.name
    if name is None:
        if args.refit or args.resume:
            raise CalibrationError("--refit and --resume need --name: which calibration?")
        import socket
        name = socket.gethostname().split(".")[0] or "this_machine"
    if args.refit:
        model, report = core.refit(name, records_dir=args.records_dir,
                                   cost_model_dir=args.cost_model_dir)
    else:
        if args.cpu_devices is not None:
            _set_cpu_devices(args.cpu_devices)
        elif args.resume and (n := _resumed_cpu_devices(name, args)) is not None:
            # The records name virtual CPU devices: split the CPU as their run did.
            _set_cpu_devices(n)
        elif (n := quick_cpu_devices(args)) is not None:
            from simplace._devices import use_cpu_devices

            try:
                use_cpu_devices(n, CalibrationError, at_least=True)
                print(f"calibrate --quick: no accelerator here, so the CPU is split into {n} "
                      f"virtual devices (as --cpu-devices {n}), giving placements devices "
                      "to choose from; --cpu-devices 1 calibrates the one CPU device.",
                      file=sys.stderr, flush=True)
            except CalibrationError as err:  # JAX already started in this process
                print(f"calibrate --quick: could not split the CPU into {n} devices "
                      f"({err}); calibrating the devices JAX has.", file=sys.stderr)
        model, report = core.calibrate(
            name, models=_split(args.models), devices=_split(args.devices),
            quick=args.quick, budget_s=args.budget_s, resume=args.resume,
            overwrite=args.overwrite, records_dir=args.records_dir,
            cost_model_dir=args.cost_model_dir, progress=not args.no_progress)
    rec, cm = core.paths(name, args.records_dir, args.cost_model_dir)
    if args.refit:  # read from wherever they were found
        rec = paths.find_records(name, "records.jsonl", args.records_dir)
    print(format_report(model, report))
    print(f"records: {rec}\ncost model: {cm}")
    sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m simplace.calibrate.cli``: the command on its own (before wiring)."""
    p = argparse.ArgumentParser(prog="simplace")
    sub = p.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = p.parse_args(["calibrate", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except CalibrationError as err:
        print(f"simplace calibrate: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

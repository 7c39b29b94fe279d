"""Bad input, tried as a new user would: every case ends in a clear message and a
documented exit code (2: bad input, 3: out of memory), never a traceback, never a silent
accept, and never a damaged file.

The cases run through the real entry point, ``simplace.cli.main`` in-process (fast); a few
run ``python -m simplace`` in a subprocess to prove the exit codes of the real command.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import simplace
from simplace import groups, zoo
from simplace._jsonfile import check_output_path, write_json
from simplace.cli import main
from simplace.errors import EXIT_OOM, EXIT_USAGE, OutputError
from simplace.models import load_graph
from simplace.placement import Placement

REPO = Path(__file__).resolve().parents[1]
MACHINE = "haswell_k40x2"  # cpu:0, gpu:0, gpu:1
SAME_SIZE = "placeto_k80x2"  # the same device names and count: another machine all the same


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A saved graph (the small MLP), a placement of it for MACHINE, a cost model whose
    devices hold 1 KiB (nothing fits), and a plain file and folder to misuse."""
    root = tmp_path_factory.mktemp("bad_input")
    fn, args = zoo.get("mlp", small=True)
    graph = simplace.trace(fn, *args, name="mlp/small")
    gpath = root / "g.json"
    graph.save(gpath)
    cm = simplace.CostModel.load(MACHINE)
    ppath = root / "p.json"
    Placement(np.arange(graph.num_ops) % 3, graph.hash, cm.name,
              tuple(cm.device_names), method="test").save(ppath)
    tiny = cm.to_dict()
    tiny["name"] = "tiny_memory"
    for dev in tiny["devices"]:
        dev["memory_bytes"] = 1024
    tpath = root / "tiny_memory.json"
    tpath.write_text(json.dumps(tiny))
    (root / "a_file").write_text("not a folder\n")
    (root / "a_dir").mkdir()
    return {"root": root, "graph": gpath, "placement": ppath, "tiny": tpath,
            "num_ops": graph.num_ops, "hash": graph.hash,
            "file": root / "a_file", "dir": root / "a_dir"}


def run(capsys, *argv, code=EXIT_USAGE, says=()):
    """Run ``simplace ARGV``; assert its exit code, that stderr has no traceback, and
    that the messages (stdout + stderr) say each of ``says``. Returns (stdout, stderr)."""
    got = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert got == code, f"exit {got}, wanted {code}\nstdout: {out}\nstderr: {err}"
    assert "Traceback" not in err and "Traceback" not in out
    if code == EXIT_USAGE:
        assert "error" in err, err
    for s in says:
        assert s in out + err, f"{s!r} not in\n{out}{err}"
    return out, err


# ---------------------------------------------------------------------------- numbers
NUMBERS = [
    # (argv after the model, option named in the message)
    (["optimize", "--method", "heft", "--seed", "-5"], "--seed"),
    (["optimize", "--method", "heft", "--seed", str(2**32)], "--seed"),
    (["optimize", "--method", "heft", "--seed", "1.5"], "--seed"),
    (["optimize", "--method", "local", "--budget-s", "0"], "--budget-s"),
    (["optimize", "--method", "local", "--budget-s", "-3"], "--budget-s"),
    (["optimize", "--method", "local", "--budget-s", "nan"], "--budget-s"),
    (["optimize", "--method", "local", "--budget-s", "inf"], "--budget-s"),
    (["optimize", "--method", "local", "--budget-s", "soon"], "--budget-s"),
    (["optimize", "--method", "local", "--budget-s", "1e12"], "--budget-s"),
    (["optimize", "--method", "rl-gnn", "--episodes", "0"], "--episodes"),
    (["optimize", "--method", "rl-gnn", "--episodes", "-4"], "--episodes"),
    (["optimize", "--method", "rl-gnn", "--samples", "0"], "--samples"),
    (["optimize", "--method", "rl-gnn", "--samples", "1000000"], "--samples"),
    (["optimize", "--method", "local", "--top-k", "0"], "--top-k"),
    (["optimize", "--method", "local", "--validate-every", "-1"], "--validate-every"),
    (["optimize", "--method", "local", "--validation-budget-s", "nan"],
     "--validation-budget-s"),
    (["optimize", "--method", "local", "--validation-repeats", "0"], "--validation-repeats"),
    (["parallelize", "--devices", "0"], "--devices"),
    (["parallelize", "--devices", "-2"], "--devices"),
    (["parallelize", "--devices", "100000"], "--devices"),
    (["parallelize", "--devices", "two"], "--devices"),
    (["parallelize", "--devices", "2", "--min-part", "0"], "--min-part"),
    (["graph", "--top", "-1"], "--top"),
    (["validate", "--top-k", "0"], "--top-k"),
    (["validate", "--held-out", "1"], "--held-out"),
    (["validate", "--repeats", "0"], "--repeats"),
    (["validate", "--budget-s", "-1"], "--budget-s"),
]


@pytest.mark.parametrize("argv,option", NUMBERS, ids=[" ".join(a) for a, _ in NUMBERS])
def test_numbers_out_of_range_exit_2(capsys, files, argv, option):
    cmd, rest = argv[0], argv[1:]
    extra = {"optimize": ["--cost-model", MACHINE], "parallelize": ["--cost-model", MACHINE],
             "validate": ["--cost-model", MACHINE, files["placement"]], "graph": []}[cmd]
    out, err = run(capsys, cmd, files["graph"], *extra, *rest, says=[option, "must be"])
    assert out == ""  # refused while parsing: nothing ran


@pytest.mark.parametrize("argv,option", [
    (["--batch", "0"], "--batch"), (["--batch", "-2"], "--batch"),
    (["--batch", str(2**63)], "--batch"),
    (["--cpu-devices", "0"], "--cpu-devices"), (["--budget-s", "0"], "--budget-s"),
    (["--budget-s", "nan"], "--budget-s")])
def test_numbers_of_graph_and_calibrate(capsys, argv, option):
    cmd = ["calibrate", "--quick"] if argv[0] != "--batch" else ["graph", "mlp", "--small"]
    run(capsys, *cmd, *argv, says=[option, "must be"])


# ---------------------------------------------------------------------------- output paths
def _bad_paths(files, kind: str, name: str) -> str:
    """An output path that cannot be written, of each kind."""
    if kind == "missing folder":
        return str(files["root"] / "no_such_folder" / name)
    if kind == "directory":
        return str(files["dir"])
    if kind == "under a file":
        return str(files["file"] / name)
    assert kind == "read-only"
    return f"/sys/{name}"  # sysfs: read-only even for root


OUTPUT_COMMANDS = {
    "graph --out": (["graph", "{g}", "--out"], "g2.json"),
    "simulate --out": (["simulate", "{g}", "--cost-model", MACHINE, "--single", "0", "--out"],
                       "p.json"),
    "simulate --gantt": (["simulate", "{g}", "--cost-model", MACHINE, "--single", "0",
                          "--gantt"], "gantt.png"),
    "optimize --out": (["optimize", "{g}", "--cost-model", MACHINE, "--method", "heft",
                        "--out"], "p.json"),
    "optimize --history": (["optimize", "{g}", "--cost-model", MACHINE, "--method", "rl-gnn",
                            "--episodes", "4", "--history"], "h.json"),
    "optimize --checkpoint": (["optimize", "{g}", "--cost-model", MACHINE, "--method",
                               "rl-gnn", "--episodes", "4", "--checkpoint"], "ck.npz"),
    "parallelize --out": (["parallelize", "{g}", "--cost-model", MACHINE, "--devices", "2",
                           "--out"], "s.json"),
}
KINDS = ["missing folder", "directory", "under a file", "read-only"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", list(OUTPUT_COMMANDS))
def test_unwritable_output_fails_before_the_work(capsys, files, command, kind):
    if kind == "read-only" and os.access("/sys", os.W_OK) and not _sys_is_read_only():
        pytest.skip("/sys is writable here")
    argv, name = OUTPUT_COMMANDS[command]
    bad = _bad_paths(files, kind, name)
    argv = [a.replace("{g}", str(files["graph"])) for a in argv]
    out, err = run(capsys, *argv, bad, says=[command.split()[1], bad])
    assert out == "", "the work started before the output path was checked"
    assert ".tmp" not in err  # the user's path, never a hidden temporary file


def _sys_is_read_only() -> bool:
    try:
        check_output_path("/sys/probe.json", "--out")
    except OutputError:
        return True
    return False


def test_read_only_folder_by_permissions(capsys, files, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders (the /sys cases cover root)")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        run(capsys, "graph", files["graph"], "--out", ro / "g.json", says=[str(ro)])
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize("argv,option", [
    (["calibrate", "--quick", "--cost-model-dir", "{file}"], "--cost-model-dir"),
    (["calibrate", "--quick", "--records-dir", "/sys/simplace_records"], "--records-dir"),
    (["validate", "{g}", "--cost-model", MACHINE, "{p}", "--records-dir", "{file}"],
     "--records-dir"),
])
def test_unwritable_output_folders(capsys, files, argv, option):
    if "/sys" in " ".join(argv) and not _sys_is_read_only():
        pytest.skip("/sys is writable here")
    argv = [a.format(file=files["file"], g=files["graph"], p=files["placement"])
            for a in argv]
    out, _ = run(capsys, *argv, says=[option])
    assert out == ""


def test_gantt_format_is_checked_before_the_work(capsys, files):
    out, _ = run(capsys, "simulate", files["graph"], "--cost-model", MACHINE, "--single", "0",
                 "--gantt", files["root"] / "chart.xyz", says=["--gantt", "png"])
    assert out == ""


def test_failed_write_keeps_the_old_file(files, tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    path.write_text("old and good\n")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OutputError, match=f"{path}.*No space left") as err:
        write_json(path, {"new": 1})
    assert ".tmp" not in str(err.value)
    assert path.read_text() == "old and good\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]  # no temporary left


def test_unserialisable_data_keeps_the_old_file(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("old\n")
    with pytest.raises(ValueError):
        write_json(path, {"t": float("nan")})
    assert path.read_text() == "old\n" and len(list(tmp_path.iterdir())) == 1


def test_failed_command_keeps_the_old_output(capsys, files, tmp_path):
    out_path = tmp_path / "p.json"
    out_path.write_text("old placement\n")
    run(capsys, "optimize", files["graph"], "--cost-model", "no_such_machine", "--method",
        "heft", "--out", out_path, says=["no_such_machine"])
    assert out_path.read_text() == "old placement\n"


@pytest.mark.parametrize("argv,what", [
    (["optimize", "{g}", "--cost-model", MACHINE, "--method", "heft", "--out", "{g}"],
     "MODEL"),
    (["simulate", "{g}", "--cost-model", "{tiny}", "--single", "0", "--out", "{tiny}"],
     "--cost-model"),
    (["simulate", "{g}", "--cost-model", MACHINE, "--placement", "{p}", "--gantt", "{p}"],
     "--placement"),
])
def test_an_output_never_overwrites_an_input(capsys, files, argv, what):
    before = {k: files[k].read_bytes() for k in ("graph", "tiny", "placement")}
    argv = [a.format(g=files["graph"], tiny=files["tiny"], p=files["placement"])
            for a in argv]
    out, _ = run(capsys, *argv, says=[what, "destroy"])
    assert out == ""
    assert {k: files[k].read_bytes() for k in before} == before


def test_simulate_may_rewrite_its_placement_file(capsys, files, tmp_path):
    p = tmp_path / "p.json"
    p.write_bytes(files["placement"].read_bytes())
    run(capsys, "simulate", files["graph"], "--cost-model", MACHINE, "--placement", p,
        "--out", p, code=0)
    assert Placement.load(p).predicted_step_time_s > 0


def test_output_to_dev_null_is_written_in_place(capsys, files):
    if not os.access("/dev/null", os.W_OK):
        pytest.skip("no writable /dev/null")
    run(capsys, "simulate", files["graph"], "--cost-model", MACHINE, "--single", "0",
        "--out", "/dev/null", code=0)
    assert Path("/dev/null").is_char_device()  # not replaced by a regular file


# ---------------------------------------------------------------------------- graph files
def _edit(d: dict, section: str, field: str, index: int, value) -> dict:
    d[section][field][index] = value
    return d


def _do(d: dict, change, *args) -> dict:
    """``change(*args)`` (an edit of ``d`` in place), then ``d``."""
    change(*args)
    return d


def _add_reverse_edge(d: dict) -> dict:
    e = d["edges"]
    s, t = e["src"][0], e["dst"][0]
    e["src"].append(t)
    e["dst"].append(s)
    e["edge_bytes"].append(4.0)
    e["edge_output"].append(0)
    return d


GRAPH_EDITS = {
    # name: (edit of the saved graph's dict, what the message says)
    "src 2.7": (lambda d: _edit(d, "edges", "src", 0, 2.7), ["edges.src", "2.7", "integer"]),
    "src 1.5": (lambda d: _edit(d, "edges", "src", 1, 1.5), ["edges.src", "1.5", "integer"]),
    "dst true": (lambda d: _edit(d, "edges", "dst", 0, True), ["edges.dst", "true"]),
    "src '3'": (lambda d: _edit(d, "edges", "src", 0, "3"), ["edges.src", "integer"]),
    "edge_output 0.5": (lambda d: _edit(d, "edges", "edge_output", 0, 0.5),
                        ["edges.edge_output", "integer"]),
    "param_op 1.2": (lambda d: _edit(d, "params", "param_op", 0, 1.2),
                     ["params.param_op", "integer"]),
    "is_output 'yes'": (lambda d: _edit(d, "ops", "is_output", 0, "yes"),
                        ["ops.is_output", "yes", "true or false"]),
    "is_output 1": (lambda d: _edit(d, "ops", "is_output", 0, 1), ["ops.is_output"]),
    "flops true": (lambda d: _edit(d, "ops", "flops", 0, True), ["ops.flops", "number"]),
    "flops '12'": (lambda d: _edit(d, "ops", "flops", 0, "12"), ["ops.flops", "number"]),
    "flops -1": (lambda d: _edit(d, "ops", "flops", 0, -1.0), ["flops", ">= 0"]),
    "edge_bytes null": (lambda d: _edit(d, "edges", "edge_bytes", 0, None),
                        ["edges.edge_bytes", "null"]),
    "op 5": (lambda d: _edit(d, "ops", "op", 0, 5), ["ops.op", "string"]),
    "flops 1e400 as an integer": (lambda d: _edit(d, "ops", "flops", 0, 10**400),
                                  ["flops", "too large"]),
    "flops 1e308": (lambda d: _edit(d, "ops", "flops", 0, 1e308), ["flops", "at most 1e+21"]),
    "out_bytes 2**70": (lambda d: _edit(d, "ops", "out_bytes", 0, 2.0**70),
                        ["out_bytes", "at most"]),
    # Indices are stored as int32: a value past it is refused, never wrapped (dst + 2**32
    # would wrap to dst, and the content hash would still match).
    "dst + 2**32": (lambda d: _edit(d, "edges", "dst", 0, d["edges"]["dst"][0] + 2**32),
                    ["'dst' entry 0", "int32"]),
    "edge_output 2**32": (lambda d: _edit(d, "edges", "edge_output", 0, 2**32),
                          ["'edge_output' entry 0", "int32"]),
    "param_index 2**32": (lambda d: _edit(d, "params", "param_index", 0, 2**32),
                          ["'param_index' entry 0", "int32"]),
    "param_op -2**32": (lambda d: _edit(d, "params", "param_op", 0, -2**32),
                        ["'param_op' entry 0", "int32"]),
    "src 2**70": (lambda d: _edit(d, "edges", "src", 0, 2**70), ["src"]),
    "param_sizes false": (lambda d: _edit(d, "params", "param_sizes", 0, False),
                          ["params.param_sizes"]),
    "src out of range": (lambda d: _edit(d, "edges", "src", 0, 10**6), ["src", "not a valid"]),
    "cycle": (_add_reverse_edge, ["cycle"]),
    "short field": (lambda d: _do(d, d["ops"]["flops"].pop), ["flops", "length"]),
    "flops not a list": (lambda d: _do(d, d["ops"].__setitem__, "flops", 3),
                         ["ops.flops", "must be a list"]),
    "no edges": (lambda d: _do(d, d.pop, "edges"), ["edges", "missing"]),
    "missing field": (lambda d: _do(d, d["ops"].pop, "signature"),
                      ["ops.signature", "missing"]),
    "wrong schema": (lambda d: _do(d, d.__setitem__, "schema", "other"), ["not a simplace"]),
    "future version": (lambda d: _do(d, d.__setitem__, "schema_version", 99),
                       ["schema_version"]),
    "name 7": (lambda d: _do(d, d.__setitem__, "name", 7), ["name", "string"]),
    "edited content": (lambda d: _edit(d, "ops", "flops", 0, d["ops"]["flops"][0] + 1.0),
                       ["hash does not match"]),
}


@pytest.mark.parametrize("edit", list(GRAPH_EDITS))
def test_bad_graph_files(capsys, files, tmp_path, edit):
    change, says = GRAPH_EDITS[edit]
    d = change(json.loads(files["graph"].read_text()))
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(d))
    before = path.read_text()
    run(capsys, "graph", path, says=[str(path), *says])
    assert path.read_text() == before  # a refused file is never touched
    if edit == "src 1.5":
        assert "Duplicate" not in capsys.readouterr().err


RAW_FILES = {
    # name: (file content as bytes, what the message says)
    "not json": (b"hello, graph", "not valid JSON"),
    "empty": (b"", "not valid JSON"),
    "a list": (b"[1, 2, 3]", "not a simplace"),
    "binary": (bytes(range(256)), "not"),
    "deep nesting": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
}


@pytest.mark.parametrize("raw", list(RAW_FILES))
def test_unreadable_graph_files(capsys, tmp_path, raw):
    content, says = RAW_FILES[raw]
    path = tmp_path / "g.json"
    path.write_bytes(content)
    run(capsys, "graph", path, says=[str(path), says])


def test_truncated_graph_file(capsys, files, tmp_path):
    path = tmp_path / "g.json"
    text = files["graph"].read_text()
    path.write_text(text[: len(text) // 2])
    run(capsys, "graph", path, says=[str(path), "not valid JSON"])


@pytest.mark.parametrize("where", ["missing", "folder"])
def test_graph_file_missing_or_a_folder(capsys, files, where):
    path = files["root"] / "nope.json" if where == "missing" else files["root"] / "d.json"
    if where == "folder":
        path.mkdir(exist_ok=True)
    run(capsys, "graph", path, says=[str(path)])


# ---------------------------------------------------------------------------- cost models
COST_MODEL_EDITS = {
    "peak_flops true": (lambda d: d["devices"][0].__setitem__("peak_flops_per_s", True),
                        "peak_flops_per_s"),
    "memory 'lots'": (lambda d: d["devices"][1].__setitem__("memory_bytes", "lots"),
                      "memory_bytes"),
    "no devices": (lambda d: d.__setitem__("devices", []), "devices"),
    "negative bandwidth": (lambda d: d["links"]["bandwidth_bytes_per_s"][0].__setitem__(1, -1),
                           "bandwidth"),
    "wrong schema": (lambda d: d.__setitem__("schema", "simplace.opgraph"), "schema"),
}


@pytest.mark.parametrize("edit", list(COST_MODEL_EDITS))
def test_bad_cost_model_files(capsys, files, tmp_path, edit):
    change, says = COST_MODEL_EDITS[edit]
    d = json.loads(files["tiny"].read_text())
    change(d)
    path = tmp_path / "cm.json"
    path.write_text(json.dumps(d))
    run(capsys, "simulate", files["graph"], "--cost-model", path, "--single", "0",
        says=[str(path), says])


@pytest.mark.parametrize("kind", ["not json", "truncated", "unknown name"])
def test_unreadable_cost_models(capsys, files, tmp_path, kind):
    path = tmp_path / "cm.json"
    if kind == "not json":
        path.write_text("{machine: fast}")
    elif kind == "truncated":
        path.write_text(files["tiny"].read_text()[:300])
    spec = "no_such_machine" if kind == "unknown name" else str(path)
    run(capsys, "simulate", files["graph"], "--cost-model", spec, "--single", "0",
        says=[spec, MACHINE if kind == "unknown name" else "JSON"])


# ---------------------------------------------------------------------------- placements
def _assign(i, v):
    return lambda d: d["assignment"].__setitem__(i, v)


PLACEMENT_EDITS = {
    "entry 2.7": (_assign(0, 2.7), ["assignment", "entry 0", "2.7", "integer"]),
    "entry 1.5": (_assign(3, 1.5), ["assignment", "entry 3", "1.5"]),
    "entry 1.0": (_assign(2, 1.0), ["assignment", "entry 2", "integer"]),
    "entry true": (_assign(1, True), ["assignment", "entry 1", "true"]),
    "entry '1'": (_assign(1, "1"), ["assignment", "entry 1"]),
    "entry 7": (_assign(0, 7), ["device 7", "indices 0..2"]),
    "entry -1": (_assign(0, -1), ["device -1"]),
    "entry 2**80": (_assign(0, 2**80), ["entry 0", "not a device index"]),
    "entry 2**32 + 1": (_assign(0, 2**32 + 1), ["entry 0", "not a device index"]),
    "one short": (lambda d: d["assignment"].pop(), ["entries but the graph has"]),
    "not a list": (lambda d: d.__setitem__("assignment", 3), ["assignment"]),
    "device_names str": (lambda d: d.__setitem__("device_names", "gpu:0"), ["device_names"]),
    "oom 'yes'": (lambda d: d.__setitem__("oom", "yes"), ["oom", "true or false"]),
    "time 'fast'": (lambda d: d.__setitem__("predicted_step_time_s", "fast"),
                    ["predicted_step_time_s"]),
    "no schema": (lambda d: d.pop("schema"), ["not a simplace placement"]),
    "no assignment": (lambda d: d.pop("assignment"), ["'assignment' is missing"]),
    "other graph": (lambda d: d.__setitem__("graph_hash", "0" * 64), ["made for graph"]),
}


@pytest.mark.parametrize("edit", list(PLACEMENT_EDITS))
def test_bad_placement_files(capsys, files, tmp_path, edit):
    change, says = PLACEMENT_EDITS[edit]
    d = json.loads(files["placement"].read_text())
    change(d)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    run(capsys, "simulate", files["graph"], "--cost-model", MACHINE, "--placement", path,
        says=says)


@pytest.mark.parametrize("kind", ["not json", "truncated", "missing"])
def test_unreadable_placement_files(capsys, files, tmp_path, kind):
    path = tmp_path / "p.json"
    if kind == "not json":
        path.write_text("0 1 2 1 0")
    elif kind == "truncated":
        text = files["placement"].read_text()
        path.write_text(text[: len(text) - 20])
    run(capsys, "simulate", files["graph"], "--cost-model", MACHINE, "--placement", path,
        says=[str(path)])


def test_a_placement_belongs_to_its_machine(capsys, files):
    # Another machine of the same size and the same device names: refused, then --force.
    _, err = run(capsys, "simulate", files["graph"], "--cost-model", SAME_SIZE, "--placement",
                 files["placement"], says=[MACHINE, SAME_SIZE, "--force"])
    out, _ = run(capsys, "simulate", files["graph"], "--cost-model", SAME_SIZE, "--placement",
                 files["placement"], "--force", code=0)
    assert "step time" in out
    # Another size: refused even with --force.
    run(capsys, "simulate", files["graph"], "--cost-model", "haswell_k40x4", "--placement",
        files["placement"], "--force", says=["3 devices", "5"])
    # --force takes a placement file.
    run(capsys, "simulate", files["graph"], "--cost-model", MACHINE, "--single", "0",
        "--force", says=["--force"])


def test_a_renamed_machine_is_another_machine(files, tmp_path):
    from simplace.errors import PlacementError

    cm = simplace.CostModel.load(MACHINE)
    graph = simplace.OpGraph.load(files["graph"])
    p = Placement.load(files["placement"])
    other = simplace.CostModel.from_dict(dict(cm.to_dict(), name="my_lab"))
    with pytest.raises(PlacementError, match="my_lab"):
        p.check(graph, other)
    assert p.check(graph, other, force=True).tolist() == p.assignment.tolist()
    assert p.check(graph, cm).tolist() == p.assignment.tolist()


def test_validate_refuses_another_machine(capsys, files, tmp_path):
    # Two machines of 4 CPU devices with the same device names (this host has them, from
    # conftest): a placement made for one is refused on the other before anything runs.
    cm = simplace.CostModel.load("cpu_vm2core_x4")
    other = tmp_path / "other_vm.json"
    other.write_text(json.dumps(dict(cm.to_dict(), name="other_vm")))
    p_path = tmp_path / "p.json"
    Placement(np.arange(files["num_ops"]) % 4, files["hash"], cm.name,
              tuple(cm.device_names)).save(p_path)
    records = tmp_path / "records"
    out, _ = run(capsys, "validate", "mlp", "--small", "--cost-model", other, p_path,
                 "--records-dir", records, says=[str(p_path), "cpu_vm2core_x4", "--force"])
    assert "measured" not in out and not records.exists()


@pytest.mark.slow
def test_validate_force_runs_a_placement_of_another_machine(capsys, files, tmp_path):
    cm = simplace.CostModel.load("cpu_vm2core_x4")
    other = tmp_path / "other_vm.json"
    other.write_text(json.dumps(dict(cm.to_dict(), name="other_vm")))
    p_path = tmp_path / "p.json"
    Placement(np.arange(files["num_ops"]) % 4, files["hash"], cm.name,
              tuple(cm.device_names)).save(p_path)
    records = tmp_path / "records"
    run(capsys, "validate", "mlp", "--small", "--cost-model", other, p_path, "--force",
        "--repeats", "1", "--budget-s", "0", "--records-dir", records, code=0)
    (rec,) = [json.loads(line) for line in
              (records / "other_vm" / "validation.jsonl").read_text().splitlines()]
    assert rec["cost_model"] == "other_vm"


# ---------------------------------------------------------------------------- models
FACTORIES = """
import jax, jax.numpy as jnp
X = jax.ShapeDtypeStruct((2, 3), jnp.float32)
def five():
    return (lambda x: x * 2), 5
def only_fn():
    return lambda x: x
def first_not_callable():
    return 5, (X,)
def three_items():
    return (lambda x: x), (X,), 1
def raises():
    raise RuntimeError("no weights here")
def fails_in_trace():
    def f(x):
        raise ValueError("boom inside")
    return f, (X,)
def good():
    return (lambda x: jnp.tanh(x).sum()), (X,)
def exits0():
    import sys
    sys.exit(0)
def exits3():
    import sys
    sys.exit(3)
def exits_in_trace():
    def f(x):
        import sys
        sys.exit(3)
    return f, (X,)
"""

FACTORY_CASES = {
    "five": ["(fn, args_tuple)", "int 5", "(x,)"],
    "only_fn": ["(fn, args_tuple)", "function"],
    "first_not_callable": ["callable fn", "int 5"],
    "three_items": ["3 items"],
    "raises": ["no weights here"],
    "fails_in_trace": ["boom inside"],
    "no_such_factory": ["no callable 'no_such_factory'", "good"],
    # A sys.exit in the user's code is a bad model (exit 2), never the process's exit:
    # 0 would pass for success, 3 for OOM.
    "exits0": ["failed", "sys.exit(0)", "(fn, args_tuple)"],
    "exits3": ["failed", "sys.exit(3)"],
    "exits_in_trace": ["Tracing", "sys.exit(3)"],
}

# Model files whose import fails: as a file (file.py:f) and as a module (module:f).
MODULE_FILES = {
    "sys.exit(0)": ("import sys\nsys.exit(0)\n", ["sys.exit(0)", "imported", "__main__"]),
    "sys.exit(3)": ("import sys\nsys.exit(3)\n", ["sys.exit(3)", "imported"]),
    "KeyError": ("raise KeyError('weights')\n", ["KeyError", "weights", "line 1"]),
}


@pytest.mark.parametrize("form", ["file", "module"])
@pytest.mark.parametrize("case", list(MODULE_FILES))
def test_model_files_that_fail_on_import(capsys, tmp_path, monkeypatch, case, form):
    text, says = MODULE_FILES[case]
    name = "failing_model_" + "".join(c for c in case if c.isalnum())
    (tmp_path / f"{name}.py").write_text(text)
    if form == "file":
        spec = f"{tmp_path / name}.py:f"
    else:
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, name, raising=False)
        spec = f"{name}:f"
    out, _ = run(capsys, "graph", spec, says=["Importing", name, *says])
    assert out == ""


@pytest.mark.parametrize("factory", list(FACTORY_CASES))
def test_bad_model_factories(capsys, tmp_path, factory):
    path = tmp_path / "models.py"
    path.write_text(FACTORIES)
    run(capsys, "graph", f"{path}:{factory}", says=FACTORY_CASES[factory])


def test_good_factory_still_traces(capsys, tmp_path):
    path = tmp_path / "models.py"
    path.write_text(FACTORIES)
    out, err = run(capsys, "graph", f"{path}:good", code=0, says=["tanh"])
    assert "tracing" in err  # progress on stderr, results on stdout


@pytest.mark.parametrize("model,says", [
    ("resnet5", "resnet50"), ("no_file.py:f", "does not exist"),
    ("models.py", "models.py:FACTORY"), ("pkg_that_is_not_there:f", "Cannot import"),
    ("justtext:", "file.py:factory")])
def test_unknown_models(capsys, tmp_path, monkeypatch, model, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models.py").write_text(FACTORIES)
    run(capsys, "graph", model, says=[says])


@pytest.mark.parametrize("argv,says", [
    (["optimize", "--cost-model", MACHINE, "--method", "nosuch"], ["nosuch", "heft"]),
    (["optimize", "--cost-model", MACHINE, "--method", "heft", "--episodes", "8"],
     ["rl-*"]),
    (["simulate", "--cost-model", MACHINE, "--single", "tpu:9"], ["tpu:9", "gpu:0"]),
    (["simulate", "--cost-model", MACHINE, "--single", "3"], ["'3'", "0..2"]),
    (["simulate", "--cost-model", MACHINE], ["--placement", "--single"]),
    (["parallelize", "--cost-model", MACHINE, "--devices", "2", "--method", "magic"],
     ["magic"]),
])
def test_unknown_methods_and_devices(capsys, files, argv, says):
    run(capsys, argv[0], files["graph"], *argv[1:], says=says)


@pytest.mark.parametrize("argv,says", [
    (["simulate", "{g}", "--cost-model", MACHINE, "--placement", ""], ["path is empty"]),
    (["simulate", "{g}", "--cost-model", MACHINE, "--single", "0", "--out", ""],
     ["--out is empty"]),
    (["graph", "{g}", "--out", "{root}/g.txt"], ["must end in .json"]),
    (["graph", "", "--small"], ["Unknown model ''"]),
    (["graph", "{g}", "--inference"], ["saved graph", "--inference"]),
    (["simulate", "{g}", "--cost-model", MACHINE, "--single", "0", "--batch", "8"],
     ["saved graph", "--batch"]),
])
def test_empty_and_unloadable_names(capsys, files, argv, says):
    argv = [a.format(g=files["graph"], root=files["root"]) for a in argv]
    out, _ = run(capsys, *argv, says=says)
    assert out == ""


def test_an_empty_checkpoint_is_refused_before_the_work(capsys, files, tmp_path):
    empty = tmp_path / "ck.npz"
    empty.write_bytes(b"")
    out, _ = run(capsys, "optimize", files["graph"], "--cost-model", MACHINE, "--method",
                 "rl-gnn", "--checkpoint", empty, says=[str(empty), "empty file"])
    assert out == "" and empty.read_bytes() == b""
    junk = tmp_path / "junk.npz"
    junk.write_text("not a checkpoint\n")
    run(capsys, "optimize", files["graph"], "--cost-model", MACHINE, "--method", "rl-gnn",
        "--checkpoint", junk, says=[str(junk), "not a simplace RL checkpoint"])


def test_unknown_command_and_option(capsys):
    run(capsys, "place", "mlp", says=["invalid choice"])
    run(capsys, "graph", "mlp", "--smallest", says=["--smallest"])


# ---------------------------------------------------------------------------- the Python API
@pytest.fixture(scope="module")
def api(files):
    """What the API cases call with: the saved graph and MACHINE."""
    return {"g": simplace.OpGraph.load(files["graph"]), "cm": simplace.CostModel.load(MACHINE),
            "hash": files["hash"]}


def _graph(**change):
    fields = dict(op=["a", "b"], name_path=["x", "y"], flops=[1.0, 2.0],
                  bytes_accessed=[1.0, 1.0], out_bytes=[1.0, 1.0], signature=["s", "t"],
                  src=[0], dst=[1], edge_bytes=[1.0])
    return simplace.OpGraph(**{**fields, **change})


def _placement(api, **change):
    fields = dict(assignment=np.zeros(api["g"].num_ops, np.int32), graph_hash=api["hash"],
                  cost_model=MACHINE, device_names=("cpu:0", "gpu:0", "gpu:1"))
    return Placement(**{**fields, **change})


NAN = float("nan")
SEED = "seed must be an integer seed in 0..4294967295"
BUDGET = "budget_s must be a finite number of seconds > 0 and <= 604800"
# name: (call, the messages it says); every call raises a SimplaceError (a ValueError)
# before any work, in the words the command line uses for the same number.
API_CASES = {
    "optimize budget_s '10'": (lambda a: simplace.optimize(a["g"], a["cm"], "heft",
                                                             budget_s="10"), [BUDGET, "'10'"]),
    "optimize budget_s True": (lambda a: simplace.optimize(a["g"], a["cm"], "local",
                                                             budget_s=True), [BUDGET, "True"]),
    "optimize budget_s 1e12": (lambda a: simplace.optimize(a["g"], a["cm"], "local",
                                                             budget_s=1e12), [BUDGET]),
    "optimize budget_s inf": (lambda a: simplace.optimize(a["g"], a["cm"], "local",
                                                            budget_s=float("inf")), [BUDGET]),
    "optimize seed -5": (lambda a: simplace.optimize(a["g"], a["cm"], seed=-5), [SEED, "-5"]),
    "optimize seed 'x'": (lambda a: simplace.optimize(a["g"], a["cm"], seed="x"), [SEED]),
    "optimize seed 2**70": (lambda a: simplace.optimize(a["g"], a["cm"], seed=2**70), [SEED]),
    "optimize seed 1.5": (lambda a: simplace.optimize(a["g"], a["cm"], seed=1.5), [SEED]),
    "optimize seed True": (lambda a: simplace.optimize(a["g"], a["cm"], seed=True), [SEED]),
    "optimize episodes nan": (lambda a: simplace.optimize(a["g"], a["cm"], "rl-gnn",
                                                            episodes=NAN),
                              ["'episodes' must be an integer", "nan"]),
    "optimize samples True": (lambda a: simplace.optimize(a["g"], a["cm"], "rl-gnn",
                                                            samples=True),
                              ["'samples' must be an integer in 1..8192"]),
    "optimize lr nan": (lambda a: simplace.optimize(a["g"], a["cm"], "rl-gnn", lr=NAN),
                        ["'lr' must be a finite number"]),
    "optimize local patience 2.5": (lambda a: simplace.optimize(a["g"], a["cm"], "local",
                                                                  patience=2.5),
                                    ["'local'", "'patience' must be an integer", "2.5"]),
    "optimize local race True": (lambda a: simplace.optimize(a["g"], a["cm"], "local",
                                                               race=True),
                                 ["'local'", "'race' must be an integer"]),
    "optimize local t0 nan": (lambda a: simplace.optimize(a["g"], a["cm"], "local", t0=NAN),
                              ["'local'", "'t0' must be a finite number > 0"]),
    "optimize local screen 1": (lambda a: simplace.optimize(a["g"], a["cm"], "local",
                                                              screen=1),
                                ["'screen' must be 'auto', True or False"]),
    "optimize graph str": (lambda a: simplace.optimize("mlp", a["cm"]),
                           ["graph must be an OpGraph"]),
    "optimize cost_model str": (lambda a: simplace.optimize(a["g"], MACHINE),
                                ["cost_model must be a CostModel", "CostModel.load"]),
    "optimize method 5": (lambda a: simplace.optimize(a["g"], a["cm"], 5),
                          ["method must be a method name"]),
    "compare budget_s -5": (lambda a: simplace.compare(a["g"], a["cm"], budget_s=-5),
                            [BUDGET, "-5"]),
    "compare budget_s nan": (lambda a: simplace.compare(a["g"], a["cm"], budget_s=NAN),
                             [BUDGET, "nan"]),
    "compare no methods": (lambda a: simplace.compare(a["g"], a["cm"], []),
                           ["non-empty list of method names"]),
    "OpGraph flops 'many'": (lambda a: _graph(flops=["many", 1.0]),
                             ["'flops'", "entry 0 is 'many'"]),
    "OpGraph flops True": (lambda a: _graph(flops=[True, 1.0]), ["'flops'", "True"]),
    "OpGraph flops 1e308": (lambda a: _graph(flops=[1e308, 1.0]), ["'flops'", "at most"]),
    "OpGraph dst 1 + 2**32": (lambda a: _graph(dst=[1 + 2**32]), ["'dst'", "int32"]),
    "OpGraph dst int64 array": (lambda a: _graph(dst=np.array([1 + 2**32])), ["int32"]),
    "CostModel.load None": (lambda a: simplace.CostModel.load(None),
                            ["cost-model name or the path", "None"]),
    "CostModel.load 123": (lambda a: simplace.CostModel.load(123), ["123"]),
    "CostModel.load dir 5": (lambda a: simplace.CostModel.load(MACHINE, 5),
                             ["cost_model_dir must be a folder"]),
    "CostModel.synthetic 100000": (lambda a: simplace.CostModel.synthetic(100000),
                                   ["num_devices", "1..1024", "100000"]),
    "CostModel.synthetic 2.5": (lambda a: simplace.CostModel.synthetic(2.5), ["2.5"]),
    "CostModel.synthetic True": (lambda a: simplace.CostModel.synthetic(True), ["True"]),
    "CostModel.synthetic seed -1": (lambda a: simplace.CostModel.synthetic(3, seed=-1),
                                    [SEED]),
    "groups.expand group -1": (lambda a: groups.expand([0, -1], [0, 1]),
                               ["groups entry 1 is -1", "integer >= 0"]),
    "groups.expand device 1.7": (lambda a: groups.expand([0, 1], [0, 1.7]),
                                 ["group_placement entry 1 is 1.7"]),
    "groups.expand device True": (lambda a: groups.expand([0, 1], [True, False]),
                                  ["group_placement entry 0 is True"]),
    "groups.target_count 0": (lambda a: groups.target_count(a["g"], 0),
                              ["num_groups must be an integer >= 1"]),
    "groups.target_count 2.5": (lambda a: groups.target_count(a["g"], 2.5), ["2.5"]),
    "Placement time nan": (lambda a: _placement(a, predicted_step_time_s=NAN),
                           ["predicted_step_time_s", "finite"]),
    "Placement oom 'yes'": (lambda a: _placement(a, oom="yes"), ["oom", "True or False"]),
    "Placement device_names str": (lambda a: _placement(a, device_names="gpu:0"),
                                   ["device_names"]),
    "validate placements []": (lambda a: simplace.validate(a["g"], a["cm"], []),
                               ["at least one placement"]),
    "parallelize devices 10**9": (lambda a: simplace.parallelize(a["g"], a["cm"], 10**9),
                                  ["devices must be an integer >= 1 and at most 4096"]),
    "parallelize devices True": (lambda a: simplace.parallelize(a["g"], a["cm"], True),
                                 ["devices must be an integer"]),
    "load_graph batch 2**63": (lambda a: load_graph("mlp", batch=2**63, small=True),
                               ["batch must be a batch size in 1..2147483647"]),
}


@pytest.mark.parametrize("case", list(API_CASES))
def test_python_api_checks_its_arguments(api, case):
    call, says = API_CASES[case]
    with pytest.raises(simplace.SimplaceError) as err:
        call(api)
    for s in says:
        assert s in str(err.value), f"{s!r} not in {err.value}"


def test_huge_group_counts_answer_at_once(api):
    # More groups than ops asks for no merging: every op its own group, at once (a billion
    # used to build a billion cut targets).
    t0 = time.perf_counter()
    got = groups.target_count(api["g"], 10**9)
    assert time.perf_counter() - t0 < 1.0
    assert len(set(got.tolist())) == api["g"].num_ops


# ---------------------------------------------------------------------------- OOM
def test_simulate_oom_exits_3_and_marks_the_file(capsys, files, tmp_path):
    out_path = tmp_path / "p.json"
    out, err = run(capsys, "simulate", files["graph"], "--cost-model", files["tiny"],
                   "--single", "0", "--out", out_path, code=EXIT_OOM,
                   says=["OUT OF MEMORY", "OOM"])
    assert json.loads(out_path.read_text())["oom"] is True
    assert Placement.load(out_path).oom
    # A model that fits no device: the fastest single device is OOM too.
    run(capsys, "simulate", files["graph"], "--cost-model", files["tiny"], "--single",
        "fastest", code=EXIT_OOM, says=["OOM on", "more memory"])


def test_optimize_oom_exits_3_and_marks_the_file(capsys, files, tmp_path):
    out_path = tmp_path / "p.json"
    run(capsys, "optimize", files["graph"], "--cost-model", files["tiny"], "--method", "heft",
        "--out", out_path, code=EXIT_OOM, says=["OOM"])
    assert json.loads(out_path.read_text())["oom"] is True


def test_a_fitting_placement_is_not_marked(capsys, files, tmp_path):
    out_path = tmp_path / "p.json"
    run(capsys, "optimize", files["graph"], "--cost-model", MACHINE, "--method", "heft",
        "--out", out_path, code=0)
    assert json.loads(out_path.read_text())["oom"] is False


# ---------------------------------------------------------------------------- files people keep
def test_placement_files_are_compact_and_old_files_load(files, tmp_path):
    text = files["placement"].read_text()
    lines = text.splitlines()
    assignment_lines = [ln for ln in lines if '"assignment"' in ln]
    assert len(assignment_lines) == 1 and len(lines) < 20  # one line, not one per op
    d = json.loads(text)
    assert d["device_names"] == ["cpu:0", "gpu:0", "gpu:1"] and d["method"] == "test"
    old = tmp_path / "old.json"  # the earlier format: one index per line
    d.pop("oom")
    old.write_text(json.dumps(d, indent=1))
    assert len(old.read_text().splitlines()) > files["num_ops"]
    p = Placement.load(old)
    assert p.assignment.tolist() == Placement.load(files["placement"]).assignment.tolist()
    assert p.oom is False


# ------------------------------------------------------------ version, help, progress
def test_version_and_exit_codes_in_help(capsys):
    run(capsys, "--version", code=0, says=[f"simplace {simplace.__version__}"])
    out, _ = run(capsys, "--help", code=0, says=["exit codes", "130"])
    assert "OOM" in out


def test_models_count_shows_progress(capsys, monkeypatch):
    monkeypatch.setattr(zoo, "names", lambda: ["mlp", "tiny_cnn"])
    out, err = run(capsys, "models", "--count", "--small", code=0)
    assert "[1/2] tracing mlp..." in err and "[2/2] tracing tiny_cnn..." in err
    assert "ops," in err and "mlp" in out


# ---------------------------------------------------------------------------- the real command
def _simplace(*argv, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH",
                                                                            ""))
    return subprocess.run([sys.executable, "-m", "simplace", *map(str, argv)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


def test_oom_exit_code_of_the_real_command(files, tmp_path):
    proc = _simplace("simulate", files["graph"], "--cost-model", files["tiny"], "--single", "0",
                     cwd=tmp_path)
    assert proc.returncode == 3 and "OOM" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_version_and_usage_exit_codes_of_the_real_command(files, tmp_path):
    proc = _simplace("--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("simplace ")
    proc = _simplace("optimize", files["graph"], "--cost-model", MACHINE, "--seed", "-5",
                     cwd=tmp_path)
    assert proc.returncode == 2 and "--seed" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_unwritable_out_through_the_real_command(files, tmp_path):
    bad = tmp_path / "missing" / "p.json"
    proc = _simplace("optimize", files["graph"], "--cost-model", MACHINE, "--method", "heft",
                     "--out", bad, cwd=tmp_path)
    assert proc.returncode == 2 and str(bad) in proc.stderr and proc.stdout == ""
    assert "Traceback" not in proc.stderr


def test_a_sigterm_lost_in_a_finalizer_still_stops_the_command(monkeypatch, capsys):
    # The handler's KeyboardInterrupt raised inside __del__ goes to sys.unraisablehook
    # and is dropped; main keeps its "Exception ignored" report off the screen,
    # `simplace models` notices the signal at its next model and exits 130, and main
    # leaves no flag, handler or hook behind.
    import gc
    import signal

    from simplace import cli, zoo

    class Finalized:
        def __del__(self):
            # To this thread (os.kill may go to another, and the handler then run after
            # __del__ returned); the handler runs between bytecodes, in this loop.
            signal.raise_signal(signal.SIGTERM)
            for _ in range(10**7):
                if cli._TERMINATED[0]:
                    break

    names = []
    real_info = zoo.info

    def info(name):
        if not names:
            Finalized()  # collected at once: the signal lands in its __del__
            gc.collect()
        names.append(name)
        return real_info(name)

    monkeypatch.setattr(zoo, "info", info)
    lost = []

    def hook(u):
        lost.append(u.exc_type)

    monkeypatch.setattr(sys, "unraisablehook", hook)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    assert cli.main(["models"]) == 130
    # The interrupt was dropped in __del__ (had it reached info(), names would be empty),
    # not reported as "Exception ignored"...
    assert lost == []
    assert len(names) == 1  # ...and the command stopped before the second model
    err = capsys.readouterr().err
    assert err.rstrip().endswith("interrupted") and "Exception ignored" not in err
    assert cli._TERMINATED == [False] and sys.unraisablehook is hook
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.slow
def test_sigterm_exits_130(tmp_path):
    import signal

    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH",
                                                                            ""))
    proc = subprocess.Popen([sys.executable, "-m", "simplace", "models", "--count"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        seen = ""
        while "[2/" not in seen:  # tracing has started: full sizes take minutes in all
            ch = proc.stderr.read(1)
            assert ch, f"ended early: {seen}"
            seen += ch
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        rest = proc.stderr.read()
        # (failed once in a full slow run under load, not since: say what happened)
        assert code == 130, f"exit {code}; stderr: {seen + rest}"
        assert "interrupted" in rest and "Traceback" not in seen + rest, seen + rest
    finally:
        proc.kill()

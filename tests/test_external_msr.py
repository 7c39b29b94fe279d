"""simplace.external.msr: the msr instances, their rulers, splits and bad files."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from simplace.external import ExternalFormatError, load_instance, msr

DATA = Path(__file__).resolve().parent.parent / "bench" / "data" / "external" / "msr"
BASELINES = DATA / "baselines.json"
MS = msr.FILE_TIME_UNIT_S


def diamond(**over):
    """a -> b -> d, a -> c -> d; costs a 0.5, b 0.25, c 0.125 (file units, ms)."""
    doc = {
        "maxSizePerFPGA": 100.0, "maxFPGAs": 2, "maxCPUs": 1,
        "nodes": [
            {"id": 0, "name": "a", "supportedOnFpga": True, "cpuLatency": 10.0,
             "fpgaLatency": 1.0, "isBackwardNode": False, "size": 60.0},
            {"id": 1, "name": "b", "supportedOnFpga": 1, "cpuLatency": 20.0,
             "fpgaLatency": 2.0, "isBackwardNode": 0, "size": 50.0},
            {"id": 2, "name": "c", "supportedOnFpga": True, "cpuLatency": 2.0,
             "fpgaLatency": 3.0, "isBackwardNode": False, "size": 0.0},
            {"id": 3, "name": "d", "supportedOnFpga": True, "cpuLatency": 0.5,
             "fpgaLatency": 4.0, "isBackwardNode": False},
        ],
        "edges": [
            {"sourceId": 0, "destId": 1, "cost": 0.5},
            {"sourceId": 0, "destId": 2, "cost": 0.5},
            {"sourceId": 1, "destId": 3, "cost": 0.25},
            {"sourceId": 2, "destId": 3, "cost": 0.125},
        ],
    }
    doc.update(over)
    return doc


def write(tmp_path, doc, name="x.json", folder=None):
    d = tmp_path / folder if folder else tmp_path
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


def ms(ruler, placement):
    return float(ruler(np.asarray(placement)).step_time_s[0]) / MS


# --------------------------------------------------------------------- reading
def test_load_small(tmp_path):
    inst = msr.load(write(tmp_path, diamond()))
    g = inst.graph
    assert inst.fmt == "msr" and g.num_ops == 4
    assert inst.node_ids.tolist() == [0, 1, 2, 3]
    assert list(g.name_path) == ["a:0", "b:1", "c:2", "d:3"]
    assert sorted(zip(g.src.tolist(), g.dst.tolist(), strict=True)) == [
        (0, 1), (0, 2), (1, 3), (2, 3)]
    np.testing.assert_allclose(g.edge_bytes, np.array([0.5, 0.5, 0.25, 0.125]) * MS *
                               msr.TRANSFER_BANDWIDTH_BYTES_PER_S)
    # sizes are parameters of their ops, so simplace's memory check holds them
    assert g.param_op.tolist() == [0, 1] and g.param_sizes.tolist() == [60.0, 50.0]
    assert inst.colocation.tolist() == [-1, -1, -1, -1]
    assert [d.kind for d in inst.cost_model.devices] == ["cpu", "gpu", "gpu"]
    assert inst.cost_model.memory_bytes[1:].tolist() == [100.0, 100.0]
    assert inst.default_objective == "throughput"
    assert inst.cost_model.objective is inst.rulers["throughput"]
    assert set(inst.rulers) == {"throughput", "latency"}
    assert load_instance(write(tmp_path, diamond()), "msr").graph.num_ops == 4


def test_default_objective_by_folder_and_devices(tmp_path):
    lat = msr.load(write(tmp_path, diamond(), folder="latency-inputs/G"))
    thr = msr.load(write(tmp_path, diamond(), folder="throughput-inputs/G"))
    assert lat.default_objective == "latency" and thr.default_objective == "throughput"
    assert lat.cost_model.objective is lat.rulers["latency"]
    four = msr.load(write(tmp_path, diamond()), devices=4)
    assert four.cost_model.num_devices == 5 and four.info["accelerators"] == 4
    with pytest.raises(ExternalFormatError, match="devices"):
        msr.load(write(tmp_path, diamond()), devices=-1)


def test_ids_sorted_and_reordered_when_not_topological(tmp_path):
    doc = diamond()
    # ids: a=30, b=10, c=20, d=5: id order is not topological
    for n, new in zip(doc["nodes"], (30, 10, 20, 5), strict=True):
        n["id"] = new
    remap = {0: 30, 1: 10, 2: 20, 3: 5}
    for e in doc["edges"]:
        e["sourceId"], e["destId"] = remap[e["sourceId"]], remap[e["destId"]]
    doc["edges"].append(dict(doc["edges"][0]))  # a repeated edge is kept once
    doc["nodes"].reverse()
    inst = msr.load(write(tmp_path, doc))
    assert inst.info["reordered"] and inst.info["duplicate_edges"] == 1
    assert inst.node_ids.tolist() == [30, 10, 20, 5]
    assert inst.graph.num_edges == 4
    base = msr.load(write(tmp_path, diamond(), name="y.json"))
    for obj in ("throughput", "latency"):
        assert ms(inst.rulers[obj], [1, 1, 2, 0]) == ms(base.rulers[obj], [1, 1, 2, 0])


def test_unsupported_node_costs_large_on_accelerator(tmp_path):
    doc = diamond()
    doc["nodes"][2]["supportedOnFpga"] = False
    inst = msr.load(write(tmp_path, doc))
    gpu = inst.cost_model.profile.op_time_s["gpu"]
    assert gpu[2] == msr.UNSUPPORTED_S and gpu[0] == pytest.approx(1.0 * MS)


# --------------------------------------------------------------------- max-load
def test_max_load_by_hand(tmp_path):
    r = msr.load(write(tmp_path, diamond())).rulers["throughput"]
    # a,b on 1; c on 2; d on CPU. Device 1: 1 + 2 + a's 0.5 (to c) + b's 0.25 (to d);
    # device 2: 3 + a's 0.5 coming in + c's 0.125 going out; the CPU pays nothing.
    assert ms(r, [1, 1, 2, 0]) == pytest.approx(3.75)
    # a's output goes to two other devices (2 and the CPU): one cost on its own device,
    # one on device 2, none on the CPU. Device 2: 2 + 0.5 + 0.25 = 2.75; CPU 2.5.
    assert ms(r, [1, 2, 0, 0]) == pytest.approx(2.75)
    assert ms(r, [0, 0, 0, 0]) == pytest.approx(32.5)
    assert ms(r, [1, 1, 1, 1]) == pytest.approx(10.0)
    res = r(np.array([[1, 2, 0, 0]]))
    np.testing.assert_allclose(res.busy_s[0] / MS, [2.5, 1.0, 2.0])
    assert res.num_transfers[0] == 3  # a -> 2, a -> CPU, b -> CPU
    assert r.lower_bound_s() <= min(ms(r, p) for p in ([1, 2, 0, 0], [1, 1, 1, 1])) * MS


def test_colour_classes_projected(tmp_path):
    doc = diamond()
    doc["nodes"][1]["colorClass"] = 7
    doc["nodes"][3]["colorClass"] = 7
    inst = msr.load(write(tmp_path, doc))
    r = inst.rulers["throughput"]
    assert inst.colocation.tolist() == [-1, 0, -1, 0]
    assert r.project(np.array([1, 2, 0, 0])).tolist() == [1, 2, 0, 2]
    # d follows b to device 2: 2 + 4 + a's 0.5 + c's 0.125 (from the CPU) = 6.625
    assert ms(r, [1, 2, 0, 0]) == pytest.approx(6.625)


def test_memory_cap_and_unsupported_are_oom(tmp_path):
    inst = msr.load(write(tmp_path, diamond()))
    for r in inst.rulers.values():
        res = r(np.array([[1, 1, 0, 0], [1, 2, 0, 0]]))  # 60 + 50 > 100 on device 1
        assert res.oom.tolist() == [True, False]
        assert res.peak_memory_bytes[0].tolist() == [0.0, 110.0, 0.0]
        assert np.isfinite(res.step_time_s).all()  # their figure still, as their warning
    doc = diamond()
    doc["nodes"][2]["supportedOnFpga"] = False
    for r in msr.load(write(tmp_path, doc, name="u.json")).rulers.values():
        assert r(np.array([[1, 2, 2, 0], [1, 2, 0, 0]])).oom.tolist() == [True, False]
    no_cpu = msr.load(write(tmp_path, diamond(maxCPUs=0), name="n.json"))
    assert no_cpu.rulers["throughput"](np.array([[1, 2, 1, 0], [1, 2, 1, 2]])).oom.tolist() \
        == [True, False]


# --------------------------------------------------------------------- latency
def test_latency_by_hand(tmp_path):
    r = msr.load(write(tmp_path, diamond())).rulers["latency"]
    assert ms(r, [1, 1, 1, 1]) == pytest.approx(10.0)
    assert ms(r, [0, 0, 0, 0]) == pytest.approx(30.5)  # CPU nodes: 10 + 20 + 0.5
    # {a, b} on 1: 3 + a's 0.5 + b's 0.25 out = 3.75; c on 2 from 3.75: in 0.5 + 3 +
    # out 0.125 = 7.375; d on the CPU: 7.375 + 0.5
    assert ms(r, [1, 1, 2, 0]) == pytest.approx(7.875)


def test_latency_reworks_a_non_contiguous_split(tmp_path):
    r = msr.load(write(tmp_path, diamond())).rulers["latency"]
    # a and d on accelerator 1 with b between them on the CPU: two pieces {a}, {d}.
    # {a}: 1 + 0.5 out = 1.5; b: 1.5 + 20 = 21.5; c on 2: 1.5 + 0.5 + 3 + 0.125 =
    # 5.125; {d}: 21.5 + b's 0.25 + c's 0.125 in + 4 = 25.875
    assert ms(r, [1, 0, 2, 1]) == pytest.approx(25.875)
    assert r.lower_bound_s() <= 25.875 * MS


# ----------------------------------------------------------- slow references
def ref_max_load(inst, p):
    """computeLoadForResultOrg transcribed with dicts and sets."""
    r = inst.rulers["throughput"]
    lat, comm = {}, {}
    for i, d in enumerate(p):
        lat[d] = lat.get(d, 0.0) + (r.cpu_ms[i] if d == 0 else r.fpga_ms[i])
    to = {}
    for a, b in zip(r.src.tolist(), r.dst.tolist(), strict=True):
        if p[a] != p[b]:
            to.setdefault(a, set()).add(p[b])
    for a, groups in to.items():
        comm[p[a]] = comm.get(p[a], 0.0) + r.out_cost_ms[a]
        for g in groups:
            comm[g] = comm.get(g, 0.0) + r.out_cost_ms[a]
    return max(v + (comm.get(g, 0.0) if g else 0.0) for g, v in lat.items())


def ref_latency(inst, p):
    """greedy.cpp's reworkSplitIntoContiguous and computeLatency transcribed."""
    r = inst.rulers["latency"]
    m = r.num_ops
    inc = {v: [] for v in range(m)}
    out = {v: [] for v in range(m)}
    for a, b in zip(r.src.tolist(), r.dst.tolist(), strict=True):
        inc[b].append(a)
        out[a].append(b)
    pieces = []
    for d in range(1, r.num_devices):
        s = {v for v in range(m) if p[v] == d}
        dp = {}
        for v in range(m):  # ops are in a topological order
            dp[v] = max([1 if v in s else 0] + [dp[u] + (v in s and u not in s)
                                                 for u in inc[v]])
        for k in sorted({dp[v] for v in s}):
            pieces.append({v for v in s if dp[v] == k})
    piece_of = {v: ("cpu", v) for v in range(m) if p[v] == 0}
    for k, s in enumerate(pieces):
        piece_of.update({v: ("acc", k) for v in s})
    finish = {}
    done = set()
    while len(done) < m:
        before = len(done)
        for v in range(m):
            if v in done:
                continue
            key = piece_of[v]
            nodes = {v} if key[0] == "cpu" else pieces[key[1]]
            feeders = {u for w in nodes for u in inc[w] if u not in nodes}
            if not feeders <= done:
                continue
            ready = max([finish[u] for u in feeders], default=0.0)
            if key[0] == "cpu":
                t = ready + r.cpu_ms[v]
            else:
                t = (ready + sum(r.out_cost_ms[u] for u in feeders)
                     + sum(r.fpga_ms[w] for w in nodes)
                     + sum(r.out_cost_ms[w] for w in nodes if set(out[w]) - nodes))
            for w in nodes:
                finish[w] = t
            done |= nodes
        if len(done) == before:  # the pieces form a cycle: their program fails
            return math.inf
    return max(finish.values(), default=0.0)


def random_instance(tmp_path, seed, m=40, k=3):
    rng = np.random.default_rng(seed)
    nodes = [{"id": int(i), "supportedOnFpga": True,
              "cpuLatency": float(rng.uniform(1, 20)), "fpgaLatency": float(rng.uniform(0, 3)),
              "isBackwardNode": False, "size": float(rng.uniform(0, 10))} for i in range(m)]
    for n in nodes[::7]:
        n["colorClass"] = 1
    cost = rng.uniform(0, 2, size=m)
    edges = []
    for v in range(1, m):
        for u in rng.choice(v, size=min(v, int(rng.integers(1, 4))), replace=False):
            edges.append({"sourceId": int(u), "destId": v, "cost": float(cost[u])})
    doc = {"maxSizePerFPGA": 60.0, "maxFPGAs": k, "maxCPUs": 1, "nodes": nodes,
           "edges": edges}
    return msr.load(write(tmp_path, doc, name=f"r{seed}.json"))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rulers_match_transcriptions_and_batch_equals_one_by_one(tmp_path, seed):
    inst = random_instance(tmp_path, seed)
    rng = np.random.default_rng(seed)
    r0 = inst.rulers["throughput"]
    p = r0.project(rng.integers(0, r0.num_devices, size=(64, inst.graph.num_ops)))
    for obj, ref in (("throughput", ref_max_load), ("latency", ref_latency)):
        ruler = inst.rulers[obj]
        batch = ruler.evaluate(p)
        for b in range(p.shape[0]):
            one = ruler.evaluate(p[b:b + 1])
            for f in ("step_time_s", "oom", "busy_s", "peak_memory_bytes", "bytes_moved"):
                np.testing.assert_array_equal(getattr(one, f)[0], getattr(batch, f)[b])
            want = ref(inst, p[b].tolist())
            if math.isinf(want):  # their program stops: infeasible, a finite penalty here
                assert batch.oom[b]
                assert batch.step_time_s[b] / MS == ruler.infeasible_ms
                continue
            assert batch.step_time_s[b] / MS == pytest.approx(want, rel=1e-12)
        assert (batch.step_time_s >= ruler.lower_bound_s() * (1 - 1e-12)).all()


def test_simplace_simulators_take_the_ruler(tmp_path):
    from simplace.sim.batched import batched_simulator

    inst = msr.load(write(tmp_path, diamond()))
    p = np.array([[1, 1, 2, 0], [1, 2, 0, 0]], dtype=np.int32)
    got = batched_simulator(inst.graph, inst.cost_model)(p).step_time_s
    np.testing.assert_array_equal(got, inst.rulers["throughput"](p).step_time_s)


# --------------------------------------------------------------------- splits
def test_split_round_trip(tmp_path):
    inst = random_instance(tmp_path, 3)
    r = inst.rulers["throughput"]
    rng = np.random.default_rng(3)
    for _ in range(5):
        p = r.project(rng.integers(0, r.num_devices, size=inst.graph.num_ops))
        split = msr.to_split(inst, p)
        assert len(split["fpgas"]) == r.num_devices - 1
        assert json.loads(json.dumps(split)) == split
        np.testing.assert_array_equal(msr.from_split(inst, split), p)


def test_from_split_infers_from_colour_classes(tmp_path):
    doc = diamond()
    doc["nodes"][1]["colorClass"] = 7
    doc["nodes"][3]["colorClass"] = 7
    inst = msr.load(write(tmp_path, doc))
    split = {"cpus": [{"nodes": [2]}], "fpgas": [{"nodes": [0]}, {"nodes": [1]}]}
    assert msr.from_split(inst, split).tolist() == [1, 2, 0, 2]  # d follows b
    bad = [
        ({"cpus": [{"nodes": [2]}], "fpgas": [{"nodes": [1]}, {"nodes": []}]}, "no colour"),
        ({"cpus": [{"nodes": [2, 0]}], "fpgas": [{"nodes": [0, 1, 3]}]}, "twice"),
        ({"cpus": [{"nodes": [9]}], "fpgas": []}, "node 9 is not"),
        ({"cpus": [], "fpgas": [{"nodes": []}] * 3}, "3 accelerators"),
        ({"cpus": [{"nodes": [0, 1, 2, 3]}]}, "lists 'cpus' and 'fpgas'"),
        ({"cpus": [{"nodes": "0"}], "fpgas": []}, "list 'nodes'"),
    ]
    for split, match in bad:
        with pytest.raises(ExternalFormatError, match=match):
            msr.from_split(inst, split)
    doc["nodes"][2]["colorClass"] = 7  # b, c, d: c on the CPU and b on 2 leave d open
    inst = msr.load(write(tmp_path, doc, name="y.json"))
    with pytest.raises(ExternalFormatError, match="node 3 out .* devices \\[0, 2\\]"):
        msr.from_split(inst, split={"cpus": [{"nodes": [2]}],
                                    "fpgas": [{"nodes": [0]}, {"nodes": [1]}]})


# --------------------------------------------------------------------- bad files
def edit(fn):
    doc = diamond()
    fn(doc)
    return doc


BAD = {
    "truncated": ('{"maxSizePerFPGA": 1, "nodes": [', "not valid JSON"),
    "not an object": ("[1, 2]", "top level"),
    "no maxFPGAs": (edit(lambda d: d.pop("maxFPGAs")), "no field 'maxFPGAs'"),
    "no nodes": (edit(lambda d: d.pop("nodes")), "list 'nodes'"),
    "node without cpuLatency": (edit(lambda d: d["nodes"][2].pop("cpuLatency")),
                                "node 2 has no field 'cpuLatency'"),
    "node without id": (edit(lambda d: d["nodes"][1].pop("id")), r"nodes\[1\] has no field"),
    "string latency": (edit(lambda d: d["nodes"][1].update(fpgaLatency="3")),
                       "node 1: 'fpgaLatency' must be"),
    "bad flag": (edit(lambda d: d["nodes"][1].update(supportedOnFpga=2)), "true/false"),
    "negative latency": (edit(lambda d: d["nodes"][3].update(cpuLatency=-1.0)),
                         "node 3: 'cpuLatency' is -1.0"),
    "negative size": (edit(lambda d: d["nodes"][0].update(size=-5)), "node 0: 'size'"),
    "negative cost": (edit(lambda d: d["edges"][2].update(cost=-0.1)), r"edges\[2\]"),
    "nan latency": (edit(lambda d: d["nodes"][0].update(cpuLatency=math.nan)), "finite"),
    "unknown edge id": (edit(lambda d: d["edges"][1].update(destId=42)), "node 42 is not"),
    "edge without cost": (edit(lambda d: d["edges"][0].pop("cost")), "no field 'cost'"),
    "two costs": (edit(lambda d: d["edges"][1].update(cost=0.75)), "node 0 has two different"),
    "duplicate id": (edit(lambda d: d["nodes"][2].update(id=1)), "node id 1 appears twice"),
    "cycle": (edit(lambda d: d["edges"].append({"sourceId": 3, "destId": 0, "cost": 1.0})),
              "cycle"),
    "self loop": (edit(lambda d: d["edges"].append({"sourceId": 2, "destId": 2, "cost": 0.125})),
                  "cycle"),
    "too big, no CPU": (edit(lambda d: d.update(maxCPUs=0) or d["nodes"][0].update(size=500)),
                        "node 0 needs 500 bytes"),
    "unsupported, no CPU": (edit(lambda d: d.update(maxCPUs=0)
                                 or d["nodes"][1].update(supportedOnFpga=False)),
                            "node 1 is not supported"),
    "class too big, no CPU": (edit(lambda d: d.update(maxCPUs=0)
                                   or [n.update(colorClass=3) for n in d["nodes"][:2]]),
                              "colour class of nodes \\[0, 1\\] needs 110"),
    "nothing can run": (edit(lambda d: d.update(maxCPUs=0, maxFPGAs=0)), "nothing can run"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_files(tmp_path, case):
    doc, match = BAD[case]
    path = write(tmp_path, doc)
    with pytest.raises(ExternalFormatError, match=match) as err:
        msr.load(path)
    assert str(path) in str(err.value)


def test_missing_file_and_what_is_not_an_error(tmp_path):
    with pytest.raises(ExternalFormatError, match="no such file"):
        msr.load(tmp_path / "absent.json")
    # A node too big for every accelerator still runs on the CPU; a class too big too.
    doc = diamond()
    doc["nodes"][0]["size"] = 500.0
    inst = msr.load(write(tmp_path, doc))
    assert inst.rulers["throughput"](np.array([[1, 1, 1, 1], [0, 1, 1, 1]])).oom.tolist() == [
        True, False]


# ------------------------------------------------------------- their programs
def baseline_runs():
    if not BASELINES.exists():
        return []
    return json.loads(BASELINES.read_text())["runs"]


def run_id(run):
    return f"{run['instance']}:{run['program']}{run['option']}:{run['args'][-1:]}"


def _params():
    # Every run, the 2012-node instance included: each takes milliseconds.
    return [pytest.param(run, id=run_id(run)) for run in baseline_runs()
            if run["value"] is not None]


def tolerance(run):
    """Half a unit of the last digit their program printed."""
    v = run["value"]
    if run["program"] == "dp" and run["option"] in ("", "-pipeDream"):
        return 1e-9 * abs(v)  # the JSON's maxLoad, in full
    if run["option"] == "-computeLatency":
        return 0.0005 + 1e-9  # three decimals
    return 0.5 * 10 ** (math.floor(math.log10(abs(v))) - 5) if v else 1e-12  # 6 digits


def test_baselines_cover_every_instance():
    runs = baseline_runs()
    if not runs:
        pytest.skip("bench/data/external/msr/baselines.json not written yet")
    files = {p.relative_to(DATA).as_posix() for p in DATA.glob("*-inputs/*/*.json")}
    assert len(files) == 24  # 16 throughput and 8 latency instances
    assert {r["instance"] for r in runs} == files


@pytest.mark.parametrize("run", _params())
def test_agrees_with_their_programs(run):
    inst = msr.load(DATA / run["instance"], devices=run.get("accelerators"))
    objective = "latency" if run["program"] == "greedy" else "throughput"
    ruler = inst.rulers[objective]
    assert run["value"] >= ruler.lower_bound_s() / MS * (1 - 1e-9)
    if run["placement"] is None:  # -localSearch keeps no split
        return
    p = np.asarray(run["placement"])
    assert (ruler.project(p) == p).all()  # their splits keep the colour classes
    ours = float(ruler.evaluate(p[None]).step_time_s[0]) / MS
    if run.get("cpu_pieces", 1) > 1:
        # the DP loaded each CPU piece alone; the scorer sums them, so ours is no less
        assert ours >= run["value"] - tolerance(run)
    else:
        assert abs(ours - run["value"]) <= tolerance(run), (ours, run["printed"])
    assert msr.from_split(inst, msr.to_split(inst, p)).tolist() == p.tolist()

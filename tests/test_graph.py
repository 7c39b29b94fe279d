import json

import networkx as nx
import numpy as np
import pytest

from simplace import GraphError, OpGraph
from simplace.graph import split_name_path


def make(**over):
    fields = dict(
        op=["dot_general", "add", "tanh"], name_path=["M/Dense_0", "M/Dense_0", ""],
        flops=[100.0, 10.0, 10.0], bytes_accessed=[40.0, 30.0, 20.0], out_bytes=[8.0, 8.0, 8.0],
        signature=["s0", "s1", "s2"], src=[0, 1, 0], dst=[1, 2, 2], edge_bytes=[8.0, 8.0, 8.0],
        param_names=["w", "b"], param_sizes=[64.0, 8.0], param_op=[0, 1], param_index=[0, 1],
        is_output=[False, False, True], name="toy",
    )
    fields.update(over)
    return OpGraph(**fields)


def test_fields_are_immutable_arrays():
    g = make()
    assert g.num_ops == 3 and g.num_edges == 3 and g.num_params == 2
    assert g.src.dtype == np.int32 and g.flops.dtype == np.float64
    with pytest.raises(ValueError):
        g.flops[0] = 1.0
    with pytest.raises(AttributeError):
        g.name = "other"
    np.testing.assert_array_equal(g.param_bytes, [64.0, 8.0, 0.0])


@pytest.mark.parametrize("over, message", [
    (dict(flops=[1.0, 2.0]), "'flops' has length 2"),
    (dict(src=[0, 1]), "'dst' has length 3 but 'src' has 2"),
    (dict(flops=[1.0, -1.0, 0.0]), "'flops' must be finite and >= 0"),
    (dict(edge_bytes=[1.0, np.nan, 1.0]), "'edge_bytes' must be finite"),
    (dict(dst=[1, 2, 7]), "'dst' entry 2 is 7, not a valid op index"),
    (dict(src=[0, 2, 0], dst=[1, 1, 2]), "not in a topological order"),
    (dict(src=[0, 1, 2], dst=[1, 2, 1]), "cycle"),
    (dict(src=[0, 1, 1], dst=[1, 1, 2]), "self-loop"),
    (dict(src=[0, 0, 1], dst=[1, 1, 2]), "Duplicate edges"),
    (dict(param_index=[0, 5]), "'param_index' entry 1 is 5"),
    (dict(param_sizes=[1.0]), "'param_sizes' has 1 entries"),
])
def test_validation_errors_say_what_is_wrong(over, message):
    with pytest.raises(GraphError, match=message):
        make(**over)


def test_cycle_error_names_the_cycle():
    with pytest.raises(GraphError, match=r"0 \(dot_general\) -> 1 \(add\) -> 2 \(tanh\) -> 0"):
        make(src=[0, 1, 2], dst=[1, 2, 0])


def test_from_unordered_sorts_topologically_and_remaps():
    g = OpGraph.from_unordered(
        op=["c", "a", "b"], name_path=["", "", ""], flops=[3, 1, 2], bytes_accessed=[0, 0, 0],
        out_bytes=[0, 0, 0], signature=["c", "a", "b"], src=[1, 2], dst=[2, 0],
        edge_bytes=[1, 2], param_names=["w"], param_sizes=[4], param_op=[0], param_index=[0])
    assert g.op.tolist() == ["a", "b", "c"]
    assert g.src.tolist() == [0, 1] and g.dst.tolist() == [1, 2]
    assert g.param_bytes.tolist() == [0, 0, 4]
    assert g.meta["original_index"] == [1, 2, 0]


def test_reordered_renumbers_ops_edges_and_parameters():
    # 0 -> 1 -> 3 and 0 -> 2 -> 3: ops 1 and 2 may run in either order.
    g = OpGraph(op=["a", "b", "c", "d"], name_path=[""] * 4, flops=[1.0, 2.0, 3.0, 4.0],
                bytes_accessed=[0.0] * 4, out_bytes=[10.0, 20.0, 30.0, 40.0],
                signature=["a", "b", "c", "d"], src=[0, 0, 1, 2], dst=[1, 2, 3, 3],
                edge_bytes=[5.0, 6.0, 7.0, 8.0], param_names=["w"], param_sizes=[4.0],
                param_op=[1], param_index=[0], is_output=[False, False, False, True])
    h = g.reordered([0, 2, 1, 3])
    assert h.op.tolist() == ["a", "c", "b", "d"]
    assert h.flops.tolist() == [1.0, 3.0, 2.0, 4.0]
    assert h.meta["original_index"] == [0, 2, 1, 3]
    # Every edge keeps its tensor: (original src, original dst) -> bytes.
    back = np.asarray(h.meta["original_index"])
    assert {(int(back[s]), int(back[d])): b for s, d, b in
            zip(h.src, h.dst, h.edge_bytes, strict=True)} == \
        {(int(s), int(d)): b for s, d, b in zip(g.src, g.dst, g.edge_bytes, strict=True)}
    assert h.param_bytes.tolist() == [0.0, 0.0, 4.0, 0.0]  # op "b" reads w
    assert g.reordered(np.arange(4)).hash == g.hash
    with pytest.raises(GraphError, match="reads: give a topological order"):
        g.reordered([0, 3, 1, 2])
    with pytest.raises(GraphError, match="exactly once"):
        g.reordered([0, 1, 1, 3])


def test_json_round_trip_keeps_hash(tmp_path):
    g = make()
    path = tmp_path / "g.json"
    g.save(path)
    h = OpGraph.load(path)
    assert h.hash == g.hash
    for f in ("op", "name_path", "flops", "src", "dst", "edge_bytes", "edge_output",
              "param_sizes", "param_op", "is_output"):
        np.testing.assert_array_equal(getattr(h, f), getattr(g, f))
    assert h.name == "toy"


def test_hash_depends_on_content_not_name():
    assert make().hash == make(name="renamed", meta={"x": 1}).hash
    assert make().hash != make(flops=[100.0, 10.0, 11.0]).hash
    assert make().hash != make(name_path=["M/Dense_1", "M/Dense_0", ""]).hash


def test_edited_file_is_refused_with_a_way_out(tmp_path):
    path = tmp_path / "g.json"
    make().save(path)
    d = json.loads(path.read_text())
    d["ops"]["flops"][0] = 5.0
    path.write_text(json.dumps(d))
    with pytest.raises(GraphError, match="delete the 'hash' field"):
        OpGraph.load(path)
    del d["hash"]
    path.write_text(json.dumps(d))
    assert OpGraph.load(path).flops[0] == 5.0


@pytest.mark.parametrize("content, message", [
    ("not json", "not valid JSON"),
    ('{"schema": "other"}', "not a simplace op graph"),
    ('{"schema": "simplace.opgraph", "schema_version": 99}', "schema_version 99"),
    ('{"schema": "simplace.opgraph", "schema_version": 2, "ops": {}}', "'ops.op' is missing"),
    ('{"schema": "simplace.opgraph", "schema_version": 1, "name": "m", "ops": {}}',
     r"schema_version 1 \(ops without their shapes and dtypes\).*`simplace graph MODEL --out "),
])
def test_bad_graph_files(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(GraphError, match=message):
        OpGraph.load(path)
    assert path.read_text() == content  # a failed load changes nothing


def test_missing_file():
    with pytest.raises(GraphError, match="does not exist"):
        OpGraph.load("/nonexistent/graph.json")


def test_to_networkx():
    g = make()
    nxg = g.to_networkx()
    assert nx.is_directed_acyclic_graph(nxg)
    assert nxg.number_of_nodes() == 3 and nxg.number_of_edges() == 3
    assert nxg.nodes[0]["param_bytes"] == 64.0 and nxg.nodes[1]["op"] == "add"
    assert nxg[0][2]["bytes"] == 8.0


def test_corner_cases_empty_and_single():
    empty = OpGraph(op=[], name_path=[], flops=[], bytes_accessed=[], out_bytes=[],
                    signature=[], src=[], dst=[], edge_bytes=[])
    assert empty.num_ops == 0 and "ops 0" in empty.summary()
    one = OpGraph(op=["add"], name_path=[""], flops=[1], bytes_accessed=[1], out_bytes=[1],
                  signature=["add"], src=[], dst=[], edge_bytes=[])
    assert one.predecessors(0).size == 0 and one.successors(0).size == 0


def test_summary_and_adjacency():
    g = make()
    s = g.summary()
    assert "ops 3" in s and "edges 3" in s and "dot_general 1" in s
    assert g.predecessors(2).tolist() == [0, 1]
    assert g.successors(0).tolist() == [1, 2]


def test_split_name_path():
    assert split_name_path("backward/ResNet/stage1") == (True, ("ResNet", "stage1"))
    assert split_name_path("ResNet/stage1") == (False, ("ResNet", "stage1"))
    assert split_name_path("") == (False, ())


@pytest.mark.parametrize("over,says", [
    ({"src": [0, 1.5, 0]}, "'src'.*1.5"),
    ({"dst": [1.0, 2.7, 2.0]}, "'dst'.*2.7"),
    ({"src": [False, True, False]}, "'src'.*integers"),
    ({"param_index": [0.0, 0.5]}, "'param_index'"),
    ({"is_output": ["no", "no", "yes"]}, "'is_output'.*booleans"),
    ({"is_output": [0, 0, 2]}, "'is_output'"),
])
def test_indices_and_flags_are_never_truncated(over, says):
    # numpy would turn 1.5 into 1 (a "duplicate edge"), True into op 1, "yes" into True.
    with pytest.raises(GraphError, match=says):
        make(**over)
    with pytest.raises(GraphError, match=says.split(".*")[0]):
        OpGraph.from_unordered(**{**make().to_dict()["ops"], **make().to_dict()["edges"],
                                  **make().to_dict()["params"], **over})


def test_whole_floats_and_0_1_flags_are_accepted():
    g = make(src=[0.0, 1.0, 0.0], is_output=[0, 0, 1])
    assert g.hash == make().hash

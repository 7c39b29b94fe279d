"""Typed method options (``simplace.placers.registry``): each option an ``Option`` with a
doc, a default and a parser; a wrong type is refused before the method runs, naming the
method, the option and what to pass; ``option_values`` fills in the defaults. Options
still declared by a plain string (untyped) are counted per method, and the count only
goes down."""

import dataclasses

import numpy as np
import pytest

import simplace
from simplace.errors import OptionError
from simplace.placers import register
from simplace.placers.registry import (
    _METHODS,
    Option,
    bool_option,
    check_options,
    choice_option,
    float_option,
    int_option,
    method,
    method_options,
    methods,
    option_values,
)

# Options declared by a plain string, per method: at most this many (issue 34: typed
# options for every method; none is left). Declare an option with a typed Option in the
# method's register(...) call (int_option, float_option, bool_option, choice_option, or
# Option(doc, default) for a value only the method can check).
UNTYPED_AT_MOST: dict[str, int] = {}


@pytest.mark.parametrize("name", methods())
def test_untyped_options_only_go_down(name):
    untyped = method(name).untyped
    most = UNTYPED_AT_MOST.get(name, 0)
    assert len(untyped) <= most, (
        f"{name}: options declared by a plain string {sorted(untyped)}: declare new "
        "options with a typed Option (simplace.placers.registry)")
    assert len(untyped) == most, (
        f"{name} has {len(untyped)} untyped options now: lower UNTYPED_AT_MOST[{name!r}]")


@pytest.mark.parametrize("name", methods())
def test_every_default_is_a_value_its_option_takes(name):
    entry = method(name)
    assert set(method_options(name)) == set(entry.options)
    for key, opt in entry.options.items():
        assert isinstance(opt, Option) and opt.doc, (name, key)
        if opt.default is not None:
            assert opt.check(name, key, opt.default) == opt.default, (name, key)


def test_option_values_fill_in_the_defaults():
    assert option_values("pipeline", {}) == {"rounds": 3, "positions": 128}
    assert option_values("pipeline", {"rounds": np.int64(5)}) == {"rounds": 5,
                                                                  "positions": 128}
    assert option_values("exact", {"batch": 8})["max_placements"] == 2**20
    assert option_values("expert", {"embed": "cpu"}) == {"embed": "cpu"}
    assert option_values("heft", {"fifo_links": np.bool_(True)})["fifo_links"] is True
    local = option_values("local", {"module_depths": np.array([2, 1])})
    assert local["module_depths"] == (2, 1) and local["screen"] == "auto"
    assert local["batch"] is None and local["validate_every"] == 0 and local["top_k"] == 5
    assert option_values("m_etf", {"units": [32, 0]})["units"] == (32, 0)
    rl = option_values("rl-gnn", {"samples": np.int64(8)})
    assert rl["samples"] == 8 and rl["lr"] == 3e-3 and rl["max_units"] == 1024
    assert rl["units"] == "auto" and rl["hidden"] is None
    assert option_values("rl-seq2seq", {})["max_units"] == 256
    assert option_values("rl-universal", {})["warm_start"] == "pretrained"


@pytest.mark.parametrize("name, options, says", [
    ("pipeline", {"rounds": "3"}, ["'pipeline'", "'rounds'", "integer >= 0", "'3'", "(3)"]),
    ("pipeline", {"positions": 0}, ["'positions'", "integer >= 1", "got 0"]),
    ("heft", {"fifo_links": "False"}, ["'heft'", "'fifo_links'", "True or False",
                                        "(False)"]),
    ("expert", {"embed": "tpu"}, ["'expert'", "'embed'", "'gpu', 'cpu'", "'tpu'"]),
    ("exact", {"batch": 0}, ["'exact'", "'batch'", "1..2147483647"]),
    ("exact", {"max_placements": 2.5}, ["'max_placements'", "2.5"]),
    ("local", {"screen": "yes"}, ["'local'", "'screen'", "'auto', True or False", "('auto')"]),
    ("local", {"module_depths": "12"}, ["'module_depths'", "list of integers >= 0"]),
    ("local", {"t0": 0.0}, ["'t0'", "> 0", "(0.01)"]),
    ("local", {"validate": 3}, ["'validate'", "callable"]),
    ("local", {"top_k": 0}, ["'top_k'", "integer >= 1", "(5)"]),
    ("heft", {"units": []}, ["'heft'", "'units'", "non-empty list of integers >= 0"]),
    ("m_etf", {"repasses": True}, ["'repasses'", "integer >= 0"]),
    ("m_topo", {"memory": "off"}, ["'memory'", "'auto', 'conservative', 'liveness'"]),
    ("m_sct", {"lp_max_edges": 1.5}, ["'m_sct'", "'lp_max_edges'", "(20000)"]),
    ("ideals", {"max_pairs": 0}, ["'ideals'", "'max_pairs'", "integer >= 1"]),
    ("rl-gnn", {"lr": "fast"}, ["'rl-gnn'", "'lr'", "must be a finite number", "(0.003)"]),
    ("rl-gnn", {"lr": 0.0}, ["'lr'", "RLConfig's check"]),
    ("rl-gnn", {"reward": "exp"}, ["'reward'", "neg, sqrt, log", "('sqrt')"]),
    ("rl-gnn", {"normalize": 1}, ["'normalize'", "True or False"]),
    ("rl-seq2seq", {"samples": 10_000}, ["'samples'", "1..8192"]),
    ("rl-seq2seq", {"units": "groups"}, ["'units'", "'auto', 'ops'"]),
    ("rl-hierarchical", {"validate_every": -1}, ["'validate_every'", "integer >= 0"]),
    ("rl-hierarchical", {"checkpoint": 5}, ["'checkpoint'", "file path"]),
    ("rl-gnn", {"layers": 1.5}, ["'layers'", "integer in 0.."]),
    ("rl-universal", {"polish_share": 1.0}, ["'polish_share'", "< 1", "(0.9)"]),
    ("rl-universal", {"samples": 1}, ["'samples'", "2..8192"]),
    ("rl-universal", {"guided_share": 1.5}, ["'guided_share'", "<= 1", "(0.8)"]),
    ("rl-pretrained", {"weights": 3}, ["'weights'", "file path"]),
])
def test_a_wrong_type_names_the_method_the_option_and_the_default(name, options, says):
    with pytest.raises(OptionError) as err:
        check_options(name, options)
    for s in says:
        assert s in str(err.value), f"{s!r} not in {err.value}"


def test_optimize_refuses_a_bad_value_before_running(mlp_graph, monkeypatch):
    ran = []
    entry = method("pipeline")
    monkeypatch.setitem(_METHODS, "pipeline", dataclasses.replace(
        entry, fn=lambda ctx: ran.append(1) or entry.fn(ctx)))
    cm = simplace.CostModel.synthetic(2, seed=0)
    with pytest.raises(OptionError, match="'rounds'"):
        simplace.optimize(mlp_graph, cm, "pipeline", rounds=-1)
    assert not ran
    res = simplace.optimize(mlp_graph, cm, "pipeline", rounds=1)
    assert ran and res.placement.shape == (mlp_graph.num_ops,)


def test_typed_option_makers():
    assert int_option("n", 2, 1, 3).check("m", "n", 3) == 3
    with pytest.raises(OptionError, match="in 1..3"):
        int_option("n", 2, 1, 3).check("m", "n", 4)
    assert float_option("x", 0.5, 0.0, 1.0).check("m", "x", 1) == 1.0
    with pytest.raises(OptionError, match="> 0"):
        float_option("x", 0.5, 0.0, lo_open=True).check("m", "x", 0.0)
    with pytest.raises(OptionError, match="True or False"):
        bool_option("b", False).check("m", "b", 1)
    with pytest.raises(OptionError, match="'a', 'b'"):
        choice_option("c", "a", "ab").check("m", "c", "z")
    anything = Option("any value")
    assert anything.check("m", "v", print) is print
    # None for an option whose default is None: the method decides
    assert int_option("n", None).check("m", "n", None) is None


def test_register_takes_typed_and_plain_string_options(monkeypatch):
    monkeypatch.setattr("simplace.placers.registry._METHODS", dict(_METHODS))
    from simplace.placers import registry

    @register("zz_typed", options={"n": int_option("count", 1, 1), "note": "free text"})
    def _zz(ctx):  # pragma: no cover - never run
        raise AssertionError

    entry = registry._METHODS["zz_typed"]
    assert entry.untyped == frozenset({"note"})
    assert registry.option_values("zz_typed", {"note": 3}) == {"n": 1, "note": 3}
    with pytest.raises(OptionError, match="'zz_typed'.*'n'.*integer >= 1"):
        registry.check_options("zz_typed", {"n": 0})

"""What ``simplace methods`` and ``CostModel.summary`` tell a newcomer: whole sentences,
and fitted figures never passed off as measurements."""

import re

import simplace
from simplace.cli import main
from simplace.placers import method_docs


def test_methods_prints_each_summary_whole(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    docs = method_docs()
    lines = out.splitlines()
    assert len(lines) == len(docs)
    for line, (name, doc) in zip(lines, docs.items(), strict=True):
        assert line.split()[0] == name and line.endswith(doc)
        # A whole sentence: ends with a full stop, no unclosed parenthesis.
        assert doc.endswith(".") and doc.count("(") == doc.count(")"), doc
    assert docs["metis"] != docs["scotch"]
    assert "METIS" in docs["metis"] and "Scotch" in docs["scotch"]
    # Descriptions start in one column, whatever the name's length.
    starts = {line.index(doc) for line, doc in zip(lines, docs.values(), strict=True)}
    assert len(starts) == 1


def _measured(edit=None):
    cm = simplace.CostModel.load("haswell_k40x2")
    d = cm.to_dict()
    d["provenance"] = {"source": "measured", "meta": {"fit_report": {"devices": {
        "gpu:0": {"rates": {"matmul": {"rate": d["devices"][1]["peak_flops_per_s"],
                                       "unit": "flop"},
                            "reduction": {"rate": d["devices"][1][
                                "memory_bandwidth_bytes_per_s"], "unit": "byte"}}}}}}}
    d["devices"][0]["overhead_s"] = 2.2e-8
    if edit:
        edit(d)
    return simplace.CostModel.from_dict(d)


def test_summary_marks_fitted_figures():
    text = _measured().summary()
    rows = {line.split()[0]: line for line in text.splitlines()[1:4]}
    assert "op 0.0 us" not in text and "op 0.022 us*" in rows["cpu:0"]
    # cpu:0 has no rate records: its rates were fitted; gpu:0's were benchmarked.
    assert re.search(r"\d\* TFLOP/s", rows["cpu:0"]) and re.search(r"\d\* GB/s", rows["cpu:0"])
    assert re.search(r"\d TFLOP/s", rows["gpu:0"]) and re.search(r"\d GB/s", rows["gpu:0"])
    assert "*: fitted" in text and "bound" not in text


def test_summary_shows_a_rate_at_its_fit_bound_as_unknown():
    def at_bound(d):
        d["devices"][2]["memory_bandwidth_bytes_per_s"] = 9.9992e13

    text = _measured(at_bound).summary()
    gpu1 = next(line for line in text.splitlines() if line.split()[0] == "gpu:1")
    assert "99992" not in text.replace(",", "") and "bound GB/s" in gpu1
    assert "bound: the fit ran" in text


def test_summary_of_a_datasheet_model_marks_nothing():
    text = simplace.CostModel.load("haswell_k40x2").summary()
    assert "*" not in text and "bound" not in text and "op 5.0 us" in text


def test_the_budget_is_the_commands_wall_time(capsys):
    """``--budget-s`` counts from the command's start: what starting up and tracing took
    comes out of the search's part (which keeps at least half), and says so."""
    import argparse

    from simplace.cli import SEARCH_MIN_BUDGET_SHARE, _search_budget

    def args(budget, started):
        return argparse.Namespace(budget_s=budget, started_s=started)

    assert _search_budget(args(None, 0.0), 5.0) is None
    assert _search_budget(args(20.0, 100.0), 100.5) == 19.5
    assert "0.5 s of the 20 s budget" not in capsys.readouterr().err  # under 5%: quiet
    assert _search_budget(args(20.0, 100.0), 103.0) == 17.0
    assert "took 3.0 s of the 20 s budget: the search gets 17.0 s" in capsys.readouterr().err
    assert _search_budget(args(20.0, 100.0), 130.0) == SEARCH_MIN_BUDGET_SHARE * 20.0


def test_the_simplace_command_counts_from_the_import(monkeypatch):
    """The console script starts the clock when the process imported simplace."""
    from simplace import cli

    seen = {}
    monkeypatch.setattr(cli, "main", lambda argv=None, started_s=None: seen.update(
        started_s=started_s) or 0)
    assert cli.console_main() == 0
    assert seen["started_s"] == simplace._IMPORTED_AT

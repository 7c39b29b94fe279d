"""simplace.kernels and ``simplace warmup``: which compiled loops an install has, their
compilation in the fast methods' estimates, and the note a budgeted search gives while
the simulator is not compiled."""

import importlib
import sys
import textwrap

import pytest

from simplace import cli, kernels
from simplace.placers import methods
from simplace.placers.registry import _CALLED, fast_cost_s
from simplace.warmup import warm_up


def test_dispatcher_cached_follows_numbas_cache(tmp_path, monkeypatch):
    # A module of its own, so that its cache starts empty wherever numba keeps caches.
    name = f"kernel_probe_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        from simplace._numba import njit

        @njit()
        def twice(x):
            return 2 * x
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module(name)
    try:
        assert not kernels.dispatcher_cached(mod.twice)
        assert mod.twice(21) == 42
        assert kernels.dispatcher_cached(mod.twice)
    finally:
        sys.modules.pop(name, None)
    assert not kernels.dispatcher_cached(len)  # not numba's: never cached


def test_warm_up_compiles_and_reports(monkeypatch):
    said = []
    rows = warm_up(["pipeline"], progress=said.append)
    assert [r["name"] for r in rows] == ["pipeline"]
    assert rows[0]["on_disk"] and rows[0]["seconds"] >= 0
    assert "pipeline" not in kernels.cold()
    assert len(said) == 1 and said[0].startswith("pipeline: ")
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):
        warm_up(["nope"])


def test_estimates_add_the_compilation_of_cold_kernels(monkeypatch):
    methods()  # registered: their costs are known
    was_called = "ideals" in _CALLED
    _CALLED.discard("ideals")
    try:
        monkeypatch.setattr(kernels, "cached", lambda name: True)
        warm = fast_cost_s("ideals", 500, 4)
        monkeypatch.setattr(kernels, "cached", lambda name: name != "ideals")
        assert fast_cost_s("ideals", 500, 4) == pytest.approx(
            warm + kernels.kernel("ideals").compile_s)
        monkeypatch.setattr(kernels, "cached", lambda name: False)
        assert fast_cost_s("ideals", 500, 4) == pytest.approx(
            warm + kernels.kernel("ideals").compile_s + kernels.kernel("simulator").compile_s)
        # heft runs no kernel: its estimate does not move
        monkeypatch.setattr(kernels, "cached", lambda name: True)
        heft = fast_cost_s("heft", 500, 4)
        monkeypatch.setattr(kernels, "cached", lambda name: False)
        assert fast_cost_s("heft", 500, 4) == heft
    finally:
        if was_called:
            _CALLED.add("ideals")


def test_note_cold_says_it_once_and_only_with_a_budget(monkeypatch):
    monkeypatch.setattr(kernels, "_SAID", [])
    said = []
    monkeypatch.setattr(kernels, "cached", lambda name: True)
    kernels.note_cold(said.append, 5.0)
    assert said == []  # compiled: nothing to say
    monkeypatch.setattr(kernels, "cached", lambda name: False)
    kernels.note_cold(said.append, None)
    assert said == []  # no budget to overrun
    kernels.note_cold(said.append, 5.0)
    kernels.note_cold(said.append, 5.0)
    assert len(said) == 1 and "5.0 s budget" in said[0] and "simplace warmup" in said[0]


def test_cli_warmup(capsys):
    assert cli.main(["warmup", "--check"]) == 0
    out = capsys.readouterr().out
    for k in kernels.KERNELS:
        assert k.name in out
    assert cli.main(["warmup", "--kernels", "pipeline"]) == 0
    out = capsys.readouterr().out
    assert "pipeline" in out and "simulator" not in out and "of 1 kernels" in out
    assert cli.main(["warmup", "--kernels", "pipeline,nope"]) == 2
    err = capsys.readouterr().err
    assert "--kernels" in err and "simulator" in err  # names the known ones

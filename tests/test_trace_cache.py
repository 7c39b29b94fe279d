"""Traced zoo graphs kept in the user directory (simplace.trace_cache) and what the
commands say about them."""

import pytest

from simplace import trace_cache
from simplace.cli import main
from simplace.graph import OpGraph


def _graph(capsys, *argv):
    """``simplace graph ARGV``: (stdout, stderr); exit code 0."""
    assert main(["graph", *argv]) == 0
    return capsys.readouterr()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMPLACE_HOME", str(tmp_path))
    monkeypatch.delenv(trace_cache.ENV_SWITCH, raising=False)
    return tmp_path


def test_a_zoo_model_traced_once_is_read_back_the_same(home, capsys):
    out1, err1 = _graph(capsys, "mlp", "--small")
    assert "tracing mlp (training step)" in err1 and "kept for the next command" in err1
    [entry] = (home / "traces").glob("*.json")
    assert entry.name.startswith("mlp-train-small-")
    out2, err2 = _graph(capsys, "mlp", "--small")
    assert "tracing" not in err2 and f"read the trace of mlp (training step) from {entry}" \
        in err2
    # the same summary (the hash among it) but for the time it took
    assert out1.splitlines()[:-1] == out2.splitlines()[:-1]
    assert "hash" in out1


def test_each_mode_and_size_has_its_own_entry(home, capsys):
    _graph(capsys, "mlp", "--small")
    _graph(capsys, "mlp", "--small", "--inference")
    _graph(capsys, "mlp", "--small", "--batch", "3")
    names = sorted(p.name.rsplit("-", 1)[0] for p in (home / "traces").glob("*.json"))
    assert names == ["mlp-inference-small", "mlp-train-small", "mlp-train-small-b3"]
    paths = {n: trace_cache.entry_path("mlp", training=t, batch=b, small=True)
             for n, t, b in (("train", True, None), ("inf", False, None), ("b3", True, 3))}
    assert len(set(paths.values())) == 3
    graphs = {n: OpGraph.load(p) for n, p in paths.items()}
    assert graphs["b3"].hash != graphs["train"].hash != graphs["inf"].hash


def test_a_damaged_entry_is_traced_again_and_replaced(home, capsys):
    _graph(capsys, "mlp", "--small")
    [entry] = (home / "traces").glob("*.json")
    good = OpGraph.load(entry).hash
    entry.write_text(entry.read_text()[:500])  # truncated
    _, err = _graph(capsys, "mlp", "--small")
    assert f"cannot read the kept trace {entry}" in err and "tracing again" in err
    assert OpGraph.load(entry).hash == good


def test_a_new_key_replaces_the_entry_of_the_same_model_and_sizes(home, capsys,
                                                                   monkeypatch):
    _graph(capsys, "mlp", "--small")
    _graph(capsys, "mlp", "--small", "--inference")
    [old] = (home / "traces").glob("mlp-train-small-*.json")
    # an edit of simplace's sources (or another jax) gives another key: traced anew
    monkeypatch.setattr(trace_cache, "_source_digest", lambda: "edited")
    _, err = _graph(capsys, "mlp", "--small")
    assert "tracing mlp" in err
    [new] = (home / "traces").glob("mlp-train-small-*.json")
    assert new != old and not old.exists()
    assert len(list((home / "traces").glob("mlp-inference-small-*.json"))) == 1


def test_no_entry_when_the_cache_is_off_or_the_model_is_not_the_zoos(home, capsys,
                                                                      monkeypatch, tmp_path):
    monkeypatch.setenv(trace_cache.ENV_SWITCH, "0")
    _, err = _graph(capsys, "mlp", "--small")
    assert "tracing mlp" in err and "kept" not in err
    assert not (home / "traces").exists()
    monkeypatch.delenv(trace_cache.ENV_SWITCH)
    for spec in ("models.py:good", "pkg.module:factory", "g.json", "sub/mlp"):
        assert trace_cache.entry_path(spec, training=True, batch=None, small=False) is None
    saved = tmp_path / "g.json"
    _graph(capsys, "mlp", "--small", "--out", str(saved))
    _, err = _graph(capsys, str(saved))
    assert "trace" not in err  # a saved graph is read as it is


def test_an_entry_that_cannot_be_written_does_not_stop_the_command(home, capsys):
    (home / "traces").write_text("a file where the folder would be")
    _, err = _graph(capsys, "mlp", "--small")
    assert "not kept (" in err

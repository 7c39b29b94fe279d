"""The worked-example notebooks: committed without outputs, in step with their generator
(``notebooks/make_notebooks.py``), and each runs from top to bottom without an error
(slow: a Jupyter kernel per notebook, up to two minutes each)."""

import importlib.util
import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
# Generous: the notebooks are sized for about two minutes on 2 busy cores.
CELL_TIMEOUT_S = 600


def _generator():
    spec = importlib.util.spec_from_file_location(
        "make_notebooks", REPO / "notebooks" / "make_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_four_notebooks_exist():
    assert [p.stem for p in NOTEBOOKS] == ["01_quickstart", "02_calibrate_validate", "03_rl",
                                          "04_pase"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, cell["id"]


def test_notebooks_match_their_generator():
    pytest.importorskip("nbformat")
    gen = _generator()
    assert sorted(gen.NOTEBOOKS) == [p.stem for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        assert path.read_text() == gen.text(gen.build(path.stem, gen.NOTEBOOKS[path.stem])), (
            f"{path.name} differs from notebooks/make_notebooks.py: run it")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    # The kernel is a new process: it imports this checkout's simplace (whatever is
    # installed), runs in a scratch folder, and keeps what it writes (calibrations, charts)
    # in a scratch user directory.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("SIMPLACE_HOME", str(tmp_path / "home"))
    # plots show inline (the kernel's own backend), whatever the environment chose
    monkeypatch.delenv("MPLBACKEND", raising=False)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors
    # every plot cell drew its figure
    plots = [c for c in code if "plt.show()" in c.source or c.source.rstrip().endswith(
        "Image(\"gantt_single.png\")") or "Image(\"gantt_best.png\")" in c.source]
    for c in plots:
        assert any("image/png" in o.get("data", {}) for o in c.outputs), c.id

"""The teaching notebooks: each runs top to bottom in a fresh kernel, and the committed copies carry outputs.

CI executes every notebook with ``SIMBATCH_NOTEBOOK_SMALL=1`` (short horizons): about 30 s for all
six on an idle 2-core machine. ``make notebooks`` runs them at full size and saves the outputs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_runner():
    spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "scripts" / "run_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


runner = _load_runner()

LESSONS = [
    "01_littles_law_and_stability.ipynb",
    "02_static_dynamic_continuous.ipynb",
    "03_throughput_curve.ipynb",
    "04_kv_memory_and_preemption.ipynb",
    "05_chunked_prefill.ipynb",
    "06_policies_and_fairness.ipynb",
]
SMALL_LINE = 'SMALL = os.environ.get("SIMBATCH_NOTEBOOK_SMALL") == "1"'


def _read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(runner.NOTEBOOK_DIR / name, as_version=4)


def _code_cells(nb: nbformat.NotebookNode) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def test_the_six_lessons_are_the_notebooks():
    assert [p.name for p in runner.notebooks()] == LESSONS


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_shape(name):
    """First code cell defines SMALL; the lesson ends with exercises and then their answers."""
    nb = _read(name)
    assert SMALL_LINE in _code_cells(nb)[0].source
    headings = [line for c in nb.cells if c.cell_type == "markdown" for line in c.source.splitlines()
                if line.startswith("## ")]
    assert headings[-2:] == ["## Exercises", "## Answers"], headings
    answers_at = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and "## Answers" in c.source)
    assert any(c.cell_type == "code" for c in nb.cells[answers_at:]), "answers are computed, not just stated"


@pytest.mark.parametrize("name", LESSONS)
def test_committed_copy_carries_full_outputs(name):
    """Saved by one top-to-bottom run: every code cell executed in order, no errors, plots embedded."""
    cells = _code_cells(_read(name))
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), f"{name}: run `make notebooks` (cells ran out of order or not at all)"
    outputs = [o for c in cells for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{name} has no plot output"


def test_runner_uses_this_interpreter_and_passes_small(tmp_path, monkeypatch):
    """The kernel is the interpreter running the tests (the venv), and it sees the SMALL switch."""
    probe = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import os, sys\nprint(sys.executable)\nprint(os.environ['SIMBATCH_NOTEBOOK_SMALL'])")])
    path = tmp_path / "probe.ipynb"
    nbformat.write(probe, path)
    monkeypatch.delenv(runner.SMALL_ENV, raising=False)
    out = runner.execute(path, small=True).cells[0].outputs
    printed = "".join(o.text for o in out if o.output_type == "stream").split()
    assert printed == [sys.executable, "1"]


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_runs_in_a_fresh_kernel(name):
    """Any failing cell raises CellExecutionError, naming the cell and its traceback."""
    nb = runner.execute(runner.NOTEBOOK_DIR / name, small=True)
    cells = _code_cells(nb)
    assert all(c.execution_count is not None for c in cells)
    assert not [o for c in cells for o in c.outputs if o.output_type == "error"]

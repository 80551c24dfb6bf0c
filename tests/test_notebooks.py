"""The teaching notebooks: each runs top to bottom in a fresh process, and the committed copies carry outputs.

CI runs every lesson's cells with ``SIMBATCH_NOTEBOOK_SMALL=1`` (short horizons) in a process forked
from one that has imported what the lessons import (``run_notebooks.check``): about 64 s for the
sixteen, against 119 s each in a fresh kernel (measured one after the other, same machine).
``make notebooks`` runs them in kernels at full size and saves the outputs; the runner's kernel path
is tested here on probe notebooks.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # run_notebooks.check's forked process finds its function by module name
    spec.loader.exec_module(module)
    return module


runner = _load_script("run_notebooks")
answers = _load_script("collapse_answers")

LESSONS = [
    "01_littles_law_and_stability.ipynb",
    "02_static_dynamic_continuous.ipynb",
    "03_throughput_curve.ipynb",
    "04_kv_memory_and_preemption.ipynb",
    "05_chunked_prefill.ipynb",
    "06_policies_and_fairness.ipynb",
    "07_tails_slos_goodput.ipynb",
    "08_one_at_a_time_queues.ipynb",
    "09_batching_server_as_a_queue.ipynb",
    "10_bursts_and_real_traces.ipynb",
    "11_fleets_and_pooling.ipynb",
    "12_from_a_model_and_a_gpu.ipynb",
    "13_build_your_own_scheduler.ipynb",
    "14_prefix_caching.ipynb",
    "15_disaggregated_prefill_decode.ipynb",
    "16_speculative_decoding_roofline.ipynb",
]
SMALL_LINE = 'SMALL = os.environ.get("SIMBATCH_NOTEBOOK_SMALL") == "1"'


def _read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(runner.NOTEBOOK_DIR / name, as_version=4)


def _code_cells(nb: nbformat.NotebookNode) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def test_the_lessons_are_the_notebooks():
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


LEARN, PREDICT, PREDICTION = "**You will learn to**", "**Predict first.**", "my_prediction"


def _bullets_after(source: str, marker: str) -> int:
    """How many "- " bullets the list right after the line ``marker`` has (continuation lines indented)."""
    lines = source.split(marker, 1)[1].splitlines()[1:]
    while lines and not lines[0].strip():
        lines.pop(0)
    count = 0
    for line in lines:
        if line.startswith("- "):
            count += 1
        elif not (line.startswith("  ") and count):
            break
    return count


def _is_blank_prediction(cell) -> bool:
    """``my_prediction = {"<what, with unit>": None, ...}`` and nothing else: the student fills the Nones in."""
    try:
        (stmt,) = ast.parse(cell.source).body
    except (SyntaxError, ValueError):
        return False
    return (cell.cell_type == "code" and isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id == PREDICTION
            and isinstance(stmt.value, ast.Dict) and len(stmt.value.keys) > 0
            and all(isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value for k in stmt.value.keys)
            and all(isinstance(v, ast.Constant) and v.value is None for v in stmt.value.values))


REVEAL = "reveal(my_prediction"


def _form_problems(nb: nbformat.NotebookNode) -> list[str]:
    """What a lesson lacks of the common form: learning objectives in its first cell, at least two
    "Predict first." questions each answered by a blank ``my_prediction`` cell before the next cell
    that computes, each prediction revealed (``reveal(my_prediction, ...)``, simbatch.app.teaching.reveal)
    before the next one is asked, and takeaways right before the exercises."""
    problems = []
    first = nb.cells[0]
    if first.cell_type != "markdown" or LEARN not in first.source:
        problems.append(f"the first cell has no {LEARN!r} list")
    elif not 3 <= _bullets_after(first.source, LEARN) <= 6:
        problems.append(f"{LEARN!r} has {_bullets_after(first.source, LEARN)} bullets, not 3 to 6")
    asked = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and PREDICT in c.source]
    if len(asked) < 2:
        problems.append(f"{len(asked)} {PREDICT!r} question(s), not at least two")
    for i in asked:
        after = next((c for c in nb.cells[i + 1:] if c.cell_type == "code"), None)
        if after is None or not _is_blank_prediction(after):
            problems.append(f"cell {i} asks {PREDICT!r}, but the next code cell is not a blank {PREDICTION} = {{...: None}}")
    blanks = [i for i, c in enumerate(nb.cells) if _is_blank_prediction(c)]
    for i, j in zip(blanks, [*blanks[1:], len(nb.cells)], strict=True):
        if not any(c.cell_type == "code" and REVEAL in c.source for c in nb.cells[i + 1:j]):
            problems.append(f"the prediction of cell {i} is never revealed: no {REVEAL}, ...) before the next one")
    headings = [line for c in nb.cells if c.cell_type == "markdown" for line in c.source.splitlines()
                if line.startswith("## ")]
    at = headings.index("## Exercises") if "## Exercises" in headings else None
    if at is None or at == 0 or headings[at - 1] != "## Takeaways":
        problems.append("'## Takeaways' is not the heading right before '## Exercises'")
    else:
        takeaways = next(c.source for c in nb.cells if c.cell_type == "markdown" and "## Takeaways" in c.source)
        if not 3 <= _bullets_after(takeaways, "## Takeaways") <= 6:
            problems.append(f"'## Takeaways' has {_bullets_after(takeaways, '## Takeaways')} bullets, not 3 to 6")
    return problems


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_follows_the_common_form(name):
    assert _form_problems(_read(name)) == []


def test_the_form_check_names_each_missing_part():
    """Each part of the form taken out of a lesson that has them all is reported, and only that part."""
    def without(edit):
        nb = _read("07_tails_slos_goodput.ipynb")
        edit(nb)
        return _form_problems(nb)

    def drop_objectives(nb):
        nb.cells[0].source = nb.cells[0].source.replace(LEARN, "**Contents**")

    def fill_in_a_prediction(nb):
        cell = next(c for c in nb.cells if _is_blank_prediction(c))
        cell.source = cell.source.replace("None", "3", 1)

    def compute_before_predicting(nb):
        at = next(i for i, c in enumerate(nb.cells) if _is_blank_prediction(c))
        nb.cells.insert(at, nbformat.v4.new_code_cell("x = 1"))

    def ask_only_once(nb):
        asked = [c for c in nb.cells if c.cell_type == "markdown" and PREDICT in c.source]
        for c in asked[1:]:
            c.source = c.source.replace(PREDICT, "**Predict.**")

    def never_reveal(nb):
        for c in nb.cells:
            c.source = c.source.replace(REVEAL, "print(my_prediction")

    def drop_takeaways(nb):
        cell = next(c for c in nb.cells if "## Takeaways" in c.source)
        cell.source = cell.source.replace("## Takeaways", "Takeaways:")

    assert without(lambda nb: None) == []
    assert without(drop_objectives) == [f"the first cell has no {LEARN!r} list"]
    for edit in (fill_in_a_prediction, compute_before_predicting):
        (problem,) = without(edit)
        assert "but the next code cell is not a blank my_prediction" in problem, edit.__name__
    assert without(ask_only_once) == [f"1 {PREDICT!r} question(s), not at least two"]
    assert without(drop_takeaways) == ["'## Takeaways' is not the heading right before '## Exercises'"]
    unrevealed = without(never_reveal)
    assert unrevealed and all("is never revealed" in p for p in unrevealed)


@pytest.mark.parametrize("name", LESSONS)
def test_committed_copy_carries_full_outputs(name):
    """Saved by one top-to-bottom run: every code cell executed in order, no errors, plots embedded."""
    cells = _code_cells(_read(name))
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), f"{name}: run `make notebooks` (cells ran out of order or not at all)"
    outputs = [o for c in cells for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{name} has no plot output"


def test_runner_uses_this_interpreter_and_passes_small_and_shuts_the_kernel_down(tmp_path, monkeypatch):
    """The kernel is the interpreter running the tests (the venv), it sees the SMALL switch, and it
    is gone once the notebook has run."""
    probe = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import os, sys\nprint(sys.executable)\nprint(os.environ['SIMBATCH_NOTEBOOK_SMALL'])\nprint(os.getpid())")])
    path = tmp_path / "probe.ipynb"
    nbformat.write(probe, path)
    monkeypatch.delenv(runner.SMALL_ENV, raising=False)
    out = runner.execute(path, small=True).cells[0].outputs
    printed = "".join(o.text for o in out if o.output_type == "stream").split()
    assert printed[:2] == [sys.executable, "1"]
    with pytest.raises(ProcessLookupError):  # shut down and reaped
        os.kill(int(printed[2]), 0)


TRACE_LESSON = "10_bursts_and_real_traces.ipynb"


def _trace_folder_lacks_the_traces() -> bool:
    """Whether the trace lesson, run as it stands, finds no Azure traces in the folder it reads: it then
    takes the same branch as under an empty SIMBATCH_TRACE_DIR (its first cell names the files)."""
    source = _code_cells(_read(TRACE_LESSON))[0].source
    files = ast.literal_eval(re.search(r"^TRACE_FILES = (\{.*\})$", source, re.M).group(1))
    folder = Path(os.environ.get("SIMBATCH_TRACE_DIR", ROOT.parent / "shared" / "data" / "traces"))
    return not all((folder / f).is_file() for f in files.values())


@pytest.fixture(scope="session")
def trace_lesson_without_traces(tmp_path_factory) -> tuple[Path, nbformat.NotebookNode]:
    """The trace lesson run once per test process with SIMBATCH_TRACE_DIR naming an empty folder."""
    empty = tmp_path_factory.mktemp("no_traces")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SIMBATCH_TRACE_DIR", str(empty))
        return empty, runner.check(runner.NOTEBOOK_DIR / TRACE_LESSON, small=True)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xdist_group("trace_lesson")) if n == TRACE_LESSON
                                  else n for n in LESSONS])
def test_lesson_runs_top_to_bottom_in_a_fresh_process(name, request):
    """Any failing cell raises CellExecutionError, naming the cell and its traceback. Where the trace
    lesson would find no Azure traces anyway (a clone without ../shared, CI), its run without them
    (test_trace_lesson_runs_without_the_azure_traces) is this run: it is made once per test process."""
    if name == TRACE_LESSON and _trace_folder_lacks_the_traces():
        _, nb = request.getfixturevalue("trace_lesson_without_traces")  # the very branch this run would take
    else:
        nb = runner.check(runner.NOTEBOOK_DIR / name, small=True)
    cells = _code_cells(nb)
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1))


def test_check_runs_cells_as_a_kernel_would_and_names_the_failing_one(tmp_path, monkeypatch):
    """run_notebooks.check: IPython's cells (a magic, a displayed last value) in the notebook's folder,
    with the kernel's environment, in a process that is neither this one nor the last lesson's; a
    figure that fails only when drawn fails its cell, and the first failing cell stops the run."""
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("SIMBATCH_PROBE", "seen")
    state = "import os, simbatch\nprint(os.getcwd(), os.environ['SIMBATCH_NOTEBOOK_SMALL'], os.environ['SIMBATCH_PROBE'])\n" \
            "print(getattr(simbatch, 'probe_mark', None), os.getpid())\nsimbatch.probe_mark = 1"
    path = _probe(tmp_path, state, "%time x = 6 * 7", "x")
    runs = [runner.check(path, small=True) for _ in range(2)]
    for nb in runs:
        state_out, timed, shown = (c.outputs for c in nb.cells)
        folder, small, probe, mark, pid = state_out[0].text.split()
        assert (folder, small, probe, mark) == (str(tmp_path), "1", "seen", "None")  # no mark left by the last run
        assert int(pid) != os.getpid() and "Wall time" in timed[0].text and "42" in shown[0].text
    assert runs[0].cells[0].outputs[0].text != runs[1].cells[0].outputs[0].text  # two processes
    bad = _probe(tmp_path, "import matplotlib.pyplot as plt\nprint('drawn')",
                 "plt.plot([0, 1]); plt.title(r'$\\frac{1$')", "print('never')")
    with pytest.raises(CellExecutionError) as failed:
        runner.check(bad, small=True)
    assert "code cell 2" in str(failed.value) and "plt.title" in str(failed.value)
    with pytest.raises(CellExecutionError, match="code cell 1"):
        runner.check(_probe(tmp_path, "1 / 0"), small=True)


def _probe(tmp_path, *sources: str):
    """A notebook of one code cell per source."""
    path = tmp_path / "probe.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources]), path)
    return path


def test_reexecution_is_byte_stable(tmp_path):
    """Output flushed in pieces (timing decides how many) is saved as one output per stream, object
    reprs lose their memory address, and two runs write identical files: `make notebooks` leaves
    `git status` clean when nothing changed."""
    path = _probe(tmp_path, "import sys, time\nimport matplotlib.pyplot as plt\nfor i in range(3):\n"
                            "    print(i, flush=True)\n    time.sleep(0.1)\nprint('e', file=sys.stderr, flush=True)\n"
                            "time.sleep(0.1)\nprint('c')\nplt.plot([0, 1], [1, 0])")
    first, second = (runner.execute(path, small=True) for _ in range(2))
    outputs = first.cells[0].outputs
    assert [(o.name, o.text) for o in outputs if o.output_type == "stream"] == [
        ("stdout", "0\n1\n2\n"), ("stderr", "e\n"), ("stdout", "c\n")]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert "[<matplotlib.lines.Line2D>]" in nbformat.writes(first)
    assert nbformat.writes(first) == nbformat.writes(second)


def test_widgets_are_not_saved_and_the_runner_draws_no_slider_panel(tmp_path):
    """A widget is a live object of its kernel: the saved notebook keeps neither its view (a random
    model id) nor its state, so re-execution stays byte-stable. The runner's kernels are headless:
    a lesson's slider panel is not even built there (simbatch.app.teaching.widgets.sliders)."""
    # One kernel for both cells (a kernel start is most of such a test): the panel's switch is the
    # environment the runner gives the kernel, which the widget made before does not touch.
    path = _probe(tmp_path, "import ipywidgets\nipywidgets.IntSlider(value=3)",
                  "from simbatch.app.teaching import widgets\nprint(widgets.sliders() is None)")
    nb = runner.execute(path, small=True)
    assert nb.cells[0].outputs == [] and "widgets" not in nb.metadata  # nothing random left to differ
    assert nb.cells[1].outputs[0].text == "True\n"


SLIDERS = {"01_littles_law_and_stability.ipynb": ("widgets.sliders(", "widgets.explore("),
           "03_throughput_curve.ipynb": ("tradeoffs.throughput_sliders(", "tradeoffs.throughput_curve("),
           "05_chunked_prefill.ipynb": ("tradeoffs.chunk_sliders(", "tradeoffs.chunk_tradeoff("),
           "07_tails_slos_goodput.ipynb": ("tradeoffs.goodput_sliders(", "tradeoffs.goodput_curve("),
           "09_batching_server_as_a_queue.ipynb": ("widgets.sliders(", "widgets.explore("),
           "11_fleets_and_pooling.ipynb": ("tradeoffs.staleness_sliders(", "tradeoffs.staleness(")}


def test_the_lessons_with_sliders_are_these():
    assert [n for n in LESSONS if "_sliders(" in (text := "".join(c.source for c in _code_cells(_read(n))))
            or "widgets.sliders(" in text] == list(SLIDERS)


@pytest.mark.parametrize("name", list(SLIDERS))
def test_lessons_with_sliders_keep_a_static_figure(name):
    """The sliders cell follows a cell that draws the same figure at the sliders' start, which a viewer
    without a kernel shows (the headless runner builds no panel)."""
    panel, figure = SLIDERS[name]
    cells = _code_cells(_read(name))
    at = next(i for i, c in enumerate(cells) if panel in c.source)
    assert figure in cells[at - 1].source
    assert any("image/png" in o.get("data", {}) for o in cells[at - 1].outputs)
    assert cells[at].outputs == []  # no panel, no widget state saved


def _hidden(cell) -> bool:
    flags = cell.metadata.get("jupyter", {})
    return flags.get("source_hidden") is True and flags.get("outputs_hidden") is True


@pytest.mark.parametrize("name", LESSONS)
def test_answers_open_collapsed(name):
    """Every cell after "## Answers" opens collapsed in Jupyter; the heading, alone at the end of its
    cell, and everything before it stay open (`make notebooks` keeps it so, via collapse_answers.py)."""
    nb = _read(name)
    at = answers.answers_heading_at(nb)
    assert nb.cells[at].source.splitlines()[-1] == "## Answers", "answer text shows under the heading"
    assert at < len(nb.cells) - 1 and all(_hidden(c) for c in nb.cells[at + 1:])
    assert not any(c.metadata.get("jupyter", {}).get(k) for c in nb.cells[:at + 1] for k in answers.HIDDEN)


def _lesson_probe() -> nbformat.NotebookNode:
    v4 = nbformat.v4
    was_hidden = v4.new_code_cell("x = 1", metadata={"jupyter": {"source_hidden": True, "outputs_hidden": True}})
    return v4.new_notebook(cells=[v4.new_markdown_cell("# A lesson"), was_hidden,
                                  v4.new_markdown_cell("## Exercises\n\n1. Why?\n\n## Answers\n\n1. Because."),
                                  v4.new_code_cell("print(x)")])


def test_collapse_moves_answer_text_out_of_the_heading_and_is_idempotent():
    nb = answers.collapse(_lesson_probe())
    assert [c.source for c in nb.cells[2:]] == ["## Exercises\n\n1. Why?\n\n## Answers", "1. Because.", "print(x)"]
    assert nb.cells[3].id == f"{nb.cells[2].id}-answers"  # derived, so a re-run writes the same file
    assert [_hidden(c) for c in nb.cells] == [False, False, False, True, True]
    assert "jupyter" not in nb.cells[1].metadata  # a lesson cell collapsed by hand is opened again
    once = nbformat.writes(nb)
    assert nbformat.writes(answers.collapse(nb)) == once
    nbformat.validate(nb)


def test_runner_collapses_the_answers(tmp_path):
    path = tmp_path / "lesson.ipynb"
    nbformat.write(_lesson_probe(), path)
    nb = runner.execute(path, small=True)
    assert nb.cells[-1].outputs[0].text == "1\n" and _hidden(nb.cells[-1]) and _hidden(nb.cells[-2])


def test_collapse_script_refuses_a_lesson_without_answers_and_writes_nothing(tmp_path, capsys):
    good, bad = tmp_path / "good.ipynb", tmp_path / "bad.ipynb"
    nbformat.write(_lesson_probe(), good)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("## Exercises")]), bad)
    before = good.read_text()
    assert answers.main([str(good), str(bad)]) == 2
    assert "no '## Answers' heading in bad.ipynb" in capsys.readouterr().err
    assert good.read_text() == before
    assert answers.main([str(good)]) == 0 and _hidden(nbformat.read(good, as_version=4).cells[-1])


# Figures the lessons' prose quotes, each next to a regular expression over the committed outputs
# (a full-size run, as test_committed_copy_carries_full_outputs checks): the text says what the run printed.
QUOTED = [
    ("01_littles_law_and_stability.ipynb", r"500 \times 20.2\ \text{ms} = 10.1$ s", r"W_B: 16\.4 s \(alone in the server: 10\.1 s\)"),
    ("01_littles_law_and_stability.ipynb", r"$W = 500 \times 30\ \text{ms} = 15.0$ s", r"B = 50\.0, W = 15\.0 s; simulated mean E2E 14\.7 s"),
    ("01_littles_law_and_stability.ipynb", "against 14.7 s\n  simulated", r"B = 50\.0, W = 15\.0 s; simulated mean E2E 14\.7 s"),
    ("01_littles_law_and_stability.ipynb", "about 3.9 requests/s, not 20", r"= 20\.1 req/s\n.*= 3\.86 req/s \(μ = 3\.90\)"),
    ("02_static_dynamic_continuous.ipynb", r"$H_{32} \approx 4.06$", r"H_32 = 4\.06x"),
    ("02_static_dynamic_continuous.ipynb", "about 6 sequences computing, of 32 slots", r"static +mean live batch 5\.9 of 32 slots"),
    ("02_static_dynamic_continuous.ipynb", "batches start with about 15 of the",
     r"rate 1\.5 req/s\n(.*\n)*?  dynamic, 10 ms window .* batches start with 15\.4 of 32"),
    ("02_static_dynamic_continuous.ipynb", "over 80 % of the decode slot-steps are idle",
     r"static +tail idling: 81\.7% of decode slot-steps idle"),
    ("03_throughput_curve.ipynb", "($B = 512$ gets 84 %)", r"B = 512: .* 83\.7% of the roofline"),
    ("03_throughput_curve.ipynb", "20.2 s against the fixed point's 16.1 s", r"\(ρ = 0\.97\): fixed point 16\.13 s, simulated median 20\.21 s"),
    ("03_throughput_curve.ipynb", r"up to $\rho \approx 0.9$", r"\(ρ = 0\.90\): fixed point 15\.38 s, simulated median 15\.83 s \(\+2\.9%\)"),
    ("04_kv_memory_and_preemption.ipynb", "969 tokens/s predicted against 945 measured", r"memory-bound +24\.0 +969 +945 +1\.48 +1\.6\n"),
    ("04_kv_memory_and_preemption.ipynb", "7.2 requests and 334 against 331", r"memory-starved \(120 blocks\) +7\.2 +334 +331 +1\.48 +0\.6\n"),
    ("04_kv_memory_and_preemption.ipynb", "about an eighth of", r"thrashing +24\.0 +969 +773 +1\.41 +12\.7\n"),
    ("04_kv_memory_and_preemption.ipynb", "57 requests of 100 tokens hold 399 blocks",
     r"400 blocks: first step runs 57 requests \(399 blocks used\)"),
    ("05_chunked_prefill.ipynb", "about 377.5 s in every row", r"none \(prefill-first\) .* 377\.5 .*\n(.*377\.[5-6] .*\n){5}"),
    ("06_policies_and_fairness.ipynb", "finishes in 154 to 189 s", r"oracle\) +mean TTFT +36\.4 s, whole burst done after +189\.3 s\n"
     r"1\. longest first +mean TTFT +112\.6 s, whole burst done after +154\.4 s"),
    ("06_policies_and_fairness.ipynb", "SJF on the true output length halves a burst's mean TTFT",
     r"fcfs +74\.4 +77\.1 *\n.*\nsjf by output \(oracle\) +36\.4 +39\.2"),
    ("07_tails_slos_goodput.ipynb", "about 21 % of the mean at 200 requests per run and 4 % at 5,000",
     r"200 +2\.0 +20\.12 +4\.20 +20\.86\n(.*\n)+5000 +50\.0 +21\.62 +0\.89 +4\.11"),
    ("07_tails_slos_goodput.ipynb", "spans from 16 to 29 s", r"interval from the order statistics \[16\.34, 28\.87\] s"),
    ("07_tails_slos_goodput.ipynb", "Prefill-first moves the p99 ITL five-fold and the p99 TPOT by a few per cent",
     r"p99 tpot \(ms\) +46\.5 +48\.6\n(.*\n)*p99 itl \(ms\) +48\.3 +244\.8"),
    ("07_tails_slos_goodput.ipynb", "The objective costs 15 % of the device's throughput",
     r"= 50; throughput there 1,667 tokens/s, against 1,951 at B = 64 \(15% less\)"),
    ("07_tails_slos_goodput.ipynb", r"$50 / (500 \times 30\ \text{ms}) = 3.33$", r"predicted goodput knee λ\* = 3\.33 req/s"),
    ("07_tails_slos_goodput.ipynb", "Goodput tracks throughput up to 2.5 requests/s",
     r"2\.50 +2\.50 +2\.50 .*\n3\.00 +2\.95 +2\.05 .*\n3\.25 +3\.21 +1\.64 +29\.95 .*\n3\.50 +3\.45 +0\.71 +31\.42"),
    ("07_tails_slos_goodput.ipynb", "at about 2.7 requests/s, 69 % of capacity", r"up to 2\.68 req/s \(69% of capacity 3\.90\)"),
    ("08_one_at_a_time_queues.ipynb", "wait almost twice as long", r"exponential answers wait 1\.90x as long"),
    ("08_one_at_a_time_queues.ipynb", "Both estimates cover the formula's 85 ms",
     r"saves 85 ms of mean wait\n +common random numbers: 89 ± 7 ms .*\n +independent seeds: +101 ± 29 ms"),
    ("08_one_at_a_time_queues.ipynb", "(±7 ms against ±29 ms)", r"common random numbers: 89 ± 7 ms"),
    ("09_batching_server_as_a_queue.ipynb", "pulls the mean down by more than\nits own interval",
     r"mean latency 14\.44 s(.*\n)+ +every request +mean E2E 14\.21 ± 0\.08 s\n +arrivals in .* mean E2E 14\.38 ± 0\.09 s"),
    ("08_one_at_a_time_queues.ipynb", "too low for\nvery bursty arrivals, too high for very smooth ones",
     r"4\.00 +0\.2 +941\.7 +1133\.7 +60\.8 +-16\.9\n(.*\n)+0\.25 +4\.0 +58\.9 +38\.3 +0\.8 +53\.5"),
    ("09_batching_server_as_a_queue.ipynb", "fixed 500-token answers take 14.4 s on\naverage",
     r"3\.0 +0\.77 +14\.29 +14\.44 +0\.01 +14\.42 +0\.09"),
    ("09_batching_server_as_a_queue.ipynb", "(15.7 s against 16.0 s, outside their interval)",
     r"3\.5 +0\.90 +15\.38 +16\.03 +0\.19 +15\.68 +0\.13"),
    ("09_batching_server_as_a_queue.ipynb", "(18.0 s against 20.3 and 20.5 s)",
     r"3\.8 +0\.97 +16\.13 +23\.16 +0\.70 +17\.98 +0\.73 +20\.25 +2\.52 +20\.55"),
    ("09_batching_server_as_a_queue.ipynb", "already busy some 40 % of the time",
     r"0\.05 +0\.013 +0\.397 +0\.407"),
    ("09_batching_server_as_a_queue.ipynb", "(13.5 s against the chain's 14.5 s)",
     r"offered load 0\.77; chain 14\.5 s, measured mean E2E 13\.5 s"),
    ("10_bursts_and_real_traces.ipynb", "from about 60 ms to about 7 s", r"stable +offered load 0\.77, p99 TTFT 60\.5 ms"
     r"(.*\n)bursty +offered load 0\.77, p99 TTFT 7,040\.9 ms"),
    ("10_bursts_and_real_traces.ipynb", "(goodput 2.09\nof 3.01 requests/s)", r"goodput 2\.09 of 3\.01 req/s"),
    ("10_bursts_and_real_traces.ipynb", "about 40 of its 64 slots", r"mean batch +40\.5 +44\.0"),
    ("10_bursts_and_real_traces.ipynb", "up to 67 requests in one second\nand 327 in one ten-second window",
     r"most arrivals in 1 s +16\.00 +67\.00\nmost arrivals in 10 s +98\.00 +327\.00"),
    ("10_bursts_and_real_traces.ipynb", "nearly uncorrelated (0.09 and 0.00)", r"corr\(log prompt, log output\) +0\.09 +-0\.00"),
    ("10_bursts_and_real_traces.ipynb", "(p99 TTFT 434 ms against 1.7 to 4.7 s)",
     r"conversation: p99 TTFT 434 ms replayed; 5 Poisson twins 1,722 to 4,737 ms"),
    ("10_bursts_and_real_traces.ipynb", "give a p99 TTFT of about 15 to 16 s",
     r"code: p99 TTFT 16,315 ms replayed; 5 Poisson twins 301 to 335 ms\ncode: 5 seeds of its own times with lengths "
     r"shuffled 14,840 to 16,177 ms; 5 i\.i\.d\. twins 302 to 318 ms(.*\n)+TTFT <= 500 ms \(%\) .* 62\.97"),
    ("10_bursts_and_real_traces.ipynb", "(10 to 18 s)", r"conversation: 5 seeds of its own times with lengths shuffled "
     r"10,412 to 17,706 ms; 5 i\.i\.d\. twins 259 to 273 ms"),
    ("10_bursts_and_real_traces.ipynb", "its p99 TTFT is 259 to 273 ms", r"5 i\.i\.d\. twins 259 to 273 ms"),
    ("10_bursts_and_real_traces.ipynb", "(correlation −0.84 over 60-second windows)",
     r"corr\(arrivals, mean output\), 60 s windows +-0\.84 +0\.03"),
    ("10_bursts_and_real_traces.ipynb", "1.77 times as long by mean (1.44 by median)",
     r"code prompts are 1\.77x the conversation's by mean, 1\.44x by median"),
    ("10_bursts_and_real_traces.ipynb", "(16 s, 23 s, 37 s), but its\n*median* explodes (0.3 s, 1.9 s, 10.4 s)",
     r"1\.00 +trace +0\.14 +278\.18 +1313\.43 +16315\.15(.*\n)+0\.50 +trace +0\.28 +1892\.67 +4252\.25 +23373\.61"
     r"(.*\n)+0\.25 +trace +0\.57 +10416\.00 +12473\.74 +36930\.54 .*\n +i\.i\.d\. twin +0\.57 +171\.47 +225\.99 +927\.99"),
    ("11_fleets_and_pooling.ipynb", "the shared\nqueue would wait about five times less",
     r"separate queues \(P-K at λ/4\): Wq = 768 ms\n.*Wq = 143 ms, 5\.4x less(.*\n)+random +770\.37"),
    ("11_fleets_and_pooling.ipynb", "(59 ms: the rest of the step in flight",
     r"0\.8 +random +14\.551 +76\.089 +1072\.842(.*\n){2} +power_of_two +14\.427 +42\.890 +58\.564"),
    ("11_fleets_and_pooling.ipynb", "(p99 about\n0.3 s, against 5.9 s)",
     r"0\.9 +random .* 5908\.468(.*\n){2} +power_of_two .* 366\.096 .*\n +least_outstanding .* 313\.004"),
    ("11_fleets_and_pooling.ipynb", "(between 0.3 and 1 s here)",
     r"mean wait 770 ms(.*\n)+ +300 +4\.8 +572\.7(.*\n) +1000 +15\.9 +1390\.4"),
    ("11_fleets_and_pooling.ipynb", "once the signal is a few seconds old (at 3 s here)",
     r"power_of_two +0 (.*\n){3} +1000 +15\.9 +654\.7 .*\n +3000 +47\.6 +1216\.2"),
    ("12_from_a_model_and_a_gpu.ipynb", "The spec sheet gives 4.48 ms; the preset says 5.84 ms of stream and 1.68 ms",
     r"= 4\.48 ms\n(.*\n)*the preset's weights_ms 5\.84 ms and tau0_ms 1\.68 ms"),
    ("12_from_a_model_and_a_gpu.ipynb", "about 1.7\ntimes as much at batch 1", r"1\.68x the spec-sheet figure at batch 1"),
    ("12_from_a_model_and_a_gpu.ipynb", "3,350 GB/s (`weights_ms`, 5.84 ms)", r"the stream at 77% of peak bandwidth +5\.838\n"),
    ("12_from_a_model_and_a_gpu.ipynb", "0.97 ms per step, and each layer's attention, norm and activation kernels some 22 µs more\n  (0.70 ms for 32 layers)",
     r"step overhead \(launch, scheduling\) +0\.972\ntau0_ms: 32 layers x 22\.0 µs +0\.703"),
    ("12_from_a_model_and_a_gpu.ipynb", "= 131{,}072", r"KV per token 131,072 bytes \(preset: 131,072\)"),
    ("12_from_a_model_and_a_gpu.ipynb", "up to a batch of about 88 (66 µs each, at the 23 %", r"preset beta_ms 66\.2 µs\nweights_ms / beta = 88:"),
    ("12_from_a_model_and_a_gpu.ipynb", "62.5 GiB per\nstep: 4.5 times the weights it streams", r"reads 62\.5 GiB per step, 4\.5x the weights streamed"),
    ("12_from_a_model_and_a_gpu.ipynb", "450,000 this H100 keeps for the cache", r"the cache holds 449,792 tokens: 64 x 8,000 = 512,000 does not fit"),
    ("12_from_a_model_and_a_gpu.ipynb", "at about 2,300 tokens", r"the context read equals the weights' stream at 2,266 tokens per sequence"),
    ("12_from_a_model_and_a_gpu.ipynb", "(the cache's 449,792\ntokens are 7,028 each)", r"the cache holds 449,792 tokens: .* \(7,028 tokens each do\)"),
    ("12_from_a_model_and_a_gpu.ipynb", "the step takes 25.6 ms instead of 7.5 ms", r"context +0: step +7\.5 ms(.*\n)+ +context +7,000: step +25\.6 ms"),
    ("12_from_a_model_and_a_gpu.ipynb", "falls from 15,109 tokens/s with no context",
     r"context +0: .* roofline +15,109(.*\n)+ +context +7,000: .* roofline +3,548; the cache holds 64 sequences"),
    ("12_from_a_model_and_a_gpu.ipynb", "the 64 sequences it holds make 2,505\ntokens/s", r"context +7,000: step +25\.6 ms, +2,505 tokens/s"),
    ("12_from_a_model_and_a_gpu.ipynb", "at 97.2 % of the\npeak bandwidth", r"\(kv_bandwidth 97\.2% of peak\)"),
    ("12_from_a_model_and_a_gpu.ipynb", "One H100 carries about 49 chat requests/s", r"limited by compute; capacity 49\.5 req/s"),
    ("12_from_a_model_and_a_gpu.ipynb", "29 µs per output token, are under a third of the\nwork",
     r"\(tau0 \+ W\) / B \(shared\) 29\.3 µs, delta c_bar 14\.7 µs, beta \(hidden under the memory side\) 66\.2 µs\nshared fraction 0\.29"),
    ("12_from_a_model_and_a_gpu.ipynb", "dropping\nδ and ε would change nothing at this batch",
     r"capacity 49\.5 req/s, offered load .*\nwithout the context terms \(delta = epsilon = 0\): capacity 49\.5 req/s"),
    ("12_from_a_model_and_a_gpu.ipynb", "at 30 to 46 requests/s the p99 TTFT stays under 100 ms",
     r"30 +0\.61 +[\d.]+ +[\d.]+ +73\.71\n40 +0\.81 +[\d.]+ +[\d.]+ +85\.69\n46 +0\.93 +[\d.]+ +[\d.]+ +97\.83\n"),
    ("12_from_a_model_and_a_gpu.ipynb", "at 50 (offered load 1.01) the queue\ngrows", r"50 +1\.01 +[\d.]+ +[\d.]+ +937\.10"),
    ("12_from_a_model_and_a_gpu.ipynb", "four times the slots buy +64 %", r"128-token prompts \+64%, 1024-token prompts \+49%, 4096-token prompts \+7%"),
    ("12_from_a_model_and_a_gpu.ipynb", "four times the slots buy +49 %", r"1024-token prompts \+49%"),
    ("12_from_a_model_and_a_gpu.ipynb", "they buy +7 %", r"4096-token prompts \+7%"),
    ("12_from_a_model_and_a_gpu.ipynb", "(its memory\nbatch is 106)", r"4096 +64 .*\n +256 +compute +0\.11 +106\.31"),
    ("12_from_a_model_and_a_gpu.ipynb", "on the closed form within\n3 %", r"largest gap between measured and closed form: 2\.9% \(prompt 4096, 256 slots\)"),
    ("12_from_a_model_and_a_gpu.ipynb", "About 450,000 tokens of KV cache, 28,112 blocks", r"num_blocks: auto -> 28,112 blocks, 449,792 tokens"),
    ("12_from_a_model_and_a_gpu.ipynb", "some 1,200 chat requests", r"memory batch at c_bar = 364: 1210 requests"),
    ("12_from_a_model_and_a_gpu.ipynb", "mostly its profiled sampler's, 1.2 GiB here", r"logits over 128,256 tokens = 1\.17 GiB"),
    ("12_from_a_model_and_a_gpu.ipynb", "fp8 weights free 6.5 GiB", r"llama-3.1-8b/H100-SXM +14\.99 +54\.91(.*\n)llama-3.1-8b/H100-SXM/fp8 +8\.49 +61\.41"),
    ("12_from_a_model_and_a_gpu.ipynb", "keeps a\nsixteenth of the H100's tokens", r"H100-SXM +14\.99 +54\.91 +128\.0 +449792(.*\n)+.*L4 +14\.99 +3\.50 +128\.0 +28656"),
    ("12_from_a_model_and_a_gpu.ipynb", "about 479,000 tokens", r"llama-3.1-70b/H100-SXM/tp4 +32\.89 +36\.53 +80\.0 +478768"),
    ("12_from_a_model_and_a_gpu.ipynb", "its median error is 13–22 % per dataset on whole",
     r"median error per dataset: 13% to 22% on steps and layers, 3% to 4% on attention kernels"),
    ("12_from_a_model_and_a_gpu.ipynb", "median error is 13–22 % per dataset", r"median error per dataset: 13% to 22% on steps"),
    ("12_from_a_model_and_a_gpu.ipynb", "τ0 comes back\nwithin 1 % and γ within 2 %; β is off by a sixth",
     r"tau0_ms +7\.513 +7\.471 .* -0\.5626\nbeta_ms .* 16\.7\nprefill_ms_per_token .* 1\.602"),
    ("12_from_a_model_and_a_gpu.ipynb", "0.119 ms, nearly twice\nthe true β", r"beta_ms +0\.06619 +0\.07724 +0\.1191 "),
    ("12_from_a_model_and_a_gpu.ipynb", "the closed form says 1.96×, the\nrun 1.96×", r"B = +1: closed form 1\.96x, simulated 1\.96x"),
    ("12_from_a_model_and_a_gpu.ipynb", "1.36× at 64 and 0.99× at 256; it ends at B = 230",
     r"speculation stops paying at B = 230(.*\n)+B = +64: closed form 1\.36x.*\nB = 256: closed form 0\.99x"),
    ("12_from_a_model_and_a_gpu.ipynb", "its 8.35 ms here", r"all-reduces 8\.35 ms"),
    ("13_build_your_own_scheduler.ipynb", "the differences are some $10^{-12}$ s",
     r"the scaffold: 400 requests; largest difference TTFT \de-1[1-4] s, E2E \de-1[1-4] s; "
     r"mean E2E 7\.720 s \(yours\) vs 7\.720 s \(simbatch\)"),
    ("13_build_your_own_scheduler.ipynb", "## 3. Your turn: chunks and memory",
     r"2\. 1,500 blocks: .*E2E \de-1[1-4] s;.*\n +preemptions: 73 \(yours\), 73 \(simbatch\)(.*\n)+"
     r"2\. 1,500 blocks, chunked 512: .*E2E \de-1[1-4] s;.*\n +preemptions: 185 \(yours\), 185 \(simbatch\)"),
    ("01_littles_law_and_stability.ipynb", "(exercise 3: 13.5 s)", r"longest 13\.5 s"),
    ("03_throughput_curve.ipynb", "at most 0.39 with 64 slots",
     r"at most 0\.39 with 64 slots; the pole at 10 req/s, the knee at 3\.90; W_B = 16\.4 s"),
    ("04_kv_memory_and_preemption.ipynb", "find only a fifth of their blocks again", r"prefix caching spares 20% of the recomputed tokens"),
    ("04_kv_memory_and_preemption.ipynb", "batching 2.76× predicted against 2.75×",
     r"what batching buys: predicted 2\.76x, simulated 2\.75x\nwhat memory buys: predicted 4\.77x, simulated 4\.19x\n"
     r"together: predicted 13\.2x, simulated 11\.5x"),
    ("05_chunked_prefill.ipynb", "where the additive law charged 1.9 times",
     r"additive \(simbatch\) +TTFT penalty at C = 512: 1\.90x prefill-first; worst gap 55\.2 ms against 229\.6 ms unchunked\n"
     r"roofline max \(by hand\) +TTFT penalty at C = 512: 1\.17x prefill-first; worst gap 29\.6 ms against 202\.4 ms"),
    ("09_batching_server_as_a_queue.ipynb", "sit below the chain's 23.2 s. That gap is not warm-up",
     r"3\.8 +0\.97 +16\.13 +23\.16 +0\.70 +17\.98 +0\.73 +20\.25 +2\.52"),
    ("11_fleets_and_pooling.ipynb", "about half of the gain ($(770 - 443)/(770 - 143) = 52$ %)",
     r"round_robin 52%, power_of_two 80%, least_outstanding 92%"),
    ("11_fleets_and_pooling.ipynb", "twenty-fold near capacity", r"p99 TTFT, random vs least_outstanding +- +18\.27"),
    ("12_from_a_model_and_a_gpu.ipynb", r"$\delta\bar c \approx 0.17$ ms per output token against $\beta = 0.066$ ms",
     r"delta c_bar = 0\.170 ms per output token \(a KV read, memory traffic\) against beta = 0\.066 ms"),
    ("12_from_a_model_and_a_gpu.ipynb", "would need\nabout 1 TiB", r"256 x 32,000 would take 0\.98 TiB"),
    ("12_from_a_model_and_a_gpu.ipynb", "inside the 436 such sequences the KV cache holds", r"the KV cache holds 436 such sequences"),
    ("12_from_a_model_and_a_gpu.ipynb", r"near $B \approx 60$", r"reaches the ridge \(295 tokens per weight read\) at B = 59"),
    ("13_build_your_own_scheduler.ipynb", "(69 at 1,200 blocks, 73 at 1,500)",
     r"3\. 1200 blocks: +69 preemptions, mean E2E 19\.32 s\n3\. 1500 blocks: +73 preemptions, mean E2E 12\.99 s"),
    ("14_prefix_caching.ipynb", "(offered load 1.42)", r"cache off offered load 1\.42"),
    ("14_prefix_caching.ipynb", "With it, the offered load is 0.65.", r"cache on  offered load 0\.65"),
    ("14_prefix_caching.ipynb", "Only about a fifth", r"the cache spares 20% of the recomputation"),
    ("15_disaggregated_prefill_decode.ipynb", "between 2 and 5 GB/s", r"disaggregation loses from 2 GB/s down, wins at 5 GB/s and up"),
    ("15_disaggregated_prefill_decode.ipynb", "They agree here on 2P:2D",
     r"capacity-optimal split 2P:2D(.*\n)+split with the highest goodput +- +2P:2D"),
    ("16_speculative_decoding_roofline.ipynb", "It reaches 1 at 59 sequences, where the additive law says 230",
     r"stops paying at B = 230 \(additive\) and B = 59 \(roofline\)"),
    ("16_speculative_decoding_roofline.ipynb", "(2.77 at $k = 4$", r"E = 2\.773 tokens per step"),
    ("16_speculative_decoding_roofline.ipynb", "some 18 to 60 sequences", r"with k = 4: B = 18 and 59"),
    ("16_speculative_decoding_roofline.ipynb", "(5.84 ms at the\n  fitted bandwidth", r"memory time 5\.84 ms \+ 0\.0403 µs per cached token; "
     r"compute 66\.2 µs per token; overheads 1\.68 ms"),
    ("16_speculative_decoding_roofline.ipynb", "Lesson 12 answered\nB = 230", r"stops paying at B = 230 \(additive\)"),
]


def _printed(nb: nbformat.NotebookNode) -> str:
    """Everything the code cells printed or displayed as text."""
    return "\n".join(o.get("text", "") or o.get("data", {}).get("text/plain", "")
                     for c in _code_cells(nb) for o in c.outputs)


@pytest.mark.parametrize(("name", "prose", "printed"), QUOTED, ids=[f"{q[0][:2]}-{i}" for i, q in enumerate(QUOTED)])
def test_prose_quotes_what_the_run_printed(name, prose, printed):
    nb = _read(name)
    text = "\n".join(c.source for c in nb.cells)
    assert prose in text, f"{name}: the prose no longer says {prose!r}"
    assert re.search(printed, _printed(nb)), f"{name}: the saved run does not print {printed!r}; re-read the prose"


@pytest.mark.xdist_group("trace_lesson")  # on the worker that runs lesson 10: the fixture's run is shared
def test_trace_lesson_runs_without_the_azure_traces(trace_lesson_without_traces):
    """Where ../shared/data/traces is absent (SIMBATCH_TRACE_DIR names an empty folder here), lesson 10
    says so and replays the shipped sample trace instead of failing."""
    empty, nb = trace_lesson_without_traces
    assert f"no Azure traces in {empty}: replaying simbatch/data/sample_trace.csv instead" in _printed(nb)
    assert not [o for c in _code_cells(nb) for o in c.outputs if o.output_type == "error"]


def test_a_kernel_that_stops_answering_is_given_one_fresh_start(monkeypatch, capsys):
    """A timeout is retried once in a fresh kernel; a second timeout, or an error in a cell, is not."""
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    def runs(*outcomes):
        """An ``_execute_once`` that raises or returns ``outcomes`` in turn, and the timeouts it was given."""
        given = []

        def run(path, *, small, timeout_s):
            given.append(timeout_s)
            outcome = outcomes[len(given) - 1]
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        monkeypatch.setattr(runner, "_execute_once", run)
        return given

    given = runs(CellTimeoutError("no reply"), "ran")
    assert runner.execute(Path("lesson.ipynb"), small=True) == "ran" and given == [180, 180]
    assert "stopped answering" in capsys.readouterr().err
    given = runs(CellTimeoutError("no reply"), CellTimeoutError("no reply"))
    with pytest.raises(CellTimeoutError):
        runner.execute(Path("lesson.ipynb"), small=False)
    assert given == [900, 900]
    given = runs(CellExecutionError("trace", "ename", "evalue"))
    with pytest.raises(CellExecutionError):
        runner.execute(Path("lesson.ipynb"), small=True)
    assert given == [180]

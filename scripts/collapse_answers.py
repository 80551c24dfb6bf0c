"""Collapse each lesson's worked answers, so a student meets the exercises before their solutions.

Everything after a lesson's ``## Answers`` heading is an answer. Those cells get the cell metadata
with which Jupyter (JupyterLab, Notebook 7) opens them collapsed, ``"jupyter": {"source_hidden": true,
"outputs_hidden": true}``; a click on the bar beside a cell opens it. The heading stays visible, so
the reader sees where the answers are. Answer text written in the heading's own cell after the
heading is moved into a cell of its own (with an id derived from the heading cell's, so a re-run
changes nothing), which is then collapsed like the rest; no cell before the heading stays collapsed.

``scripts/run_notebooks.py`` applies :func:`collapse` to every notebook it executes, so ``make
notebooks`` keeps it true. Run alone, this script rewrites the committed notebooks in place without
executing them:

    .venv/bin/python scripts/collapse_answers.py                  # every lesson
    .venv/bin/python scripts/collapse_answers.py 02_static_dynamic_continuous.ipynb
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
ANSWERS_HEADING = "## Answers"
HIDDEN = {"source_hidden": True, "outputs_hidden": True}


def answers_heading_at(nb: nbformat.NotebookNode) -> int | None:
    """The index of the markdown cell holding the ``## Answers`` heading line, or None."""
    return next((i for i, c in enumerate(nb.cells)
                 if c.cell_type == "markdown" and ANSWERS_HEADING in c.source.splitlines()), None)


def _show(cell: nbformat.NotebookNode) -> None:
    flags = cell.metadata.get("jupyter")
    if flags is None:
        return
    for key in HIDDEN:
        flags.pop(key, None)
    if not flags:
        del cell.metadata["jupyter"]


def collapse(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Collapse the cells after the ``## Answers`` heading, in place; a notebook without one is left as
    it is. Returns ``nb``. Applying it twice gives the same notebook as applying it once."""
    at = answers_heading_at(nb)
    if at is None:
        return nb
    heading = nb.cells[at]
    lines = heading.source.splitlines()
    cut = lines.index(ANSWERS_HEADING) + 1
    rest = "\n".join(lines[cut:]).strip("\n")
    if rest:  # answers written under the heading, in its cell: give them a cell that can collapse
        heading.source = "\n".join(lines[:cut])
        answer = nbformat.from_dict({"cell_type": "markdown", "metadata": {}, "source": rest})
        if "id" in heading:
            answer.id = f"{heading.id}-answers"[-64:]  # nbformat allows ids of 1 to 64 characters
        nb.cells.insert(at + 1, answer)
    for i, cell in enumerate(nb.cells):
        if i > at:
            cell.metadata["jupyter"] = {**cell.metadata.get("jupyter", {}), **HIDDEN}
        else:
            _show(cell)
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook file names in notebooks/ (default: every lesson)")
    args = parser.parse_args(argv)
    paths = [NOTEBOOK_DIR / n for n in args.names] if args.names else sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    books = {path: nbformat.read(path, as_version=4) for path in paths}
    lacking = [path.name for path, nb in books.items() if answers_heading_at(nb) is None]
    if lacking:  # checked before any file is written
        print(f"no '{ANSWERS_HEADING}' heading in {', '.join(lacking)}: a lesson ends with its exercises' answers "
              f"under that heading; add it", file=sys.stderr)
        return 2
    for path, nb in books.items():
        nbformat.write(collapse(nb), path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

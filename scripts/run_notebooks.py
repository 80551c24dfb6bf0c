"""Execute the teaching notebooks, each in a fresh kernel, and (optionally) save their outputs.

``make notebooks`` runs this at full size and writes the outputs back into ``notebooks/*.ipynb``, so
the plots render when the notebooks are browsed. ``tests/test_notebooks.py`` runs the same function
with ``SIMBATCH_NOTEBOOK_SMALL=1`` (short horizons) and saves nothing. Either way the worked answers
come back collapsed (``scripts/collapse_answers.py``).

The kernel is always the interpreter running this script, whatever kernels the machine has
registered: a notebook must see the simbatch it is shipped with, and CI has nothing but the venv.

    .venv/bin/python scripts/run_notebooks.py            # all, full size, saved in place
    .venv/bin/python scripts/run_notebooks.py --small 03_throughput_curve.ipynb   # one, small, not saved
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/ is no package: find the sibling below
from collapse_answers import collapse  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
SMALL_ENV = "SIMBATCH_NOTEBOOK_SMALL"


def notebooks() -> list[Path]:
    """The lessons, in reading order (``NN_name.ipynb``)."""
    return sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))


def execute(path: Path, *, small: bool, timeout_s: int | None = None, attempts: int = 2) -> nbformat.NotebookNode:
    """Run every cell of ``path`` top to bottom in a new kernel started in its folder.

    Raises ``nbclient.exceptions.CellExecutionError`` (naming the cell and the traceback) on the first
    failing cell. Returns the notebook with its new outputs and its answers collapsed; the file is left
    untouched.

    A cell that gets no answer within ``timeout_s`` (small runs: 180 s; full: 900 s) is a kernel that
    stopped answering, not a lesson that failed: on a loaded machine a freshly started kernel now and
    then never sees the first request (both sides wait, idle, for ever). Such a run is started again,
    once, in a fresh kernel, and said so on stderr; an error in a cell is never retried.
    """
    timeout_s = timeout_s or (180 if small else 900)
    for attempt in range(1, attempts + 1):
        try:
            return _execute_once(path, small=small, timeout_s=timeout_s)
        except (CellTimeoutError, DeadKernelError) as exc:
            if attempt == attempts:
                raise
            cell = str(exc).partition("Here is a preview of the cell contents:")[2].strip().splitlines()[:2]
            print(f"{path.name}: the kernel stopped answering ({type(exc).__name__}"
                  f"{', in the cell ' + repr(' / '.join(cell)) if cell else ''}); running it again in a fresh kernel",
                  file=sys.stderr)
    raise AssertionError("unreachable")


def _lesson_env(small: bool, backend: str) -> dict[str, str]:
    """The environment a lesson runs in: the caller's, with the SMALL switch, ``backend`` for
    matplotlib, and no live slider panels (simbatch.app.teaching.widgets.sliders)."""
    return {**os.environ, SMALL_ENV: "1" if small else "0", "MPLBACKEND": backend, "SIMBATCH_HEADLESS_KERNEL": "1"}


def _execute_once(path: Path, *, small: bool, timeout_s: int) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # timestamps of an earlier run
    # An empty kernel_dirs leaves only the native kernel: this interpreter, via ipykernel.
    km = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    # No per-cell timestamps: a re-run with unchanged results must leave the files unchanged. Once the
    # last cell has answered, the kernel has nothing left to say: it is killed rather than asked to
    # wind its interpreter down (a second of tearing down NumPy, pandas and matplotlib, per lesson).
    client = NotebookClient(nb, km=km, timeout=timeout_s, record_timing=False, shutdown_kernel="immediate",
                            resources={"metadata": {"path": str(path.parent)}})
    # Inline figures whatever MPLBACKEND the caller has set: the plots must land in the outputs.
    env = _lesson_env(small, "module://matplotlib_inline.backend_inline")
    # cleanup_kc: shut the kernel down afterwards. nbclient leaves a kernel it did not create running,
    # and a dozen idle kernels per test worker is memory and sockets nobody uses.
    client.execute(env=env, cleanup_kc=True)
    # A widget is a live object of the kernel that made it: saved, it is a dead reference with a random
    # id, and its state as well. The lesson draws the static figure a reader without a kernel sees.
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = coalesce_streams([o for o in cell.outputs if WIDGET_VIEW not in o.get("data", {})])
            for out in cell.outputs:
                if "text/plain" in out.get("data", {}):
                    out.data["text/plain"] = _ADDRESS.sub(r"\1>", out.data["text/plain"])
    return collapse(nb)  # the worked answers open collapsed (scripts/collapse_answers.py)


def check(path: Path, *, small: bool, timeout_s: int = 180) -> nbformat.NotebookNode:
    """Run every code cell of ``path`` top to bottom in a fresh process, as ``execute`` does in a fresh
    kernel, and return the notebook with what each cell printed: the test of every lesson.

    The process is forked from one that has already imported what the lessons import (multiprocessing's
    forkserver, started once per calling process and preloaded with every module a lesson's cells
    import), so a lesson pays neither a kernel's start nor the imports of matplotlib, pandas, SciPy and
    simbatch, which are most of a short lesson's time. Forked from that server, not from the caller, each lesson
    starts from the same state whatever ran before it. The cells run in IPython, as in a kernel, with
    the kernel's environment (``SIMBATCH_NOTEBOOK_SMALL``, a headless slider switch); figures are drawn
    on Agg after each cell and closed, as the inline backend draws and closes them, but not embedded:
    ``execute`` makes the saved copies, and the tests check their plots.

    Raises ``nbclient.exceptions.CellExecutionError`` naming the first failing cell and its traceback,
    and ``TimeoutError`` if the lesson has not finished within ``timeout_s``."""
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    env = _lesson_env(small, "Agg")
    context = _forkserver()
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_run_cells, args=(send, str(path.parent), env, [c.source for c in cells]),
                            name=f"lesson {path.name}")
    child.start()
    send.close()
    try:
        if not receive.poll(timeout_s):
            raise TimeoutError(f"{path.name} did not finish within {timeout_s} s")
        try:
            printed, failure = receive.recv()
        except EOFError:
            child.join()
            raise RuntimeError(f"{path.name}: the process running it died (exit code {child.exitcode})") from None
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        receive.close()
    for number, (cell, (stdout, stderr)) in enumerate(zip(cells, printed, strict=False), start=1):
        cell.execution_count = number
        cell.outputs = [nbformat.v4.new_output("stream", name=name, text=text)
                        for name, text in (("stdout", stdout), ("stderr", stderr)) if text]
    if failure is not None:
        number, traceback, ename, evalue = failure
        raise CellExecutionError(f"{path.name}, code cell {number}:\n{cells[number - 1].source}\n\n{traceback}",
                                 ename, evalue)
    return nb


_FORK_PRELOAD = ("IPython.core.interactiveshell", "IPython.utils.capture", "matplotlib.pyplot")


@functools.cache  # the preload list is read when the server starts, at the first lesson
def _forkserver():
    """The forkserver context, its server preloaded with this module and every module a lesson imports
    (names that are not modules, such as ``from simbatch.model import cost``'s ``cost``, are skipped by
    the server)."""
    import multiprocessing

    modules = {*_FORK_PRELOAD, __name__}
    for path in notebooks():
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            try:
                tree = ast.parse(cell.source)
            except SyntaxError:  # a cell of IPython magics: check() runs it, the server need not read it
                continue
            for node in tree.body:
                if isinstance(node, ast.Import):
                    modules.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    modules.add(node.module)
                    modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(sorted(modules))
    return context


def _run_cells(conn, folder: str, env: dict, sources: list[str]) -> None:
    """In the forked process: the cells in one IPython shell, in ``folder``; sends back what each
    printed, and the first failure as (cell number, traceback, exception name, message)."""
    import traceback

    os.environ.clear()
    os.environ.update(env)
    os.chdir(folder)
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False  # no sqlite file per lesson
    shell = InteractiveShell(config=config)
    printed, failure = [], None
    for number, source in enumerate(sources, start=1):
        with capture_output(display=False) as out:
            result = shell.run_cell(source, store_history=True)
            error = result.error_before_exec or result.error_in_exec
            try:
                for figure in map(plt.figure, plt.get_fignums()):
                    figure.canvas.draw()  # what fails only when drawn (a label's mathtext, say) fails here too
            except Exception as exc:  # the cell's failure, as the inline backend's draw would report it
                error = error or exc
            plt.close("all")
        printed.append((out.stdout, out.stderr))
        if error is not None:
            failure = (number, "".join(traceback.format_exception(error)), type(error).__name__, str(error))
            break
    conn.send((printed, failure))
    conn.close()


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# The default repr of an object names its memory address ("<Line2D at 0x7f1a6566fe50>"), new each run.
_ADDRESS = re.compile(r"(<[^<>]*) at 0x[0-9a-fA-F]+>")


def coalesce_streams(outputs: list) -> list:
    """Merge consecutive stream outputs of the same stream into one.

    How a cell's printing is cut into stream messages depends on when the kernel flushes, that is
    on timing: the same text arrives as one chunk in one run and three in the next. Merged, a re-run
    with unchanged results writes byte-identical files (``make notebooks`` leaves ``git status`` clean).
    """
    merged: list = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if (out.output_type == "stream" and prev is not None and prev.output_type == "stream"
                and prev.name == out.name):
            prev.text += out.text
        else:
            merged.append(out)
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook file names (default: all)")
    parser.add_argument("--small", action="store_true", help="short horizons, as in CI; outputs are not saved")
    args = parser.parse_args(argv)
    paths = [NOTEBOOK_DIR / n for n in args.names] if args.names else notebooks()
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    for path in paths:
        start = time.perf_counter()
        nb = execute(path, small=args.small)
        if not args.small:
            nbformat.write(nb, path)
        print(f"{path.name}: ran in {time.perf_counter() - start:.1f} s{'' if args.small else ', saved'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

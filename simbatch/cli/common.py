"""What every command shares: loading a scenario with overrides, reporting bad input, progress.

Bad input of any kind ends the command the same way: one line per problem on stderr (for a
scenario, ``file:line:col: dotted.path: message``), exit code 2, no traceback, nothing written.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator

import typer

from simbatch.loading import ScenarioError
from simbatch.results import OutputError

EXIT_BAD_INPUT = 2


class BadInput(Exception):
    """A command-line value that cannot be used; the message names the option, the value and the fix."""


def reports_bad_input(command: Callable) -> Callable:
    """Turn every kind of bad input raised by ``command`` into lines on stderr and exit code 2."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except ScenarioError as exc:
            for problem in exc.problems:
                typer.echo(str(problem), err=True)
        except (BadInput, OutputError) as exc:
            typer.echo(str(exc), err=True)
        raise typer.Exit(EXIT_BAD_INPUT)

    return wrapper


def overrides(sets: list[str] | None, **fields: object) -> list[str]:
    """``--set`` items followed by dedicated options (``--mode``, ``--seed``) as dotted overrides.

    Dedicated options go through the same validation as the file, so their errors read the same.
    """
    return [*(sets or []), *(f"{key}={value}" for key, value in fields.items() if value is not None)]


@contextlib.contextmanager
def progress(label: str, total: int, quiet: bool) -> Iterator[Callable[[float, int], None] | None]:
    """A progress callback for ``simulate(on_progress=...)``, drawing a bar on stderr.

    The bar shows requests arrived and simulated time; it is drawn only on a terminal and not
    under ``--quiet``, so logs and pipes get clean output.
    """
    if quiet or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed:,}/{task.total:,} arrived, t = {task.fields[sim_s]:,.1f} s simulated"),
               TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total, sim_s=0.0)
        yield lambda sim_s, arrived: bar.update(task, completed=arrived, sim_s=sim_s)

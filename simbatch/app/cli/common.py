"""What every command shares: loading a scenario with overrides, reporting bad input, progress.

Bad input of any kind ends the command the same way: one line per problem on stderr (for a
scenario, ``file:line:col: dotted.path: message``), exit code 2, no traceback, nothing written.
So do the ways a command is stopped from outside: Ctrl-C (SIGINT) and SIGTERM (what ``timeout``
and ``kill`` send) print "interrupted" and exit 130 and 143, after the half-written result folder
is removed; a reader that goes away (``simbatch run ... | head``) is ignored, and the run still
writes its results.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import typer

from simbatch.app.errors import (
    OutputError,
    Terminated,
    forget_signals,
    interrupting_signal,
    interruption,
    raise_keyboard_interrupt,
    raise_terminated,
)
from simbatch.app.text import printable

if TYPE_CHECKING:
    from simbatch.config import Scenario

# The command modules import the schema (pydantic), the simulator, the frames and the plots inside their
# command functions, when one runs: `simbatch --help` and a command's --help build none of them.

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, as a shell reports a command stopped by Ctrl-C
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143

FORCE_OPT = typer.Option(False, "--force",
                         help="Run even when the size estimate is above the limit (see docs/errors.md).")
JSON_OPT = typer.Option(False, "--json", help="For scripts: print one JSON document on stdout (the result folder "
                                              "and the numbers) and nothing else there; warnings stay on stderr.")


def emit_json(document: object) -> None:
    """``document`` as the command's one JSON document on stdout: strict JSON (NaN and infinities as null)."""
    import json

    from simbatch.app.results import json_safe

    typer.echo(json.dumps(json_safe(document), indent=2, allow_nan=False))


class BadInput(Exception):
    """A command-line value that cannot be used; the message names the option, the value and the fix."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` and Ctrl-C Python's own KeyboardInterrupt while the command runs
    (replacing :mod:`simbatch.app.console`'s start-up handler; only the main thread can set a handler)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_terminated), signal.signal(signal.SIGINT, raise_keyboard_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


class _QuietWhenClosed:
    """Standard output that, once its reader has gone (a broken pipe), discards the rest.

    The run goes on and writes its result folder: ``| head`` wanted the first lines, not less work.
    Any other failure to write (``> /dev/full``) is kept in ``failure`` and reported by the command's
    wrapper as one line (raising here would not do: click probes streams and swallows what they raise).
    """

    def __init__(self, stream):
        self._stream = stream
        self._closed = False
        self.failure: str | None = None

    def _guarded(self, action: Callable[[], object]) -> None:
        if self._closed:
            return
        try:
            action()
        except OSError as exc:
            self._closed = True
            with contextlib.suppress(OSError, ValueError):
                # Python flushes stdout once more at exit; pointed at /dev/null, that flush succeeds.
                os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
            if not isinstance(exc, BrokenPipeError):
                self.failure = f"cannot write to standard output: {exc.strerror or exc}"

    def write(self, text: str) -> int:
        self._guarded(lambda: self._stream.write(text))
        return len(text)

    def flush(self) -> None:
        self._guarded(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def reports_bad_input(command: Callable) -> Callable:
    """Turn every kind of bad input raised by ``command`` into lines on stderr and exit code 2,
    and an interruption (Ctrl-C, SIGTERM) into "interrupted" and exit code 130 or 143."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        # Before the try, so that the handlers below can name them (an interruption here reaches console.main).
        from simbatch.inputs.guard import TooLarge
        from simbatch.inputs.loading import ScenarioError

        stdout = sys.stdout
        sys.stdout = guarded = _QuietWhenClosed(stdout)
        forget_signals()
        try:
            with _sigterm_raises():
                result = command(*args, **kwargs)
                guarded.flush()  # now, so that a failing stdout is one line here, not a traceback at exit
                if guarded.failure:
                    raise OutputError(guarded.failure)
                return result
        except ScenarioError as exc:
            for problem in exc.problems:
                typer.echo(printable(problem), err=True)
        except (BadInput, OutputError, TooLarge) as exc:
            typer.echo(printable(exc), err=True)
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except Terminated:
            typer.echo("interrupted (terminated)", err=True)
            raise typer.Exit(EXIT_TERMINATED) from None
        except Exception:
            # A library may re-raise a signal's exception as its own error (simbatch.app.errors): still the signal.
            signum = interrupting_signal()
            if signum is None:
                raise
            message, code = interruption(signum)
            typer.echo(message, err=True)
            raise typer.Exit(code) from None
        finally:
            sys.stdout = stdout
        raise typer.Exit(EXIT_BAD_INPUT)

    return wrapper


def warn(scenario: Scenario, workload, mode_fixed: bool = True) -> None:
    """Print each of :func:`simbatch.app.advice.advisories` as a ``warning:`` line on stderr."""
    from simbatch.app.advice import advisories  # the engine's rules; imported when a command needs them

    for line in advisories(scenario, workload, mode_fixed):
        typer.echo(f"warning: {printable(line)}", err=True)


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

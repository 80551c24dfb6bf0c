"""The ``simbatch`` console script: the command line, stoppable at any moment.

A command reports Ctrl-C and SIGTERM as "interrupted" (exit 130 or 143) after removing what it
was writing (:func:`simbatch.app.cli.common.reports_bad_input`). Before a command starts, Python is
importing the machinery for the good part of a second, and a signal then is the same interruption,
not a traceback from the middle of an import nor a silent death by SIGTERM: this module, which
imports nothing heavy, takes SIGTERM first and imports the command line after. Ctrl-C, until the
command starts (and Python's own KeyboardInterrupt takes over), raises :class:`Interrupted`: the
command modules import their machinery when they run, so most of the start-up is typer parsing the
command line, and typer would end a KeyboardInterrupt there with exit 130 and not a word.
"""

from __future__ import annotations

import signal
import sys

from simbatch.app.errors import (
    Interrupted,
    Terminated,
    forget_signals,
    interrupting_signal,
    interruption,
    raise_interrupted,
    raise_terminated,
)


def main() -> None:
    forget_signals()
    signal.signal(signal.SIGTERM, raise_terminated)
    signal.signal(signal.SIGINT, raise_interrupted)
    try:
        from simbatch.app.cli import app

        app()
    except (KeyboardInterrupt, Interrupted):
        _interrupted(signal.SIGINT)
    except Terminated:
        _interrupted(signal.SIGTERM)
    except Exception:
        # A library may re-raise a signal's exception as its own error (errors._received): still the signal.
        signum = interrupting_signal()
        if signum is None:
            raise
        _interrupted(signum)


def _interrupted(signum: int) -> None:
    message, code = interruption(signum)
    sys.stderr.write(message + "\n")
    sys.exit(code)

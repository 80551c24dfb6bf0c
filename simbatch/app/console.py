"""The ``simbatch`` console script: the command line, stoppable at any moment.

A command reports Ctrl-C and SIGTERM as "interrupted" (exit 130 or 143) after removing what it
was writing (:func:`simbatch.app.cli.common.reports_bad_input`). Before a command starts, Python is
importing the machinery for the good part of a second, and a signal then is the same interruption,
not a traceback from the middle of an import nor a silent death by SIGTERM: this module, which
imports nothing heavy, takes SIGTERM first and imports the command line after.
"""

from __future__ import annotations

import signal
import sys

from simbatch.app.errors import Terminated, raise_terminated


def main() -> None:
    signal.signal(signal.SIGTERM, raise_terminated)
    try:
        from simbatch.app.cli import app

        app()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(128 + signal.SIGINT)
    except Terminated:
        sys.stderr.write("interrupted (terminated)\n")
        sys.exit(128 + signal.SIGTERM)

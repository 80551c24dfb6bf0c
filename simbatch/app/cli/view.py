"""``simbatch view RESULT_DIR``: a result folder's report.html, in a browser.

On a desktop the report opens in the default browser (Python's ``webbrowser``). Where there is no
browser to open (a server reached over SSH: Linux with neither ``DISPLAY`` nor ``WAYLAND_DISPLAY``,
or ``webbrowser`` finding none), or with ``--no-browser``, the folder is served read-only on
127.0.0.1 at a free port and the URL printed: forward the port, keeping its number (``ssh -L
PORT:127.0.0.1:PORT``), and open it there.
Ctrl-C stops the server at once.

The server answers with the folder's own files and nothing else: a path that leads out of it (``..``,
a symbolic link to elsewhere) or to a folder is not found (no listings), and a request not addressed
to localhost is refused (:mod:`simbatch.app.localhost`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from simbatch.app.cli.common import BadInput, reports_bad_input
from simbatch.app.text import printable

if TYPE_CHECKING:
    import http.server

POLL_S = 0.25  # how often the server checks that it should stop (Ctrl-C itself interrupts at once)


def has_display() -> bool:
    """Whether a graphical browser could open here (always assumed off Linux)."""
    if not sys.platform.startswith("linux"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def serve_until_stopped(server: http.server.HTTPServer, what: str, path: str) -> None:
    """Print ``what``'s URL (``path`` on the server), then serve until Ctrl-C, which ends it at once."""
    with server:
        url = f"http://127.0.0.1:{server.server_port}/{path}"
        typer.echo(f"Serving {what} at {url}  (Ctrl-C stops)")
        sys.stdout.flush()
        try:
            server.serve_forever(poll_interval=POLL_S)
        except KeyboardInterrupt:
            typer.echo("stopped")


def make_server(folder: Path, port: int = 0) -> http.server.HTTPServer:
    """The server of ``folder``'s own files on 127.0.0.1 (``port`` 0: a free one)."""
    # Here, not at the top: `simbatch --help` lists this command without a web server.
    from simbatch.app.localhost import folder_server

    return folder_server(folder, port)


def serve(folder: Path) -> None:
    """Serve ``folder`` on 127.0.0.1 at a free port until Ctrl-C; print the report's URL first."""
    serve_until_stopped(make_server(folder), printable(folder), "report.html")


FOLDER_ARG = typer.Argument(..., metavar="RESULT_DIR", show_default=False,
                            help="A folder written by simbatch run or compare.")
NO_BROWSER_OPT = typer.Option(False, "--no-browser", help="Serve the folder on 127.0.0.1 and print the URL instead.")


@reports_bad_input
def view(folder: Path = FOLDER_ARG, no_browser: bool = NO_BROWSER_OPT) -> None:
    """Open a result folder's report.html in a browser, or serve it on localhost and print the URL."""
    import webbrowser

    report = folder / "report.html"
    if not report.is_file():
        raise BadInput(f"{printable(folder)}: no report.html there; give a folder written by simbatch run or "
                       "compare without --no-plots")
    if not no_browser and has_display() and webbrowser.open(report.resolve().as_uri()):
        typer.echo(f"Opened {printable(report)}")
        return
    serve(folder)

"""``simbatch explore SCENARIO``: sliders that re-simulate a scenario at lesson size, in the browser."""

from __future__ import annotations

from pathlib import Path

import typer

from simbatch.app.cli.common import BadInput, reports_bad_input
from simbatch.app.cli.view import serve_until_stopped
from simbatch.app.text import printable

SCENARIO_ARG = typer.Argument(..., metavar="SCENARIO.yaml", show_default=False, help="The scenario to explore.")
PORT_OPT = typer.Option(0, "--port", min=0, max=65535, help="Port on 127.0.0.1 (0: a free one).")


@reports_bad_input
def explore(scenario_file: Path = SCENARIO_ARG, port: int = PORT_OPT) -> None:
    """Serve a page of sliders (rate, B_max, tau0, beta, mode, policy) that re-simulates and redraws.

    Each change runs the scenario again at lesson size (400 requests) and replaces the plots; the
    page is served on 127.0.0.1 and its URL printed. Ctrl-C stops it.
    """
    from simbatch.app.explore import make_server

    try:
        server = make_server(scenario_file, port)
    except OSError as exc:
        raise BadInput(f"--port {port}: {exc.strerror or exc}; choose another port, or 0 for a free one") from None
    serve_until_stopped(server, f"the explorer of {printable(scenario_file)}", "")

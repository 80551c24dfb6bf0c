"""The ``simbatch`` command.

    simbatch run SCENARIO.yaml        simulate, print the tables, write a result folder
    simbatch compare SCENARIO.yaml    the same requests under several batching modes
    simbatch validate SCENARIO.yaml   check a scenario without running it
    simbatch schema                   the scenario JSON Schema
    simbatch capacity [SCENARIO.yaml] the analytic throughput model
    simbatch sweep SCENARIO.yaml      a grid of parameters x replications, locally or on Dask
    simbatch capacity-search ...      the highest arrival rate that meets the SLOs
    simbatch placement SCENARIO.yaml  the best prefill:decode split of N replicas (disaggregated)
    simbatch plan SCENARIO.yaml       the cheapest fleet (GPU, settings, replicas) that meets the SLOs
    simbatch presets                  the model and GPU cards behind device.preset
    simbatch calibrate FILE...        device costs fitted to per-step timings or vllm bench serve results
    simbatch replay RESULT.json       a vllm bench serve run simulated, beside what it measured
    simbatch view RESULT_DIR          open a result folder's report.html (or serve it on localhost)
    simbatch explore SCENARIO.yaml    sliders that re-simulate a scenario, on a localhost page

Each command lives in its own module; this one only assembles them. The console script is
:func:`simbatch.app.console.main`, which wraps this app.
"""

from __future__ import annotations

import typer

from simbatch import __version__
from simbatch.app.cli.bench_flags import BenchCommand
from simbatch.app.cli.capacity import capacity
from simbatch.app.cli.explore import explore
from simbatch.app.cli.hardware import calibrate, presets
from simbatch.app.cli.inspect import schema, validate
from simbatch.app.cli.placement import placement
from simbatch.app.cli.plan import plan
from simbatch.app.cli.replay import replay
from simbatch.app.cli.run import compare, run
from simbatch.app.cli.sweep import register as register_sweep
from simbatch.app.cli.view import view

app = typer.Typer(
    name="simbatch",
    help="Simulate how an LLM inference server batches and schedules requests.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    # Plain help: typer's rich help imports rich's Markdown renderer, a quarter of a second of start-up
    # on every --help (benchmarks/cli.py holds --help to 0.3 s), for boxes around the same text.
    rich_markup_mode=None,
)
for command in (run, compare):
    app.command(cls=BenchCommand)(command)  # vllm bench serve's flags, --goodput's separate pairs included
for command in (validate, schema, capacity, presets, calibrate, replay, placement):
    app.command()(command)
register_sweep(app)
app.command()(plan)
app.command()(view)
app.command()(explore)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"simbatch {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """Simulate how an LLM inference server batches and schedules requests."""

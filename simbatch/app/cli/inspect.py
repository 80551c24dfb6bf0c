"""``simbatch validate`` and ``simbatch schema``: check a scenario without running it; describe them all."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from simbatch.app.cli.common import FORCE_OPT, reports_bad_input, warn
from simbatch.app.cli.run import SCENARIO_ARG, SET_OPT
from simbatch.app.text import printable


@reports_bad_input
def validate(scenario_file: Path = SCENARIO_ARG, sets: list[str] = SET_OPT, force: bool = FORCE_OPT) -> None:
    """Check a scenario, and the data files it reads, without simulating it."""
    from simbatch.analysis.capacity import expected_stability
    from simbatch.inputs import guard
    from simbatch.inputs.loading import load_scenario
    from simbatch.workload import generate

    scenario = load_scenario(scenario_file, sets)
    guard.check_run(scenario, force)
    workload = generate(scenario)  # reads and checks traces and length files row by row
    warn(scenario, workload, mode_fixed=False)  # the scenario may be meant for `compare`
    st = expected_stability(scenario, workload)
    typer.echo(f"{printable(scenario_file)}: OK: {len(workload):,} requests, {scenario.batching.mode} batching; "
               f"{st.verdict}")


@reports_bad_input
def schema() -> None:
    """Print the JSON Schema of a scenario file (point your editor's YAML support at it)."""
    from simbatch.config import Scenario

    typer.echo(json.dumps(Scenario.model_json_schema(), indent=2))

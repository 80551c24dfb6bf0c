"""``simbatch run`` and ``simbatch compare``: simulate a scenario, print its tables, write its folder."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import typer

from simbatch import guard, report, results
from simbatch.cli.common import FORCE_OPT, BadInput, overrides, progress, reports_bad_input, warn
from simbatch.config import Batching, Scenario
from simbatch.loading import load_scenario
from simbatch.simulation import Result, expected_stability, simulate
from simbatch.text import printable
from simbatch.workload import generate

MODES: tuple[str, ...] = get_args(Batching.model_fields["mode"].annotation)

SCENARIO_ARG = typer.Argument(..., metavar="SCENARIO.yaml", help="The scenario file (see `simbatch schema`).",
                              show_default=False)
SET_OPT = typer.Option(None, "--set", metavar="KEY=VALUE",
                       help="Override one scenario value, e.g. --set workload.arrival.rate=4 (repeatable).")
SEED_OPT = typer.Option(None, "--seed", metavar="N", help="Root seed (sets `seed`).")
OUT_OPT = typer.Option(None, "--out", metavar="DIR",
                       help="Result folder (must not exist or be empty) [default: results/<name>/<time>].")
QUIET_OPT = typer.Option(False, "--quiet", "-q", help="Print only the result folder's path; no progress bar.")


def _simulate(scenario: Scenario, label: str, total: int, quiet: bool) -> Result:
    with progress(label, total, quiet) as on_progress:
        return simulate(scenario, on_progress=on_progress)


@reports_bad_input
def run(scenario_file: Path = SCENARIO_ARG,
        mode: str = typer.Option(None, "--mode", metavar="MODE",
                                 help="static, dynamic or continuous (sets batching.mode)."),
        sets: list[str] = SET_OPT, seed: str = SEED_OPT, out: Path = OUT_OPT, quiet: bool = QUIET_OPT,
        force: bool = FORCE_OPT) -> None:
    """Simulate a scenario: stability check, result table, Little's law, and a result folder."""
    scenario = load_scenario(scenario_file, overrides(sets, **{"batching.mode": mode, "seed": seed}))
    guard.check_run(scenario, force)
    folder = out or results.default_folder(scenario.name)
    results.check_target(folder)
    workload = generate(scenario)
    warn(scenario, workload)
    say = (lambda text: None) if quiet else typer.echo
    say(report.stability_block(expected_stability(scenario, workload)))
    result = _simulate(scenario, scenario.batching.mode, len(workload), quiet)
    say(report.result_table(result.summary))
    for extra in (report.rejections_line(result.requests), report.tenant_table(result.requests)):
        if extra:
            say(extra)
    say(report.littles_law_line(result.summary))
    folder = results.write_run(folder, result, unique=out is None)
    typer.echo(f"Results written to {printable(folder)}" if not quiet else printable(folder))


def parse_modes(text: str) -> list[str]:
    """``"static,continuous"`` -> ["static", "continuous"], or BadInput naming what is wrong."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        what = f"{unknown[0]!r} is not a batching mode" if unknown else "no mode given"
        raise BadInput(f"--modes {text!r}: {what}; give a comma-separated list of {', '.join(MODES)}")
    if len(set(modes)) < len(modes):
        raise BadInput(f"--modes {text!r}: a mode is listed twice; list each once")
    return modes


@reports_bad_input
def compare(scenario_file: Path = SCENARIO_ARG,
            modes: str = typer.Option(",".join(MODES), "--modes", metavar="M1,M2,...",
                                      help="Batching modes to compare, comma-separated."),
            sets: list[str] = SET_OPT, seed: str = SEED_OPT, out: Path = OUT_OPT,
            quiet: bool = QUIET_OPT, force: bool = FORCE_OPT) -> None:
    """Run one scenario under several batching modes, on the very same requests, side by side."""
    chosen = parse_modes(modes)
    scenarios = {m: load_scenario(scenario_file, overrides(sets, **{"batching.mode": m, "seed": seed}))
                 for m in chosen}
    first = scenarios[chosen[0]]
    guard.check_run(first, force)
    folder = out or results.default_folder(first.name, prefix="compare-")
    results.check_target(folder)
    # The workload is drawn from streams the mode never touches, so one draw serves every mode.
    workload = generate(first)
    warn(first, workload, mode_fixed=False)
    say = (lambda text: None) if quiet else typer.echo
    say(report.stability_block(expected_stability(first, workload)))
    runs = {m: _simulate(sc, m, len(workload), quiet) for m, sc in scenarios.items()}
    say(report.compare_table(runs))
    for m, r in runs.items():
        say(f"{m}: {report.littles_law_line(r.summary)}")
    folder = results.write_compare(folder, runs, unique=out is None)
    typer.echo(f"Results written to {printable(folder)}" if not quiet else printable(folder))

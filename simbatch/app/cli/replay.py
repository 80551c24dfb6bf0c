"""``simbatch replay``: a ``vllm bench serve`` run simulated, beside what it measured."""

from __future__ import annotations

from pathlib import Path

import typer

from simbatch.app.cli.common import FORCE_OPT, BadInput, reports_bad_input
from simbatch.app.text import printable

RESULT_ARG = typer.Argument(..., metavar="RESULT.json", show_default=False,
                            help="A vllm bench serve --save-result file (any release; --save-detailed replays its "
                                 "own requests).")
SCENARIO_OPT = typer.Option(None, "--scenario", metavar="S.yaml", show_default=False,
                            help="The server: device, batching, kv_cache, ... (its workload is replaced by the "
                                 "benchmark's, but for lengths a file without them needs).")
SET_OPT = typer.Option(None, "--set", metavar="KEY=VALUE",
                       help="Override a scenario value, e.g. --set device.preset=llama-3.1-8b/H100-SXM (repeatable).")
OUT_OPT = typer.Option(None, "--out", metavar="DIR", show_default=False,
                       help="Also write the simulated run's result folder here.")


def run_replay(result, data: dict, source: str, base_dir: Path | None, force: bool, quiet: bool, label: str = ""):
    """Plan, guard and simulate one replay; (replay, simulation result, measured summary, simulated
    summary, notes). Shared with ``calibrate --check``."""
    from simbatch.app import replay
    from simbatch.app.cli.run import _simulate
    from simbatch.inputs import guard

    try:
        plan = replay.plan(result, data, source, base_dir)
    except ValueError as exc:
        if type(exc) is not ValueError:
            raise
        raise BadInput(str(exc)) from None
    guard.check_run(plan.scenario, force)
    sim = _simulate(plan.scenario, label or "replay", len(plan.workload), quiet, plan.workload)
    measured, notes = replay.measured_summary(result)
    simulated = replay.simulated_summary(plan, sim.summary, sim.requests)
    return plan, sim, measured, simulated, notes + replay.notes(plan, measured)


class _Column:
    """A column of the comparison table: a summary, no frames."""

    def __init__(self, summary: dict):
        self.summary, self.iterations = summary, None


def side_by_side(measured: dict, simulated: dict) -> str:
    from simbatch.app import report

    return report.compare_table({"measured": _Column(measured), "simulated": _Column(simulated)}, against="measured")


@reports_bad_input
def replay(result_file: Path = RESULT_ARG, scenario: Path = SCENARIO_OPT, sets: list[str] = SET_OPT,
           seed: int = typer.Option(None, "--seed", metavar="N", help="Seed of the redrawn arrivals (sets `seed`)."),
           out: Path = OUT_OPT, no_plots: bool = typer.Option(False, "--no-plots", help="With --out: no plots."),
           quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
           force: bool = FORCE_OPT) -> None:
    """Simulate the benchmark a vllm bench serve result describes; print measured beside simulated, with the error.

    simbatch replay bench.json --set device.preset=llama-3.1-8b/H100-SXM;
    simbatch replay bench.json --scenario server.yaml
    """
    from simbatch.app import results
    from simbatch.app.replay import base_data
    from simbatch.workload import bench_result

    if scenario is not None and not scenario.is_file():
        raise BadInput(f"--scenario {printable(scenario)}: {'not a file' if scenario.exists() else 'file not found'}")
    if not result_file.is_file():
        raise BadInput(f"{printable(result_file)}: {'not a file' if result_file.exists() else 'file not found'}; "
                       "give a vllm bench serve --save-result JSON file")
    try:
        result = bench_result.read(result_file)
    except bench_result.BenchResultError as exc:
        raise BadInput(str(exc)) from None
    if out is not None:
        results.check_target(out)
    data, source, base_dir = base_data(scenario, [*(sets or []), *([f"seed={seed}"] if seed is not None else [])])
    plan, sim, measured, simulated, notes = run_replay(result, data, source, base_dir, force, quiet)
    for line in plan.lines():
        typer.echo(printable(line))
    for note in notes:
        typer.echo(f"note: {printable(note)}")
    typer.echo(side_by_side(measured, simulated))
    if out is not None:
        folder = results.write_run(out, sim, unique=False, with_plots=not no_plots)
        typer.echo(f"Results written to {printable(folder)}")

"""``simbatch run`` and ``simbatch compare``: simulate a scenario, print its tables, write its folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from simbatch.app.cli.bench_flags import (
    BurstinessOpt,
    GoodputOpt,
    MaxConcurrencyOpt,
    MetricPercentilesOpt,
    NumPromptsOpt,
    PercentileMetricsOpt,
    RequestRateOpt,
    bench_overrides,
)
from simbatch.app.cli.common import (
    FORCE_OPT,
    JSON_OPT,
    BadInput,
    emit_json,
    overrides,
    progress,
    reports_bad_input,
    warn,
)
from simbatch.app.text import printable

if TYPE_CHECKING:
    from simbatch.config import Scenario
    from simbatch.simulation import Result

# Commands import the schema, the simulator, the frames and the plots when they run, so that
# `simbatch --help` costs neither pydantic, NumPy, pandas, SimPy nor matplotlib.


def batching_modes() -> tuple[str, ...]:
    """The batching modes the schema accepts (the registry's)."""
    from simbatch.registry import MODES

    return MODES.names()

SCENARIO_ARG = typer.Argument(..., metavar="SCENARIO.yaml", help="The scenario file (see `simbatch schema`).",
                              show_default=False)
SET_OPT = typer.Option(None, "--set", metavar="KEY=VALUE",
                       help="Override one scenario value, e.g. --set workload.arrival.rate=4 (repeatable).")
SEED_OPT = typer.Option(None, "--seed", metavar="N", help="Root seed (sets `seed`).")
OUT_OPT = typer.Option(None, "--out", metavar="DIR",
                       help="Result folder (must not exist or be empty); default: results/<name>/<time>.")
QUIET_OPT = typer.Option(False, "--quiet", "-q", help="Print only the result folder's path; no progress bar.")


NO_PLOTS_OPT = typer.Option(False, "--no-plots", help="Write no plots and no report.html (batch use: faster, smaller folders).")
TRACE_OPT = typer.Option(False, "--trace", help="Also write trace.json, a Chrome trace of every step and request "
                                                "(open it in ui.perfetto.dev or chrome://tracing).")
TRACE_MAX_OPT = typer.Option(None, "--trace-max-requests", metavar="N", show_default=False,
                             help="Trace the first N requests and the steps until the next one arrives "
                                  "(default 10000; implies --trace).")


def _simulate(scenario: Scenario, label: str, total: int, quiet: bool, workload=None, observers=()) -> Result:
    from simbatch.simulation import simulate

    with progress(label, total, quiet) as on_progress:
        return simulate(scenario, on_progress=on_progress, workload=workload, observers=observers)


def _tracer(scenario: Scenario, trace: bool, max_requests: int | None):
    """The trace observer ``--trace`` asks for, or None."""
    from simbatch.observe.perfetto import DEFAULT_MAX_REQUESTS, TraceObserver

    if max_requests is not None and max_requests < 1:
        raise BadInput(f"--trace-max-requests {max_requests}: must be at least 1, e.g. --trace-max-requests 10000")
    if not trace and max_requests is None:
        return None
    return TraceObserver(scenario, max_requests or DEFAULT_MAX_REQUESTS)


def _table(scenario: Scenario, summary: dict) -> str:
    from simbatch.app import report

    return report.result_table(summary, scenario.metrics.percentile_metrics, scenario.metrics.metric_percentiles)


@reports_bad_input
def run(scenario_file: Path = SCENARIO_ARG,
        mode: str = typer.Option(None, "--mode", metavar="MODE",
                                 help="static, dynamic or continuous (sets batching.mode)."),
        sets: list[str] = SET_OPT, seed: str = SEED_OPT, out: Path = OUT_OPT, quiet: bool = QUIET_OPT,
        no_plots: bool = NO_PLOTS_OPT, request_rate: RequestRateOpt = None, burstiness: BurstinessOpt = None,
        num_prompts: NumPromptsOpt = None, max_concurrency: MaxConcurrencyOpt = None,
        percentile_metrics: PercentileMetricsOpt = None, metric_percentiles: MetricPercentilesOpt = None,
        goodput: GoodputOpt = None, force: bool = FORCE_OPT, trace: bool = TRACE_OPT,
        trace_max_requests: int = TRACE_MAX_OPT, as_json: bool = JSON_OPT) -> None:
    """Simulate a scenario: stability check, result table, Little's law, and a result folder.

    The flags named as in `vllm bench serve` (--request-rate, --burstiness, --num-prompts,
    --max-concurrency, --percentile-metrics, --metric-percentiles, --goodput) set scenario keys.
    """
    from simbatch.analysis.capacity import expected_stability
    from simbatch.app import report, results
    from simbatch.hardware.report import preset_block
    from simbatch.inputs import guard
    from simbatch.inputs.loading import load_scenario
    from simbatch.workload import generate

    bench = bench_overrides(request_rate, burstiness, num_prompts, max_concurrency, percentile_metrics,
                            metric_percentiles, goodput)
    scenario = load_scenario(scenario_file, overrides([*(sets or []), *bench], **{"batching.mode": mode, "seed": seed}))
    guard.check_run(scenario, force)
    tracer = _tracer(scenario, trace, trace_max_requests)
    folder = out or results.default_folder(scenario.name)
    results.check_target(folder)
    workload = generate(scenario)
    warn(scenario, workload)
    say = (lambda text: None) if quiet or as_json else typer.echo
    if block := preset_block(scenario):
        say(block)
    say(report.stability_block(expected_stability(scenario, workload)))
    if note := report.client_note(scenario.workload):
        say(note)
    result = _simulate(scenario, scenario.batching.mode, len(workload), quiet, workload,
                       () if tracer is None else (tracer,))
    if result.fleet is not None:  # what autoscaling bought: the fixed fleet of the same cost, same requests
        from simbatch.app.equal_cost import equal_cost_fleet

        result.summary |= equal_cost_fleet(result, workload)
    say(_table(scenario, result.summary))
    for extra in (report.rejections_line(result.requests), report.tenant_table(result.requests),
                  report.autoscale_lines(result.summary)):
        if extra:
            say(extra)
    say(report.littles_law_line(result.summary))
    folder = results.write_run(folder, result, unique=out is None, with_plots=not no_plots, trace=tracer)
    if tracer is not None and tracer.notice:
        say(tracer.notice)
    if as_json:
        emit_json({"folder": str(folder), "summary": results.summary_record(result)})
        return
    typer.echo(f"Results written to {printable(folder)}" if not quiet else printable(folder))


def parse_modes(text: str) -> list[str]:
    """``"static,continuous"`` -> ["static", "continuous"], or BadInput naming what is wrong."""
    modes, known = [m.strip() for m in text.split(",") if m.strip()], batching_modes()
    unknown = [m for m in modes if m not in known]
    if unknown or not modes:
        what = f"{unknown[0]!r} is not a batching mode" if unknown else "no mode given"
        raise BadInput(f"--modes {text!r}: {what}; give a comma-separated list of {', '.join(known)}")
    if len(set(modes)) < len(modes):
        raise BadInput(f"--modes {text!r}: a mode is listed twice; list each once")
    return modes


SOURCES_ARG = typer.Argument(..., metavar="SCENARIO.yaml | RUN...", show_default=False,
                             help="One scenario file to run in variants, or two or more result folders "
                                  "and vllm bench serve --save-result JSON files to set side by side.")


VARY_OPT = typer.Option(None, "--vary", metavar="KEY=A,B,C",
                        help="A column per value of a scenario key, e.g. --vary scheduler.policy=fcfs,sjf,priority; "
                             "repeated: their product.")
VARIANT_OPT = typer.Option(None, "--variant", metavar="KEY=V;KEY=V",
                           help="A column with these overrides (repeatable), e.g. --variant "
                                "'scheduler.policy=sjf;batching.max_num_seqs=32'.")


@reports_bad_input
def compare(sources: list[Path] = SOURCES_ARG,
            modes: str = typer.Option(None, "--modes", metavar="M1,M2,...", show_default=False,
                                      help="Batching modes to compare, comma-separated (default: all three, "
                                           "unless --vary or --variant is given)."),
            vary: list[str] = VARY_OPT, variant: list[str] = VARIANT_OPT,
            sets: list[str] = SET_OPT, seed: str = SEED_OPT, out: Path = OUT_OPT,
            quiet: bool = QUIET_OPT, no_plots: bool = NO_PLOTS_OPT, request_rate: RequestRateOpt = None,
            burstiness: BurstinessOpt = None, num_prompts: NumPromptsOpt = None,
            max_concurrency: MaxConcurrencyOpt = None, percentile_metrics: PercentileMetricsOpt = None,
            metric_percentiles: MetricPercentilesOpt = None, goodput: GoodputOpt = None,
            force: bool = FORCE_OPT, as_json: bool = JSON_OPT) -> None:
    """Side by side: one scenario's variants on the very same requests, or existing runs.

    simbatch compare scenarios/heavy_tail.yaml --vary scheduler.policy=fcfs,sjf,priority;
    simbatch compare results/a results/b vllm_result.json
    """
    from simbatch.app import report, results
    from simbatch.app.compare import CompareInputError, shares_workload, variants
    from simbatch.inputs import guard
    from simbatch.inputs.loading import load_scenario
    from simbatch.workload import generate

    say = (lambda text: None) if quiet or as_json else typer.echo
    bench = bench_overrides(request_rate, burstiness, num_prompts, max_concurrency, percentile_metrics,
                            metric_percentiles, goodput)
    try:
        if len(sources) > 1 or sources[0].is_dir() or sources[0].suffix == ".json":
            given = [flag for flag, value in (("--modes", modes), ("--vary", vary), ("--variant", variant),
                                              ("--set", sets), ("--seed", seed), ("a vllm bench serve flag", bench))
                     if value]
            if given:
                raise BadInput(f"{given[0]}: applies to a scenario, and these are existing runs; remove it")
            _compare_runs(sources, out, no_plots, quiet, say, force, as_json)
            return
        axes = list(vary or [])
        if modes is not None or not (axes or variant):
            # --modes is --vary batching.mode=..., and with nothing else to vary, every mode.
            every = ",".join(batching_modes())
            axes.append("batching.mode=" + ",".join(parse_modes(every if modes is None else modes)))
        columns = variants(axes, variant or [])
    except CompareInputError as exc:
        raise BadInput(str(exc)) from None
    scenario_file = sources[0]
    base = overrides([*(sets or []), *bench], seed=seed)
    scenarios = {label: load_scenario(scenario_file, [*base, *extra]) for label, extra in columns.items()}
    first = next(iter(scenarios.values()))
    for sc in scenarios.values():
        guard.check_run(sc, force)
    folder = out or results.default_folder(first.name, prefix="compare-")
    results.check_target(folder)
    # Variants that leave the workload section alone share one draw of it (common random numbers).
    shared = generate(first) if shares_workload(list(columns.values())) else None
    workload = shared if shared is not None else generate(first)
    warn(first, workload, mode_fixed=False)
    total = len(shared) if shared is not None else first.workload.num_requests or 0
    runs = {label: _simulate(sc, label, total, quiet, shared) for label, sc in scenarios.items()}
    say(report.compare_table(runs))  # each column with its own stability verdict: they differ
    for line in report.verdict_lines(runs):
        say(line)
    for label, r in runs.items():
        say(f"{label}: {report.littles_law_line(r.summary)}")
    folder = results.write_compare(folder, runs, unique=out is None, with_plots=not no_plots)
    if as_json:
        emit_json({"folder": str(folder), "columns": {label: results.summary_record(r) for label, r in runs.items()}})
        return
    typer.echo(f"Results written to {printable(folder)}" if not quiet else printable(folder))


def _compare_runs(sources: list[Path], out: Path | None, no_plots: bool, quiet: bool, say, force: bool,
                  as_json: bool) -> None:
    """``compare`` of existing runs: result folders and vLLM result files, read, tabled, plotted."""
    from simbatch.app import report, results
    from simbatch.app.compare import load_sources, write_sources

    if len(sources) < 2 or any(p.suffix in (".yaml", ".yml") for p in sources):
        raise BadInput(f"compare {' '.join(map(str, sources))}: give one scenario file, or two or more "
                       "result folders and vllm bench serve --save-result JSON files")
    runs = load_sources(sources, force, lambda line: typer.echo(f"warning: {printable(line)}", err=True))
    folder = out or results.default_folder("compare")
    results.check_target(folder)
    for note in (n for r in runs.values() for n in r.notes):
        typer.echo(f"note: {printable(note)}", err=True)
    say(report.compare_table(runs))
    for line in report.verdict_lines(runs):
        say(line)
    folder = write_sources(folder, sources, runs, with_plots=not no_plots, unique=out is None)
    if as_json:
        emit_json({"folder": str(folder), "columns": {label: s.summary for label, s in runs.items()}})
        return
    typer.echo(f"Results written to {printable(folder)}" if not quiet else printable(folder))

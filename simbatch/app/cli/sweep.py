"""The ``sweep`` and ``capacity-search`` commands; ``register(app)`` adds them to a typer app.

The work is in :mod:`simbatch.app.sweep`; this module turns arguments into a plan, bad input into one
line and exit code 2 (as every simbatch command does, through :mod:`simbatch.app.cli.common`), and
results into files and a short report. The sweep machinery (the simulator, matplotlib, scipy) is
imported when a command runs, so registering the commands costs ``simbatch --help`` nothing.
"""

from __future__ import annotations

import functools
import math
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from simbatch.app.text import mean_ci, printable

if TYPE_CHECKING:
    from simbatch.app.sweep.runner import Executor

ScenarioArg = Annotated[Path, typer.Argument(metavar="SCENARIO.yaml", help="The scenario file.",
                                             show_default=False)]
ParamOpt = Annotated[list[str] | None, typer.Option(
    "--param", "-p", metavar="KEY=VALUES",
    help="A swept parameter, repeatable: values 1,2,4; range start:stop:step (1:40:2); "
         "log range log:start:stop:n (log:1:64:7). The grid is the product of all --param.")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", metavar="KEY=VALUE", help="Override a scenario value for every point (repeatable).")]
ReplicationsOpt = Annotated[int, typer.Option(
    "--replications", "-r", help="Runs per point; replication r uses seed = scenario seed + r.")]
WorkersOpt = Annotated[int | None, typer.Option(
    "--workers", "-w", help="Local worker processes (default: all cores); 1 runs in this process.")]
AddressOpt = Annotated[str | None, typer.Option(
    "--scheduler-address", metavar="tcp://HOST:8786",
    help="Run on this Dask distributed cluster instead of local processes (see docs/distributed.md).")]
OutOpt = Annotated[Path | None, typer.Option(
    "--out", "-o", metavar="DIR",
    help="Output folder (default: results/<scenario name>/sweep-<time>, or capacity-<time>); rerunning the "
         "command with --out an earlier folder resumes it, reusing its finished runs.")]
NoPlotsOpt = Annotated[bool, typer.Option("--no-plots", help="Write the CSV files only, no plots.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="For scripts: print one JSON document on stdout (the folder and "
                                                      "every row of the table) and nothing else there.")]
SloOpt = Annotated[list[str] | None, typer.Option(
    "--slo", metavar="METRIC_STAT_ms=LIMIT",
    help="An SLO, repeatable: ttft/tpot/itl/e2el with mean/median/p50/p90/p99 or any pN, e.g. ttft_p99_ms=500 "
         "(vLLM's p99_ttft_ms also works). It holds when the replications' mean meets it.")]

_WRITING: list[Path] = []  # the folder the command writes its runs to, once it is known (to say how to resume)
ForceOpt = Annotated[bool, typer.Option(
    "--force", help="Run even when the size estimate is above the limit (see docs/errors.md).")]


def _reports_bad_input(command: Callable) -> Callable:
    """Bad input as every simbatch command reports it (:func:`simbatch.app.cli.common.reports_bad_input`).

    The sweep's own errors (arguments, output folder, executor) become :class:`BadInput`. Both are
    imported when the command runs: ``simbatch.app.cli`` imports this module, so a module-level import
    of ``simbatch.app.cli.common`` here would be circular.
    """

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        from simbatch.app.cli.common import BadInput, reports_bad_input
        from simbatch.app.errors import OutputError
        from simbatch.app.sweep.plan import SweepInputError
        from simbatch.app.sweep.runner import ExecutorError
        from simbatch.app.sweep.store import StoreError

        @reports_bad_input
        def checked():
            try:
                return command(*args, **kwargs)
            except (SweepInputError, StoreError, ExecutorError) as exc:
                raise BadInput(str(exc)) from None
            except OSError as exc:  # a full disk, a folder made read-only: what is written stays whole
                where = f"{exc.filename}: " if exc.filename else ""
                raise OutputError(f"cannot write {where}{exc.strerror or exc}; free some space or choose "
                                  "another --out, then rerun to resume") from None

        try:
            return checked()
        except typer.Exit as exc:
            if exc.exit_code in (128 + signal.SIGINT, 128 + signal.SIGTERM) and _WRITING:
                typer.echo(printable(f"the finished runs are in {_WRITING[0]}: run the command again with --out "
                                     f"{_WRITING[0]} to resume"), err=True)
            raise
        finally:
            _WRITING.clear()

    return wrapper


def _check(replications: int, workers: int | None, scheduler_address: str | None) -> None:
    from simbatch.app.sweep.plan import SweepInputError

    if replications < 1:
        raise SweepInputError(f"--replications {replications}: must be at least 1 "
                              "(3 or more for confidence intervals)")
    if workers is not None and workers < 1:
        raise SweepInputError(f"--workers {workers}: must be at least 1 (1 runs in this process)")
    if workers is not None and scheduler_address is not None:
        raise SweepInputError("--workers with --scheduler-address: give one; Dask has its own workers")


def _connect(workers: int | None, scheduler_address: str | None) -> Executor:
    """The executor, connected: called once the arguments are known good, before any file is written."""
    from simbatch.app.sweep.runner import Executor

    executor = Executor(workers, scheduler_address)
    executor.connect()
    return executor


@contextmanager
def _progress(total: int, what: str) -> Iterator[Callable[[], None] | None]:
    """A bar on stderr advanced once per finished item, drawn only on a terminal (never in logs or pipes)."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda: bar.advance(task)


@_reports_bad_input
def sweep(
    scenario: ScenarioArg,
    param: ParamOpt = None,
    set_: SetOpt = None,
    replications: ReplicationsOpt = 3,
    workers: WorkersOpt = None,
    scheduler_address: AddressOpt = None,
    out: OutOpt = None,
    no_plots: NoPlotsOpt = False,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a scenario over a grid of parameters with replications: summary.csv (means, 95 % CIs) and plots.

    Example: simbatch sweep scenarios/heavy_tail.yaml -p workload.arrival.rate=1,2,4,8
    -p batching.mode=static,continuous

    Exit code 1 when any point failed (the others are in summary.csv), 2 on bad input.
    """
    from simbatch.app.sweep.plan import Sweep

    _check(replications, workers, scheduler_address)
    plan = Sweep.plan(scenario, param or [], set_ or [], replications, out, force)
    _WRITING.append(plan.out)
    with _connect(workers, scheduler_address) as executor, _progress(len(plan.points), "points") as advance:
        frame, plots = plan.run(executor, advance, with_plots=not no_plots)
    failed = frame[frame["error"] != ""]
    if as_json:
        _emit(plan.out, "points", frame)
        _report_failures(failed, plan)
        return
    if plan.store.resumed:
        typer.echo(f"resumed {plan.store.resumed} of {plan.store.requested} points (runs) already in {plan.out}")
    typer.echo(f"{len(frame)} points x {replications} replications on {executor.description}; "
               f"{len(failed)} failed")
    _report_failures(failed, plan, exit_now=False)
    _print_table(frame, [p.key for p in plan.params], "mean ± 95 % CI half-width over "
                 f"{replications} replication{'s' * (replications > 1)}")
    for path in [plan.out / "summary.csv", *plots]:
        typer.echo(f"wrote {path}")
    if plots and "request_goodput_mean" not in frame:
        typer.echo("no goodput plot: the scenario sets no slo; add one, e.g. --set slo.ttft_ms=500")
    if len(failed):
        raise typer.Exit(1)  # a script must not mistake a partial table for the sweep it asked for


def _emit(folder: Path, key: str, frame) -> None:
    """The one JSON document of ``--json``: the folder, and the table's rows (NaN as null)."""
    from simbatch.app.cli.common import emit_json

    emit_json({"folder": str(folder), key: frame.to_dict(orient="records")})


def _report_failures(failed, plan, exit_now: bool = True) -> None:
    """A line on stderr per failed point; exit 1 (``exit_now``) when there is one."""
    for _, row in failed.iterrows():
        point = ", ".join(f"{p.key}={row[p.key]}" for p in plan.params)
        typer.echo(printable(f"  failed: {point}: {row['error']}"), err=True)
    if exit_now and len(failed):
        raise typer.Exit(1)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}"
    return str(value)


# The sweep's compact table: (column title, summary metric), when the metric is in summary.csv.
MAIN_METRICS = (("req/s", "request_throughput"), ("goodput req/s", "request_goodput"),
                ("output tok/s", "output_throughput"), ("mean TTFT ms", "mean_ttft_ms"),
                ("p99 TTFT ms", "p99_ttft_ms"), ("mean TPOT ms", "mean_tpot_ms"), ("p99 E2EL ms", "p99_e2el_ms"))


def _print_table(frame, keys: list[str], title: str) -> None:
    """The main metrics of every point of a sweep, mean ± 95 % CI, as a table on stdout."""
    from rich.console import Console
    from rich.table import Table

    metrics = [(title_, m) for title_, m in MAIN_METRICS if f"{m}_mean" in frame]
    table = Table(title=title)
    for key in keys:
        table.add_column(key.rsplit(".", 1)[-1], justify="right")
    for title_, _ in metrics:
        table.add_column(title_, justify="right")
    for _, row in frame.iterrows():
        cells = [_cell(row[k]) for k in keys]
        if row["replications"] == 0:
            table.add_row(*cells, *(["failed"] + [""] * (len(metrics) - 1)))
            continue
        table.add_row(*cells, *(mean_ci(row[f"{m}_mean"], row[f"{m}_ci95"]) for _, m in metrics))
    Console(width=max(100, 12 * len(keys) + 20 * len(metrics))).print(table)


@_reports_bad_input
def capacity_search(
    scenario: ScenarioArg,
    slo: SloOpt = None,
    param: ParamOpt = None,
    set_: SetOpt = None,
    replications: ReplicationsOpt = 3,
    tolerance: Annotated[float, typer.Option(
        help="Stop bisecting when the bracket is narrower than this fraction of its upper end.")] = 0.02,
    workers: WorkersOpt = None,
    scheduler_address: AddressOpt = None,
    out: OutOpt = None,
    no_plots: NoPlotsOpt = False,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """The highest arrival rate meeting every SLO, per configuration: bisection below the analytic capacity.

    Example: simbatch capacity-search scenarios/stable.yaml --slo ttft_p99_ms=500 --slo tpot_p99_ms=50
    -p batching.max_num_seqs=32,64

    Exit code 1 when any configuration has no answer (SLOs out of reach, a failed run), 2 on bad input.
    """
    from simbatch.app.sweep.capacity import CapacitySearch

    _check(replications, workers, scheduler_address)
    plan = CapacitySearch.plan(scenario, param or [], set_ or [], slo or [], replications, tolerance, out, force)
    _WRITING.append(plan.out)
    with _connect(workers, scheduler_address) as executor, \
            _progress(len(plan.configs), "configurations") as advance:
        frame = plan.run(executor, advance)
    written = [plan.out / "capacity.csv", plan.out / "probes.csv"]
    if len(plan.probes) and not no_plots:
        from simbatch.app.sweep.plots import plot_slo_vs_rate

        written.append(plot_slo_vs_rate(plan.probes, plan.slos, plan.keys, frame, plan.out / "slo_vs_rate.png"))
    if as_json:
        _emit(plan.out, "configurations", frame)
    else:
        _print_search(frame, plan.slos, written)
    unanswered = frame[frame["error"] != ""]
    for error in unanswered["error"]:
        typer.echo(printable(f"  no answer: {error}"), err=True)
    if len(unanswered):
        raise typer.Exit(1)


def _print_search(frame, slos, written: list[Path]) -> None:
    """A search's table on stdout, what its ratio means, and the files it wrote."""
    from rich.console import Console
    from rich.table import Table

    limits = ", ".join(f"{s.key} <= {s.limit_ms:g}" for s in slos)
    table = Table(title=f"highest arrival rate (requests/s) meeting {limits}")
    for column in frame.columns:
        table.add_column(column, justify="left" if frame[column].dtype == object else "right")
    for row in frame.itertuples(index=False):
        table.add_row(*(_cell(v) for v in row))
    Console(width=max(100, 16 * len(frame.columns))).print(table)
    typer.echo("ratio = max_rate / capacity_requests_per_s: the share of the analytic capacity (the rate at which "
               "the offered load ρ reaches 1) that this configuration can take while meeting every SLO.")
    for path in written:
        typer.echo(f"wrote {path}")


def register(app: typer.Typer) -> None:
    """Add ``sweep`` and ``capacity-search`` to ``app``."""
    app.command("sweep")(sweep)
    app.command("capacity-search")(capacity_search)

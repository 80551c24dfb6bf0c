"""``simbatch plan``: which GPU, how many, with which settings, at what cost, for this traffic and these SLOs.

The work is in :mod:`simbatch.app.plan`; this module turns arguments into a question, bad input into
one line and exit code 2, and the plan into tables, a ``vllm serve`` line and a result folder.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Annotated

import typer

from simbatch.app.cli.sweep import (
    AddressOpt,
    ForceOpt,
    ReplicationsOpt,
    ScenarioArg,
    SetOpt,
    SloOpt,
    WorkersOpt,
    _check,
    _connect,
    _progress,
    _reports_bad_input,
)
from simbatch.app.text import mean_ci, printable

ListOpt = Annotated[str | None, typer.Option(show_default=False)]


def _text(value: object) -> str:
    """A user's name or a message as a table cell: control characters escaped, and brackets too (rich
    would read ``[...]`` as markup)."""
    from rich.markup import escape

    return escape(printable(value))


def _money(x: float) -> str:
    return "-" if math.isnan(x) else f"${x:,.2f}" if x >= 0.995 else f"${x:.3f}"


def _num(x: float, digits: str = ".4g") -> str:
    return "-" if isinstance(x, float) and math.isnan(x) else f"{x:,{digits}}" if abs(x) >= 1000 else f"{x:{digits}}"


def _ranked_table(plan, frame):
    from rich.table import Table

    q = plan.question
    table = Table(title=f"configurations meeting {', '.join(lim.text for lim in q.limits)} at {q.rate:.4g} req/s, "
                  f"best first ({q.objective})")
    columns = ["#", "configuration", "replicas", "GPUs", "$/hour", "$/M out tok", "headroom req/s", "binding",
               *(lim.key for lim in q.limits if lim.key != "incomplete_requests"), "kWh/h", "tok/J"]
    for c in columns:
        table.add_column(c, justify="left" if c in ("configuration", "binding") else "right")
    for row in frame.itertuples(index=False):
        r = row._asdict()
        slo_cells = [mean_ci(r[lim.key], r[f"{lim.key}_ci95"], 2) for lim in q.limits
                     if lim.key != "incomplete_requests"]
        table.add_row(str(r["rank"]), _text(r["configuration"]), str(r["replicas"]), str(r["gpus"]),
                      _money(r["cost_per_hour"]),
                      _money(r["cost_per_million_output_tokens"]),
                      "-" if math.isnan(r["headroom_rate"]) else f"{_num(r['headroom_rate'])} (×{r['headroom_x']:.2f})",
                      r["binding"], *slo_cells,
                      _num(r["kwh_per_hour"], ".3g"), _num(r["output_tokens_per_joule"], ".3g"))
    return table


def _rejected_table(misses):
    from rich.table import Table

    table = Table(title="best rejected candidates, and why they fail")
    for c in ("configuration", "replicas", "GPUs", "$/hour", "judged by", "why"):
        table.add_column(c, justify="right" if c in ("replicas", "GPUs", "$/hour") else "left")
    for m in misses:
        table.add_row(_text(m["configuration"]), str(m["replicas"]), str(m["gpus"]), _money(m["cost_per_hour"]),
                      m["by"], _text(m["why"]))
    return table


def verdict_lines(plan) -> list[str]:
    """The answer in words: the winner, its cost and headroom, its launch lines (no timings: the report
    must be the same whatever executed the runs)."""
    from simbatch.app.plan.launch import describe
    from simbatch.app.plan.output import launches, ranked_frame

    q, best = plan.question, plan.ranked[0]
    row = ranked_frame(plan).iloc[0]
    replicas, gpus = int(row.replicas), int(row.gpus)
    lines = [f"Chosen: {best.config.label} x {replicas} replica{'s' * (replicas != 1)} ({gpus} {best.config.gpu} "
             f"GPU{'s' * (gpus != 1)}), {_money(row.cost_per_hour)}/hour at {q.prices.describe(best.config.gpu)}, "
             f"{_money(row.cost_per_million_output_tokens)} per million output tokens.",
             f"Headroom: {row.headroom_rate:.4g} req/s, {row.headroom_x:.2f}x the planned {q.rate:.4g} (then "
             f"{row.binding} binds)." if q.headroom else "Headroom: not searched (--no-headroom)."]
    lines += describe(launches(plan), best.screen.point.scenario.cluster.router)
    if math.isnan(row.kwh_per_hour):
        lines.append(f"energy: no idle_watts/max_watts for {best.config.gpu} in its GPU card or the prices file")
    lines.append(f"Prices from {q.prices.label}: prices vary by provider, region and week; bring yours with --prices.")
    return lines


def _counts(plan) -> str:
    cands = plan.candidates
    invalid = sum(1 for c in cands if c.screen.reason.startswith("invalid"))
    screened = sum(1 for c in cands if c.status == "screened") - invalid
    return (f"{len(cands)} configurations: {invalid} invalid, {screened} ruled out by the closed forms, "
            f"{sum(1 for c in cands if not c.at and c.status == 'outranked')} outranked by their bounds without a "
            f"simulation, {sum(1 for c in cands if c.at)} simulated")


@_reports_bad_input
def plan(
    scenario: ScenarioArg,
    slo: SloOpt = None,
    goodput: Annotated[list[str] | None, typer.Option(
        "--goodput", metavar="METRIC:MS",
        help="Per-request SLOs in vLLM's syntax, --goodput 'ttft:500 tpot:50': met when at least --attainment of "
             "the requests meet every one.")] = None,
    attainment: Annotated[float, typer.Option(help="The share of requests that must meet --goodput.")] = 0.99,
    space: Annotated[Path | None, typer.Option(
        "--space", metavar="SPACE.yaml", help="The search space (docs/planning.md); flags below override it.")] = None,
    model: Annotated[str | None, typer.Option("--model", metavar="M1,M2", help="Model cards.")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", metavar="G1,G2", help="GPU cards.")] = None,
    tensor_parallel_size: Annotated[str | None, typer.Option(
        "--tensor-parallel-size", "--tp", metavar="1,2,4", help="GPUs per replica.")] = None,
    quantization: Annotated[str | None, typer.Option(
        "--quantization", metavar="none,fp8", help="Weight precision: none (bf16) or fp8.")] = None,
    max_num_seqs: Annotated[str | None, typer.Option("--max-num-seqs", metavar="64,256")] = None,
    max_num_batched_tokens: Annotated[str | None, typer.Option("--max-num-batched-tokens", metavar="2048,8192")] = None,
    split: Annotated[str | None, typer.Option(
        "--split", metavar="1:1,1:2", help="Disaggregated prefill:decode ratios to try too.")] = None,
    max_replicas: Annotated[int | None, typer.Option(
        "--max-replicas", help="The largest fleet searched (replicas, or units of a split; default 64).")] = None,
    prices: Annotated[Path | None, typer.Option(
        "--prices", metavar="PRICES.yaml", help="Prices per GPU-hour (default: the shipped example, "
        "simbatch/data/gpu_prices.yaml).")] = None,
    objective: Annotated[str, typer.Option(
        help="cost (lowest $/hour), gpus (fewest GPUs) or goodput-per-dollar.")] = "cost",
    top: Annotated[int, typer.Option(help="Configurations ranked (each bisected for its headroom).")] = 10,
    replications: ReplicationsOpt = 3,
    tolerance: Annotated[float, typer.Option(
        help="The headroom's bisection stops when its bracket is narrower than this fraction of its "
             "upper end.")] = 0.05,
    headroom: Annotated[bool, typer.Option(
        "--headroom/--no-headroom", help="Bisect each ranked fleet for the highest rate it carries within the "
        "SLOs (--no-headroom: the sizing alone, faster).")] = True,
    request_rate: Annotated[str | None, typer.Option(
        "--request-rate", metavar="R", help="The planned rate, requests/s (sets workload.arrival.rate).")] = None,
    set_: SetOpt = None,
    workers: WorkersOpt = None,
    scheduler_address: AddressOpt = None,
    dask: Annotated[str | None, typer.Option(
        "--dask", metavar="tcp://HOST:8786", help="The same as --scheduler-address.")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", metavar="DIR", help="Output folder (default: results/<scenario name>/plan-<hash of the "
        "arguments>); rerunning the same command into it resumes.")] = None,
    force: ForceOpt = False,
) -> None:
    """The cheapest fleet that meets the SLOs: every configuration screened by closed forms, the survivors
    near the boundary simulated with replications, each sized by bisection on its replicas.

    Example: simbatch plan scenarios/llama3_8b_h100.yaml --request-rate 5 --space scenarios/plan/llama3_8b.yaml
    --slo ttft_p99_ms=500 --slo tpot_p99_ms=50

    Exit code 2 on bad input, or when no configuration can meet the SLOs (the closest miss is named).
    """
    from rich.console import Console

    from simbatch.app.cli.bench_flags import bench_overrides, goodput_limits
    from simbatch.app.plan import output
    from simbatch.app.plan.question import Flags, PlanInputError, ask
    from simbatch.app.plan.search import Searcher
    from simbatch.app.sweep.runner import ExecutorError

    if dask is not None and scheduler_address is not None and dask != scheduler_address:
        raise PlanInputError("--dask and --scheduler-address: give one (they are the same option)")
    address = scheduler_address or dask
    _check(replications, workers, address)
    flags = Flags(model, gpu, tensor_parallel_size, quantization, max_num_seqs, max_num_batched_tokens, split,
                  max_replicas)
    sets = [*(set_ or []), *bench_overrides(request_rate)]
    question = ask(scenario, space, flags, slo or [], goodput_limits(goodput or []), attainment, prices, objective, top,
                   replications, tolerance, sets, out, force, headroom)
    started = time.perf_counter()
    try:
        executor = _connect(workers, address)
    except ExecutorError as exc:  # said of --scheduler-address: name the flag given
        raise ExecutorError(str(exc).replace("--scheduler-address", "--dask") if dask else str(exc)) from None
    with executor, _progress(None, "simulations") as advance:
        result = Searcher(question, executor, advance).run()
    elapsed = time.perf_counter() - started
    console = Console(width=200)
    folder = question.store.out
    if not result.ranked:
        output.write_unranked(result, folder)
        best = output.rejected(result)
        miss = f"; the best rejected, {best[0]['configuration']} x {best[0]['replicas']}: {best[0]['why']}" \
            if best else ""
        raise PlanInputError(f"no configuration meets the SLOs within the search space{miss} (every candidate's "
                             f"fate: {folder / 'candidates.csv'})")
    typer.echo(f"Traffic: {question.rate:.4g} req/s from {printable(scenario)}, {replications} replications per point.")
    typer.echo(f"Search: {_counts(result)}.")
    typer.echo(f"Runs: {result.runs} ({question.store.resumed} resumed from {printable(folder)}) on "
               f"{executor.description} in {elapsed:.1f} s.")
    console.print(_ranked_table(result, output.ranked_frame(result)))
    misses = output.rejected(result)
    if misses:
        console.print(_rejected_table(misses))
    lines = verdict_lines(result)
    for line in lines:
        typer.echo(printable(line))
    for path in output.write(result, folder, lines):
        typer.echo(f"wrote {printable(path)}")

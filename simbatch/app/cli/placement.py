"""``simbatch placement``: DistServe's placement search, every prefill:decode split of N replicas simulated."""

from __future__ import annotations

from pathlib import Path

import typer

from simbatch.app.cli.common import FORCE_OPT, BadInput, overrides, reports_bad_input
from simbatch.app.cli.run import SCENARIO_ARG, SET_OPT
from simbatch.app.text import printable

GPUS_OPT = typer.Option(..., "--gpus", metavar="N", help="Replicas to split between the pools (>= 2).")
PLACEMENT_OUT_OPT = typer.Option(None, "--out", metavar="DIR",
                                 help="Also write placement.csv and placement.png here (must not exist or be empty).")


@reports_bad_input
def placement(scenario_file: Path = SCENARIO_ARG, gpus: int = GPUS_OPT, sets: list[str] = SET_OPT,
              out: Path = PLACEMENT_OUT_OPT, force: bool = FORCE_OPT) -> None:
    """Simulate every prefill:decode split of --gpus replicas of a disaggregated scenario on the same
    requests; print each split's goodput and latencies, the best, and the closed-form best split."""
    from simbatch.app import results
    from simbatch.app.plots.disaggregated import placement as placement_plot
    from simbatch.app.plots.figure import save_figure
    from simbatch.app.sweep.placement import best, closed_form_best, placement_search
    from simbatch.inputs import guard
    from simbatch.inputs.loading import load_scenario

    scenario = load_scenario(scenario_file, overrides(sets))
    if scenario.cluster.disaggregated is None:
        raise BadInput(f"{printable(scenario_file)}: cluster.disaggregated is not set; placement splits its pools "
                       "(see scenarios/disaggregated.yaml)")
    if gpus < 2:
        raise BadInput(f"--gpus {gpus}: a split needs at least 2 replicas (one prefill, one decode), e.g. --gpus 4")
    guard.check_run(scenario, force)
    if out is not None:
        results.check_target(out)
    frame = placement_search(scenario, gpus)
    shown = frame.copy()
    for col in shown.columns:
        if shown[col].dtype.kind == "f":
            shown[col] = shown[col].map(lambda v: f"{v:,.2f}")
    typer.echo(shown.to_string(index=False))
    top = best(frame)
    metric = "goodput" if scenario.slo.limits_s() else "request throughput"
    typer.echo(f"Best split: {int(top.prefill_replicas)} prefill : {int(top.decode_replicas)} decode "
               f"({metric} {top.goodput:.2f} requests/s, p99 TTFT {top.p99_ttft_ms:.1f} ms, "
               f"p99 TPOT {top.p99_tpot_ms:.1f} ms)")
    p = closed_form_best(frame)
    typer.echo(f"Closed form (max over p of min(prefill, decode capacity)): {p} prefill : {gpus - p} decode")
    if out is not None:
        with results.atomic_folder(out) as target:  # whole or not at all, as a run's folder
            frame.to_csv(target.tmp / "placement.csv", index=False)
            save_figure(placement_plot(frame, bool(scenario.slo.limits_s())), target.tmp / "placement.png")
        typer.echo(f"Results written to {printable(out)}")

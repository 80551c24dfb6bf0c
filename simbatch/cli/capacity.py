"""``simbatch capacity``: the analytic throughput model, without simulating anything."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from pydantic import ValidationError

from simbatch import guard
from simbatch.cli.common import FORCE_OPT, BadInput, reports_bad_input
from simbatch.config import Device
from simbatch.loading import load_scenario


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _device(base: Device, given: dict[str, float | None]) -> Device:
    """``base`` with the given flags applied, validated like a scenario's ``device`` section."""
    try:
        return Device.model_validate(base.model_dump() | {k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = _flag(str(err["loc"][0])) if err["loc"] else "/".join(_flag(k) for k in ("tau0_ms", "beta_ms"))
        raise BadInput(f"{where}: {err['msg'].removeprefix('Value error, ')} (got {err['input']!r})") from None


def _positive(flag: str, value: float | None, *, allow_zero: bool = False) -> None:
    if value is not None and not (math.isfinite(value) and (value >= 0 if allow_zero else value > 0)):
        bound = "zero or more" if allow_zero else "greater than zero"
        raise BadInput(f"{flag}: got {value:g}; it must be a finite number {bound}")


OPTIONAL_SCENARIO_ARG = typer.Argument(None, metavar="[SCENARIO.yaml]", show_default=False,
                                       help="Take every default below from this scenario.")


@reports_bad_input
def capacity(
    scenario_file: Path = OPTIONAL_SCENARIO_ARG,
    tau0_ms: float = typer.Option(None, help="Fixed cost of a step, ms [default: scenario's, or 20]."),
    beta_ms: float = typer.Option(None, help="Marginal cost per decoding sequence, ms [default: 0.2]."),
    prefill_ms_per_token: float = typer.Option(None, help="Cost per prefill token, ms [default: 0]."),
    max_num_seqs: int = typer.Option(None, help="Running slots B_max [default: 64]."),
    rate: float = typer.Option(None, help="Arrival rate, requests/s (for the stability check)."),
    mean_output_tokens: float = typer.Option(None, help="Mean output length, tokens (for the stability check)."),
    mean_prompt_tokens: float = typer.Option(None, help="Mean prompt length, tokens [default: 0]."),
    replicas: int = typer.Option(None, help="Identical engines [default: 1]."),
    force: bool = FORCE_OPT,
) -> None:
    """Throughput B/τ(B) by batch size, the batch size for 50 % of the roofline, and the stability check.

    τ(B) = tau0 + beta·B is the step time of B decoding sequences; B/τ(B) tokens/s rises toward
    the roofline 1/β. Given a rate and a mean output length, the traffic's offered load ρ and the
    concurrency it demands (Little's law) are checked against max_num_seqs × replicas.
    """
    from simbatch import report
    from simbatch.capacity import expected_stability, stability
    from simbatch.workload import generate

    for flag, value in (("--max-num-seqs", max_num_seqs), ("--rate", rate),
                        ("--mean-output-tokens", mean_output_tokens), ("--replicas", replicas)):
        _positive(flag, value)
    _positive("--mean-prompt-tokens", mean_prompt_tokens, allow_zero=True)
    base, seqs, n_replicas = Device(), 64, 1
    traffic = {"rate": None, "out": None, "prompt": 0.0}
    memory, shed = math.inf, False
    if scenario_file is not None:
        scenario = load_scenario(scenario_file)
        guard.check_run(scenario, force)
        base, seqs, n_replicas = scenario.device, scenario.batching.max_num_seqs, scenario.cluster.replicas
        st = expected_stability(scenario, generate(scenario))
        traffic = {"rate": st.arrival_rate, "out": st.mean_output_tokens, "prompt": st.mean_prompt_tokens}
        memory, shed = st.memory_batch, st.admission_control
    device = _device(base, {"tau0_ms": tau0_ms, "beta_ms": beta_ms, "prefill_ms_per_token": prefill_ms_per_token})
    seqs, n_replicas = max_num_seqs or seqs, replicas or n_replicas
    rate = rate if rate is not None else traffic["rate"]
    mean_out = mean_output_tokens if mean_output_tokens is not None else traffic["out"]
    mean_prompt = mean_prompt_tokens if mean_prompt_tokens is not None else traffic["prompt"]

    if (rate is None) != (mean_out is None):
        raise BadInput(f"{'--mean-output-tokens' if mean_out is None else '--rate'} is needed too: "
                       "the stability check takes a rate and a mean output length")
    typer.echo(report.capacity_table(device, seqs, n_replicas))
    if rate is None:
        typer.echo("Give --rate and --mean-output-tokens (or a scenario) for the stability check.")
        return
    typer.echo(report.stability_block(stability(device, seqs, rate, mean_out, mean_prompt, replicas=n_replicas,
                                                memory_batch=memory, admission_control=shed)))

"""``simbatch capacity``: the analytic throughput model, without simulating anything."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from simbatch.app.cli.common import FORCE_OPT, JSON_OPT, BadInput, emit_json, reports_bad_input

if TYPE_CHECKING:
    from simbatch.config import Device


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _device(base: Device, given: dict[str, float | None]) -> Device:
    """``base`` with the given flags applied, validated like a scenario's ``device`` section."""
    from pydantic import ValidationError

    from simbatch.config import Device

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


_FLAGS = ("tau0_ms", "beta_ms", "prefill_ms_per_token", "kv_read_ms_per_1k_tokens", "prefill_attention_ms_per_1m_pairs",
          "max_num_seqs", "rate", "mean_output_tokens", "mean_prompt_tokens", "mean_context_tokens", "replicas")


def _stability_record(st) -> dict:
    import dataclasses

    return {**dataclasses.asdict(st), "stable": st.stable, "verdict": st.verdict, "short_verdict": st.short_verdict}


def _print(device: Device, seqs: int, replicas: int, context_tokens: float, st, as_json: bool) -> None:
    """The curve and the check (``st``, or None), as tables or as the one JSON document."""
    from simbatch.app import report
    from simbatch.model.cost import roofline_tokens_per_s

    if as_json:
        emit_json({"curve": report.capacity_curve(device, seqs, context_tokens), "replicas": replicas,
                   "roofline_tokens_per_s": roofline_tokens_per_s(device, context_tokens),
                   "stability": None if st is None else _stability_record(st)})
        return
    typer.echo(report.capacity_table(device, seqs, replicas, context_tokens))
    typer.echo(report.stability_block(st) if st is not None else
               "Give --rate and --mean-output-tokens (or a scenario) for the stability check.")


def _disaggregated(scenario, given: list[str], as_json: bool) -> None:
    """A disaggregated scenario: the decode pool's throughput table and the two pools' stability check."""
    from simbatch.analysis.capacity import expected_stability
    from simbatch.config import replica_scenarios
    from simbatch.workload import generate

    if given:
        raise BadInput(f"{_flag(given[0])}: the scenario's cluster is disaggregated, and the flags describe one pool "
                       "of alike replicas; edit the pools in the scenario file, or drop the flag")
    st = expected_stability(scenario, generate(scenario))
    decode = replica_scenarios(scenario)[-1]
    _print(decode.device, decode.batching.max_num_seqs, scenario.cluster.disaggregated.decode.count,
           st.mean_context_tokens, st, as_json)


OPTIONAL_SCENARIO_ARG = typer.Argument(None, metavar="[SCENARIO.yaml]", show_default=False,
                                       help="Take every default below from this scenario.")


@reports_bad_input
def capacity(
    scenario_file: Path = OPTIONAL_SCENARIO_ARG,
    tau0_ms: float = typer.Option(None, help="Fixed cost of a step, ms [default: scenario's, or 20]."),
    beta_ms: float = typer.Option(None, help="Marginal cost per decoding sequence, ms [default: 0.2]."),
    prefill_ms_per_token: float = typer.Option(None, help="Cost per prefill token, ms [default: 0]."),
    kv_read_ms_per_1k_tokens: float = typer.Option(
        None, help="delta: cost of reading 1,000 cached KV tokens in a step, ms [default: 0]."),
    prefill_attention_ms_per_1m_pairs: float = typer.Option(
        None, help="epsilon: prefill attention per 1,000,000 token pairs, ms [default: 0]."),
    max_num_seqs: int = typer.Option(None, help="Running slots B_max [default: 64]."),
    rate: float = typer.Option(None, help="Arrival rate, requests/s (for the stability check)."),
    mean_output_tokens: float = typer.Option(None, help="Mean output length, tokens (for the stability check)."),
    mean_prompt_tokens: float = typer.Option(None, help="Mean prompt length, tokens [default: 0]."),
    mean_context_tokens: float = typer.Option(
        None, help="c̄, the cached context a decode step reads per sequence, tokens [default: the scenario's; "
        "else mean prompt + (mean output - 1) / 2]."),
    replicas: int = typer.Option(None, help="Identical engines [default: 1]."),
    force: bool = FORCE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Throughput B/τ(B) by batch size, the batch size for 50 % of the roofline, and the stability check.

    τ(B) = tau0 + (beta + delta·c̄)·B is the step time of B decoding sequences reading c̄ tokens of
    context each; B/τ(B) tokens/s rises toward the roofline 1/(β + δ·c̄). Given a rate and a mean output length, the traffic's offered load ρ and the
    concurrency it demands (Little's law) are checked against max_num_seqs × replicas.
    """
    from simbatch.analysis.capacity import expected_stability, stability
    from simbatch.config import Device
    from simbatch.inputs import guard
    from simbatch.inputs.loading import load_scenario
    from simbatch.workload import generate

    for flag, value in (("--max-num-seqs", max_num_seqs), ("--rate", rate),
                        ("--mean-output-tokens", mean_output_tokens), ("--replicas", replicas)):
        _positive(flag, value)
    _positive("--mean-prompt-tokens", mean_prompt_tokens, allow_zero=True)
    _positive("--mean-context-tokens", mean_context_tokens, allow_zero=True)
    base, seqs, n_replicas = Device(), 64, 1
    traffic = {"rate": None, "out": None, "prompt": 0.0}
    memory, shed, context, checked = math.inf, False, {}, None
    given = [flag for flag, value in locals().items() if flag in _FLAGS and value is not None]
    if scenario_file is not None:
        scenario = load_scenario(scenario_file)
        guard.check_run(scenario, force)
        if scenario.cluster.disaggregated is not None:
            _disaggregated(scenario, given, as_json)
            return
        base, seqs, n_replicas = scenario.device, scenario.batching.max_num_seqs, scenario.cluster.replicas
        checked = st = expected_stability(scenario, generate(scenario))  # the scenario's check, as `run` prints it
        traffic = {"rate": st.arrival_rate, "out": st.mean_output_tokens, "prompt": st.mean_prompt_tokens}
        memory, shed = st.memory_batch, st.admission_control
        if mean_output_tokens is None and mean_prompt_tokens is None:  # the scenario's own lengths
            context = {"mean_context_tokens": st.mean_context_tokens, "mean_prompt_sq_tokens": st.mean_prompt_sq_tokens}
    device = _device(base, {"tau0_ms": tau0_ms, "beta_ms": beta_ms, "prefill_ms_per_token": prefill_ms_per_token,
                            "kv_read_ms_per_1k_tokens": kv_read_ms_per_1k_tokens,
                            "prefill_attention_ms_per_1m_pairs": prefill_attention_ms_per_1m_pairs})
    seqs, n_replicas = max_num_seqs or seqs, replicas or n_replicas
    rate = rate if rate is not None else traffic["rate"]
    mean_out = mean_output_tokens if mean_output_tokens is not None else traffic["out"]
    mean_prompt = mean_prompt_tokens if mean_prompt_tokens is not None else traffic["prompt"]

    if (rate is None) != (mean_out is None):
        raise BadInput(f"{'--mean-output-tokens' if mean_out is None else '--rate'} is needed too: "
                       "the stability check takes a rate and a mean output length")
    if mean_context_tokens is not None:
        context["mean_context_tokens"] = mean_context_tokens
    elif "mean_context_tokens" not in context and mean_out is not None:
        # Request i reads P .. P + O - 1 over its O steps: about E[P] + (E[O] - 1) / 2 on average.
        context["mean_context_tokens"] = mean_prompt + max(mean_out - 1, 0) / 2
    st = checked if checked is not None and not given else None if rate is None else \
        stability(device, seqs, rate, mean_out, mean_prompt, replicas=n_replicas, memory_batch=memory,
                  admission_control=shed, **context)
    _print(device, seqs, n_replicas, context.get("mean_context_tokens", 0.0), st, as_json)

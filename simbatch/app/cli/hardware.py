"""``simbatch presets`` and ``simbatch calibrate``: device costs from public specs, or from your own server."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from simbatch.app.cli.common import BadInput, reports_bad_input
from simbatch.app.text import printable

PRESET_ARG = typer.Argument(None, metavar="[MODEL/GPU]", show_default=False,
                            help="A preset to show derived: its five costs and its KV cache at vLLM's defaults.")
HF_CONFIG_OPT = typer.Option(None, "--hf-config", metavar="FILE", show_default=False,
                             help="A Hugging Face config.json: print the model card it gives (device.model_card: "
                                  "{hf_config: FILE}), its parameters counted from the shapes.")


@reports_bad_input
def presets(preset: str = PRESET_ARG, hf_config: Path = HF_CONFIG_OPT) -> None:
    """The model and GPU cards behind `device.preset: <model>/<gpu>`, and the fitted efficiencies.

    Any model combines with any GPU; /tpN splits the model over N GPUs (tensor parallelism), /fp8 stores
    the weights in fp8. Your own cards go inline in a scenario, as device.model_card / device.gpu_card
    with the fields shown here and a name the preset uses (docs/hardware.md). Given a preset, show
    what it derives instead; given --hf-config, the card a config.json makes.
    """
    from simbatch.hardware.cards import shipped
    from simbatch.hardware.preset import fitted

    if hf_config is not None:
        _show_hf_config(hf_config, preset)
        return
    if preset is not None:
        _show(preset)
        return
    gpus, models = shipped()
    typer.echo(f"{'model':<17} {'params_b':>8} {'active_b':>8} {'layers':>6} {'hidden':>6} {'q/kv heads':>10} "
               f"{'head_dim':>8} {'vocab':>7}  experts (per token)")
    for m in models.values():
        experts = f"{m.num_experts} ({m.experts_per_token})" if m.is_moe else "-"
        typer.echo(f"{m.name:<17} {m.params / 1e9:>8.3f} {m.active_b:>8.3f} {m.layers:>6} {m.hidden_size:>6} "
                   f"{f'{m.q_heads}/{m.kv_heads}':>10} {m.head_dim:>8} {m.vocab_size:>7}  {experts}"
                   + ("  MLA" if m.is_mla else ""))
    typer.echo("")
    typer.echo(f"{'gpu':<12} {'memory_gib':>10} {'cuda_gib':>8} {'bw_gb_s':>7} {'bf16_tflops':>11} {'fp8_tflops':>10} "
               f"{'link_gb_s':>9} {'host_gb_s':>9} {'idle_w':>6} {'max_w':>5}  aliases")
    opt = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    for g in gpus.values():
        typer.echo(f"{g.name:<12} {g.memory_gib:>10g} {g.cuda_memory_gib:>8g} {g.memory_bandwidth_gb_s:>7g} "
                   f"{g.bf16_tflops:>11g} {opt(g.fp8_tflops):>10} {g.interconnect_gb_s:>9g} {opt(g.host_link_gb_s):>9} "
                   f"{opt(g.idle_watts):>6} {opt(g.max_watts):>5}  {', '.join(g.aliases)}")
    eff, record = fitted()
    typer.echo("")
    typer.echo("efficiencies fitted to simbatch/data/measured/hardware (simbatch/data/hardware_efficiency.yaml): " +
               ", ".join(f"{k} {v:g}" for k, v in vars(eff).items()))
    for g in gpus.values():
        if own := g.measured_efficiency.given():
            typer.echo(f"  {g.name}: measured on it with vLLM's kernels, in their place: " +
                       ", ".join(f"{k} {v:g}" for k, v in own.items()))
    typer.echo("fit error (relative, median / p90), per dataset:")
    for key, err in record["fit_error"].items():
        typer.echo(f"  {key}: {err['median']:.1%} / {err['p90']:.1%} over {err['rows']} rows")
    typer.echo("e.g. device.preset: llama-3.1-8b/H100-SXM, llama-3.1-70b/H100-SXM/tp4, qwen2.5-72b/H200/tp2/fp8")


def _show_hf_config(path: Path, preset: str | None) -> None:
    """The card a config.json makes, as YAML to paste, and its counted parameters; with a preset
    (``NAME/GPU``, NAME the card's), what it derives on that GPU too."""
    import yaml
    from pydantic import ValidationError

    from simbatch.config.cards import ModelCard
    from simbatch.config.hf_config import checkpoint_notes

    try:
        card = ModelCard.model_validate({"hf_config": str(path)})
        notes = checkpoint_notes(path)
    except (ValidationError, ValueError) as exc:
        msg = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise BadInput(f"--hf-config {printable(path)}: {msg.removeprefix('Value error, ')}") from None
    fields = card.model_dump(exclude_defaults=True, exclude={"source"})
    typer.echo(yaml.safe_dump({"model_card": fields}, sort_keys=False, width=110), nl=False)
    typer.echo(f"# parameters counted from the shapes: {card.params / 1e9:.3f}B"
               + (f", {card.active_b:.3f}B per token" if card.is_moe else "")
               + f"; KV cache {card.layers * card.kv_elements_per_token_layer * 2:,} bytes per token in bf16")
    for note in notes:
        typer.echo(f"# {note}")
    if preset is not None:
        typer.echo("")
        _show(preset, card)
    else:
        typer.echo(f"# use it as device.preset: {card.name}/<gpu> with device.model_card: {{hf_config: {path}}}")


def _show(preset: str, model_card=None) -> None:
    """One preset's costs, vLLM's defaults for its GPU, and the KV cache num_blocks: auto leaves there."""
    from pydantic import ValidationError

    from simbatch.config import Scenario
    from simbatch.hardware.report import preset_block
    from simbatch.inputs.resolve import resolve

    device = {"preset": preset} | ({"model_card": model_card} if model_card is not None else {})
    try:
        scenario = resolve(Scenario.model_validate({"workload": {"num_requests": 1}, "device": device}))
    except ValidationError as exc:
        raise BadInput(f"{printable(preset)}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    typer.echo(preset_block(scenario))
    try:
        sized = resolve(scenario.model_copy(update={"kv_cache": scenario.kv_cache.model_copy(
            update={"num_blocks": "auto"})}))
    except ValidationError as exc:
        typer.echo(exc.errors()[0]["msg"].removeprefix("Value error, "))
        return
    blocks = sized.resolution["kv_cache.num_blocks"]
    typer.echo(f"  {'kv_cache.num_blocks: auto':<34} {blocks.value:>10,}  ({blocks.value * 16:,} tokens of 16-token "
               f"blocks) from {blocks.note}")


FILES_ARG = typer.Argument(..., metavar="FILE...", show_default=False,
                           help="Per-step .csv files (batch_size, prefill_tokens, context_tokens, step_ms) and/or "
                                "vllm bench serve --save-result .json files (any release), one per request rate.")


SNIPPET_OPT = typer.Option(None, "--out", metavar="FILE", help="Write the device: YAML snippet here.")
PRESET_OPT = typer.Option(None, "--preset", metavar="MODEL/GPU",
                          help="Hold the costs not fitted at this preset's values (else 0).")
FIT_OPT = typer.Option(None, "--fit", metavar="KEY,KEY",
                       help="The unknowns to fit, e.g. tau0_ms,beta_ms,kv_read_ms_per_1k_tokens (frontend_ms: the "
                            "fixed time outside the GPU) [default: all five costs from steps, the first three from "
                            "bench runs].")
FRONTEND_OPT = typer.Option(None, "--frontend-ms", metavar="MS", show_default=False,
                            help="A request's fixed time outside the GPU step (API server, tokenisation, streaming "
                                 "back), held at this value [default: 3 for a vLLM server, 0 for simbatch's own "
                                 "summaries; fit it with --fit ...,frontend_ms].")
ASYNC_OPT = typer.Option(None, "--async-scheduling/--no-async-scheduling", show_default=False,
                         help="Whether the server scheduled a step ahead (vLLM's default since late 2025: a request "
                              "arriving in step k is first scheduled in step k+2) [default: from the file's date].")
HIT_OPT = typer.Option(None, "--prefix-hit-rate", metavar="[FILE=]H",
                       help="The prefix cache's hit rate, 0 to 1 (vllm:prefix_cache_hits / "
                            "vllm:prefix_cache_queries), of every run or of FILE's (repeatable).")
TIER_OPT = typer.Option(None, "--gemm-tier-tokens", metavar="LOW,HIGH", show_default=False,
                        help="The GEMM tile switch: steps of LOW < tokens <= HIGH cost gemm_tier_ms more, which is "
                             "then fitted (16,64 for vLLM's CUTLASS fp8 GEMM on Hopper) [default: the preset's, none].")
CHECK_OPT = typer.Option(False, "--check", help="Replay each bench file with the fitted device (as simbatch replay "
                                               "does) and print measured beside simulated.")
SCENARIO_OPT = typer.Option(None, "--scenario", metavar="S.yaml", show_default=False,
                            help="With --check: the server's other settings (batching, kv_cache, ...).")
SET_OPT = typer.Option(None, "--set", metavar="KEY=VALUE", help="With --check: override a scenario value (repeatable).")


def _hit_rates(items: list[str], files: list[Path]) -> dict:
    out: dict = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        try:
            rate = float(value)
        except ValueError:
            rate = math.nan
        if not 0 <= rate <= 1:
            raise BadInput(f"--prefix-hit-rate {printable(item)}: expected a hit rate from 0 to 1 (hits over queries), "
                           "e.g. --prefix-hit-rate 0.4 or --prefix-hit-rate rate4.json=0.95")
        if not sep:
            out[None] = rate
            continue
        match = [f for f in files if str(f) == name or f.name == name]
        if len(match) != 1:
            raise BadInput(f"--prefix-hit-rate {printable(item)}: {printable(name)} is "
                           f"{'not one of the files given' if not match else 'ambiguous: give its path'}")
        out[match[0]] = rate
    return out


@reports_bad_input
def calibrate(files: list[Path] = FILES_ARG, out: Path = SNIPPET_OPT, preset: str = PRESET_OPT,
              fit_only: str = FIT_OPT, frontend_ms: float = FRONTEND_OPT, async_scheduling: bool = ASYNC_OPT,
              prefix_hit_rate: list[str] = HIT_OPT, gemm_tier_tokens: str = TIER_OPT, check: bool = CHECK_OPT,
              scenario: Path = SCENARIO_OPT, sets: list[str] = SET_OPT) -> None:
    """Fit the device costs to measurements of your own server; print the fit, its error per point, a device: snippet.

    Per-step timings are fitted exactly (non-negative least squares); vllm bench serve results by a
    closed-form steady-state approximation (docs/hardware.md says which costs they determine). A fit
    that cannot be trusted (too few points, a cost at its bound, a point off by over 10 %) prints
    warnings and exits 1. --check replays each bench file with the fitted device.
    """
    from pydantic import ValidationError

    from simbatch.config import Device
    from simbatch.hardware.calibrate import FRONTEND, PARAMS, CalibrationError
    from simbatch.hardware.calibrate import calibrate as run_fit
    from simbatch.inputs.resolve import resolve_device

    for f in [*files, *([scenario] if scenario is not None else [])]:
        if not f.is_file():
            raise BadInput(f"{printable(f)}: {'not a file' if f.exists() else 'file not found'}; give per-step .csv "
                           "or vllm bench serve .json files")
    if frontend_ms is not None and not (math.isfinite(frontend_ms) and 0 <= frontend_ms <= 1e4):
        raise BadInput(f"--frontend-ms {frontend_ms}: expected milliseconds from 0 to 10,000, e.g. --frontend-ms 3")
    if (scenario is not None or sets) and not check:
        raise BadInput(f"{'--scenario' if scenario is not None else '--set'}: used by --check only; add --check")
    tier = None
    if gemm_tier_tokens is not None:
        try:
            tier = tuple(int(v) for v in gemm_tier_tokens.split(","))
        except ValueError:
            tier = ()
        if len(tier) != 2 or not 0 < tier[0] < tier[1] <= 1_000_000:
            raise BadInput(f"--gemm-tier-tokens {printable(gemm_tier_tokens)}: expected LOW,HIGH token counts with "
                           "0 < LOW < HIGH, e.g. --gemm-tier-tokens 16,64")
    start = None
    if preset is not None:
        try:
            device = resolve_device(Device(preset=preset))
        except ValidationError as exc:
            raise BadInput(f"--preset: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
        start = {k: getattr(device, k) for k in PARAMS} | \
            ({"gemm_tier_tokens": device.gemm_tier_tokens} if device.gemm_tier_tokens else {})
    try:
        result = run_fit(files, None if fit_only is None else [p.strip() for p in fit_only.split(",")], start,
                         frontend_ms, async_scheduling, _hit_rates(prefix_hit_rate or [], files), tier)
    except CalibrationError as exc:
        raise BadInput(str(exc)) from None
    for k, v in result.params.items():
        how = "fitted" if k in result.fitted else (f"held ({result.held[k]})" if result.held[k] != "held" else
                                                   f"held at {'--preset' if preset else '0'}")
        typer.echo(f"{k:<34} {v:>12.6g}  {how}")
    if any(p.suffix.lower() != ".csv" for p in files):
        how = "fitted" if FRONTEND in result.fitted else "held"
        typer.echo(f"{FRONTEND:<34} {result.frontend_ms:>12.6g}  {how} (outside the GPU step, in the TTFT equation)")
    typer.echo("")
    width = max(48, *(len(printable(label)) for label in result.points.label))  # labels name files: never cut
    typer.echo(f"{'point':<{width}} {'measured_ms':>12} {'fitted_ms':>10} {'error':>8}")
    for p in result.points.itertuples():
        typer.echo(f"{printable(p.label):<{width}} {p.measured_ms:>12.4g} {p.fitted_ms:>10.4g} {p.relative_error:>+8.1%}")
    err = result.points.relative_error.abs()
    typer.echo(f"relative error: median {err.median():.1%}, max {err.max():.1%} over {len(err)} points")
    for note in result.notes:
        typer.echo(f"note: {printable(note)}")
    snippet = result.yaml_snippet(preset)
    typer.echo("")
    typer.echo(snippet, nl=False)
    if out is not None:
        try:
            out.write_text(snippet, encoding="utf-8")
        except OSError as exc:
            raise BadInput(f"--out {printable(out)}: cannot write: {exc.strerror or exc}") from None
        typer.echo(f"written to {printable(out)}")
    if check:
        _check(files, result, preset, scenario, sets or [])
    for warning in result.warnings:
        typer.echo(f"warning: {printable(warning)}", err=True)
    if result.warnings:
        raise typer.Exit(1)


def _check(files: list[Path], result, preset: str | None, scenario: Path | None, sets: list[str]) -> None:
    """Each bench file replayed with the fitted device: the loop closed, fit by formula, judged by simulation."""
    from simbatch.app.cli.replay import run_replay, side_by_side
    from simbatch.app.replay import base_data
    from simbatch.workload import bench_result

    data, source, base_dir = base_data(scenario, [*sets, *result.overrides(preset)])
    for path in (f for f in files if f.suffix.lower() == ".json"):
        typer.echo("")
        plan, _, measured, simulated, notes = run_replay(bench_result.read(path), data, source, base_dir, False,
                                                        True, path.name)
        for line in plan.lines():
            typer.echo(printable(line))
        for note in notes:
            typer.echo(f"note: {printable(note)}")
        typer.echo(side_by_side(measured, simulated))

"""``simbatch presets`` and ``simbatch calibrate``: device costs from public specs, or from your own server."""

from __future__ import annotations

from pathlib import Path

import typer

from simbatch.app.cli.common import BadInput, reports_bad_input
from simbatch.app.text import printable

PRESET_ARG = typer.Argument(None, metavar="[MODEL/GPU]", show_default=False,
                            help="A preset to show derived: its five costs and its KV cache at vLLM's defaults.")


@reports_bad_input
def presets(preset: str = PRESET_ARG) -> None:
    """The model and GPU cards behind `device.preset: <model>/<gpu>`, and the fitted efficiencies.

    Any model combines with any GPU; /tpN splits the model over N GPUs (tensor parallelism), /fp8 stores
    the weights in fp8. Your own cards go inline in a scenario, as device.model_card / device.gpu_card
    with the fields shown here and a name the preset uses (docs/hardware.md). Given a preset, show
    what it derives instead.
    """
    from simbatch.hardware.cards import shipped
    from simbatch.hardware.preset import fitted

    if preset is not None:
        _show(preset)
        return
    gpus, models = shipped()
    typer.echo(f"{'model':<15} {'params_b':>8} {'active_b':>8} {'layers':>6} {'hidden':>6} {'q/kv heads':>10} "
               f"{'head_dim':>8} {'vocab':>7}")
    for m in models.values():
        typer.echo(f"{m.name:<15} {m.params_b:>8g} {m.active_b:>8g} {m.layers:>6} {m.hidden_size:>6} "
                   f"{f'{m.q_heads}/{m.kv_heads}':>10} {m.head_dim:>8} {m.vocab_size:>7}")
    typer.echo("")
    typer.echo(f"{'gpu':<10} {'memory_gib':>10} {'bw_gb_s':>8} {'bf16_tflops':>11} {'fp8_tflops':>10} "
               f"{'link_gb_s':>9}")
    for g in gpus.values():
        fp8 = "-" if g.fp8_tflops is None else f"{g.fp8_tflops:g}"
        typer.echo(f"{g.name:<10} {g.memory_gib:>10g} {g.memory_bandwidth_gb_s:>8g} {g.bf16_tflops:>11g} {fp8:>10} "
                   f"{g.interconnect_gb_s:>9g}")
    eff, record = fitted()
    typer.echo("")
    typer.echo("efficiencies fitted to ../shared/data/hardware (simbatch/data/hardware_efficiency.yaml): " +
               ", ".join(f"{k} {v:g}" for k, v in vars(eff).items()))
    typer.echo("fit error (relative, median / p90), per dataset:")
    for key, err in record["fit_error"].items():
        typer.echo(f"  {key}: {err['median']:.1%} / {err['p90']:.1%} over {err['rows']} rows")
    typer.echo("e.g. device.preset: llama-3.1-8b/H100-SXM, llama-3.1-70b/H100-SXM/tp4, qwen2.5-72b/H200/tp2/fp8")


def _show(preset: str) -> None:
    """One preset's costs, and the KV cache it leaves at gpu_memory_utilization 0.9, max_num_batched_tokens
    8192 and max_num_seqs 256 (vLLM's defaults on a large GPU)."""
    from pydantic import ValidationError

    from simbatch.config import DEVICE_COSTS, Device
    from simbatch.config.resolve import deployment, resolve_device
    from simbatch.hardware.memory import kv_budget

    try:
        device = resolve_device(Device(preset=preset))
    except ValidationError as exc:
        raise BadInput(f"{printable(preset)}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    for key in DEVICE_COSTS:
        typer.echo(f"{key:<34} {getattr(device, key):>10.6g}")
    try:
        budget = kv_budget(deployment(device), 16, 0.9, 8192, 256)
        typer.echo(f"{'kv_cache.num_blocks: auto':<34} {budget.blocks:>10,}  ({budget.blocks * 16:,} tokens of "
                   f"16-token blocks: {budget.describe()})")
    except ValueError as exc:
        typer.echo(str(exc))


FILES_ARG = typer.Argument(..., metavar="FILE...", show_default=False,
                           help="Per-step .csv files (batch_size, prefill_tokens, context_tokens, step_ms) and/or "
                                "vllm bench serve --save-result .json files, one per request rate.")


SNIPPET_OPT = typer.Option(None, "--out", metavar="FILE", help="Write the device: YAML snippet here.")
PRESET_OPT = typer.Option(None, "--preset", metavar="MODEL/GPU",
                          help="Hold the costs not fitted at this preset's values (else 0).")
FIT_OPT = typer.Option(None, "--fit", metavar="KEY,KEY",
                       help="The costs to fit, e.g. tau0_ms,beta_ms,kv_read_ms_per_1k_tokens "
                            "[default: all five from steps, the first three from bench runs].")


@reports_bad_input
def calibrate(files: list[Path] = FILES_ARG, out: Path = SNIPPET_OPT, preset: str = PRESET_OPT,
              fit_only: str = FIT_OPT) -> None:
    """Fit the device costs to measurements of your own server; print the fit, its error per point, a device: snippet.

    Per-step timings are fitted exactly (non-negative least squares); vllm bench serve results by a
    closed-form steady-state approximation (docs/hardware.md says which costs they determine).
    """
    from pydantic import ValidationError

    from simbatch.config import Device
    from simbatch.config.resolve import resolve_device
    from simbatch.hardware.calibrate import PARAMS, CalibrationError
    from simbatch.hardware.calibrate import calibrate as run_fit

    for f in files:
        if not f.is_file():
            raise BadInput(f"{printable(f)}: {'not a file' if f.exists() else 'file not found'}; give per-step .csv "
                           "or vllm bench serve .json files")
    start = None
    if preset is not None:
        try:
            device = resolve_device(Device(preset=preset))
        except ValidationError as exc:
            raise BadInput(f"--preset: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
        start = {k: getattr(device, k) for k in PARAMS}
    try:
        result = run_fit(files, None if fit_only is None else [p.strip() for p in fit_only.split(",")], start)
    except CalibrationError as exc:
        raise BadInput(str(exc)) from None
    for k, v in result.params.items():
        how = "fitted" if k in result.fitted else (f"held ({result.held[k]})" if result.held[k] != "held" else
                                                   f"held at {'--preset' if preset else '0'}")
        typer.echo(f"{k:<34} {v:>12.6g}  {how}")
    typer.echo("")
    typer.echo(f"{'point':<48} {'measured_ms':>12} {'fitted_ms':>10} {'error':>8}")
    for p in result.points.itertuples():
        typer.echo(f"{printable(p.label)[:48]:<48} {p.measured_ms:>12.4g} {p.fitted_ms:>10.4g} {p.relative_error:>+8.1%}")
    err = result.points.relative_error.abs()
    typer.echo(f"relative error: median {err.median():.1%}, max {err.max():.1%} over {len(err)} points")
    snippet = result.yaml_snippet(preset)
    typer.echo("")
    typer.echo(snippet, nl=False)
    if out is not None:
        try:
            out.write_text(snippet, encoding="utf-8")
        except OSError as exc:
            raise BadInput(f"--out {printable(out)}: cannot write: {exc.strerror or exc}") from None
        typer.echo(f"written to {printable(out)}")

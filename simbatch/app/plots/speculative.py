"""Speculative decoding as a capacity planner sees it: when it pays, and how many tokens a step brings."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from simbatch.analysis.capacity import mean_context_tokens
from simbatch.app.plots.figure import Frames, finish_axes, new_figure
from simbatch.config import Scenario, replica_scenarios
from simbatch.features.speculative import speedup, step_ms, tokens_per_step
from simbatch.model.cost import LinearCost


def speculative_decoding(run: Frames, scenario: Scenario) -> Figure:
    """Decode speed-up against batch size (top) and each request's tokens per speculating step (bottom).

    Top: the cost model's closed form, E tau(B) / tau_spec(B) at the run's mean context, with E the
    expected tokens per step: above 1 at small batch, where the fixed cost tau0 dominates and a step
    that emits E tokens costs little more than one that emits one; below 1 once the drafts' compute
    (gamma k per sequence) outweighs what they bring. The points are the run's own decode-only steps
    with every sequence verifying k drafts: the run's tokens per step times tau(B) over their
    measured duration. Bottom: how the requests' mean tokens per speculating step scatter around E.
    """
    device = next(s.device for s in replica_scenarios(scenario) if s.device.speculative is not None)
    spec, cost = device.speculative, LinearCost.of(device)
    k, alpha = spec.num_speculative_tokens, spec.acceptance_rate
    e = tokens_per_step(spec)
    rq, it = run.requests, run.iterations
    context = mean_context_tokens(rq["prompt_tokens"].to_numpy(), rq["output_tokens"].to_numpy())
    fig, (top, bottom) = new_figure(2, height_in=6.4)

    largest = max(1024, 4 * scenario.batching.max_num_seqs)
    batch = np.unique(np.geomspace(1, largest, 200).round())
    top.plot(batch, [speedup(cost, spec, b, context) for b in batch], color="#1f77b4",
             label=f"closed form: k = {k}, alpha = {alpha:g}, E = {e:.2f} tokens per step"
             + ("" if spec.acceptance_rate_concentration is None else ", alpha per request"))
    top.axhline(1.0, color="black", linewidth=0.8)
    drafts, accepted = rq["num_drafts"].sum(), rq["num_accepted_tokens"].sum()
    full = it[(it["prefill_tokens"] == 0) & (it["decode_tokens"] == it["batch_size"] * (1 + k))]
    if drafts and not full.empty:
        run_tokens_per_step = 1 + accepted / drafts
        steps = full.groupby("batch_size").apply(
            lambda g: np.average(g["duration_s"], weights=g["num_steps"]), include_groups=False)
        points = [run_tokens_per_step * step_ms(cost, b, 0, context) / (1e3 * s) for b, s in steps.items()]
        top.scatter(steps.index, points, color="#d62728", zorder=3, s=18,
                    label=f"this run: {run_tokens_per_step:.2f} tokens per step over measured step times")
    top.set_xscale("log")
    top.set_title("Speculative decoding: decode speed-up against batch size")
    finish_axes(top, "speed-up over plain decoding", xlabel="decoding sequences per step (B)")

    per_request = (1 + rq["num_accepted_tokens"] / rq["num_drafts"])[rq["num_drafts"] > 0]
    if len(per_request):
        bottom.hist(per_request, bins=min(50, max(5, len(per_request) // 10)), color="#1f77b4", alpha=0.7,
                    label=f"{len(per_request):,} requests")
    bottom.axvline(e, color="black", linestyle="--", label=f"closed form: {e:.2f} tokens per step")
    finish_axes(bottom, "requests", xlabel="tokens per speculating step (1 + accepted / steps with drafts)")
    return fig

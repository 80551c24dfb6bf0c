"""The lessons' trade-offs as figures with sliders: move one setting, and the figure is drawn again.

Each function here draws one lesson's trade-off for one setting and returns the numbers it drew;
its ``*_sliders`` companion binds it to a panel of sliders (:func:`simbatch.app.teaching.widgets.panel`:
none in a headless kernel, so CI and the saved lessons keep the static figure drawn just before).

- :func:`throughput_curve` (lesson 03): tau0, beta and the slot cap against throughput and latency,
  closed forms only.
- :func:`chunk_tradeoff` (lesson 05): the chunk size against the streams' worst gap and the long
  prompt's TTFT, under step laws the lesson passes in (the additive law and its roofline max).
- :func:`goodput_curve` (lesson 07): an SLO against goodput, recounted over runs the lesson made
  (an objective changes which requests count, not what the server did).
- :func:`staleness` (lesson 11): a router's signal delay against each replica's queue, one run per
  setting from the lesson's own scenario.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np

from simbatch.analysis import capacity, theory
from simbatch.app.teaching.widgets import panel
from simbatch.config import Device, Scenario
from simbatch.model import cost
from simbatch.simulation import Result, simulate


def _show(draw: Callable, **settings) -> None:
    """A slider callback: draw, show, release the figure."""
    fig = draw(**settings).figure
    plt.show()
    plt.close(fig)


# ---------------------------------------------------------------- lesson 03

@dataclass(frozen=True)
class Curve:
    """One setting of lesson 03's curve: capacity at the cap, the roofline, the knee and W_B."""

    throughput_at_cap: float
    roofline: float
    knee_requests_per_s: float
    full_batch_latency_s: float
    batch_share_at_cap: float
    figure: object


def throughput_curve(tau0_ms: float = 20.0, beta_ms: float = 0.2, max_num_seqs: int = 64,
                     mean_output_tokens: int = 500) -> Curve:
    """Throughput B / tau(B) against B, capped at the slots, and the latency the load builds below the
    knee: the processor-sharing fixed point and the birth-death chain of lesson 09."""
    device = Device(tau0_ms=tau0_ms, beta_ms=beta_ms)
    check = capacity.stability(device, max_num_seqs, 1.0, mean_output_tokens)
    roofline = cost.roofline_tokens_per_s(device) if beta_ms > 0 else math.inf
    at_cap = cost.decode_throughput(device, max_num_seqs)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8))
    b = np.geomspace(1, 1024, 300)
    left.plot(b, [cost.decode_throughput(device, x) for x in b], label="B / (τ0 + βB)")
    if math.isfinite(roofline):
        left.axhline(roofline, color="k", ls="--", lw=1, label=f"roofline 1/β = {roofline:,.0f}")
    left.axvline(max_num_seqs, color="tab:red", lw=1, label=f"slot cap {max_num_seqs}: {at_cap:,.0f} tokens/s")
    left.set(xscale="log", xlabel="batch size B (log)", ylabel="tokens/s", title="The throughput curve")
    left.legend(fontsize=8)
    knee = check.capacity_requests_per_s
    rates = np.linspace(0, knee, 200)[:-1]
    right.plot(rates, [theory.ps_fixed_point_latency_s(device, r, mean_output_tokens) for r in rates], "k--",
               label="fixed point E[out]τ0 / (1 − λE[out]β)")
    chain_rates = np.linspace(knee / 40, knee * 0.98, 30)
    right.plot(chain_rates, [theory.batching_mean_latency_s(device, max_num_seqs, r, mean_output_tokens)
                             for r in chain_rates], label="birth–death chain (slots, fluctuations)")
    right.axhline(check.full_batch_latency_s, color="grey", lw=0.8, ls=":",
                  label=f"W_B = E[out]τ(B_max) = {check.full_batch_latency_s:.1f} s")
    right.axvline(knee, color="tab:red", lw=1, label=f"knee {knee:.2f} req/s")
    top = 2.5 * check.full_batch_latency_s
    right.set(xlabel="arrival rate (requests/s)", ylabel="mean E2E latency (s)", ylim=(0, top),
              title=f"{mean_output_tokens}-token answers")
    right.legend(fontsize=8)
    fig.tight_layout()
    share = beta_ms * max_num_seqs / (tau0_ms + beta_ms * max_num_seqs)
    return Curve(at_cap, roofline, knee, check.full_batch_latency_s, share, fig)


def throughput_sliders(**initial):
    """Sliders on tau0, beta and the slot cap for :func:`throughput_curve`."""
    values = {"tau0_ms": 20.0, "beta_ms": 0.2, "max_num_seqs": 64, **initial}
    return panel(lambda **s: _show(throughput_curve, **s), values, {
        "tau0_ms": ("float", "τ0 (ms)", 1.0, 50.0, 0.5),
        "beta_ms": ("float", "β (ms)", 0.01, 1.0, 0.01),
        "max_num_seqs": ("int", "slot cap B_max", 1, 512, 1),
    })


# ---------------------------------------------------------------- lesson 05

StepLaw = Callable[[float, float], float]
"""A step's duration in ms for (decode sequences, prompt tokens): the lesson's cost law."""


@dataclass(frozen=True)
class Chunking:
    """One chunk size under each step law: the streams' worst gap and the long prompt's TTFT, in ms."""

    max_itl_ms: dict[str, float]
    ttft_ms: dict[str, float]
    figure: object


def chunked(law: StepLaw, chunk_tokens: int, decoders: int, prompt_tokens: int) -> tuple[float, float]:
    """(worst gap of the streams, the prompt's TTFT) in ms when ``prompt_tokens`` are cut into chunks of
    ``chunk_tokens``, each riding a step with ``decoders`` decodes (the prompt arriving at a step's start)."""
    chunks = [min(chunk_tokens, prompt_tokens - start) for start in range(0, prompt_tokens, chunk_tokens)]
    steps = [law(decoders, c) for c in chunks]
    return max(steps), sum(steps)


def chunk_tradeoff(laws: Mapping[str, StepLaw], chunk_tokens: int = 512, decoders: int = 48,
                   prompt_tokens: int = 4000) -> Chunking:
    """Lesson 05's trade-off curve (worst inter-token gap against TTFT, every chunk size) for each law,
    with ``chunk_tokens`` marked on each."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    sizes = np.unique(np.geomspace(16, prompt_tokens, 60).astype(int))
    itl, ttft = {}, {}
    for i, (name, law) in enumerate(laws.items()):
        curve = np.array([chunked(law, int(c), decoders, prompt_tokens) for c in sizes])
        ax.plot(curve[:, 0], curve[:, 1], color=f"C{i}", label=name)
        itl[name], ttft[name] = chunked(law, chunk_tokens, decoders, prompt_tokens)
        whole = law(decoders, prompt_tokens)
        ax.plot([itl[name]], [ttft[name]], "o", color=f"C{i}", ms=9,
                label=f"C = {chunk_tokens}: gap {itl[name]:.0f} ms, TTFT {ttft[name]:.0f} ms "
                      f"({ttft[name] / whole:.2f}x prefill-first)")
    ax.set(xscale="log", yscale="log", xlabel="worst inter-token gap of the streams (ms, log)",
           ylabel="the long prompt's TTFT (ms, log)",
           title=f"{prompt_tokens:,}-token prompt into {decoders} streams: every chunk size")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return Chunking(itl, ttft, fig)


def chunk_sliders(laws: Mapping[str, StepLaw], **initial):
    """Sliders on the chunk size and the number of streams for :func:`chunk_tradeoff`."""
    values = {"chunk_tokens": 512, "decoders": 48, **initial}
    return panel(lambda **s: _show(chunk_tradeoff, laws=laws, **s), values, {
        "chunk_tokens": ("int", "chunk C (tokens)", 16, 4000, 16),
        "decoders": ("int", "streams decoding", 1, 256, 1),
    })


# ---------------------------------------------------------------- lesson 07

def goodput_per_s(result: Result, ttft_ms: float | None, tpot_ms: float | None) -> float:
    """Completed requests per second of the run that meet both objectives (None: not set), as the
    summary's ``request_goodput`` counts them (a one-token answer has no TPOT and meets a TPOT limit)."""
    done = result.requests[result.requests["status"] == "finished"]
    ok = np.ones(len(done), dtype=bool)
    for column, limit_ms in (("ttft_s", ttft_ms), ("tpot_s", tpot_ms)):
        if limit_ms is not None:
            v = done[column].to_numpy()
            ok &= np.isnan(v) | (v <= limit_ms / 1e3)
    return int(ok.sum()) / result.summary["duration"]


@dataclass(frozen=True)
class Goodput:
    """Goodput per arrival rate at one pair of objectives, and the figure."""

    by_rate: dict[float, float]
    figure: object


def goodput_curve(runs: Mapping[float, Result], ttft_ms: float = 500.0, tpot_ms: float = 30.0) -> Goodput:
    """Throughput and goodput against the arrival rate of ``runs`` (rate -> result), at these objectives."""
    rates = sorted(runs)
    good = {r: goodput_per_s(runs[r], ttft_ms, tpot_ms) for r in rates}
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(rates, [runs[r].summary["request_throughput"] for r in rates], "o-", label="request_throughput")
    ax.plot(rates, [good[r] for r in rates], "s-", label=f"goodput: TTFT ≤ {ttft_ms:.0f} ms, TPOT ≤ {tpot_ms:.0f} ms")
    ax.set(xlabel="arrival rate (requests/s)", ylabel="requests/s", ylim=(0, None),
           title="The objective decides which requests count")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return Goodput(good, fig)


def goodput_sliders(runs: Mapping[float, Result], **initial):
    """Sliders on the TTFT and TPOT objectives for :func:`goodput_curve` over ``runs``."""
    values = {"ttft_ms": 500.0, "tpot_ms": 30.0, **initial}
    return panel(lambda **s: _show(goodput_curve, runs=runs, **s), values, {
        "ttft_ms": ("float", "TTFT objective (ms)", 50.0, 20_000.0, 50.0),
        "tpot_ms": ("float", "TPOT objective (ms)", 20.0, 60.0, 0.5),
    })


# ---------------------------------------------------------------- lesson 11

@dataclass(frozen=True)
class Staleness:
    """One router and signal delay: the run, its mean wait (arrivals after ``warmup_s``) and the figure."""

    result: Result
    mean_wait_s: float
    figure: object


def staleness(scenario_for: Callable[[str, float], Scenario], router: str = "least_outstanding",
              signal_delay_ms: float = 1000.0, warmup_s: float = 10.0, window_s: float = 20.0) -> Staleness:
    """Simulate ``scenario_for(router, signal_delay_ms)`` and draw each replica's requests in the system
    over ``window_s`` seconds after the warm-up: herding shows as replicas taking turns to fill."""
    result = simulate(scenario_for(router, signal_delay_ms))
    rq = result.requests
    kept = rq[rq["arrival_s"] >= warmup_s]
    wait_s = float((kept["first_scheduled_s"] - kept["arrival_s"]).mean())
    grid = np.linspace(warmup_s, warmup_s + window_s, 800)
    fig, ax = plt.subplots(figsize=(11, 3.6))
    for replica, rows in rq.groupby("replica"):
        arrived = np.searchsorted(np.sort(rows["arrival_s"].to_numpy()), grid, side="right")
        left = np.searchsorted(np.sort(rows["finish_s"].dropna().to_numpy()), grid, side="right")
        ax.step(grid, arrived - left, where="post", lw=1, label=f"replica {replica}")
    ax.set(xlabel="time (s)", ylabel="requests in the replica",
           title=f"{router}, signal {signal_delay_ms:.0f} ms old: mean wait {1e3 * wait_s:.0f} ms")
    ax.legend(fontsize=8, ncol=4, loc="upper right")
    fig.tight_layout()
    return Staleness(result, wait_s, fig)


def staleness_sliders(scenario_for: Callable[[str, float], Scenario], routers: tuple[str, ...], **initial):
    """A slider on the signal delay and a menu of routers for :func:`staleness`."""
    values = {"router": "least_outstanding", "signal_delay_ms": 1000.0, **initial}
    return panel(lambda **s: _show(staleness, scenario_for=scenario_for, **s), values, {
        "router": routers,
        "signal_delay_ms": ("float", "signal delay (ms)", 0.0, 3000.0, 50.0),
    })

"""7: Stability: a bounded queue below capacity, linear growth at lambda - mu_max above it

Continuous batching with B slots, all busy, completes requests at
mu_max = 1 / (tau0 E[L]/B + beta (E[L] - 1) + gamma E[P]) (``simbatch.analysis.theory.continuous_request_cost_s``:
every step samples B tokens; a request's slot pays beta in its L - 1 decode steps). Below mu_max the
number in system N(t) is a positive-recurrent process, so its time average converges (the ergodic
theorem for regenerative processes; S. Asmussen, *Applied Probability and Queues*, 2003, ch. VI):
the averages over a window of length T and of 2T agree within noise. Above it every step is full,
admissions run at mu_max, and the number waiting grows on average as (lambda - mu_max) t, so the
window-2T average exceeds the window-T one by (lambda - mu_max) T / 2. ``capacity.stability`` (the
verdict ``simbatch run`` prints) charges beta for all L tokens, a capacity lower by about one beta
per request (0.15% here); its mu_max, from each run's own mean output, is checked against the slope
too, and its verdict must be stable exactly when lambda < mu_max.

Runs: B = 8, tau0 = 20 ms, beta = 0.2 ms, 16-token prompts, outputs ceil(Exp(50)), Poisson arrivals
at 0.7 mu_max and 1.5 mu_max. Bias by design: the windows start after a warm-up ``warmup_s`` (a few
hundred request lifetimes). A window average comes from runs of one seed stopped by
``sim.max_time_s`` at w, w + T and w + 2T: the simulator is deterministic, so the shorter runs are
prefixes of the longest and L over [a, b] = (b L_b - a L_a) / (b - a) from their summaries. The slope
of num_waiting is a least-squares fit over the longest run's steps after the warm-up (each
iteration row placed at its middle step and weighted by its number of steps).
"""

from __future__ import annotations

from functools import partial

import pytest
from replicate import ols_slope

from simbatch.analysis import theory
from simbatch.config import Device, Exponential

DEVICE = {"tau0_ms": 20.0, "beta_ms": 0.2}
BATCH, PROMPT, MEAN_OUTPUT = 8, 16, 50.0


def _mu_max() -> float:
    mean_len = theory.length_moments(Exponential(dist="exponential", mean=MEAN_OUTPUT))[0]
    return 1 / theory.continuous_request_cost_s(Device(**DEVICE), BATCH, mean_len, PROMPT)


def _observe(result, warmup_s: float):
    """(integral of N(t) up to the stop, least-squares slope of num_waiting after the warm-up, the
    stability verdict ``simulate`` reports for this traffic)."""
    it = result.iterations[result.iterations["start_s"] >= warmup_s]
    mid_s = it["start_s"] + (it["num_steps"] - 1) * it["duration_s"] / 2  # a run of steps, at its middle step
    slope = ols_slope(mid_s.to_numpy(), it["num_waiting"].to_numpy(), it["num_steps"].to_numpy()) \
        if len(it) > 1 else float("nan")
    return result.summary["L"] * result.summary["duration"], slope, result.stability


def _windows(sim, rate: float, seeds, warmup_s: float, window_s: float):
    """Per seed: (L over [w, w+T], L over [w, w+2T], slope of num_waiting over [w, w+2T], verdict)."""
    stops = (warmup_s, warmup_s + window_s, warmup_s + 2 * window_s)
    specs = [{
        "seed": seed,
        "workload": {"duration_s": stops[-1], "arrival": {"rate": rate},
                     "prompt_tokens": {"dist": "fixed", "value": PROMPT},
                     "output_tokens": {"dist": "exponential", "mean": MEAN_OUTPUT}},
        "device": DEVICE,
        "batching": {"max_num_seqs": BATCH},
        "sim": {"max_time_s": stop_s},
    } for seed in seeds for stop_s in stops]
    runs = sim.map(partial(_observe, warmup_s=warmup_s), specs)
    out = []
    for i in range(0, len(runs), 3):
        (a0, _, _), (a1, _, _), (a2, slope, verdict) = runs[i:i + 3]
        out.append(((a1 - a0) / window_s, (a2 - a0) / (2 * window_s), slope, verdict))
    return zip(*out, strict=True)


@pytest.mark.validation
def test_below_capacity_converges(sim, check, mode):
    """lambda = 0.7 mu_max: L over [w, w+T] and over [w, w+2T] agree (paired), and the verdict is stable."""
    rate, warmup_s, window_s = 0.7 * _mu_max(), 50.0, mode.pick(150.0, 600.0)
    seeds = range(mode.pick(8, 30))
    short, long, _, verdicts = _windows(sim, rate, seeds, warmup_s, window_s)
    check.paired(f"L over 2T = {2 * window_s:g} s vs over T (requests)", short, long, seeds)
    for verdict in verdicts:
        assert verdict.stable and verdict.verdict.startswith("stable"), verdict


@pytest.mark.validation
def test_above_capacity_grows_linearly(sim, check, mode):
    """lambda = 1.5 mu_max: the number waiting grows at lambda - mu_max (slope fit, and the window
    averages), and the verdict says oversubscribed."""
    mu = _mu_max()
    rate, warmup_s, window_s = 1.5 * mu, 50.0, mode.pick(150.0, 600.0)
    seeds = range(mode.pick(8, 30))
    short, long, slope, verdicts = _windows(sim, rate, seeds, warmup_s, window_s)
    check.ci("slope of num_waiting, lambda - mu_max (requests/s)", rate - mu, slope, seeds)
    check.paired("slope of num_waiting, lambda - capacity.stability's mu_max (requests/s)",
                 [rate - v.capacity_requests_per_s for v in verdicts], slope, seeds)
    check.ci("L over 2T minus L over T, (lambda - mu_max) T/2 (requests)", (rate - mu) * window_s / 2,
             [b - a for a, b in zip(short, long, strict=True)], seeds)
    for verdict in verdicts:
        assert not verdict.stable and verdict.verdict.startswith("oversubscribed"), verdict

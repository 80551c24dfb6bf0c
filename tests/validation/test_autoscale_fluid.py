"""15: Autoscaling: on a slow daily curve, the fleet follows the fluid approximation ceil(lambda(t - d) / c)

A non-homogeneous Poisson stream of rate lambda(t) = m (1 + a cos(2 pi (t - t_peak) / P)) (drawn by
thinning: simbatch.workload.rate_curve) feeds replicas that serve one request at a time in a fixed
S = 0.5 s (one 100-token prefill step of 400 + 100 x 1 ms, one output token), so a replica's busy
fraction is exactly its arrival rate x S. An autoscaler on busy_fraction with target b asks for
ceil(n x busy / b) replicas: with the load spread evenly, ceil(lambda S / b), that is
ceil(lambda / c) with c = b / S one replica's capacity at the target (c = 1.2 req/s at b = 0.6).

The fluid approximation (simbatch.analysis.autoscale.fluid_replicas) is the limit of a deterministic
load spread exactly: replicas follow ceil(lambda(t - d) / c) after the start-up delay d. The
autoscaler adds two lags of its own: the load is read on average half an evaluation interval late,
and a scale-down waits for the stabilization window (the highest recommendation of the last
cooldown_s): n(t) = max over [t - cooldown, t] of ceil(lambda(s - d - interval / 2) / c). On a curve
slow against d, the interval and the cool-down (P = 2 h against 60 s, 30 s, 120 s) the ready
replicas' time average must be within 2 % of the stabilized fluid's and within 5 % of the plain
one's (which the cool-down alone puts about 2.5 % below), and the count itself within half a
replica of the stabilized fluid's on average over the run (Poisson noise in the measured busy
fraction, and HPA's 10 % tolerance band, keep it off by one now and then). Bounds: the mean over
replications of each relative error, less its half-width, at most the tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest

from simbatch.analysis.autoscale import fluid_replicas, ready_at
from simbatch.config import Scenario
from simbatch.workload.rate_curve import rate_function

SERVICE_S, TARGET = 0.5, 0.6
CAPACITY = TARGET / SERVICE_S


def _spec(seed: int, period_s: float) -> dict:
    return {"seed": seed,
            "workload": {"duration_s": period_s, "arrival": {"rate_curve": {
                "kind": "sinusoidal", "mean": 10.0, "amplitude": 0.8, "period_s": period_s, "peak_s": period_s / 2}},
                "prompt_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 1}},
            "device": {"tau0_ms": 400.0, "beta_ms": 0.0, "prefill_ms_per_token": 1.0},
            "batching": {"max_num_seqs": 1},
            "cluster": {"replicas": 2, "router": "least_outstanding", "autoscale": {
                "metric": "busy_fraction", "target": TARGET, "min_replicas": 1, "max_replicas": 30,
                "startup_delay_s": 60.0, "interval_s": 30.0, "cooldown_s": 120.0}}}


def _errors(result) -> tuple[float, float, float]:
    """Relative errors of the ready replicas' time average against the stabilized and the plain
    fluid fleets, and the mean absolute difference from the stabilized one, replicas."""
    sc = result.scenario
    rate, spec, end_s = rate_function(sc.workload.arrival.rate_curve), sc.cluster.autoscale, sc.workload.duration_s
    times, held = fluid_replicas(rate.at, CAPACITY, spec, end_s)
    _, plain = fluid_replicas(rate.at, CAPACITY, spec, end_s, stabilized=False)
    ready = ready_at(result.fleet, times)
    return (abs(ready.mean() - held.mean()) / held.mean(), abs(ready.mean() - plain.mean()) / plain.mean(),
            float(np.abs(ready - held).mean()))


@pytest.mark.validation
def test_replicas_follow_the_fluid_approximation_on_a_slow_curve(sim, check, mode):
    """m = 10 req/s, a = 0.8 (2 to 18 req/s: 2 to 15 replicas), P = 2 h, d = 60 s, evaluation
    every 30 s, cool-down 120 s, HPA's 10 % tolerance, 1 to 30 replicas, 2 ready at t = 0 (72,000 requests a run)."""
    period_s = 7200.0
    seeds = range(mode.pick(2, 8))
    held, plain, gap = zip(*sim.map(_errors, [_spec(s, period_s) for s in seeds]), strict=True)
    check.upper_bound("abs(mean ready replicas / stabilized fluid - 1)", 0.02, held, seeds)
    check.upper_bound("abs(mean ready replicas / plain fluid ceil(lambda(t - d) / c) - 1)", 0.05, plain, seeds)
    check.upper_bound("mean abs(ready replicas - stabilized fluid) (replicas)", 0.5, gap, seeds)


@pytest.mark.validation  # (cheap: it keeps the validation's premise true, so it runs with it)
def test_the_scenario_is_what_the_check_says():
    """The service time and capacity the docstring states are the device's."""
    sc = Scenario.model_validate(_spec(0, 3600.0))
    assert sc.device.tau0_ms + 100 * sc.device.prefill_ms_per_token == SERVICE_S * 1e3

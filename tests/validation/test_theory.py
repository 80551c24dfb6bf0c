"""0: Lengths and formulas: simbatch.analysis.theory describes the laws the simulator draws from

Every other check computes its theory from ``simbatch.analysis.theory``; this one checks that module itself.
The length samplers of ``simbatch.workload.lengths`` must draw from the probability mass functions
``theory.length_pmf`` assumes, discreteness included (``exponential`` is ceil(Exp(mean)), geometric;
``max`` piles the tail onto the cap): the replication means of E[L] and of the maximum of 8 i.i.d.
lengths must cover the exact values. The closed forms are then pinned on cases with known answers:
M/M/1's Wq = rho / (mu - lambda) from Pollaczek-Khinchine with E[S^2] = 2/mu^2, harmonic numbers,
order statistics of tiny distributions, and Inoue's bound above the exact mean latency, which tends
to alpha + tau0 (a lone job) as lambda goes to 0.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from simbatch.analysis import theory
from simbatch.config import Choice, Device, Exponential, Fixed, Uniform, Zipf
from simbatch.inputs.loading import scenario_from_dict
from simbatch.workload.lengths import sample_lengths

DISTS = {
    "fixed": Fixed(value=7),
    "uniform": Uniform(dist="uniform", low=3, high=40),
    "choice": Choice(dist="choice", values=[5, 50, 5, 500], weights=[1.0, 2.0, 3.0, 0.5]),
    "zipf": Zipf(dist="zipf", a=1.2, min=2, max=300),
    "exponential": Exponential(dist="exponential", mean=30.0),
    "exponential_capped": Exponential(dist="exponential", mean=30.0, max=45),
}
GROUP = 8


@pytest.mark.validation
@pytest.mark.parametrize("name", list(DISTS))
def test_sampler_matches_pmf(name, check, mode):
    """E[L] and E[max of 8 lengths], replication means of the sampler's draws against the pmf."""
    dist = DISTS[name]
    scenario = scenario_from_dict({"workload": {"num_requests": 1}})
    draws = mode.pick(40_000, 400_000)
    seeds = range(mode.pick(8, 30))
    samples = [sample_lengths(dist, draws, np.random.default_rng(seed), scenario) for seed in seeds]
    values, probs = theory.length_pmf(dist)
    assert math.isclose(probs.sum(), 1.0, rel_tol=1e-12) and (probs >= 0).all() and (np.diff(values) > 0).all()
    check.ci("E[L] (tokens)", theory.length_moments(dist)[0], [s.mean() for s in samples], seeds)
    check.ci(f"E[max of {GROUP}] (tokens)", theory.expected_max_length(dist, GROUP),
             [s.reshape(-1, GROUP).max(axis=1).mean() for s in samples], seeds)


@pytest.mark.validation
def test_closed_forms_on_known_cases():
    """Cases solved by hand."""
    lam, mu = 3.0, 5.0
    assert math.isclose(theory.pk_mean_wait_s(lam, 1 / mu, 2 / mu**2), (lam / mu) / (mu - lam), rel_tol=1e-12)
    with pytest.raises(ValueError, match="offered load"):
        theory.pk_mean_wait_s(5.0, 0.2, 0.08)
    assert theory.harmonic_number(1) == 1.0 and math.isclose(theory.harmonic_number(4), 25 / 12)
    assert math.isclose(theory.expected_max_exponential(4, 10.0), 250 / 12)
    two = Uniform(dist="uniform", low=1, high=2)
    assert math.isclose(theory.expected_max_length(two, 2), 1.75)  # max is 1 only if both are 1
    assert theory.expected_max_length(Fixed(value=9), 5) == 9.0
    # Geometric: E[L] = 1/(1-q), E[L^2] = (1+q)/(1-q)^2, q = exp(-1/mean).
    q = math.exp(-1 / 30)
    mean, second = theory.length_moments(DISTS["exponential"])
    assert math.isclose(mean, 1 / (1 - q), rel_tol=1e-12) and math.isclose(second, (1 + q) / (1 - q) ** 2,
                                                                           rel_tol=1e-12)
    # One sequence at a time with fixed lengths: S is deterministic, E[S^2] = E[S]^2.
    es, es2 = theory.single_sequence_service_moments_s(Device(prefill_ms_per_token=0.1), Fixed(value=50),
                                                       Fixed(value=10))
    assert math.isclose(es, 0.025 + 9 * 0.0202) and math.isclose(es2, es**2)


@pytest.mark.validation
@pytest.mark.parametrize("alpha_s,tau0_s", [(0.01, 0.02), (0.002, 0.02), (0.02, 0.001)])
def test_inoue_bound_dominates_the_exact_latency(alpha_s, tau0_s):
    """Theorem 2 on a grid of loads lambda alpha in (0, 1), and the light-traffic limit."""
    for x in (0.05, 0.3, 0.6, 0.9):
        lam = x / alpha_s
        exact = theory.inoue_mean_latency_s(lam, alpha_s, tau0_s, *theory.inoue_batch_moments(lam, alpha_s, tau0_s))
        assert alpha_s + tau0_s < exact <= theory.inoue_latency_bound_s(lam, alpha_s, tau0_s)
    lam = 1e-4 / (alpha_s + tau0_s)
    light = theory.inoue_mean_latency_s(lam, alpha_s, tau0_s, *theory.inoue_batch_moments(lam, alpha_s, tau0_s))
    assert math.isclose(light, alpha_s + tau0_s, rel_tol=1e-3)
    with pytest.raises(ValueError, match="grow without bound"):
        theory.inoue_latency_bound_s(1 / alpha_s, alpha_s, tau0_s)

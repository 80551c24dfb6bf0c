"""The queueing formulas lessons 8 and 9 put next to simulations: Kingman, the processor-sharing fixed
point and the birth-death chain of a continuous-batching server, pinned on cases solved by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simbatch.analysis import theory
from simbatch.config import Device

DEVICE = Device(tau0_ms=20, beta_ms=0.2)


def test_kingman_is_pollaczek_khinchine_for_poisson_arrivals():
    lam, es, cs2 = 3.0, 0.2, 0.5  # E[S^2] = (1 + c_s^2) E[S]^2
    pk = theory.pk_mean_wait_s(lam, es, (1 + cs2) * es**2)
    assert math.isclose(theory.kingman_mean_wait_s(lam, es, 1.0, cs2), pk, rel_tol=1e-12)
    # M/M/1: Wq = rho / (mu - lambda); and the wait is linear in c_a^2 + c_s^2.
    assert math.isclose(theory.kingman_mean_wait_s(lam, es, 1.0, 1.0), 0.6 / (5 - 3), rel_tol=1e-12)
    assert math.isclose(theory.kingman_mean_wait_s(lam, es, 10.0, 0.0), 5 * theory.kingman_mean_wait_s(lam, es, 1.0, 1.0))
    with pytest.raises(ValueError, match="offered load 1.200"):
        theory.kingman_mean_wait_s(6.0, 0.2, 1.0, 1.0)


def test_ps_fixed_point_solves_littles_law():
    lam, out = 2.0, 500
    w = theory.ps_fixed_point_latency_s(DEVICE, lam, out)
    assert math.isclose(w, out * 0.020 / (1 - lam * out * 0.0002))  # 12.5 s
    assert math.isclose(w, out * (0.020 + 0.0002 * lam * w))  # W = E[out] tau(lambda W)
    assert theory.ps_fixed_point_latency_s(DEVICE, 1e-9, out) == pytest.approx(out * 0.020)
    with pytest.raises(ValueError, match="grows without bound"):
        theory.ps_fixed_point_latency_s(DEVICE, 10.0, out)


def test_occupancy_chain_on_hand_solved_cases():
    # beta = 0: every step costs tau0 whatever the batch, completions at rate n / (E[out] tau0) up to
    # B_max: the M/M/c queue with c = B_max, mu = 1 / (E[out] tau0). With B_max = 1 it is M/M/1.
    flat = Device(tau0_ms=100, beta_ms=0)
    pmf = theory.batching_occupancy_pmf(flat, 1, 2.0, 4)  # mu = 2.5, rho = 0.8
    assert np.allclose(pmf[:5], 0.2 * 0.8 ** np.arange(5))
    assert math.isclose(theory.batching_mean_latency_s(flat, 1, 2.0, 4), 1 / (2.5 - 2.0), rel_tol=1e-9)
    # M/M/infinity (B_max far above the load): N is Poisson(lambda E[out] tau0).
    pmf = theory.batching_occupancy_pmf(flat, 200, 5.0, 4)
    assert np.allclose(pmf[:20], [math.exp(-2) * 2**n / math.factorial(n) for n in range(20)])
    # M/M/2, lambda = 3, mu = 2.5 per server: P0 = (1 - r) / (1 + r), r = lambda / (2 mu) = 0.6.
    pmf = theory.batching_occupancy_pmf(flat, 2, 3.0, 4)
    assert math.isclose(pmf[0], 0.4 / 1.6, rel_tol=1e-9)
    assert math.isclose(pmf[3] / pmf[2], 0.6, rel_tol=1e-9)


def test_occupancy_chain_meets_the_fixed_point_in_light_load_and_the_slot_limit_in_heavy():
    lam = 1.0
    light = theory.batching_mean_latency_s(DEVICE, 64, lam, 500)
    assert light == pytest.approx(theory.ps_fixed_point_latency_s(DEVICE, lam, 500), rel=0.01)
    capacity = 64 / (500 * 0.0328)
    heavy = theory.batching_occupancy_pmf(DEVICE, 64, 0.99 * capacity, 500)
    assert heavy.sum() == pytest.approx(1.0) and heavy[64:].sum() > 0.5  # most of the time slots are full
    with pytest.raises(ValueError, match="completion rate of a full batch"):
        theory.batching_occupancy_pmf(DEVICE, 64, capacity, 500)


def test_erlang_c_on_hand_solved_cases():
    # One server: P(wait) = rho. Two servers at a = 1: C = (1/2 * 2) / (1 + 1 + 1) = 1/3.
    assert math.isclose(theory.erlang_c(1, 0.7), 0.7)
    assert math.isclose(theory.erlang_c(2, 1.0), 1 / 3)
    with pytest.raises(ValueError, match="per server"):
        theory.erlang_c(4, 4.0)


def test_mgc_wait_reduces_to_pk_and_mmc():
    lam, es = 3.0, 0.2
    # c = 1: Pollaczek-Khinchine for any c_s^2.
    assert math.isclose(theory.mgc_mean_wait_s(lam, es, 0.0, 1), theory.pk_mean_wait_s(lam, es, es**2))
    assert math.isclose(theory.mgc_mean_wait_s(lam, es, 1.0, 1), theory.pk_mean_wait_s(lam, es, 2 * es**2))
    # M/M/2, lambda = 3, mu = 2.5: Wq = C / (2 mu - lambda) with C = 2 r^2 / (1 + r) at r = 0.6 (= 0.45).
    mm2 = theory.mgc_mean_wait_s(lam, 1 / 2.5, 1.0, 2)
    assert math.isclose(mm2, 0.45 / (5 - 3))
    # One queue for four servers waits far less than four queues of a quarter of the traffic each.
    assert theory.mgc_mean_wait_s(4 * lam, es, 1.0, 4) < theory.mgc_mean_wait_s(lam, es, 1.0, 1) / 3

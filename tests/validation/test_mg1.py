"""1: M/G/1, one sequence at a time, against the Pollaczek-Khinchine mean wait

With ``batching.max_num_seqs: 1`` the continuous engine serves one request at a time in arrival
order, and a request's service time follows from its lengths and the step cost:
S = (tau0 + gamma P) + (O - 1)(tau0 + beta), one prefill step that samples the first token and one
single-sequence decode step per further token. Poisson arrivals make it an M/G/1 queue, whose mean
wait is the Pollaczek-Khinchine formula

    Wq = lambda E[S^2] / (2 (1 - rho)),   rho = lambda E[S]

(F. Pollaczek 1930, A. Khinchine 1932; L. Kleinrock, *Queueing Systems* vol. 1, 1975, eq. 5.105).
E[S] and E[S^2] are computed exactly from the length distribution (``simbatch.analysis.theory``): for
``exponential`` outputs, O = ceil(Exp(mean)) is geometric, P(O = k) = q^(k-1)(1 - q) with
q = exp(-1/mean). The simulated Wq of a request is ``first_scheduled_s - arrival_s``.

Bias by design: the run starts empty, so early requests wait less than in steady state; requests
arriving in the first 100 s (a hundred relaxation times E[S]/(1 - sqrt(rho))^2 ~ 1 s) are dropped.
Arrivals stop at the horizon and the engine drains, so every kept wait is observed whole.
"""

from __future__ import annotations

from functools import partial

import pytest

from simbatch.analysis import theory
from simbatch.config import Device, Exponential, Fixed

DEVICE = {"tau0_ms": 20.0, "beta_ms": 0.2, "prefill_ms_per_token": 0.1}
PROMPT = {"dist": "fixed", "value": 50}
RHO = 0.5
OUTPUT, MEAN_OUTPUT = 4, 3.5  # ceil(Exp(3.5)) has mean 1 / (1 - exp(-1/3.5)) = 4.0


def _measure(result, warmup_s: float) -> tuple[float, float, float]:
    """(mean wait, mean service time, busy fraction) of the requests that arrived after the warm-up."""
    req = result.requests
    kept = req[req["arrival_s"] >= warmup_s]
    wait = kept["first_scheduled_s"] - kept["arrival_s"]
    return float(wait.mean()), float((kept["e2e_s"] - wait).mean()), result.summary["busy_fraction"]


@pytest.mark.validation
@pytest.mark.parametrize("output", [{"dist": "fixed", "value": OUTPUT},
                                    {"dist": "exponential", "mean": MEAN_OUTPUT}], ids=["deterministic", "exponential"])
def test_mg1_mean_wait(output, sim, check, mode):
    """rho = 0.5; P = 50 tokens at gamma = 0.1 ms, tau0 = 20 ms, beta = 0.2 ms; outputs fixed at 4
    tokens (M/D/1, S = 85.6 ms) or ceil(Exp(3.5)) (E[O] = 4.0). Also checks E[S] and rho."""
    length = Fixed(**output) if output["dist"] == "fixed" else Exponential(**output)
    es, es2 = theory.single_sequence_service_moments_s(Device(**DEVICE), Fixed(**PROMPT), length)
    lam = RHO / es
    horizon_s, warmup_s = mode.pick(1_000.0, 4_000.0), 100.0
    seeds = range(mode.pick(8, 30))
    specs = [{"seed": seed,
              "workload": {"duration_s": horizon_s, "arrival": {"rate": lam}, "prompt_tokens": PROMPT,
                           "output_tokens": output},
              "device": DEVICE,
              "batching": {"max_num_seqs": 1}} for seed in seeds]
    waits, service, busy = zip(*sim.map(partial(_measure, warmup_s=warmup_s), specs), strict=True)
    check.ci("Wq (s)", theory.pk_mean_wait_s(lam, es, es2), waits, seeds)
    check.ci("E[S] (s)", es, service, seeds)
    check.ci("rho (busy fraction)", RHO, busy, seeds)

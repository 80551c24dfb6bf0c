"""10: Speculative decoding: tokens per step (1 - alpha^(k+1)) / (1 - alpha), the step's cost, and TPOT at low load

A decode step verifies k drafts, each accepted with probability alpha until the first rejection, and
emits the accepted ones and one more: E[A + 1] = sum_{j=0..k} alpha^j = (1 - alpha^(k+1)) / (1 - alpha)
tokens (Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative Decoding",
ICML 2023). The run's ``spec_decode_acceptance_length`` (1 + accepted / drafts, vLLM's
mean acceptance length) must match it within the replications' interval. A request's last steps
propose fewer than k drafts (never one past its last token); with outputs of thousands of tokens
they are under 1 step in 500, a bias well inside the interval.

The step's cost (simbatch/model/cost.py): B sequences verifying k drafts each take
tau0 + beta B + gamma k B plus k drafter passes, each ``draft_cost_ms`` or ``draft_cost_fraction``
times tau0 + beta B: checked exactly on every step of a run where B requests speculate at once.

With a rate of each request's own (alpha_i from a Beta distribution of mean alpha), a request
spends 1 / E(alpha_i) steps per token, and the run's steps per token must match E[1 / E(alpha_i)],
the Beta integral.

At low load each request is alone on the engine, every decode step is that cost at B = 1, and a
request emits E tokens a step, so TPOT = tau_spec(1) / E (ITL, the gap between streamed chunks,
stays the step time); mean TPOT over the replications must match it.
"""

from __future__ import annotations

import pytest

from simbatch.config import Device, Speculative
from simbatch.features.speculative import expected_tokens_per_step, step_ms, tokens_per_step
from simbatch.model.cost import LinearCost

DEVICE = {"tau0_ms": 10.0, "beta_ms": 0.1, "prefill_ms_per_token": 0.1}


def _spec(k: int, alpha: float, **cost) -> dict:
    return {"num_speculative_tokens": k, "acceptance_rate": alpha, **cost}


def _acceptance_length(result) -> float:
    return result.summary["spec_decode_acceptance_length"]


@pytest.mark.validation
@pytest.mark.parametrize(("k", "alpha"), [(3, 0.6), (5, 0.85)])
def test_tokens_per_step(k, alpha, sim, check, mode):
    """16 requests at t = 0 decoding side by side, outputs of 2,000 (quick) or 20,000 tokens."""
    seeds = range(mode.pick(4, 30))
    output = mode.pick(2000, 20_000)
    specs = [{"seed": s,
              "workload": {"num_requests": 16, "arrival": {"rate": float("inf")},
                           "prompt_tokens": {"dist": "fixed", "value": 32},
                           "output_tokens": {"dist": "fixed", "value": output}},
              "device": {**DEVICE, "speculative": _spec(k, alpha, draft_cost_ms=1.0)},
              "kv_cache": {"num_blocks": 100_000}}
             for s in seeds]
    measured = sim.map(_acceptance_length, specs)
    check.ci(f"tokens per speculating step, k = {k}, alpha = {alpha}", expected_tokens_per_step(k, alpha),
             measured, seeds)


def _steps_per_token(result) -> float:
    return 1 / result.summary["spec_decode_acceptance_length"]


@pytest.mark.validation
def test_per_request_acceptance_rates(sim, check, mode):
    """Each request draws its own alpha from Beta(c alpha, c (1 - alpha)), alpha = 0.7, c = 4, k = 4;
    16 requests of equal length per replication (64 in the full mode). A request takes 1 / E(alpha_i)
    steps per token, so the run's steps per token, 1 / mean acceptance length, estimates
    E[1 / E(alpha_i)] without bias (a ratio over the requests would not): against the Beta integral."""
    k, alpha, c = 4, 0.7, 4.0
    seeds = range(mode.pick(4, 30))
    spec = _spec(k, alpha, draft_cost_ms=1.0, acceptance_rate_concentration=c)
    specs = [{"seed": s,
              "workload": {"num_requests": mode.pick(16, 64), "arrival": {"rate": float("inf")},
                           "prompt_tokens": {"dist": "fixed", "value": 32},
                           "output_tokens": {"dist": "fixed", "value": mode.pick(2000, 5000)}},
              "device": {**DEVICE, "speculative": spec},
              "batching": {"max_num_seqs": 64},
              "kv_cache": {"num_blocks": 100_000}}
             for s in seeds]
    measured = sim.map(_steps_per_token, specs)
    expected = 1 / tokens_per_step(Speculative.model_validate(spec))
    check.ci(f"speculating steps per token, alpha_i ~ Beta({c * alpha:g}, {c * (1 - alpha):g}), k = {k}",
             expected, measured, seeds)
    assert expected > 1 / expected_tokens_per_step(k, alpha)  # the spread costs steps: Jensen


def _decode_rows(result):
    it = result.iterations
    return it[it["prefill_tokens"] == 0][["decode_tokens", "duration_s", "num_steps"]]


@pytest.mark.validation
@pytest.mark.parametrize("cost", [{"draft_cost_ms": 1.5}, {"draft_cost_fraction": 0.2}], ids=["ms", "fraction"])
def test_step_cost(cost, sim, check):
    """8 requests at t = 0, k = 4: every step where all 8 verify 4 drafts lasts
    10 + 0.8 + 0.1 x 32 + 4 x 1.5 = 20 ms, or 14 + 4 x 0.2 x 10.8 = 22.64 ms."""
    k, batch = 4, 8
    spec = {"workload": {"num_requests": batch, "arrival": {"rate": float("inf")},
                         "prompt_tokens": {"dist": "fixed", "value": 32},
                         "output_tokens": {"dist": "fixed", "value": 400}},
            "device": {**DEVICE, "speculative": _spec(k, 0.7, **cost)}}
    device = Device.model_validate(spec["device"])
    expected_s = step_ms(LinearCost.of(device), batch, k, spec=device.speculative) / 1e3
    rows = sim.map(_decode_rows, [spec])[0]
    full = rows[rows["decode_tokens"] == batch * (1 + k)]
    slowest, fastest, steps = float(full["duration_s"].max()), float(full["duration_s"].min()), full["num_steps"].sum()
    assert steps > 20, "too few steps with every request speculating: not a check"
    check.exact(f"step time with {batch} x {k} drafts, slowest (s)", expected_s, slowest)
    check.exact(f"step time with {batch} x {k} drafts, fastest (s)", expected_s, fastest)
    plain_s = step_ms(LinearCost.of(device), batch, 0) / 1e3
    check.exact("overhead over a plain decode step (ratio)", expected_s / plain_s, slowest / plain_s)


def _tpot_ms(result) -> float:
    return result.summary["mean_tpot_ms"]


@pytest.mark.validation
def test_tpot_at_low_load(sim, check, mode):
    """Requests 30 s apart (each done in under 25 s: alone on the engine), 4,000-token outputs,
    k = 4, alpha = 0.7, drafter passes a tenth of the target's step: TPOT = tau_spec(1) / E."""
    k, alpha = 4, 0.7
    seeds = range(mode.pick(4, 30))
    device = {**DEVICE, "speculative": _spec(k, alpha, draft_cost_fraction=0.1)}
    specs = [{"seed": s,
              "workload": {"num_requests": mode.pick(3, 10), "arrival": {"process": "constant", "rate": 1 / 30},
                           "prompt_tokens": {"dist": "fixed", "value": 64},
                           "output_tokens": {"dist": "fixed", "value": 4000}},
              "device": device}
             for s in seeds]
    measured = sim.map(_tpot_ms, specs)
    validated = Device.model_validate(device)
    tau = step_ms(LinearCost.of(validated), 1, k, spec=validated.speculative)
    check.ci(f"mean TPOT (ms), tau_spec(1) / E = {tau:.2f} / {expected_tokens_per_step(k, alpha):.4f}",
             tau / expected_tokens_per_step(k, alpha), measured, seeds)

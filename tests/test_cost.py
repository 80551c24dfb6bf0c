"""The step-time model, the KV block arithmetic and the capacity check, against the chapter's worked device and exercises.

The chapter's device: tau0 = 20 ms, beta = 0.2 ms per decoding sequence (the ``Device`` defaults).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simbatch.analysis.capacity import stability
from simbatch.config import Device
from simbatch.memory.blocks import blocks_for, peak_kv_tokens
from simbatch.model.cost import batch_for_fraction, decode_throughput, roofline_tokens_per_s, step_time_s

CHAPTER = Device(tau0_ms=20.0, beta_ms=0.2)


def test_step_time_adds_fixed_sequence_and_prefill_costs():
    device = Device(tau0_ms=20.0, beta_ms=0.2, prefill_ms_per_token=0.05)
    assert step_time_s(device, 0) == pytest.approx(0.020)
    assert step_time_s(device, 64) == pytest.approx(0.0328)
    # 10 decodes and 400 prompt tokens: 20 + 2 + 20 ms.
    assert step_time_s(device, 10, 400) == pytest.approx(0.042)


@pytest.mark.parametrize(("batch", "tokens_per_s"), [(1, 1 / 0.0202), (8, 8 / 0.0216), (32, 32 / 0.0264),
                                                     (64, 64 / 0.0328)])
def test_decode_throughput_is_batch_over_step_time(batch, tokens_per_s):
    assert decode_throughput(CHAPTER, batch) == pytest.approx(tokens_per_s)


def test_chapter_exercise_throughputs():
    # Exercise 2(a): the figures quoted in the chapter, to the token.
    assert round(decode_throughput(CHAPTER, 8), 2) == 370.37
    assert round(decode_throughput(CHAPTER, 32), 2) == 1212.12
    assert round(decode_throughput(CHAPTER, 64), 2) == 1951.22


def test_throughput_rises_toward_the_roofline():
    roofline = roofline_tokens_per_s(CHAPTER)
    assert roofline == pytest.approx(5000.0)
    values = [decode_throughput(CHAPTER, b) for b in (1, 8, 64, 512, 10**6)]
    assert values == sorted(values)
    assert values[-1] < roofline
    assert values[-1] == pytest.approx(roofline, rel=1e-3)
    # Exercise 2(b): B = 64 reaches only 39 % of the roofline.
    assert decode_throughput(CHAPTER, 64) / roofline == pytest.approx(0.3902, abs=1e-4)


def test_roofline_is_infinite_without_marginal_cost():
    assert roofline_tokens_per_s(Device(tau0_ms=20.0, beta_ms=0.0)) == math.inf
    assert batch_for_fraction(Device(tau0_ms=20.0, beta_ms=0.0), 0.5) == math.inf


def test_batch_for_fraction_inverts_the_throughput_curve():
    # Exercise 2(c): half the roofline takes B = tau0 / beta = 100 > B_max = 64.
    assert batch_for_fraction(CHAPTER, 0.5) == pytest.approx(100.0)
    for f in (0.1, 0.39, 0.9, 0.99):
        b = batch_for_fraction(CHAPTER, f)
        assert decode_throughput(CHAPTER, b) == pytest.approx(f * roofline_tokens_per_s(CHAPTER))


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.5, 1.5])
def test_batch_for_fraction_rejects_fractions_outside_the_open_interval(fraction):
    with pytest.raises(ValueError, match="fraction"):
        batch_for_fraction(CHAPTER, fraction)


def test_blocks_for_rounds_up():
    assert [blocks_for(t, 4) for t in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    # Exercise 3(a): a 600-token prompt fills 38 blocks of 16, so 400 blocks hold 10 of them.
    assert blocks_for(600, 16) == 38
    assert 400 // blocks_for(600, 16) == 10
    # Exercise 3(c): 64 sequences of 100 tokens need 448 blocks > 400: memory binds before max_num_seqs.
    assert 64 * blocks_for(100, 16) == 448


def test_peak_kv_excludes_the_last_token():
    # The last sampled token is never fed back: prompt + output - 1 tokens, at least the prompt.
    assert peak_kv_tokens(6, 5) == 10
    assert peak_kv_tokens(6, 1) == 6
    assert peak_kv_tokens(16, 1) == 16 and blocks_for(peak_kv_tokens(16, 1), 16) == 1
    assert blocks_for(peak_kv_tokens(16, 2), 16) == 2


def test_stability_of_the_chapter_example():
    # 20 req/s x 500 tokens = 10,000 tok/s offered against 1951 tok/s: oversubscribed ~5x.
    s = stability(CHAPTER, 64, 20.0, 500.0)
    assert s.offered_tokens_per_s == pytest.approx(10_000.0)
    assert s.capacity_tokens_per_s == pytest.approx(64 / 0.0328)
    assert s.offered_load == pytest.approx(5.125)
    assert s.offered_load == pytest.approx(s.offered_tokens_per_s / s.capacity_tokens_per_s)
    assert s.capacity_requests_per_s == pytest.approx(20.0 / 5.125)
    # W_B, at the full-batch step time: 500 x 32.8 ms = 16.4 s; Little: L = 20 x 16.4 = 328 resident.
    # Not the idle server's latency (concepts.md, notebook 01): alone, 500 x tau(1) = 10.1 s.
    assert s.full_batch_latency_s == pytest.approx(16.4)
    assert 500 * step_time_s(CHAPTER, 1) == pytest.approx(10.1)
    assert s.demanded_concurrency == pytest.approx(328.0)
    assert not s.stable
    assert s.verdict.startswith("oversubscribed 5.1×")


def test_stability_scales_with_replicas_and_charges_prefill():
    six = stability(CHAPTER, 64, 20.0, 500.0, replicas=6)
    assert six.offered_load == pytest.approx(5.125 / 6)
    assert six.capacity_tokens_per_s == pytest.approx(6 * 64 / 0.0328)
    assert six.stable and six.verdict == "stable (offered load 85%)"
    # Each prompt token costs gamma on top: 2 req/s x (500 x 32.8 ms / 64 + 1000 x 0.05 ms).
    device = Device(tau0_ms=20.0, beta_ms=0.2, prefill_ms_per_token=0.05)
    s = stability(device, 64, 2.0, 500.0, mean_prompt_tokens=1000.0)
    assert s.offered_load == pytest.approx(2 * (500 * 0.0328 / 64 + 0.05))
    assert s.capacity_requests_per_s == pytest.approx(1 / (500 * 0.0328 / 64 + 0.05))
    assert s.full_batch_latency_s == pytest.approx(500 * 0.0328 + 0.05)


def test_the_gemm_tile_switch_charges_steps_inside_its_window_only():
    """A step of low < tokens <= high (decodes and prompt tokens together) costs gemm_tier_ms more,
    on the roofline and off it, and through the engine's per-plan path."""
    from simbatch.model.cost import LinearCost
    from simbatch.model.step import StepPlan

    device = Device(tau0_ms=10.0, beta_ms=1.0, prefill_ms_per_token=0.5, gemm_tier_tokens=[16, 64], gemm_tier_ms=3.0)
    cost = LinearCost.of(device)
    assert cost.step_ms(16) == pytest.approx(26.0)  # 10 + 16: at the switch, not above it
    assert cost.step_ms(17) == pytest.approx(30.0)  # 10 + 17 + 3
    assert cost.step_ms(10, 7) == pytest.approx(26.5)  # 10 + 10 + 3.5 + 3: the prompt's tokens count too
    assert cost.step_ms(64) == pytest.approx(77.0) and cost.step_ms(65) == pytest.approx(75.0)  # above high: none
    plan = StepPlan()
    plan.decode_seqs = 17
    assert cost.plan_ns(plan) == 30_000_000
    roofline = LinearCost.of(device.model_copy(update={"weights_ms": 20.0}))
    assert roofline.step_ms(17) - roofline.step_ms(16) == pytest.approx(3.0)
    assert LinearCost.of(device.model_copy(update={"gemm_tier_tokens": None})).step_ms(17) == pytest.approx(27.0)


@settings(max_examples=200, deadline=None)
@given(tau0=st.floats(0.001, 50), beta=st.floats(0, 2), gamma=st.floats(0, 0.2), swap=st.floats(0, 0.5),
       counts=st.lists(st.integers(0, 5000), min_size=6, max_size=6),
       extra=st.sampled_from([{}, {"gemm_tier_tokens": [16, 64], "gemm_tier_ms": 0.7},
                              {"moe": {"num_experts": 8, "experts_per_token": 2, "local_experts": 8, "expert_read_ms": 0.1}}]))
def test_the_engine_s_per_plan_function_is_plan_ns(tau0, beta, gamma, swap, counts, extra):
    """What the engine calls per plan (plan_ns_function: for the plain sum, the coefficients bound in a
    closure) gives plan_ns's nanoseconds, to the bit."""
    from simbatch.model.cost import LinearCost
    from simbatch.model.step import StepPlan

    cost = LinearCost.of(Device(tau0_ms=tau0, beta_ms=beta, prefill_ms_per_token=gamma, **extra), swap)
    plan = StepPlan()
    (plan.decode_seqs, plan.padded_decode_seqs, plan.prefill_tokens, plan.padded_prefill_tokens, plan.draft_tokens,
     plan.swap_blocks) = counts
    assert cost.plan_ns_function()(plan) == cost.plan_ns(plan)


def test_a_gemm_tile_window_must_be_ordered():
    with pytest.raises(ValueError, match="gemm_tier_tokens"):
        Device(gemm_tier_tokens=[64, 16], gemm_tier_ms=1.0)

"""The context-aware step time: delta (KV read) and epsilon (prefill attention), by hand and in runs.

A step reads the cached context of every scheduled request (K, at delta) and a prefill chunk of c
tokens after k cached attends to c (k + c/2) pairs (A, at epsilon). Runs of repeated decode steps
then grow by delta per slot per step, and must sum, in whole nanoseconds, to what stepping sums.
"""

from __future__ import annotations

import numpy as np
import pytest
from builders import Driver, at_once, make_scenario, req
from hypothesis import given
from hypothesis import strategies as st
from test_cli import invoke, table_value

from simbatch.analysis.capacity import expected_stability, mean_context_tokens, stability
from simbatch.config import Device, Scenario
from simbatch.engine import Engine
from simbatch.model.clock import step_ns
from simbatch.model.cost import LinearCost, StepRun, SwitchingRun, floor_sum, step_time_s
from simbatch.model.step import StepPlan
from simbatch.simulation import simulate
from simbatch.workload import generate

# delta = 2 ms per 1k tokens (2 us a token), epsilon = 10 ms per 1M pairs (10 ns a pair).
CONTEXT = {"device__kv_read_ms_per_1k_tokens": 2.0, "device__prefill_attention_ms_per_1m_pairs": 10.0}


@given(st.integers(0, 60), st.integers(1, 10**7), st.integers(0, 10**9), st.integers(0, 10**9))
def test_floor_sum_is_the_sum_of_floors(n, m, a, b):
    assert floor_sum(n, m, a, b) == sum((a * i + b) // m for i in range(n))


@given(st.integers(1, 5 * 10**7), st.integers(0, 4 * 10**6), st.integers(0, 10**7), st.integers(0, 40),
       st.integers(1, 40), st.integers(-5, 2 * 10**9))
def test_a_run_sums_and_inverts_its_steps_exactly(base_ns, num, inc, i0, m, dt_ns):
    run = StepRun(base_ns, num, inc)
    steps = [base_ns + (num + i * inc) // 2_000_000 for i in range(i0 + 200)]
    assert run.ns(i0, m) == sum(steps[i0:i0 + m])
    assert run.first_ns == steps[0]
    # reach: the fewest steps from i0 whose total is at least dt (the step in progress at dt).
    want = next((j for j in range(1, 200) if sum(steps[i0:i0 + j]) >= dt_ns), None)
    if want is not None:
        assert run.reach(i0, dt_ns) == want


@given(st.integers(1, 5 * 10**7), st.integers(1, 60), st.integers(1, 5 * 10**7), st.integers(0, 4 * 10**6),
       st.integers(1, 10**7), st.integers(0, 80), st.integers(1, 40), st.integers(-5, 2 * 10**9))
def test_a_switching_run_sums_and_inverts_its_steps_exactly(flat_ns, switch, base_ns, num, inc, i0, m, dt_ns):
    """The decode roofline's run: ``switch`` repeats of ``flat_ns``, then a growing progression."""
    run = SwitchingRun(flat_ns, switch, base_ns, num, inc)
    steps = [flat_ns if i < switch else base_ns + (num + i * inc) // 2_000_000 for i in range(i0 + 200)]
    assert run.ns(i0, m) == sum(steps[i0:i0 + m])
    want = next((j for j in range(1, 200) if sum(steps[i0:i0 + j]) >= dt_ns), None)
    if want is not None:
        assert run.reach(i0, dt_ns) == want


def test_the_decode_roofline_by_hand():
    """tau0 + max(weights + delta K, beta B) + gamma P + epsilon A: 8 decodes at 1 ms each outlast
    5 ms of weights and 2 us per cached token until the context passes 1,500 tokens; a run of them
    switches branch once, where the memory side overtakes, and sums what stepping sums."""
    device = Device(tau0_ms=1.0, beta_ms=1.0, prefill_ms_per_token=0.1, weights_ms=5.0,
                    kv_read_ms_per_1k_tokens=2.0, prefill_attention_ms_per_1m_pairs=10.0)
    cost = LinearCost.of(device)
    decode = StepPlan(decode_seqs=8, kv_tokens=1_000)
    assert cost.plan_ns(decode) == step_ns(1.0) + 8_000_000  # max(5 + 2, 8) ms
    assert cost.step_ms(8, 0, 0, 1_000) == pytest.approx(9.0)
    mixed = StepPlan(decode_seqs=8, prefill_tokens=100, kv_tokens=2_000, attention_pairs_x2=20_000)
    # max(5 + 4, 8) = 9 ms of memory, then 10 ms of prompt and 0.1 ms of attention.
    assert cost.plan_ns(mixed) == step_ns(1.0 + 10.0) + 9_100_000
    assert cost.step_ms(8, 100, 0, 2_000, 10_000) == pytest.approx(20.1)
    run = cost.run(decode)
    assert isinstance(run, SwitchingRun)
    stepped = [cost.plan_ns(StepPlan(decode_seqs=8, kv_tokens=1_000 + 8 * i)) for i in range(400)]
    assert stepped[0] == stepped[62] < stepped[63]  # 1,000 + 8 i reaches 1,500 at i = 62.5
    assert [run.ns(0, m) for m in (1, 62, 63, 64, 400)] == [sum(stepped[:m]) for m in (1, 62, 63, 64, 400)]
    assert run.ns(50, 100) == sum(stepped[50:150])
    # Without weights_ms every cost adds, as ever.
    added = LinearCost.of(Device(tau0_ms=6.0, beta_ms=1.0, kv_read_ms_per_1k_tokens=2.0))
    assert added.plan_ns(decode) == step_ns(6.0 + 8.0) + 2_000_000


def test_a_run_of_a_trillion_steps_costs_a_few_operations():
    """Each step 3 ns longer than the last: the sum is an arithmetic series, and neither the total
    nor the step in progress at an instant loops over the steps."""
    run = StepRun(5_000_000, 1_000_000, 3 * 2_000_000)
    n = 10**12
    total = n * 5_000_000 + 3 * n * (n - 1) // 2
    assert run.ns(0, n) == total
    assert run.reach(0, total) == n and run.reach(0, total + 1) == n + 1 and run.reach(0, total - 1) == n


def test_a_decode_and_a_prefill_chunk_by_hand():
    """A decodes after its 100-token prompt while B's 300-token prompt is chunked, 128 tokens a step."""
    for fast_forward in (False, True):
        d = Driver(make_scenario(batching__max_num_batched_tokens=128, batching__max_num_seqs=4,
                                 kv_cache__num_blocks=512, sim__fast_forward=fast_forward, **CONTEXT))
        d.add(req(0, 100, 10), req(1, 300, 10))
        first, _ = d.run()
        # A's whole prompt and B's first 28 tokens, nothing cached: K = 0, 2A = 100^2 + 28^2.
        assert (first.prefill_tokens, first.kv_tokens, first.attention_pairs_x2) == (128, 0, 10_784)
        second, _ = d.run()
        # A decodes over its 100 cached tokens; B computes 127 more after 28: K = 128, 2A = 127 (2 x 28 + 127).
        assert (second.decode_seqs, second.prefill_tokens) == (1, 127)
        assert (second.kv_tokens, second.attention_pairs_x2) == (128, 23_241)
        cost = LinearCost.of(d.sched.scenario.device)
        # tau = 10 + 1 + 0.1 x 127 (= 23.7 ms) + 0.002 x 128 + 1e-5 x 11,620.5 (= 0.372205 ms).
        assert cost.plan_ns(second) == step_ns(23.7) + 372_205 == 24_072_205
        assert cost.step_ms(1, 127, 0, 128, 11_620.5) == pytest.approx(24.072205, abs=1e-12)


def test_without_delta_and_epsilon_the_step_is_the_chapters():
    plan = StepPlan(decode_seqs=7, prefill_tokens=300, swap_blocks=2, kv_tokens=5_000, attention_pairs_x2=90_000)
    device = Device(tau0_ms=8.0, beta_ms=0.3, prefill_ms_per_token=0.09)
    cost = LinearCost.of(device, 0.05)
    assert cost.plan_ns(plan) == step_ns(8.0 + 0.3 * 7 + 0.09 * 300 + 0.05 * 2)
    assert cost.run(plan).ns(3, 1000) == 1000 * cost.plan_ns(plan)
    assert step_time_s(device, 7, 300, 5_000, 45_000) == step_time_s(device, 7, 300)


@pytest.mark.parametrize("pad", [True, False])
def test_request_level_charges_every_row_of_the_batch(pad):
    """Static batching computes the batch as a dense tensor: padded prompts attend over the longest,
    and a done slot, still computed, still reads its row's growing context."""
    d = Driver(make_scenario(batching__mode="static", batching__max_num_seqs=3, batching__pad_prompts=pad,
                             **CONTEXT))
    d.add(req(0, 4, 2), req(1, 8, 4), req(2, 2, 1))
    prefill, _ = d.run()
    rows = [8, 8, 8] if pad else [4, 8, 2]
    assert (prefill.kv_tokens, prefill.attention_pairs_x2) == (0, sum(c * c for c in rows))
    contexts = []
    while d.sched.batch:
        plan, _ = d.run()
        contexts.append((plan.decode_seqs, plan.padded_decode_seqs, plan.kv_tokens, plan.attention_pairs_x2))
    # Decode step t reads p + t - 1 per row, done rows (c after the prefill, then a) included.
    assert contexts == [(2, 1, sum(rows), 0), (1, 2, sum(rows) + 3, 0), (1, 2, sum(rows) + 6, 0)]


def long_decode(fast_forward: bool, **device) -> Scenario:
    return at_once(8, 16, 2000, sim__fast_forward=fast_forward, kv_cache__num_blocks=4096,
                   batching__max_num_seqs=8, batching__max_num_batched_tokens=256,
                   **{f"device__{k}": v for k, v in device.items()})


def test_a_long_decode_run_ends_where_stepping_ends_in_one_go():
    """One prefill step and 1,999 decode steps whose context grows by 8 tokens a step: the
    accelerated engine takes them as one run and ends at the nanosecond the hand-summed steps do."""
    context = {"kv_read_ms_per_1k_tokens": 0.0415, "prefill_attention_ms_per_1m_pairs": 0.72}
    fast = simulate(long_decode(True, **context))
    reference = simulate(long_decode(False, **context))
    # By hand: 10 + 0.1 x 128 ms of prefill (2A = 8 x 16^2 pairs), then decode step t (from 1)
    # reads 8 (16 + t - 1) tokens at 41.5 ns each, rounded to the ns, on top of 10 + 8 x 1 ms.
    end_ns = step_ns(10 + 0.1 * 128) + (720_000 * 8 * 256 + 1_000_000) // 2_000_000
    end_ns += sum(step_ns(18.0) + (2 * 41_500_000 * 8 * (16 + t - 1) + 1_000_000) // 2_000_000
                  for t in range(1, 2000))
    for result in (fast, reference):
        assert result.requests["finish_s"].tolist() == [end_ns / 1e9] * 8
        assert result.summary["num_steps"] == 2000
    # Each decode step lasts longer than the last: stepping records one row per step; fast-forward
    # records the same rows (one shape, one row, their mean duration) from a single run.
    assert len(fast.iterations) == len(reference.iterations) == 2
    decode = fast.iterations.iloc[1]
    assert decode["num_steps"] == 1999
    assert decode["duration_s"] * 1999 == pytest.approx(end_ns / 1e9 - decode["start_s"], rel=1e-12)

    engine = Engine(long_decode(True, **context), generate(long_decode(True, **context)))
    made = []
    timeout = engine.env.timeout
    engine.env.timeout = lambda delay=0, value=None: made.append(delay) or timeout(delay, value)
    engine.run()
    assert len(made) <= 2  # the prefill and the run of 1,999 steps (or running ahead: fewer)


def test_mean_context_is_the_length_weighted_mean_of_every_decode_step():
    rng = np.random.default_rng(11)
    prompt, output = rng.integers(1, 300, 200), rng.integers(1, 400, 200)
    reads = np.concatenate([np.arange(p, p + o) for p, o in zip(prompt, output, strict=True)])
    assert mean_context_tokens(prompt, output) == pytest.approx(reads.mean(), rel=1e-12)


def test_the_closed_form_charges_context_and_prefill_attention_by_hand():
    device = Device(tau0_ms=20.0, beta_ms=0.2, prefill_ms_per_token=0.05, kv_read_ms_per_1k_tokens=0.04,
                    prefill_attention_ms_per_1m_pairs=0.7)
    s = stability(device, 32, 2.0, 500.0, 1000.0, mean_context_tokens=1250.0, mean_prompt_sq_tokens=1.2e6)
    # Per request: 500 (20/32 + 0.2 + 0.04 x 1.25) ms of decode + 0.05 x 1000 + 0.7 x 0.6 ms of prefill.
    per_request_ms = 500 * (20 / 32 + 0.2 + 0.05) + 50 + 0.42
    assert s.capacity_requests_per_s == pytest.approx(1e3 / per_request_ms)
    assert s.offered_load == pytest.approx(2 * per_request_ms / 1e3)
    assert s.full_batch_latency_s == pytest.approx((500 * (20 + 32 * 0.25) + 50.42) / 1e3)
    assert s.capacity_tokens_per_s == pytest.approx(32 / (20 + 32 * 0.25) * 1e3)
    # The batch's share of tau0 is 64 % of a request's device time: the slots bind.
    assert s.limited_by == "slots" and s.shared_fraction == pytest.approx(500 * 20 / 32 / per_request_ms)
    # Long contexts make the per-sequence work dominate: more slots would barely help.
    long = stability(device, 32, 2.0, 500.0, 1000.0, mean_context_tokens=20_000.0)
    assert long.limited_by == "compute" and "compute binds" in long.verdict


def served(num_blocks: int, rate: float, delta: float = 0.04) -> Scenario:
    return Scenario.model_validate({
        "seed": 3,
        "workload": {"num_requests": 6000, "arrival": {"rate": rate},
                     "prompt_tokens": {"dist": "uniform", "low": 500, "high": 1500},
                     "output_tokens": {"dist": "uniform", "low": 100, "high": 500}},
        "device": {"tau0_ms": 20.0, "beta_ms": 0.05, "prefill_ms_per_token": 0.01,
                   "kv_read_ms_per_1k_tokens": delta, "prefill_attention_ms_per_1m_pairs": 0.7},
        "kv_cache": {"block_size": 16, "num_blocks": num_blocks},
        "batching": {"max_num_seqs": 32, "max_num_batched_tokens": 2048},
        "sim": {"max_time_s": 400.0}})


@pytest.mark.parametrize(("num_blocks", "limit", "tolerance"), [(100_000, "slots", 0.02), (1_500, "memory", 0.06)])
def test_the_closed_form_capacity_is_what_an_overloaded_server_serves(num_blocks, limit, tolerance):
    """Offered twice its capacity, a server completes requests at its capacity: the closed form
    (contexts of ~1,200 tokens at 40 ns a token) against 400 simulated seconds. Memory binding
    loses a little more to preemptions (recomputed prompts), hence the wider tolerance."""
    scenario = served(num_blocks, 1.0)
    st = expected_stability(scenario, generate(scenario))
    assert st.limited_by == limit and st.mean_context_tokens == pytest.approx(1175, rel=0.02)
    throughput = simulate(served(num_blocks, 2 * st.capacity_requests_per_s)).summary["request_throughput"]
    assert throughput == pytest.approx(st.capacity_requests_per_s, rel=tolerance)
    # Without its context term the same closed form misses by more than the tolerance.
    blind = expected_stability(served(num_blocks, 1.0, delta=0.0), generate(scenario))
    assert abs(blind.capacity_requests_per_s / throughput - 1) > tolerance


def test_simbatch_capacity_takes_the_context_terms():
    args = ["capacity", "--tau0-ms", "20", "--beta-ms", "0.2", "--prefill-ms-per-token", "0.05",
            "--kv-read-ms-per-1k-tokens", "0.04", "--prefill-attention-ms-per-1m-pairs", "0.7",
            "--max-num-seqs", "32", "--rate", "2", "--mean-output-tokens", "500", "--mean-prompt-tokens", "1000"]
    given = invoke(*args, "--mean-context-tokens", "1250")
    assert given.exit_code == 0, given.output
    # As by hand above, but E[prompt^2] taken as E[prompt]^2: 0.7 x 0.5 ms of prefill attention.
    per_request_s = (500 * (20 / 32 + 0.2 + 0.05) + 50 + 0.35) / 1e3
    assert table_value(given.stdout, "Offered load ρ (demand / capacity):") == pytest.approx(2 * per_request_s, abs=0.005)
    assert table_value(given.stdout, "Mean context per decode step (tokens):") == 1250
    assert "Limit that binds:                        slots (max_num_seqs)" in given.stdout
    # Without --mean-context-tokens: E[prompt] + (E[out] - 1) / 2 = 1,249.5.
    assert "at a context of 1,250 tokens" in invoke(*args).stdout
    bad = invoke("capacity", "--kv-read-ms-per-1k-tokens", "-1")
    assert bad.exit_code == 2 and "--kv-read-ms-per-1k-tokens" in bad.output and "Traceback" not in bad.output

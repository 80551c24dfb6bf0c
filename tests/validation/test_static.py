"""5: Static batching at saturation: useful slots E[L] / E[max of B lengths], and the H_B gap

A static batch of B requests holds all B slots until its longest request is done: it runs
max(L_1..L_B) token-steps per slot (the prefill step, which samples every first token, and
max - 1 decode steps), of which only sum(L_i) produce tokens. Over i.i.d. batches (renewal-reward)
the useful share of slots is

    E[L] / E[max of B lengths]      (and (E[L] - 1) / (E[max] - 1) over decode steps alone).

For continuous exponential lengths E[max] = H_B E[L] with H_B = 1 + 1/2 + ... + 1/B (A. Renyi,
Acta Math. Acad. Sci. Hungar. 4, 1953: the gaps between exponential order statistics are
independent exponentials), so the share is 1/H_B. The simulator's ``exponential`` length is
ceil(Exp(mean)), geometric, so the exact discrete E[max] = sum_k (1 - F(k)^B) is the theory here
(``simbatch.analysis.theory.expected_max_length``); H_B E[L] is reported next to it.

Continuous batching backfills every freed slot at the next step, so at saturation every step is
full: its throughput is E[L] / (tau0 E[L]/B + beta (E[L] - 1)) against static's
B E[L] / (tau0 + (E[max] - 1) tau(B)) (``simbatch.analysis.theory``), a ratio close to E[max]/E[L], about H_B:
the chapter's "throughput multiplier" of backfilling.

Runs: N = B x batches requests at t = 0 (``rate: inf``), fixed 16-token prompts (no prompt padding,
so ``padded_tokens`` counts idle decode slots only), exponential outputs of mean 100, gamma = 0.
Every batch is full and i.i.d., so no warm-up exists; each run is reduced to a ratio of sums over its
batches, whose O(1/batches) bias is orders of magnitude below the interval. Continuous throughput is
measured over the steps that start with requests still waiting (the saturated part of its run).
"""

from __future__ import annotations

import pytest

from simbatch.analysis import theory
from simbatch.config import Device, Exponential

DEVICE = {"tau0_ms": 20.0, "beta_ms": 0.2}
PROMPT, MEAN_OUTPUT = 16, 100.0


def _scenario(mode_name: str, batch_size: int, batches: int, seed: int) -> dict:
    return {
        "seed": seed,
        "workload": {"num_requests": batch_size * batches, "arrival": {"rate": float("inf")},
                     "prompt_tokens": {"dist": "fixed", "value": PROMPT},
                     "output_tokens": {"dist": "exponential", "mean": MEAN_OUTPUT}},
        "device": DEVICE,
        "kv_cache": {"num_blocks": 10_000_000},
        "batching": {"mode": mode_name, "max_num_seqs": batch_size,
                     "max_num_batched_tokens": batch_size * (PROMPT + 1)},
    }


def _tokens_per_s(it) -> float:
    """Tokens sampled per second of device time: every scheduled sequence samples one per step."""
    return float((it["batch_size"] * it["num_steps"]).sum() / (it["duration_s"] * it["num_steps"]).sum())


def _static(result) -> tuple[float, float, float]:
    """(useful share of slots, of decode slots, tokens/s) of a static run."""
    it = result.iterations
    assert (it["padded_tokens"][it["prefill_tokens"] > 0] == 0).all(), "prompt padding with fixed prompts"
    n = it["num_steps"]
    share = (it["batch_size"] * n).sum() / ((it["batch_size"] + it["padded_tokens"]) * n).sum()
    dec = it[it["prefill_tokens"] == 0]
    decode_share = (dec["decode_tokens"] * dec["num_steps"]).sum() / \
        ((dec["decode_tokens"] + dec["padded_tokens"]) * dec["num_steps"]).sum()
    return float(share), float(decode_share), _tokens_per_s(it)


def _continuous(result) -> float:
    """Tokens/s of a continuous run over the steps that start with requests still waiting."""
    saturated = result.iterations[result.iterations["num_waiting"] > 0]
    assert (saturated["batch_size"] == result.scenario.batching.max_num_seqs).all(), \
        "continuous batch not full while requests wait"
    return _tokens_per_s(saturated)


@pytest.mark.validation
@pytest.mark.parametrize("batch_size", [8, 32])
def test_static_useful_share(batch_size, sim, check, mode):
    """Useful share of slots (all steps, then decode steps only), static throughput, and the
    continuous/static throughput ratio, on common random numbers (same requests in both modes)."""
    device, lengths = Device(**DEVICE), Exponential(dist="exponential", mean=MEAN_OUTPUT)
    mean_len = theory.length_moments(lengths)[0]
    mean_max = theory.expected_max_length(lengths, batch_size)
    batches = mode.pick(60, 200)
    seeds = range(mode.pick(8, 30))
    share, decode_share, static_rate = zip(*sim.map(_static, [_scenario("static", batch_size, batches, seed)
                                                              for seed in seeds]), strict=True)
    continuous_rate = sim.map(_continuous, [_scenario("continuous", batch_size, batches, seed) for seed in seeds])
    continuous = mean_len / theory.continuous_request_cost_s(device, batch_size, mean_len, PROMPT)
    static = theory.static_saturated_tokens_per_s(device, batch_size, PROMPT, lengths)
    check.ci("useful share E[L]/E[max]", mean_len / mean_max, share, seeds)
    check.ci("useful share of decode steps (E[L]-1)/(E[max]-1)", (mean_len - 1) / (mean_max - 1),
             decode_share, seeds)
    check.ci("static throughput (tokens/s)", static, static_rate, seeds)
    check.ci(f"continuous/static throughput (H_{batch_size} = {theory.harmonic_number(batch_size):.4f}, "
             f"E[max]/E[L] = {mean_max / mean_len:.4f})", continuous / static,
             [c / s for c, s in zip(continuous_rate, static_rate, strict=True)], seeds)
    # The continuous idealization for comparison: 1/H_B, a little below the discrete share.
    assert abs(mean_max - theory.expected_max_exponential(batch_size, MEAN_OUTPUT)) < 1.0

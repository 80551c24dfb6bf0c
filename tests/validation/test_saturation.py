"""3: Saturated decode throughput B / (tau0 + beta B), the chapter's exercise 2

A decode step over B sequences costs tau(B) = tau0 + beta B and yields B tokens, so a batch held
full yields B / (tau0 + beta B) tokens/s, rising toward the roofline 1/beta
(the chapter's throughput model; S. Williams, A. Waterman, D. Patterson, "Roofline",
CACM 52(4), 2009). At tau0 = 20 ms and beta = 0.2 ms: 49.5, 370.4, 1212.1 and 1951.2 tokens/s at
B = 1, 8, 32, 64, and a roofline of 5000 tokens/s (exercise 2).

The runs send 4B requests at t = 0 (``rate: inf``) with fixed 16-token prompts and 512-token
outputs, so the waiting queue stays full until the last cohort. The lengths are fixed, so the runs
are deterministic and the comparison is exact. Two measurements: every decode-only step in the
iterations frame (``prefill_tokens == 0``) must run at B / tau(B); and over the whole run, where
each cohort of B requests costs one prefill step and 511 decode steps, the output throughput must be
B o / (tau0 + (o - 1) tau(B)), which approaches B / tau(B) as outputs grow.
"""

from __future__ import annotations

import pytest

from simbatch.analysis import theory
from simbatch.config import Device, Fixed
from simbatch.model.cost import decode_throughput, roofline_tokens_per_s

DEVICE = {"tau0_ms": 20.0, "beta_ms": 0.2}
CHAPTER_TOKENS_PER_S = {8: 370.4, 32: 1212.1, 64: 1951.2}  # exercise 2, rounded to 0.1
PROMPT, OUTPUT = 16, 512


@pytest.mark.validation
@pytest.mark.parametrize("batch_size", [1, 8, 32, 64])
def test_saturated_decode_throughput(batch_size, sim, check):
    """Decode-only steps and the whole run against B / tau(B); the chapter's rounded figures."""
    device = Device(**DEVICE)
    result = sim({
        "workload": {"num_requests": 4 * batch_size, "arrival": {"rate": float("inf")},
                     "prompt_tokens": {"dist": "fixed", "value": PROMPT},
                     "output_tokens": {"dist": "fixed", "value": OUTPUT}},
        "device": DEVICE,
        "batching": {"max_num_seqs": batch_size, "max_num_batched_tokens": max(2048, batch_size * PROMPT)},
    })
    it = result.iterations
    decode = it[it["prefill_tokens"] == 0]
    assert (decode["num_waiting"] > 0).any(), "the queue was never full: not a saturation test"
    assert (decode["batch_size"] == batch_size).all() and (decode["decode_tokens"] == batch_size).all()
    per_step = decode["decode_tokens"] / decode["duration_s"]
    expected = decode_throughput(device, batch_size)
    check.exact("decode-only steps, slowest (tokens/s)", expected, float(per_step.min()))
    check.exact("decode-only steps, fastest (tokens/s)", expected, float(per_step.max()))
    check.exact("whole run (tokens/s)",
                theory.static_saturated_tokens_per_s(device, batch_size, PROMPT, Fixed(value=OUTPUT)),
                result.summary["output_throughput"])
    if batch_size in CHAPTER_TOKENS_PER_S:
        assert round(expected, 1) == CHAPTER_TOKENS_PER_S[batch_size]
    assert roofline_tokens_per_s(device) == 5000.0 and expected < 5000.0

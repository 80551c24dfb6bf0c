"""9: Prefix caching: the token hit rate of a shared system prompt, and a conversation's reuse of its turns

A share q of the requests start with the same S-token system prompt, prepended to prompts of N new
tokens. With blocks of b tokens and a cache that never evicts, a request with the prompt finds
floor(S / b) blocks of it computed by an earlier one, every such request but the first; a request
without it finds nothing (its own content is its own). The token hit rate of the run, hits over
prompt tokens, then tends to

    h = q floor(S / b) b / (E[N] + q S)

(a ratio of means over the requests, less the first request's miss, 1 / (q n) of the hits: within
the interval here). Paired, per replication: its own requests with the prompt, all but the first
finding floor(S / b) b tokens, over its own prompt tokens; a request that comes while the first is
still computing the prompt would miss it too, which the paired check would show.
A conversation's turn k quotes every earlier turn; turn k - 1 computed all its tokens but the last
sampled one (never fed back), so turn k finds floor((P + O - 1) / b) b tokens of it when the turns
do not overlap: checked request by request, exactly.
A trace with Mooncake's hash_ids (one id per 512-token block, naming the block and all before it)
says by itself what a cache that never evicts finds: a request's block j of b tokens is named by the
id of the 512-token block holding its last token, and is found when an earlier request's prompt
held it whole, up to its first unseen block and short of the block of its last prompt token
(simbatch.workload.prefix.expected_hash_hits). The real trace's first 200 requests, one every 30 s
so that none overlaps another: the run's hit rate is the ids', exactly, request by request.
"""

from __future__ import annotations

from pathlib import Path

import pytest

S_TOKENS, BLOCK, SHARE = 300, 16, 0.4
NEW = {"dist": "uniform", "low": 20, "high": 200}


def _spec(seed: int, n: int) -> dict:
    return {"seed": seed,
            "workload": {"num_requests": n, "arrival": {"rate": 2.0}, "prompt_tokens": NEW,
                         "output_tokens": {"dist": "fixed", "value": 16},
                         "prefix": {"shared_tokens": S_TOKENS, "share": SHARE}},
            "kv_cache": {"block_size": BLOCK, "num_blocks": 100_000, "enable_prefix_caching": True}}


def _hit_rate(result) -> tuple[float, float, float]:
    """(simulated token hit rate, the prediction for this replication's own requests, their share with
    the prompt): every request with it but the first finds floor(S / b) b tokens."""
    rq = result.requests
    shared = (rq["prompt_tokens"] > NEW["high"]).to_numpy()
    predicted = (shared.sum() - 1) * (S_TOKENS // BLOCK) * BLOCK / rq["prompt_tokens"].sum()
    return result.summary["prefix_cache_hit_rate"], predicted, shared.mean()


@pytest.mark.validation
def test_shared_system_prompt_hit_rate(sim, check, mode):
    """S = 300 tokens on a share 0.4 of the requests, N uniform on 20..200 tokens, 16-token blocks:
    h = 0.4 x 288 / (110 + 0.4 x 300) = 0.5009; per replication, and against the replications' mean."""
    seeds = range(mode.pick(6, 30))
    n = mode.pick(600, 3000)
    measured, predicted, shares = zip(*sim.map(_hit_rate, [_spec(s, n) for s in seeds]), strict=True)
    check.paired("token hit rate, paired with (k - 1) floor(S/b) b / prompt tokens, k requests with the prompt",
                 predicted, measured, seeds)
    closed_form = SHARE * (S_TOKENS // BLOCK) * BLOCK / ((NEW["low"] + NEW["high"]) / 2 + SHARE * S_TOKENS)
    check.ci("token hit rate, against q floor(S/b) b / (E[N] + q S)", closed_form, measured, seeds)
    check.ci("share of requests with the system prompt", SHARE, shares, seeds)


def _turn_mismatches(result) -> int:
    """Requests whose cached tokens differ from floor((P + O - 1) / b) b of their conversation's previous turn."""
    rq = result.requests.sort_values("request_id")
    from simbatch.workload import generate

    wl = generate(result.scenario)
    last: dict[int, int] = {}
    wrong = 0
    for i, cached in zip(rq["request_id"].tolist(), rq["num_cached_tokens"].tolist(), strict=True):
        stream = int(wl.prefix_stream[i])
        prev = last.get(stream)
        wrong += cached != (0 if prev is None else (prev - 1) // BLOCK * BLOCK)
        last[stream] = int(wl.prompt_tokens[i] + wl.output_tokens[i])
    return wrong


@pytest.mark.validation
def test_each_turn_finds_the_previous_ones(sim, check, mode):
    """Eight sessions drawn at random for arrivals 1.25 s apart; a turn takes at most 0.13 s (1 ms
    steps, up to 120 output tokens), so it has finished when the next one comes; 16-token blocks."""
    seeds = range(mode.pick(3, 10))
    specs = [{"seed": s,
              "workload": {"num_requests": mode.pick(200, 1000), "arrival": {"process": "constant", "rate": 0.8},
                           "num_sessions": 8,
                           "prompt_tokens": NEW, "output_tokens": {"dist": "uniform", "low": 1, "high": 120},
                           "prefix": {"multi_turn": True, "max_context_tokens": 8192}},
              "device": {"tau0_ms": 1.0, "beta_ms": 0.0},
              "kv_cache": {"block_size": BLOCK, "num_blocks": 100_000, "enable_prefix_caching": True}}
             for s in seeds]
    mismatches = sim.map(_turn_mismatches, specs)
    check.exact("turns whose cached tokens differ from floor((P + O - 1) / b) b of the previous turn",
                0, sum(mismatches), seeds=seeds)


MOONCAKE = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "mooncake_conversation_head200.jsonl"


def _hash_hits(result) -> tuple[float, float, int]:
    """(simulated token hit rate, the ids' hit rate, requests whose cached tokens differ from the ids')."""
    from simbatch.workload import generate
    from simbatch.workload.prefix import expected_hash_hits

    wl = generate(result.scenario)
    expected = expected_hash_hits(wl.prompt_tokens, wl.hashes, BLOCK)
    cached = result.requests.sort_values("request_id")["num_cached_tokens"].to_numpy()
    return (result.summary["prefix_cache_hit_rate"], expected.sum() / wl.prompt_tokens.sum(),
            int((cached != expected).sum()))


@pytest.mark.validation
def test_a_mooncake_trace_finds_what_its_hash_ids_share(sim, check, tmp_path):
    """kvcache-ai/Mooncake's conversation trace (FAST'25), its first 200 lines as published but for the
    timestamps, respaced 30 s apart; 16-token blocks, a cache that never evicts, 1 ms steps."""
    import json

    lines = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    trace = tmp_path / "mooncake_spaced.jsonl"
    trace.write_text("".join(json.dumps({**row, "timestamp": 30_000 * i}) + "\n" for i, row in enumerate(lines)))
    spec = {"workload": {"trace": {"path": str(trace), "format": "mooncake"}},
            "device": {"tau0_ms": 1.0, "beta_ms": 0.0},
            "batching": {"max_num_batched_tokens": 16_384, "max_num_seqs": 8},
            "kv_cache": {"block_size": BLOCK, "num_blocks": 400_000, "enable_prefix_caching": True}}
    ((measured, expected, wrong),) = sim.map(_hash_hits, [spec])
    check.exact("token hit rate of 200 Mooncake requests: the run against the hash_ids alone", expected, measured)
    check.exact("requests whose cached tokens differ from their hash_ids'", 0, wrong)

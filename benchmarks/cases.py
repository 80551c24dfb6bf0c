"""The benchmark workloads, as scenarios.

A 7B-class device on one GPU: streaming ~14 GB of fp16 weights takes tau0 ~ 8 ms; each decoding
sequence reads its KV cache (~0.5 MB per token of context, ~1,300 tokens) for beta ~ 0.3 ms; a
prompt token costs ~14 GFLOP, ~0.09 ms at half of an A100's peak. 8,192 blocks of 16 tokens
(~131 k tokens of KV), up to 256 running sequences and a 2,048-token budget with chunked prefill.

Traffic looks like the public conversation traces: lognormal prompts (mean 1,155 tokens) and
heavy-tailed lognormal outputs (mean 211, capped at 1,000), Poisson arrivals.

B5 runs that traffic on a device whose step time grows with the context it reads: Llama-3-8B-like on
one H100, numbers written out here (device presets are another issue's). The weights (~16 GB) stream
in ~6 ms; the KV read, delta, is 0.042 ms per 1,000 tokens, and prefill attention, epsilon, 0.72 ms
per million token pairs: least-squares fits to one layer's decode- and prefill-attention kernel times
for its head layout (32 query, 8 KV heads of 128) on an H100, times 32 layers
(``../shared/data/hardware/blis_h100_attention_*_kernels.csv``); ~0.03 ms a prompt token for the
matmuls (16 GFLOP at ~60 % of 989 TFLOP/s).

B9 is a day of B1's traffic on an autoscaled fleet: the request rate follows a sinusoidal daily curve
(a million requests in the day) and replicas of B1's device start and stop by Kubernetes' HPA rule;
its target is twice B2's, a million requests on one replica (a fleet cannot run ahead of SimPy as a
lone replica does, and the autoscaler reads the fleet every 15 s).

B7 and B8 are shaped like peer simulators' own workloads (files in ``benchmarks/data``, whose README
says how each was made). B7 is the continuous-batching chapter's toy scheduler
(``scenarios/chapter_toy.yaml``) on 5,000 of its requests: one iteration is a second whatever the
batch, prefill is free, 400 blocks of 16, a 512-token budget, 64 slots. B8 is a 7B model on an A100 as
a linear step-time model with a 25.5 ms step, 0.96 ms per decoding sequence and 0.1405 ms per prompt
token, under 2 req/s of Poisson arrivals whose (prompt, output) pairs are resampled from the Azure 2023
conversation trace, no chunked prefill, 4,134 blocks of 16 (66 k tokens of KV).
"""

from __future__ import annotations

from pathlib import Path

from simbatch.config import Scenario

DATA = Path(__file__).resolve().parent / "data"  # absolute: a case's scenario is also run from other folders
STABLE_RATE = 4.0  # req/s: offered load ~0.7 by the stability check (see `describe`)


A100_7B = {"tau0_ms": 8.0, "beta_ms": 0.3, "prefill_ms_per_token": 0.09}
H100_LLAMA3_8B = {"tau0_ms": 6.0, "beta_ms": 0.02, "prefill_ms_per_token": 0.03,
                  "kv_read_ms_per_1k_tokens": 0.042, "prefill_attention_ms_per_1m_pairs": 0.72}


def conversation(num_requests: int, rate: float = STABLE_RATE, output_scale: float = 1.0,
                 mode: str = "continuous", fast_forward: bool = True, device: dict = A100_7B,
                 prefix_caching: bool = False) -> Scenario:
    """B1's traffic (on ``device``); ``prefix_caching``: a chat service on B1's device, rate and answers, with prefix
    caching: 256 conversations, each turn the conversation so far (a shared 1,024-token system prompt,
    earlier turns) and ~150 new tokens, up to 8,192 tokens; 1M tokens of KV cache (an 8B model on
    an 80 GB GPU), so that conversations stay cached between turns."""
    chat = {"num_sessions": 256, "prompt_tokens": {"dist": "lognormal", "mean": 150, "sigma": 0.9, "max": 2000},
            "prefix": {"shared_tokens": 1024, "multi_turn": True, "max_context_tokens": 8192}} \
        if prefix_caching else {}
    return Scenario.model_validate({
        "name": "bench-conversation",
        "seed": 1,
        "workload": {
            "num_requests": num_requests,
            "arrival": {"process": "poisson", "rate": rate},
            "prompt_tokens": {"dist": "lognormal", "mean": 1155, "sigma": 0.9, "max": 8192},
            "output_tokens": {"dist": "lognormal", "mean": 211 * output_scale, "sigma": 1.0,
                              "max": int(1000 * output_scale)},
            **chat,
        },
        "device": device,
        "kv_cache": {"block_size": 16, "num_blocks": 65536 if prefix_caching else 8192,
                     "enable_prefix_caching": prefix_caching},
        "batching": {"mode": mode, "max_num_seqs": 256, "max_num_batched_tokens": 2048,
                     "enable_chunked_prefill": True},
        "sim": {"fast_forward": fast_forward},
    })


def chapter_toy() -> Scenario:
    """B7: the chapter's toy generator scaled to 5,000 requests, replayed on the toy's settings."""
    return Scenario.model_validate({
        "name": "bench-chapter-toy",
        "workload": {"trace": {"path": str(DATA / "chapter_toy_5000.csv"), "timestamp_column": "arrival_s",
                               "prompt_column": "prompt_tokens", "output_column": "output_tokens"}},
        "device": {"tau0_ms": 1000, "beta_ms": 0, "prefill_ms_per_token": 0},
        "kv_cache": {"block_size": 16, "num_blocks": 400},
        "batching": {"mode": "continuous", "max_num_seqs": 64, "max_num_batched_tokens": 512,
                     "enable_chunked_prefill": True},
        "scheduler": {"policy": "fcfs", "preemption": "recompute"},
    })


def azure_conversations() -> Scenario:
    """B8: Poisson arrivals, (prompt, output) pairs resampled from the Azure 2023 conversation trace."""
    lengths = str(DATA / "azure_conv_2023_lengths.csv")
    return Scenario.model_validate({
        "name": "bench-azure-conv",
        "seed": 1,
        "workload": {
            "num_requests": 5000,
            "arrival": {"process": "poisson", "rate": 2.0},
            # One file for both: each request is one observed pair (simbatch.workload.lengths.paired).
            "prompt_tokens": {"dist": "empirical", "path": lengths, "column": "ContextTokens", "max": 2048},
            "output_tokens": {"dist": "empirical", "path": lengths, "column": "GeneratedTokens", "max": 1024},
        },
        "device": {"tau0_ms": 25.5, "beta_ms": 0.96, "prefill_ms_per_token": 0.1405},
        "kv_cache": {"block_size": 16, "num_blocks": 4134},
        "batching": {"mode": "continuous", "max_num_seqs": 256, "max_num_batched_tokens": 8192,
                     "enable_chunked_prefill": False},
    })


def autoscaled_day(num_requests: int = 1_000_000, fast_forward: bool = True) -> Scenario:
    """B9: B1's requests over a day on an autoscaled fleet of B1's device: a sinusoidal daily curve whose
    mean puts ``num_requests`` in the day (11.6 req/s for a million), from 0.4 to 1.6 times it, peaking
    at 14:00; HPA's rule on 8 requests per replica (B1 holds 21 at its rho ~0.7, where its steps slow down with the batch), 1 to 16 replicas, 120 s to start,
    300 s of scale-down stabilization, evaluated every 15 s (Kubernetes' defaults)."""
    day = conversation(num_requests, fast_forward=fast_forward).model_dump(mode="json", exclude_unset=True)
    day["name"] = "bench-autoscaled-day"
    day["workload"]["arrival"] = {"rate_curve": {"kind": "sinusoidal", "mean": num_requests / 86_400,
                                                 "amplitude": 0.6, "period_s": 86_400, "peak_s": 14 * 3600}}
    day["cluster"] = {"replicas": 2, "router": "least_outstanding", "autoscale": {
        "metric": "queue_per_replica", "target": 8, "min_replicas": 1, "max_replicas": 16,
        "startup_delay_s": 120, "cooldown_s": 300, "interval_s": 15}}
    return Scenario.model_validate(day)


# name -> (description, scenario factory, target seconds or None)
CASES = {
    "B1": ("10k requests, stable load (rho ~0.7), continuous + chunked prefill",
           lambda: conversation(10_000), 1.0),
    "B1-reference": ("B1 stepping one iteration at a time (sim.fast_forward: false)",
                     lambda: conversation(10_000, fast_forward=False), None),
    "B1-static": ("B1's workload under static batching", lambda: conversation(10_000, mode="static"), None),
    "B1-dynamic": ("B1's workload under dynamic batching", lambda: conversation(10_000, mode="dynamic"), None),
    "B2": ("1M requests, stable load", lambda: conversation(1_000_000), 60.0),
    "B3": ("10k requests, oversubscribed 5x (queue of thousands)",
           lambda: conversation(10_000, rate=STABLE_RATE * 5 / 0.70), None),
    "B4": ("B1 with every output length doubled (rate halved: the same decode load)",
           lambda: conversation(10_000, rate=STABLE_RATE / 2, output_scale=2.0), None),
    "B5": ("B1's workload on an H100, Llama-3-8B-like device whose steps read their KV context (delta, epsilon > 0)",
           lambda: conversation(10_000, device=H100_LLAMA3_8B), None),
    "B6": ("B1's device, rate and answers as a chat service: multi-turn conversations, with prefix caching",
           lambda: conversation(10_000, prefix_caching=True), None),
    "B7": ("the chapter's toy scheduler on 5,000 of its requests: 1 s iterations, 400 blocks, budget 512",
           chapter_toy, None),
    "B8": ("5,000 Poisson arrivals at 2 req/s, Azure 2023 conversation (prompt, output) pairs, no chunking",
           azure_conversations, None),
    "B9": ("a day of B1's traffic, 1M requests on a sinusoidal curve, on a fleet autoscaled from 1 to 16 replicas",
           autoscaled_day, 120.0),
}

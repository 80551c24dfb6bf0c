"""13: A host KV tier: the two tiers are one LRU stack, device hits within its capacity, host hits within both

The device's cached free blocks are evicted least recently freed first, and what they held goes to the
host tier, which drops its least recently stored (simbatch.memory.host_tier). Together they are one LRU
stack of num_blocks + host_blocks blocks: a block re-referenced at stack distance d (the distinct blocks
referenced since its last reference, itself included) is found on the device when d <= N (the device's
blocks), in the host tier when N < d <= N + H, and computed again otherwise.

The stream (a trace with hash_ids, one id per 16-token block) sets the distances. Each request's prompt
is K + 1 whole blocks and it outputs one token, so every block it holds is full and published: the
device's free queue holds content only, N blocks of it between requests (one request at a time, each
done long before the next). The last block is never looked up (vLLM's rule: the block of the last
prompt token is computed) and its id is the request's own; the K before it are an item's. Requests come
in rounds: a round of W new items A_1 .. A_W, then the same items again in the same order; W is drawn
independently per round from a known law. A's second reference finds W - 1 distinct items (K + 1 blocks
each, their last one included) referenced since, and a request frees its blocks last first (its first
block is the most recent), so its block i (from 0) lies at distance

    d(W, i) = (W - 1)(K + 1) + i + 1;

a first reference finds nothing. The shares of prompt tokens found on the device, in the host tier and
computed, over a replication's rounds, tend to the ratios of their expectations under the law of W:

    device = E[W #{i < K: d(W, i) <= N}] / E[2 W (K + 1)],  host = E[W #{i < K: N < d(W, i) <= N + H}] / ...

(a ratio of means: its bias, O(1 / rounds), is under a tenth of the interval here). Each request is also
held to its own d(W, i), exactly: where every one of its looked-up blocks was found.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

BLOCK, K, N_DEVICE, H_HOST = 16, 4, 152, 200
W_MAX = 90  # W uniform on 1 .. W_MAX: rounds at every distance, device, host and beyond
# N = 152 and N + H = 352 are not multiples of K + 1 = 5: the rounds at W = 31 and W = 71 straddle a
# tier's edge within a request (blocks 0-1 in one tier, 2-3 in the next).


def distance(w: np.ndarray | int, i: np.ndarray | int):
    """The stack distance of block i of an item's second reference in a round of w items."""
    return (np.asarray(w) - 1) * (K + 1) + np.asarray(i) + 1


def tier_blocks(w: int) -> tuple[int, int, int]:
    """(device, host, computed) of the K looked-up blocks of a second reference in a round of w items."""
    d = distance(w, np.arange(K))
    device = int((d <= N_DEVICE).sum())
    host = int(((d > N_DEVICE) & (d <= N_DEVICE + H_HOST)).sum())
    return device, host, K - device - host


def predicted_shares() -> tuple[float, float, float]:
    """Shares of prompt tokens on the device, on the host and computed: expectations over W uniform on
    1 .. W_MAX, of a round's 2 W requests of (K + 1) blocks each."""
    w = np.arange(1, W_MAX + 1)
    tiers = np.array([tier_blocks(int(x)) for x in w], dtype=float)  # per second reference
    prompt_blocks = (2 * w * (K + 1)).mean()
    device, host, _ = (w[:, None] * tiers).mean(axis=0) / prompt_blocks
    return device, host, 1 - device - host


def rounds_trace(seed: int, num_requests: int) -> tuple[list[dict], np.ndarray]:
    """Whole rounds up to ``num_requests`` requests: the trace's rows, and each request's round size W (0
    for a first reference)."""
    rng = np.random.default_rng(seed)
    rows, expected_w, next_id = [], [], 0

    def row(item_ids: list[int]) -> None:
        nonlocal next_id
        rows.append({"timestamp": 1000 * len(rows), "input_length": (K + 1) * BLOCK, "output_length": 1,
                     "hash_ids": [*item_ids, next_id]})  # the last block is the request's own
        next_id += 1

    while True:
        w = int(rng.integers(1, W_MAX + 1))
        if len(rows) + 2 * w > num_requests:
            break
        items = []
        for _ in range(w):
            items.append(list(range(next_id, next_id + K)))
            next_id += K
            row(items[-1])
            expected_w.append(0)
        for ids in items:
            row(ids)
            expected_w.append(w)
    return rows, np.asarray(expected_w)


def _spec(path) -> dict:
    return {"workload": {"trace": {"path": str(path), "format": "mooncake", "hash_block_tokens": BLOCK}},
            "device": {"tau0_ms": 1.0, "beta_ms": 0.0},
            "kv_cache": {"block_size": BLOCK, "num_blocks": N_DEVICE, "enable_prefix_caching": True,
                         "host_blocks": H_HOST, "host_link_gb_s": 25.0, "kv_bytes_per_token": 131072}}


def _tiers(result) -> np.ndarray:
    """Per request, in arrival order: (device, host, computed) prompt tokens."""
    rq = result.requests.sort_values("request_id")
    host = rq["num_host_cached_tokens"].to_numpy()
    device = rq["num_cached_tokens"].to_numpy() - host
    return np.column_stack([device, host, rq["prompt_tokens"].to_numpy() - device - host])


@pytest.mark.validation
def test_two_tiers_are_one_lru_stack(sim, check, mode, tmp_path):
    """K = 4 looked-up blocks of 16 tokens a request (and its own last one), N = 152 device blocks, H = 200
    host blocks, W uniform on 1 .. 90 per round: shares of prompt tokens device 0.0469, host 0.1993,
    computed 0.7538; over the replications, and every request against its own d(W, i)."""
    seeds = range(mode.pick(4, 20))
    n = mode.pick(1500, 8000)
    specs, ws = [], []
    for s in seeds:
        rows, w = rounds_trace(s, n)
        path = tmp_path / f"rounds_{s}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        specs.append(_spec(path))
        ws.append(w)
    runs = sim.map(_tiers, specs)
    shares = np.array([tiers.sum(axis=0) / tiers.sum() for tiers in runs])
    for j, (name, theory) in enumerate(zip(("on the device", "in the host tier", "computed"), predicted_shares(),
                                           strict=True)):
        check.ci(f"share of prompt tokens found {name}" if j < 2 else "share of prompt tokens computed",
                 theory, shares[:, j], seeds)
    wrong = 0
    for tiers, w in zip(runs, ws, strict=True):
        expected = np.array([(0, 0, K) if x == 0 else tier_blocks(int(x)) for x in w]) * BLOCK
        expected[:, 2] += BLOCK  # the last block, never looked up
        wrong += int((tiers != expected).any(axis=1).sum())
    check.exact("requests whose device, host and computed tokens differ from their blocks' stack distances",
                0, wrong, seeds=seeds)

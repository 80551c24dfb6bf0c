"""6: KV blocks, the chapter's exercise 3, through the simulator's own accounting

With 16-token blocks and 400 blocks on the device (the chapter's toy scheduler): a 600-token prompt
occupies ceil(600/16) = 38 blocks, so floor(400/38) = 10 such requests fit at once; a 40-token
prompt fills 3 blocks (48 token slots), so the KV entries of 8 generated tokens still fit and the
9th needs a fourth block; 64 requests at 100 tokens need 64 ceil(100/16) = 448 blocks, more than
400, so memory binds before the 64-sequence cap does. Exact arithmetic, no replications: each
figure is read from ``simbatch.memory.kv.blocks_for``, from ``simbatch.memory.kv.KVCacheManager``, from a
continuous scheduler stepped by hand, or from the ``kv_blocks_used`` and ``batch_size`` columns of a
simulated run.
"""

from __future__ import annotations

import pytest

from simbatch.config import KVCache
from simbatch.inputs.loading import scenario_from_dict
from simbatch.memory.kv import KVCacheManager, blocks_for
from simbatch.model.request import Request
from simbatch.schedulers import make_scheduler

TOY_KV = {"block_size": 16, "num_blocks": 400}


def _burst(prompt: int, count: int, num_blocks: int) -> dict:
    """``count`` requests of ``prompt`` tokens and one output token, all at t = 0."""
    return {
        "workload": {"num_requests": count, "arrival": {"rate": float("inf")},
                     "prompt_tokens": {"dist": "fixed", "value": prompt},
                     "output_tokens": {"dist": "fixed", "value": 1}},
        "kv_cache": {"block_size": 16, "num_blocks": num_blocks},
        "batching": {"max_num_seqs": 64, "max_num_batched_tokens": 64 * 600},
    }


@pytest.mark.validation
def test_600_token_prompts(sim, check):
    """38 blocks each; 10 fit in 400 blocks (the manager refuses the 11th; the first step admits 10)."""
    check.exact("blocks for a 600-token prompt", 38, blocks_for(600, 16), seeds=())
    kv = KVCacheManager(KVCache(**TOY_KV))
    admitted = sum(kv.allocate_slots(Request(i, 0.0, 600, 1), 600) is not None for i in range(11))
    check.exact("600-token prompts the manager admits in 400 blocks", 10, admitted, seeds=())
    first = sim(_burst(600, 20, 400)).iterations.iloc[0]
    check.exact("600-token prompts in the first simulated step", 10, first["batch_size"])
    check.exact("blocks used by that step", 380, first["kv_blocks_used"])


@pytest.mark.validation
def test_40_token_prompt_next_block(check):
    """A 40-token prompt stepped through a continuous scheduler by hand: cached tokens and blocks
    after every step; the fourth block arrives with the 9th generated token's KV entry."""
    sched = make_scheduler(scenario_from_dict({"workload": {"num_requests": 1}, "kv_cache": TOY_KV}))
    req = Request(0, 0.0, 40, 20)
    sched.add(req, 0.0)
    blocks = {}  # generated tokens whose KV is cached -> blocks held
    for step in range(20):
        sched.finish_step(sched.schedule(float(step)), step + 1.0, step)
        if not req.done:
            blocks[req.num_computed_tokens - 40] = req.blocks
    assert req.done and sched.kv_blocks_used == 0
    check.exact("blocks after the prefill", 3, blocks[0], seeds=())
    check.exact("generated tokens cached before the next block", 8, max(g for g, b in blocks.items() if b == 3),
                seeds=())
    check.exact("blocks once the 9th generated token is cached", 4, blocks[9], seeds=())


@pytest.mark.validation
def test_64_requests_at_100_tokens(sim, check):
    """448 blocks, above 400: with room they all run (448 used); in 400 blocks only 57 do."""
    check.exact("blocks for 64 requests at 100 tokens", 448, 64 * blocks_for(100, 16), seeds=())
    roomy = sim(_burst(100, 64, 10_000)).iterations.iloc[0]
    check.exact("blocks used by 64 simulated requests", 448, roomy["kv_blocks_used"])
    check.exact("their batch size", 64, roomy["batch_size"])
    tight = sim(_burst(100, 64, 400)).iterations.iloc[0]
    check.exact("batch size in 400 blocks (memory binds before max_num_seqs = 64)", 400 // 7,
                tight["batch_size"])

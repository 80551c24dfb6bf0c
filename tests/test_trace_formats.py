"""Public trace layouts and what their prompts share (simbatch/workload/trace.py, simbatch/workload/prefix.py).

The fixtures are real rows of the Azure 2023/2024, BurstGPT and Mooncake traces (tests/fixtures/traces).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from simbatch.inputs.loading import ScenarioError, scenario_from_dict
from simbatch.simulation import simulate
from simbatch.workload import generate
from simbatch.workload.prefix import expected_hash_hits
from simbatch.workload.trace import BlockHashes

TRACES = Path(__file__).resolve().parent / "fixtures" / "traces"
MOONCAKE = TRACES / "mooncake_conversation_head200.jsonl"
CACHE = {"kv_cache": {"enable_prefix_caching": True, "num_blocks": 100_000},
         "batching": {"max_num_batched_tokens": 8192, "max_num_seqs": 64}}


def workload(trace: dict, **sections):
    return generate(scenario_from_dict({"workload": {"trace": trace, **sections.pop("workload", {})}, **sections}))


def test_azure_2023_and_2024_timestamps():
    w = workload({"path": str(TRACES / "azure_2023_code_head20.csv")})
    assert len(w) == 20 and w.arrival_s[0] == 0 and w.arrival_s[1] == pytest.approx(0.052, abs=1e-6)
    # 2024: timezone-aware, and the fraction left out when it is zero (the notebook's own rows).
    w = workload({"path": str(TRACES / "azure_2024_conv_notebook_rows.csv")})
    assert len(w) == 10 and w.prompt_tokens[0] == 1452 and w.arrival_s[1] == pytest.approx(0.04052, abs=1e-6)
    assert w.arrival_s[-1] == pytest.approx(7 * 86400 - 0.001163 - 0.004540, abs=1e-3)


def test_burstgpt_sessions_and_failures(tmp_path):
    w = workload({"path": str(TRACES / "burstgpt_v1_first3.csv"), "format": "burstgpt"})
    assert np.array_equal(w.arrival_s, [0, 40, 113]) and np.array_equal(w.prompt_tokens, [472, 1087, 417])
    assert (w.prefix_stream == -1).all()  # v1 has no sessions
    w = workload({"path": str(TRACES / "burstgpt_v3_first4.csv"), "format": "burstgpt"})
    assert np.array_equal(w.session, [0, 1, 2, 3]) and np.array_equal(w.prefix_stream, [0, 1, 2, 3])
    # A failure (0 response tokens) is dropped; an API call (no session) shares nothing.
    text = (TRACES / "burstgpt_v3_first4.csv").read_text().splitlines()
    rows = [text[0], text[1], text[1].replace("19440110.0", "19440120.0").replace(",446,", ",0,"),
            text[2].replace("d5983bf9-4b48-497b-892b-a58995247443", "")]
    (tmp_path / "b.csv").write_text("\n".join(rows) + "\n")
    w = workload({"path": str(tmp_path / "b.csv"), "format": "burstgpt"})
    assert len(w) == 2 and np.array_equal(w.prefix_stream, [0, -1]) and len(set(w.session.tolist())) == 2


def test_mooncake_hash_ids():
    w = workload({"path": str(MOONCAKE), "format": "mooncake"})
    assert len(w) == 200 and w.hashes.block_tokens == 512
    assert w.hashes.of(0).tolist() == list(range(14)) and w.hashes.of(1)[:2].tolist() == [0, 14]
    assert all(len(w.hashes.of(i)) == math.ceil(p / 512) for i, p in enumerate(w.prompt_tokens.tolist()))
    assert w.arrival_s.max() == pytest.approx(max(json.loads(line)["timestamp"] for line in
                                                  MOONCAKE.read_text().splitlines()) / 1e3)


def test_the_hit_rate_the_ids_give():
    """From the ids alone: block j of a request holds (hash_ids[t], j), t its last token's trace block."""
    hashes = BlockHashes(np.array([7, 8, 7, 9, 7, 8], np.int64), np.array([0, 2, 4, 6]), 32)
    prompts = np.array([64, 64, 50])
    # 16-token blocks: request 1 shares trace block 7 (blocks 0, 1) with request 0, not 8 vs 9;
    # request 2's first trace block 7 (blocks 0, 1), then 8 (block 2 is whole, ends at token 48, found);
    # its last block is short of its last token (49), so never looked up.
    assert expected_hash_hits(prompts, hashes, 16).tolist() == [0, 32, 48]


@pytest.mark.parametrize(("trace", "says"), [
    ({"format": "mooncake", "hash_block_tokens": 256}, "hash_block_tokens to the trace's block size"),
    ({"format": "mooncake", "session_column": "x", "prompt_id_column": "y"}, "give one"),
])
def test_bad_traces_name_the_problem(tmp_path, trace, says):
    with pytest.raises(ScenarioError) as info:
        workload({"path": str(MOONCAKE), **trace})
    assert says in str(info.value.problems[0])


def test_prefix_and_a_trace(tmp_path):
    """The workload's system prompt with a trace: the first shared_tokens of a share of its prompts; with
    a trace's hash ids (which say it all already) or multi-turn (the trace's rows are the turns), refused."""
    w = workload({"path": str(TRACES / "azure_2023_code_head20.csv")},
                 workload={"prefix": {"shared_tokens": 1000, "share": 1.0}})
    assert np.array_equal(w.shared_prefix_tokens, np.minimum(1000, w.prompt_tokens))
    assert w.prompt_tokens.tolist()[:2] == [4808, 3180]  # the trace's lengths, nothing added
    for prefix, says in (({"shared_tokens": 10}, "the block ids already say"),
                         ({"multi_turn": True}, "the trace's own rows are the turns")):
        with pytest.raises(ScenarioError, match=says):
            workload({"path": str(MOONCAKE), "format": "mooncake"}, workload={"prefix": prefix, "num_sessions": 2})


def _trace(tmp_path: Path, rows: list[str], **trace) -> dict:
    (tmp_path / "t.csv").write_text("t,in,out,conv,turn,pid\n" + "\n".join(rows) + "\n")
    return {"path": str(tmp_path / "t.csv"), "timestamp_column": "t", "prompt_column": "in", "output_column": "out",
            **trace}


def test_a_conversations_turns_share_their_history(tmp_path):
    """Turn 2's prompt begins with turn 1's prompt and answer: with prefix caching it finds them cached
    (floor((P1 + O1 - 1) / b) b tokens), and the turn column orders turns whose timestamps tie."""
    rows = ["0,100,40,a,1,", "5,300,20,a,2,", "5,500,10,b,1,", "10,200,10,,1,"]
    trace = _trace(tmp_path, rows, session_column="conv", turn_column="turn")
    w = workload(trace)
    # At t = 5 conversation b's first turn goes before a's second (turns order a tie).
    assert w.prefix_stream.tolist() == [0, 1, 0, -1] and len(set(w.session.tolist())) == 3
    r = simulate(scenario_from_dict({"workload": {"trace": trace}, **CACHE}))
    cached = r.requests.sort_values("request_id")["num_cached_tokens"].tolist()
    assert cached == [0, 0, (100 + 40 - 1) // 16 * 16, 0]


def test_a_resent_prompt_finds_its_blocks(tmp_path):
    rows = ["0,100,40,,,p1", "5,100,40,,,p1", "6,100,40,,,p2", "9,100,40,,,"]
    r = simulate(scenario_from_dict({"workload": {"trace": _trace(tmp_path, rows, prompt_id_column="pid")},
                                     **CACHE}))
    assert r.requests.sort_values("request_id")["num_cached_tokens"].tolist() == [0, 96, 0, 0]


def test_a_system_prompt_with_a_trace_is_found(tmp_path):
    rows = [f"{i},{300 + i},5,,," for i in range(6)]
    r = simulate(scenario_from_dict({"workload": {"trace": _trace(tmp_path, rows),
                                                  "prefix": {"shared_tokens": 200}}, **CACHE}))
    cached = r.requests.sort_values("request_id")["num_cached_tokens"].tolist()
    assert cached == [0] + [192] * 5 and r.requests["prompt_tokens"].tolist() == [300 + i for i in range(6)]


def test_qwen_bailian_chats_and_16_token_blocks(tmp_path):
    """The layout of alibaba-edu/qwen-bailian-usagetraces-anon (no real line is readable here: the rows
    follow its README's schema): seconds, 16-token blocks, a conversation as a tree of chats."""
    rows = [{"chat_id": 5, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40, "output_length": 8,
             "type": "text", "turn": 1, "hash_ids": [1, 2, 3]},
            {"chat_id": 9, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 20, "output_length": 4,
             "type": "text", "turn": 1, "hash_ids": [7, 8]},
            {"chat_id": 6, "parent_chat_id": 5, "timestamp": 2.25, "input_length": 70, "output_length": 9,
             "type": "text", "turn": 2, "hash_ids": [1, 2, 4, 5, 6]}]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = workload({"path": str(tmp_path / "q.jsonl"), "format": "qwen-bailian"})
    assert np.array_equal(w.arrival_s, [0, 0.5, 1.75]) and w.hashes.block_tokens == 16
    assert w.session.tolist() == [0, 1, 0]  # chat 6 continues chat 5's conversation
    # 16-token blocks: turn 2 shares blocks 0 and 1 (ids 1, 2); block 2 differs (3 against 4).
    assert expected_hash_hits(w.prompt_tokens, w.hashes, 16).tolist() == [0, 0, 32]


def test_vllms_random_prefix_len_is_a_system_prompt():
    """--dataset-name random --random-prefix-len 100 --random-input-len 200 --random-range-ratio 0.5:
    100 shared tokens, then 100 to 300 of the request's own."""
    w = generate(scenario_from_dict({"workload": {
        "num_requests": 500, "prompt_tokens": {"dist": "random", "len": 200, "range_ratio": 0.5},
        "output_tokens": {"dist": "random", "len": 10}, "prefix": {"shared_tokens": 100}}}))
    assert (w.shared_prefix_tokens == 100).all() and w.prompt_tokens.min() == 200 and w.prompt_tokens.max() == 400
    assert (w.output_tokens == 10).all()

"""Disaggregated prefill and decode (simbatch.engine.disaggregated): hand-computed runs, to the
nanosecond, and the bookkeeping of two pools and the transfers between them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from simbatch.config import Scenario
from simbatch.inputs.resolve import resolve
from simbatch.simulation import simulate

# tau0 10 ms, beta 1 ms, gamma 0.1 ms/token: a 100-token prefill takes 20 ms, a decode step of one 11 ms.
# 100 tokens x 100 kB over 1 GB/s, plus 1 ms: a transfer takes 11 ms.
DEVICE = {"tau0_ms": 10.0, "beta_ms": 1.0, "prefill_ms_per_token": 0.1}
POOLS = {"prefill": {"count": 1}, "decode": {"count": 1},
         "kv_transfer": {"bandwidth_gb_s": 1.0, "latency_ms": 1.0}, "kv_bytes_per_token": 100_000}


def scenario(num_requests: int = 1, rate: float = math.inf, output: int = 10, pools: dict | None = None,
             **sections) -> Scenario:
    return Scenario.model_validate({
        "workload": {"num_requests": num_requests, "arrival": {"process": "constant", "rate": rate},
                     "prompt_tokens": {"dist": "fixed", "value": 100},
                     "output_tokens": {"dist": "fixed", "value": output}},
        "device": DEVICE, "kv_cache": {"block_size": 16, "num_blocks": 64},
        "cluster": {"disaggregated": {**POOLS, **(pools or {})}}, **sections})


@pytest.mark.parametrize("fast_forward", [True, False])
def test_one_request_by_hand(fast_forward):
    """Prefill 0-20 ms on replica 0 (first token at 20 ms), transfer 20-31 ms, then 9 decode steps of
    11 ms on replica 1: the last token at 130 ms."""
    result = simulate(scenario(sim={"fast_forward": fast_forward}), check_invariants=True)
    row = result.requests.iloc[0]
    assert (row.replica, row.decode_replica) == (0, 1)
    assert row.first_token_s == 0.020 and row.ttft_s == 0.020  # DistServe's TTFT: the prefill replica's token
    assert row.decode_queue_s == 0.0 and row.kv_transfer_s == 0.011
    assert row.finish_s == 0.130 and row.tpot_s == (0.130 - 0.020) / 9
    assert result.stall_gaps_s == [pytest.approx(0.022, abs=1e-12)]  # token 2 waits for the transfer
    it = result.iterations
    assert list(it["pool"]) == ["prefill", "decode", "decode"]
    assert list(it["num_steps"]) == [1, 1, 8]
    assert list(it["start_s"]) == [0.0, 0.031, 0.042]
    assert list(it["prefill_tokens"]) == [100, 0, 0] and list(it["decode_tokens"]) == [0, 1, 1]
    # The first decode step holds the 7 blocks of the prompt and the one its token needs (token 101).
    assert it["kv_blocks_used"].iloc[1] == 7
    s = result.summary
    assert s["prefill_num_steps"] == 1 and s["decode_num_steps"] == 9
    assert s["mean_kv_transfer_ms"] == pytest.approx(11.0) and s["prefill_token_throughput"] == 100 / 0.130


def test_prefill_blocks_are_held_until_the_transfer_ends():
    """The prefill replica has 7 blocks: a second prompt of 7 blocks waits for the first's KV to leave
    (31 ms), not for its first token (20 ms)."""
    result = simulate(scenario(num_requests=2, output=2, kv_cache={"block_size": 16, "num_blocks": 7},
                               pools={"decode": {"count": 1, "kv_cache": {"block_size": 16, "num_blocks": 64}}}),
                      check_invariants=True)
    first, second = result.requests.itertuples()
    assert first.first_token_s == 0.020
    assert second.first_scheduled_s == 0.031 and second.first_token_s == 0.051


def test_a_full_decode_replica_queues_the_hand_over():
    """One decode slot: the second request's transfer starts when the first has left the decode
    replica (FCFS, nothing dropped), and ``decode_queue_s`` is that wait."""
    result = simulate(scenario(num_requests=2, output=3,
                               pools={"decode": {"count": 1, "batching": {"max_num_seqs": 1,
                                                                          "max_num_batched_tokens": 512}}}),
                      check_invariants=True)
    first, second = result.requests.itertuples()
    # Both prompts in one prefill step, 0-30 ms. First: transfer 30-41, decodes 41-52-63. Second: waits
    # for the slot until 63, transfer 63-74, decodes 74-85-96.
    assert first.first_token_s == second.first_token_s == 0.030 and first.finish_s == 0.063
    assert second.decode_queue_s == pytest.approx(0.033) and second.kv_transfer_s == 0.011
    assert second.finish_s == 0.096
    assert result.summary["completed"] == 2


def test_one_token_outputs_never_leave_the_prefill_replica():
    result = simulate(scenario(num_requests=3, output=1), check_invariants=True)
    assert (result.requests["decode_replica"] == -1).all()
    assert result.requests["kv_transfer_s"].isna().all()
    assert result.summary["completed"] == 3 and result.summary["decode_num_steps"] == 0


def test_every_request_is_accounted_for_once_under_load():
    """Overloaded, memory-short decode pool, preemptions, clock stop mid-run: each request is
    completed, unfinished or rejected once; the invariants (KV conserved on every replica, no request
    in two pools, prefill blocks held while their transfer runs) are checked at every step."""
    sc = scenario(num_requests=200, rate=40.0, output=60,
                  workload={"num_requests": 200, "arrival": {"rate": 40.0},
                            "prompt_tokens": {"dist": "uniform", "low": 20, "high": 400},
                            "output_tokens": {"dist": "uniform", "low": 1, "high": 120}},
                  pools={"prefill": {"count": 2}, "decode": {"count": 2, "kv_cache": {"block_size": 16,
                                                                                       "num_blocks": 80}}},
                  sim={"max_time_s": 4.0})
    result = simulate(sc, check_invariants=True)
    req, s = result.requests, result.summary
    assert len(req) == req["request_id"].nunique() == s["completed"] + s["rejected"] + s["unfinished"]
    decoded = req[req["decode_replica"] >= 0]
    assert decoded["replica"].isin([0, 1]).all() and decoded["decode_replica"].isin([2, 3]).all()
    assert s["num_preemptions"] > 0 and s["unfinished"] > 0
    assert s["littles_law_rel_error"] < 1e-9
    # Requests stopped mid-transfer keep their transfer; those handed over have a first token.
    assert decoded["first_token_s"].notna().all()


def test_pools_route_separately():
    """round_robin over the prefill pool for arrivals, least_outstanding over the decode pool."""
    pools = {**POOLS, "prefill": {"count": 2}, "decode": {"count": 2}}
    result = simulate(Scenario.model_validate({**scenario(num_requests=4).model_dump(exclude={"cluster"}),
                                               "cluster": {"router": "round_robin", "disaggregated": pools}}))
    assert list(result.requests["replica"]) == [0, 1, 0, 1]
    assert set(result.requests["decode_replica"]) == {2, 3}


def test_the_kv_bytes_come_from_the_preset():
    sc = scenario(device={"preset": "llama-3.1-8b/H100-SXM"}, pools={"kv_bytes_per_token": None})
    assert resolve(sc).cluster.disaggregated.kv_bytes_per_token == 131072  # 2 x 32 layers x 8 KV heads x 128 x 2 bytes
    with pytest.raises(ValidationError, match="kv_bytes_per_token is missing"):
        scenario(pools={"kv_bytes_per_token": None})


def test_a_dumped_scenario_loads_again():
    sc = scenario(pools={"prefill": {"count": 2}, "decode": {"count": 3}})
    assert sc.cluster.replicas == 5
    again = Scenario.model_validate(sc.model_dump())
    assert again.cluster.replicas == 5 and again.cluster.disaggregated == sc.cluster.disaggregated
    assert np.array_equal(simulate(again).requests["finish_s"], simulate(sc).requests["finish_s"])


# --------------------------------------------------------------------------- capacity and placement
def test_prefill_capacity_and_the_best_split():
    from simbatch.analysis.capacity import best_split, pool_capacity, prefill_capacity
    from simbatch.config import Device

    device = Device(tau0_ms=10.0, beta_ms=0.0, prefill_ms_per_token=0.02)
    # Steps of 1024 tokens, 30.48 ms: two 512-token prompts a step.
    assert prefill_capacity(device, 1, 1024, 64, 512) == pytest.approx(2 / 0.03048)
    # Two slots hold two 100-token prompts: steps of 200 tokens, 14 ms.
    assert prefill_capacity(device, 3, 8192, 2, 100) == pytest.approx(3 * 2 / 0.014)
    assert pool_capacity(5.0, 7.0) == (5.0, "prefill") and pool_capacity(9.0, 7.0) == (7.0, "decode")
    assert best_split(6, 65.6, 19.0) == 2 and best_split(2, 1.0, 1.0) == 1
    assert best_split(4, 10.0, 10.0) == 2  # min(20, 20): the even split
    with pytest.raises(ValueError, match="at least 2"):
        best_split(1, 1.0, 1.0)


def test_the_cli_places_and_writes_its_folder(tmp_path):
    from test_cli import PNG, SCENARIOS, invoke

    out = tmp_path / "placement"
    result = invoke("placement", SCENARIOS / "disaggregated.yaml", "--gpus", "3", "--set", "workload.duration_s=20",
                    "--out", out)
    assert result.exit_code == 0, result.stderr
    assert "Best split:" in result.stdout and "Closed form" in result.stdout
    assert {p.name for p in out.iterdir()} == {"placement.csv", "placement.png"}
    assert (out / "placement.png").read_bytes().startswith(PNG)
    assert len((out / "placement.csv").read_text().splitlines()) == 3  # header, 1:2, 2:1


@pytest.mark.parametrize(("args", "words"), [
    (("--gpus", "1"), ["--gpus 1", "at least 2", "e.g. --gpus 4"]),
    (("--gpus", "4", "--set", "cluster.disaggregated=null"), ["cluster.disaggregated is not set"]),
])
def test_the_cli_rejects_a_placement_it_cannot_make(tmp_path, args, words):
    from test_cli import SCENARIOS, invoke

    result = invoke("placement", SCENARIOS / "disaggregated.yaml", *args, "--out", tmp_path / "out")
    assert result.exit_code == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and all(w in result.stderr for w in words), result.stderr
    assert not (tmp_path / "out").exists()


def test_the_tables_and_the_handover_plot_show_the_pools():
    """(The run folder of scenarios/disaggregated.yaml, with plots/handover.png: tests/test_scenarios.py.)"""
    from simbatch.app import report
    from simbatch.app.plots.disaggregated import handover

    result = simulate(scenario(num_requests=20, rate=5.0, pools={"decode": {"count": 2}}))
    table = report.result_table(result.summary)
    assert "Disaggregated pools (prefill / decode)" in table and "Mean KV transfer (ms):" in table
    assert "Pool that binds:" in report.stability_block(result.stability)
    queues, top, bottom = handover(result.requests, result.iterations).axes
    assert [line.get_label() for line in queues.lines] == ["prefill pool", "decode pool"]
    assert len(top.collections) == 4  # queue, prefill, wait for a slot, transfer
    assert bottom.lines[0].get_ydata()[-1] == 100  # every request handed over


def test_concepts_names_every_disaggregated_summary_key():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "concepts.md").read_text(encoding="utf-8")
    keys = [k for k in simulate(scenario(num_requests=5, rate=10.0)).summary
            if k.startswith(("prefill_", "decode_")) or "kv_transfer" in k or "decode_queue" in k]
    assert len(keys) == 20
    unnamed = [k for k in keys if f"`{k}`" not in text and
               f"{{mean,median,std,p90,p99}}_{k.split('_', 1)[1]}" not in text]
    assert not unnamed


def test_the_capacity_command_checks_both_pools():
    from test_cli import SCENARIOS, invoke

    result = invoke("capacity", SCENARIOS / "disaggregated.yaml")
    assert result.exit_code == 0, result.stderr
    assert "Pool that binds:                         prefill" in result.stdout
    assert "With 2 replicas at B = 128" in result.stdout  # the decode pool's table
    refused = invoke("capacity", SCENARIOS / "disaggregated.yaml", "--rate", "3")
    assert refused.exit_code == 2 and refused.stderr.startswith("--rate: the scenario's cluster is disaggregated")

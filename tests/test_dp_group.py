"""A data-parallel MoE engine's ranks step in lockstep (simbatch.engine.dp_group), as vLLM's do."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fast_forward import assert_same_run, examples, scenarios

from simbatch.config import Scenario
from simbatch.engine import Engine
from simbatch.engine.dp_group import SYNC_EVERY_STEPS, dp_pads, max_graph_tokens
from simbatch.observe.observers import Observer
from simbatch.simulation import simulate
from simbatch.workload import generate


def _moe(dp: int) -> dict:
    return {"num_experts": 8, "experts_per_token": 2, "local_experts": 4, "expert_read_ms": 0.0,
            "data_parallel_size": dp}


def _two_ranks(tmp_path, moe: dict | None) -> dict:
    """Request 0 (10 prompt tokens, 5 output) at t = 0 on rank 0; request 1 (100 prompt tokens, 1 output) at
    25 ms on rank 1; steps of 10 ms plus 1 ms per prompt token."""
    trace = tmp_path / "two.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n0.025,100,1\n")
    return {"workload": {"trace": {"path": str(trace)}},
            "device": {"tau0_ms": 10.0, "beta_ms": 0.0, "prefill_ms_per_token": 1.0, "moe": moe},
            "kv_cache": {"num_blocks": 100}, "cluster": {"replicas": 2, "router": "round_robin"}}


@pytest.mark.parametrize("fast_forward", [False, True])
def test_one_ranks_prefill_holds_the_other_ranks_decode(tmp_path, fast_forward):
    """Rank 0 prefills request 0 in [0, 20] ms and decodes it in [20, 30]; request 1 reaches rank 1 at 25 ms,
    and its 100-token prefill (110 ms) is the group's third step, [30, 140]: rank 0's decode, 10 ms alone,
    ends at 140 too. Then rank 0 decodes at 150 and 160 (request 0 done: TPOT (160 - 20) / 4 = 35 ms), while
    rank 1 runs dummy steps of 10 ms; both run dummies until the wave's 32nd step, at 160 + 27 x 10 = 430 ms."""
    sc = _two_ranks(tmp_path, _moe(2)) | {"sim": {"fast_forward": fast_forward}}
    result = simulate(Scenario.model_validate(sc), check_invariants=True)
    req = result.requests.set_index("request_id").sort_index()
    assert req.first_token_s.tolist() == pytest.approx([0.02, 0.14], abs=1e-12)
    assert req.finish_s.tolist() == pytest.approx([0.16, 0.14], abs=1e-12)
    assert req.tpot_s[0] == pytest.approx(0.035, abs=1e-12)
    it = result.iterations
    for rank in (0, 1):
        rows = it[it.replica == rank]
        assert rows.num_steps.sum() == SYNC_EVERY_STEPS
        assert rows.end_s.max() == pytest.approx(0.43, abs=1e-12)
    # Rank 1's dummies pad to rank 0's 10 prompt tokens, then its decode token; rank 0's decode pads to
    # rank 1's 100 prompt tokens (a CUDA-graph step: up to 2 x 64 tokens). Pads cost beta (0 here).
    rank0, rank1 = it[it.replica == 0], it[it.replica == 1]
    assert rank1.padded_tokens.tolist() == [10, 1, 0, 1] and rank1.prefill_tokens.tolist() == [0, 0, 100, 0]
    assert rank1.duration_s.tolist() == pytest.approx([0.02, 0.01, 0.11, 0.01], abs=1e-12)
    assert rank0.padded_tokens.tolist() == [0, 0, 99, 0, 1] and rank0.num_steps.tolist() == [1, 1, 1, 2, 27]


def test_ranks_pad_to_the_largest_when_every_step_fits_a_cuda_graph():
    assert dp_pads([1, 10, 0], 16) == [9, 0, 10]
    assert dp_pads([1, 16], 16) == [15, 0]
    assert dp_pads([1, 17], 16) == [0, 0]  # the larger runs eager: so do all, unpadded
    base = {"workload": {"num_requests": 1}}
    assert max_graph_tokens(Scenario.model_validate(base)) == 128  # vLLM's default max_num_seqs 64 (simbatch's)
    assert max_graph_tokens(Scenario.model_validate(base | {"batching": {"max_num_seqs": 256}})) == 512
    assert max_graph_tokens(Scenario.model_validate(
        base | {"batching": {"max_num_seqs": 256, "max_num_batched_tokens": 300}})) == 300
    spec = {"device": {"speculative": {"num_speculative_tokens": 3, "acceptance_rate": 0.5,
                                        "draft_cost_ms": 1.0}}}
    assert max_graph_tokens(Scenario.model_validate(base | spec | {"batching": {"max_num_seqs": 16}})) == 128


def test_without_the_mixture_the_ranks_are_independent(tmp_path):
    """A dense model's data-parallel ranks are independent engines (vLLM: reconfigure_for_independent_dp_rank):
    rank 0's decode is not held by rank 1's prefill, and nobody runs a dummy step."""
    result = simulate(Scenario.model_validate(_two_ranks(tmp_path, None)))
    assert result.requests.set_index("request_id").sort_index().finish_s.tolist() == \
        pytest.approx([0.06, 0.135], abs=1e-12)
    assert (result.iterations.padded_tokens == 0).all()


def test_groups_are_data_parallel_size_consecutive_replicas(tmp_path):
    sc = _two_ranks(tmp_path, _moe(2))
    for replicas, groups in ((1, []), (2, [(0, 1)]), (3, [(0, 1)]), (4, [(0, 1), (2, 3)])):
        scenario = Scenario.model_validate(sc | {"cluster": {"replicas": replicas}})
        engine = Engine(scenario, generate(scenario))
        assert [tuple(r.index for r in g.ranks) for g in engine.dp_groups] == groups
    dense = Scenario.model_validate(_two_ranks(tmp_path, None))
    assert Engine(dense, generate(dense)).dp_groups == []


class StepTimes(Observer):
    """Every replica's steps, as (start, duration, done), in order."""

    def __init__(self):
        self.steps: defaultdict[int, list[tuple]] = defaultdict(list)

    def step(self, replica, start_s, duration_s, plan, done):
        self.steps[replica].append((start_s, duration_s, done))


@st.composite
def grouped(draw) -> dict:
    """A random scenario (tests/test_fast_forward.py) of one or two data-parallel MoE engines."""
    scenario = draw(scenarios())
    dp = draw(st.integers(2, 3))
    moe = {**_moe(dp), "expert_read_ms": draw(st.floats(0, 0.5))}
    return {**scenario, "device": {**scenario["device"], "moe": moe},
            "cluster": {**scenario["cluster"], "replicas": dp * draw(st.integers(1, 2))}}


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grouped())
def test_every_ranks_step_k_has_the_same_start_and_end(scenario):
    times = StepTimes()
    sc = Scenario.model_validate(scenario)
    simulate(sc, check_invariants=True, observers=(times,))
    dp = sc.device.moe.data_parallel_size
    for first in range(0, sc.cluster.replicas, dp):
        ranks = [times.steps[i] for i in range(first, first + dp)]
        assert all(r == ranks[0] for r in ranks)


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grouped())
def test_a_data_parallel_group_runs_alike_stepped_or_accelerated(scenario):
    assert_same_run(scenario)

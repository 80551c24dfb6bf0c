"""Observers see every event of a run, and what they see adds up to the frames, in either engine."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest
from builders import fixed

from simbatch import Observer, simulate
from simbatch.config import Scenario


class Tally(Observer):
    """Everything an observer is told, summed."""

    def __init__(self):
        self.arrived, self.rejected, self.completed = [], Counter(), []
        self.step_counts = Counter()  # (replica, done) -> steps
        self.tokens = Counter()  # replica -> tokens computed in steps that were done
        self.members = Counter()  # replica -> sum over steps of the batch size
        self.times: list[float] = []

    def arrival(self, t_s, request):
        self.arrived.append((request.request_id, request.replica))
        self.times.append(t_s)

    def rejection(self, t_s, request_id, reason):
        self.rejected[reason] += 1
        self.times.append(t_s)

    def steps(self, replica, start_s, step_s, count, plan, done):
        self.step_counts[replica, done] += count
        self.members[replica] += count * len(plan.scheduled)
        if done:
            self.tokens[replica] += count * sum(n for _, n in plan.scheduled)

    def completion(self, t_s, requests):
        self.completed += [r.request_id for r in requests]
        self.times.append(t_s)
        assert all(r.done for r in requests)


SCENARIO = {
    "workload": {"num_requests": 120, "arrival": {"rate": 40.0}, "prompt_tokens": {"dist": "uniform", "low": 4, "high": 60},
                 "output_tokens": {"dist": "exponential", "mean": 30, "max": 200}},
    "kv_cache": {"block_size": 4, "num_blocks": 160},
    "batching": {"max_num_seqs": 8, "max_num_batched_tokens": 64},
    "scheduler": {"max_waiting": 20},
    "cluster": {"replicas": 2, "router": "least_outstanding"},
    "sim": {"max_time_s": 4.0},
}


@pytest.mark.parametrize("fast_forward", [False, True])
def test_an_observer_sees_what_the_frames_hold(fast_forward):
    tally = Tally()
    result = simulate(Scenario.model_validate({**SCENARIO, "sim": {**SCENARIO["sim"], "fast_forward": fast_forward}}),
                      observers=[tally])
    rq, it = result.requests, result.iterations
    assert sorted(tally.arrived) == sorted(zip(rq.loc[rq["status"] != "rejected", "request_id"],
                                               rq.loc[rq["status"] != "rejected", "replica"], strict=True))
    assert tally.rejected == Counter(rq.loc[rq["status"] == "rejected", "reason"])
    assert sorted(tally.completed) == sorted(rq.loc[rq["status"] == "finished", "request_id"])
    assert tally.times == sorted(tally.times)  # told in simulation order
    for r, rows in it.groupby("replica"):
        stopped = rows["itl_tokens"].eq(0) & (rows["end_s"] > result.summary["duration"])
        assert tally.step_counts[r, True] + tally.step_counts[r, False] == rows["num_steps"].sum()
        assert tally.step_counts[r, False] == rows.loc[stopped, "num_steps"].sum() <= 1
        assert tally.members[r] == (rows["batch_size"] * rows["num_steps"]).sum()
        done = rows[~stopped]
        assert tally.tokens[r] == ((done["decode_tokens"] + done["prefill_tokens"]) * done["num_steps"]).sum()


def test_observers_change_nothing():
    scenario = Scenario.model_validate({**SCENARIO, "workload": {**SCENARIO["workload"], "output_tokens": fixed(20)}})
    watched, plain = simulate(scenario, observers=[Tally()]), simulate(scenario)
    pd.testing.assert_frame_equal(watched.requests, plain.requests, check_exact=True)
    pd.testing.assert_frame_equal(watched.iterations, plain.iterations, check_exact=True)
    assert pd.Series(watched.summary).equals(pd.Series(plain.summary))

"""2: Little's law, L = lambda W and Lq = lambda Wq, on every run

Little's law (J. D. C. Little, Operations Research 9(3), 1961) holds for any queueing system and,
counted over a finite horizon with every request's time clipped to the horizon, on every sample
path exactly: the area under N(t) is the sum of the times the requests spent inside
(S. Stidham, Operations Research 22(2), 1974). The simulator measures the two sides independently:
L and Lq are integrated from the engine's own state changes (arrival, admission, preemption,
completion) by the recorder, W and Wq are means over the request rows, with lambda the admitted
requests per second of simulated time. Any disagreement beyond rounding is a bookkeeping bug.

Every simulation of this suite goes through the same guard (the ``sim`` fixture), so the law is
checked on all of them; the runs here add the mechanisms the other checks do not exercise:
preemption by recompute and by swap, static and dynamic batching with timers, several replicas
behind a router, rejections at a full queue, priorities, and a clock stopped with requests inside.
"""

from __future__ import annotations

import pytest

BASE = {
    "seed": 0,
    "workload": {"duration_s": 60.0, "arrival": {"rate": 6.0},
                 "prompt_tokens": {"dist": "uniform", "low": 16, "high": 256},
                 "output_tokens": {"dist": "exponential", "mean": 80, "max": 600}},
    "device": {"tau0_ms": 20.0, "beta_ms": 0.2, "prefill_ms_per_token": 0.05},
}

CASES = {
    # name: (sections merged into BASE, what the run must show so the case tests what it claims)
    "preempt_recompute": ({"kv_cache": {"num_blocks": 120}}, "num_preemptions"),
    "preempt_swap": ({"kv_cache": {"num_blocks": 120, "swap_blocks": 400, "swap_ms_per_block": 0.05},
                      "scheduler": {"preemption": "swap"}}, "num_preemptions"),
    "static_max_wait": ({"batching": {"mode": "static", "max_num_seqs": 8, "max_wait_ms": 200.0}}, "completed"),
    "dynamic_delay": ({"batching": {"mode": "dynamic", "max_num_seqs": 16, "max_queue_delay_ms": 50.0}},
                      "completed"),
    "three_replicas": ({"cluster": {"replicas": 3, "router": "least_outstanding"},
                        "workload": {**BASE["workload"], "arrival": {"rate": 15.0}}}, "completed"),
    "queue_full_rejections": ({"batching": {"max_num_seqs": 4}, "scheduler": {"max_waiting": 5}}, "rejected"),
    "priority_classes": ({"scheduler": {"policy": "priority"}, "kv_cache": {"num_blocks": 150},
                          "workload": {**BASE["workload"],
                                       "classes": [{"name": "gold", "priority": 0, "share": 1},
                                                   {"name": "free", "priority": 1, "share": 3}]}},
                         "num_preemptions"),
    "stopped_clock": ({"batching": {"max_num_seqs": 8}, "sim": {"max_time_s": 40.0}}, "unfinished"),
}


@pytest.mark.validation
@pytest.mark.parametrize("case", list(CASES))
def test_littles_law(case, sim, check):
    """Relative error of L against lambda W and of Lq against lambda Wq, to rounding."""
    sections, exercised = CASES[case]
    result = sim({**BASE, **sections})
    s = result.summary
    assert s[exercised] > 0, f"{case}: the run has no {exercised}, so it does not test what it claims"
    check.exact("L = lambda W (requests)", s["arrival_rate"] * s["W_s"], s["L"])
    check.exact("Lq = lambda Wq (requests)", s["arrival_rate"] * s["Wq_s"], s["Lq"])

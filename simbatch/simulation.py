"""The public entry point: ``simulate(scenario) -> Result``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd

from simbatch.config import Scenario, replica_scenarios
from simbatch.cost import Stability, fleet_stability, mean_blocks_held, memory_batch
from simbatch.engine import Engine
from simbatch.metrics.summary import iterations_frame, requests_frame, summarize
from simbatch.observers import Observer
from simbatch.workload import WorkloadArrays, generate


@dataclass
class Result:
    """What one simulation produced.

    ``requests``: one row per arrived request; ``iterations``: one row per run of identical engine
    steps (``num_steps`` of them); ``summary``: vLLM-named metrics (see :mod:`simbatch.metrics.summary`).
    """

    scenario: Scenario
    requests: pd.DataFrame
    iterations: pd.DataFrame
    summary: dict
    stability: Stability
    stall_gaps_s: list[float] = field(default_factory=list, repr=False)


def expected_stability(scenario: Scenario, workload: WorkloadArrays) -> Stability:
    """The stability check for this scenario's traffic, from the workload's own lengths.

    Each replica's full batch is capped by what its KV cache holds, from the mean blocks a running
    request holds over its output (:func:`~simbatch.cost.mean_blocks_held`). Closed-loop users have
    no arrival rate; the rate checked is the one they would send at the latency of a full batch W_B:
    concurrency / (W_B + think time).
    """
    duration = float(workload.arrival_s[-1]) if len(workload) else 0.0
    rate = scenario.workload.arrival.rate if scenario.workload.arrival is not None else float("inf")
    if scenario.workload.trace is not None or rate == float("inf"):
        rate = len(workload) / duration if duration > 0 else float("inf")
    held: dict[int, float] = {}  # by block size: a fleet shares one workload
    replicas = []
    for s in replica_scenarios(scenario):
        kv = s.kv_cache
        if kv.block_size not in held:
            held[kv.block_size] = mean_blocks_held(workload.prompt_tokens, workload.output_tokens, kv.block_size)
        replicas.append((s.device, s.batching.max_num_seqs, memory_batch(kv.num_blocks, held[kv.block_size])))
    shed = scenario.scheduler.max_waiting is not None or scenario.cluster.max_in_flight is not None
    means = (float(workload.output_tokens.mean()) if len(workload) else 0.0,
             float(workload.prompt_tokens.mean()) if len(workload) else 0.0)
    users = scenario.workload.closed_loop
    if users is not None:
        w_full_s = fleet_stability(replicas, 1.0, *means).full_batch_latency_s
        rate = users.concurrency / (w_full_s + users.think_time_s)
    return fleet_stability(replicas, rate, *means, admission_control=shed)


def simulate(scenario: Scenario, *, check_invariants: bool = False,
             on_progress: Callable[[float, int], None] | None = None,
             workload: WorkloadArrays | None = None, observers: Sequence[Observer] = ()) -> Result:
    """Run ``scenario`` to the end and collect its frames and summary.

    ``check_invariants`` re-checks pools and block conservation at every step (slow; for tests).
    ``on_progress(sim_time_s, requests_arrived)`` is called now and then, for progress bars.
    ``workload``: the requests, when already drawn from this scenario's workload section (a comparison
    of variants that leave it alone draws it once); drawn here otherwise.
    ``observers``: :class:`~simbatch.observers.Observer` objects told of every arrival, rejection,
    step (with its membership) and completion as the run goes.
    """
    if workload is None:
        workload = generate(scenario)
    engine = Engine(scenario, workload, check_invariants=check_invariants, on_progress=on_progress,
                    observers=observers)
    end_s = engine.run()
    requests = requests_frame(workload, engine.recorder)
    iterations = iterations_frame(engine.recorder)
    summary = summarize(scenario, requests, iterations, engine.recorder, end_s)
    return Result(scenario, requests, iterations, summary, expected_stability(scenario, workload),
                  list(engine.recorder.stall_gaps_s))

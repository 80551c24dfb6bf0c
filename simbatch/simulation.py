"""The public entry point: ``simulate(scenario) -> Result``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd

from simbatch.analysis.autoscale import autoscale_summary, fleet_frame
from simbatch.analysis.capacity import Stability, expected_stability
from simbatch.analysis.summary import iterations_frame, requests_frame, summarize
from simbatch.config import Scenario
from simbatch.engine import Engine
from simbatch.inputs.resolve import resolve
from simbatch.observe.observers import Observer
from simbatch.workload import WorkloadArrays, generate


@dataclass
class Result:
    """What one simulation produced.

    ``requests``: one row per arrived request; ``iterations``: one row per run of identical engine
    steps (``num_steps`` of them); ``summary``: vLLM-named metrics (see :mod:`simbatch.analysis.summary`).
    """

    scenario: Scenario
    requests: pd.DataFrame
    iterations: pd.DataFrame
    summary: dict
    stability: Stability
    stall_gaps_s: list[float] = field(default_factory=list, repr=False)
    fleet: pd.DataFrame | None = None  # an autoscaled fleet's changes (simbatch.analysis.autoscale.fleet_frame)


def simulate(scenario: Scenario, *, check_invariants: bool = False,
             on_progress: Callable[[float, int], None] | None = None,
             workload: WorkloadArrays | None = None, observers: Sequence[Observer] = ()) -> Result:
    """Run ``scenario`` to the end and collect its frames and summary.

    The scenario is resolved first (:func:`~simbatch.inputs.resolve.resolve`: presets, ``num_blocks: auto``;
    a loaded scenario is already, and resolving it again changes nothing); ``Result.scenario`` is the
    resolved one, the scenario the engine ran.

    ``check_invariants`` re-checks pools and block conservation at every step (slow; for tests).
    ``on_progress(sim_time_s, requests_arrived)`` is called now and then, for progress bars.
    ``workload``: the requests, when already drawn from this scenario's workload section (a comparison
    of variants that leave it alone draws it once); drawn here otherwise.
    ``observers``: :class:`~simbatch.observe.observers.Observer` objects told of every arrival, rejection,
    step (with its membership) and completion as the run goes.
    """
    scenario = resolve(scenario)
    if workload is None:
        workload = generate(scenario)
    engine = Engine(scenario, workload, check_invariants=check_invariants, on_progress=on_progress,
                    observers=observers)
    end_s = engine.run()
    requests = requests_frame(workload, engine.recorder)
    pools = scenario.cluster.disaggregated
    iterations = iterations_frame(engine.recorder, None if pools is None else pools.prefill.count)
    summary = summarize(scenario, requests, iterations, engine.recorder, end_s)
    fleet = None
    if engine.autoscaler is not None:
        fleet = fleet_frame(engine.autoscaler.events)
        summary |= autoscale_summary(scenario, fleet, end_s)
    return Result(scenario, requests, iterations, summary, expected_stability(scenario, workload),
                  list(engine.recorder.stall_gaps_s), fleet)

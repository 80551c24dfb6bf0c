"""Run one benchmark case once, in this process, and print its measurements as JSON.

Each repeat runs in a fresh process (``benchmarks.run`` starts them), so peak RSS is the case's own.
"""

from __future__ import annotations

import json
import resource
import sys
import time

from benchmarks.cases import CASES
from simbatch.analysis.summary import iterations_frame, requests_frame, summarize
from simbatch.engine import Engine
from simbatch.workload import generate


def measure(name: str) -> dict:
    scenario = CASES[name][1]()
    t0 = time.perf_counter()
    workload = generate(scenario)
    t1 = time.perf_counter()
    engine = Engine(scenario, workload)
    end_s = engine.run()
    t2 = time.perf_counter()
    requests = requests_frame(workload, engine.recorder)
    iterations = iterations_frame(engine.recorder)
    summary = summarize(scenario, requests, iterations, engine.recorder, end_s)
    t3 = time.perf_counter()
    return {
        "case": name,
        "requests": len(workload),
        "workload_s": t1 - t0,
        "simulation_s": t2 - t1,
        "total_s": t3 - t0,
        "iterations": summary["num_steps"],
        "iteration_rows": len(iterations),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "completed": summary["completed"],
        "mean_batch_size": summary["mean_batch_size"],
        "max_waiting": int(iterations["num_waiting"].max()),
        "preemptions": summary["num_preemptions"],
    }


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1])))

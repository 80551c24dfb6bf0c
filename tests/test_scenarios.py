"""The scenario library: every shipped file runs through the CLI, and each tells the story it claims.

The CLI runs are cut short with ``--set workload.num_requests=...``; the story checks simulate
directly (no plots) at the sizes the scenario's comments talk about, or as small as still shows it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import RUN_FILES, SCENARIOS, invoke

from simbatch.loading import load_scenario
from simbatch.simulation import simulate

SHIPPED = sorted(SCENARIOS.glob("*.yaml"))
NAMES = [p.stem for p in SHIPPED]


def test_the_library_is_complete():
    assert {"oversubscribed", "oversubscribed_shed", "stable", "heavy_tail", "long_prompts", "memory_pressure",
            "priority_tiers", "bursty", "trace_replay"} <= set(NAMES)


@pytest.mark.parametrize("path", SHIPPED, ids=NAMES)
def test_every_scenario_runs_through_the_cli(tmp_path, path):
    out = tmp_path / "out"
    result = invoke("run", path, "--set", "workload.num_requests=40", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert "Stability check" in result.stdout and "Serving Benchmark Result" in result.stdout
    assert {p.name for p in out.iterdir()} == RUN_FILES
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] + summary["rejected"] + summary["unfinished"] == summary["num_requests"] > 0
    assert summary["littles_law_rel_error"] < 1e-6
    # Results land under the scenario's own name; a lesson names its file.
    assert load_scenario(path).name == path.stem


@pytest.mark.parametrize("path", SHIPPED, ids=NAMES)
def test_every_scenario_is_a_commented_lesson(path):
    text = path.read_text(encoding="utf-8")
    comments = [ln for ln in text.splitlines() if ln.lstrip().startswith("#")]
    assert len(comments) >= 10


def run(name: str, *overrides: str):
    return simulate(load_scenario(SCENARIOS / f"{name}.yaml", list(overrides)))


def test_oversubscribed_shed_rejects_instead_of_queueing():
    shed = run("oversubscribed_shed", "workload.num_requests=400")
    rejected = shed.requests[shed.requests["status"] == "rejected"]
    assert len(rejected) > 100 and set(rejected["reason"]) == {"queue_full"}
    # The wait is bounded by the cap: 64 waiting, served at the device's ~3.9 requests/s.
    assert shed.summary["p99_ttft_ms"] / 1e3 < 64 / shed.stability.capacity_requests_per_s * 1.2
    assert shed.iterations["num_waiting"].max() <= 64


def test_stable_and_bursty_same_load_different_tails():
    stable, bursty = run("stable"), run("bursty")
    assert stable.stability.stable and bursty.stability.stable
    assert bursty.stability.offered_load == pytest.approx(stable.stability.offered_load, rel=0.15)
    assert stable.summary["p99_ttft_ms"] < 2 * stable.summary["median_ttft_ms"]
    assert bursty.summary["p99_ttft_ms"] > 20 * stable.summary["p99_ttft_ms"]


def test_long_prompts_chunking_removes_the_itl_stutter():
    chunked = run("long_prompts", "workload.num_requests=120")
    whole = run("long_prompts", "workload.num_requests=120", "batching.enable_chunked_prefill=false",
                "batching.max_num_batched_tokens=8192")
    assert whole.summary["rejected"] == chunked.summary["rejected"] == 0
    assert whole.summary["p99_itl_ms"] > 3 * chunked.summary["p99_itl_ms"]
    assert whole.summary["mean_ttft_ms"] < chunked.summary["mean_ttft_ms"]  # chunking's price


@pytest.mark.parametrize("preemption", ["swap", "recompute"])
def test_memory_pressure_preempts_and_memory_sets_the_batch(preemption):
    result = run("memory_pressure", "workload.num_requests=150", f"scheduler.preemption={preemption}")
    assert result.summary["num_preemptions"] > 20
    assert result.summary["mean_batch_size"] < result.scenario.batching.max_num_seqs / 2
    swapped = (result.iterations["swap_blocks"] * result.iterations["num_steps"]).sum()
    assert (swapped > 0) == (preemption == "swap")


def test_priority_tiers_starve_without_aging_and_share_with_it():
    def ttft_s(result, tenant):
        r = result.requests
        return r[(r["tenant"] == tenant) & (r["status"] == "finished")]["ttft_s"]

    strict, aged = run("priority_tiers"), run("priority_tiers", "scheduler.aging_s=5")
    assert ttft_s(strict, "interactive").mean() < 0.2 < 2 < ttft_s(strict, "batch").mean()
    assert ttft_s(aged, "batch").max() < ttft_s(strict, "batch").max() * 0.75
    assert ttft_s(aged, "interactive").mean() > 5 * ttft_s(strict, "interactive").mean()


def test_trace_replay_replays_the_shipped_trace():
    result = run("trace_replay")
    trace = Path(result.scenario.resolve(result.scenario.workload.trace.path))
    assert trace.name == "sample_trace.csv" and trace.is_file()
    assert result.summary["num_requests"] == len(trace.read_text().splitlines()) - 1
    assert result.stability.stable
    assert not run("trace_replay", "workload.trace.time_scale=0.25").stability.stable

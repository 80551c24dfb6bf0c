"""The run-size guard: measured constants, refusal with the estimate, --force, and the must-show timings."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from test_cli import SCENARIOS, invoke

from simbatch.inputs import guard
from simbatch.inputs.loading import load_scenario
from simbatch.simulation import simulate

SIMBATCH = Path(sys.executable).with_name("simbatch")


def _peak_bytes(overrides: list[str]) -> float:
    scenario = load_scenario(SCENARIOS / "stable.yaml", ["workload.duration_s=null", *overrides])
    tracemalloc.start()
    try:
        simulate(scenario)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_bytes_per_request_covers_what_a_simulation_allocates():
    n = 8_000
    assert _peak_bytes([f"workload.num_requests={n}", "workload.arrival.rate=3.5"]) / n < guard.BYTES_PER_REQUEST


def test_bytes_per_replica_covers_what_a_fleet_allocates():
    n = 400
    assert _peak_bytes(["workload.num_requests=50", f"cluster.replicas={n}",
                        "workload.arrival.rate=100"]) / n < guard.BYTES_PER_REPLICA


@pytest.mark.parametrize(("overrides", "requests"), [
    (["workload.num_requests=1000"], 1000),
    (["workload.num_requests=null", "workload.duration_s=100", "workload.arrival.rate=4"], 400),
    # Both set: num_requests arrival times are drawn before the duration cuts them.
    (["workload.num_requests=5000", "workload.duration_s=10"], 5000),
])
def test_expected_requests(overrides, requests):
    assert guard.expected_requests(load_scenario(SCENARIOS / "stable.yaml", overrides)) == requests


def test_a_trace_is_sized_by_its_rows(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{i},10,5\n" for i in range(37)))
    (tmp_path / "s.yaml").write_text("workload:\n  trace:\n    path: t.csv\n")
    assert guard.expected_requests(load_scenario(tmp_path / "s.yaml")) == 37
    assert guard.expected_requests(load_scenario(tmp_path / "s.yaml", ["workload.num_requests=5"])) == 5


def test_refusal_names_the_estimate_and_force_runs_anyway(tmp_path, monkeypatch):
    monkeypatch.setattr(guard, "MAX_BYTES", 10 * guard.BYTES_PER_REQUEST)
    args = ("run", SCENARIOS / "stable.yaml", "--set", "workload.num_requests=20", "--out", tmp_path / "out", "-q")
    refused = invoke(*args)
    assert refused.exit_code == 2 and refused.stdout == ""
    assert "about 20 requests x 1 replica" in refused.stderr and "--force" in refused.stderr
    assert not (tmp_path / "out").exists()
    forced = invoke(*args, "--force", "--no-plots")  # that it runs is the point, not its plots
    assert forced.exit_code == 0, forced.stderr
    assert (tmp_path / "out" / "summary.json").is_file()


def test_a_sweep_checks_every_point_and_its_run_count(tmp_path, monkeypatch):
    monkeypatch.setattr(guard, "MAX_RUNS", 5)
    result = invoke("sweep", SCENARIOS / "stable.yaml", "-p", "workload.arrival.rate=1,2", "-r", "3",
                    "-o", tmp_path / "sw")
    assert result.exit_code == 2 and "2 points x 3 replications = 6 runs" in result.stderr
    result = invoke("sweep", SCENARIOS / "stable.yaml", "-p", "workload.num_requests=10,1000000000", "-r", "1",
                    "-o", tmp_path / "sw")
    assert result.exit_code == 2 and "1,000,000,000 requests" in result.stderr
    assert not (tmp_path / "sw").exists()


def test_a_billion_requests_is_refused_with_the_estimate_before_any_request_is_drawn(tmp_path, monkeypatch):
    # What the guard saves is work: the refusal comes before the workload is drawn (the CPU time it
    # takes as a whole process is measured by `make bench`: benchmarks/cli.py).
    import simbatch.workload

    def drawn(*args, **kwargs):
        raise AssertionError("the workload was drawn before the guard refused the run")

    monkeypatch.setattr(simbatch.workload, "generate", drawn)
    monkeypatch.chdir(tmp_path)
    result = invoke("run", SCENARIOS / "oversubscribed.yaml", "--set", "workload.num_requests=1000000000")
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("run too large: about 1,000,000,000 requests") and result.stdout == ""
    assert not (tmp_path / "results").exists()


def test_a_billion_laughs_is_refused_in_one_line(tmp_path):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    (tmp_path / "laughs.yaml").write_text("\n".join(lines) + "\n")
    done = subprocess.run([str(SIMBATCH), "run", "laughs.yaml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert "expands to more than 100,000 values" in done.stderr and len(done.stderr.splitlines()) == 1

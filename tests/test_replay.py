"""``simbatch replay``: a ``vllm bench serve`` run simulated beside what it measured (simbatch/app/replay.py).

Runs on every fixture with per-request arrays; the arrivals are drawn as the client of the file's
release drew them; the table is compare's, with the signed error per metric.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from test_bench_result import BASE, FIXTURES
from test_cli import invoke

from simbatch.model import streams
from simbatch.workload.bench_client import client_arrivals, requests_of
from simbatch.workload.bench_result import read

DETAILED = [p for p in sorted(FIXTURES.glob("*.json")) if read(p).requests is not None]
DEVICE = ["--set", "device.tau0_ms=10", "--set", "device.beta_ms=0.05", "--set", "device.prefill_ms_per_token=0.02"]


def _cells(stdout: str, label: str) -> list[str]:
    line = next(line for line in stdout.splitlines() if line.startswith(label))
    return line[34:].split()


def test_vllms_client_draws_arrivals_as_its_release_did():
    rng = streams.rng(0, streams.ARRIVALS)
    new = client_arrivals(4.0, 1.0, 1000, rng, rescaled=True)
    assert new[-1] == pytest.approx(1000 / 4.0, rel=1e-12) and new[0] > 0  # the first waits its own gap
    old = client_arrivals(4.0, 1.0, 1000, rng, rescaled=False)
    assert old[0] == 0 and np.all(np.diff(old) > 0) and old[-1] != pytest.approx(250, rel=1e-3)
    gaps = np.diff(client_arrivals(4.0, 0.25, 20_000, rng, rescaled=False))
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.05)  # CV = 1 / sqrt(burstiness)
    assert np.allclose(np.diff(client_arrivals(2.0, math.inf, 5, rng, rescaled=False)), 0.5)
    assert not client_arrivals(math.inf, 1.0, 7, rng, rescaled=True).any()


@pytest.mark.parametrize("path", DETAILED, ids=lambda p: p.stem)
def test_replay_runs_on_every_detailed_fixture(path):
    result = invoke("replay", path, *DEVICE, "--quiet")
    assert result.exit_code == 0, result.stderr
    r = read(path)
    assert f"requests: the file's {len(r.requests)} requests in send order" in result.stdout
    assert "measured     simulated    error" in result.stdout
    if "mean_tpot_ms" in r.summary:
        measured, simulated, error = _cells(result.stdout, "Mean TPOT (ms)")
        expected = 100 * (float(simulated.replace(",", "")) / float(measured.replace(",", "")) - 1)
        assert float(error.rstrip("%")) == pytest.approx(expected, abs=0.2)  # signed, of the printed values


def test_the_table_compares_the_same_requests():
    """vLLM averaged in 379 zeros (requests that streamed nothing); the replay recomputes the measured TTFT
    over the 621 others, and the simulated one over the same requests."""
    path = FIXTURES / "dstack_llama-3.1-405b-fp8_8xh100-tp8_v0.6.3_rate16.json"
    result = invoke("replay", path, *DEVICE, "--quiet")
    assert result.exit_code == 0, result.stderr
    ttfts = np.array(json.loads(path.read_text())["ttfts"])
    assert _cells(result.stdout, "Mean TTFT (ms)")[0] == f"{1e3 * ttfts[ttfts > 0].mean():,.1f}"
    assert "over the 621 requests that streamed a token" in result.stdout
    assert "redrawn at 16 req/s, Poisson, the first at t = 0, unrescaled (benchmark_serving.py's way)" in result.stdout


def test_chunked_streaming_is_said():
    result = invoke("replay", FIXTURES / "lambda_llama-3.1-8b-fp8_h100_v0.5.4-or-0.6.0_chunked.json", *DEVICE,
                    "--quiet")
    assert result.exit_code == 0 and "the measured ITL is a streamed chunk's gap (8.4 x TPOT" in result.stdout
    assert "3 with 0 tokens replayed with 1" in result.stdout


def test_summary_only_files_replay_their_mean_lengths_and_client():
    path = FIXTURES / "er0080_opt-125m_v0.25.1_conc2.json"
    result = invoke("replay", path, *DEVICE, "--quiet")
    assert result.exit_code == 0, result.stderr
    assert "8 requests of the file's mean lengths, 32 in / 16 out" in result.stdout
    assert "client: max_concurrency 2 (the file's)" in result.stdout and "P99 E2EL (ms)" in result.stdout
    assert "device tau0_ms 10, beta_ms 0.05, prefill_ms_per_token 0.02 (given)" in result.stdout
    assert "batching.max_num_seqs 64 (default)" in result.stdout
    result = invoke("replay", FIXTURES / "tsho_gemma-4-31b_2xa100-tp2_2026-04_rate1.json", *DEVICE, "--quiet")
    assert result.exit_code == 0, result.stderr
    assert "rescaled so the last is sent at N/rate = 1,000.0 s (vllm bench serve's way)" in result.stdout


def test_recorded_send_times_are_replayed(tmp_path):
    """vLLM 0.19's start_times (perf_counter seconds): the requests are sent at those offsets."""
    starts = [1000.0, 1000.5, 1001.25, 1003.0]
    record = {**BASE, "completed": 4, "input_lens": [10, 20, 30, 40], "output_lens": [5, 6, 7, 8],
              "ttfts": [0.01] * 4, "start_times": starts, "endpoint_type": "openai"}
    (tmp_path / "r.json").write_text(json.dumps(record))
    rebuilt = requests_of(read(tmp_path / "r.json"), streams.rng(0, 0))
    assert np.allclose(rebuilt.arrival_s, np.array(starts) - 1000.0)
    result = invoke("replay", tmp_path / "r.json", *DEVICE, "--quiet")
    assert result.exit_code == 0 and "send times as recorded (start_times)" in result.stdout, result.stderr


def test_a_file_without_lengths_needs_a_scenario(tmp_path):
    path = FIXTURES / "nvaction_llama-3-8b_ascend_rate1_latency-only.json"
    result = invoke("replay", path, *DEVICE)
    assert result.exit_code == 2 and "latency-only, no lengths" in result.stderr and result.stderr.count("\n") == 1
    (tmp_path / "s.yaml").write_text("workload:\n  prompt_tokens: {dist: sharegpt}\n  output_tokens: {dist: sharegpt}\n")
    result = invoke("replay", path, "--scenario", tmp_path / "s.yaml", *DEVICE, "--quiet")
    assert result.exit_code == 0, result.stderr
    assert "200 requests, lengths from the scenario" in result.stdout
    assert re.search(r"Mean TTFT \(ms\)\s+111\.2", result.stdout)  # measured, beside the simulated


def test_bad_replay_input_is_one_line(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({**BASE, "mean_ttft_ms": -1.0}))
    for args in (["replay", tmp_path / "bad.json"], ["replay", tmp_path / "missing.json"],
                 ["replay", FIXTURES / "er0080_opt-125m_v0.25.1_conc2.json", "--set", "device.tau0_ms=-1"]):
        result = invoke(*args)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr

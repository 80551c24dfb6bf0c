"""Reading ``vllm bench serve --save-result`` files of every release (simbatch/workload/bench_result.py).

The fixtures are real files from public repositories (tests/fixtures/vllm_results/README.md): every
one is read, and ``compare`` accepts it or refuses it in one line. Hostile files are refused in one
line naming the file, the key and the value.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_cli import invoke

from simbatch.workload.bench_result import MAX_BYTES, BenchResultError, labels, read

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm_results"
ALL = sorted(FIXTURES.glob("*.json"))
LAMBDA = FIXTURES / "lambda_llama-3.1-8b-fp8_h100_v0.5.4-or-0.6.0_chunked.json"


def test_the_fixtures_span_releases():
    """At least 8 files from at least 4 releases' key sets (README: the versions)."""
    results = [read(p) for p in ALL]
    assert len(results) >= 8
    assert {r.client for r in results} == {"benchmark_serving.py", "vllm bench serve"}
    readme = (FIXTURES / "README.md").read_text(encoding="utf-8")
    assert all(p.name in readme for p in ALL), "every fixture has its row (source, commit, version) in the README"


def test_old_keys_are_read_under_todays_names():
    r = read(LAMBDA)
    assert r.client == "benchmark_serving.py" and r.request_rate == math.inf
    assert r.renamed["mean_latency_ms"] == "mean_e2el_ms" and r.summary["mean_e2el_ms"] == pytest.approx(290.353, 1e-5)
    raw = json.loads(LAMBDA.read_text())
    assert r.summary["total_token_throughput"] == raw["input_throughput"] + raw["output_throughput"]
    assert r.requests is not None and len(r.requests) == 10
    # About ten tokens per streamed chunk: (120 + 194 + 40 + 6 + 80 - 5) / 45 gaps.
    assert r.requests.tokens_per_chunk() == pytest.approx(9.667, abs=1e-3)
    assert any("3 of 10 requests" in n and "streamed no token" in n for n in r.notes)


def test_todays_keys_and_spec_decode():
    r = read(FIXTURES / "er0080_qwen3.8-27b-fp8_2xrtx3090-tp2_v0.25.1_specdecode.json")
    assert r.client == "vllm bench serve" and r.max_concurrency == 2 and r.spec_decode
    assert r.summary["spec_decode_acceptance_rate"] == pytest.approx(72.037, 1e-4)  # percent, as vLLM writes it
    assert r.summary["spec_decode_acceptance_length"] == pytest.approx(1 + 2723 / 1260)
    assert r.percentiles == (99.0,) and r.percentile_metrics == ("ttft", "tpot", "itl")


def test_damage_is_noted_and_placeholders_dropped():
    failed = read(FIXTURES / "er0080_opt-125m_v0.25.1_all-failed.json")
    assert "mean_ttft_ms" not in failed.summary and "no request completed (8 failed)" in failed.notes[0]
    partial = read(FIXTURES / "nerdalert_llama-3.1-8b_h100_v0.8.3_rateinf_1015-of-2000.json")
    assert partial.renamed == {"request_goodput:": "request_goodput"} or "request_goodput:" not in partial.renamed
    assert "985 of 2000 prompts neither completed nor counted as failed" in partial.notes[0]
    latency = read(FIXTURES / "nvaction_llama-3-8b_ascend_rate1_latency-only.json")
    assert latency.latency_only and latency.kind() == "latency-only"
    with pytest.raises(BenchResultError, match="latency-only: no duration"):
        latency.require(("duration", "completed"), "calibrate needs")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(text)
    return path


BASE = {"duration": 10.0, "completed": 5, "total_input_tokens": 50, "total_output_tokens": 50,
        "request_throughput": 0.5, "mean_ttft_ms": 20.0, "mean_tpot_ms": 5.0, "request_rate": 1.0}


@pytest.mark.parametrize(("text", "says"), [
    (json.dumps(BASE).replace("20.0", "NaN"), "key 'mean_ttft_ms' is nan: NaN is no measurement"),
    (json.dumps(BASE).replace("20.0", "Infinity"), "key 'mean_ttft_ms' is inf: an infinity"),
    (json.dumps(BASE).replace("20.0", '"20 ms"'), "key 'mean_ttft_ms' is '20 ms': expected a number"),
    (json.dumps(BASE).replace("20.0", "1e308"), "beyond 1e+15"),
    (json.dumps(BASE).replace("20.0", "-45.5"), "a negative value cannot be measured"),
    (json.dumps(BASE).replace('"completed": 5', '"completed": true'), "key 'completed' is True: expected a number"),
    (json.dumps(BASE).replace('"completed": 5', '"completed": 5.5'), "expected a whole number"),
    (json.dumps({**BASE, "input_lens": [1, 2], "output_lens": [1, 2, 3]}), "ragged"),
    (json.dumps({**BASE, "input_lens": [1, 2], "output_lens": [1, 2], "itls": [[0.1]]}), "ragged"),
    (json.dumps({**BASE, "input_lens": [1, "2"], "output_lens": [1, 2]}), "key 'input_lens[1]' is '2'"),
    (json.dumps({**BASE, "ttfts": [0.1]}), "per-request arrays without input_lens"),
    ("[" * 100_000 + "]" * 100_000, "nested deeper"),
    ("[1, 2]", "a JSON list, not an object"),
    ("{", "not JSON"),
    (json.dumps({**BASE, "request_rate": 0}), "a rate of 0 sends nothing"),
    (json.dumps({**BASE, "spec_decode_acceptance_rate": 140.0}), "a percentage is at most 100"),
])
def test_hostile_files_are_one_line(tmp_path, text, says):
    path = _write(tmp_path, text)
    with pytest.raises(BenchResultError) as info:
        read(path)
    message = str(info.value)
    assert says in message and str(path) in message and "\n" not in message, message
    # The CLI readers say the same, in one line, exit 2.
    result = invoke("calibrate", path, path)
    assert result.exit_code == 2 and says in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_a_huge_file_is_refused_unread(tmp_path):
    path = tmp_path / "huge.json"
    with path.open("wb") as f:
        f.truncate(2 * 2**30)  # 2 GB, sparse: nothing is written, and nothing must be read
    with pytest.raises(BenchResultError, match=f"above the {MAX_BYTES // 2**20} MiB"):
        read(path)


def test_infinity_means_something_for_the_rate_only(tmp_path):
    r = read(_write(tmp_path, json.dumps({**BASE, "request_rate": "inf", "burstiness": 1.0})))
    assert r.request_rate == math.inf and r.rate_text() == "inf"
    assert read(_write(tmp_path, json.dumps(BASE).replace('"request_rate": 1.0', '"burstiness": Infinity'))).burstiness \
        == math.inf


def test_labels_name_the_file_or_its_path_when_two_share_a_name(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "run.json").write_text(json.dumps(BASE))
    (tmp_path / "other.json").write_text(json.dumps(BASE))
    results = [read(p) for p in (tmp_path / "a" / "run.json", tmp_path / "b" / "run.json", tmp_path / "other.json")]
    assert list(labels(results).values()) == [str(tmp_path / "a" / "run.json"), str(tmp_path / "b" / "run.json"),
                                              "other.json"]


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_compare_accepts_every_fixture_or_refuses_in_one_line(tmp_path, path):
    result = invoke("compare", path, LAMBDA, "--no-plots", "--out", tmp_path / "c")
    if result.exit_code == 2:
        assert result.stderr.count("\n") == 1, result.stderr
    else:
        assert result.exit_code == 0, result.stderr
        assert "Mean TTFT (ms)" in result.stdout or "Mean TPOT (ms)" in result.stdout
        if read(path).latency_only:
            assert "latency-only" in result.stderr and "no throughput rows" in result.stderr

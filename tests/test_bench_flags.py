"""``vllm bench serve``'s flags on ``simbatch run``: each sets its scenario key, with vLLM's meaning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from simbatch.analysis.stats import percentile_word
from simbatch.app.cli import app

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def test_flags_set_the_scenario_and_the_summary_follows_vllms_names(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "run", str(SCENARIOS / "stable.yaml"), "--request-rate", "5", "--burstiness", "0.5", "--num-prompts", "60",
        "--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,95,99.9", "--goodput", "ttft:45 e2el:14000",
        "--goodput", "tpot:30", "--no-plots", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    config = json.loads((out / "resolved_config.json").read_text())
    assert config["workload"]["arrival"] == {"process": "gamma", "rate": 5.0, "burstiness": 0.5, "rate_curve": None}
    assert config["workload"]["num_requests"] == 60
    assert config["metrics"] == {"percentile_metrics": ["ttft", "itl"], "metric_percentiles": [50.0, 95.0, 99.9]}
    assert config["slo"] == {"ttft_ms": 45.0, "tpot_ms": 30.0, "e2el_ms": 14000.0}

    summary = json.loads((out / "summary.json").read_text())
    requests = pd.read_csv(out / "requests.csv")
    done = requests[requests["status"] == "finished"]
    for p in (50, 95, 99.9):
        assert summary[f"{percentile_word(p)}_ttft_ms"] == pytest.approx(np.percentile(1e3 * done["ttft_s"], p))
        assert f"{percentile_word(p)}_itl_ms" in summary and f"{percentile_word(p)}_tpot_ms" not in summary
    assert "p99.9_ttft_ms" in summary and "p95_e2el_ms" not in summary
    good = (done["ttft_s"] * 1e3 <= 45) & (done["tpot_s"].isna() | (done["tpot_s"] * 1e3 <= 30)) & \
        (done["e2e_s"] * 1e3 <= 14000)
    assert 0 < good.sum() < len(done)
    assert summary["request_goodput"] == pytest.approx(good.sum() / summary["duration"])
    # The table shows the chosen latencies with the chosen percentiles, as vLLM prints them.
    assert "P99.9 TTFT (ms):" in result.stdout and "P95 ITL (ms):" in result.stdout
    assert "TPOT (ms):" not in result.stdout and "Request goodput (req/s):" in result.stdout


@pytest.mark.parametrize(("args", "words"), [
    (["--request-rate", "-1"], "--request-rate -1: expected a positive number"),
    (["--goodput", "ttft"], "--goodput ttft: expected METRIC:MS"),
    (["--goodput", "itl:5"], "--goodput itl:5: expected METRIC:MS"),
    (["--percentile-metrics", "ttft,latency"], "'latency' is not one of ttft, tpot, itl, e2el"),
    (["--metric-percentiles", "abc"], "--metric-percentiles abc: expected a positive number"),
    (["--max-concurrency", "0"], "workload.max_concurrency"),
    (["--burstiness", "0"], "workload.arrival.burstiness"),
])
def test_bad_flags_are_one_line_and_write_nothing(tmp_path, args, words):
    result = CliRunner().invoke(app, ["run", str(SCENARIOS / "stable.yaml"), *args, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and words in result.stderr, result.stderr
    assert not (tmp_path / "x").exists()


def test_percentile_word_is_vllms():
    assert [percentile_word(p) for p in (99, 99.0, 99.9, 50, 99.99)] == ["p99", "p99", "p99.9", "p50", "p99.99"]


def test_concepts_maps_every_vllm_flag():
    """docs/concepts.md's table names every flag of simbatch.app.cli.bench_flags, and vLLM's dataset flags."""
    import re

    from simbatch.app.cli import bench_flags

    text = (Path(__file__).resolve().parent.parent / "docs" / "concepts.md").read_text(encoding="utf-8")
    table = text[text.index("## From `vllm bench serve` to simbatch"):]
    flags = set(re.findall(r'"(--[a-z-]+)"', Path(bench_flags.__file__).read_text(encoding="utf-8")))
    assert len(flags) == 7
    dataset = {"--dataset-name random", "--random-input-len", "--random-output-len", "--random-range-ratio",
               "--dataset-name sharegpt", "--save-result", "--seed"}
    assert not [f for f in flags | dataset if f not in table]

"""``simbatch compare``: variants of any key on the same requests, and existing runs side by side.

The "must show" of issue 16: ``--vary`` over the scenario library, and ``simbatch compare
results/a results/b`` (with a ``vllm bench serve --save-result`` file as a third column).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from simbatch.app.cli import app
from simbatch.app.compare import CompareInputError, variants

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
LIBRARY = sorted(SCENARIOS.glob("*.yaml"))


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def header(text: str) -> list[str]:
    return next(ln for ln in text.splitlines() if ln.startswith(" " * 34) and ln.strip()).split()


def row(text: str, label: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith(label))
    return line[34:].split()


@pytest.mark.parametrize("scenario", LIBRARY, ids=lambda p: p.stem)
def test_vary_any_key_on_every_library_scenario_sees_the_same_requests(tmp_path, scenario):
    out = tmp_path / "cmp"
    result = invoke("compare", scenario, "--vary", "scheduler.policy=fcfs,sjf", "--set", "workload.num_requests=30",
                    "--no-plots", "--quiet", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert {p.name for p in out.iterdir()} == {"scenario.yaml", "run.json", "summary.json", "policy=fcfs",
                                               "policy=sjf"}
    a, b = (pd.read_csv(out / label / "requests.csv") for label in ("policy=fcfs", "policy=sjf"))
    for column in ("request_id", "prompt_tokens", "output_tokens", "tenant"):
        assert a[column].equals(b[column])
    configs = {label: json.loads((out / label / "resolved_config.json").read_text())
               for label in ("policy=fcfs", "policy=sjf")}
    assert [configs[k]["scheduler"]["policy"] for k in ("policy=fcfs", "policy=sjf")] == ["fcfs", "sjf"]


def test_vary_prints_a_column_per_value_and_the_policies_differ(tmp_path):
    out = tmp_path / "cmp"
    result = invoke("compare", SCENARIOS / "heavy_tail.yaml", "--vary", "scheduler.policy=fcfs,sjf",
                    "--variant", "scheduler.policy=sjf;batching.max_num_seqs=4", "--set", "batching.max_num_seqs=8",
                    "--set", "scheduler.sjf_key=output", "--no-plots", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert header(result.stdout) == ["policy=fcfs", "policy=sjf", "policy=sjf,max_num_seqs=4"]
    fcfs, sjf, fewer_slots = (float(v.replace(",", "")) for v in row(result.stdout, "Mean TTFT (ms)"))
    assert sjf < fcfs / 2 and fewer_slots > sjf  # shortest job first cuts the mean wait; fewer slots raise it
    assert not (out / "plots").exists()


def test_vary_product_and_modes(tmp_path):
    result = invoke("compare", SCENARIOS / "heavy_tail.yaml", "--vary", "scheduler.policy=fcfs,sjf",
                    "--modes", "static,continuous", "--set", "workload.num_requests=20", "--no-plots",
                    "--out", tmp_path / "c")
    assert result.exit_code == 0, result.stderr
    assert header(result.stdout) == ["policy=fcfs,mode=static", "policy=fcfs,mode=continuous",
                                     "policy=sjf,mode=static", "policy=sjf,mode=continuous"]


def test_compare_existing_runs_and_a_vllm_result(tmp_path):
    for name, rate in (("a", "2"), ("b", "3")):
        result = invoke("run", SCENARIOS / "stable.yaml", "--request-rate", rate, "--set", "workload.duration_s=10",
                        "--no-plots", "--quiet", "--out", tmp_path / name)
        assert result.exit_code == 0, result.stderr
    measured = {"duration": 12.5, "completed": 25, "total_input_tokens": 800, "total_output_tokens": 12500,
                "request_throughput": 2.0, "output_throughput": 1000.0, "total_token_throughput": 1064.0,
                "mean_ttft_ms": 55.5, "p99_ttft_ms": 80.0, "ttfts": [0.05] * 25, "input_lens": [32] * 25,
                "output_lens": [500] * 25, "backend": "vllm"}
    (tmp_path / "bench.json").write_text(json.dumps(measured))
    out = tmp_path / "side"
    result = invoke("compare", tmp_path / "a", tmp_path / "b", tmp_path / "bench.json", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert header(result.stdout) == ["stable/a", "stable/b", "bench"]  # one scenario: its name and the folder
    summaries = {k: json.loads((tmp_path / k / "summary.json").read_text()) for k in ("a", "b")}
    ttft = row(result.stdout, "Mean TTFT (ms)")
    assert ttft[:2] == [f"{summaries[k]['mean_ttft_ms']:.1f}" for k in ("a", "b")] and ttft[2] == "55.5"
    assert row(result.stdout, "Mean batch size (seqs/step)")[2] == "n/a"  # a measured run has no engine steps
    assert json.loads((out / "summary.json").read_text())["bench"]["mean_ttft_ms"] == 55.5
    assert json.loads((out / "sources.json").read_text())["stable/a"] == str(tmp_path / "a")
    assert {"ttft_cdf.png", "running_waiting.png"} <= {p.name for p in (out / "plots").iterdir()}


@pytest.mark.parametrize(("args", "words"), [
    (["--vary", "scheduler.policy"], "--vary scheduler.policy: expected KEY=A,B,C"),
    (["--vary", "scheduler.policy=fcfs,fcfs"], "listed twice"),
    (["--variant", "scheduler.policy"], "expected KEY=VALUE;KEY=VALUE"),
    (["--vary", "scheduler.policy=fcfs,bogus"], "scheduler.policy"),
    (["--goodput", "ttft=5"], "--goodput ttft=5: expected METRIC:MS"),
    (["--metric-percentiles", "99,100"], "metrics.metric_percentiles"),
])
def test_bad_variants_are_one_line_and_write_nothing(tmp_path, args, words):
    result = invoke("compare", SCENARIOS / "heavy_tail.yaml", *args, "--out", tmp_path / "x")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and words in result.stderr, result.stderr
    assert not (tmp_path / "x").exists()


def test_bad_sources_are_one_line_and_write_nothing(tmp_path):
    (tmp_path / "not_vllm.json").write_text(json.dumps({"completed": 3}))
    (tmp_path / "empty").mkdir()
    for sources, words in (([tmp_path / "empty", tmp_path / "not_vllm.json"], "not a result folder"),
                           ([tmp_path / "not_vllm.json", tmp_path / "not_vllm.json"], "lacks duration"),
                           ([tmp_path / "nowhere", tmp_path / "empty"], "no such file or folder"),
                           ([tmp_path / "empty"], "give one scenario file, or two or more"),
                           ([SCENARIOS / "stable.yaml", SCENARIOS / "bursty.yaml"], "give one scenario file")):
        result = invoke("compare", *sources, "--out", tmp_path / "x")
        assert result.exit_code == 2 and result.stderr.count("\n") == 1 and words in result.stderr, result.stderr
    result = invoke("compare", tmp_path / "empty", tmp_path / "empty", "--vary", "seed=1,2", "--out", tmp_path / "x")
    assert result.exit_code == 2 and "--vary: applies to a scenario" in result.stderr
    result = invoke("compare", tmp_path / "empty", tmp_path / "empty", "--request-rate", "3", "--out", tmp_path / "x")
    assert result.exit_code == 2 and "a vllm bench serve flag: applies to a scenario" in result.stderr
    assert not (tmp_path / "x").exists()


def test_variant_labels():
    assert list(variants(["a.b=1,2"], [])) == ["b=1", "b=2"]
    assert list(variants(["a.b=1,2", "c.d=x"], ["a.b=3;c.d=y"])) == ["b=1,d=x", "b=2,d=x", "b=3,d=y"]
    with pytest.raises(CompareInputError, match="same column"):
        variants(["a.b=1"], ["a.b=1"])


def test_per_tenant_and_per_replica_rows_are_kept(tmp_path):
    result = invoke("compare", SCENARIOS / "priority_tiers.yaml", "--vary", "scheduler.policy=fcfs,priority",
                    "--set", "workload.duration_s=10", "--set", "cluster.replicas=2", "--no-plots", "--out",
                    tmp_path / "c")
    assert result.exit_code == 0, result.stderr
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())["policy=fcfs"]
    for label, key in (("interactive: mean TTFT (ms)", "tenant_interactive_mean_ttft_ms"),
                       ("batch: req/s", "tenant_batch_request_throughput"),
                       ("replica 1: output (tok/s)", "replica_1_output_throughput")):
        assert row(result.stdout, label)[0] == f"{summary[key]:,.{1 if 'TTFT' in label or 'tok' in label else 2}f}"
    # A sweep's summary.csv gets the same keys as columns: its runs are summarized alike.
    from simbatch.app.sweep.runner import simulate_run
    from simbatch.inputs.loading import load_scenario

    record = simulate_run(load_scenario(SCENARIOS / "priority_tiers.yaml",
                                        ["workload.duration_s=10", "cluster.replicas=2"]))
    assert {"tenant_interactive_p99_ttft_ms", "tenant_batch_mean_e2el_ms", "replica_0_L"} <= set(record["summary"])


def test_client_wait_has_its_rows(tmp_path):
    result = invoke("compare", SCENARIOS / "stable.yaml", "--vary", "workload.max_concurrency=4,16", "--set",
                    "workload.duration_s=20", "--no-plots", "--out", tmp_path / "c")
    assert result.exit_code == 0, result.stderr
    few, many = (float(v.replace(",", "")) for v in row(result.stdout, "Mean client wait (ms)"))
    assert few > many >= 0  # four slots hold more back than sixteen

"""The ``simbatch`` command end to end: what it prints, in what order, and the folder it writes.

Commands run in-process through typer's CliRunner (stdout and stderr apart). The two "must show"
runs of issue 3 run at full size: the chapter's oversubscribed example (5.1×) and the heavy-tail
comparison (continuous ahead of static); everything else is cut short with ``--set``.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from simbatch import __version__
from simbatch.app import plots, results
from simbatch.app.cli import app
from simbatch.app.cli.common import progress
from simbatch.config import Scenario
from simbatch.inputs.loading import load_scenario

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"
PNG = b"\x89PNG\r\n\x1a\n"

VLLM_KEYS = ("duration", "completed", "num_requests", "request_throughput", "output_throughput",
             "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
             "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
             "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms")
RUN_FILES = {"scenario.yaml", "run.json", "resolved_config.json", "summary.json", "requests.csv", "iterations.csv",
             "stall_gaps.csv",
             "plots", "report.html"}
RUN_PLOTS = {"output_throughput.png", "running_waiting.png", "kv_usage.png", "batch_size.png", "ttft_cdf.png",
             "e2e_histogram.png"}
COMPARE_PLOTS = {"batch_size.png", "cumulative_output_tokens.png", "running_waiting.png", "ttft_cdf.png",
                 "latency_by_request.png"}


def invoke(*args: str | Path):
    """Run ``simbatch ARGS`` in-process; the result has exit_code, stdout and stderr."""
    return CliRunner().invoke(app, [str(a) for a in args])


def table_value(text: str, label: str) -> float:
    """The number printed after ``label`` in a result table line."""
    line = next(ln for ln in text.splitlines() if ln.startswith(label))
    return float(line[len(label):].split()[0].replace(",", ""))


def compare_row(text: str, label: str) -> list[float]:
    """The per-mode numbers of one row of the compare table."""
    line = next(ln for ln in text.splitlines() if ln.startswith(label))
    return [float(v.replace(",", "")) for v in line[len(label):].split()]


def write_scenario(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------ basics
def test_version_and_help():
    assert invoke("--version").stdout.strip() == f"simbatch {__version__}"
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("run", "compare", "validate", "schema", "capacity"):
        assert command in result.stdout
    run_help = invoke("run", "--help").stdout
    for option in ("--mode", "--set", "--seed", "--out", "--quiet"):
        assert option in run_help


def test_schema_is_the_scenario_json_schema():
    result = invoke("schema")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert {"workload", "device", "kv_cache", "batching", "scheduler", "cluster", "slo", "sim"} <= set(
        schema["properties"])
    assert schema["additionalProperties"] is False  # unknown keys are errors, and editors say so


def test_validate_checks_without_running(tmp_path):
    result = invoke("validate", SCENARIOS / "oversubscribed.yaml")
    assert result.exit_code == 0, result.stderr
    assert "OK" in result.stdout and "oversubscribed 5.1" in result.stdout
    assert not (REPO / "results" / "validate").exists()


# ------------------------------------------------------------------------------------------ run
def test_run_oversubscribed_prints_the_story_in_order_and_writes_the_folder(tmp_path):
    out = tmp_path / "run"
    result = invoke("run", SCENARIOS / "oversubscribed.yaml", "--out", out)
    assert result.exit_code == 0, result.stderr
    text = result.stdout

    # The stability check comes first and carries the chapter's numbers.
    order = [text.index(s) for s in ("Stability check", "Serving Benchmark Result",
                                     "L (time-averaged, from engine state)", f"Results written to {out}")]
    assert order == sorted(order)
    verdict = next(ln for ln in text.splitlines() if ln.startswith("Verdict:"))
    factor = float(re.search(r"oversubscribed (\d+\.\d)", verdict).group(1))
    assert factor == pytest.approx(5.1, abs=0.1)
    assert table_value(text, "Offered token load λ·E[out] (tok/s):") == 10_000
    assert table_value(text, "Capacity B/τ(B) at B = 64 (tok/s):") == pytest.approx(1951.22)
    assert table_value(text, "Concurrency demanded L = λ·W_B:") == pytest.approx(328.0)
    assert table_value(text, "Slots available (64 × 1 replica):") == 64
    for label in ("Successful requests:", "Rejected requests:", "Benchmark duration (s):",
                  "Request throughput (req/s):", "Output token throughput (tok/s):",
                  "Total Token throughput (tok/s):", "Mean TTFT (ms):", "Median TTFT (ms):", "P99 TTFT (ms):",
                  "Mean TPOT (ms):", "P99 ITL (ms):", "Mean E2EL (ms):"):
        assert label in text

    # The folder: every file, the effective scenario, the vLLM keys, one row per request.
    assert {p.name for p in out.iterdir()} == RUN_FILES
    assert {p.name for p in (out / "plots").iterdir()} == RUN_PLOTS
    assert all((out / "plots" / name).read_bytes().startswith(PNG) for name in RUN_PLOTS)
    assert load_scenario(out / "scenario.yaml").model_dump() == load_scenario(SCENARIOS / "oversubscribed.yaml").model_dump()
    resolved = json.loads((out / "resolved_config.json").read_text())
    assert resolved == load_scenario(SCENARIOS / "oversubscribed.yaml").model_dump(mode="json")
    summary = json.loads((out / "summary.json").read_text())
    assert set(VLLM_KEYS) <= set(summary)
    assert summary["stability"]["offered_load"] == pytest.approx(5.125)
    assert summary["stability"]["stable"] is False
    requests = pd.read_csv(out / "requests.csv")
    assert len(requests) == summary["num_requests"] == summary["completed"]
    assert table_value(text, "Successful requests:") == summary["completed"]

    # Queue growth and latency inflation: latency is many times the unloaded one, and the waiting
    # queue peaks in the hundreds when arrivals stop.
    assert summary["mean_e2el_ms"] / 1e3 > 5 * summary["stability"]["full_batch_latency_s"]
    iterations = pd.read_csv(out / "iterations.csv")
    assert iterations["num_waiting"].max() > 500

    # Little's law line: L from the engine's state against lambda*W from the rows.
    line = next(ln for ln in text.splitlines() if ln.startswith("L (time-averaged"))
    m = re.fullmatch(r"L \(time-averaged, from engine state\) = ([\d,.]+); λ·W \(from request rows\) = "
                     r"([\d,.]+); difference ([\d.]+) %", line)
    l_state, lam_w, diff = (float(g.replace(",", "")) for g in m.groups())
    assert l_state == pytest.approx(summary["L"], rel=1e-3)
    assert lam_w == pytest.approx(summary["arrival_rate"] * summary["W_s"], rel=1e-3)
    assert diff < 1e-3


def test_quiet_run_with_mode_and_seed_into_an_empty_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "parquet_available", lambda: False)
    out = tmp_path / "empty"
    out.mkdir()  # an empty --out is used, not refused
    result = invoke("run", SCENARIOS / "stable.yaml", "--set", "workload.num_requests=12", "--mode", "static",
                    "--seed", "7", "--out", out, "--quiet")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == str(out) and result.stderr == ""
    # --mode and --seed are scenario overrides, validated and recorded like --set.
    resolved = json.loads((out / "resolved_config.json").read_text())
    assert resolved["batching"]["mode"] == "static" and resolved["seed"] == 7
    assert resolved["workload"]["num_requests"] == 12
    assert json.loads((out / "summary.json").read_text())["mode"] == "static"
    assert {p.name for p in out.iterdir()} == RUN_FILES  # no Parquet without pyarrow


def test_default_folder_is_results_name_timestamp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # --no-plots: the folder's name is the point here (plots cost a second; the other runs here draw them).
    result = invoke("run", SCENARIOS / "stable.yaml", "--set", "workload.num_requests=5", "-q", "--no-plots")
    assert result.exit_code == 0, result.stderr
    folder = Path(result.stdout.strip())
    assert re.fullmatch(r"results/stable/\d{8}-\d{6}", folder.as_posix())
    assert (tmp_path / folder / "summary.json").is_file()
    # A second folder in the same second gets a suffix instead of overwriting the first.
    again = results.default_folder("stable", root=tmp_path / "results")
    assert again.parent == tmp_path / "results" / "stable" and again != tmp_path / folder


@pytest.mark.parametrize("occupant", ["file", "folder"])
def test_existing_out_is_refused_before_running(tmp_path, occupant):
    out = tmp_path / "taken"
    if occupant == "file":
        out.write_text("keep me")
    else:
        out.mkdir()
        (out / "old.txt").write_text("keep me")
    result = invoke("run", SCENARIOS / "stable.yaml", "--out", out)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "--out" in result.stderr and "choose a new folder" in result.stderr
    assert (out.read_text() if occupant == "file" else (out / "old.txt").read_text()) == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_unwritable_out_is_one_line_and_exit_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = invoke("run", SCENARIOS / "stable.yaml", "--out", blocker / "sub" / "run")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "not a writable folder" in result.stderr


# ------------------------------------------------------------------------------------------ folder
def test_parquet_twins_when_pyarrow_is_importable(tmp_path, monkeypatch):
    written: list[str] = []
    monkeypatch.setattr(pd.DataFrame, "to_parquet", lambda self, path, **kw: written.append(Path(path).name)
                        or Path(path).write_bytes(b"PAR1"))
    monkeypatch.setattr(results, "parquet_available", lambda: True)
    out = tmp_path / "with"
    assert invoke("run", SCENARIOS / "stable.yaml", "--set", "workload.num_requests=5", "-q", "--no-plots",
                  "--out", out).exit_code == 0  # the frames' twins only: no plots needed
    assert sorted(written) == ["iterations.parquet", "requests.parquet", "stall_gaps.parquet"]
    assert {p.name for p in out.glob("*.parquet")} == set(written)


@pytest.mark.parametrize("failure", [RuntimeError("plotting crashed"), OSError(28, "No space left on device")])
def test_a_failure_mid_write_leaves_no_folder(tmp_path, monkeypatch, failure):
    def broken(folder, result):
        (folder / "half_written.png").write_bytes(PNG)
        raise failure

    monkeypatch.setattr(plots, "save_run_plots", broken)
    out = tmp_path / "results" / "run"
    result = invoke("run", SCENARIOS / "stable.yaml", "--set", "workload.num_requests=5", "--out", out, "-q")
    assert result.exit_code != 0
    assert not out.exists()
    assert list(out.parent.iterdir()) == []  # the temporary sibling is gone too
    if isinstance(failure, OSError):  # a write error is reported like bad input, in one line
        assert result.exit_code == 2 and "No space left on device" in result.stderr
        assert result.stderr.count("\n") == 1


def test_progress_bar_only_on_a_terminal(monkeypatch):
    with progress("x", 10, quiet=False) as callback:
        assert callback is None  # CliRunner's stderr is not a terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with progress("x", 10, quiet=True) as callback:
        assert callback is None
    with progress("x", 10, quiet=False) as callback:
        callback(1.5, 4)


# ------------------------------------------------------------------------------------------ compare
def test_compare_heavy_tail_continuous_beats_static(tmp_path):
    out = tmp_path / "cmp"
    result = invoke("compare", SCENARIOS / "heavy_tail.yaml", "--modes", "static,continuous", "--out", out)
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    header = next(ln for ln in text.splitlines() if "static" in ln and "continuous" in ln)
    assert header.split() == ["static", "continuous"]
    static_tput, continuous_tput = compare_row(text, "Output token throughput (tok/s)")
    assert continuous_tput > 1.5 * static_tput
    static_ttft, continuous_ttft = compare_row(text, "Mean TTFT (ms)")
    assert continuous_ttft < static_ttft / 100
    static_pad, continuous_pad = compare_row(text, "Padded tokens share (%)")
    assert continuous_pad == 0 < static_pad
    for label in ("P99 TTFT (ms)", "Mean TPOT (ms)", "P99 ITL (ms)", "Mean E2EL (ms)", "P99 E2EL (ms)",
                  "Mean batch size (seqs/step)", "Mean queue time Wq (s)", "Request throughput (req/s)",
                  "Total Token throughput (tok/s)"):
        assert len(compare_row(text, label)) == 2

    assert {p.name for p in out.iterdir()} == {"scenario.yaml", "run.json", "summary.json", "static", "continuous",
                                            "plots", "report.html"}
    assert {p.name for p in (out / "plots").iterdir()} == COMPARE_PLOTS
    summary = json.loads((out / "summary.json").read_text())
    assert summary["continuous"]["output_throughput"] == pytest.approx(continuous_tput, abs=0.1)
    # Common random numbers: both modes served exactly the same requests.
    a, b = (pd.read_csv(out / m / "requests.csv") for m in ("static", "continuous"))
    for column in ("arrival_s", "prompt_tokens", "output_tokens"):
        assert a[column].equals(b[column])


def test_compare_defaults_to_every_mode(tmp_path):
    out = tmp_path / "all"
    # --no-plots: which modes ran is the point (the comparison above draws the plots).
    result = invoke("compare", SCENARIOS / "heavy_tail.yaml", "--set", "workload.num_requests=20", "--no-plots",
                    "--out", out)
    assert result.exit_code == 0, result.stderr
    assert {"static", "dynamic", "continuous"} <= {p.name for p in out.iterdir()}
    assert result.stdout.count("L (time-averaged") == 3


@pytest.mark.parametrize(("modes", "complaint"), [("static,fast", "'fast' is not a batching mode"),
                                                  (",", "no mode given"),
                                                  ("static,static", "listed twice")])
def test_compare_bad_modes(tmp_path, modes, complaint):
    result = invoke("compare", SCENARIOS / "heavy_tail.yaml", "--modes", modes, "--out", tmp_path / "x")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and complaint in result.stderr and "--modes" in result.stderr
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------------------ capacity
def capacity_rows(text: str) -> dict[int, tuple[float, float, float]]:
    """B -> (tau ms, tokens/s, % of roofline) from the capacity table."""
    rows = {}
    for line in text.splitlines():
        m = re.fullmatch(r"\s+(\d+)\s+([\d.]+)\s+([\d,.]+)\s+([\d.]+) %", line)
        if m:
            rows[int(m[1])] = (float(m[2]), float(m[3].replace(",", "")), float(m[4]))
    return rows


def test_capacity_table_is_the_chapter_curve():
    result = invoke("capacity")
    assert result.exit_code == 0, result.stderr
    rows = capacity_rows(result.stdout)
    assert sorted(rows) == [1, 2, 4, 8, 16, 32, 64]
    assert rows[8] == (21.6, 370.37, 7.4)
    assert rows[32][1] == 1212.12 and rows[64] == (32.8, 1951.22, 39.0)
    assert "B = 100.0 (beyond max_num_seqs = 64)" in result.stdout
    assert "Verdict" not in result.stdout  # no traffic given, no stability check


def test_capacity_from_a_scenario_with_flags_overriding():
    result = invoke("capacity", SCENARIOS / "oversubscribed.yaml")
    assert result.exit_code == 0, result.stderr
    assert "oversubscribed 5.1×" in result.stdout
    result = invoke("capacity", SCENARIOS / "oversubscribed.yaml", "--max-num-seqs", "48", "--replicas", "8")
    assert sorted(capacity_rows(result.stdout)) == [1, 2, 4, 8, 16, 32, 48]
    assert "stable" in result.stdout and "Slots available (48 × 8 replicas):" in result.stdout
    result = invoke("capacity", "--rate", "20", "--mean-output-tokens", "500", "--beta-ms", "0")
    assert "none (β = 0" in result.stdout and "n/a" in result.stdout


def test_capacity_agrees_with_a_saturated_run(tmp_path):
    """rate: inf and long fixed outputs keep 64 sequences decoding: run measures B / tau(B)."""
    scenario = write_scenario(tmp_path / "saturated.yaml", {
        "name": "saturated",
        "workload": {"num_requests": 128, "arrival": {"rate": "inf"},
                     "prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": 2000}},
        "device": {"tau0_ms": 20, "beta_ms": 0.2, "prefill_ms_per_token": 0},
        "batching": {"max_num_seqs": 64}})
    predicted = capacity_rows(invoke("capacity", scenario).stdout)[64][1]
    out = tmp_path / "out"
    assert invoke("run", scenario, "--out", out, "-q", "--no-plots").exit_code == 0  # the summary is what counts
    measured = json.loads((out / "summary.json").read_text())["output_throughput"]
    assert measured == pytest.approx(predicted, rel=0.01)
    # rate: inf survives the trip through resolved_config.json (JSON has no infinity of its own).
    resolved = Scenario.model_validate(json.loads((out / "resolved_config.json").read_text()))
    assert resolved.workload.arrival.rate == math.inf


@pytest.mark.parametrize(("args", "complaint"), [
    (("--beta-ms", "-1"), "--beta-ms: Input should be greater than or equal to 0 (got -1.0)"),
    (("--tau0-ms", "0", "--beta-ms", "0"), "--tau0-ms/--beta-ms: tau0_ms and beta_ms are both 0"),
    (("--rate", "0", "--mean-output-tokens", "5"), "--rate: got 0; it must be a finite number greater than zero"),
    (("--max-num-seqs", "0",), "--max-num-seqs: got 0"),
    (("--mean-prompt-tokens", "-1",), "--mean-prompt-tokens: got -1; it must be a finite number zero or more"),
    (("--rate", "3"), "--mean-output-tokens is needed too"),
])
def test_capacity_bad_flags(args, complaint):
    result = invoke("capacity", *args)
    assert result.exit_code == 2
    assert complaint in result.stderr and "Traceback" not in result.stderr


HEAVY = ("matplotlib", "bokeh", "simpy", "pandas", "scipy", "numpy", "pydantic", "yaml", "simbatch.config")


def imported_by(*argv: str, cwd: Path | None = None) -> list[str]:
    """Which of HEAVY a whole ``simbatch ARGV...`` process has imported by its end."""
    code = (f"import sys\nfrom simbatch.app.console import main\nsys.argv = ['simbatch', *{list(argv)!r}]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code in (0, None), exc.code\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                          cwd=cwd)
    return json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"'))


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["sweep", "--help"]], ids=" ".join)
def test_help_imports_none_of_the_heavy_libraries(argv):
    # Every command imports the schema, the simulator, the frames and the plots when it runs, not to list
    # itself. (A command's own --help has typer read its parameters, with pydantic: typer's doing.)
    assert set(imported_by(*argv)) <= (set() if argv == ["--help"] else {"pydantic"})


def test_a_run_without_plots_imports_no_plotting(tmp_path):
    argv = ["run", str(SCENARIOS / "stable.yaml"), "--set", "workload.num_requests=20", "--set",
            "workload.duration_s=null", "--no-plots", "-q", "--out", str(tmp_path / "out")]
    assert imported_by(*argv) == ["numpy", "pandas", "pydantic", "simbatch.config", "simpy", "yaml"]

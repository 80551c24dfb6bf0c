"""Sweeps: parameter grids, replications with common random numbers, the result store and resuming,
summary.csv's means and confidence intervals, failed points, the plots, and the same numbers
whether runs execute in this process, in a local process pool or on a Dask cluster.

Scenarios are small (tens of requests, short outputs), so each simulation takes milliseconds and
the whole module runs in about 20 s on 2 cores, most of it the Dask cluster's start.
"""

from __future__ import annotations

import io
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats
from typer.testing import CliRunner

from simbatch.app.cli.sweep import _progress, register
from simbatch.app.plots.figure import MODE_COLORS, colors
from simbatch.app.sweep import plan, runner
from simbatch.app.sweep import plots as sweep_plots
from simbatch.app.sweep.aggregate import mean_ci95
from simbatch.app.sweep.grid import GridError, expand, format_value, parse_param, parse_params, parse_values
from simbatch.app.sweep.store import MANIFEST, POINTS
from simbatch.inputs.loading import load_scenario, parse_override
from simbatch.model.cost import decode_throughput
from simbatch.simulation import simulate

SCENARIO = """\
name: tiny
seed: 11
workload:
  num_requests: 60
  arrival: {process: poisson, rate: 2.0}
  prompt_tokens: {dist: uniform, low: 8, high: 64}
  output_tokens: {dist: uniform, low: 4, high: 40}
device: {tau0_ms: 20, beta_ms: 0.2, prefill_ms_per_token: 0.01}
batching: {mode: continuous, max_num_seqs: 8, max_num_batched_tokens: 256}
slo: {ttft_ms: 200}
"""
GRID = ["--param", "workload.arrival.rate=4,16", "--param", "batching.mode=static,continuous"]


@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("scenario") / "tiny.yaml"
    path.write_text(SCENARIO)
    return path


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    """A fresh app given the two commands the way the main `simbatch` app gets them."""
    app = typer.Typer()
    register(app)
    return app


@pytest.fixture
def no_plots(monkeypatch):
    """For tests about numbers and files: drawing is a second or so per sweep, and tested on its own."""
    monkeypatch.setattr(plan, "plot_sweep", lambda *args: [])


def invoke(app: typer.Typer, *args: str | Path):
    return CliRunner().invoke(app, [str(a) for a in args])


def sweep(app, scenario_file: Path, out: Path, *args: str | Path, code: int = 0):
    result = invoke(app, "sweep", scenario_file, "--out", out, *args)
    assert result.exit_code == code, result.output
    return result


def bad_input(result) -> str:
    """The one line a bad input prints, after checking the exit code."""
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


# --------------------------------------------------------------------------- grid
def test_lists_and_ranges_expand_to_the_documented_values():
    assert parse_values("k", "1,2,4") == (1, 2, 4)
    assert parse_values("k", "1:40:2") == tuple(range(1, 40, 2))
    assert parse_values("k", "1:41:2")[-1] == 41  # a stop on the grid is included
    assert parse_values("k", "0.1:0.3:0.1") == (0.1, 0.2, 0.3)  # not 0.30000000000000004, not dropped
    assert parse_values("k", "log:1:64:7") == (1, 2, 4, 8, 16, 32, 64)
    assert parse_values("k", "log:0.5:8:5") == (0.5, 1.0, 2.0, 4.0, 8.0)
    assert parse_values("k", "1,2,log:4:64:5") == (1, 2, 4, 8, 16, 32, 64)
    assert parse_values("k", "static, continuous") == ("static", "continuous")
    assert parse_values("k", "inf,2") == (math.inf, 2)
    assert parse_values("k", "{dist: fixed, value: 8},{dist: fixed, value: 9}") == (
        {"dist": "fixed", "value": 8}, {"dist": "fixed", "value": 9})


def test_integer_ranges_stay_integers_and_rounding_drops_repeats():
    values = parse_values("k", "log:1:10:10")
    assert all(isinstance(v, int) for v in values)
    assert list(values) == sorted(set(values)) and values[0] == 1 and values[-1] == 10 and len(values) < 10
    assert all(isinstance(v, int) for v in parse_values("k", "2:10:4"))
    assert all(isinstance(v, float) for v in parse_values("k", "2:10:2.5"))


@pytest.mark.parametrize(("spec", "says"), [
    ("1:0:1", "below start"), ("1:4:0", "step must be positive"), ("log:1:64:1", "at least 2 points"),
    ("log:0:64:4", "0 < start"), ("log:1:64", "log:start:stop:n"), ("1,,2", "empty item"),
    ("[1, 2", "not YAML"), ("1:10", "start:stop:step"),
])
def test_bad_specs_name_the_parameter_and_the_problem(spec, says):
    with pytest.raises(GridError, match=says) as err:
        parse_param(f"workload.arrival.rate={spec}")
    assert "workload.arrival.rate" in str(err.value)


def test_grid_is_the_product_in_command_line_order_last_fastest():
    params = parse_params(["a=1,2", "b=x,y,z"])
    assert expand(params) == [{"a": a, "b": b} for a in (1, 2) for b in ("x", "y", "z")]
    assert expand([]) == [{}]
    with pytest.raises(GridError, match="given twice"):
        parse_params(["a=1", "a=2"])
    with pytest.raises(GridError, match="--set seed"):
        parse_params(["seed=1,2"], {"seed": "use --set seed=N"})


@given(st.one_of(st.floats(allow_nan=False), st.integers(), st.booleans(),
                 st.sampled_from(["static", "continuous", "1e-5", "yes", "null", "007"])))
def test_a_value_passed_to_load_scenario_reads_back_exactly(value):
    assert parse_override(f"k={format_value(value)}")[1] == value


# --------------------------------------------------------------------------- aggregation
def test_ci95_is_the_student_t_half_width():
    x = [3.0, 5.0, 4.0, 8.0]
    mean, half = mean_ci95(x)
    low, high = stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=stats.sem(x))
    assert mean == pytest.approx(5.0) and half == pytest.approx((high - low) / 2)
    assert math.isnan(mean_ci95([2.0])[1])


# --------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def local_sweep(cli, scenario_file, tmp_path_factory) -> Path:
    """The must-show sweep: two parameters, three replications, on a local pool of two processes."""
    out = tmp_path_factory.mktemp("sweeps") / "pool"
    sweep(cli, scenario_file, out, *GRID, "--replications", "3", "--workers", "2")
    return out


def test_summary_has_one_row_per_point_with_means_and_cis_of_every_metric(local_sweep, scenario_file):
    frame = pd.read_csv(local_sweep / "summary.csv", keep_default_na=False, na_values=[""])
    assert list(frame["workload.arrival.rate"]) == [4, 4, 16, 16]
    assert list(frame["batching.mode"]) == ["static", "continuous"] * 2
    assert (frame["replications"] == 3).all() and frame["error"].isna().all()

    one = simulate(load_scenario(scenario_file)).summary
    for metric in one:
        assert f"{metric}_mean" in frame and f"{metric}_ci95" in frame, metric
    assert "capacity_tokens_per_s_mean" in frame and "request_goodput_mean" in frame

    # Row 3 (rate 16, continuous) recomputed by hand: replication r is the scenario at seed 11 + r.
    runs = [simulate(load_scenario(scenario_file, ["workload.arrival.rate=16", "batching.mode=continuous",
                                                   f"seed={11 + r}"])).summary for r in range(3)]
    row = frame.iloc[3]
    for metric in ("p99_ttft_ms", "median_tpot_ms", "output_throughput", "request_goodput"):
        values = [s[metric] for s in runs]
        assert row[f"{metric}_mean"] == pytest.approx(np.mean(values), rel=1e-12)
        assert row[f"{metric}_ci95"] == pytest.approx(mean_ci95(values)[1], rel=1e-12)
    assert row["p99_ttft_ms_ci95"] > 0  # the replications differ: independent seeds


def test_replications_share_random_numbers_across_points(local_sweep):
    """Replication r of every point sees the same requests; different replications see different ones."""
    records = [json.loads(p.read_text()) for p in (local_sweep / POINTS).glob("*.json")]
    assert len(records) == 12
    by_seed: dict[int, set[tuple[int, int]]] = {}
    for rec in records:
        s = rec["summary"]
        assert s["completed"] == s["num_requests"] == 60  # all done, so the token totals are the workload's
        by_seed.setdefault(rec["seed"], set()).add((s["total_input_tokens"], s["total_output_tokens"]))
    assert sorted(by_seed) == [11, 12, 13]
    assert all(len(totals) == 1 for totals in by_seed.values())  # same lengths at every point
    assert len({next(iter(t)) for t in by_seed.values()}) == 3  # but not across replications


def test_plots_are_written(local_sweep):
    for name in ("latency.png", "throughput.png", "goodput.png"):
        assert (local_sweep / name).stat().st_size > 10_000, name


def test_the_same_csv_in_this_process_as_in_a_pool(cli, scenario_file, local_sweep, tmp_path, no_plots):
    sweep(cli, scenario_file, tmp_path / "inline", *GRID, "--replications", "3", "--workers", "1")
    assert (tmp_path / "inline" / "summary.csv").read_bytes() == (local_sweep / "summary.csv").read_bytes()


def test_the_same_csv_through_a_dask_cluster(cli, scenario_file, local_sweep, dask_cluster, tmp_path,
                                             no_plots):
    result = sweep(cli, scenario_file, tmp_path / "dask", *GRID, "--replications", "3",
                   "--scheduler-address", dask_cluster.scheduler_address)
    assert "Dask cluster" in result.output
    assert (tmp_path / "dask" / "summary.csv").read_bytes() == (local_sweep / "summary.csv").read_bytes()


# --------------------------------------------------------------------------- resuming
def count_simulations(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = runner.simulate_run

    def counting(scenario):
        calls.append(scenario.seed)
        return real(scenario)

    monkeypatch.setattr(runner, "simulate_run", counting)
    return calls


def test_a_restart_runs_only_what_is_missing_and_gives_the_same_csv(cli, scenario_file, local_sweep, tmp_path,
                                                                    monkeypatch, no_plots):
    out = tmp_path / "resumed"
    out.mkdir()
    (out / POINTS).mkdir()
    (out / MANIFEST).write_text((local_sweep / MANIFEST).read_text())
    kept = sorted((local_sweep / POINTS).glob("*.json"))[:9]
    for path in kept:
        (out / POINTS / path.name).write_text(path.read_text())
    (out / POINTS / ".x.json.tmp").write_text("{half a rec")  # what a kill mid-write leaves: ignored
    calls = count_simulations(monkeypatch)
    result = sweep(cli, scenario_file, out, *GRID, "--replications", "3", "--workers", "1")
    assert len(calls) == 3 and "resumed 9 of 12 points" in result.stdout
    assert (out / "summary.csv").read_bytes() == (local_sweep / "summary.csv").read_bytes()
    calls.clear()
    sweep(cli, scenario_file, out, *GRID, "--replications", "3", "--workers", "1")
    assert calls == []


def test_an_extended_sweep_reuses_the_runs_it_has(cli, scenario_file, local_sweep, tmp_path, monkeypatch, no_plots):
    out = tmp_path / "extended"
    shutil.copytree(local_sweep, out)
    calls = count_simulations(monkeypatch)
    # One more rate (6 points, not 4) and a fourth replication: 24 runs, of which the 12 made before are kept.
    result = sweep(cli, scenario_file, out, "--param", "workload.arrival.rate=4,16,32", "--param",
                   "batching.mode=static,continuous", "--replications", "4", "--workers", "1")
    assert len(calls) == 12 and "resumed 12 of 24 points" in result.stdout
    frame = pd.read_csv(out / "summary.csv")
    assert len(frame) == 6 and (frame["replications"] == 4).all()


def test_a_restart_with_other_arguments_is_refused(cli, scenario_file, local_sweep):
    before = sorted(p.name for p in local_sweep.rglob("*"))
    line = bad_input(invoke(cli, "sweep", scenario_file, "--out", local_sweep, *GRID, "--set", "seed=5"))
    assert "other arguments" in line and "set: [] -> ['seed=5']" in line
    assert sorted(p.name for p in local_sweep.rglob("*")) == before


def test_a_run_that_raises_is_a_failed_row_and_is_retried_on_restart(cli, scenario_file, tmp_path, no_plots,
                                                                     monkeypatch):
    real = runner.simulate_run

    def flaky(scenario):
        if scenario.seed == 12:
            raise RuntimeError("worker lost")
        return real(scenario)

    monkeypatch.setattr(runner, "simulate_run", flaky)
    out = tmp_path / "flaky"
    sweep(cli, scenario_file, out, "--param", "batching.max_num_seqs=4,8", "-r", "2", "--workers", "1", code=1)
    frame = pd.read_csv(out / "summary.csv")
    assert list(frame["replications"]) == [1, 1]
    assert list(frame["error"]) == ["RuntimeError: worker lost"] * 2
    assert len(list((out / POINTS).glob("*.json"))) == 2  # the failures are not stored
    monkeypatch.setattr(runner, "simulate_run", real)
    sweep(cli, scenario_file, out, "--param", "batching.max_num_seqs=4,8", "-r", "2", "--workers", "1")
    assert list(pd.read_csv(out / "summary.csv")["replications"]) == [2, 2]


def test_a_sweep_where_no_run_finished_exits_1(cli, scenario_file, tmp_path, no_plots, monkeypatch):
    def broken(scenario):
        raise MemoryError("out of memory")

    monkeypatch.setattr(runner, "simulate_run", broken)
    result = invoke(cli, "sweep", scenario_file, "--out", tmp_path / "broken", "-r", "1", "-w", "1")
    assert result.exit_code == 1
    assert pd.read_csv(tmp_path / "broken" / "summary.csv")["error"].tolist() == ["MemoryError: out of memory"]


# --------------------------------------------------------------------------- bad points, bad input
def test_a_bad_combination_is_a_row_with_its_error_and_the_rest_runs(cli, scenario_file, tmp_path, no_plots):
    out = tmp_path / "mixed"
    result = sweep(cli, scenario_file, out, "--param", "batching.max_num_batched_tokens=4,256",
                   "--replications", "1", "--workers", "1", code=1)
    frame = pd.read_csv(out / "summary.csv")
    assert "1 failed" in result.output
    assert frame.loc[0, "replications"] == 0 and "max_num_batched_tokens (4)" in frame.loc[0, "error"]
    assert frame.loc[1, "replications"] == 1 and pd.isna(frame.loc[1, "error"])
    assert frame.loc[1, "completed_mean"] == 60


@pytest.mark.parametrize(("args", "says"), [
    (["--param", "workload.arrival.rate=4:1:1"], "--param workload.arrival.rate=4:1:1"),
    (["--param", "seed=1,2"], "--set seed=N"),
    (["--param", "workload.arival.rate=1,2"], "every point is invalid"),
    (["--set", "batching.mode=bogus"], "batching.mode"),
    (["--replications", "0"], "--replications 0"),
    (["--workers", "0"], "--workers 0"),
    (["--workers", "2", "--scheduler-address", "tcp://127.0.0.1:1"], "give one"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(cli, scenario_file, tmp_path, args, says):
    line = bad_input(invoke(cli, "sweep", scenario_file, "--out", tmp_path / "never", *args))
    assert says in line
    assert not (tmp_path / "never").exists()


def test_missing_scenario_and_foreign_folder_are_bad_input(cli, scenario_file, tmp_path):
    assert "file not found" in bad_input(invoke(cli, "sweep", tmp_path / "nope.yaml"))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    line = bad_input(invoke(cli, "sweep", scenario_file, "--out", tmp_path / "taken"))
    assert "holds no manifest.json" in line


def test_scheduler_address_without_dask_says_how_to_install(cli, scenario_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    line = bad_input(invoke(cli, "sweep", scenario_file, "--out", tmp_path / "never",
                            "--scheduler-address", "tcp://127.0.0.1:8786"))
    assert "pip install 'simbatch[dask]'" in line
    assert not (tmp_path / "never").exists()


# --------------------------------------------------------------------------- batch-size plot, progress
def test_batch_size_sweep_points_lie_on_the_device_curve(cli, scenario_file, tmp_path):
    """The batch plot's points (tokens per busy second at the mean batch) sit on B / (tau0 + beta B)."""
    out = tmp_path / "batch"
    sweep(cli, scenario_file, out, "--param", "batching.max_num_seqs=log:2:32:5", "--set",
          "workload.arrival.rate=inf", "--set", "device.prefill_ms_per_token=0", "--replications", "1",
          "--workers", "1")
    assert (out / "batch_throughput.png").stat().st_size > 10_000
    frame = pd.read_csv(out / "summary.csv")
    device = load_scenario(scenario_file).device
    busy_rate = frame["output_throughput_mean"] / frame["busy_fraction_mean"]
    curve = [decode_throughput(device, b) for b in frame["mean_batch_size_mean"]]
    np.testing.assert_allclose(busy_rate, curve, rtol=0.02)


def test_progress_advances_once_per_point_on_a_terminal(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    with _progress(3, "points") as advance:
        for _ in range(3):
            advance()
    assert "3/3" in screen.getvalue()
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: no bar at all
    with _progress(3, "points") as advance:
        assert advance is None


# --------------------------------------------------------------------------- issue 16: what a sweep shows
def test_a_sweep_ends_with_a_table_of_means_and_95_ci(cli, scenario_file, tmp_path):
    out = tmp_path / "sweep"
    result = sweep(cli, scenario_file, out, "-p", "batching.mode=static,continuous", "-r", "3", "-w", "1",
                   "--no-plots")
    assert not list(out.glob("*.png"))
    assert "mean ± 95 % CI half-width over 3 replications" in result.output
    frame = pd.read_csv(out / "summary.csv")
    rows = [[c.strip() for c in ln.split("│")[1:-1]] for ln in result.output.splitlines() if "±" in ln and "│" in ln]
    header = next([c.strip() for c in ln.split("┃")[1:-1]] for ln in result.output.splitlines() if "┃" in ln)
    assert [r[header.index("mode")] for r in rows] == ["static", "continuous"]
    for i, row in enumerate(rows):
        mean, ci = (float(v.replace(",", "")) for v in row[header.index("mean TTFT ms")].split(" ± "))
        assert mean == pytest.approx(frame.loc[i, "mean_ttft_ms_mean"], rel=1e-3, abs=0.5)
        assert ci == pytest.approx(frame.loc[i, "mean_ttft_ms_ci95"], rel=1e-3, abs=0.5)


def test_modes_have_one_colour_everywhere():
    assert colors(["static", "continuous"]) == {"static": MODE_COLORS["static"], "continuous": MODE_COLORS["continuous"]}
    # as a sweep labels its series, as compare labels a product of settings
    assert colors(["mode=continuous", "mode=static"]) == {"mode=continuous": MODE_COLORS["continuous"],
                                                          "mode=static": MODE_COLORS["static"]}
    assert colors(["policy=fcfs,mode=static", "policy=fcfs,mode=dynamic"])["policy=fcfs,mode=static"] == \
        MODE_COLORS["static"]
    # two series of one mode cannot share its colour: then a plain cycle, every series its own
    shared = colors(["mode=static, policy=fcfs", "mode=static, policy=sjf"])
    assert len(set(shared.values())) == 2
    frame = pd.DataFrame({"batching.mode": ["continuous", "static"], "workload.arrival.rate": [1.0, 1.0]})
    series = sweep_plots._series(frame, ["batching.mode", "workload.arrival.rate"], "workload.arrival.rate")
    assert sweep_plots._colors(series) == [MODE_COLORS["continuous"], MODE_COLORS["static"]]


def test_error_bars_say_they_are_95_ci(tmp_path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    seen = []
    fig.savefig = lambda path, **kw: seen.append([t.get_text() for t in fig.texts])
    sweep_plots._finish(fig, ax, "x", Path(tmp_path / "f.png"))
    assert seen == [[sweep_plots.CI_NOTE]] and "95 % confidence interval" in sweep_plots.CI_NOTE

"""Capacity search: SLO names, the bisection, and the chapter's device.

The bisection is checked against a known boundary without simulating; the end-to-end checks use the
chapter's device (tau0 = 20 ms, beta = 0.2 ms, 64 slots, 500-token outputs), whose capacity is
B / tau(B) = 64 / 32.8 ms = 1951 tokens/s, 3.90 requests/s. About 15 s on 2 cores.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from simbatch.app.cli.sweep import register
from simbatch.app.sweep.capacity import (
    FLOOR_FRACTION,
    METRICS,
    SLO,
    STATS,
    Search,
    goodput_overrides,
    parse_slo,
)
from simbatch.app.sweep.plan import SweepInputError
from simbatch.app.sweep.runner import Point
from simbatch.inputs.loading import load_scenario
from simbatch.simulation import simulate

CHAPTER = """\
name: chapter
seed: 3
workload:
  num_requests: 150
  arrival: {process: poisson, rate: 1.0}
  prompt_tokens: {dist: fixed, value: 100}
  output_tokens: {dist: fixed, value: 500}
device: {tau0_ms: 20, beta_ms: 0.2}
batching: {mode: continuous, max_num_seqs: 64}
"""
CAPACITY = 64 / (20 + 0.2 * 64) * 1e3 / 500  # requests/s: 1951.2 tokens/s over 500 tokens each


@pytest.fixture(scope="module")
def chapter(tmp_path_factory) -> Path:
    """The scenario file; the tests vary it with --set and --param, as a user would."""
    return write(tmp_path_factory.mktemp("scenario") / "chapter.yaml", CHAPTER)


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    """The two commands on an app of their own; see tests/test_sweep.py for how they are run."""
    app = typer.Typer(name="capacity")
    register(app)
    return app


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def search(app, scenario: Path, out: Path, *args: str) -> pd.DataFrame:
    result = CliRunner().invoke(app, ["capacity-search", str(scenario), "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    assert "max_rate" in result.output  # the table
    return pd.read_csv(out / "capacity.csv")


# --------------------------------------------------------------------------- SLO names
def test_both_spellings_name_a_real_summary_key(chapter):
    assert parse_slo("ttft_p99_ms=500") == parse_slo("p99_ttft_ms=500") == SLO("ttft", "p99", 500.0)
    assert parse_slo("tpot_p50_ms=30").key == "median_tpot_ms"
    summary = simulate(load_scenario(chapter, ["workload.num_requests=5"])).summary
    for metric in METRICS:
        for stat in STATS:
            assert parse_slo(f"{metric}_{stat}_ms=1").key in summary


@pytest.mark.parametrize(("text", "says"), [
    ("ttft_p100_ms=500", "unknown SLO"), ("ttft_p0_ms=5", "not between 0 and 100"), ("goodput=3", "unknown SLO"), ("ttft_p99_ms=0", "positive"),
    ("ttft_p99_ms=fast", "positive"), ("ttft_p99_ms", "positive"), ("ttft_p99_ms=inf", "positive"),
])
def test_bad_slos_are_refused_with_the_fix(text, says):
    with pytest.raises(SweepInputError, match=says):
        parse_slo(text)


def test_goodput_uses_the_loosest_limit_per_metric():
    slos = [parse_slo(s) for s in ("ttft_p99_ms=500", "ttft_median_ms=200", "tpot_p99_ms=50",
                                   "itl_p99_ms=80")]
    assert goodput_overrides(slos) == ["slo.ttft_ms=500.0", "slo.tpot_ms=50.0"]


# --------------------------------------------------------------------------- bisection
def bisect(boundary: float, tolerance: float = 0.02) -> Search:
    """Run a Search against an oracle whose p99 TTFT crosses 100 ms exactly at ``boundary`` req/s."""
    s = Search(Point({}, [], None), capacity=4.0, tolerance=tolerance)
    slo = [SLO("ttft", "p99", 100.0)]
    while (rate := s.next_rate()) is not None:
        s.record(rate, {"replications": 1, "p99_ttft_ms_mean": 100.0 * rate / boundary}, slo)
    return s


@pytest.mark.parametrize("boundary", [0.01, 0.7, 2.0, 3.3, 3.99, 10.0])
def test_bisection_brackets_the_boundary_within_tolerance(boundary):
    s = bisect(boundary)
    assert s.lo is not None and s.lo <= boundary
    assert s.hi - s.lo <= 0.02 * s.hi
    assert s.hi >= min(boundary, s.capacity)  # never above capacity, never past the boundary
    assert s.probes <= math.ceil(math.log2(1 / 0.02)) + 1 + max(0, math.ceil(math.log2(2 / boundary)))


def test_an_slo_missed_even_at_tiny_load_is_reported_not_looped():
    s = bisect(boundary=FLOOR_FRACTION * 4.0 / 4)
    assert s.lo is None and "out of reach" in s.error
    assert s.probes == 10


# --------------------------------------------------------------------------- the chapter's device
def test_the_rate_approaches_capacity_as_the_slo_loosens(cli, chapter, tmp_path):
    levels = ["tpot_p99_ms=26", "tpot_p99_ms=30", "ttft_p99_ms=2000"]  # tight to loose
    rows = [search(cli, chapter, tmp_path / f"level{i}", "--slo", slo, "-r", "2", "-w", "2").iloc[0]
            for i, slo in enumerate(levels)]
    rates = [row["max_rate"] for row in rows]
    assert rows[0]["capacity_requests_per_s"] == pytest.approx(CAPACITY, rel=1e-12)
    assert rates[0] < rates[1] < rates[2] < CAPACITY
    assert rates[0] < 0.75 * CAPACITY  # a tight TPOT keeps the batch small
    assert rates[2] > 0.95 * CAPACITY  # a loose SLO is bounded by the device alone
    for row, slo in zip(rows, levels, strict=True):
        key = parse_slo(slo)
        assert row[key.key] <= key.limit_ms  # the SLO holds where the search stopped
        assert row["ratio"] == pytest.approx(row["max_rate"] / CAPACITY)
        assert row["request_goodput"] > 0 and pd.isna(row["error"])  # an empty error cell


def test_each_configuration_gets_its_own_capacity_and_rate(cli, chapter, tmp_path):
    frame = search(cli, chapter, tmp_path / "by_seqs", "--slo", "ttft_p99_ms=2000", "--param",
                   "batching.max_num_seqs=16,64", "-r", "1", "--tolerance", "0.05", "-w", "2")
    assert list(frame["batching.max_num_seqs"]) == [16, 64]
    capacity_16 = 16 / (20 + 0.2 * 16) * 1e3 / 500
    assert frame["capacity_requests_per_s"].tolist() == pytest.approx([capacity_16, CAPACITY], rel=1e-12)
    assert (frame["max_rate"] < frame["capacity_requests_per_s"]).all()
    assert (frame["ratio"] > 0.5).all()
    assert frame.loc[0, "max_rate"] < frame.loc[1, "max_rate"]


@pytest.mark.parametrize(("args", "says"), [
    ([], "--slo: give at least one"),
    (["--slo", "ttft_p99_ms=500", "--param", "workload.arrival.rate=1,2"], "searches the rate itself"),
    (["--slo", "ttft_p99_ms=500", "--tolerance", "1.5"], "--tolerance 1.5"),
    (["--slo", "ttft_p100_ms=500"], "unknown SLO"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(cli, chapter, tmp_path, args, says):
    result = CliRunner().invoke(cli, ["capacity-search", str(chapter), "--out", str(tmp_path / "never"),
                                      *args])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert says in result.output
    assert not (tmp_path / "never").exists()


# --------------------------------------------------------------------------- issue 16: any percentile, output
def test_any_percentile_is_an_slo_and_the_search_draws_and_explains_itself(cli, chapter, tmp_path):
    assert parse_slo("p99.9_itl_ms=80") == parse_slo("itl_p99.9_ms=80") == SLO("itl", "p99.9", 80.0)
    assert parse_slo("ttft_p95.0_ms=1").key == "p95_ttft_ms"
    out = tmp_path / "p95"
    result = CliRunner().invoke(cli, ["capacity-search", str(chapter), "--out", str(out), "--slo", "ttft_p95_ms=300",
                                      "-r", "1", "--tolerance", "0.1", "-w", "1"])
    assert result.exit_code == 0, result.output
    assert "ratio = max_rate / capacity_requests_per_s" in result.output
    row = pd.read_csv(out / "capacity.csv").iloc[0]
    probes = pd.read_csv(out / "probes.csv")
    assert 0 < row["p95_ttft_ms"] <= 300 and row["probes"] == len(probes)
    # The probes trace the curve the search walked: met below max_rate, missed at the rates above it.
    assert probes.loc[probes["met"], "rate"].max() == row["max_rate"]
    assert (probes.loc[~probes["met"], "p95_ttft_ms"] > 300).all()
    assert (out / "slo_vs_rate.png").read_bytes()[:4] == b"\x89PNG"


def test_the_default_folder_is_timestamped_as_a_runs(chapter, tmp_path, monkeypatch):
    from simbatch.app.sweep.capacity import CapacitySearch

    monkeypatch.chdir(tmp_path)
    first = CapacitySearch.plan(chapter, [], [], ["ttft_p99_ms=500"], 1, 0.02).out
    assert re.fullmatch(r"capacity-\d{8}-\d{6}", first.name) and first.parent.parent == Path("results")
    first.mkdir(parents=True)  # a search took it: the next one, even in the same second, gets another
    assert CapacitySearch.plan(chapter, [], [], ["ttft_p99_ms=500"], 1, 0.02).out != first

"""Result folders: reproducible from their own scenario.yaml, named safely, unique, and the user's to share."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from datetime import datetime

import pandas as pd
import pytest
import yaml
from test_cli import REPO, SCENARIOS, invoke, write_scenario

from simbatch import __version__
from simbatch.analysis.stats import describe_ms
from simbatch.analysis.summary import itl_sample
from simbatch.app import plots, results, webreport
from simbatch.app.results import file_sha256, safe_name
from simbatch.app.text import printable, spreadsheet_safe


@pytest.fixture(autouse=True)
def _no_parquet_no_plots(monkeypatch):
    """These tests are about folders and numbers; drawing is a second a run, and tested on its own
    (the plots in test_plots_*, the report in test_webreport): here the report is an empty file."""
    monkeypatch.setattr(results, "parquet_available", lambda: False)
    monkeypatch.setattr(plots, "save_run_plots", lambda folder, result: [])
    monkeypatch.setattr(webreport, "write_report", lambda path, runs, title: path.write_text(""))


DRAW_REPORT = webreport.write_report


@pytest.fixture
def drawn_report(monkeypatch):
    """The real report, for the runs with hostile names: those must come out of it drawn too."""
    monkeypatch.setattr(webreport, "write_report", DRAW_REPORT)


def _run(*args) -> None:
    result = invoke("run", *args, "-q")
    assert result.exit_code == 0, result.stderr


def test_a_folder_reproduces_its_summary_byte_for_byte_with_overrides(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [SCENARIOS / "oversubscribed.yaml", "--set", "cluster.replicas=6", "--set", "workload.duration_s=10",
            "--seed", "3", "--out", "first"]
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/simbatch", "run", *map(str, args)])
    _run(*args)
    _run("first/scenario.yaml", "--out", "again")
    assert (tmp_path / "again" / "summary.json").read_bytes() == (tmp_path / "first" / "summary.json").read_bytes()
    effective = yaml.safe_load((tmp_path / "first" / "scenario.yaml").read_text())
    assert effective["cluster"]["replicas"] == 6 and effective["seed"] == 3
    record = json.loads((tmp_path / "first" / "run.json").read_text())
    assert record["simbatch"] == __version__ and record["seed"] == 3
    assert record["command_line"] == ["simbatch", "run", *map(str, args)]


def test_a_trace_folder_reproduces_from_anywhere(tmp_path, monkeypatch):
    # The scenario names its trace relative to itself; the folder's copy must find it from elsewhere.
    shutil.copy(REPO / "simbatch" / "data" / "sample_trace.csv", tmp_path / "trace.csv")
    write_scenario(tmp_path / "s.yaml", {"name": "traced", "workload": {"trace": {"path": "trace.csv"},
                                                                         "num_requests": 40}})
    _run(tmp_path / "s.yaml", "--out", tmp_path / "first")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    shutil.move(tmp_path / "first", elsewhere / "first")
    _run("first/scenario.yaml", "--out", "again")
    assert (elsewhere / "again" / "summary.json").read_bytes() == (elsewhere / "first" / "summary.json").read_bytes()
    data = json.loads((elsewhere / "first" / "run.json").read_text())["data_files"]
    assert data == {"workload.trace.path": {"path": str((tmp_path / "trace.csv").resolve()),
                                            "sha256": file_sha256(tmp_path / "trace.csv")}}


@pytest.mark.parametrize(("name", "folder"), [("../../x", "x"), ("/etc/passwd", "etc_passwd"), ("a\x00b", "a_b"),
                                              ("..", "scenario"), ("", "scenario"), ("chat 7b", "chat_7b"),
                                              (".hidden", "hidden"), ("x" * 300, "x" * 64)])
def test_a_name_is_a_label_never_a_path(name, folder):
    assert safe_name(name) == folder


def test_a_hostile_name_stays_under_results(tmp_path, monkeypatch, drawn_report):
    monkeypatch.chdir(tmp_path)
    write_scenario(tmp_path / "s.yaml", {"name": "../../escape", "workload": {"num_requests": 3}})
    result = invoke("run", tmp_path / "s.yaml", "-q")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("results/escape/")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results", "s.yaml"]


@pytest.mark.parametrize(("mask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_modes_follow_the_umask(tmp_path, mask, file_mode, dir_mode):
    old = os.umask(mask)
    try:
        _run(SCENARIOS / "stable.yaml", "--set", "workload.num_requests=5", "--out", tmp_path / "out")
    finally:
        os.umask(old)
    out = tmp_path / "out"
    assert stat.S_IMODE(out.stat().st_mode) == dir_mode
    assert stat.S_IMODE((out / "plots").stat().st_mode) == dir_mode
    assert stat.S_IMODE((out / "summary.json").stat().st_mode) == file_mode


def test_two_runs_taking_the_same_name_both_keep_their_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    now = datetime(2026, 1, 1, 12, 0, 0)
    first = results.default_folder("same", now=now)
    second = results.default_folder("same", now=now)  # chosen before the first is written: a race
    assert first == second
    _run(SCENARIOS / "stable.yaml", "--set", "workload.num_requests=3", "--out", first)
    from simbatch.inputs.loading import load_scenario
    from simbatch.simulation import simulate
    result = simulate(load_scenario(SCENARIOS / "stable.yaml", ["workload.num_requests=3"]))
    placed = results.write_run(second, result, unique=True)
    assert placed == first.with_name(first.name + "-2") and (placed / "summary.json").is_file()


def test_out_is_tried_before_simulating(tmp_path):
    result = invoke("run", SCENARIOS / "stable.yaml", "--out", "/proc/simbatch-test/out")
    assert result.exit_code == 2 and "not a writable folder" in result.stderr and result.stdout == ""


def test_names_cannot_inject_formulas_or_terminal_codes(tmp_path, drawn_report):
    hostile = ['=HYPERLINK("http://x","y")', "evil\x1b[2J\nname"]
    write_scenario(tmp_path / "s.yaml", {
        "name": "inject", "workload": {"num_requests": 20, "classes": [{"name": n} for n in hostile]}})
    result = invoke("run", tmp_path / "s.yaml", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert "\x1b" not in result.stdout and "evil\\x1b[2J" in result.stdout
    tenants = set(pd.read_csv(tmp_path / "out" / "requests.csv")["tenant"])
    assert "'" + hostile[0] in tenants and not any(t.startswith("=") for t in tenants)


@pytest.mark.parametrize(("cell", "safe"), [("=1+1", "'=1+1"), ("+x", "'+x"), ("-x", "'-x"), ("@SUM(A1)", "'@SUM(A1)"),
                                            ("\tx", "'\tx"), ("plain", "plain"), ("a=b", "a=b")])
def test_spreadsheet_safe(cell, safe):
    assert spreadsheet_safe(cell) == safe


def test_printable_escapes_controls_and_cuts():
    assert printable("a\x1b[31mb\nc\u202ed") == "a\\x1b[31mb\\nc\\u202ed"
    assert printable("abcdef", 4) == "abc…"


def test_a_folder_holds_what_recomputes_its_itl_percentiles(tmp_path):
    # Preemptions under memory pressure make stall gaps, which the iterations alone do not hold.
    out = tmp_path / "run"
    result = invoke("run", SCENARIOS / "memory_pressure.yaml", "--set", "workload.num_requests=150", "--no-plots",
                    "-q", "--out", out)
    assert result.exit_code == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    iterations, stalls = pd.read_csv(out / "iterations.csv"), pd.read_csv(out / "stall_gaps.csv")
    assert summary["num_preemptions"] > 0 and len(stalls) > 0
    again = describe_ms("itl", *itl_sample(iterations, stalls["stall_gap_s"]))
    for key in ("mean_itl_ms", "median_itl_ms", "p99_itl_ms", "std_itl_ms"):
        assert again[key] == pytest.approx(summary[key], rel=1e-12), key

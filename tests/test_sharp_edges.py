"""Issue 33, "no sharp edges": what a hostile or a new user tried, each with the behaviour it gets now.

Sections follow the issue: wrong results, unbounded inputs, tracebacks where a line belongs, the
servers' reach, leftovers, and what a new user trips on. Commands run in-process (``invoke``) on
scenarios of a few requests; the servers run in a thread of this process.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import threading
from pathlib import Path

import pytest
import yaml
from test_cli import invoke

SMALL = {"name": "small", "workload": {"num_requests": 10, "arrival": {"rate": 2}},
         "batching": {"max_num_seqs": 8, "max_num_batched_tokens": 512}}


def scenario(tmp_path: Path, data: dict | None = None, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data or SMALL, allow_unicode=True), encoding="utf-8")
    return path


def one_line(result, *words: str) -> str:
    """Bad input: exit 2, one line on stderr holding every word, nothing on stdout, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr, result.exception)
    assert result.stderr.count("\n") == 1 and not result.stdout, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
    return result.stderr


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """One finished result folder (no plots), to copy and damage."""
    tmp = tmp_path_factory.mktemp("run")
    result = invoke("run", scenario(tmp), "--no-plots", "--quiet", "--out", tmp / "r")
    assert result.exit_code == 0, result.stderr
    return tmp / "r"


def copy_of(run_folder: Path, where: Path) -> Path:
    shutil.copytree(run_folder, where)
    return where


# ================================================================== what a new user trips on: the flags
def test_goodput_takes_vllms_space_separated_pairs(tmp_path):
    out = tmp_path / "r"
    result = invoke("run", scenario(tmp_path), "--goodput", "ttft:500", "tpot:50", "--no-plots", "--quiet",
                    "--out", out)
    assert result.exit_code == 0, result.stderr
    slo = json.loads((out / "resolved_config.json").read_text())["slo"]
    assert (slo["ttft_ms"], slo["tpot_ms"]) == (500.0, 50.0)
    # The pairs end at the first word that is not one: the scenario may come after them.
    result = invoke("run", "--goodput", "ttft:500", "e2el:900", scenario(tmp_path), "--no-plots", "--quiet",
                    "--out", tmp_path / "r2")
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "r2" / "resolved_config.json").read_text())["slo"]["e2el_ms"] == 900.0


@pytest.mark.parametrize(("value", "fix"), [("ttft:0.5s", "--goodput ttft:500"), ("ttft:500ms", "--goodput ttft:500"),
                                            ("tpot:2min", "--goodput tpot:120000"), ("ttft:abc", "--goodput ttft:500")])
def test_goodput_with_a_unit_suggests_the_limit_in_ms(tmp_path, value, fix):
    text = one_line(invoke("run", scenario(tmp_path), "--goodput", value, "--out", tmp_path / "r"), fix)
    assert "--goodput 4" not in text
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("value", "fix"), [("0.99", "99"), ("0.5,0.9", "50,90"), ("50,0.999", "50,99.9")])
def test_metric_percentiles_as_fractions_are_refused_with_the_fix(tmp_path, value, fix):
    one_line(invoke("run", scenario(tmp_path), "--metric-percentiles", value, "--out", tmp_path / "r"),
             f"--metric-percentiles {value}: percentiles are in percent", f"e.g. --metric-percentiles {fix}")


def test_a_set_typo_is_blamed_on_the_command_line(tmp_path):
    text = one_line(invoke("validate", scenario(tmp_path), "--set", "workload.arival.rate=4"),
                    "--set: workload.arival: unknown key; did you mean 'arrival'?")
    assert not text.startswith(str(tmp_path))
    # A typo in the file itself is still the file's, with its line.
    data = {**SMALL, "workload": {**SMALL["workload"], "arival": {"rate": 2}}}
    one_line(invoke("validate", scenario(tmp_path, data)), f"{tmp_path / 's.yaml'}:", "workload.arival: unknown key")


def test_a_param_also_given_by_set_is_refused(tmp_path):
    one_line(invoke("sweep", scenario(tmp_path), "-p", "workload.arrival.rate=1,2", "--set",
                    "workload.arrival.rate=3", "-o", tmp_path / "sw"), "--param workload.arrival.rate",
             "--set workload.arrival.rate")
    one_line(invoke("capacity-search", scenario(tmp_path), "--slo", "ttft_p99_ms=500", "-p",
                    "batching.max_num_seqs=4,8", "--set", "batching.max_num_seqs=16", "-o", tmp_path / "cs"),
             "--param batching.max_num_seqs")
    assert not (tmp_path / "sw").exists() and not (tmp_path / "cs").exists()


def test_compare_with_empty_modes_is_refused(tmp_path):
    one_line(invoke("compare", scenario(tmp_path), "--modes", "", "--out", tmp_path / "c"), "--modes ''",
             "no mode given")
    assert not (tmp_path / "c").exists()


# ================================================================== tracebacks where a line belongs: compare
def _truncate(folder: Path) -> None:
    (folder / "summary.json").write_text('{"completed": 1')


def _non_object(folder: Path) -> None:
    (folder / "summary.json").write_text("[1, 2]")


def _deep(folder: Path) -> None:
    (folder / "summary.json").write_text("[" * 100_000 + "]" * 100_000)


def _string_metrics(folder: Path) -> None:
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "mean_ttft_ms": "fast", "completed": [1]}))


def _bad_config(folder: Path) -> None:
    (folder / "resolved_config.json").write_text(json.dumps({"workload": {"num_requests": -3}}))


def _config_not_json(folder: Path) -> None:
    (folder / "resolved_config.json").write_text("{nope")


def _no_status(folder: Path) -> None:
    import pandas as pd

    frame = pd.read_csv(folder / "requests.csv")
    frame.drop(columns=["status"]).to_csv(folder / "requests.csv", index=False)


def _empty_requests(folder: Path) -> None:
    (folder / "requests.csv").write_text("")


def _binary_requests(folder: Path) -> None:
    (folder / "requests.csv").write_bytes(bytes(range(256)) * 8)


def _no_iterations_column(folder: Path) -> None:
    (folder / "iterations.csv").write_text("a,b\n1,2\n")


@pytest.mark.parametrize(("damage", "words"), [
    (_truncate, ["summary.json", "not valid JSON"]),
    (_non_object, ["summary.json", "not a JSON object"]),
    (_deep, ["summary.json", "nested"]),
    (_bad_config, ["resolved_config.json", "workload.num_requests"]),
    (_config_not_json, ["resolved_config.json", "not valid JSON"]),
    (_no_status, ["requests.csv", "'status'"]),
    (_empty_requests, ["requests.csv", "empty"]),
    (_binary_requests, ["requests.csv"]),
    (_no_iterations_column, ["iterations.csv"]),
], ids=lambda v: v.__name__ if callable(v) else None)
def test_compare_on_a_damaged_result_folder_is_one_line(run_folder, tmp_path, damage, words):
    good, bad = copy_of(run_folder, tmp_path / "good"), copy_of(run_folder, tmp_path / "bad")
    damage(bad)
    one_line(invoke("compare", good, bad, "--no-plots", "--out", tmp_path / "c"), str(bad), *words,
             "give a folder written by simbatch run")
    assert not (tmp_path / "c").exists()


def test_compare_shows_string_metrics_as_missing(run_folder, tmp_path):
    good, odd = copy_of(run_folder, tmp_path / "good"), copy_of(run_folder, tmp_path / "odd")
    _string_metrics(odd)
    result = invoke("compare", good, odd, "--no-plots", "--out", tmp_path / "c")
    assert result.exit_code == 0, result.stderr
    assert "warning: " in result.stderr and "mean_ttft_ms is 'fast', not a number" in result.stderr
    ttft = next(ln for ln in result.stdout.splitlines() if ln.startswith("Mean TTFT (ms)")).split()[-2:]
    assert ttft[0] != "n/a" and ttft[1] == "n/a"


def test_compare_caps_what_it_reads_from_a_result_folder(run_folder, tmp_path, monkeypatch):
    from simbatch.app import compare

    good, big = copy_of(run_folder, tmp_path / "good"), copy_of(run_folder, tmp_path / "big")
    monkeypatch.setattr(compare, "MAX_JSON_BYTES", 5_000)
    with open(big / "summary.json", "a") as f:
        f.write(" " * 5_000)
    one_line(invoke("compare", good, big, "--out", tmp_path / "c"), str(big / "summary.json"), "larger than 5,000 bytes")
    monkeypatch.setattr(compare, "MAX_JSON_BYTES", 10_000_000)
    monkeypatch.setattr(compare, "MAX_FRAME_BYTES", 100)
    one_line(invoke("compare", good, big, "--out", tmp_path / "c"), "requests.csv", "larger than 100 bytes", "--force")
    assert not (tmp_path / "c").exists()
    assert invoke("compare", good, big, "--no-plots", "--force", "--out", tmp_path / "c").exit_code == 0


# ================================================================== the servers' reach
@contextlib.contextmanager
def serving(server):
    """``server`` answering in a thread of this process until the block ends."""
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def viewer(tmp_path):
    """``simbatch view``'s server of a folder holding a report, a plot and a symlink out; its base URL."""
    import os

    from simbatch.app.cli.view import make_server

    folder = tmp_path / "r"
    (folder / "plots").mkdir(parents=True)
    (folder / "report.html").write_text("<html>the report</html>")
    (folder / "plots" / "a.png").write_bytes(b"\x89PNG")
    (tmp_path / "secret.txt").write_text("secret")
    os.symlink("/", folder / "link")
    os.symlink(tmp_path / "secret.txt", folder / "plots" / "b.png")
    with serving(make_server(folder)) as server:
        yield server


def http_get(port: int, path: str, host: str | None = None) -> tuple[int, bytes, dict]:
    """GET ``path`` from 127.0.0.1:``port`` with this Host header (default: 127.0.0.1:port)."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest("GET", path, skip_host=True)
        connection.putheader("Host", host or f"127.0.0.1:{port}")
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        connection.close()


def test_view_serves_the_folders_own_files(viewer):
    port = viewer.server_port
    assert http_get(port, "/report.html")[:2] == (200, b"<html>the report</html>")
    status, body, headers = http_get(port, "/plots/a.png")
    assert (status, body, headers["Content-Type"]) == (200, b"\x89PNG", "image/png")
    status, _, headers = http_get(port, "/")
    assert status in (301, 302) and headers["Location"] == "/report.html"


@pytest.mark.parametrize("path", ["/link/etc/passwd", "/link/", "/plots/b.png", "/plots/", "/plots", "/../secret.txt",
                                  "/%2e%2e/secret.txt", "/report.html%00", "/nothing.html"])
def test_view_follows_no_link_out_and_lists_no_folder(viewer, path):
    status, body, _ = http_get(viewer.server_port, path)
    assert status == 404 and b"secret" not in body and b"passwd" not in body and b"Directory listing" not in body


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "LOCALHOST:{port}"])
def test_view_answers_its_own_host(viewer, host):
    port = viewer.server_port
    assert http_get(port, "/report.html", host.format(port=port))[0] == 200


@pytest.mark.parametrize("host", ["evil.example:{port}", "127.0.0.1.evil.example:{port}", "localhost:1",
                                  "127.0.0.1", "", "localhost:{port}@evil.example"])
def test_view_refuses_another_host_dns_rebinding(viewer, host):
    port = viewer.server_port
    status, body, _ = http_get(port, "/report.html", host.format(port=port) or " ")
    assert status == 403 and b"the report" not in body


def test_explore_refuses_another_host(tmp_path):

    from simbatch.app.explore import make_server

    with serving(make_server(scenario(tmp_path))) as server:
        port = server.server_port
        assert http_get(port, "/")[0] == 200
        status, body, _ = http_get(port, "/simulate?rate=3", f"rebound.example:{port}")
    assert status == 403 and b"summary" not in body


@pytest.mark.parametrize("error", [BrokenPipeError, ConnectionResetError, ConnectionAbortedError])
def test_a_client_that_left_leaves_no_traceback(viewer, capsys, error):
    try:
        raise error(32, "gone")
    except OSError:
        viewer.handle_error(None, ("127.0.0.1", 1))
    assert capsys.readouterr().err == ""
    try:
        raise RuntimeError("a real bug")
    except RuntimeError:
        viewer.handle_error(None, ("127.0.0.1", 1))
    assert "a real bug" in capsys.readouterr().err  # anything else is still reported


def test_explore_answers_a_failed_simulation_with_a_line_not_an_empty_reply(tmp_path, monkeypatch, capsys):

    from simbatch.app import explore

    def broken(path, query):
        raise OverflowError("cannot convert float infinity to integer")

    server = explore.make_server(scenario(tmp_path))
    monkeypatch.setattr(explore, "simulate_page", broken)
    with serving(server):
        status, body, _ = http_get(server.server_port, "/simulate?tau0_ms=3")
    assert status == 500 and "OverflowError: cannot convert float infinity" in json.loads(body)["error"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


# ================================================================== leftovers
def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_later_run_removes_what_killed_runs_left_and_nothing_else(tmp_path, monkeypatch):
    import os

    from simbatch.app import atomic

    monkeypatch.chdir(tmp_path)
    parent = tmp_path / "results" / "small"
    parent.mkdir(parents=True)
    dead, alive = atomic.partial_prefix("20240101-000000", _dead_pid()), atomic.partial_prefix("x", os.getpid())
    stale = parent / f"{dead}abc123"
    (stale / "plots").mkdir(parents=True)
    (stale / "requests.csv").write_text("25 MB of rows")
    running = parent / f"{alive}def456"  # another run of this very process, still writing
    running.mkdir()
    foreign = parent / ".notes.partial-old"  # not ours to judge: no owner in its name
    foreign.mkdir()
    elsewhere = tmp_path / "keep"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("x")
    link = parent / f"{atomic.partial_prefix('y', _dead_pid())}link"
    os.symlink(elsewhere, link)  # a link named like a leftover: removed as a link, never followed
    result = invoke("run", scenario(tmp_path), "--no-plots", "--quiet")
    assert result.exit_code == 0, result.stderr
    assert not stale.exists() and running.is_dir() and foreign.is_dir()
    assert (elsewhere / "precious").is_file()
    assert len([p for p in parent.iterdir() if not p.name.startswith(".")]) == 1


def test_a_sweep_that_fills_the_disk_leaves_no_truncated_plot(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    real = Figure.savefig

    def full_disk(self, path, *args, **kwargs):
        real(self, path, *args, **kwargs)
        with open(path, "r+b") as f:
            f.truncate(100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full_disk)
    out = tmp_path / "sw"
    result = invoke("sweep", scenario(tmp_path), "-p", "workload.arrival.rate=1,2", "-r", "1", "-w", "1", "-o", out)
    one_line(result, "No space left on device")
    assert (out / "summary.csv").is_file()
    assert not list(out.glob("*.png")) and not [p for p in out.iterdir() if ".partial-" in p.name]


# ================================================================== wrong results, silently: the clock
def trace_scenario(tmp_path: Path, rows: list[str], **trace) -> Path:
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{r}\n" for r in rows))
    return scenario(tmp_path, {"name": "traced", "workload": {"trace": {"path": "t.csv", **trace}}})


def test_arrivals_past_the_clock_are_refused_naming_the_rate(tmp_path):
    text = one_line(invoke("validate", scenario(tmp_path), "--set", "workload.arrival.rate=1e-12"),
                    "workload.arrival.rate", "past", "s the simulation clock holds")
    assert "4.6e+09 s" in text
    one_line(invoke("run", scenario(tmp_path), "--set", "workload.arrival.rate=1e-12", "--out", tmp_path / "r"),
             "workload.arrival.rate")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("rows", "trace", "words"), [
    (["1700000000000,10,5", "1700000000500,12,6"], {"keep_time_origin": True}, ["epoch milliseconds"]),
    (["0,10,5", "1e15,12,6"], {}, ["t.csv:3:", "'1e15'"]),
    (["0,10,5", "1e300,12,6"], {}, ["'1e300'"]),
    (["0,10,5", "1,12,6"], {"time_scale": 1e308}, ["time_scale"]),
])
def test_trace_times_past_the_clock_are_refused(tmp_path, rows, trace, words):
    one_line(invoke("validate", trace_scenario(tmp_path, rows, **trace)), "workload.trace", "the simulation clock",
             *words)


def test_epoch_seconds_with_the_time_origin_kept_still_replay(tmp_path):
    result = invoke("validate", trace_scenario(tmp_path, ["1700000000.0,10,5", "1700000000.5,12,6"],
                                               keep_time_origin=True))
    assert result.exit_code == 0, result.stderr


def test_the_frame_builder_refuses_a_negative_latency(tmp_path):
    from simbatch.analysis.summary import requests_frame
    from simbatch.engine import Engine
    from simbatch.inputs.loading import load_scenario
    from simbatch.workload import generate

    sc = load_scenario(scenario(tmp_path))
    workload = generate(sc)
    engine = Engine(sc, workload)
    engine.run()
    engine.recorder.finish_s[3] = -1.0  # what a wrapped clock gives
    with pytest.raises(RuntimeError, match="negative latency"):
        requests_frame(workload, engine.recorder)


# ================================================================== unbounded inputs
def test_a_compressed_trace_is_sized_by_its_rows_not_its_bytes(tmp_path, monkeypatch):
    import gzip

    from simbatch.inputs import guard
    from simbatch.inputs.loading import load_scenario

    rows = 200_000
    with gzip.open(tmp_path / "t.csv.gz", "wt") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "0,1,1\n" * rows)
    assert (tmp_path / "t.csv.gz").stat().st_size < 5_000
    path = scenario(tmp_path, {"name": "gz", "workload": {"trace": {"path": "t.csv.gz"}}})
    assert guard.expected_requests(load_scenario(path)) == rows
    monkeypatch.setattr(guard, "BYTES_PER_REQUEST", guard.MAX_BYTES / 1_000)
    one_line(invoke("validate", path), "run too large", "200,000 requests")
    # Decompressing past the scan's cap is itself too much: the trace counts as too large.
    monkeypatch.setattr(guard, "_MAX_TRACE_SCAN_BYTES", 100_000)
    assert guard.expected_requests(load_scenario(path)) == float("inf")


def test_a_compressed_length_file_is_capped_decompressed(tmp_path, monkeypatch):
    import gzip

    from simbatch.workload import csvfile

    with gzip.open(tmp_path / "l.csv.gz", "wt") as f:
        f.write("len\n" + "7\n" * 100_000)
    data = {**SMALL, "workload": {**SMALL["workload"], "prompt_tokens": {"dist": "empirical", "path": "l.csv.gz",
                                                                          "column": "len"}}}
    assert invoke("validate", scenario(tmp_path, data)).exit_code == 0
    monkeypatch.setattr(csvfile, "MAX_LENGTH_FILE_BYTES", 10_000)
    one_line(invoke("validate", scenario(tmp_path, data)), "workload.prompt_tokens.path", "10,000 bytes")


def test_num_speculative_tokens_of_a_billion_is_answered_at_once(tmp_path):
    from simbatch.features.speculative import expected_tokens_per_step

    for k, alpha in ((1, 0.5), (4, 0.7), (7, 0.0), (30, 0.999)):
        assert expected_tokens_per_step(k, alpha) == pytest.approx(sum(alpha ** j for j in range(k + 1)), rel=1e-12)
    assert expected_tokens_per_step(10**12, 0.7) == pytest.approx(1 / 0.3, rel=1e-12)
    data = yaml.safe_load((Path(__file__).parent.parent / "scenarios" / "speculative.yaml").read_text())
    data["device"]["speculative"]["num_speculative_tokens"] = 10**9
    data["workload"] = {**data["workload"], "duration_s": None, "num_requests": 20}
    assert invoke("validate", scenario(tmp_path, data)).exit_code == 0


# ================================================================== a name YAML cannot write out
def test_an_escaped_emoji_name_is_the_emoji_and_a_lone_surrogate_is_refused(tmp_path):
    from simbatch.inputs.loading import load_scenario

    (tmp_path / "e.yaml").write_text('name: "\\ud83d\\ude80 launch"\nworkload: {num_requests: 5}\n')
    assert load_scenario(tmp_path / "e.yaml").name == "\U0001f680 launch"
    (tmp_path / "l.yaml").write_text('name: "half \\ud83d"\nworkload: {num_requests: 5}\n')
    one_line(invoke("validate", tmp_path / "l.yaml"), "l.yaml:1:7: name:", "lone surrogate", "\\ud83d")
    one_line(invoke("validate", scenario(tmp_path), "--set", 'name="\\ud83d"'), "--set: name:")


# ================================================================== what a new user trips on: the verdict
SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def stability_of(name: str, *overrides: str):
    from simbatch.analysis.capacity import expected_stability
    from simbatch.inputs.loading import load_scenario
    from simbatch.workload import generate

    sc = load_scenario(SCENARIOS / f"{name}.yaml", list(overrides))
    return expected_stability(sc, generate(sc))


def test_a_finite_burst_is_a_burst_not_an_infinite_overload(tmp_path):
    st = stability_of("stable", "workload.arrival.rate=inf", "workload.num_requests=10", "workload.duration_s=null")
    assert st.stable and st.burst == 10
    assert st.verdict.startswith("a burst of 10 requests at t = 0") and "inf" not in st.verdict
    result = invoke("run", SCENARIOS / "stable.yaml", "--request-rate", "inf", "--num-prompts", "10", "--set",
                    "workload.duration_s=null", "--no-plots", "--out", tmp_path / "r")
    assert result.exit_code == 0, result.stderr
    assert "oversubscribed" not in result.stdout and "∞" not in result.stdout and "inf×" not in result.stdout
    assert "Verdict: a burst of 10 requests at t = 0" in result.stdout
    drain = float(next(ln for ln in result.stdout.splitlines() if ln.startswith("Burst drains in about (s):"))
                  .split()[-1])
    duration = json.loads((tmp_path / "r" / "summary.json").read_text())["duration"]
    assert drain == pytest.approx(duration, rel=0.25)  # the closed form's drain against the run's


def test_a_client_that_holds_requests_back_is_in_the_verdict(tmp_path):
    st = stability_of("stable", "workload.max_concurrency=8")
    assert not st.stable and st.offered_load < 1  # the server could carry it; eight in flight cannot
    assert st.verdict.startswith("client-bound") and "8 in flight" in st.verdict and "4.0" in st.verdict
    assert st.client_capacity_requests_per_s == pytest.approx(8 / (500 * (20 + 8 * 0.2) / 1e3), rel=1e-9)
    result = invoke("run", SCENARIOS / "stable.yaml", "--max-concurrency", "8", "--set", "workload.duration_s=30",
                    "--no-plots", "--out", tmp_path / "r")
    assert result.exit_code == 0, result.stderr
    assert "Verdict: client-bound" in result.stdout
    wait_ms = json.loads((tmp_path / "r" / "summary.json").read_text())["mean_client_wait_ms"]
    assert wait_ms > 10_000  # the run agrees: requests wait at the client for many seconds
    roomy = stability_of("stable", "workload.max_concurrency=64")
    assert roomy.stable and "64 in flight carry it" in roomy.verdict


def test_expected_max_is_the_mean_of_the_longest_of_b_draws():
    import numpy as np

    from simbatch.analysis.capacity import expected_max

    values = np.random.default_rng(3).lognormal(5, 1.2, 500).astype(int) + 1
    draws = np.random.default_rng(4).choice(values, size=(200_000, 8)).max(axis=1)
    assert expected_max(values, 8) == pytest.approx(draws.mean(), rel=0.01)
    assert expected_max(values, 1) == pytest.approx(values.mean(), rel=1e-12)
    assert expected_max(np.array([7, 7, 7]), 32) == pytest.approx(7.0)


def test_request_level_batching_pays_for_each_batchs_longest_request():
    continuous = stability_of("heavy_tail")
    static = stability_of("heavy_tail", "batching.mode=static")
    assert continuous.stable and not static.stable
    assert static.capacity_requests_per_s < continuous.capacity_requests_per_s / 2
    assert stability_of("stable", "batching.mode=static").offered_load == pytest.approx(continuous_load := stability_of(
        "stable").offered_load, rel=1e-9) and continuous_load < 1  # equal lengths: no straggler to wait for


def test_compare_gives_each_column_its_own_verdict(tmp_path):
    result = invoke("compare", SCENARIOS / "heavy_tail.yaml", "--modes", "static,continuous", "--set",
                    "workload.num_requests=120", "--no-plots", "--out", tmp_path / "c")
    assert result.exit_code == 0, result.stderr
    row = next(ln for ln in result.stdout.splitlines() if ln.startswith("Stability (closed form)"))
    static, continuous = re.split(r"\s{2,}", row[34:].strip())
    assert static.startswith("over") and continuous.endswith("%")
    assert "static: verdict: oversubscribed" in result.stdout and "continuous: verdict: stable" in result.stdout
    assert "Verdict:" not in result.stdout  # no single verdict above columns it does not describe
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert summary["static"]["stability"]["stable"] is False and summary["continuous"]["stability"]["stable"]
    ttft = [float(v.replace(",", "")) for v in next(ln for ln in result.stdout.splitlines()
                                                     if ln.startswith("Mean TTFT (ms)"))[34:].split()]
    assert ttft[0] > 10 * ttft[1]  # the runs agree with the verdicts


# ================================================================== report.html has the numbers
def assert_page(path: Path, *texts: str) -> None:
    """The page holds every text, and no script a name smuggled in."""
    page = path.read_text(encoding="utf-8")
    for text in texts:
        assert text in page, text
    assert "<script>alert" not in page


def test_a_run_named_with_an_escaped_emoji_writes_a_report_with_its_numbers(tmp_path, monkeypatch):
    from simbatch.app import plots

    monkeypatch.setattr(plots, "save_run_plots", lambda folder, result: [])  # the page is the point, not the PNGs
    (tmp_path / "e.yaml").write_text('name: "\\ud83d\\ude80 launch"\n'
                                     + yaml.safe_dump({k: v for k, v in SMALL.items() if k != "name"}))
    out = tmp_path / "r"
    result = invoke("run", tmp_path / "e.yaml", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert_page(out / "report.html", "Request throughput (req/s):", "Mean TTFT (ms):", "Stability check",
                "Verdict: stable", "max_num_batched_tokens: 512", "launch")


def test_a_comparison_report_has_the_table_and_each_verdict(tmp_path):
    from simbatch.app.webreport import write_report
    from simbatch.inputs.loading import load_scenario
    from simbatch.simulation import simulate

    hostile = scenario(tmp_path, {**SMALL, "name": "<script>alert(1)</script>"})
    runs = {mode: simulate(load_scenario(hostile, [f"batching.mode={mode}"])) for mode in ("static", "continuous")}
    write_report(tmp_path / "report.html", runs, "simbatch compare: <script>alert(1)</script>")
    assert_page(tmp_path / "report.html", "Stability (closed form)", "static: verdict:", "continuous: verdict:",
                "Mean TTFT (ms)", "mode: static", "mode: continuous")


# ================================================================== compare's columns say what they are
def test_vary_columns_are_labelled_by_key_and_value(tmp_path):
    from simbatch.app.compare import variants

    assert list(variants(["kv_cache.enable_prefix_caching=true,false"], [])) == ["enable_prefix_caching=true",
                                                                                 "enable_prefix_caching=false"]
    assert list(variants(["batching.mode=static,continuous"], [])) == ["static", "continuous"]  # a mode names itself
    out = tmp_path / "c"
    result = invoke("compare", scenario(tmp_path), "--vary", "batching.max_num_seqs=4,8", "--no-plots", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0].split() == ["max_num_seqs=4", "max_num_seqs=8"]
    assert {p.name for p in out.iterdir()} >= {"max_num_seqs=4", "max_num_seqs=8"}


def test_result_folders_are_labelled_by_their_scenario(tmp_path, run_folder):
    other = {**SMALL, "name": "other"}
    assert invoke("run", scenario(tmp_path, other), "--no-plots", "--quiet", "--out", tmp_path / "o").exit_code == 0
    a, b = copy_of(run_folder, tmp_path / "20240101-000000"), copy_of(run_folder, tmp_path / "20240102-000000")
    result = invoke("compare", a, tmp_path / "o", "--no-plots", "--out", tmp_path / "c1")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0].split() == ["small", "other"]
    result = invoke("compare", a, b, "--no-plots", "--out", tmp_path / "c2")
    assert result.stdout.splitlines()[0].split() == ["small/20240101-000000", "small/20240102-000000"]


# ================================================================== sweeps keep every result, and say how to resume
def test_a_second_sweep_gets_a_folder_of_its_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = scenario(tmp_path)
    for rates in ("1,2", "3"):
        result = invoke("sweep", path, "-p", f"workload.arrival.rate={rates}", "-r", "1", "-w", "1", "--no-plots")
        assert result.exit_code == 0, result.stderr
    folders = sorted((tmp_path / "results" / "small").iterdir())
    assert [f.name.startswith("sweep-") for f in folders] == [True, True]
    assert sorted(len(__import__("pandas").read_csv(f / "summary.csv")) for f in folders) == [1, 2]


def test_capacity_search_has_timestamped_folders_and_no_plots(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ("capacity-search", scenario(tmp_path), "--slo", "ttft_p99_ms=2000", "-r", "1", "-w", "1",
            "--tolerance", "0.2", "--no-plots")
    for _ in range(2):
        result = invoke(*args)
        assert result.exit_code == 0, result.stderr
    folders = sorted((tmp_path / "results" / "small").iterdir())
    assert len(folders) == 2 and all(f.name.startswith("capacity-") for f in folders)
    assert {p.name for p in folders[0].iterdir()} == {"manifest.json", "points", "capacity.csv", "probes.csv"}
    assert "slo_vs_rate.png" not in result.stdout


def test_an_interrupted_sweep_says_how_to_resume(tmp_path, monkeypatch):
    from simbatch.app.sweep import runner

    calls = []

    def interrupted(sc):
        calls.append(sc)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(sc)

    real = runner.simulate_run
    monkeypatch.setattr(runner, "simulate_run", interrupted)
    monkeypatch.chdir(tmp_path)
    result = invoke("sweep", scenario(tmp_path), "-p", "workload.arrival.rate=1,2", "-r", "1", "-w", "1", "--no-plots")
    assert result.exit_code == 130
    folder = next((tmp_path / "results" / "small").iterdir())
    assert result.stderr.splitlines()[0] == "interrupted"
    assert f"--out {Path('results') / 'small' / folder.name}" in result.stderr


# ================================================================== --json for scripts
def test_run_json_is_one_document_on_stdout(tmp_path):
    result = invoke("run", scenario(tmp_path), "--json", "--no-plots", "--out", tmp_path / "r")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["folder"] == str(tmp_path / "r")
    assert doc["summary"] == json.loads((tmp_path / "r" / "summary.json").read_text())
    assert doc["summary"]["stability"]["verdict"].startswith("stable")


def test_compare_json_has_a_summary_per_column(tmp_path, run_folder):
    result = invoke("compare", scenario(tmp_path), "--modes", "static,continuous", "--json", "--no-plots",
                    "--out", tmp_path / "c")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert list(doc["columns"]) == ["static", "continuous"] and doc["folder"] == str(tmp_path / "c")
    assert doc["columns"]["static"]["mode"] == "static"
    result = invoke("compare", run_folder, copy_of(run_folder, tmp_path / "again"), "--json", "--no-plots",
                    "--out", tmp_path / "c2")
    assert result.exit_code == 0, result.stderr
    assert len(json.loads(result.stdout)["columns"]) == 2


def test_capacity_json_has_the_curve_and_the_check():
    doc = json.loads((result := invoke("capacity", "--rate", "3", "--mean-output-tokens", "500", "--json")).stdout)
    assert result.exit_code == 0
    rows = {row["batch_size"]: row for row in doc["curve"]}
    assert rows[64]["tokens_per_s"] == pytest.approx(64 / (20 + 0.2 * 64) * 1e3, rel=1e-9)
    assert doc["stability"]["offered_load"] == pytest.approx(3 * 500 / rows[64]["tokens_per_s"], rel=1e-9)
    assert doc["stability"]["verdict"].startswith("stable")
    doc = json.loads(invoke("capacity", "--json").stdout)
    assert doc["stability"] is None and len(doc["curve"]) == 7


def test_sweep_and_capacity_search_json(tmp_path):
    result = invoke("sweep", scenario(tmp_path), "-p", "workload.arrival.rate=1,2", "-r", "1", "-w", "1",
                    "--no-plots", "--json", "-o", tmp_path / "sw")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["folder"] == str(tmp_path / "sw") and [p["workload.arrival.rate"] for p in doc["points"]] == [1, 2]
    assert doc["points"][0]["request_throughput_mean"] > 0
    result = invoke("capacity-search", scenario(tmp_path), "--slo", "ttft_p99_ms=2000", "-r", "1", "-w", "1",
                    "--tolerance", "0.2", "--json", "-o", tmp_path / "cs")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["configurations"][0]["max_rate"] > 0 and doc["folder"] == str(tmp_path / "cs")


# ================================================================== shell completion
def test_install_completion_writes_the_script_and_it_completes(tmp_path, monkeypatch):
    from typer import _completion_shared
    from typer.testing import CliRunner

    from simbatch.app.cli import app

    monkeypatch.setenv("HOME", str(tmp_path))
    # The shell is detected from the process tree (a terminal's bash; here, whatever ran pytest): say bash.
    monkeypatch.setattr(_completion_shared, "_get_shell_name", lambda: "bash")
    result = CliRunner().invoke(app, ["--install-completion"], prog_name="simbatch")
    assert result.exit_code == 0, result.output
    assert "source" in (tmp_path / ".bashrc").read_text()
    script = next((tmp_path / ".bash_completions").glob("simbatch*"))
    assert "_SIMBATCH_COMPLETE" in script.read_text()
    env = {"_SIMBATCH_COMPLETE": "complete_bash", "COMP_WORDS": "simbatch c", "COMP_CWORD": "1"}
    done = CliRunner().invoke(app, [], prog_name="simbatch", env=env)
    assert {"compare", "capacity", "capacity-search", "calibrate"} <= set(done.output.split())
    env = {"_SIMBATCH_COMPLETE": "complete_bash", "COMP_WORDS": "simbatch run --goo", "COMP_CWORD": "2"}
    assert "--goodput" in CliRunner().invoke(app, [], prog_name="simbatch", env=env).output.split()


# ================================================================== a cost no GPU has
@pytest.mark.parametrize(("key", "value", "words"), [
    ("tau0_ms", 0.02, ["device.tau0_ms is 0.02 ms", "seconds", "20 ms"]),
    ("tau0_ms", 20_000, ["device.tau0_ms is 20000 ms", "microseconds", "20 ms"]),
    ("beta_ms", 500, ["device.beta_ms is 500 ms"]),
    ("prefill_ms_per_token", 1e-7, ["device.prefill_ms_per_token"]),
])
def test_a_cost_outside_what_any_gpu_does_is_warned_about(tmp_path, key, value, words):
    result = invoke("validate", scenario(tmp_path), "--set", f"device.{key}={value}")
    assert result.exit_code == 0, result.stderr
    warning = next(ln for ln in result.stderr.splitlines() if f"device.{key}" in ln)
    assert warning.startswith("warning: ") and all(w in warning for w in words), warning


def test_every_preset_and_the_defaults_are_within_the_plausible_costs(tmp_path):
    from simbatch.app.advice import PLAUSIBLE_MS
    from simbatch.config import Device
    from simbatch.hardware.cards import shipped
    from simbatch.hardware.preset import Deployment, fitted

    gpus, models = shipped()
    for gpu in gpus.values():
        for model in models.values():
            for tp in (1, 2, 4, 8):
                for fp8 in (False, True) if gpu.fp8_tflops else (False,):
                    for key, ms in Deployment(model, gpu, tp, fp8).device_ms(fitted()[0]).items():
                        if key == "moe":  # the experts' shape, not a cost
                            continue
                        low, high = PLAUSIBLE_MS[key]
                        assert low <= ms <= high, (model.name, gpu.name, tp, fp8, key, ms)
    for key, (low, high) in PLAUSIBLE_MS.items():
        default = Device.model_fields[key].default
        assert default in (0, None) or low <= default <= high
    assert "warning" not in invoke("validate", scenario(tmp_path)).stderr


# ================================================================== physical bounds: a line, not a silent absurdity
DISAGGREGATED = SCENARIOS / "disaggregated.yaml"


@pytest.mark.parametrize(("path", "sets", "words"), [
    (DISAGGREGATED, ["cluster.disaggregated.kv_transfer.latency_ms=1e300"],
     ["cluster.disaggregated.kv_transfer.latency_ms", "less than or equal to 60000"]),
    (DISAGGREGATED, ["cluster.disaggregated.kv_transfer.bandwidth_gb_s=1e-300"],
     ["cluster.disaggregated.kv_transfer.bandwidth_gb_s", "greater than or equal to 0.001"]),
    (DISAGGREGATED, ["cluster.disaggregated.kv_bytes_per_token=1e308"],
     ["cluster.disaggregated.kv_bytes_per_token", "less than or equal to 1000000000"]),
    (SCENARIOS / "speculative.yaml", ["device.speculative.draft_cost_fraction=1e308"],
     ["device.speculative.draft_cost_fraction", "less than or equal to 10"]),
    (None, ["device.tau0_ms=1e305"], ["device.tau0_ms", "less than or equal to 1000000"]),
    (None, ["device.beta_ms=1e305"], ["device.beta_ms"]),
    (None, ["kv_cache.num_blocks=100000000000000000000000"], ["kv_cache.num_blocks", "100,000,000"]),
    (None, ["kv_cache.gpu_kv_cache_tokens=100000000000000000000"], ["kv_cache.gpu_kv_cache_tokens"]),
    (None, ["sim.max_time_s=1e300"], ["sim.max_time_s", "the simulation clock"]),
    (None, ["workload.duration_s=1e300"], ["workload.duration_s", "the simulation clock"]),
    (None, ["scheduler.aging_s=1e300", "scheduler.policy=priority"], ["scheduler.aging_s"]),
    (None, ["batching.max_queue_delay_ms=1e300"], ["batching.max_queue_delay_ms"]),
    (None, ["device.preset=llama-3.1-8b/H100-SXM", "device.gpu_card={name: MyGPU, memory_gib: 80, "
            "memory_bandwidth_gb_s: 3000, bf16_tflops: 900, interconnect_gb_s: 400}"],
     ["device: gpu_card 'MyGPU' is not the GPU the preset names ('H100-SXM')"]),
    (None, ["device.preset=llama-3.1-8b/G", "device.gpu_card={name: G, memory_gib: 1e15, "
            "memory_bandwidth_gb_s: 3000, bf16_tflops: 900, interconnect_gb_s: 400}"],
     ["device.gpu_card.memory_gib", "less than or equal to 10000"]),
    (None, ["device.preset=llama-3.1-70b/L4", "kv_cache.num_blocks=1000"],
     ["device.preset", "llama-3.1-70b/L4", "weights", "exceed", "tp"]),
])
def test_physically_absurd_settings_are_refused(tmp_path, path, sets, words):
    args = [a for s in sets for a in ("--set", s)]
    one_line(invoke("validate", path or scenario(tmp_path), *args), *words)


def test_explore_answers_an_absurd_cost_with_a_400(tmp_path):

    from simbatch.app.explore import make_server

    with serving(make_server(scenario(tmp_path))) as server:
        status, body, _ = http_get(server.server_port, "/simulate?tau0_ms=1e305")
    assert status == 400 and "device.tau0_ms" in json.loads(body)["error"]


def test_a_num_blocks_the_gpu_cannot_hold_is_warned_about(tmp_path):
    result = invoke("validate", scenario(tmp_path), "--set", "device.preset=llama-3.1-8b/L4", "--set",
                    "kv_cache.num_blocks=100000")
    assert result.exit_code == 0, result.stderr
    assert "warning: kv_cache.num_blocks" in result.stderr and "auto" in result.stderr
    result = invoke("validate", scenario(tmp_path), "--set", "device.preset=llama-3.1-8b/L4", "--set",
                    "kv_cache.num_blocks=auto")
    assert result.exit_code == 0 and "num_blocks" not in result.stderr


def test_weights_larger_than_the_gpu_with_the_default_blocks_are_warned_about(tmp_path):
    result = invoke("validate", scenario(tmp_path), "--set", "device.preset=llama-3.1-70b/L4")
    assert result.exit_code == 0, result.stderr
    assert "warning: device.preset llama-3.1-70b/L4: its weights" in result.stderr and "cannot load" in result.stderr

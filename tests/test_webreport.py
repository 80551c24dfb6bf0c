"""report.html: self-contained, bounded, and drawing exactly the frames' requests and steps."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import numpy as np
import pytest
from test_cli import SCENARIOS, invoke

from simbatch import simulate
from simbatch.app import webreport
from simbatch.inputs.loading import load_scenario


@pytest.fixture(scope="module")
def heavy():
    return simulate(load_scenario(SCENARIOS / "heavy_tail.yaml", ["workload.num_requests=120"]))


def external_references(page: str) -> list[str]:
    """The src and href attributes of the page's own tags (the inlined scripts' text is not parsed)."""
    found = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.extend(f"{tag} {name}={value}" for name, value in attrs if name in ("src", "href"))

    Tags().feed(page)
    return found


def sources(layout) -> dict[str, dict]:
    """Every named data source of a built page: name -> its columns."""
    from bokeh.models import ColumnDataSource

    return {m.name: m.data for m in layout.select({"type": ColumnDataSource}) if m.name}


def test_the_gantt_has_a_bar_per_phase_each_request_reached(heavy):
    data = sources(webreport.build({"continuous": heavy}, "t"))["gantt:continuous"]
    rq = heavy.requests
    expected = len(rq) + rq["first_scheduled_s"].notna().sum() + rq["first_token_s"].notna().sum()
    assert len(data["request_id"]) == expected
    decode = np.asarray(data["phase"]) == "decode"
    done = rq.set_index("request_id")
    ids = np.asarray(data["request_id"])[decode]
    np.testing.assert_array_equal(np.asarray(data["left"])[decode], done.loc[ids, "first_token_s"])
    np.testing.assert_array_equal(np.asarray(data["right"])[decode], done.loc[ids, "finish_s"])


def test_a_big_run_is_sampled_and_the_page_says_so(heavy, monkeypatch):
    monkeypatch.setattr(webreport, "GANTT_MAX_REQUESTS", 50)
    layout = webreport.build({"continuous": heavy}, "t")
    ids = set(sources(layout)["gantt:continuous"]["request_id"])
    assert ids == set(range(0, 120, 3))  # one in three, by arrival
    header = layout.children[0].text
    assert "the timeline shows 40 of 120 requests (one in 3, by arrival)" in header


def test_the_pool_series_keep_the_frames_areas(heavy):
    it = heavy.iterations
    end_s = heavy.summary["duration"]
    pools = webreport.pool_series(heavy, end_s, bins=97)
    width = np.diff(pools["time_s"])
    busy = it["num_steps"] * it["duration_s"]
    assert (pools["running"][:-1] * width).sum() == pytest.approx((it["num_running"] * busy).sum())
    assert (pools["kv_blocks"][:-1] * width).sum() == pytest.approx((it["kv_blocks_used"] * busy).sum())
    # Waiting + running is the number in system, whose time average is Little's L.
    assert ((pools["running"] + pools["waiting"])[:-1] * width).sum() / end_s == pytest.approx(heavy.summary["L"])


def test_every_result_folder_gets_a_self_contained_report(tmp_path, monkeypatch):
    from simbatch.app import plots

    for name in ("save_run_plots", "save_compare_plots"):  # the PNGs are not what this test is about
        monkeypatch.setattr(plots, name, lambda *args, **kwargs: [])
    runs = []
    for command, name in (("run", "r"), ("compare", "c")):
        out = tmp_path / name
        result = invoke(command, SCENARIOS / "heavy_tail.yaml", "--set", "workload.num_requests=40", "--out", out, "-q")
        assert result.exit_code == 0, result.stderr
        runs.append(out)
    vllm = tmp_path / "vllm.json"
    vllm.write_text(json.dumps({"duration": 10.0, "completed": 3, "total_input_tokens": 30, "total_output_tokens": 60,
                                "request_throughput": 0.3, "output_throughput": 6.0, "total_token_throughput": 9.0,
                                "ttfts": [0.05, 0.07, 0.2], "input_lens": [10, 10, 10], "output_lens": [20, 20, 20]}))
    out = tmp_path / "cr"
    result = invoke("compare", runs[0], runs[1] / "static", vllm, "--out", out, "-q")
    assert result.exit_code == 0, result.stderr
    for folder in (*runs, out):
        page = (folder / "report.html").read_text()
        assert "Bokeh" in page and 'id="' in page
        assert external_references(page) == []  # nothing fetched: no script, style or image from elsewhere
        assert len(page) < 4_000_000


def test_no_plots_writes_no_report(tmp_path):
    out = tmp_path / "r"
    result = invoke("run", SCENARIOS / "heavy_tail.yaml", "--set", "workload.num_requests=20", "--out", out, "-q",
                    "--no-plots")
    assert result.exit_code == 0, result.stderr
    assert not (out / "report.html").exists()


@pytest.mark.parametrize("sections", [
    {"cluster": {"replicas": 3}},  # one request, two replicas that never see one
    {"workload": {"num_requests": 5}, "kv_cache": {"num_blocks": 2}},  # every request rejected
    {"workload": {"num_requests": 4, "arrival": {"process": "constant", "rate": 1}}},  # identical latencies
], ids=["empty_replicas", "nothing_finished", "identical_latencies"])
def test_valid_edge_cases_get_a_page(tmp_path, sections):
    from simbatch.config import Scenario

    result = simulate(Scenario.model_validate({"name": "edge", "workload": {"num_requests": 1}, **sections}))
    webreport.write_report(tmp_path / "report.html", {"a": result, "b": result}, "edge")
    assert "Bokeh" in (tmp_path / "report.html").read_text()

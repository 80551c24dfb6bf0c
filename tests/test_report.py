"""Tables, time series and plots: the numbers they show are the frames' numbers.

The time series are checked against independent sums (the integral of a binned series is the
frame's total, whatever the bins; the time average of the in-system series is the recorder's L);
the tables against the summary they print; the plots for what they draw and for leaking no state.
"""

from __future__ import annotations

import json
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from builders import make_scenario
from matplotlib.figure import Figure

from simbatch.analysis.capacity import stability
from simbatch.app import plots, report, results
from simbatch.app.plots import series
from simbatch.config import SLO, Device
from simbatch.simulation import simulate


def fixed(value: int) -> dict:
    return {"dist": "fixed", "value": value}


@pytest.fixture(scope="module")
def static_run():
    """Poisson arrivals into static batches: idle gaps, draining batches, padded slots."""
    return simulate(make_scenario(workload__num_requests=40, workload__arrival__rate=2.0,
                                  workload__prompt_tokens=fixed(8),
                                  workload__output_tokens={"dist": "uniform", "low": 1, "high": 30},
                                  batching__mode="static", batching__max_wait_ms=300.0))


@pytest.fixture(scope="module")
def continuous_run():
    return simulate(make_scenario(workload__num_requests=40, workload__arrival__rate=2.0,
                                  workload__prompt_tokens=fixed(8),
                                  workload__output_tokens={"dist": "uniform", "low": 1, "high": 30}))


# ------------------------------------------------------------------------------------------ series
def test_integral_of_boxes_matches_brute_force():
    rng = np.random.default_rng(3)
    starts = rng.uniform(0, 10, 50)
    ends = starts + rng.uniform(0, 3, 50)
    values = rng.uniform(-2, 5, 50)
    times = np.array([0.0, 0.5, 3.3, 7.0, 12.9, 20.0])
    expected = [sum(v * max(0.0, min(t, e) - s) for s, e, v in zip(starts, ends, values, strict=True))
                for t in times]
    assert series.integral_at(times, starts, ends, values) == pytest.approx(expected, abs=1e-9)
    assert list(series.integral_at(times, [], [], [])) == [0.0] * len(times)


def test_bin_means_are_exact_time_averages():
    # One box of height 4 over [1, 2.5): bins of width 1 see 0, 4, 2 (half covered), 0.
    means = series.bin_means(np.arange(5.0), np.array([1.0]), np.array([2.5]), np.array([4.0]))
    assert means == pytest.approx([0, 4, 2, 0])


@pytest.mark.parametrize("bins", [7, 600])
def test_in_system_series_averages_to_littles_l(static_run, bins):
    edges = series.grid(static_run.summary["duration"], bins)
    in_system = series.in_system(static_run.requests, edges)
    assert in_system.mean() == pytest.approx(static_run.summary["L"], rel=1e-9)


@pytest.mark.parametrize("run", ["static_run", "continuous_run"])
def test_output_token_series_adds_up_to_every_token(run, request):
    result = request.getfixturevalue(run)
    end = series.end_time_s(result.iterations, result.requests)
    assert end == pytest.approx(result.summary["duration"])
    edges = series.grid(end, 97)
    total = result.requests["generated_tokens"].sum()
    assert series.cumulative_output_tokens(result.iterations, result.requests, edges)[-1] == pytest.approx(total)
    per_s = series.output_tokens_per_s(result.iterations, result.requests, edges)
    assert (per_s * np.diff(edges)).sum() == pytest.approx(total)


def test_idle_slots_are_static_padding(static_run, continuous_run):
    it = static_run.iterations
    idle = series.idle_slots(it)
    # With fixed prompts no prompt is padded, so every padded token is an idle decode slot.
    assert (idle * it["num_steps"]).sum() == (it["padded_tokens"] * it["num_steps"]).sum() > 0
    assert not series.idle_slots(continuous_run.iterations).any()
    # Slots computed never exceed the batch a static batch was formed with.
    assert (it["batch_size"] + idle).max() <= static_run.scenario.batching.max_num_seqs


def test_running_series_matches_the_step_records(continuous_run):
    it = continuous_run.iterations
    edges = series.grid(continuous_run.summary["duration"], 50)
    running = series.step_mean(it, it["num_running"], edges)
    busy_area = (it["num_running"] * it["duration_s"] * it["num_steps"]).sum()
    assert (running * np.diff(edges)).sum() == pytest.approx(busy_area)


# ------------------------------------------------------------------------------------------ tables
def test_result_table_prints_the_summary(continuous_run):
    s = continuous_run.summary
    table = report.result_table(s)
    assert table.splitlines()[0] == "=" * 12 + " Serving Benchmark Result " + "=" * 12
    assert f"{'Successful requests:':<40} {s['completed']:,}" in table
    assert f"{'Output token throughput (tok/s):':<40} {s['output_throughput']:,.2f}" in table
    for short in ("TTFT", "TPOT", "ITL", "E2EL"):
        for stat in ("Mean", "Median", "P99"):
            assert f"{stat} {short} (ms):" in table
    assert "goodput" not in table and "Unfinished" not in table
    with_slo = report.result_table({**s, "request_goodput": 1.25, "unfinished": 3})
    assert f"{'Request goodput (req/s):':<40} 1.25" in with_slo and "Unfinished requests" in with_slo


def test_stability_block_is_the_chapters_worked_example():
    st = stability(Device(tau0_ms=20, beta_ms=0.2), 64, 20.0, 500.0)
    block = report.stability_block(st)
    assert "Offered token load λ·E[out] (tok/s):     10,000.00" in block
    assert "Capacity B/τ(B) at B = 64 (tok/s):       1,951.22" in block
    assert "Verdict: oversubscribed 5.1" in block
    assert "Concurrency demanded L = λ·W_B:          328.0" in block
    assert "Traffic needs 264 more requests resident than there are slots" in block
    calm = report.stability_block(stability(Device(tau0_ms=20, beta_ms=0.2), 64, 1.0, 100.0, replicas=2))
    assert "stable" in calm and "more requests resident" not in calm and "(64 × 2 replicas)" in calm


def test_littles_law_line():
    line = report.littles_law_line({"L": 10.0, "arrival_rate": 2.0, "W_s": 4.9, "littles_law_rel_error": 0.02})
    assert line == ("L (time-averaged, from engine state) = 10.00; λ·W (from request rows) = 9.80; "
                    "difference 2.0000 %")


def test_compare_table_has_a_column_per_mode(static_run, continuous_run):
    table = report.compare_table({"static": static_run, "continuous": continuous_run})
    lines = table.splitlines()
    assert lines[0].split() == ["static", "continuous"]
    pad = next(ln for ln in lines if ln.startswith("Padded tokens share (%)")).split()[-2:]
    assert float(pad[0]) == pytest.approx(100 * report.padded_share(static_run.iterations), abs=0.05)
    assert float(pad[1]) == 0.0
    assert not any(ln.startswith("Request goodput") for ln in lines)  # no SLO, no row


def test_rejections_line_counts_reasons():
    requests = pd.DataFrame({"status": ["rejected", "finished", "rejected", "rejected"],
                             "reason": ["queue_full", "", "never_fits", "queue_full"]})
    assert report.rejections_line(requests) == "Rejected by reason: queue_full 2, never_fits 1"
    assert report.rejections_line(requests[requests["status"] == "finished"]) == ""


def test_padded_share_by_hand():
    it = pd.DataFrame({"num_steps": [1, 3], "decode_tokens": [0, 2], "prefill_tokens": [10, 0],
                       "padded_tokens": [2, 1]})
    # pad = 2 + 3 = 5 of 10 + 6 + 5 = 21 tokens computed
    assert report.padded_share(it) == pytest.approx(5 / 21)


def test_tenant_table_only_with_several_tenants(continuous_run):
    assert report.tenant_table(continuous_run.requests) == ""
    mixed = simulate(make_scenario(workload__num_requests=30, workload__classes=[
        {"name": "chat", "priority": 0}, {"name": "jobs", "priority": 1}]))
    lines = report.tenant_table(mixed.requests).splitlines()
    assert lines[1].split()[:4] == ["Tenant", "prio", "done", "rejected"]
    assert [ln.split()[:2] for ln in lines[2:]] == [["chat", "0"], ["jobs", "1"]]
    assert sum(int(ln.split()[2]) for ln in lines[2:]) == mixed.summary["completed"]


def test_capacity_table():
    table = report.capacity_table(Device(tau0_ms=20, beta_ms=0.2), 48, replicas=3)
    rows = [ln.split()[0] for ln in table.splitlines() if ln.strip()[:1].isdigit()]
    assert rows == ["1", "2", "4", "8", "16", "32", "48"]
    assert "B = 100.0 (beyond max_num_seqs = 48)" in table and "With 3 replicas at B = 48" in table


def test_json_safe():
    data = {"a": math.nan, "b": [math.inf, np.int64(3)], "c": np.float64(1.5)}
    assert json.dumps(results.json_safe(data)) == '{"a": null, "b": [null, 3], "c": 1.5}'
    assert results.json_safe({"rate": math.inf}, str) == {"rate": "inf"}


# ------------------------------------------------------------------------------------------ plots
def test_plots_draw_every_run_and_leak_no_pyplot_state(tmp_path, static_run, continuous_run):
    plt.close("all")
    runs = {"static": static_run, "continuous": continuous_run}
    figures = [plots.output_throughput(runs, capacity_tokens_per_s=100.0, offered_tokens_per_s=50.0),
               plots.cumulative_output_tokens(runs), plots.running_waiting(runs, slots=4),
               plots.kv_usage(runs, num_blocks=64), plots.batch_size(runs, max_num_seqs=4),
               plots.ttft_cdf(runs, slo=SLO(ttft_ms=500.0)), plots.e2e_histogram(runs, full_batch_latency_s=0.3),
               plots.latency_by_request(runs)]
    assert all(isinstance(f, Figure) for f in figures)
    assert plt.get_fignums() == []
    # Two panels for the two runs of the batch-size plot, each named after its mode.
    assert [ax.get_ylabel().split("\n")[0] for ax in figures[4].axes] == ["static", "continuous"]
    # The static panel shows tail idling; the continuous one does not.
    assert "tail idling" in " ".join(t.get_text() for t in figures[4].axes[0].texts)
    assert "tail idling" not in " ".join(t.get_text() for t in figures[4].axes[1].texts)
    legend = [t.get_text() for t in figures[5].axes[0].get_legend().get_texts()]
    assert any(t.startswith("static: median") for t in legend) and "TTFT SLO 500 ms" in legend
    path = plots.save_figure(figures[0], tmp_path / "x.png")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_plots_from_csv_frames(tmp_path, static_run):
    """A result folder's CSVs plot as well as the live frames (e.g. in a notebook, later)."""
    static_run.requests.to_csv(tmp_path / "r.csv", index=False)
    static_run.iterations.to_csv(tmp_path / "i.csv", index=False)
    run = plots.Run(pd.read_csv(tmp_path / "i.csv"), pd.read_csv(tmp_path / "r.csv"))
    for figure in (plots.running_waiting({"static": run}), plots.latency_by_request({"static": run})):
        assert isinstance(figure, Figure)

"""The benchmark client (simbatch.engine.client): requests held back at the client, and closed-loop users.

The "must show" of issue 16: ``simbatch run --max-concurrency 8`` never has more than 8 requests in
the server, and reports the client-side wait apart from the server's latencies.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from simbatch.app.cli import app
from simbatch.inputs.loading import scenario_from_dict
from simbatch.simulation import simulate

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def max_in_server(requests: pd.DataFrame) -> int:
    """The most requests ever between their arrival at the server and their finish (a finish frees first)."""
    admitted = requests[requests["status"] != "rejected"]
    times = np.concatenate([admitted["arrival_s"], admitted["finish_s"]])
    steps = np.concatenate([np.ones(len(admitted)), -np.ones(len(admitted))])
    order = np.lexsort((steps, times))  # at equal times the finish (-1) comes before the arrival
    return int(np.cumsum(steps[order]).max())


def test_max_concurrency_8_caps_the_server_and_reports_client_wait_apart(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(SCENARIOS / "stable.yaml"), "--max-concurrency", "8",
                                      "--set", "workload.duration_s=30", "--no-plots", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    requests = pd.read_csv(out / "requests.csv")
    assert len(requests) > 50 and (requests["status"] == "finished").all()
    assert max_in_server(requests) == 8  # reached, never exceeded
    # Held back at the client, and that wait is not in TTFT: TTFT stays a step or two (no queue at the server).
    assert requests["client_wait_s"].max() > 10
    assert requests["ttft_s"].max() < 0.1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mean_client_wait_ms"] == pytest.approx(1e3 * requests["client_wait_s"].mean())
    assert summary["mean_ttft_ms"] < 100 < summary["mean_client_wait_ms"]
    assert "Mean client wait (ms):" in result.stdout
    assert not (out / "plots").exists()  # --no-plots


def _scenario(**workload) -> dict:
    return {"workload": {"num_requests": 120, **workload}, "batching": {"max_num_seqs": 16}}


def test_client_sends_in_order_at_intended_time_or_when_a_slot_frees():
    data = _scenario(arrival={"rate": 40}, max_concurrency=4,
                     output_tokens={"dist": "uniform", "low": 1, "high": 60})
    capped = simulate(scenario_from_dict(data), check_invariants=True)
    free = simulate(scenario_from_dict({**data, "workload": {k: v for k, v in data["workload"].items()
                                                            if k != "max_concurrency"}}))
    rq, intended = capped.requests, free.requests["arrival_s"].to_numpy()
    sent = rq["arrival_s"].to_numpy()
    assert np.allclose(sent - rq["client_wait_s"], intended)  # the same requests, each sent no earlier
    assert (np.diff(sent) >= 0).all() and (rq["client_wait_s"] >= 0).all()
    assert max_in_server(rq) == 4
    # A request that waited was sent exactly when an earlier one finished.
    finishes = set(rq["finish_s"].round(9))
    waited = rq[rq["client_wait_s"] > 0]
    assert len(waited) > 10 and waited["arrival_s"].round(9).isin(finishes).all()
    assert capped.summary["littles_law_rel_error"] < 1e-9


def test_rejected_requests_free_their_client_slot():
    data = _scenario(arrival={"rate": 40}, max_concurrency=3)
    data["scheduler"] = {"max_waiting": 1}
    data["batching"] = {"max_num_seqs": 1}
    r = simulate(scenario_from_dict(data))
    assert (r.requests["reason"] == "queue_full").sum() > 0
    assert len(r.requests) == 120 and r.summary["completed"] + r.summary["rejected"] == 120


@pytest.mark.parametrize("think_time_s", [0.0, 0.5])
def test_closed_loop_users_send_when_their_previous_request_ends(think_time_s):
    r = simulate(scenario_from_dict(_scenario(closed_loop={"concurrency": 5, "think_time_s": think_time_s})),
                 check_invariants=True)
    rq = r.requests
    assert r.summary["completed"] == 120 and (rq["client_wait_s"] == 0).all()
    assert (rq["arrival_s"].iloc[:5] == 0).all()  # every user sends at once
    assert max_in_server(rq) == 5
    # Each later request is sent think_time_s after some request finished.
    finishes = np.sort(rq["finish_s"].to_numpy())
    later = rq["arrival_s"].to_numpy()[5:]
    gap = later - finishes[np.searchsorted(finishes, later - think_time_s + 1e-9) - 1]
    assert np.allclose(gap, think_time_s)


def test_closed_loop_stops_sending_at_the_duration():
    r = simulate(scenario_from_dict(_scenario(closed_loop={"concurrency": 2}, duration_s=5.0)))
    assert 0 < len(r.requests) < 120 and r.requests["arrival_s"].max() < 5.0


@pytest.mark.parametrize(("workload", "words"), [
    ({"closed_loop": {"concurrency": 2}, "arrival": {"rate": 3}}, "closed_loop with arrival"),
    ({"closed_loop": {"concurrency": 2}, "max_concurrency": 3}, "closed_loop with max_concurrency"),
])
def test_closed_loop_refuses_arrival_settings(workload, words):
    with pytest.raises(Exception, match=words):
        scenario_from_dict({"workload": {"num_requests": 5, **workload}})


def test_a_client_refuses_a_signal_delay():
    with pytest.raises(Exception, match="signal_delay_ms .* with workload.max_concurrency"):
        scenario_from_dict({"workload": {"num_requests": 5, "max_concurrency": 2},
                            "cluster": {"replicas": 2, "router": "least_outstanding", "signal_delay_ms": 5}})


def test_closed_loop_takes_an_explicit_null_arrival_and_nothing_else_does():
    sc = scenario_from_dict({"workload": {"num_requests": 30, "arrival": None, "duration_s": 100,
                                          "closed_loop": {"concurrency": 3}}})
    r = simulate(sc)
    assert r.summary["completed"] == 30  # duration_s stops the users, it does not thin the requests
    assert r.stability.demanded_concurrency == pytest.approx(3)  # the users' rate at the unloaded latency
    with pytest.raises(Exception, match="arrival is null, so nobody sends requests"):
        scenario_from_dict({"workload": {"num_requests": 5, "arrival": None}})


@pytest.mark.parametrize("client", [{"max_concurrency": 6, "arrival": {"rate": 30}},
                                    {"closed_loop": {"concurrency": 6, "think_time_s": 0.05}, "arrival": None}])
def test_a_client_gives_the_same_run_stepping_one_step_at_a_time(client):
    data = {"workload": {"num_requests": 150, "output_tokens": {"dist": "uniform", "low": 1, "high": 80}, **client},
            "batching": {"max_num_seqs": 4}}
    fast = simulate(scenario_from_dict({**data, "sim": {"fast_forward": True}}))
    slow = simulate(scenario_from_dict({**data, "sim": {"fast_forward": False}}), check_invariants=True)
    pd.testing.assert_frame_equal(fast.requests, slow.requests)
    assert fast.summary == pytest.approx(slow.summary, nan_ok=True)


def test_the_cap_holds_across_a_fleet():
    r = simulate(scenario_from_dict({"workload": {"num_requests": 200, "arrival": {"rate": 60}, "max_concurrency": 7},
                                     "cluster": {"replicas": 3, "router": "least_outstanding"},
                                     "batching": {"max_num_seqs": 4}}), check_invariants=True)
    assert max_in_server(r.requests) == 7 and r.summary["completed"] == 200
    assert set(r.requests["replica"]) == {0, 1, 2}

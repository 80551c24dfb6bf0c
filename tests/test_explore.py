"""``simbatch explore``: the page of knobs, and /simulate re-running the scenario with them."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
from test_cli import SCENARIOS, invoke

from simbatch import simulate
from simbatch.app.explore import HEADLINE, KNOBS, LESSON_REQUESTS, make_server
from simbatch.inputs.loading import load_scenario

SCENARIO = SCENARIOS / "heavy_tail.yaml"


@pytest.fixture(scope="module")
def explorer():
    """The explorer of heavy_tail, serving on a free port in a thread; its base URL."""
    server = make_server(SCENARIO)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_page_offers_every_knob_at_the_scenarios_values(explorer):
    status, body = get(explorer)
    page = body.decode()
    assert status == 200 and "Bokeh" in page
    for knob in KNOBS:
        assert f'name="{knob.name}"' in page
    assert 'name="max_num_seqs" min="1" max="128" step="1" value="32"' in page  # heavy_tail: 32 slots
    assert "<option selected>continuous</option>" in page


def test_simulate_reruns_the_scenario_with_the_knobs(explorer):
    status, body = get(explorer + "simulate?max_num_seqs=8&mode=static&tau0_ms=10")
    assert status == 200
    answer = json.loads(body)
    expected = simulate(load_scenario(SCENARIO, [f"workload.num_requests={LESSON_REQUESTS}", "batching.max_num_seqs=8",
                                                 "batching.mode=static", "device.tau0_ms=10"])).summary
    assert answer["summary"] == {k: expected[k] for k in HEADLINE}
    assert answer["item"]["doc"]["roots"]  # a Bokeh document to embed


@pytest.mark.parametrize("query, says", [
    ("rate=-1", "--set: workload.arrival.rate: Input should be greater than 0 (got -1)"),
    ("slots=3", "slots: not a knob of this page; use rate, max_num_seqs, tau0_ms, beta_ms, mode, policy"),
    ("mode=static&mode=dynamic", "mode: given 2 times; give it once"),
])
def test_a_refused_value_is_a_400_with_one_line(explorer, query, says):
    status, body = get(explorer + "simulate?" + query)
    assert status == 400 and json.loads(body) == {"error": says}


def test_anything_else_is_not_found(explorer):
    assert get(explorer + "etc/passwd")[0] == 404


def test_a_taken_port_is_one_line(explorer):
    port = int(explorer.rsplit(":", 1)[1].strip("/"))
    result = invoke("explore", SCENARIO, "--port", str(port))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"--port {port}: ") and result.stderr.endswith("; choose another port, or 0 for a free one\n")

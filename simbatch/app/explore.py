"""``simbatch explore SCENARIO``: a page of sliders that re-simulates the scenario and redraws its report.

A tiny HTTP server on 127.0.0.1 answers two paths:

- ``/``: the page, BokehJS inlined, with a slider or a choice per knob (:data:`KNOBS`: arrival rate
  λ, B_max, τ0, β, batching mode, queue policy) set to the scenario's values;
- ``/simulate?rate=4&max_num_seqs=32...``: the scenario with those values as ``--set`` overrides, cut
  to ``LESSON_REQUESTS`` requests so that an answer takes a fraction of a second, simulated and drawn
  as :mod:`simbatch.app.webreport` draws a result folder; answered as JSON: the page's Bokeh document
  (``bokeh.embed.json_item``) and the headline metrics. A value the scenario refuses is answered
  with status 400 and the one line ``simbatch run`` would print.

Moving a knob asks ``/simulate`` again and replaces the plots, so a lesson's question ("what if the
batch were twice as large?") is a drag away.
"""

from __future__ import annotations

import html
import json
import math
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from simbatch.app.localhost import LocalHandler, LocalServer
from simbatch.app.text import printable
from simbatch.config import Scenario
from simbatch.inputs.guard import TooLarge, check_run
from simbatch.inputs.loading import ScenarioError, load_scenario
from simbatch.registry import MODES, POLICIES

LESSON_REQUESTS = 400
HEADLINE = ("request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
            "p99_tpot_ms", "mean_e2el_ms", "num_preemptions")


@dataclass(frozen=True)
class Knob:
    """One control of the page: its query name, the scenario key it sets, and its range or choices."""

    name: str
    key: str
    label: str
    choices: tuple[str, ...] = ()  # a choice; else a slider
    integer: bool = False

    def value(self, scenario: Scenario):
        node = scenario
        for part in self.key.split("."):
            node = getattr(node, part)
        return node

    def slider(self, scenario: Scenario) -> tuple[float, float, float]:
        """(low, high, step): from one step to four times the scenario's value, in 200 steps."""
        value = float(self.value(scenario))
        if self.integer:
            return 1, max(8, int(value) * 4), 1
        high = value * 4 if value > 0 else 1.0
        return high / 200, high, high / 200

    def applies(self, scenario: Scenario) -> bool:
        """Whether the page offers this knob: a rate of ``inf`` or a trace's own times have no slider."""
        if self.name == "rate" and scenario.workload.trace is not None:
            return False
        return bool(self.choices) or math.isfinite(float(self.value(scenario)))


KNOBS = (
    Knob("rate", "workload.arrival.rate", "arrival rate λ (requests/s)"),
    Knob("max_num_seqs", "batching.max_num_seqs", "B_max (slots)", integer=True),
    Knob("tau0_ms", "device.tau0_ms", "τ0 (ms per step)"),
    Knob("beta_ms", "device.beta_ms", "β (ms per sequence)"),
    Knob("mode", "batching.mode", "batching mode", choices=MODES.names()),
    Knob("policy", "scheduler.policy", "queue policy", choices=POLICIES.names()),
)


class ExploreError(ValueError):
    """A request the explorer refuses: one line naming the value and the fix."""


def overrides(query: dict[str, list[str]]) -> list[str]:
    """Query parameters as ``--set`` overrides, the lesson size first; unknown or repeated ones refused."""
    known = {k.name: k for k in KNOBS}
    out = [f"workload.num_requests={LESSON_REQUESTS}"]
    for name, values in query.items():
        if name not in known:
            raise ExploreError(f"{name}: not a knob of this page; use {', '.join(known)}")
        if len(values) != 1:
            raise ExploreError(f"{name}: given {len(values)} times; give it once")
        out.append(f"{known[name].key}={values[0]}")
    return out


def simulate_page(path: Path, query: dict[str, list[str]]) -> dict:
    """The answer to ``/simulate``: ``{"item": Bokeh document, "summary": headline metrics}``."""
    from bokeh.embed import json_item

    from simbatch.app import webreport
    from simbatch.simulation import simulate

    try:
        scenario = load_scenario(path, overrides(query))
        check_run(scenario, force=False)
    except ScenarioError as exc:
        raise ExploreError("; ".join(str(p) for p in exc.problems)) from None
    except TooLarge as exc:
        raise ExploreError(str(exc)) from None
    result = simulate(scenario)
    mode = scenario.batching.mode
    layout = webreport.build({mode: result}, f"{scenario.name}: {LESSON_REQUESTS:,} requests, {mode}")
    summary = {k: result.summary[k] for k in HEADLINE}
    return {"item": json_item(layout), "summary": {k: v if math.isfinite(v) else None for k, v in summary.items()}}


def page(scenario: Scenario) -> str:
    """The explorer's page: the knobs, a line of headline metrics, and the plots' place."""
    from bokeh.resources import INLINE

    controls = []
    for knob in (k for k in KNOBS if k.applies(scenario)):
        value = knob.value(scenario)
        if knob.choices:
            options = "".join(f'<option{" selected" if c == value else ""}>{c}</option>' for c in knob.choices)
            field = f'<select name="{knob.name}">{options}</select>'
        else:
            low, high, step = knob.slider(scenario)
            field = (f'<input type="range" name="{knob.name}" min="{low}" max="{high}" step="{step}" value="{value}" '
                     f'oninput="this.nextElementSibling.textContent=this.value"><output>{value}</output>')
        controls.append(f"<label>{knob.label} {field}</label>")
    name = html.escape(scenario.name)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>simbatch explore: {name}</title>
{INLINE.render()}
<style>body{{font-family:sans-serif;margin:1em}} label{{display:inline-block;margin:0 1.5em .5em 0}}
#summary{{font-family:monospace;margin:.5em 0}}</style></head>
<body><h2>simbatch explore: {name}</h2>
<form id="knobs">{"".join(controls)}</form>
<div id="summary">simulating...</div><div id="plots"></div>
<script>
const form = document.getElementById("knobs");
let pending = null;
async function redraw() {{
  const query = new URLSearchParams(new FormData(form));
  const answer = await fetch("simulate?" + query);
  const body = await answer.json();
  const summary = document.getElementById("summary");
  if (!answer.ok) {{ summary.textContent = body.error; return; }}
  summary.textContent = Object.entries(body.summary).map(([k, v]) => k + " " + (v === null ? "-" : Number.isInteger(v) ? v : v.toPrecision(4))).join("   ");
  for (const doc of Bokeh.documents.splice(0)) doc.clear();
  document.getElementById("plots").replaceChildren();
  await Bokeh.embed.embed_item(body.item, "plots");
}}
form.addEventListener("change", () => {{ clearTimeout(pending); pending = setTimeout(redraw, 150); }});
redraw();
</script></body></html>"""


def make_server(path: Path, port: int = 0) -> LocalServer:
    """The explorer's server on 127.0.0.1 (``port`` 0: a free one); the scenario is checked first.
    It answers requests addressed to localhost only (:mod:`simbatch.app.localhost`)."""
    scenario = load_scenario(path, [f"workload.num_requests={LESSON_REQUESTS}"])
    body = page(scenario).encode("utf-8")

    class Handler(LocalHandler):
        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
            url = urllib.parse.urlsplit(self.path)
            if url.path == "/":
                self._send(200, body, "text/html; charset=utf-8")
            elif url.path == "/simulate":
                try:
                    answer, status = simulate_page(path, urllib.parse.parse_qs(url.query)), 200
                except ExploreError as exc:
                    answer, status = {"error": str(exc)}, 400
                except Exception as exc:  # a bug: the page says so in a line, and the server keeps serving
                    answer, status = {"error": f"the simulation failed ({type(exc).__name__}: {exc}); "
                                               "please report this, with the scenario"}, 500
                    sys.stderr.write(f"simbatch explore: {printable(answer['error'])}\n")
                self._send(status, json.dumps(answer).encode("utf-8"), "application/json")
            else:
                self._send(404, b"not found", "text/plain")

    return LocalServer(Handler, port)

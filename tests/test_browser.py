"""report.html in a real browser: headless Chromium (the system's, through Selenium) renders it offline,
without a console error, with every request's bars, and hovering a bar names its request.

Where Chromium is not installed the test is skipped with one line saying how to install it, except
in CI (``CI=true``), where it must run: there a missing browser fails it (.ci/run installs one).
"""

from __future__ import annotations

import os

import pytest
from test_cli import SCENARIOS

from simbatch import simulate
from simbatch.app import headless, webreport
from simbatch.inputs.loading import load_scenario

# Chromium is a system package, which `make test` (pip, into .venv) cannot install: on a developer's
# machine without it the test is skipped with the command that installs it; CI installs it
# (.ci/run), so there a missing browser fails the suite instead of skipping.
if headless.binaries() is None:
    if os.environ.get("CI") == "true":
        pytest.fail(headless.HOW_TO_ENABLE, pytrace=False)
    pytest.skip(headless.HOW_TO_ENABLE, allow_module_level=True)

MODES = ("static", "continuous")

READY = """return window.Bokeh !== undefined && Bokeh.documents.length > 0 && Bokeh.index.roots.length > 0
           && Bokeh.index.roots.every(v => v.has_finished())"""

# Of the plot drawing a named source: where (page pixels) the middle of its widest bar is, and its
# request; the plot is scrolled into view first.
WIDEST_BAR = """
const source = Bokeh.documents[0].get_model_by_name(arguments[0]);
function* walk(view) { yield view; for (const child of (view.child_views ?? [])) yield* walk(child); }
for (const root of Bokeh.index.roots) for (const view of walk(root)) {
  if (view.model.renderers === undefined || !view.model.renderers.some(r => r.data_source === source)) continue;
  const d = source.data, sx = view.frame.x_scale, sy = view.frame.y_scale;
  let best = 0;
  for (let i = 1; i < d.left.length; i++)
    if (sx.compute(d.right[i]) - sx.compute(d.left[i]) > sx.compute(d.right[best]) - sx.compute(d.left[best])) best = i;
  view.el.scrollIntoView({block: "center"});
  const box = view.canvas_view.el.getBoundingClientRect();
  return [box.left + sx.compute((d.left[best] + d.right[best]) / 2), box.top + sy.compute(d.request_id[best]),
          d.request_id[best]];
}
return null;
"""

# The text of every tooltip shown (Bokeh draws them inside shadow roots).
TOOLTIPS = """
function* deep(root) { for (const el of root.querySelectorAll("*")) { yield el; if (el.shadowRoot) yield* deep(el.shadowRoot); } }
return [...deep(document)].filter(el => el.classList.contains("bk-Tooltip") && el.shadowRoot)
  .map(el => [...el.shadowRoot.children].filter(c => c.tagName !== "STYLE").map(c => c.innerText).join(" "))
  .join("\\n");
"""


def _wait(browser, timeout_s: float):
    """Selenium's wait, asking every 50 ms rather than its default 500: the page is ready, or redrawn,
    a moment after it is asked, and the rest of a half-second poll is the test sleeping."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout_s, poll_frequency=0.05)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A comparison's report, as ``simbatch compare`` writes it, and its runs."""
    runs = {mode: simulate(load_scenario(SCENARIOS / "heavy_tail.yaml", ["workload.num_requests=80",
                                                                         f"batching.mode={mode}"])) for mode in MODES}
    path = tmp_path_factory.mktemp("report") / "report.html"
    webreport.write_report(path, runs, "browser test")
    return path, runs


def test_the_report_renders_offline_in_chromium(report, tmp_path):
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    path, runs = report
    with headless.chromium(1400, 1000) as browser:
        browser.get(headless.page_url(path))
        _wait(browser, 30).until(lambda b: b.execute_script(READY))
        problems = [e["message"] for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        assert problems == []
        fetched = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert [url for url in fetched if not url.startswith(("file:", "data:", "blob:"))] == []
        for mode, run in runs.items():
            rq = run.requests
            bars = len(rq) + rq["first_scheduled_s"].notna().sum() + rq["first_token_s"].notna().sum()
            shown = browser.execute_script(f"return Bokeh.documents[0].get_model_by_name('gantt:{mode}')"
                                           ".data.request_id.length")
            assert shown == bars
        x, y, request_id = browser.execute_script(WIDEST_BAR, "gantt:continuous")
        hover = ActionBuilder(browser)
        hover.pointer_action.move_to_location(int(x), int(y))
        hover.perform()
        _wait(browser, 10).until(lambda b: "request:" in b.execute_script(TOOLTIPS))
        tip = " ".join(browser.execute_script(TOOLTIPS).split())
        assert f"request: {request_id} arrival:" in tip and "queue:" in tip and "preemptions:" in tip
        shot = tmp_path / "report.png"
        browser.save_screenshot(str(shot))
        assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 20_000


def test_the_explorer_redraws_when_a_knob_moves(tmp_path):
    import threading

    from simbatch.app.explore import make_server

    server = make_server(SCENARIOS / "heavy_tail.yaml")
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        with headless.chromium(1400, 1000) as browser:
            browser.get(f"http://127.0.0.1:{server.server_port}/")
            has_gantt = "return Bokeh.documents.some(d => d.get_model_by_name(arguments[0]) !== null)"
            _wait(browser, 30).until(lambda b: b.execute_script(has_gantt, "gantt:continuous"))
            browser.execute_script("const s = document.querySelector('select[name=mode]'); s.value = 'static';"
                                   "s.dispatchEvent(new Event('change', {bubbles: true}));")
            _wait(browser, 30).until(lambda b: b.execute_script(has_gantt, "gantt:static"))
            _wait(browser, 30).until(lambda b: b.execute_script(READY))
            assert not browser.execute_script(has_gantt, "gantt:continuous")  # the old plots are gone
            assert "mean_ttft_ms" in browser.find_element("id", "summary").text
            assert [e["message"] for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")] == []
            browser.save_screenshot(str(tmp_path / "explore.png"))
    finally:
        server.shutdown()
        server.server_close()

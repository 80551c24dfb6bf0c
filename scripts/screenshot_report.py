"""Take ``docs/img/report_heavy_tail.png``, the README's picture of report.html, in headless Chromium.

Runs ``simbatch compare scenarios/heavy_tail.yaml`` into a temporary folder, opens its report.html
in the system's Chromium (``apt-get install chromium chromium-driver``), waits for every plot to
render, and saves the whole page.

    .venv/bin/python scripts/screenshot_report.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from selenium.webdriver.support.ui import WebDriverWait

from simbatch.app import headless

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img" / "report_heavy_tail.png"
WIDTH = 1400
READY = """return window.Bokeh !== undefined && Bokeh.documents.length > 0 && Bokeh.index.roots.length > 0
           && Bokeh.index.roots.every(v => v.has_finished())"""


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "compare"
        simbatch = Path(sys.executable).with_name("simbatch")
        subprocess.run([str(simbatch), "compare", str(ROOT / "scenarios" / "heavy_tail.yaml"), "--out", str(folder),
                        "--quiet"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        with headless.chromium(WIDTH, 1000) as browser:
            browser.get(headless.page_url(folder / "report.html"))
            WebDriverWait(browser, 60).until(lambda b: b.execute_script(READY))
            height = 0
            while height != (height := browser.execute_script("return document.documentElement.scrollHeight")):
                # A taller viewport lays the page out anew: grow it until the whole page fits.
                browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                        {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False})
                WebDriverWait(browser, 60).until(lambda b: b.execute_script(READY))
            browser.save_screenshot(str(OUT))
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

"""Headless Chromium, the system's own (Debian's ``chromium`` and ``chromium-driver``), driven by Selenium.

For the browser test of ``report.html`` and the README's screenshot of it: nothing is downloaded at
run time (Selenium's driver manager is bypassed by naming both binaries). Selenium is a development
dependency; the simulator never imports this module.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

CHROMIUM = ("/usr/bin/chromium", "chromium", "chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver", "chromedriver")
HOW_TO_ENABLE = ("headless Chromium not found: install it with `apt-get install -y chromium chromium-driver` "
                 "(Debian; .ci/run does) to run the browser test")


def _which(names: tuple[str, ...]) -> str | None:
    return next((found for name in names if (found := shutil.which(name))), None)


def binaries() -> tuple[str, str] | None:
    """(chromium, chromedriver) paths, or None when either is missing."""
    browser, driver = _which(CHROMIUM), _which(CHROMEDRIVER)
    return (browser, driver) if browser and driver else None


@contextlib.contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[object]:
    """A headless Chromium WebDriver with the browser's console log kept; quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = binaries()
    if found is None:
        raise RuntimeError(HOW_TO_ENABLE)
    browser, driver_path = found
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def page_url(path: Path) -> str:
    return path.resolve().as_uri()

"""``simbatch view``: the browser when there is one, else the folder served on localhost until Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request
import webbrowser
from pathlib import Path

from builders import ctrl_c_reaches_the_child
from test_cli import invoke

SIMBATCH = Path(sys.executable).with_name("simbatch")


def folder_with_report(tmp_path: Path) -> Path:
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "report.html").write_text("<html><body>the report</body></html>")
    return folder


def test_without_a_display_it_serves_the_folder_and_stops_at_ctrl_c(tmp_path):
    folder = folder_with_report(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    process = subprocess.Popen([str(SIMBATCH), "view", str(folder)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, preexec_fn=ctrl_c_reaches_the_child)
    try:
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=20)
        assert first, "no URL printed within 20 s"
        url = first[0].split(" at ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/report.html")
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200 and response.read() == b"<html><body>the report</body></html>"
        process.send_signal(signal.SIGINT)  # (how soon it stops: benchmarks/cli.py, ctrl-c-view)
        assert process.wait(timeout=5) == 0
        assert process.stdout.read() == "stopped\n" and process.stderr.read() == ""
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_with_a_browser_it_opens_the_report(tmp_path, monkeypatch):
    folder = folder_with_report(tmp_path)
    opened = []
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.setattr(webbrowser, "open", lambda url: opened.append(url) or True)
    result = invoke("view", folder)
    assert result.exit_code == 0, result.output
    assert opened == [(folder / "report.html").resolve().as_uri()]
    assert result.stdout == f"Opened {folder / 'report.html'}\n"


def test_a_folder_without_a_report_is_one_line(tmp_path):
    result = invoke("view", tmp_path)
    assert result.exit_code == 2
    assert result.stderr == (f"{tmp_path}: no report.html there; give a folder written by simbatch run or compare "
                             "without --no-plots\n")

"""Stopping a command from outside: Ctrl-C (SIGINT) and SIGTERM on ``run`` and ``sweep``, and a reader
that goes away. Each is a real process, signalled while it simulates: it must print "interrupted",
exit 130 (SIGINT) or 143 (SIGTERM), and leave no result folder, hidden or not. That it does so within a
second is measured as a whole process by `make bench` (benchmarks/cli.py, the interrupt cases): a
shared machine's clock is no unit test's business, and a command that does not stop fails here by
the 10 s timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builders import ctrl_c_reaches_the_child
from test_cli import SCENARIOS

from simbatch.app.errors import Terminated
from simbatch.app.results import atomic_folder

SIMBATCH = Path(sys.executable).with_name("simbatch")
# Long enough to be caught simulating (tens of seconds), never run to the end.
LONG_RUN = ["run", str(SCENARIOS / "stable.yaml"), "--set", "workload.duration_s=200000", "--out", "out"]
LONG_SWEEP = ["sweep", str(SCENARIOS / "stable.yaml"), "--set", "workload.duration_s=200000",
              "-p", "workload.arrival.rate=2,3", "-r", "2", "-w", "2", "-o", "sw"]


def _signalled(args: list[str], cwd: Path, signum: int, after_s: float = 1.5,
               started: Path | None = None) -> tuple[int, str, float]:
    """Run ``args``, signal it ``after_s`` seconds in (or that long after ``started`` appears: on a
    busy machine a command's start-up is slower), and return its exit code, stderr and how long it
    took to exit after the signal."""
    process = subprocess.Popen([str(SIMBATCH), *args], cwd=cwd, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_the_child)
    deadline = time.monotonic() + 180  # a loaded machine starts a sweep's workers slowly
    while started is not None and not started.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert started is None or started.exists(), "the command never got started"
    time.sleep(after_s)
    assert process.poll() is None, "the command ended before it was signalled"
    sent = time.monotonic()
    process.send_signal(signum)
    try:
        _, err = process.communicate(timeout=10)
    finally:
        process.kill()
    return process.returncode, err, time.monotonic() - sent


@pytest.mark.parametrize(("signum", "code", "says"), [(signal.SIGINT, 130, "interrupted\n"),
                                                        (signal.SIGTERM, 143, "interrupted (terminated)\n")])
def test_run_stops_and_leaves_nothing(tmp_path, signum, code, says):
    returncode, err, _ = _signalled(LONG_RUN, tmp_path, signum)
    assert (returncode, err) == (code, says), (returncode, err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_sweep_stops_its_workers(tmp_path, signum, code):
    returncode, err, _ = _signalled(LONG_SWEEP, tmp_path, signum, started=tmp_path / "sw" / "manifest.json")
    assert returncode == code and err.startswith("interrupted"), (returncode, err)
    # What the sweep keeps is what a restart resumes from: its manifest and finished runs, no temporaries.
    assert sorted(p.name for p in (tmp_path / "sw").iterdir()) == ["manifest.json", "points"]
    assert not [p for p in (tmp_path / "sw" / "points").iterdir() if p.suffix != ".json"]
    workers = subprocess.run(["pgrep", "-f", f"multiprocessing.*{os.getpid()}"], capture_output=True)
    assert workers.stdout == b""


def test_ctrl_c_while_the_command_starts(tmp_path):
    # A third of a second in, Python is importing simbatch's machinery: that, too, is an interruption.
    # (A long run, not `validate`: on a quick machine `validate` can be over by then.)
    returncode, err, _ = _signalled(LONG_RUN, tmp_path, signal.SIGINT, 0.3)
    assert (returncode, err) == (130, "interrupted\n"), (returncode, err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("stop", [KeyboardInterrupt, Terminated])
def test_an_interrupted_folder_is_removed(tmp_path, stop):
    with pytest.raises(stop), atomic_folder(tmp_path / "run") as target:
        (target.tmp / "summary.json").write_text("{}")
        raise stop
    assert list(tmp_path.iterdir()) == []


def test_a_closed_pipe_ends_the_output_not_the_run(tmp_path):
    # --no-plots: the lines after the reader left (the table, "Results written to") are printed all the
    # same; drawing them would only lengthen the run.
    process = subprocess.Popen([str(SIMBATCH), "run", str(SCENARIOS / "stable.yaml"), "--set",
                                "workload.duration_s=30", "--no-plots", "--out", "out"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline().strip()  # like `| head -1`: one line, then the reader is gone
    process.stdout.close()
    err = process.stderr.read()
    assert process.wait(timeout=60) == 0 and err == b""
    assert (tmp_path / "out" / "summary.json").is_file()

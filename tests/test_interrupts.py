"""Stopping a command from outside: Ctrl-C (SIGINT) and SIGTERM on ``run`` and ``sweep``, and a reader
that goes away. Each is a real process, signalled while it simulates: it must print "interrupted",
exit 130 (SIGINT) or 143 (SIGTERM), and leave no result folder, hidden or not. That it does so within a
second is measured as a whole process by `make bench` (benchmarks/cli.py, the interrupt cases): a
shared machine's clock is no unit test's business, and a command that does not stop fails here by
the 10 s timeout.
"""

from __future__ import annotations

import os
import select
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
               started: Path | str | None = None) -> tuple[int, str, float]:
    """Run ``args``, signal it ``after_s`` seconds in, or that long after ``started`` appears (a file, or a
    line the command prints: on a busy machine a command's start-up is slower), and return its exit code,
    stderr and how long it took to exit after the signal."""
    process = subprocess.Popen([str(SIMBATCH), *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=ctrl_c_reaches_the_child,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})  # each line as it is printed
    deadline = time.monotonic() + 180  # a loaded machine starts a sweep's workers slowly
    printed = ""
    while started is not None and time.monotonic() < deadline and process.poll() is None:
        if isinstance(started, Path) and started.exists():
            break
        if isinstance(started, str) and started in printed.splitlines():
            break
        if select.select([process.stdout], [], [], 0.05)[0]:
            printed += os.read(process.stdout.fileno(), 65536).decode()  # (the pipe must not fill)
    assert started is None or (started.exists() if isinstance(started, Path) else started in printed.splitlines()), \
        "the command never got started"
    time.sleep(after_s)
    assert process.poll() is None, "the command ended before it was signalled"
    sent = time.monotonic()
    process.send_signal(signum)
    try:
        _, err = process.communicate(timeout=10)
    finally:
        process.kill()
    return process.returncode, err, time.monotonic() - sent


# The last line of the stability check, which ``run`` prints before it simulates.
SIMULATING = "=" * 50


@pytest.mark.parametrize(("signum", "code", "says"), [(signal.SIGINT, 130, "interrupted\n"),
                                                        (signal.SIGTERM, 143, "interrupted (terminated)\n")])
def test_run_stops_and_leaves_nothing(tmp_path, signum, code, says):
    returncode, err, _ = _signalled(LONG_RUN, tmp_path, signum, 0.3, started=SIMULATING)
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


def _reporting_as_its_own(handler, signum: int):
    """A library call that reports whatever its callback raised as an error of its own, as pydantic-core does
    while it builds a model's schema at import: here the callback is the signal's handler."""
    def call():
        try:
            handler(signum, None)
        except BaseException as exc:
            raise RuntimeError(f"Error building validator: {exc!r}") from None
    return call


@pytest.fixture
def signal_handlers_restored():
    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGINT, previous[0])
    signal.signal(signal.SIGTERM, previous[1])


@pytest.mark.parametrize(("signum", "code", "says"), [(signal.SIGINT, 130, "interrupted\n"),
                                                        (signal.SIGTERM, 143, "interrupted (terminated)\n")])
def test_a_signal_a_library_reports_as_its_own_error_is_still_an_interruption(monkeypatch, capsys,
                                                                             signal_handlers_restored, signum,
                                                                             code, says):
    """Seen on a loaded machine: Ctrl-C while the command line was being imported ended in a traceback, a
    SchemaError that pydantic-core had made of the start-up handler's Interrupted."""
    from simbatch.app import cli, console
    from simbatch.app.errors import raise_interrupted, raise_terminated

    handler = raise_interrupted if signum == signal.SIGINT else raise_terminated
    monkeypatch.setattr(cli, "app", _reporting_as_its_own(handler, signum))
    with pytest.raises(SystemExit) as stopped:
        console.main()
    assert (stopped.value.code, capsys.readouterr().err) == (code, says)


def test_a_signal_a_library_reports_as_its_own_error_inside_a_command_is_still_an_interruption(capsys):
    import typer

    from simbatch.app.cli.common import reports_bad_input
    from simbatch.app.errors import raise_keyboard_interrupt

    @reports_bad_input
    def command():
        _reporting_as_its_own(raise_keyboard_interrupt, signal.SIGINT)()

    with pytest.raises(typer.Exit) as stopped:
        command()
    assert (stopped.value.exit_code, capsys.readouterr().err) == (130, "interrupted\n")


def test_an_error_with_no_signal_before_it_is_not_taken_for_one(monkeypatch, signal_handlers_restored):
    from simbatch.app import cli, console
    from simbatch.app.cli.common import reports_bad_input

    def bug():
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "app", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        console.main()
    with pytest.raises(RuntimeError, match="a bug"):
        reports_bad_input(bug)()


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

"""Whole-process timings of the command line: start-up, a small run, refusals, and plots that scale.

These are the bounds that used to sit in unit tests, where a shared machine's load made them fail;
here each command runs ``--repeats`` times in a fresh process and the median is held to its bound.
``python -m benchmarks.cli`` prints the table; ``make bench`` adds it to ``benchmarks/results.md``.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).parent.parent
SIMBATCH = str(Path(sys.executable).with_name("simbatch"))
SCENARIOS = ROOT / "scenarios"

LAUGHS = "\n".join(['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]',
                    *(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10))]) + "\n"

FLEET_PLOTS = """
from pathlib import Path
import sys
from simbatch.app import plots
from simbatch.inputs.loading import scenario_from_dict
from simbatch.simulation import simulate
result = simulate(scenario_from_dict({
    "workload": {"num_requests": 1000, "arrival": {"rate": 300},
                 "output_tokens": {"dist": "uniform", "low": 8, "high": 64}},
    "cluster": {"replicas": 1000, "router": "least_outstanding"}}))
import time
start = time.perf_counter()
plots.save_run_plots(Path(sys.argv[1]), result)
print(time.perf_counter() - start)
"""

ARRIVALS_1M = """
import time
import numpy as np
from simbatch.config import Arrival
from simbatch.workload.arrivals import arrival_times
start = time.perf_counter()
arrival_times(Arrival(process="gamma", rate=100.0, burstiness=0.5), np.random.default_rng(0), 1_000_000, None)
print(time.perf_counter() - start)
"""

LONG_RUN = [SIMBATCH, "run", str(SCENARIOS / "stable.yaml"), "--set", "workload.duration_s=200000", "--out", "out"]
LONG_SWEEP = [SIMBATCH, "sweep", str(SCENARIOS / "stable.yaml"), "--set", "workload.duration_s=200000",
              "-p", "workload.arrival.rate=2,3", "-r", "2", "-w", "2", "-o", "sw"]

# name -> (what, command (in a scratch folder), expected exit code, bound, measured: "wall" | "cpu" |
# "printed" | "signal": the time from Ctrl-C, sent 2 s into the command, to its exit)
COMMANDS = {
    "help": ("`simbatch --help`", [SIMBATCH, "--help"], 0, 0.3, "wall"),
    "run-100": ("`simbatch run` of a 100-request scenario, no plots",
                [SIMBATCH, "run", str(SCENARIOS / "stable.yaml"), "--set", "workload.num_requests=100",
                 "--set", "workload.duration_s=null", "--no-plots", "--out", "out"], 0, 1.0, "wall"),
    "refuse-1e9": ("a run of a billion requests refused with its estimate",
                   [SIMBATCH, "run", str(SCENARIOS / "oversubscribed.yaml"), "--set",
                    "workload.num_requests=1000000000"], 2, 2.0, "cpu"),
    "refuse-laughs": ("a billion-laughs YAML refused", [SIMBATCH, "run", "laughs.yaml"], 2, 2.0, "cpu"),
    "plots-1000": ("the plots of a 1,000-replica run (drawing only)", [sys.executable, "-c", FLEET_PLOTS, "."],
                   0, 5.0, "printed"),
    "arrivals-1m": ("a million gamma arrivals drawn (vectorized: a per-request loop takes over a second)",
                    [sys.executable, "-c", ARRIVALS_1M], 0, 1.0, "printed"),
    "ctrl-c-view": ("`simbatch view` without a display stops serving after Ctrl-C",
                    [SIMBATCH, "view", "."], 0, 1.0, "signal"),
    "ctrl-c-run": ("a long `simbatch run` stops after Ctrl-C", LONG_RUN, 130, 1.0, "signal"),
    "ctrl-c-sweep": ("a long `simbatch sweep` and its workers stop after Ctrl-C", LONG_SWEEP, 130, 1.0, "signal"),
    "plan-256": ("`simbatch plan` of docs/planning.md's worked example: 256 configurations, from scratch",
                 [SIMBATCH, "plan", str(SCENARIOS / "llama3_8b_h100.yaml"), "--request-rate", "5", "--space",
                  str(SCENARIOS / "plan" / "llama3_8b.yaml"), "--slo", "ttft_p99_ms=500", "--slo", "tpot_p99_ms=50",
                  "--out", "out"], 0, 120.0, "wall"),
}


# Start-up as a user's machine has it: with Python's bytecode caches (a shell that sets
# PYTHONDONTWRITEBYTECODE would time the compiling of pandas instead, seconds of it).
# No display either: `simbatch view` then serves its folder instead of opening a browser.
ENV = {**{k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")},
       "COLUMNS": "100", "PYTHONDONTWRITEBYTECODE": ""}


def measure_once(command: list[str], expect: int, kind: str) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "laughs.yaml").write_text(LAUGHS)
        (Path(scratch) / "report.html").write_text("<html><body>a report</body></html>")
        if kind == "signal":
            return signalled(command, scratch, expect)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, cwd=scratch, capture_output=True, text=True, timeout=600, env=ENV)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != expect:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}, not {expect}: {done.stderr[-500:]}")
    if kind == "printed":
        return float(done.stdout.split()[-1])
    if kind == "cpu":
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall


def signalled(command: list[str], cwd: str, expect: int, after_s: float = 2.0) -> float:
    """Seconds from a Ctrl-C sent ``after_s`` into ``command`` to its exit (which must be ``expect``)."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(after_s)
    sent = time.perf_counter()
    process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    took = time.perf_counter() - sent
    if process.returncode != expect:
        raise SystemExit(f"{' '.join(command)} exited {process.returncode} after Ctrl-C, not {expect}: {err[-500:]}")
    return took


def measure(names: list[str], repeats: int) -> dict[str, list[float]]:
    """Each command ``repeats`` times, interleaved (round r of every command before round r + 1)."""
    runs: dict[str, list[float]] = {n: [] for n in names}
    for name in names:  # untimed: writes the bytecode caches a first start-up would
        _, command, expect, _, kind = COMMANDS[name]
        if kind in ("wall", "cpu"):
            measure_once(command, expect, kind)
    for _ in range(repeats):
        for name in names:
            _, command, expect, _, kind = COMMANDS[name]
            runs[name].append(measure_once(command, expect, kind))
    return runs


def rows(runs: dict[str, list[float]]) -> list[tuple[str, str, str, bool]]:
    """(what, bound, measured, met) per command: the median against the bound."""
    out = []
    for name, values in runs.items():
        what, _, _, bound, kind = COMMANDS[name]
        unit = {"wall": "s wall", "cpu": "CPU s", "printed": "s", "signal": "s"}[kind]
        med = statistics.median(values)
        out.append((what, f"<= {bound:g} {unit}", f"{med:.2f} [{min(values):.2f}-{max(values):.2f}]", med <= bound))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commands", nargs="*", help=f"subset of {', '.join(COMMANDS)}")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for what, bound, measured, ok in rows(measure(args.commands or list(COMMANDS), args.repeats)):
        print(f"{'ok  ' if ok else 'MISS'} {what}: {measured} ({bound})")


if __name__ == "__main__":
    main()

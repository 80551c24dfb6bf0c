"""``make bench``: run issue 8's benchmarks and write ``benchmarks/results.md``.

Every case runs ``--repeats`` times, each in a fresh Python process; the report gives medians, and
the command line's whole-process bounds (``benchmarks.cli``) beside them.
``python -m benchmarks.run B1 B3 --repeats 3`` runs a subset (and does not rewrite the report).
``python -m benchmarks.compare REV [CASES...]`` runs the cases here and at another commit, side by side
(see its docstring); the report keeps the sections it writes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import cli
from benchmarks.cases import CASES
from simbatch.analysis.capacity import expected_stability
from simbatch.workload import generate

REPORT = Path(__file__).with_name("results.md")
COMPARED = "## Compared with"  # sections written by benchmarks.compare, which this report keeps


def sections(text: str) -> list[list[str]]:
    """The report's lines cut before each ``## `` heading: what precedes the first, then each section."""
    parts: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.startswith("## "):
            parts.append([])
        parts[-1].append(line)
    return parts


def calibration_s() -> float:
    """CPU seconds of a fixed pure-Python loop: how fast this machine runs Python right now.

    Shared machines vary (seen here: the same loop 2.2 to 3.2 s between consecutive runs), so the
    report prints this before and after, and every case's fastest run beside its median.
    """
    start, x = time.process_time(), 0
    for i in range(10_000_000):
        x += i
    return time.process_time() - start


def run_once(name: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.one", name], check=True, capture_output=True,
                         text=True, cwd=Path(__file__).parent.parent)
    return json.loads(out.stdout)


def summarize_runs(runs: list[dict]) -> dict:
    med = {k: statistics.median(r[k] for r in runs) for k in ("simulation_s", "total_s", "peak_rss_mb")}
    return {**runs[0], **med, "repeats": len(runs), "min_simulation_s": min(r["simulation_s"] for r in runs),
            "min_total_s": min(r["total_s"] for r in runs), "simulation_runs": [r["simulation_s"] for r in runs]}


def paired_ratios(a: dict, b: dict, per_request: bool = False) -> list[float]:
    """a's time over b's, round by round: the two ran back to back (see run_cases), so each ratio is
    free of the machine's drift between rounds; their median is the comparison reported."""
    scale = b["requests"] / a["requests"] if per_request else 1.0
    return sorted(x / y * scale for x, y in zip(a["simulation_runs"], b["simulation_runs"], strict=True))


LONG = ("B2", "B9")  # a million requests each: repeated less often, last


def b2_repeats(repeats: int) -> int:
    """B2 takes about a minute a run: it repeats less often than the quick cases, but at least twice."""
    return max(2, repeats // 3)


def run_cases(names: list[str], repeats: int) -> dict:
    """Repeat r of every case before repeat r + 1: cases compared with each other (B3 and B4 against
    B1) see the same machine, however its speed drifts. B2, long, runs last (see b2_repeats)."""
    runs: dict[str, list[dict]] = {name: [] for name in names}
    quick = [n for n in names if n not in LONG]
    for _ in range(repeats):
        for name in quick:
            runs[name].append(run_once(name))
    for _ in range(b2_repeats(repeats)):  # the long cases alternate, so that B9 and B2 see the same machine
        for name in [n for n in LONG if n in names]:
            runs[name].append(run_once(name))
    return {name: summarize_runs(r) for name, r in runs.items()}


def offered_load(name: str) -> float:
    scenario = CASES[name][1]()
    if (scenario.workload.num_requests or 0) > 100_000:  # a trace (B7) is as long as its file
        scenario = scenario.model_copy(update={"workload": scenario.workload.model_copy(
            update={"num_requests": 100_000})})
    return expected_stability(scenario, generate(scenario)).offered_load


def verdicts(r: dict) -> list[tuple[str, str, bool]]:
    b1, b3 = r["B1"], r.get("B3")
    checks = [("B1 simulation <= 0.40 s", f"{b1['simulation_s']:.2f} s", b1["simulation_s"] <= 0.40),
              ("B1 including frames <= 2 s", f"{b1['total_s']:.2f} s", b1["total_s"] <= 2.0)]
    if "B2" in r:
        b2 = r["B2"]
        checks += [("B2 1M requests, with frames <= 35 s", f"{b2['total_s']:.1f} s", b2["total_s"] <= 35.0),
                   ("B2 peak RSS <= 0.7 GB", f"{b2['peak_rss_mb']:.0f} MB", b2["peak_rss_mb"] <= 700)]
    if "B9" in r and "B2" in r:
        ratios = paired_ratios(r["B9"], r["B2"])
        ratio = statistics.median(ratios)
        checks.append(("B9 autoscaled day, 1M requests: wall <= 2x B2", f"{ratio:.2f}x, rounds {ratios[0]:.2f}-"
                       f"{ratios[-1]:.2f} ({r['B9']['simulation_s']:.1f} s, peak RSS {r['B9']['peak_rss_mb']:.0f} MB)",
                       ratio <= 2.0))
    if b3:
        per1, per3 = b1["simulation_s"] / b1["requests"], b3["simulation_s"] / b3["requests"]
        ratios = paired_ratios(b3, b1, per_request=True)
        ratio = statistics.median(ratios)
        checks.append(("B3 overloaded: time/request <= stable",
                       f"{ratio:.2f}x of stable, rounds {ratios[0]:.2f}-{ratios[-1]:.2f} "
                       f"({per3 * 1e6:.0f} vs {per1 * 1e6:.0f} us)", ratio <= 1.0))
    for case, what, limit in (("B4", "B4 doubled outputs: wall <= 1.25x", 1.25),
                              ("B5", "B5 context-aware steps: wall <= 1.5x B1", 1.5),
                              ("B6", "B6 prefix caching, conversations: wall <= 2.2x B1", 2.2)):
        if case in r:
            ratios = paired_ratios(r[case], b1)
            ratio = statistics.median(ratios)
            # Per simulated iteration too: a case's engine may take more, shorter steps than B1's.
            per_iteration = ratio * b1["iterations"] / r[case]["iterations"]
            checks.append((what, f"{ratio:.2f}x, rounds {ratios[0]:.2f}-{ratios[-1]:.2f} "
                                 f"({per_iteration:.2f}x per iteration)", ratio <= limit))
    for mode in ("static", "dynamic"):
        key = f"B1-{mode}"
        if key in r:
            checks.append((f"{mode} at least as fast as continuous",
                           f"{r[key]['simulation_s']:.2f} vs {b1['simulation_s']:.2f} s",
                           r[key]["simulation_s"] <= b1["simulation_s"]))
    return checks


def write_report(results: dict, repeats: int, calibration: tuple[float, float],
                 commands: list[tuple[str, str, str, bool]]) -> None:
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `make bench` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}. Medians of {repeats} runs (B2: {b2_repeats(repeats)}), each in a "
        "fresh process, the cases' repeats interleaved; the fastest run in brackets. Workloads and device: `benchmarks/cases.py`.",
        "",
        f"Machine speed: a fixed 10M-iteration Python loop took {calibration[0]:.2f} s of CPU before the "
        f"benchmarks and {calibration[1]:.2f} s after (lower is faster; times below scale with it).",
        "",
        "| case | what | requests | offered load | simulation (s) | with frames (s) | requests/s | "
        "iterations | iterations/s | rows | longest queue | preemptions | peak RSS (MB) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {CASES[name][0]} | {r['requests']:,} | {offered_load(name):.2f} | "
            f"{r['simulation_s']:.2f} [{r['min_simulation_s']:.2f}] | {r['total_s']:.2f} [{r['min_total_s']:.2f}] | "
            f"{r['requests'] / r['simulation_s']:,.0f} | {r['iterations']:,} | "
            f"{r['iterations'] / r['simulation_s']:,.0f} | {r['iteration_rows']:,} | {r['max_waiting']:,} | "
            f"{r['preemptions']:,} | {r['peak_rss_mb']:.0f} |")
    lines += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {'yes' if ok else '**no**'} |" for t, m, ok in verdicts(results)]
    if commands:
        lines += ["", "## The command line", "",
                  f"Whole processes (`python -m benchmarks.cli`), medians of {repeats} runs [range]: start-up, a small "
                  "run, refusals, drawing, Ctrl-C, a plan.", "", "| command | bound | measured | met |", "|---|---|---|---|"]
        lines += [f"| {w} | {b} | {m} | {'yes' if ok else '**no**'} |" for w, b, m, ok in commands]
    lines += ["", "B3, B4 and B5 are compared with B1 round by round (each pair ran back to back): the median of "
              "the per-round ratios, and their range.",
              "", "*iterations* are engine steps represented (a run of identical steps counts each step); "
              "*rows* are rows of the iterations frame. *requests/s* is simulated requests per second of wall time. "
              "*longest queue* is the most requests waiting at once.",
              "B1-reference steps one iteration at a time; fast-forward gives the same frames (tests/test_fast_forward.py).",
              ""]
    kept = [part for part in sections(REPORT.read_text(encoding="utf-8") if REPORT.exists() else "")
            if part and part[0].startswith(COMPARED)]
    REPORT.write_text("\n".join(lines + [line for part in kept for line in part]) + ("\n" if kept else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("cases", nargs="*", help=f"subset of {', '.join(CASES)}")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    names = args.cases or list(CASES)
    before = calibration_s()
    results = run_cases(names, args.repeats)
    for name, r in results.items():
        print(f"{name:13s} sim {r['simulation_s']:7.2f} s  total {r['total_s']:7.2f} s  "
              f"rss {r['peak_rss_mb']:6.0f} MB  iterations {r['iterations']:,}", flush=True)
    if not args.cases:
        commands = cli.rows(cli.measure(list(cli.COMMANDS), args.repeats))
        for what, bound, measured, ok in commands:
            print(f"{'ok  ' if ok else 'MISS'} {what}: {measured} ({bound})")
        write_report(results, args.repeats, (before, calibration_s()), commands)
        print(f"wrote {REPORT}")
    for target, measured, ok in verdicts(results) if "B1" in results else []:
        print(f"{'ok  ' if ok else 'MISS'} {target}: {measured}")


if __name__ == "__main__":
    main()

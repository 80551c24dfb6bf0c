"""Write ``docs/errors.md``: every kind of bad input, the exit code and the one line simbatch prints.

Each case below is run for real, in a scratch folder, through the ``simbatch`` command (in-process,
as typer's test runner does; the one case that needs a real file descriptor, a full stdout, runs as
a subprocess). ``tests/test_errors_doc.py`` runs every case, checks that it ends with its exit code,
one line on stderr and no traceback, and fails when the committed page differs from what this
script prints. After adding a case or changing a message, run from the repository root:

    .venv/bin/python scripts/gen_errors_doc.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from typer.testing import CliRunner

from simbatch.app.sweep import grid
from simbatch.config import guard, loading

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "errors.md"

GOOD = """\
name: good
workload:
  num_requests: 10
  arrival: {rate: 2}
batching: {max_num_seqs: 8, max_num_batched_tokens: 512}
"""
TRACE = "name: traced\nworkload:\n  trace:\n    path: {path}\n"
PRESET = GOOD + "device: {preset: llama-3.1-8b/H100-SXM}\nkv_cache: {num_blocks: auto}\n"
TRACE_CSV = "TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,10,5\n0.5,12,6\n1.0,9,4\n"


def _laughs() -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Case:
    """One bad input: files to write (name -> text or bytes), the command, and what it must end with."""

    kind: str
    args: tuple[str, ...]
    files: dict[str, str | bytes] = field(default_factory=dict)
    code: int = 2
    setup: Callable[[Path], None] | None = None  # prepares the scratch folder (a sweep to damage, ...)
    subprocess: bool = False


def _sweep_then(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    """A finished one-point sweep in ``sw/``, then ``damage`` applied to the folder."""
    def setup(tmp: Path) -> None:
        result = invoke(["sweep", "s.yaml", "-r", "1", "-w", "1", "-o", "sw"], tmp)
        assert result.exit_code == 0, result.output
        damage(tmp / "sw")
    return setup


def _point(sw: Path) -> Path:
    return next((sw / "points").glob("*.json"))


def _truncate(sw: Path) -> None:
    point = _point(sw)
    point.write_text(point.read_text()[:50])


def _foreign(sw: Path) -> None:
    _point(sw).write_text(json.dumps({"overrides": ["seed=99"], "seed": 99, "summary": {}, "stability": {}}))


def _change_trace(sw: Path) -> None:
    (sw.parent / "trace.csv").write_text(TRACE_CSV + "1.5,20,8\n")


SWEEP_ARGS = ("sweep", "s.yaml", "-r", "1", "-w", "1", "-o", "sw")

CASES = [
    # The scenario file itself
    Case("scenario file is a device", ("validate", "/dev/zero")),
    Case("NUL byte in the scenario", ("validate", "s.yaml"), {"s.yaml": "name: x\x00y\n"}),
    Case("nesting 100,000 levels deep", ("validate", "s.yaml"), {"s.yaml": "[" * 100_000}),
    Case('"billion laughs" (aliases of aliases)', ("validate", "s.yaml"), {"s.yaml": _laughs()}),
    Case("alias inside itself", ("validate", "s.yaml"), {"s.yaml": "a: &a [*a]\n"}),
    Case("duplicate key", ("validate", "s.yaml"), {"s.yaml": GOOD.replace("  num_requests: 10\n",
                                                                            "  num_requests: 10\n  num_requests: 20\n")}),
    Case("misspelt key", ("validate", "s.yaml"), {"s.yaml": GOOD.replace("num_requests", "num_request")}),
    Case("infinite number", ("validate", "s.yaml", "--set", "device.tau0_ms=.inf"), {"s.yaml": GOOD}),
    Case("NaN", ("validate", "s.yaml", "--set", "device.beta_ms=.nan"), {"s.yaml": GOOD}),
    Case("absurd rate", ("validate", "s.yaml", "--set", "workload.arrival.rate=1.0e308"), {"s.yaml": GOOD}),
    Case("absurd length", ("validate", "s.yaml", "--set", "workload.output_tokens={dist: fixed, value: 1000000000000}"),
         {"s.yaml": GOOD}),
    # Run size
    Case("a billion requests", ("run", "s.yaml", "--set", "workload.num_requests=1000000000"), {"s.yaml": GOOD}),
    Case("duration of 10^12 s", ("validate", "s.yaml", "--set", "workload.num_requests=null",
                                 "--set", "workload.duration_s=1.0e12"), {"s.yaml": GOOD}),
    Case("10^8 replicas", ("validate", "s.yaml", "--set", "cluster.replicas=100000000"), {"s.yaml": GOOD}),
    Case("a range of a million values", ("sweep", "s.yaml", "-p", "workload.arrival.rate=1:1000000:1"),
         {"s.yaml": GOOD}),
    Case("a grid of 150,000 runs", ("sweep", "s.yaml", "-p", "workload.arrival.rate=1:50000:1"), {"s.yaml": GOOD}),
    # Data files
    Case("trace is /dev/zero", ("validate", "s.yaml"), {"s.yaml": TRACE.format(path="/dev/zero")}),
    Case("trace is /dev/stdin", ("validate", "s.yaml"), {"s.yaml": TRACE.format(path="/dev/stdin")}),
    Case("trace is not a CSV (a password file)", ("validate", "s.yaml"),
         {"s.yaml": TRACE.format(path="shadow"), "shadow": "root:$y$j9T$secret:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n"}),
    Case("trace is binary", ("validate", "s.yaml"),
         {"s.yaml": TRACE.format(path="blob.csv"), "blob.csv": bytes(range(256)) * 4}),
    Case("trace cell with a terminal escape", ("validate", "s.yaml"),
         {"s.yaml": TRACE.format(path="t.csv"), "t.csv": TRACE_CSV + "1.5,\x1b[2J,8\n"}),
    # Output
    Case("--out on a read-only file system", ("run", "s.yaml", "--out", "/proc/simbatch-out"), {"s.yaml": GOOD}),
    Case("standard output is full", ("schema",), subprocess=True),
    Case("trace cap below one request", ("run", "s.yaml", "--trace-max-requests", "0"), {"s.yaml": GOOD}),
    Case("view a folder without a report", ("view", "."), {"s.yaml": GOOD}),
    # Sweeps
    Case("truncated point file", SWEEP_ARGS, {"s.yaml": GOOD}, setup=_sweep_then(_truncate)),
    Case("foreign point file", SWEEP_ARGS, {"s.yaml": GOOD}, setup=_sweep_then(_foreign)),
    Case("trace changed since the sweep began", SWEEP_ARGS,
         {"s.yaml": TRACE.format(path="trace.csv"), "trace.csv": TRACE_CSV}, setup=_sweep_then(_change_trace)),
    Case("malformed Dask address", ("sweep", "s.yaml", "--scheduler-address", "localhost"), {"s.yaml": GOOD}),
    Case("capacity-search on a trace", ("capacity-search", "s.yaml", "--slo", "ttft_p99_ms=500"),
         {"s.yaml": TRACE.format(path="trace.csv"), "trace.csv": TRACE_CSV}),
    Case("a sweep point that fails", ("sweep", "s.yaml", "-p", "workload.arrival.rate=2,-1", "-r", "1", "-w", "1",
                                      "-o", "sw"), {"s.yaml": GOOD}, code=1),
    Case("capacity-search SLO out of reach", ("capacity-search", "s.yaml", "--slo", "ttft_p99_ms=0.001", "-r", "1",
                                              "-w", "1", "-o", "cs"), {"s.yaml": GOOD}, code=1),
    # Plans
    Case("plan: an empty search space", ("plan", "p.yaml", "--space", "space.yaml", "--slo", "ttft_p99_ms=500"),
         {"p.yaml": PRESET, "space.yaml": "gpus: []\n"}),
    Case("plan: an SLO no configuration meets", ("plan", "p.yaml", "--slo", "tpot_p99_ms=1"), {"p.yaml": PRESET}),
    Case("plan: a prices file without the chosen GPU", ("plan", "p.yaml", "--slo", "ttft_p99_ms=500", "--prices",
                                                        "prices.yaml"),
         {"p.yaml": PRESET, "prices.yaml": "gpus:\n  L4: {usd_per_gpu_hour: 0.89}\n"}),
    Case("plan: a device without a GPU to price", ("plan", "s.yaml", "--slo", "ttft_p99_ms=500"), {"s.yaml": GOOD}),
]


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    stderr: str
    stdout: str


def invoke(args: list[str], cwd: Path):
    """``simbatch ARGS`` in-process, run from ``cwd``."""
    from simbatch.app.cli import app

    here = Path.cwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(app, args)
    finally:
        os.chdir(here)


def run_case(case: Case) -> Outcome:
    """Run ``case`` in a fresh scratch folder; the folder's path is removed from what it printed."""
    tmp = Path(tempfile.mkdtemp(prefix="simbatch-errors-"))
    try:
        for name, content in case.files.items():
            (tmp / name).write_bytes(content if isinstance(content, bytes) else content.encode())
        if case.setup:
            case.setup(tmp)
        if case.subprocess:
            simbatch = Path(sys.executable).with_name("simbatch")
            with open("/dev/full", "w") as full:
                done = subprocess.run([str(simbatch), *case.args], cwd=tmp, stdout=full, stderr=subprocess.PIPE,
                                      text=True, timeout=60)
            outcome = Outcome(done.returncode, done.stderr, "")
        else:
            result = invoke(list(case.args), tmp)
            outcome = Outcome(result.exit_code, result.stderr, result.stdout)
        return Outcome(outcome.exit_code, outcome.stderr.replace(f"{tmp}/", ""), outcome.stdout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


HEADER = """\
# What simbatch says about bad input

<!-- Generated by scripts/gen_errors_doc.py, which runs every case; tests/test_errors_doc.py checks
     that each ends as shown and that this page is current. Do not edit by hand. -->

Bad input of any kind ends a command the same way: **one line per problem on stderr**, naming the
file (with line and column where there is one), the field, the value and the fix; **exit code 2**;
no traceback; and no result folder, not even a half-written one. A sweep or capacity search that ran
but has points without an answer exits **1** (the rows with their errors are in its table). A plan
whose question has no answer exits 2 with one line naming the closest miss: before any simulation when
the closed forms rule out every configuration (nothing is written), or after one, with the store of
its runs and ``candidates.csv`` (every candidate's fate) in its folder.

The other ways a command ends early:

| what | exit code | printed |
| --- | --- | --- |
| Ctrl-C (SIGINT), at any stage | 130 | `interrupted` (a half-written result folder is removed) |
| SIGTERM (`timeout`, `kill`) | 143 | `interrupted (terminated)` (likewise) |
| the reader of stdout goes away (`simbatch run ... \\| head`) | as if it had not | nothing: output stops, the run still writes its folder |

## Size limits

Before anything is drawn, the command estimates what the run will hold in memory, from measured
costs (`simbatch/config/guard.py`, checked by `tests/test_guard.py`): about {per_request:,} bytes per request
and {per_replica:,} per replica. A run estimated above **{max_gb:g} GB** (about {max_requests:,}
requests), or a sweep of more than **{max_runs:,} runs** (grid points x replications), is refused with
the estimate; pass `--force` to run it anyway, or lower the setting. One range in `--param` may
expand to at most {max_values:,} values. A scenario file may be at most {max_file:,} bytes, nested at
most {max_depth} levels, and expand to at most {max_nodes:,} values with its aliases.

## Every case

Each row was produced by running the command shown in a scratch folder holding the files the case
needs (`s.yaml` is the scenario).

| bad input | command | exit | message |
| --- | --- | --- | --- |
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def render(outcomes: dict[str, Outcome] | None = None) -> str:
    """The page; ``outcomes`` (by case kind) when the cases have been run already."""
    rows = []
    for case in CASES:
        outcome = outcomes[case.kind] if outcomes else run_case(case)
        line = outcome.stderr.strip().splitlines()[-1] if outcome.stderr.strip() else ""
        command = "simbatch " + " ".join(case.args) + (" > /dev/full" if case.subprocess else "")
        rows.append(f"| {_cell(case.kind)} | `{_cell(command)}` | {outcome.exit_code} | {_cell(line)} |")
    limits = {"per_request": guard.BYTES_PER_REQUEST, "per_replica": guard.BYTES_PER_REPLICA,
              "max_gb": guard.MAX_BYTES / 1e9, "max_requests": int(guard.MAX_BYTES // guard.BYTES_PER_REQUEST),
              "max_runs": guard.MAX_RUNS, "max_values": grid.MAX_VALUES, "max_file": loading.MAX_SCENARIO_BYTES,
              "max_depth": loading.MAX_DEPTH, "max_nodes": loading.MAX_NODES}
    return HEADER.format(**limits) + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/errors.md is stale, write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        return 0 if OUT.read_text(encoding="utf-8") == text else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

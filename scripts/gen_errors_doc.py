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

from simbatch.app import compare
from simbatch.app.sweep import grid
from simbatch.config import base, cluster, device, kv_cache
from simbatch.inputs import guard, loading

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
DISAGGREGATED = GOOD + """\
cluster:
  disaggregated:
    prefill: {count: 1}
    decode: {count: 1}
    kv_transfer: {bandwidth_gb_s: 50, latency_ms: 1}
    kv_bytes_per_token: 131072
"""
MS_TRACE = "TIMESTAMP,ContextTokens,GeneratedTokens\n1700000000000,10,5\n1700000000500,12,6\n"
CARD = "{name: G, memory_gib: 1.0e15, memory_bandwidth_gb_s: 3000, bf16_tflops: 900, interconnect_gb_s: 400}"


def _two_runs_then(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    """Two finished result folders, ``a/`` and ``b/``, then ``damage`` applied to ``b/``."""
    def setup(tmp: Path) -> None:
        for name in ("a", "b"):
            result = invoke(["run", "s.yaml", "--no-plots", "--quiet", "--out", name], tmp)
            assert result.exit_code == 0, result.output
        damage(tmp / "b")
    return setup


def _truncate_summary(folder: Path) -> None:
    (folder / "summary.json").write_text('{"completed": 1')


def _deep_summary(folder: Path) -> None:
    (folder / "summary.json").write_text("[" * 100_000 + "]" * 100_000)


def _foreign_config(folder: Path) -> None:
    (folder / "resolved_config.json").write_text(json.dumps({"workload": {"num_requests": -3}}))


def _no_status(folder: Path) -> None:
    lines = (folder / "requests.csv").read_text().splitlines()
    header = lines[0].split(",")
    keep = [i for i, name in enumerate(header) if name != "status"]
    (folder / "requests.csv").write_text("\n".join(",".join(row.split(",")[i] for i in keep) for row in lines) + "\n")


COMPARE_ARGS = ("compare", "a", "b", "--no-plots")

BENCH = ('{"duration": 100.0, "completed": 100, "total_input_tokens": 10000, "total_output_tokens": 10000, '
         '"request_throughput": 1.0, "mean_ttft_ms": 40.0, "mean_tpot_ms": 9.0, "request_rate": 1.0}')
LENS = ', "input_lens": [5, 7, 9], "output_lens": [3, 3, 3], "ttfts": [0.01, 0.02, 0.03]}'


def _huge_result(tmp: Path) -> None:
    with (tmp / "r.json").open("wb") as f:
        f.truncate(2 * 2**30)  # sparse: nothing written, and nothing may be read

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
    Case("a lone surrogate in a name", ("validate", "s.yaml"), {"s.yaml": 'name: "half \\ud83d"\n' + GOOD[len("name: good\n"):]}),
    # Physical bounds
    Case("a step of 1e305 ms", ("validate", "s.yaml", "--set", "device.tau0_ms=1e305"), {"s.yaml": GOOD}),
    Case("10^23 KV blocks", ("validate", "s.yaml", "--set", "kv_cache.num_blocks=100000000000000000000000"),
         {"s.yaml": GOOD}),
    Case("a KV transfer of 1e300 ms", ("validate", "s.yaml", "--set", "cluster.disaggregated.kv_transfer.latency_ms=1e300"),
         {"s.yaml": DISAGGREGATED}),
    Case("a KV link of 1e-300 GB/s", ("validate", "s.yaml", "--set",
                                      "cluster.disaggregated.kv_transfer.bandwidth_gb_s=1e-300"), {"s.yaml": DISAGGREGATED}),
    Case("1e308 bytes of KV per token", ("validate", "s.yaml", "--set", "cluster.disaggregated.kv_bytes_per_token=1e308"),
         {"s.yaml": DISAGGREGATED}),
    Case("a drafter of 1e308 target steps", ("validate", "s.yaml", "--set", "device.speculative={num_speculative_tokens: 4, "
                                             "acceptance_rate: 0.7, draft_cost_fraction: 1.0e308}"), {"s.yaml": GOOD}),
    Case("a GPU card of 10^15 GiB", ("validate", "s.yaml", "--set", "device.preset=llama-3.1-8b/G", "--set",
                                     f"device.gpu_card={CARD}"), {"s.yaml": GOOD}),
    Case("an inline GPU card the preset does not name", ("validate", "s.yaml", "--set", "device.preset=llama-3.1-8b/H100-SXM",
                                                         "--set", f"device.gpu_card={CARD.replace('1.0e15', '80')}"),
         {"s.yaml": GOOD}),
    Case("weights larger than the GPU, num_blocks given", ("validate", "s.yaml", "--set", "device.preset=llama-3.1-70b/L4",
                                                           "--set", "kv_cache.num_blocks=1000"), {"s.yaml": GOOD}),
    # The clock (int64 nanoseconds)
    Case("arrivals past the clock", ("validate", "s.yaml", "--set", "workload.arrival.rate=1e-12"), {"s.yaml": GOOD}),
    Case("epoch milliseconds kept as seconds", ("validate", "s.yaml"),
         {"s.yaml": TRACE.format(path="t.csv") + "    keep_time_origin: true\n", "t.csv": MS_TRACE}),
    Case("a clock stop of 1e300 s", ("validate", "s.yaml", "--set", "sim.max_time_s=1e300"), {"s.yaml": GOOD}),
    # Run size
    Case("a billion requests", ("run", "s.yaml", "--set", "workload.num_requests=1000000000"), {"s.yaml": GOOD}),
    Case("duration of 10^9 s", ("validate", "s.yaml", "--set", "workload.num_requests=null",
                                "--set", "workload.duration_s=1.0e9"), {"s.yaml": GOOD}),
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
    # The command line
    Case("--goodput with a unit", ("run", "s.yaml", "--goodput", "ttft:0.5s"), {"s.yaml": GOOD}),
    Case("--metric-percentiles as fractions", ("run", "s.yaml", "--metric-percentiles", "0.99"), {"s.yaml": GOOD}),
    Case("a --set typo", ("validate", "s.yaml", "--set", "workload.arival.rate=4"), {"s.yaml": GOOD}),
    Case("a --param also given by --set", ("sweep", "s.yaml", "-p", "workload.arrival.rate=1,2", "--set",
                                           "workload.arrival.rate=3"), {"s.yaml": GOOD}),
    Case("compare with no mode", ("compare", "s.yaml", "--modes", ""), {"s.yaml": GOOD}),
    # Compare of damaged result folders
    Case("compare: a truncated summary.json", COMPARE_ARGS, {"s.yaml": GOOD}, setup=_two_runs_then(_truncate_summary)),
    Case("compare: a summary.json 100,000 levels deep", COMPARE_ARGS, {"s.yaml": GOOD},
         setup=_two_runs_then(_deep_summary)),
    Case("compare: resolved_config.json not a scenario", COMPARE_ARGS, {"s.yaml": GOOD},
         setup=_two_runs_then(_foreign_config)),
    Case("compare: requests.csv without its status column", COMPARE_ARGS, {"s.yaml": GOOD},
         setup=_two_runs_then(_no_status)),
    Case("view a folder without a report", ("view", "."), {"s.yaml": GOOD}),
    # Sweeps
    Case("Mooncake trace whose hash_ids do not cover the prompt", ("validate", "s.yaml"),
         {"s.yaml": "workload:\n  trace: {path: t.jsonl, format: mooncake}\n",
          "t.jsonl": '{"timestamp": 0, "input_length": 1500, "output_length": 5, "hash_ids": [0, 1]}\n'}),
    Case("a trace's two ways of sharing at once", ("validate", "s.yaml"),
         {"s.yaml": "workload:\n  trace: {path: t.csv, session_column: conv, prompt_id_column: pid}\n",
          "t.csv": "TIMESTAMP,ContextTokens,GeneratedTokens,conv,pid\n0,10,5,a,x\n"}),
    # vllm bench serve --save-result files (calibrate, compare and replay read them alike)
    Case("result file with NaN", ("calibrate", "r.json"), {"r.json": BENCH.replace("40.0", "NaN")}),
    Case("result file with a string for a number", ("compare", "r.json", "r.json"),
         {"r.json": BENCH.replace("40.0", '"40 ms"')}),
    Case('result file with "completed": true', ("calibrate", "r.json"),
         {"r.json": BENCH.replace('"completed": 100', '"completed": true')}),
    Case("result file with a negative latency", ("replay", "r.json"), {"r.json": BENCH.replace("40.0", "-45.5")}),
    Case("result file with ragged per-request arrays", ("replay", "r.json"),
         {"r.json": BENCH[:-1] + LENS.replace("[3, 3, 3]", "[3, 3]")}),
    Case("result file nested 100,000 levels deep", ("calibrate", "r.json"), {"r.json": "[" * 100_000}),
    Case("result file of 2 GB", ("compare", "r.json", "r.json"), setup=_huge_result),
    Case("latency-only result file to calibrate", ("calibrate", "r.json"),
         {"r.json": '{"request_rate": 1.0, "mean_ttft_ms": 40.0, "mean_tpot_ms": 9.0, "mean_itl_ms": 9.0}'}),
    Case("speculative-decoding result file to calibrate", ("calibrate", "r.json"),
         {"r.json": BENCH[:-1] + ', "spec_decode_acceptance_rate": 72.0, "spec_decode_acceptance_length": 3.2}'}),
    Case("two runs of the same prompts, no prefix hit rate", ("calibrate", "a.json", "b.json"),
         {"a.json": BENCH[:-1] + LENS, "b.json": BENCH[:-1].replace('"request_rate": 1.0', '"request_rate": 2.0') + LENS}),
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
costs (`simbatch/inputs/guard.py`, checked by `tests/test_guard.py`): about {per_request:,} bytes per request
and {per_replica:,} per replica. A run estimated above **{max_gb:g} GB** (about {max_requests:,}
requests), or a sweep of more than **{max_runs:,} runs** (grid points x replications), is refused with
the estimate; pass `--force` to run it anyway, or lower the setting. One range in `--param` may
expand to at most {max_values:,} values. A scenario file may be at most {max_file:,} bytes, nested at
most {max_depth} levels, and expand to at most {max_nodes:,} values with its aliases. `compare` reads at
most {max_json:,} bytes of a result folder's JSON files and {max_frame:,} bytes of its CSV files
(`--force` lifts the second); a compressed trace is sized by its decompressed rows.

## Physical bounds

A number far past anything real is a typo, and is refused with its field's name
(each section's module in `simbatch/config/` says why its bound is where it is): a step's cost above {max_cost:,.0f} ms,
a drafter above {max_draft:g} target steps, a KV link below {min_link:g} or above {max_link:,.0f} GB/s or
with more than {max_latency:,.0f} ms of set-up, more than {max_kv_bytes:,.0f} bytes of KV per token, more
than {max_blocks:,} KV blocks. Every time must fit the clock, whole nanoseconds in 64 bits: at most
{max_time:.2g} s (146 years, half of what the clock holds, the rest left for serving), arrivals included
(a rate of 1e-12, a trace's epoch milliseconds read as seconds). Values that are possible but no GPU
has give a `warning:` line instead: a device cost outside what any GPU does (seconds or microseconds
typed as milliseconds), a `num_blocks` more than the preset's GPU holds.

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
        command = "simbatch " + " ".join(a or "''" for a in case.args) + (" > /dev/full" if case.subprocess else "")
        rows.append(f"| {_cell(case.kind)} | `{_cell(command)}` | {outcome.exit_code} | {_cell(line)} |")
    limits = {"per_request": guard.BYTES_PER_REQUEST, "per_replica": guard.BYTES_PER_REPLICA,
              "max_gb": guard.MAX_BYTES / 1e9, "max_requests": int(guard.MAX_BYTES // guard.BYTES_PER_REQUEST),
              "max_runs": guard.MAX_RUNS, "max_values": grid.MAX_VALUES, "max_file": loading.MAX_SCENARIO_BYTES,
              "max_depth": loading.MAX_DEPTH, "max_nodes": loading.MAX_NODES, "max_json": compare.MAX_JSON_BYTES,
              "max_frame": compare.MAX_FRAME_BYTES, "max_cost": base.MAX_COST_MS,
              "max_draft": device.MAX_DRAFT_COST_FRACTION, "min_link": cluster.MIN_LINK_GB_S,
              "max_link": cluster.MAX_LINK_GB_S, "max_latency": cluster.MAX_TRANSFER_LATENCY_MS,
              "max_kv_bytes": cluster.MAX_KV_BYTES_PER_TOKEN, "max_blocks": kv_cache.MAX_NUM_BLOCKS,
              "max_time": base.MAX_TIME_S}
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

"""``python -m benchmarks.compare REV [CASES...]``: every benchmark case, here and at commit REV, side by side.

REV's code is taken out of git (``git archive``) into a temporary folder and run by this venv's
Python with ``PYTHONPATH`` pointing at it (``--python`` names another interpreter, for a commit whose
dependencies differ); this checkout runs as it is, uncommitted changes included. Each case's
scenario is built by *this* code (``benchmarks/cases.py``, data paths absolute) and handed to both as
JSON, so both simulate the same scenario. Runs alternate, each in a fresh process (here, REV, here,
REV, ...), and each measures the CPU time (``time.process_time``) of building the engine and running
it, as ``benchmarks.one`` times the simulation: workload generation, imports and frames are left out.

For each case it prints the median over rounds of the ratio here/REV (below 1: faster here) and the
range of those ratios; each round's pair ran back to back, so its ratio is free of the machine's drift
between rounds. It also prints both sides' engine steps: a differing count means REV simulates the
scenario differently (a behaviour change since), and the ratio compares different work.

REV's schema may lack fields this code has. A field REV does not know, set to this code's default (a
feature left off), is left out for REV. A workload REV cannot express (e.g. resampled pairs) is
replayed, on both sides, as a trace of the requests this code draws (arrival time, prompt, output),
and the case is marked so. Any other case REV cannot run is reported with REV's error, never skipped.
The table is also written into ``benchmarks/results.md`` (section "Compared with"; ``--no-write``
leaves the file alone).

``--instructions`` counts instead, once a side, the machine instructions of running the engine (under
valgrind's callgrind: the count of a process that builds the engine and runs it, less that of one that
only builds it), which a shared, noisy machine does not change: a ratio of work, not of time (a cache
miss costs no more than a hit here). Its table goes into a section of its own ("Compared with REV, in instructions").
Unless named, it leaves out the million-request cases (B2, B9): under callgrind each takes half an hour or more a side.

    python -m benchmarks.compare 51d82f9 B1 B6 B7 B8 --repeats 5
    python -m benchmarks.compare 51d82f9 B1 B3 --instructions
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from benchmarks.cases import CASES
from benchmarks.run import COMPARED, LONG, REPORT, b2_repeats, sections

ROOT = Path(__file__).resolve().parent.parent

# Run by each side's own code (its folder first on sys.path): only names both layouts have, the flat one
# of early commits (simbatch/engine.py, simbatch/metrics/) and today's (simbatch/engine/, simbatch/analysis/).
DRIVER = r'''
import json, sys, time
spec = json.loads(open(sys.argv[1], encoding="utf-8").read())
def say(**fields):
    print(json.dumps(fields))
    sys.exit(0)
try:
    import pydantic
    from simbatch.config import Scenario
    from simbatch.engine import Engine
    from simbatch.workload import generate
    try:
        from simbatch.analysis.summary import iterations_frame, requests_frame, summarize
    except ImportError:
        from simbatch.metrics.summary import iterations_frame, requests_frame, summarize
    try:  # where validation and resolution (presets, num_blocks: auto) are two steps
        from simbatch.inputs.resolve import resolve
    except ImportError:
        def resolve(scenario):
            return scenario
except Exception as exc:
    say(error=f"cannot import its engine: {type(exc).__name__}: {exc}")

def key_path(data, loc):
    """The loc of a validation error as keys of the input (union tags in loc are not keys)."""
    path, node = [], data
    for part in loc:
        if isinstance(node, dict) and part in node:
            path.append(part); node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            path.append(part); node = node[part]
    return path

data, droppable, dropped = spec["scenario"], [list(p) for p in spec["droppable"]], []
while True:
    try:
        scenario = resolve(Scenario.model_validate(data))
        break
    except pydantic.ValidationError as exc:
        errors = [(key_path(data, e["loc"]), e) for e in exc.errors()]
        fixable = [p for p, e in errors if e["type"] == "extra_forbidden" and p in droppable]
        if len(fixable) < len(errors):
            say(error="; ".join(f"{'.'.join(map(str, p)) or 'scenario'}: {e['msg']}" for p, e in errors
                                if p not in fixable), workload_only=all(p[:1] == ["workload"] for p, _ in errors))
        for path in fixable:
            node = data
            for part in path[:-1]:
                node = node[part]
            del node[path[-1]]
            dropped.append(".".join(map(str, path)))
if spec.get("check_only"):
    say(dropped=dropped)
workload = generate(scenario)
start = time.process_time()
engine = Engine(scenario, workload)
if spec.get("stop") == "built":  # (--instructions: what is counted before the run, taken from what is after it)
    say(stop="built")
end_s = engine.run()
cpu_s = time.process_time() - start
if spec.get("stop") == "ran":
    say(stop="ran")
requests, iterations = requests_frame(workload, engine.recorder), iterations_frame(engine.recorder)
frames_s = time.process_time() - start
summary = summarize(scenario, requests, iterations, engine.recorder, end_s)
say(cpu_s=cpu_s, frames_s=frames_s, steps=int(summary["num_steps"]), completed=int(summary["completed"]),
    dropped=dropped)
'''


def at_default(model: BaseModel, prefix: tuple = ()) -> list[list]:
    """Key paths of the fields set in ``model`` (nested models included) whose value is today's default."""
    found = []
    for name in sorted(model.model_fields_set):
        value, field = getattr(model, name), type(model).model_fields[name]
        if isinstance(value, BaseModel):
            found += at_default(value, (*prefix, name))
        elif field.default_factory is None and value == field.default:
            found.append([*prefix, name])
    return found


def portable(scenario) -> dict:
    """The scenario as JSON for another commit's code: what was set, and which of it is at today's default.

    Only set fields are given (a default that moved since is the other commit's to apply, as a user of
    it would see); those at today's default are the ones it may drop if its schema lacks them.
    """
    return {"scenario": scenario.model_dump(mode="json", exclude_unset=True), "droppable": at_default(scenario)}


def as_trace(scenario, folder: Path) -> dict | None:
    """The scenario with its workload replaced by a trace of the requests this code draws, or None
    when a trace (times and two lengths) cannot carry them: tenants, priorities, sessions, prefixes."""
    from simbatch.workload import generate

    given = scenario.model_dump(mode="json", exclude_unset=True)
    if set(given.get("workload", {})) - {"num_requests", "duration_s", "arrival", "prompt_tokens", "output_tokens"}:
        return None
    w = generate(scenario)
    plain = (w.tenant_names == ("default",) and not w.priority.any() and np.array_equal(w.session, np.arange(len(w)))
             and not w.shared_prefix_tokens.any() and len(set(w.prefix_stream.tolist())) <= 1)
    if not plain or len(w) == 0:
        return None
    path = folder / f"{scenario.name}-requests.csv"
    with path.open("w", encoding="utf-8") as f:
        f.write("arrival_s,prompt_tokens,output_tokens\n")
        # Times from the first arrival, written exactly (repr): the replay's shift to t = 0 is then exact.
        for t, p, o in zip((w.arrival_s - w.arrival_s[0]).tolist(), w.prompt_tokens.tolist(),
                           w.output_tokens.tolist(), strict=True):
            f.write(f"{t!r},{p},{o}\n")
    given["workload"] = {"trace": {"path": str(path), "timestamp_column": "arrival_s",
                                   "prompt_column": "prompt_tokens", "output_column": "output_tokens"}}
    return {"scenario": given, "droppable": portable(scenario)["droppable"]}


def checkout(rev: str, folder: Path) -> tuple[str, str]:
    """REV's tree extracted into ``folder``; (full hash, subject line)."""
    commit, subject = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%H%n%s", f"{rev}^{{commit}}"],
                                     check=True, capture_output=True, text=True).stdout.splitlines()[:2]
    archive = folder / "tree.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), commit], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(folder / "tree", filter="data")
    archive.unlink()
    return commit, subject


def run_side(python: str, tree: Path, spec: dict, folder: Path, wrapper: tuple[str, ...] = ()) -> dict:
    """One fresh process of ``tree``'s code on the scenario of ``spec`` (run by ``wrapper``, if any);
    its last line of output, and its ``stderr``."""
    path = folder / "scenario.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    # A fixed hash seed: under --instructions, two processes alike must count alike (dict layouts).
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    done = subprocess.run([*wrapper, python, "-c", DRIVER, str(path)], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=3600)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return {"error": f"failed: {last}"}
    return {**json.loads(lines[-1]), "stderr": done.stderr}


def instructions(python: str, tree: Path, spec: dict, folder: Path) -> int | str:
    """Machine instructions of running the engine on ``spec`` with ``tree``'s code (callgrind's count of
    building and running it, less that of building it), or what went wrong."""
    counts = []
    for stop in ("built", "ran"):
        # One BLAS thread: valgrind runs a process's threads in turns, and NumPy's idle BLAS workers poll
        # meanwhile, which it counts in proportion to the run's length (1 % of B3); outside valgrind they sleep.
        out = run_side(python, tree, {**spec, "stop": stop}, folder,
                       ("env", "OPENBLAS_NUM_THREADS=1", "valgrind", "--tool=callgrind",
                        f"--callgrind-out-file={folder / 'callgrind.out'}"))
        if "error" in out:
            return out["error"]
        found = re.search(r"Collected\s*:\s*(\d+)", out["stderr"])
        if found is None:
            return "valgrind printed no count"
        counts.append(int(found.group(1)))
    return counts[1] - counts[0]


def compare_case(name: str, repeats: int, old_tree: Path, old_python: str, folder: Path,
                 count: bool = False) -> dict:
    """Alternating runs of one case here and in ``old_tree``: their CPU times, steps and what was adapted
    (``count``: instead, each side's instructions, once)."""
    scenario = CASES[name][1]()
    spec, note = portable(scenario), ""
    check = run_side(old_python, old_tree, {**spec, "check_only": True}, folder)
    if "error" in check and check.get("workload_only"):
        traced = as_trace(scenario, folder)
        if traced is None:
            return {"error": f"{check['error']} (nor can a trace of its requests say what it says: tenants, "
                             "priorities, sessions or shared prefixes)"}
        note = f"workload replayed as a trace of its requests on both sides (REV: {check['error']})"
        spec = traced
        check = run_side(old_python, old_tree, {**spec, "check_only": True}, folder)
    if "error" in check:
        return {"error": check["error"]}
    if count:
        new_i = instructions(sys.executable, ROOT, spec, folder)
        old_i = instructions(old_python, old_tree, spec, folder)
        for side, counted in (("here", new_i), ("REV", old_i)):
            if isinstance(counted, str):
                return {"error": f"{side}: {counted}"}
        return {"new_i": new_i, "old_i": old_i, "note": note}
    new_runs, old_runs = [], []
    for _ in range(b2_repeats(repeats) if name == "B2" else repeats):
        for side, runs, python, tree in (("here", new_runs, sys.executable, ROOT),
                                         ("REV", old_runs, old_python, old_tree)):
            runs.append(run_side(python, tree, spec, folder))
            if "error" in runs[-1]:
                return {"error": f"{side}: {runs[-1]['error']}"}
    ratios = sorted(n["cpu_s"] / o["cpu_s"] for n, o in zip(new_runs, old_runs, strict=True))
    with_frames = statistics.median(n["frames_s"] / o["frames_s"] for n, o in zip(new_runs, old_runs, strict=True))
    if check["dropped"]:
        note = "; ".join(filter(None, [note, f"left out for REV (at their default): {', '.join(check['dropped'])}"]))
    return {"new_s": statistics.median(r["cpu_s"] for r in new_runs),
            "old_s": statistics.median(r["cpu_s"] for r in old_runs), "ratios": ratios, "with_frames": with_frames,
            "steps": (new_runs[0]["steps"], old_runs[0]["steps"]), "note": note}


def instruction_table(results: dict[str, dict]) -> list[str]:
    lines = ["| case | here (M instructions) | REV (M instructions) | here/REV | note |", "|---|---:|---:|---:|---|"]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | | | cannot run | {r['error']} |")
            continue
        lines.append(f"| {name} | {r['new_i'] / 1e6:,.1f} | {r['old_i'] / 1e6:,.1f} | {r['new_i'] / r['old_i']:.3f}x | "
                     f"{r['note']} |")
    return lines


def table(results: dict[str, dict]) -> list[str]:
    lines = ["| case | here (CPU s) | REV (CPU s) | here/REV, median | range | with frames | steps here / REV | note |",
             "|---|---:|---:|---:|---|---:|---|---|"]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | | | cannot run | | | | {r['error']} |")
            continue
        steps = f"{r['steps'][0]:,} / {r['steps'][1]:,}" + ("" if r["steps"][0] == r["steps"][1] else " (differ)")
        lines.append(f"| {name} | {r['new_s']:.3f} | {r['old_s']:.3f} | {statistics.median(r['ratios']):.2f}x | "
                     f"{r['ratios'][0]:.2f}-{r['ratios'][-1]:.2f} | {r['with_frames']:.2f}x | {steps} | {r['note']} |")
    return lines


def write_section(lines: list[str]) -> None:
    """Put the section into results.md in place of an earlier one for the same commit (``make bench`` keeps both)."""
    parts = sections(REPORT.read_text(encoding="utf-8") if REPORT.exists() else "# Benchmarks\n")
    heading = lines[0].split(" (")[0]  # "## Compared with 51d82f9": another commit's section stays
    kept = [line for part in parts if not (part and part[0].split(" (")[0] == heading) for line in part]
    REPORT.write_text("\n".join(kept).rstrip() + "\n\n" + "\n".join(lines) + "\n", encoding="utf-8")


def default_cases(instructions: bool) -> list[str]:
    """The cases compared when none is named: all of them, but under ``--instructions`` not the
    million-request ones (``benchmarks.run.LONG``): callgrind runs tens of times slower, and each of them
    would take half an hour or more a side."""
    return [name for name in CASES if not (instructions and name in LONG)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the commit to compare with (a hash, tag or branch)")
    parser.add_argument("cases", nargs="*", help=f"subset of {', '.join(CASES)} (all when omitted)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds per case (B2: a third, at least 2)")
    parser.add_argument("--python", default=sys.executable, help="interpreter for REV's code (default: this one)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave benchmarks/results.md alone")
    parser.add_argument("--instructions", action="store_true",
                        help="count each side's instructions once under valgrind instead of timing")
    args = parser.parse_args()
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; the cases are {', '.join(CASES)}")
    if args.instructions and shutil.which("valgrind") is None:
        parser.error("--instructions needs valgrind (Debian: apt-get install -y valgrind)")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="simbatch-compare-") as scratch:
        folder = Path(scratch)
        try:
            commit, subject = checkout(args.rev, folder)
        except subprocess.CalledProcessError:
            raise SystemExit(f"{args.rev!r} is not a commit of {ROOT}") from None
        results = {}
        names = args.cases or default_cases(args.instructions)
        left_out = [] if args.cases else [name for name in CASES if name not in names]
        if left_out:
            print(f"left out under --instructions: {', '.join(left_out)} (a million requests each: half an hour "
                  "or more a side under callgrind); name them to count them", flush=True)
        for name in names:
            results[name] = compare_case(name, args.repeats, folder / "tree", args.python, folder, args.instructions)
            print((instruction_table if args.instructions else table)({name: results[name]})[-1], flush=True)
    if args.instructions:
        lines = [f"{COMPARED} {commit[:7]}, in instructions (`python -m benchmarks.compare {args.rev} --instructions`)",
                 "", f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, against {commit[:7]} \"{subject}\". Machine "
                 "instructions of building and running the engine on the same scenario here and there (valgrind's "
                 "callgrind, once a side, one BLAS thread), less those of building it: a ratio of work that a "
                 "loaded machine does not change; *here/REV* below 1 is less work here.", "",
                 *instruction_table(results)]
        print("\n".join(lines[2:]))
        if not args.no_write:
            write_section(lines)
            print(f"wrote {REPORT}")
        return
    load_after = os.getloadavg()
    lines = [f"{COMPARED} {commit[:7]} (`python -m benchmarks.compare {args.rev}`)", "",
             f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, against {commit[:7]} \"{subject}\". Simulation CPU time "
             f"(engine built and run) of the same scenario here and at {commit[:7]}, in alternating fresh processes, "
             f"{args.repeats} rounds a case; *here/REV* below 1 is faster here; *with frames*: the median ratio "
             "of the same runs' time to the requests and iterations frames. Load average (1 min) "
             f"{load_before[0]:.1f} before, {load_after[0]:.1f} after, on {os.cpu_count()} cores"
             + (": a loaded machine, so the ratios are indicative only." if max(load_before[0], load_after[0])
                > (os.cpu_count() or 1) else "."), "",
             *table(results)]
    print("\n".join(lines[2:]))
    if not args.no_write:
        write_section(lines)
        print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()

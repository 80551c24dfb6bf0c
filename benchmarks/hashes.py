"""Fingerprints of the frames every shipped scenario and benchmark case produces.

A restructuring must not change what is simulated: ``python -m benchmarks.hashes --write`` stores the
fingerprints before the change (``benchmarks/frame_hashes.json``), ``python -m benchmarks.hashes``
compares them after it and names every case that differs. A change of behaviour (another issue's)
rewrites the file in its own commit, so that the diff shows which cases it moved.

A fingerprint is the SHA-256 of the requests and iterations frames (column names, dtypes and values)
and of the summary's JSON. ``--skip-large`` leaves out the cases of a million requests (B2's minute).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import pandas as pd

from benchmarks.cases import CASES
from simbatch.inputs.loading import load_scenario
from simbatch.simulation import simulate

HASHES = Path(__file__).with_name("frame_hashes.json")
SCENARIOS = Path(__file__).parent.parent / "scenarios"
LARGE = 100_000  # requests: cases above it are skipped by --skip-large


def frame_digest(frame: pd.DataFrame) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([[str(c), str(t)] for c, t in frame.dtypes.items()]).encode())
    h.update(pd.util.hash_pandas_object(frame, index=True).to_numpy().tobytes())
    return h.hexdigest()[:16]


def fingerprint(scenario) -> dict[str, str]:
    result = simulate(scenario)
    summary = json.dumps(result.summary, sort_keys=True, default=str).encode()
    return {"requests": frame_digest(result.requests), "iterations": frame_digest(result.iterations),
            "summary": hashlib.sha256(summary).hexdigest()[:16]}


def cases(skip_large: bool) -> dict[str, object]:
    """name -> a factory of the scenario: every shipped scenario file, then every benchmark case."""
    found: dict[str, object] = {f"scenarios/{p.name}": (lambda p=p: load_scenario(p))
                                for p in sorted(SCENARIOS.glob("*.yaml"))}
    for name, (_, factory, *_rest) in CASES.items():
        if skip_large and (factory().workload.num_requests or 0) > LARGE:  # a trace's size is its file's
            continue
        found[f"benchmarks/{name}"] = factory
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the fingerprints instead of comparing")
    parser.add_argument("--skip-large", action="store_true", help=f"leave out cases of more than {LARGE:,} requests")
    parser.add_argument("only", nargs="*", help="names (or name prefixes) of the cases to run")
    args = parser.parse_args()
    stored = json.loads(HASHES.read_text()) if HASHES.exists() else {}
    found = {}
    for name, factory in cases(args.skip_large).items():
        if args.only and not any(name.startswith(o) or name.endswith(o) for o in args.only):
            continue
        found[name] = fingerprint(factory())
        print(f"{name:40s} {' '.join(found[name].values())}", flush=True)
    if args.write:
        HASHES.write_text(json.dumps({**stored, **found}, indent=1, sort_keys=True) + "\n")
        print(f"wrote {HASHES}")
        return 0
    differ = [n for n, h in found.items() if stored.get(n) != h]
    missing = [n for n in found if n not in stored]
    for name in differ:
        print(f"DIFFERS {name}: stored {stored.get(name)}, now {found[name]}")
    print(f"{len(found) - len(differ)} of {len(found)} identical" + (f" ({len(missing)} not stored)" if missing else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

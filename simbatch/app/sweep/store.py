"""The result folder of a sweep: one JSON file per finished run, so an interrupted sweep resumes.

Layout of ``<out>/``:

- ``manifest.json``: what a run's numbers depend on besides its own overrides and seed: the
  scenario file and its hash, ``--set``, the sha256 of every data file the points read (traces,
  length files), the simbatch version. A restart into the same folder must present the same
  manifest, otherwise old and new runs would be mixed in one table; it is refused instead.
- ``points/<key>.json``: one finished simulation, named by a hash of what determines its numbers
  (the point's overrides and its seed). Written to a temporary file and renamed into place, so a
  file that exists is complete: a sweep killed mid-write leaves no half record to trust. A file
  that is not such a record (truncated by a full disk, copied from elsewhere) is refused by name.

The swept values and the replication count are not in the manifest: a run is found by its key, so
a sweep extended with new values or more replications reuses every run it already has. How a task
is executed (workers, Dask) is not in it either: it does not change the numbers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from simbatch.app.atomic import remove_leftovers
from simbatch.app.atomic import write_text as write_atomic

MANIFEST = "manifest.json"
POINTS = "points"


class StoreError(ValueError):
    """The output folder belongs to something else; the message says what and how to proceed."""


def run_key(overrides: list[str], seed: int) -> str:
    """The file name stem of one run: a hash of the overrides (in order) and the seed."""
    return hashlib.sha256(json.dumps([overrides, seed]).encode()).hexdigest()[:20]


def _differences(old: dict, new: dict) -> list[str]:
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(old.keys() | new.keys())
            if old.get(k) != new.get(k)]


class Store:
    """Finished runs of one sweep, under ``out``."""

    def __init__(self, out: Path, manifest: dict[str, Any]):
        self.out = Path(out)
        # Through JSON once, so tuples and lists, or ints and floats, compare as they will be read back.
        self.manifest = json.loads(json.dumps(manifest))
        self.points = self.out / POINTS
        self.requested = 0  # runs asked of :meth:`load`
        self.resumed = 0  # of which found finished on disk

    def check(self) -> None:
        """Refuse a folder holding another sweep, or anything else. Creates nothing."""
        if not self.out.exists():
            return
        if not self.out.is_dir():
            raise StoreError(f"--out {self.out}: exists and is not a folder; choose another --out")
        manifest = self.out / MANIFEST
        if not manifest.is_file():
            if any(self.out.iterdir()):
                raise StoreError(f"--out {self.out}: the folder is not empty and holds no {MANIFEST}; "
                                 "choose another --out")
            return
        try:
            old = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise StoreError(f"--out {self.out}: cannot read {MANIFEST} ({exc}); choose another --out") \
                from None
        data_then, data_now = old.get("data_sha256", {}), self.manifest.get("data_sha256", {})
        changed_files = [f for f in data_now if f in data_then and data_then[f] != data_now[f]]
        if changed_files:
            raise StoreError(f"--out {self.out}: {changed_files[0]} changed since the runs in it were made "
                             "(its sha256 differs), so they would mix with new ones; delete the folder to "
                             "recompute, or choose another --out")
        if old != self.manifest:
            changed = "; ".join(_differences(old, self.manifest))
            raise StoreError(f"--out {self.out}: holds runs made with other arguments ({changed}); "
                             "rerun with the same arguments to resume, or choose another --out")

    def create(self) -> None:
        try:
            self.points.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"--out {self.out}: cannot create it ({exc.strerror}); choose another place") \
                from None
        for folder in (self.out, self.points):  # what a killed sweep was writing
            remove_leftovers(folder)
        write_atomic(self.out / MANIFEST, json.dumps(self.manifest, indent=2) + "\n")

    def load(self, key: str, overrides: list[str], seed: int) -> dict[str, Any] | None:
        """The finished record of the run ``(overrides, seed)`` stored under ``key``, or None.

        StoreError names a file that is there but is not that run's complete record.
        """
        self.requested += 1
        path = self.points / f"{key}.json"
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            complete = (isinstance(record, dict) and record.get("overrides") == overrides
                        and record.get("seed") == seed and isinstance(record.get("summary"), dict)
                        and isinstance(record.get("stability"), dict))
        except (OSError, ValueError):
            complete = False
        if not complete:
            raise StoreError(f"{path}: not a finished run of this sweep (truncated, or from elsewhere); "
                             "delete it to recompute")
        self.resumed += 1
        return record

    def save(self, key: str, record: dict[str, Any]) -> None:
        # Python's json writes NaN and Infinity (not strict JSON) and reads them back exactly, as it
        # does every float: a resumed sweep's summary.csv is identical to an uninterrupted one's.
        write_atomic(self.points / f"{key}.json", json.dumps(record, indent=1) + "\n")

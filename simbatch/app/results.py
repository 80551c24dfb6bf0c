"""The result folder: everything a run produced, appearing whole or not at all.

A run is written into a hidden temporary folder next to its destination and renamed into place
only once every file is written (:mod:`simbatch.app.atomic`). A crash, a full disk, Ctrl-C or SIGTERM
halfway leaves no folder that looks like a result, so a folder's existence means it is complete; what
a killed run left (a hidden ``.partial-`` folder) the next run writing beside it removes. Folders and
files get the permissions the user's umask gives any new file.

Layout of one run::

    scenario.yaml          the effective scenario: --set overrides applied, every default spelled
                           out, data paths absolute; `simbatch run` on it reproduces summary.json
    run.json               how the folder was made: simbatch version, command line, seed, and the
                           sha256 of every data file the scenario read
    resolved_config.json   the scenario after defaults and --set overrides, as JSON
    summary.json           vLLM-named metrics plus the stability check
    requests.csv           one row per request      (+ requests.parquet when pyarrow is installed)
    iterations.csv         one row per run of steps (+ iterations.parquet)
    fleet.csv              an autoscaled fleet's changes, with the replicas after each (+ fleet.parquet)
    plots/*.png
    report.html            the interactive report (simbatch.app.webreport; `simbatch view FOLDER` opens it)
    trace.json             with --trace: a Chrome trace of steps and requests (simbatch.observe.perfetto)

A comparison holds one such folder per mode (without plots) and overlay plots and the report at the top; its
``scenario.yaml`` is the first mode's (``simbatch compare`` sets the mode of each column itself).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from simbatch import __version__
from simbatch.app.atomic import partial_folder, remove_leftovers, umask
from simbatch.app.errors import OutputError  # noqa: F401 - raised here, caught by the command line
from simbatch.app.scenario_file import scenario_yaml
from simbatch.app.text import spreadsheet_safe_frame
from simbatch.config import Scenario
from simbatch.observe.perfetto import TraceObserver, write_trace
from simbatch.simulation import Result

# The plots and the report (matplotlib, bokeh) are imported where a folder gets them: `run --no-plots`
# and the sweep's points write none and import neither.

RESULTS_ROOT = Path("results")
_NAME_LENGTH = 64


def safe_name(label: str) -> str:
    """A scenario's name as one folder name: letters, digits, ``.``, ``_`` and ``-`` only.

    The name is a label, not a path: ``../../x``, ``/etc`` or a NUL byte must not steer where
    results go. Anything else becomes ``_``; leading dots go (no hidden folders, no ``..``).
    """
    cleaned = re.sub(r"[^A-Za-z0-9._-]+|\.{2,}", "_", label)
    cleaned = re.sub(r"_+", "_", cleaned).strip("._-")[:_NAME_LENGTH].strip("._-")
    return cleaned or "scenario"


def default_folder(scenario_name: str, prefix: str = "", root: Path = RESULTS_ROOT,
                   now: datetime | None = None) -> Path:
    """``root/<safe name>/<prefix><YYYYmmdd-HHMMSS>``, with ``-2``, ``-3``... if that is taken.

    Another run may take the same name before this one finishes; :func:`atomic_folder` then moves
    on to the next suffix, so two runs started in the same second both keep their results.
    """
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return _free(root / safe_name(scenario_name) / f"{prefix}{stamp}")


def _free(base: Path) -> Path:
    folder, n = base, 1
    while folder.exists():
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    return folder


def check_target(folder: Path) -> None:
    """Fail early, before any simulation runs, if ``folder`` cannot become a result folder.

    Writability is tried, not inferred from permission bits: a folder is created (and removed) in
    the nearest existing parent, which also catches read-only and virtual file systems (``/sys``).
    """
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        kind = "a file" if not folder.is_dir() else "a folder that is not empty"
        raise OutputError(f"--out {folder}: {kind} is already there; choose a new folder or remove it")
    parent = folder.absolute().parent
    existing = next(p for p in (parent, *parent.parents) if p.exists())
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a folder")
        Path(tempfile.mkdtemp(prefix=".simbatch-probe-", dir=existing)).rmdir()
    except OSError:
        raise OutputError(f"--out {folder}: cannot create it, {existing} is not a writable folder; "
                          "choose another place") from None


def _place(tmp: Path, folder: Path, unique: bool) -> Path:
    """Rename ``tmp`` to ``folder`` (an empty folder there is replaced), or, if another run took
    ``folder`` meanwhile and ``unique`` is set, to the next free name."""
    while True:
        try:
            os.replace(tmp, folder)
            return folder
        except OSError as exc:
            if not unique or exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            folder = _free(folder)


def _honour_umask(tree: Path) -> None:
    """Give ``tree`` (made by mkdtemp/mkstemp, private by design) the modes a new file would get."""
    mask = umask()
    tree.chmod(0o777 & ~mask)
    for path in tree.rglob("*"):
        if path.is_dir():
            path.chmod(0o777 & ~mask)


@dataclasses.dataclass
class Target:
    """Where a result folder is being written (``tmp``) and where it ends up (``folder``)."""

    tmp: Path
    folder: Path


@contextlib.contextmanager
def atomic_folder(folder: Path, unique: bool = False) -> Iterator[Target]:
    """Yield a :class:`Target` whose ``tmp`` (a hidden sibling of ``folder``) is renamed into place on
    success; its ``folder`` is then the final path (another name only when ``unique`` allowed one).

    On any error or interruption the temporary folder is removed and the error propagates
    (``OSError`` as :class:`OutputError`); ``folder`` is never left half-written.
    """
    if unique:
        folder = _free(folder)
    check_target(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(folder.parent)
        tmp = partial_folder(folder)
    except OSError as exc:
        raise OutputError(f"cannot create the result folder {folder}: {exc.strerror or exc}") from None
    target = Target(tmp, folder)
    try:
        yield target
        _honour_umask(tmp)
        # An empty destination folder is replaced; a non-empty one makes rename fail, never merge.
        target.folder = _place(tmp, folder, unique)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write the result folder {folder}: {exc}") from None
        raise


def json_safe(value, non_finite: Callable[[float], object] = lambda x: None):
    """Plain JSON values. JSON has no spelling for NaN and infinities: ``non_finite`` says what to
    write instead (null by default: a metric that could not be measured)."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, non_finite) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v, non_finite) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return non_finite(value)
    return value


def summary_record(result: Result) -> dict:
    """``summary.json``: the summary's vLLM keys, the mode, and the stability check."""
    st = result.stability
    return json_safe({"mode": result.scenario.batching.mode, **result.summary,
                      "stability": {**dataclasses.asdict(st), "stable": st.stable, "verdict": st.verdict,
                                    "short_verdict": st.short_verdict}})


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def parquet_available() -> bool:
    """Parquet twins are written only when pyarrow happens to be installed (it is not a dependency)."""
    return importlib.util.find_spec("pyarrow") is not None


def write_frames(folder: Path, frames: Mapping[str, pd.DataFrame]) -> None:
    """``<name>.csv`` for each frame, and ``<name>.parquet`` when pyarrow is importable.

    Text cells of the CSV are made spreadsheet-safe (a tenant named ``=HYPERLINK(...)`` must not
    become a live formula); the Parquet twin keeps the names exactly, as data.
    """
    parquet = parquet_available()
    for name, frame in frames.items():
        spreadsheet_safe_frame(frame).to_csv(folder / f"{name}.csv", index=False)
        if parquet:
            frame.to_parquet(folder / f"{name}.parquet", index=False)


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in chunks (traces can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def data_hashes(scenario: Scenario) -> dict[str, dict[str, str]]:
    """``{dotted key: {"path": absolute path, "sha256": ...}}`` for every data file the scenario reads."""
    hashes = {}
    for key, path in scenario.data_files().items():
        where = scenario.resolve(path).resolve()
        hashes[key] = {"path": str(where), "sha256": file_sha256(where)}
    return hashes


def run_record(scenario: Scenario) -> dict:
    """``run.json``: what made the folder, to reproduce it or tell two folders apart."""
    return {"simbatch": __version__, "command_line": [Path(sys.argv[0]).name, *sys.argv[1:]],
            "seed": scenario.seed, "data_files": data_hashes(scenario)}


def _write_run_files(folder: Path, result: Result) -> None:
    # A config's infinity is a setting (rate: inf), written "inf" so that the file loads back as it was.
    _write_json(folder / "resolved_config.json", json_safe(result.scenario.model_dump(mode="json"), str))
    _write_json(folder / "summary.json", summary_record(result))
    write_frames(folder, {"requests": result.requests, "iterations": result.iterations,
                          "stall_gaps": pd.DataFrame({"stall_gap_s": np.sort(np.asarray(result.stall_gaps_s))}),
                          **({"fleet": result.fleet} if result.fleet is not None else {})})


def _write_provenance(folder: Path, scenario: Scenario) -> None:
    (folder / "scenario.yaml").write_text(scenario_yaml(scenario), encoding="utf-8")
    _write_json(folder / "run.json", run_record(scenario))


def write_run(folder: Path, result: Result, unique: bool = False, with_plots: bool = True,
              trace: TraceObserver | None = None) -> Path:
    """Write one run's result folder at ``folder`` (atomically); returns where it went.

    ``unique``: ``folder`` is a default name, and another free name will do if it is taken meanwhile.
    ``with_plots``: False writes the frames and summary only.
    ``trace``: the observer that watched the run, to write ``trace.json`` from (:mod:`simbatch.observe.perfetto`).
    """
    with atomic_folder(folder, unique) as target:
        _write_provenance(target.tmp, result.scenario)
        _write_run_files(target.tmp, result)
        if trace is not None:
            write_trace(target.tmp / "trace.json", result, trace)
        if with_plots:
            from simbatch.app import plots
            from simbatch.app.webreport import write_report

            (target.tmp / "plots").mkdir()
            plots.save_run_plots(target.tmp / "plots", result)
            sc = result.scenario
            write_report(target.tmp / "report.html", {sc.batching.mode: result}, f"simbatch run: {sc.name}")
    return target.folder


def write_compare(folder: Path, results: Mapping[str, Result], unique: bool = False,
                  with_plots: bool = True) -> Path:
    """Write a comparison's folder at ``folder`` (atomically): a subfolder per mode, overlay plots."""
    with atomic_folder(folder, unique) as target:
        tmp = target.tmp
        _write_provenance(tmp, next(iter(results.values())).scenario)
        _write_json(tmp / "summary.json", {mode: summary_record(r) for mode, r in results.items()})
        for mode, result in results.items():
            (tmp / mode).mkdir()
            _write_run_files(tmp / mode, result)
        if with_plots:
            from simbatch.app import plots
            from simbatch.app.webreport import write_report

            (tmp / "plots").mkdir()
            plots.save_compare_plots(tmp / "plots", results)
            write_report(tmp / "report.html", results,
                         f"simbatch compare: {next(iter(results.values())).scenario.name}, {', '.join(results)}")
    return target.folder

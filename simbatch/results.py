"""The result folder: everything a run produced, appearing whole or not at all.

A run is written into a hidden temporary folder next to its destination and renamed into place
only once every file is written. A crash, a full disk or Ctrl-C halfway leaves no folder that
looks like a result, so a folder's existence means it is complete.

Layout of one run::

    scenario.yaml          the scenario file exactly as given
    resolved_config.json   the scenario after defaults and --set overrides
    summary.json           vLLM-named metrics plus the stability check
    requests.csv           one row per request      (+ requests.parquet when pyarrow is installed)
    iterations.csv         one row per run of steps (+ iterations.parquet)
    plots/*.png

A comparison holds one such folder per mode (without plots) and overlay plots at the top.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from simbatch import plots
from simbatch.simulation import Result

RESULTS_ROOT = Path("results")


class OutputError(Exception):
    """The result folder cannot be written where asked; the message says why and what to do."""


def default_folder(scenario_name: str, prefix: str = "", root: Path = RESULTS_ROOT,
                   now: datetime | None = None) -> Path:
    """``root/<scenario>/<prefix><YYYYmmdd-HHMMSS>``, with ``-2``, ``-3``... if that is taken."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = root / scenario_name / f"{prefix}{stamp}"
    folder, n = base, 1
    while folder.exists():
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    return folder


def check_target(folder: Path) -> None:
    """Fail early, before any simulation runs, if ``folder`` cannot become a result folder."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        kind = "a file" if not folder.is_dir() else "a folder that is not empty"
        raise OutputError(f"--out {folder}: {kind} is already there; choose a new folder or remove it")
    parent = folder.absolute().parent
    existing = next(p for p in (parent, *parent.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"--out {folder}: cannot create it, {existing} is not a writable folder; "
                          "choose another place")


@contextlib.contextmanager
def atomic_folder(folder: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``folder`` to write into, renamed to ``folder`` on success.

    On any error the temporary folder is removed and the error propagates (``OSError`` as
    :class:`OutputError`); ``folder`` is never left half-written.
    """
    check_target(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.partial-", dir=folder.parent))
    except OSError as exc:
        raise OutputError(f"cannot create the result folder {folder}: {exc.strerror or exc}") from None
    try:
        yield tmp
        # An empty destination folder is replaced; a non-empty one makes rename fail, never merge.
        os.replace(tmp, folder)
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
                      "stability": {**dataclasses.asdict(st), "stable": st.stable, "verdict": st.verdict}})


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def parquet_available() -> bool:
    """Parquet twins are written only when pyarrow happens to be installed (it is not a dependency)."""
    return importlib.util.find_spec("pyarrow") is not None


def write_frames(folder: Path, frames: Mapping[str, pd.DataFrame]) -> None:
    """``<name>.csv`` for each frame, and ``<name>.parquet`` when pyarrow is importable."""
    parquet = parquet_available()
    for name, frame in frames.items():
        frame.to_csv(folder / f"{name}.csv", index=False)
        if parquet:
            frame.to_parquet(folder / f"{name}.parquet", index=False)


def _write_run_files(folder: Path, result: Result) -> None:
    # A config's infinity is a setting (rate: inf), written "inf" so that the file loads back as it was.
    _write_json(folder / "resolved_config.json", json_safe(result.scenario.model_dump(mode="json"), str))
    _write_json(folder / "summary.json", summary_record(result))
    write_frames(folder, {"requests": result.requests, "iterations": result.iterations})


def write_run(folder: Path, scenario_file: Path, result: Result, with_plots: bool = True) -> Path:
    """Write one run's result folder at ``folder`` (atomically), with plots unless ``with_plots`` is False."""
    with atomic_folder(folder) as tmp:
        shutil.copyfile(scenario_file, tmp / "scenario.yaml")
        _write_run_files(tmp, result)
        if with_plots:
            (tmp / "plots").mkdir()
            plots.save_run_plots(tmp / "plots", result)
    return folder


def write_compare(folder: Path, scenario_file: Path, results: Mapping[str, Result], with_plots: bool = True) -> Path:
    """Write a comparison's folder at ``folder`` (atomically): a subfolder per mode, overlay plots."""
    with atomic_folder(folder) as tmp:
        shutil.copyfile(scenario_file, tmp / "scenario.yaml")
        _write_json(tmp / "summary.json", {mode: summary_record(r) for mode, r in results.items()})
        for mode, result in results.items():
            (tmp / mode).mkdir()
            _write_run_files(tmp / mode, result)
        if with_plots:
            (tmp / "plots").mkdir()
            plots.save_compare_plots(tmp / "plots", results)
    return folder

"""A sweep from its arguments to ``summary.csv`` and plots: check everything, then run.

Everything a user can get wrong is checked before the output folder is touched (parameter specs,
the scenario, every point, the folder's manifest), so bad input never leaves a half-made folder.
Points that fail validation while others pass are not bad input but results: rows with an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from simbatch import __version__
from simbatch.app.results import RESULTS_ROOT, default_folder, file_sha256
from simbatch.app.sweep.aggregate import summary_frame
from simbatch.app.sweep.grid import GridError, Param, expand, parse_params
from simbatch.app.sweep.plots import plot_sweep
from simbatch.app.sweep.runner import Executor, Point, Run, execute, load_points, runs_for
from simbatch.app.sweep.store import Store, StoreError, write_atomic
from simbatch.inputs import guard

SEED_IS_PER_REPLICATION = ("each replication sets the seed (base seed + replication); "
                           "change the base with --set seed=N")


class SweepInputError(ValueError):
    """Bad arguments; the message is one line naming the argument, its value and the fix."""


def valid_points(scenario_path: Path, param_texts: list[str], sets: list[str], reserved: dict[str, str],
                 replications: int, force: bool = False) -> tuple[list[Param], list[Point]]:
    """Parse the grid and validate every point; bad input when no point at all is valid.

    The size guard runs first on the grid (points x replications, before a point is loaded), then
    on each valid point's run (:mod:`simbatch.inputs.guard`); ``force`` lifts both limits.
    """
    try:
        params = parse_params(param_texts, reserved)
    except GridError as exc:
        raise SweepInputError(str(exc)) from None
    for param in params:
        for text in sets:
            key = text.partition("=")[0].strip()
            if key == param.key or param.key.startswith(key + ".") or key.startswith(param.key + "."):
                raise SweepInputError(f"--param {param.key} and --set {text}: both set {key}, and the --param "
                                      "would silently win at every point; give it once")
    guard.check_sweep(math.prod(len(p.values) for p in params), replications, force)
    if not scenario_path.is_file():
        raise SweepInputError(f"SCENARIO {scenario_path}: file not found; pass the path of a scenario file")
    points = load_points(scenario_path, sets, expand(params))
    for point in points:
        if point.scenario is not None:
            guard.check_run(point.scenario, force)
    if all(p.error is not None for p in points):
        first = points[0]
        where = ", ".join(f"{k}={v}" for k, v in first.values.items())
        raise SweepInputError(f"{scenario_path}: {first.error}" if not where else
                              f"{scenario_path}: every point is invalid, e.g. {where}: {first.error}")
    return params, points


def default_out(points: list[Point], command: str) -> Path:
    """``results/<scenario name>/<command>-<YYYYmmdd-HHMMSS>``, as ``run`` and ``compare`` name theirs: a
    new sweep never writes over another's ``summary.csv``; ``--out`` that folder resumes it."""
    name = next(p.scenario.name for p in points if p.scenario is not None)
    return default_folder(name, prefix=f"{command}-", root=RESULTS_ROOT)


def data_sha256(points: list[Point]) -> dict[str, str]:
    """``{absolute path: sha256}`` of every data file any valid point reads (a --param may change them)."""
    files = {str(p.scenario.resolve(path).resolve()) for p in points if p.scenario is not None
             for path in p.scenario.data_files().values()}
    return {path: file_sha256(Path(path)) for path in sorted(files)}


def open_store(out: Path, command: str, scenario_path: Path, sets: list[str], points: list[Point],
               **extra: Any) -> Store:
    """The output folder's store, checked against what is already there (nothing is created yet).

    ``extra`` adds what else must match for the folder's runs to be reused (a search's SLOs).
    """
    store = Store(out, {"command": command, "scenario": str(scenario_path.resolve()),
                        "scenario_sha256": file_sha256(scenario_path), "set": list(sets),
                        "data_sha256": data_sha256(points), "simbatch": __version__, **extra})
    try:
        store.check()
    except StoreError as exc:
        raise SweepInputError(str(exc)) from None
    return store


@dataclass
class Sweep:
    """A checked sweep, ready to run: its grid, its points, and the store its runs go to."""

    params: list[Param]
    points: list[Point]
    replications: int
    store: Store

    @classmethod
    def plan(cls, scenario_path: Path, param_texts: list[str], sets: list[str], replications: int,
             out: Path | None = None, force: bool = False) -> Sweep:
        """Check every argument; raises :class:`SweepInputError` and creates nothing when one is bad."""
        scenario_path = Path(scenario_path)
        params, points = valid_points(scenario_path, param_texts, sets, {"seed": SEED_IS_PER_REPLICATION},
                                      replications, force)
        store = open_store(Path(out) if out else default_out(points, "sweep"), "sweep", scenario_path, sets, points)
        return cls(params, points, replications, store)

    @property
    def out(self) -> Path:
        return self.store.out

    def run(self, executor: Executor, on_point_done: Callable[[], None] | None = None,
            with_plots: bool = True) -> tuple[pd.DataFrame, list[Path]]:
        """Execute the runs not already stored, then write ``summary.csv`` and (unless not ``with_plots``) the plots."""
        self.store.create()
        owner: dict[int, int] = {}  # id(run) -> its point
        remaining: dict[int, int] = {}
        runs: list[Run] = []
        for i, point in enumerate(self.points):
            mine = runs_for(point, self.replications)
            owner |= {id(run): i for run in mine}
            remaining[i] = len(mine)
            runs += mine
            if not mine and on_point_done:
                on_point_done()

        def done(run: Run) -> None:
            i = owner[id(run)]
            remaining[i] -= 1
            if remaining[i] == 0 and on_point_done:
                on_point_done()

        records = execute(runs, self.store, executor, done)
        frame = summary_frame(self.points, self.replications, records)
        write_atomic(self.out / "summary.csv", frame.to_csv(index=False))
        if not with_plots:
            return frame, []
        return frame, plot_sweep(frame, self.points, [p.key for p in self.params], self.out)

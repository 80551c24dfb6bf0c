"""A sweep from its arguments to ``summary.csv`` and plots: check everything, then run.

Everything a user can get wrong is checked before the output folder is touched (parameter specs,
the scenario, every point, the folder's manifest), so bad input never leaves a half-made folder.
Points that fail validation while others pass are not bad input but results: rows with an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from simbatch import __version__
from simbatch.results import RESULTS_ROOT
from simbatch.sweep.aggregate import summary_frame
from simbatch.sweep.grid import GridError, Param, expand, parse_params
from simbatch.sweep.plots import plot_sweep
from simbatch.sweep.runner import Executor, Point, Run, execute, load_points, runs_for
from simbatch.sweep.store import Store, StoreError, file_sha256, write_atomic

SEED_IS_PER_REPLICATION = ("each replication sets the seed (base seed + replication); "
                           "change the base with --set seed=N")


class SweepInputError(ValueError):
    """Bad arguments; the message is one line naming the argument, its value and the fix."""


def valid_points(scenario_path: Path, param_texts: list[str], sets: list[str],
                 reserved: dict[str, str]) -> tuple[list[Param], list[Point]]:
    """Parse the grid and validate every point; bad input when no point at all is valid."""
    try:
        params = parse_params(param_texts, reserved)
    except GridError as exc:
        raise SweepInputError(str(exc)) from None
    if not scenario_path.is_file():
        raise SweepInputError(f"SCENARIO {scenario_path}: file not found; pass the path of a scenario file")
    points = load_points(scenario_path, sets, expand(params))
    if all(p.error is not None for p in points):
        first = points[0]
        where = ", ".join(f"{k}={v}" for k, v in first.values.items())
        raise SweepInputError(f"{scenario_path}: {first.error}" if not where else
                              f"{scenario_path}: every point is invalid, e.g. {where}: {first.error}")
    return params, points


def default_out(points: list[Point], command: str) -> Path:
    """``results/<scenario name>/<command>``: no timestamp, so running the same command again resumes."""
    name = next(p.scenario.name for p in points if p.scenario is not None)
    return RESULTS_ROOT / name / command


def open_store(out: Path, command: str, scenario_path: Path, sets: list[str], params: list[Param],
               replications: int, **extra: Any) -> Store:
    """The output folder's store, checked against what is already there (nothing is created yet)."""
    store = Store(out, {"command": command, "scenario": str(scenario_path.resolve()),
                        "scenario_sha256": file_sha256(scenario_path), "set": list(sets),
                        "params": {p.key: list(p.values) for p in params}, "replications": replications,
                        "simbatch": __version__, **extra})
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
             out: Path | None = None) -> Sweep:
        """Check every argument; raises :class:`SweepInputError` and creates nothing when one is bad."""
        scenario_path = Path(scenario_path)
        params, points = valid_points(scenario_path, param_texts, sets, {"seed": SEED_IS_PER_REPLICATION})
        store = open_store(Path(out) if out else default_out(points, "sweep"), "sweep", scenario_path, sets,
                           params, replications)
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

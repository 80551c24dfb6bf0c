"""Points x replications -> runs, and where they execute: here, a local process pool, or Dask.

A *point* is one combination of swept parameters: the scenario file, the ``--set`` overrides and
the point's own overrides, loaded and validated once, up front, by :func:`load_points`. A point
that does not validate (a bad combination, such as a token budget below the slot count) keeps its
error and is reported, not run; the others go on.

A *run* is one replication of a point. Replication ``r`` runs with ``seed = base_seed + r``, the
base being the scenario's seed, so every point's replication ``r`` sees the same random streams:
points that differ only in mode, policy or device see request for request the same traffic (common
random numbers), and their differences are not the dice's.

A run is a pure function of its scenario, so results do not depend on where it executes or in what
order runs finish: results are keyed by run, never by completion order. The executor sends the
validated :class:`~simbatch.config.Scenario` (not the YAML path) to the workers, so Dask workers need
simbatch installed, but not the scenario file; data files a scenario reads (traces, empirical
lengths) must exist at the same path on every worker.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simbatch.app.sweep.grid import overrides_for
from simbatch.app.sweep.store import Store, run_key
from simbatch.config import Scenario
from simbatch.inputs.loading import ScenarioError, load_scenario
from simbatch.simulation import simulate

# The analytic stability check kept with each run's summary (renamed where a summary key would clash).
STABILITY_FIELDS = {"capacity_tokens_per_s": "capacity_tokens_per_s",
                    "capacity_requests_per_s": "capacity_requests_per_s",
                    "offered_tokens_per_s": "offered_tokens_per_s",
                    "offered_load": "offered_load"}


class ExecutorError(RuntimeError):
    """The requested executor cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class Point:
    """One combination of swept parameters, validated (``scenario``) or not (``error``)."""

    values: dict[str, Any]
    overrides: list[str]
    scenario: Scenario | None
    error: str | None = None


@dataclass(frozen=True)
class Run:
    """One replication of a point: the scenario with its seed, and the key its record is stored under."""

    overrides: list[str]
    seed: int
    scenario: Scenario

    @property
    def key(self) -> str:
        return run_key(self.overrides, self.seed)


def problem_text(exc: ScenarioError) -> str:
    """A scenario error on one line. A field's problem is named by its dotted path alone: its value
    may come from an override, so the file position of the key would mislead."""
    return "; ".join(f"{p.path}: {p.message}" if p.path else str(p) for p in exc.problems)


def load_point(path: Path, sets: list[str], values: dict[str, Any]) -> Point:
    overrides = list(sets) + overrides_for(values)
    try:
        return Point(values, overrides, load_scenario(path, overrides))
    except ScenarioError as exc:
        return Point(values, overrides, None, problem_text(exc))


def load_points(path: Path, sets: list[str], grid: list[dict[str, Any]]) -> list[Point]:
    return [load_point(path, sets, values) for values in grid]


def runs_for(point: Point, replications: int) -> list[Run]:
    """The point's replications; none for a point that did not validate."""
    if point.scenario is None:
        return []
    base = point.scenario.seed
    return [Run(point.overrides, base + r, point.scenario.model_copy(update={"seed": base + r}))
            for r in range(replications)]


def _plain(value: Any) -> int | float:
    return value if isinstance(value, int) else float(value)


def simulate_run(scenario: Scenario) -> dict[str, dict[str, int | float]]:
    """The task a worker executes: one simulation, reduced to the numbers of its summary and stability."""
    result = simulate(scenario)
    stability = dataclasses.asdict(result.stability)
    numbers = {k: v for k, v in result.summary.items() if isinstance(v, int | float | np.number)}
    return {"summary": {k: _plain(v) for k, v in numbers.items()},
            "stability": {new: _plain(stability[old]) for old, new in STABILITY_FIELDS.items()}}


def _error_text(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__


class Executor:
    """Runs one function over many items: in this process (``workers=1``), a local process pool,
    or, given ``scheduler_address``, an existing Dask distributed cluster.

    Use it as a context manager; the pool or the Dask connection lives until the block ends, so a
    capacity search's successive rounds reuse it.
    """

    def __init__(self, workers: int | None = None, scheduler_address: str | None = None):
        self.workers = workers or os.cpu_count() or 1
        self.address = scheduler_address
        self._pool: ProcessPoolExecutor | None = None
        self._client = None

    def connect(self) -> None:
        """Reach the Dask scheduler (ExecutorError if it cannot be used) or start the local workers.

        Local workers start here, before the caller starts threads of its own (a progress bar): a
        process forked while another thread holds a lock inherits the lock held, forever.
        """
        if self.address is not None and self._client is None:
            self._client = _dask_client(self.address)
        elif self.address is None and self.workers > 1 and self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, initializer=_exit_with_parent,
                                             initargs=(os.getpid(),))
            self._pool.submit(int).result()  # the first task starts every worker process

    def __enter__(self) -> Executor:
        self.connect()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._pool is not None:
            if exc_type is not None:
                # On Ctrl-C or SIGTERM stop now, not after the runs in progress: finished runs are on
                # disk already. (_processes is private; Python 3.14 adds terminate_workers for this.)
                for process in list((self._pool._processes or {}).values()):
                    process.terminate()
            self._pool.shutdown(wait=True, cancel_futures=exc_type is not None)
            self._pool = None
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def description(self) -> str:
        if self.address is not None:
            return f"Dask cluster at {self.address}"
        return "this process" if self.workers == 1 else f"{self.workers} local processes"

    def map_unordered(self, fn: Callable[[Any], Any],
                      items: list[Any]) -> Iterator[tuple[int, Any, str | None]]:
        """Yield ``(index, result, None)`` or ``(index, None, error text)`` per item, as each finishes."""
        if not items:
            return
        if self._client is not None:
            yield from self._dask_map(fn, items)
        elif self.workers == 1:
            for i, item in enumerate(items):
                try:
                    yield i, fn(item), None
                except Exception as exc:
                    yield i, None, _error_text(exc)
        else:
            self.connect()
            index = {self._pool.submit(fn, item): i for i, item in enumerate(items)}
            pending = set(index)
            while pending:
                # Wake now and then rather than block: a signal the kernel hands to one of the pool's
                # threads would leave a blocked main thread asleep, and Ctrl-C must act within a second.
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                for future in done:
                    yield _outcome(index[future], future)

    def _dask_map(self, fn, items):
        from distributed import as_completed as dask_completed

        futures = self._client.map(fn, items, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        try:
            for future in dask_completed(futures, loop=self._client.loop):
                yield _outcome(index[future.key], future)
        finally:
            self._client.cancel(futures)


def _exit_with_parent(parent_pid: int) -> None:
    """Run in each pool worker: exit when the sweep's process is gone; leave Ctrl-C to the parent.

    A worker outlives a parent that is killed (SIGTERM, SIGKILL, a closed terminal): it holds its
    own end of the task pipe, so it would wait for tasks forever. Finished runs are on disk already.
    Ctrl-C reaches every process of the terminal's group: the parent handles it (and ends the
    workers), so a worker ignores it instead of dying with a traceback mid-task. SIGTERM gets its
    default back (the parent's handler, inherited through fork, would turn it into an exception the
    pool reports as a result): it is how the parent ends a worker.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def _outcome(i: int, future) -> tuple[int, Any, str | None]:
    try:
        return i, future.result(), None
    except Exception as exc:
        return i, None, _error_text(exc)


_ADDRESS = re.compile(r"(?:[a-z]+://)?(?:\[[0-9a-fA-F:]+\]|[^\s:/\[\]]+):\d{1,5}")


def _dask_client(address: str):
    # Checked here: a Client built from a malformed address fails inside, and its finaliser then
    # prints an "Exception ignored" traceback twenty seconds later, after ours.
    if not _ADDRESS.fullmatch(address):
        raise ExecutorError(f"--scheduler-address {address}: not an address; give tcp://HOST:PORT, "
                            "as `dask scheduler` prints it (e.g. tcp://10.0.0.5:8786)")
    try:
        from distributed import Client
    except ImportError:
        raise ExecutorError("--scheduler-address needs dask.distributed, which is not installed; "
                            "install it with: pip install 'simbatch[dask]'") from None
    try:
        return Client(address, timeout="10s", set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ExecutorError(f"--scheduler-address {address}: cannot reach a Dask scheduler ({exc}); "
                            "start one with `dask scheduler` and pass the address it prints") from None


def execute(runs: list[Run], store: Store, executor: Executor,
            on_done: Callable[[Run], None] | None = None) -> dict[str, dict[str, Any]]:
    """Every run's record by key: from the store when it finished before, else executed and stored.

    A run that raised is recorded as ``{"error": text}`` and not stored, so a restart retries it.
    """
    records: dict[str, dict[str, Any]] = {}
    pending: dict[str, list[Run]] = {}  # runs sharing a key (a value listed twice) execute once
    for run in runs:
        record = store.load(run.key, run.overrides, run.seed)
        if record is None:
            pending.setdefault(run.key, []).append(run)
            continue
        records[run.key] = record
        if on_done:
            on_done(run)
    todo = [same[0] for same in pending.values()]
    for i, result, error in executor.map_unordered(simulate_run, [r.scenario for r in todo]):
        run = todo[i]
        if error is None:
            records[run.key] = {"overrides": run.overrides, "seed": run.seed, **result}
            store.save(run.key, records[run.key])
        else:
            records[run.key] = {"error": error}
        for same in pending[run.key] if on_done else ():
            on_done(same)
    return records

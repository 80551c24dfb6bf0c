"""Plumbing of the validation suite: its two modes, Little's law on every run, and the report.

``SIMBATCH_VALIDATION=quick`` (the default: ``make validate-quick``, which CI runs after ``make test``)
runs every check with few replications and short horizons; ``full`` (``make validate``) with many and
long ones, and then writes ``docs/validation.md`` -- but only when the whole suite ran, so the report
never describes a subset.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import report
from report import Checker, Ledger

from simbatch.config import Scenario
from simbatch.inputs.loading import ScenarioError, scenario_from_dict
from simbatch.simulation import Result, simulate

HERE = Path(__file__).resolve().parent
DOC = HERE.parent.parent / "docs" / "validation.md"
MODE_VARIABLE = "SIMBATCH_VALIDATION"
LEDGER = pytest.StashKey[Ledger]()


@dataclass(frozen=True)
class Mode:
    name: str

    def pick(self, quick, full):
        """The quick or the full value of a parameter."""
        return full if self.name == "full" else quick


def pytest_configure(config: pytest.Config) -> None:
    name = os.environ.get(MODE_VARIABLE, "quick")
    if name not in ("quick", "full"):
        pytest.exit(f"{MODE_VARIABLE}={name!r} is not a validation mode; "
                    f"set {MODE_VARIABLE}=quick (the default) or {MODE_VARIABLE}=full", returncode=2)
    config.stash[LEDGER] = Ledger(mode=name)


def _ours(item: pytest.Item) -> bool:
    return HERE in Path(item.path).parents


def pytest_deselected(items: list[pytest.Item]) -> None:
    if any(_ours(i) for i in items):
        items[0].config.stash[LEDGER].partial = True


def pytest_collection_finish(session: pytest.Session) -> None:
    collected = {Path(i.path) for i in session.items if _ours(i)}
    if collected and collected != set(HERE.glob("test_*.py")):
        session.config.stash[LEDGER].partial = True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    if rep.failed and _ours(item):  # in any phase, whether or not it recorded rows
        item.config.stash[LEDGER].failed_tests.append(item.name)
    return rep


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    result = yield
    checker = getattr(item, "funcargs", {}).get("check")
    if isinstance(checker, Checker) and checker.failures:
        raise AssertionError("theory outside the simulated interval:\n  " + "\n  ".join(checker.failures))
    return result


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The comparisons themselves in the full mode, or with ``-v`` (which cancels the default ``-q``)."""
    ledger = config.stash.get(LEDGER, None)
    if ledger is not None and ledger.rows and (ledger.mode == "full" or config.get_verbosity() >= 0):
        terminalreporter.write_sep("-", f"validation ({ledger.mode} mode)")
        for row in ledger.rows:
            terminalreporter.write_line(report.row_line(row))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    ledger = session.config.stash.get(LEDGER, None)
    if ledger is None or ledger.mode != "full" or not ledger.rows:
        return
    if ledger.partial:
        print(f"\n{DOC} not written: only part of the validation suite ran")
        return
    report.write(ledger, DOC)


@pytest.fixture(scope="session")
def mode(pytestconfig: pytest.Config) -> Mode:
    return Mode(pytestconfig.stash[LEDGER].mode)


@pytest.fixture
def check(request: pytest.FixtureRequest) -> Checker:
    """Records this test's comparisons; the test fails after it returns if any did not hold."""
    return Checker(request.config.stash[LEDGER], request.module, request.node.name, request.function)


def _little_errors(summary: dict) -> dict[str, float]:
    """Relative errors of L against lambda W and of Lq against lambda Wq."""
    return {name: abs(time_average - summary["arrival_rate"] * mean_s) / max(time_average, 1e-300)
            for name, time_average, mean_s in (("L", summary["L"], summary["W_s"]),
                                               ("Lq", summary["Lq"], summary["Wq_s"]))}


def _scenario(spec: dict | Scenario) -> Scenario:
    try:
        return spec if isinstance(spec, Scenario) else scenario_from_dict(spec)
    except ScenarioError as exc:  # a broken check, not a simulator bug: say which field
        raise AssertionError(f"invalid validation scenario: {exc}") from None


def _run_and_measure(spec: dict | Scenario, measure: Callable[[Result], Any]) -> tuple[Scenario, dict, Any]:
    """In a worker: simulate, and send back only the Little's-law errors and what ``measure`` keeps."""
    scenario = _scenario(spec)
    result = simulate(scenario)
    return scenario, _little_errors(result.summary), measure(result)


class Simulator:
    """``simulate`` with Little's law checked on every run (the ``sim`` fixture).

    L and Lq are time averages of the engine's own state; lambda W and lambda Wq come from the
    request rows, requests still in the system counting up to the end. The two must agree on every
    sample path, to rounding, whatever the scenario: a bookkeeping error shows here first.

    ``sim(spec)`` runs one scenario here; ``sim.map(measure, specs)`` runs many in worker processes,
    one per core, and returns ``measure(result)`` for each, in order (``measure`` must be a
    module-level function, so that it can be sent to a worker).
    """

    def __init__(self, ledger: Ledger, pool: ProcessPoolExecutor | None):
        self.ledger, self.pool = ledger, pool

    def _guard(self, scenario: Scenario, errors: dict[str, float]) -> None:
        self.ledger.little_runs += 1
        for name, rel in errors.items():
            self.ledger.little(name, rel)
            assert rel <= report.EXACT_REL, (
                f"Little's law broken: {name} differs from lambda x mean by a relative {rel:.2e} "
                f"in scenario {scenario.name!r}, seed {scenario.seed}")

    def __call__(self, spec: dict | Scenario) -> Result:
        result = simulate(_scenario(spec))
        self._guard(result.scenario, _little_errors(result.summary))
        return result

    def map(self, measure: Callable[[Result], Any], specs: list[dict | Scenario]) -> list[Any]:
        if self.pool is None:
            done = [_run_and_measure(spec, measure) for spec in specs]
        else:
            done = list(self.pool.map(_run_and_measure, specs, [measure] * len(specs)))
        for scenario, errors, _ in done:
            self._guard(scenario, errors)
        return [kept for _, _, kept in done]


@pytest.fixture(scope="session")
def sim(pytestconfig: pytest.Config):
    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if workers < 2:
        yield Simulator(pytestconfig.stash[LEDGER], None)
        return
    # fork: workers start in milliseconds with the suite's modules already imported. Frozen first, what
    # the test process holds is never walked by a worker's garbage collector (nor copied on write by it).
    gc.collect()
    gc.freeze()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        yield Simulator(pytestconfig.stash[LEDGER], pool)

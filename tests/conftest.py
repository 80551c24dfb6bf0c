"""Fixtures shared by test modules."""

from __future__ import annotations

import gc

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Refuse ``--dist loadgroup`` (make test) where it would not group: the tests would pass, each
    group's shared fixture made on every worker instead of once (pytest 9.2 reads node ids from a field
    xdist 3.8 does not write, pytest-dev/pytest-xdist#1386)."""
    if config.getoption("dist", "no") != "loadgroup" or hasattr(config, "workerinput"):
        return
    import xdist

    if pytest.version_tuple[:2] >= (9, 2) and tuple(map(int, xdist.__version__.split(".")[:2])) <= (3, 8):
        raise pytest.UsageError(f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__} loses "
                                "--dist loadgroup's groups: install pytest<9.2 (make install does)")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once the modules are imported, the cyclic garbage collector stops walking them: frozen, the
    hundred thousand objects of simbatch, pandas, matplotlib and the collected tests are never traversed
    again (nor copied on write by the validation suite's forked workers), and a first generation of
    20,000 allocations instead of 700 is collected less often. Simulations allocate in bulk and free by
    reference counting; no test depends on when a cycle is collected. (tests/test_scenarios.py alone:
    307 collections instead of 1,120, 0.8 s in the collector instead of 1.7 s, of 25 s.)"""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


@pytest.fixture(scope="session")
def dask_cluster():
    """A local Dask cluster of two worker processes, started once per test process (sweeps and plans
    are checked to write through it the same files as locally)."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster:
        yield cluster

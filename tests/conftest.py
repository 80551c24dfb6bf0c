"""Fixtures shared by test modules."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def dask_cluster():
    """A local Dask cluster of two worker processes, started once per test process (sweeps and plans
    are checked to write through it the same files as locally)."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster:
        yield cluster

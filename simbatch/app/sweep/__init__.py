"""Sweeps, replications and capacity search, on local cores or a Dask cluster.

- :mod:`.grid`: ``--param`` specs (lists, ranges, log ranges) and their Cartesian product;
- :mod:`.runner`: points x replications -> runs, and the executors (this process, a local process
  pool, Dask distributed);
- :mod:`.store`: one JSON file per finished run, so an interrupted sweep resumes;
- :mod:`.aggregate`: replications -> means and 95 % confidence half-widths, ``summary.csv``;
- :mod:`.plots`: latency, throughput, goodput and batch-size figures;
- :mod:`.plan`: a sweep from its arguments to its files;
- :mod:`.capacity`: the highest rate meeting latency SLOs, by bisection below the analytic capacity.
"""

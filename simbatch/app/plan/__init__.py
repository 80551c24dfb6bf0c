"""``simbatch plan``: the cheapest fleet that meets the SLOs, screened by closed forms, confirmed by simulation.

- :mod:`.space`: the search space (a small YAML schema, or flags) and the configurations it spans;
- :mod:`.prices`: prices per GPU-hour and GPU power, from a user's file or the shipped example;
- :mod:`.limits`: the SLOs as limits on the replications' means;
- :mod:`.screen`: every configuration judged by the closed forms (:mod:`simbatch.analysis.planning`);
- :mod:`.search`: sizing by simulation, pruned by the bounds, then each ranked fleet's headroom;
- :mod:`.launch`: the winner's ``vllm serve`` command lines;
- :mod:`.output`: the tables, the Pareto front, the report.

The command is :mod:`simbatch.app.cli.plan`; docs/planning.md walks through an example.
"""

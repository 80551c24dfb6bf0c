"""The SimPy model: the cluster (arrivals, admission, routing) around one engine loop per replica.

- :mod:`.replica`: the plain loop, plan -> cost -> timeout -> apply -> record; the model itself.
- :mod:`.accelerated`: the same loop taking runs of identical steps in one go, and running ahead of
  SimPy's clock when nothing can interfere; selected by ``sim.fast_forward`` (the default).
- :mod:`.cluster`: :class:`Engine`, which builds the replicas and sends them the requests.
"""

from simbatch.engine.cluster import Engine, rejection_reasons

__all__ = ["Engine", "rejection_reasons"]

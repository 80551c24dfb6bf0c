"""The SimPy model: the cluster (arrivals, admission, routing) around one engine loop per replica.

- :mod:`.replica`: the one engine loop, plan -> cost -> timeout -> apply -> record, holding an
  accelerator (:mod:`.accel`: the null one is the reference engine; ``sim.fast_forward``, the default,
  takes runs of identical steps in one go, and lets a lone replica run ahead of SimPy's clock).
- :mod:`.cluster`: :class:`Engine`, which builds the replicas and sends them the requests.
"""

from simbatch.engine.cluster import Engine, rejection_reasons

__all__ = ["Engine", "rejection_reasons"]

"""The traffic a simulation serves: every request's arrival time, lengths, tenant and priority.

Synthetic workloads are drawn from seeded streams independent of the batching mode, so runs that
compare modes see identical requests; traces replay a CSV file instead. :func:`generate` is the
entry point; :class:`WorkloadArrays` is what it returns.
"""

from simbatch.workload.generate import WorkloadArrays, generate

__all__ = ["WorkloadArrays", "generate"]

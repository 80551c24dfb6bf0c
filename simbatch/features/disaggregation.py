"""Disaggregated prefill and decode (``cluster.disaggregated``): the scheduler's side of the hand-off.

A prompt's prefill is one long compute-bound pass; its decode, many short memory-bound steps. Run on
the same GPUs, each new prefill stalls every running decode for its duration. Disaggregation
(DistServe, Splitwise; vLLM's P/D disaggregation through a KV connector) runs them on separate pools:
a prefill replica computes the prompt and samples the first token, its KV moves to a decode replica
over a link, and the decode replica generates the rest.

vLLM V1's scheduler meets the KV connector at two points, which are this feature's hooks:

- on a prefill replica, a request that sampled its first token with more to come leaves
  (``hands_off``): it is finished there, and its blocks are kept until its KV has been sent (the
  connector's ``request_finished`` says to delay freeing them);
- on a decode replica, the request arrives in WAITING with its KV still remote (``receives``): when
  it reaches the head and a slot and the blocks for its KV are free, they are reserved and its
  transfer starts (``receiving``; vLLM: ``WAITING_FOR_REMOTE_KVS``, the connector's asynchronous
  load), without budget, since it computes nothing yet; when the KV is in, it joins the running set
  at the next plan, as a decode. Its slot counts from the reservation on.

The cluster side, which decode replica a request goes to and how long its transfer lasts, is the
dispatcher's (:mod:`simbatch.engine.disaggregated`): it tells each replica's feature its pool, takes
the transfers it starts (``transfers``), and tells observers of each (``Observer.transfer``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simbatch.features import Feature, register
from simbatch.features import lora as _registered_before  # noqa: F401  (registration order is fixed)

if TYPE_CHECKING:
    from simbatch.config import Scenario
    from simbatch.model.request import Request


@register
class Disaggregation(Feature):
    """``cluster.disaggregated``: prefill and decode pools, a request's KV handed from one to the other."""

    name = "disaggregation"
    description = "Prefill and decode on separate pools: a request's KV moves to a decode replica after its first token."
    switch = "cluster.disaggregated"
    # A hand-off or a delivery reaches a replica as an arrival does, and cuts a run of steps as one does.
    repeatable = True

    def __init__(self, scenario: Scenario):
        super().__init__(scenario)
        self.pool: str | None = None  # "prefill" or "decode", told by the dispatcher
        self.transfers: list[Request] = []  # transfers started since the dispatcher last took them

    @staticmethod
    def enabled(scenario: Scenario) -> bool:
        return scenario.cluster.disaggregated is not None

    def receives(self, req: Request) -> bool:
        """The decode side of a handed-off request: its prompt's KV is on the prefill replica."""
        return req.remote_kv

    def receiving(self, req: Request) -> None:
        """Its blocks are reserved: its transfer starts now (the dispatcher times it)."""
        self.transfers.append(req)

    def hands_off(self, req: Request) -> bool:
        """On a prefill replica, every request leaves at its first token (a one-token output finishes here)."""
        return self.pool == "prefill"

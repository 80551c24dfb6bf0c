"""Disaggregated prefill and decode: the dispatcher between the two pools.

A request arrives at a prefill replica (``cluster.router``), which prefills it (chunked as its
batching says) and samples its first token. At that instant the dispatcher gives it to a decode
replica (``disaggregated.decode_router``), where it waits in the waiting queue until that replica
has a free slot and the blocks for its prompt's KV: reserving them starts the transfer, which lasts
``prompt tokens x KV bytes per token / bandwidth + latency``. When the transfer is done, the prefill
replica frees its blocks (as vLLM's P/D connectors keep them until the KV has been read) and the
request decodes on the decode replica from the next step on, its prompt's KV in place
(``num_computed_tokens = prompt``, one token generated; the first decode step computes the first
token's KV and samples the second). Nothing is dropped: a request that finds no room waits.

Two request objects stand for one request, one per side, so that each KV cache keeps its own
bookkeeping; the recorder sees the decode side's, which carries the prefill side's history
(first scheduled, first token, waiting, preemptions, cached tokens).

Timing. The first tokens a prefill step produces are known when it is planned, so their hand-over
is an urgent event at the step's end, and a transfer's delivery one at its end: both come, like
arrivals, before the engines at their instant (:mod:`simbatch.model.clock`), and everything the
dispatcher does at one instant it does in request order, so the reference and the accelerated
engines see the very same hand-overs. A transfer lasts at least 1 ns.
"""

from __future__ import annotations

from collections.abc import Sequence

import simpy

from simbatch.config import Scenario
from simbatch.engine.router import make_router
from simbatch.features.disaggregation import Disaggregation
from simbatch.model import streams
from simbatch.model.clock import NS_PER_S, Urgent, to_ns
from simbatch.model.request import Request
from simbatch.model.step import StepPlan
from simbatch.observe.observers import Observer
from simbatch.observe.recorder import Recorder
from simbatch.workload import WorkloadArrays


def _by_id(req: Request) -> int:
    return req.request_id


class Dispatcher:
    """Hands prefilled requests to the decode pool and times their KV transfers."""

    def __init__(self, env: simpy.Environment, scenario: Scenario, replicas: Sequence, recorder: Recorder,
                 workload: WorkloadArrays, check_invariants: bool = False):
        pools = scenario.cluster.disaggregated
        self.env, self.replicas, self.recorder = env, replicas, recorder
        self.prefill, self.decode = replicas[:pools.prefill.count], replicas[pools.prefill.count:]
        # Each replica's side of the hand-off (simbatch.features.disaggregation), told its pool.
        self.features = [next(f for f in r.scheduler.features if isinstance(f, Disaggregation)) for r in replicas]
        for replica in replicas:
            replica.pool = self.features[replica.index].pool = \
                "prefill" if replica.index < pools.prefill.count else "decode"
            replica.dispatcher = self
        # Who listens to each replica's transfers (Observer.transfer; the recorder first).
        self._listeners = [tuple(o for o in r.observers if type(o).transfer is not Observer.transfer) for r in replicas]
        self.router = make_router(scenario, workload.session, pools.decode_router, streams.DECODE_ROUTING,
                                  workload=workload)
        self.link = pools.kv_transfer
        self.kv_bytes_per_token = pools.kv_bytes_per_token  # resolved: from the prefill pool's preset if not given
        # What happens at each future instant: (deliveries, hand-overs), fired by one urgent event.
        self._at: dict[int, tuple[list[Request], list[Request]]] = {}
        self._sent: dict[int, Request] = {}  # request id -> its prefill side, until its KV is delivered
        self.check = check_invariants

    def transfer_ns(self, prompt_tokens: int) -> int:
        """One request's KV transfer on the clock's grid (at least 1 ns)."""
        return max(1, to_ns(self.link.seconds_for(prompt_tokens * self.kv_bytes_per_token)))

    # ---------------------------------------------------------------- told by the replicas
    def planned(self, replica, plan, now_ns: int) -> None:
        """``replica`` planned its next step (or idles) at ``now_ns``: time the KV transfers its plan
        started (a decode replica reserved their blocks), telling its observers of each, and, for a
        prefill step, note the first tokens it will sample at its end, which hand those requests over."""
        feature = self.features[replica.index]
        if feature.transfers:
            now_s, index = now_ns / NS_PER_S, replica.index
            for req in feature.transfers:
                duration = self.transfer_ns(req.prompt_tokens)
                self._instant(now_ns + duration)[0].append(req)
                for o in self._listeners[index]:
                    o.transfer(now_s, index, req, duration / NS_PER_S)
            feature.transfers.clear()
        if feature.pool == "prefill" and plan.__class__ is StepPlan:
            firsts = [req for req, n in plan.slices if req.prefill_pending and req.output_tokens > 1
                      and req.num_computed_tokens + n >= req.prompt_tokens + req.num_generated]
            if firsts:
                self._instant(now_ns + replica.step_duration_ns(plan))[1].extend(firsts)

    # ---------------------------------------------------------------- the events
    def _instant(self, t_ns: int) -> tuple[list[Request], list[Request]]:
        entry = self._at.get(t_ns)
        if entry is None:
            entry = self._at[t_ns] = ([], [])
            Urgent(self.env, t_ns - self.env.now).callbacks.append(lambda _event: self._fire(t_ns))
        return entry

    def _fire(self, t_ns: int) -> None:
        deliveries, handovers = self._at.pop(t_ns)
        replicas, rec, now_s = self.replicas, self.recorder, t_ns / NS_PER_S
        for req in sorted(deliveries, key=_by_id):
            sent = self._sent.pop(req.request_id)
            source = replicas[sent.replica]
            source.scheduler.release_sent(sent)
            source._poke()
            target = replicas[rec.decode_replica[req.request_id]]
            target.scheduler.deliver(req)
            target._poke()
        for sent in sorted(handovers, key=_by_id):
            i = sent.request_id
            self._sent[i] = sent
            target = replicas[self.router.route(i, self.decode)]
            rec.decode_replica[i] = target.index
            target.scheduler.add(_decode_side(sent, now_s, target.scheduler.request_class), now_s)
            rec.waiting_change(now_s, 1)
            target._poke()
        if self.check:
            self.check_invariants()

    def check_invariants(self) -> None:
        """AssertionError unless every request in the cluster is in one pool of one replica, and every
        request whose KV is in flight is held on both sides: sent by its prefill replica, owed by a decode one."""
        # A request handed over at this instant is still in its prefill step, which ends after this.
        owed = [r.request_id for rep in self.prefill for r in rep.scheduler.in_system() if r.request_id not in self._sent]
        owed += [r.request_id for rep in self.decode for r in rep.scheduler.in_system()]
        assert len(owed) == len(set(owed)), "a request is in two pools"
        decode_side = {r.request_id for rep in self.decode for r in rep.scheduler.in_system()}
        assert set(self._sent) <= decode_side, "a request's KV left its prefill replica for no decode replica"
        for i, sent in self._sent.items():
            assert sent in self.replicas[sent.replica].scheduler._sending or sent.status.name == "RUNNING", \
                f"request {i}'s prefill blocks were freed before its transfer ended"


def _decode_side(sent: Request, first_token_s: float, cls: type[Request] = Request) -> Request:
    """The decode replica's request for ``sent`` (a ``cls``, as that replica's scheduler builds them),
    whose first token came at ``first_token_s``: its prompt computed (remotely), one token generated,
    and the prefill side's history carried over."""
    req = cls(sent.request_id, sent.arrival_s, sent.prompt_tokens, sent.output_tokens, sent.tenant, sent.priority)
    req.replica, req.prefill_pending, req.remote_kv = sent.replica, False, True
    req.num_cached_tokens, req.num_preemptions = sent.num_cached_tokens, sent.num_preemptions
    req.first_scheduled_s, req.first_token_s, req.waiting_s = sent.first_scheduled_s, first_token_s, sent.waiting_s
    req.prefix_stream, req.shared_prefix_tokens = sent.prefix_stream, sent.shared_prefix_tokens
    req.num_computed_tokens, req.num_generated, req.last_token_s = sent.prompt_tokens, 1, first_token_s
    return req

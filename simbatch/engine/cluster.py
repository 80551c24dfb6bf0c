"""The cluster: arrivals, admission control, routing, and the end of the run, around the replicas.

One SimPy process sends each request at its arrival instant: the cluster cap (``max_in_flight``), the
router (reading live replicas, or snapshots taken ``signal_delay_ms`` earlier by a second process),
then the chosen replica's own checks, and the replica's queue. (A lone replica that runs ahead of
SimPy's clock takes its requests itself, through the same steps, as its clock passes them: :class:`Feed`.)
The replicas run on their own (:mod:`simbatch.engine.replica`, accelerated under ``sim.fast_forward``:
:mod:`simbatch.engine.accel`).

Time is kept in integer nanoseconds (:mod:`simbatch.model.clock`, which also states the tie rule: at one
instant, the clock stop, then arrivals and snapshots, then the engines). Arrivals and snapshots are
therefore *urgent* SimPy events; the replicas' steps and timers are normal ones.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from itertools import chain

import numpy as np
import simpy

from simbatch.config import Scenario, replica_scenarios
from simbatch.engine.autoscale import Autoscaler, ScaledReplica
from simbatch.engine.client import Client
from simbatch.engine.disaggregated import Dispatcher
from simbatch.engine.dp_group import form_groups
from simbatch.engine.replica import Replica
from simbatch.engine.router import Load, make_router
from simbatch.features import feature_classes
from simbatch.inputs.resolve import resolve
from simbatch.memory.blocks import blocks_for, peak_kv_tokens
from simbatch.model.clock import NS_PER_S, Urgent, to_ns
from simbatch.observe.observers import Observer
from simbatch.observe.recorder import Recorder
from simbatch.registry import MODES
from simbatch.workload import WorkloadArrays
from simbatch.workload.prefix import OWN_STREAM


def rejection_reasons(scenario: Scenario, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> dict[int, str]:
    """The requests an engine of this scenario can never serve: {index: reason} (all others: none).

    Checked at arrival so that the simulation never waits on a request that cannot fit; computed for
    the whole workload at once, since lengths are known in advance.
    """
    kv, b = scenario.kv_cache, scenario.batching
    reasons: dict[int, str] = {}
    if MODES[b.mode].iteration_level and not b.enable_chunked_prefill:
        reasons.update(dict.fromkeys(np.flatnonzero(prompt_tokens > b.max_num_batched_tokens).tolist(),
                                     "prompt_exceeds_budget"))
    never_fits = blocks_for(peak_kv_tokens(prompt_tokens, output_tokens), kv.block_size) > kv.num_blocks
    reasons.update(dict.fromkeys(np.flatnonzero(never_fits).tolist(), "never_fits"))
    return reasons


def _stop_ns(max_time_s: float) -> int:
    """``sim.max_time_s`` on the grid (at least one tick: SimPy stops only in the future)."""
    return max(1, to_ns(max_time_s))


CHUNK_ROWS = 65_536  # rows of the workload's columns converted to Python scalars at a time


def _chunked(*columns: np.ndarray):
    """The columns' rows as tuples of Python scalars (read one at a time, several times faster than
    NumPy's), converted a chunk at a time: a million of them at once would hold hundreds of MB for the run.
    Chained, not yielded from: a row then passes through no Python frame."""
    return chain.from_iterable(zip(*(column[start:start + CHUNK_ROWS].tolist() for column in columns), strict=True)
                               for start in range(0, len(columns[0]), CHUNK_ROWS))


class Engine:
    """The whole model for one scenario: build it, ``run()`` it, read its recorder."""

    def __init__(self, scenario: Scenario, workload: WorkloadArrays, check_invariants: bool = False,
                 on_progress: Callable[[float, int], None] | None = None, observers: Sequence[Observer] = ()):
        # The engine runs resolved scenarios only (presets' costs, numbers of blocks); resolving one
        # that is (simulate's, a loaded one) gives it back alike.
        self.scenario = scenario = resolve(scenario)
        self.workload = workload
        self.env = simpy.Environment()
        # A client sends when earlier requests complete or are rejected, so send times are known only
        # as the run goes: it observes the run, after the caller's observers.
        self.client = Client.of(self.env, scenario.workload, scenario.frontend.response_latency_s)
        # The recorder is the first observer: the caller's see a request the recorder has counted.
        self.replica_scenarios = replica_scenarios(scenario)
        self.recorder = Recorder(len(workload), scenario.cluster.fleet_size,
                                 columns=tuple(c for f in feature_classes(self.replica_scenarios) for c in f.columns),
                                 disaggregated=scenario.cluster.disaggregated is not None,
                                 request_latency_s=scenario.frontend.request_latency_s,
                                 response_latency_s=scenario.frontend.response_latency_s)
        self.observers = (self.recorder, *observers, *([self.client] if self.client is not None else []))
        self._check_invariants = check_invariants
        self.arrivals_done = False
        self.replicas = [self._replica(i) for i in range(len(self.replica_scenarios))]
        # An autoscaled fleet: every replica it may start is built now, and routing reads the ready ones.
        self.autoscaler = None
        if scenario.cluster.autoscale is not None:
            self.autoscaler = Autoscaler(self.env, scenario.cluster.autoscale, self.replicas, scenario.cluster.replicas,
                                         self._replica, lambda: self.arrivals_done)
            self.observers = (*self.observers, self.autoscaler)
            for replica in self.replicas:
                replica.observers = self.observers
        self.router = make_router(scenario, workload.session, workload=workload)
        # Arrivals go to the prefill pool when prefill and decode are disaggregated, to every replica otherwise.
        self.dispatcher = None if scenario.cluster.disaggregated is None else \
            Dispatcher(self.env, scenario, self.replicas, self.recorder, workload, check_invariants)
        self.entry = self.replicas if self.dispatcher is None else self.dispatcher.prefill
        # The ranks of a data-parallel MoE engine step together (not under an autoscaler or disaggregated).
        self.dp_groups = form_groups(self.env, self.replicas, self.replica_scenarios) \
            if self.dispatcher is None and self.autoscaler is None else []
        if self.autoscaler is not None:
            self.entry = self.autoscaler.active  # changed in place as replicas start and drain
        self.on_progress = on_progress
        self._arrival_ns = np.rint(workload.arrival_s * NS_PER_S).astype(np.int64)  # exact on the clock's grid
        # With a signal delay, the router reads snapshots taken signal_delay_ms before each arrival.
        self._views: deque[tuple[Load, ...]] | None = None
        if scenario.cluster.signal_delay_ms > 0:
            self._views = deque()
            self.env.process(self._observe())  # first, so that it snapshots t <= 0 before any arrival
        # A lone accelerated replica is told when each request will arrive (see _arrivals), and
        # unless snapshots read its state in between, it runs ahead and takes its requests itself
        # (Feed, made in run()); not with a client, whose next send may wait on any of its completions.
        self._lone = self.replicas[0] if len(self.replicas) == 1 and scenario.sim.fast_forward \
            and self.client is None and self.autoscaler is None else None
        if self._lone is not None:
            self._lone.knows_arrivals = True
            self._lone.run_ahead = self._views is None
            if scenario.sim.max_time_s is not None:
                self._lone.stop_at_ns = _stop_ns(scenario.sim.max_time_s)
        self._request_latency_ns = to_ns(scenario.frontend.request_latency_s)
        self._single = len(self.entry) == 1 and self._views is None and self.autoscaler is None
        self._max_in_flight, self._max_waiting = scenario.cluster.max_in_flight, scenario.scheduler.max_waiting
        self._rejected = self._rejections()
        self._sending_done = False
        self._deliveries_wake: simpy.Event | None = None

    def _replica(self, i: int) -> Replica:
        """Replica ``i``, a new engine: built at the start, and again when an autoscaler restarts it."""
        kind = Replica if self.scenario.cluster.autoscale is None else ScaledReplica
        replica = kind(self.env, i, self.replica_scenarios[i], self.recorder, self.workload.tenant_names,
                       self._check_invariants, self.observers)
        replica.plans_after_sends = self.client is not None
        if self.arrivals_done:
            replica.close()
        return replica

    def _observe(self):
        """Snapshot every replica at each arrival time minus the signal delay.

        The arrival times are known in advance, so the router's view of request i is the replicas'
        state at exactly t_i - delay (before t = 0: the empty cluster), not an approximation
        refreshed at some polling period. Cost: one event and one snapshot of N replicas per arrival.
        """
        env, delay_ns = self.env, to_ns(self.scenario.cluster.signal_delay_s) - self._request_latency_ns
        for (t,) in _chunked(self._arrival_ns):
            if t - delay_ns > env.now:
                yield Urgent(env, t - delay_ns - env.now)
            self._views.append(tuple(Load.of(r) for r in self.replicas))

    def _rows(self, latency_ns: int = 0):
        """Every request in order as (when it reaches the cluster on the clock, :meth:`_receive`'s arguments:
        its index, that instant in s, its other columns), ``latency_ns`` after its arrival. Made a chunk at a
        time (:func:`_chunked`), in the shape they are used in: a row is taken apart by nobody."""
        wl, arrival_ns = self.workload, self._arrival_ns
        others = (wl.prompt_tokens, wl.output_tokens, wl.tenant, wl.priority, wl.prefix_stream, wl.shared_prefix_tokens)

        def chunk(start: int):
            stop = start + CHUNK_ROWS
            t_ns = arrival_ns[start:stop].tolist()
            if latency_ns:
                t_ns = [t + latency_ns for t in t_ns]
                t_s = [t / NS_PER_S for t in t_ns]
            else:
                t_s = wl.arrival_s[start:stop].tolist()
            args = zip(range(start, start + len(t_ns)), t_s, *(c[start:stop].tolist() for c in others), strict=True)
            return zip(t_ns, args, strict=True)

        return chain.from_iterable(map(chunk, range(0, len(arrival_ns), CHUNK_ROWS)))

    def _arrivals(self):
        """Send each request at its arrival instant (or when the client lets it go), and hand it to the
        cluster ``frontend.request_latency_ms`` later (:meth:`_receive`).

        Without a client the send times are known in advance, so each request is received at its
        arrival plus the latency; a client's sends are known only as the run goes, so with a latency
        they queue for :meth:`_deliveries`, in send order (the latency is the same for all).
        """
        env, rec, sc = self.env, self.recorder, self.scenario
        lone = self._lone  # told when each request will arrive
        client, latency_ns = self.client, self._request_latency_ns
        # Closed-loop users stop at the workload's duration (open-loop arrivals are all before it).
        stop_sending_ns = to_ns(sc.workload.duration_s) \
            if client is not None and not client.open_loop and sc.workload.duration_s is not None else None
        deliveries = None
        if client is not None and latency_ns:
            self._pending: deque = deque()
            deliveries = env.process(self._deliveries())
        # (A client sends at the arrival instant: the latency counts from the send, not the arrival.)
        for t, args in self._rows(latency_ns if client is None else 0):
            if client is not None:
                wait_ns = yield from client.send(t)
                if stop_sending_ns is not None and env.now >= stop_sending_ns:
                    break
                rec.sent(args[0], env.now / NS_PER_S, wait_ns / NS_PER_S)  # the server's clock starts at the send
                if deliveries is not None:
                    self._pending.append((env.now + latency_ns, args))
                    self._poke_deliveries()
                    continue
                self._receive(args[0], env.now / NS_PER_S, *args[2:])
            else:
                if lone is not None:
                    lone.next_arrival_ns = t
                now = env.now
                if t > now:
                    yield Urgent(env, t - now)
                self._receive(*args)
        self._sending_done = True
        if deliveries is not None:
            self._poke_deliveries()
        else:
            self._close()

    def _deliveries(self):
        """Requests a client sent, received ``frontend.request_latency_ms`` later, in send order."""
        env, pending = self.env, self._pending
        while True:
            if not pending:
                if self._sending_done:
                    self._close()
                    return
                self._deliveries_wake = env.event()
                yield self._deliveries_wake
                continue
            at_ns = pending[0][0]
            if at_ns > env.now:
                yield Urgent(env, at_ns - env.now)
            _, args = pending.popleft()
            self._receive(args[0], env.now / NS_PER_S, *args[2:])

    def _poke_deliveries(self) -> None:
        wake = self._deliveries_wake
        if wake is not None and not wake.triggered:
            wake.succeed()

    def _close(self) -> None:
        """Every request has been received: no more arrivals."""
        if self._lone is not None:
            self._lone.next_arrival_ns = math.inf
        self.arrivals_done = True
        for replica in self.replicas:
            replica.close()

    def _receive(self, i: int, now_s: float, prompt: int, output: int, tenant: int, priority: int, stream: int,
                 shared: int) -> None:
        """Admit request ``i``, reaching the cluster at ``now_s`` (``on_progress`` is told every 1,024th
        arrival): cluster cap, router, then the replica's checks.

        Rejection reasons: ``cluster_full`` (``cluster.max_in_flight`` requests already in the
        cluster; never routed), then, at the replica the router chose, ``never_fits`` or
        ``prompt_exceeds_budget`` (see :func:`rejection_reasons`) and ``queue_full``
        (``scheduler.max_waiting``). A routed request records its replica even when rejected.
        Every arrival takes its own snapshot off the queue, routed or not.
        """
        if self.on_progress is not None and i % 1024 == 0:
            self.on_progress(now_s, i)
        views, max_in_flight, max_waiting = self._views, self._max_in_flight, self._max_waiting
        view = None if views is None else views.popleft()
        if max_in_flight is not None and sum(r.num_running + r.num_waiting for r in self.replicas) >= max_in_flight:
            reason = "cluster_full"  # never routed
        else:
            if self._single:
                replica = self.entry[0]
            else:
                replica = self.replicas[self.router.route(i, self.entry if view is None else view)]
            self.recorder.replica[i] = replica.index
            reason = self._rejected[replica.index].get(i)
            if reason is None and max_waiting is not None and replica.num_waiting >= max_waiting:
                reason = "queue_full"
        if reason is not None:
            for o in self.observers:
                o.rejection(now_s, i, reason)
            return
        req = replica.scheduler.request_class(i, now_s, prompt, output, tenant, priority)
        if stream != OWN_STREAM or shared:
            req.prefix_stream, req.shared_prefix_tokens = stream, shared
        wl = self.workload
        if wl.hashes is not None:
            req.block_hashes, req.hash_block_tokens = wl.hashes.of(i), wl.hashes.block_tokens
        if wl.adapter is not None:
            req.lora_id = int(wl.adapter[i])
        replica.submit(req, now_s)
        for o in self.observers:
            o.arrival(now_s, req)

    def _rejections(self) -> list[dict[int, str]]:
        """Per replica, the requests it must turn away at arrival (see :func:`rejection_reasons`).

        Disaggregated, a prefill replica holds a prompt (its output is the decode side's), and
        turns away, too, a request no decode replica could ever hold whole."""
        wl = self.workload
        if self.dispatcher is None:
            # Alike replicas share one scenario object: their reasons are computed once (and only read).
            reasons: dict[int, dict[int, str]] = {}
            for s in self.replica_scenarios:
                if id(s) not in reasons:
                    reasons[id(s)] = rejection_reasons(s, wl.prompt_tokens, wl.output_tokens)
            return [reasons[id(s)] for s in self.replica_scenarios]
        one = np.ones_like(wl.output_tokens)
        decode = rejection_reasons(self.replica_scenarios[-1], wl.prompt_tokens, wl.output_tokens)
        prefill = decode | rejection_reasons(self.replica_scenarios[0], wl.prompt_tokens, one)
        return [prefill if r.pool == "prefill" else {} for r in self.replicas]

    def run(self) -> float:
        """Run to the end (drained, or ``sim.max_time_s``); returns the end time of the run, s.

        The run ends at its last event (a completion, a rejection or an arrival) when it drained, and
        at the clock stop when the stop cut it short (requests still in the system, or still to come).
        """
        limit = self.scenario.sim.max_time_s
        limit_ns = None if limit is None else _stop_ns(limit)
        lone = self._lone
        if lone is not None and lone.run_ahead and lone.group is None:
            lone.feed = Feed(self, lone)  # it receives its requests itself (Feed)
        else:
            self.env.process(self._arrivals())
        self.env.run(until=limit_ns)
        for replica in self.replicas:
            replica.stop(self.env.now)
        rec = self.recorder
        in_system = [r for rep in self.replicas for r in rep.scheduler.in_system()]
        if in_system and limit is None:
            raise RuntimeError(f"the engine stopped with {len(in_system)} requests in the system: a scheduler bug")
        cut = limit_ns is not None and (in_system or not self.arrivals_done)
        end_s = limit_ns / NS_PER_S if cut else rec.t_last
        for req in in_system:
            rec.unfinished(req, end_s)
        rec.close(end_s)
        return end_s


class Feed:
    """The arrivals of a lone replica that runs ahead of SimPy's clock, received by the replica itself.

    Nothing but that replica could see an arrival at its instant (no router, no snapshots, no client),
    so instead of one SimPy event per arrival, the replica takes the requests due as its clock passes
    them: at the end of the step during which they arrive, before the step is applied (where the
    arrival process's urgent events would have put them), or when it wakes from idling at the next
    one. Everything an arrival does is the cluster's as before (:meth:`Engine._receive`).
    """

    __slots__ = ("_engine", "_replica", "_rows", "_next", "_next_ns")

    def __init__(self, engine: Engine, replica: Replica):
        self._engine, self._replica = engine, replica
        self._rows = engine._rows(engine._request_latency_ns)  # received this long after it was sent, as _arrivals does
        self._next, self._next_ns = None, math.inf  # the next arrival (_receive's arguments), and its time
        self._advance()

    def _advance(self) -> None:
        row = next(self._rows, None)
        if row is None:
            self._next, self._next_ns = None, math.inf
            self._engine._close()  # (sets the replica's next_arrival_ns to inf)
            return
        t, self._next = row
        self._next_ns = self._replica.next_arrival_ns = t

    def receive_until(self, t_ns: int) -> None:
        """Receive every request due at or before ``t_ns``, in order."""
        receive = self._engine._receive
        while self._next_ns <= t_ns:
            receive(*self._next)
            self._advance()

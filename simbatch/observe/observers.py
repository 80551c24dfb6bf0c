"""Watching a run as it goes: the engine's events, for whoever subscribes.

``simulate(scenario, observers=[...])`` calls every observer's methods at the instants things
happen. An observer overrides the methods it wants; the others do nothing, and the engine does no
work for an event nobody overrides (a run whose observers ignore steps pays nothing per step, one
whose observers ignore admissions, preemptions and transfers nothing per request). The recorder, which builds
the frames and the summary, is the first observer of every run (:mod:`simbatch.observe.recorder`);
another is for what the frames do not keep: a trace of which requests rode in which step and when
each was admitted and preempted (:mod:`simbatch.observe.perfetto`), a live view.

**The events.** Times are seconds on the engine's nanosecond clock; ``replica`` is the engine's index.

- ``arrival(t_s, request)``: ``request`` reached ``request.replica`` and joined its waiting queue.
- ``rejection(t_s, request_id, reason)``: turned away (``reason`` as in the requests frame).
- ``admission(t_s, replica, request)``: ``request`` left WAITING for RUNNING while the step starting
  at ``t_s`` was planned, for the first time or back from a preemption; its counters
  (``num_computed_tokens``, including the blocks a prefix-cache hit gave it, ``num_generated``) are
  where its step starts. A static or dynamic batch admits all its members at its start. The
  ``num_admitted`` of the plan counts these; a disaggregated decode replica's reservation of a
  request whose KV is on its way is not one: it is a ``transfer``.
- ``transfer(t_s, replica, request, duration_s)``: disaggregated pools. ``request``, handed off by
  its prefill replica (``request.replica``) when it sampled its first token (``request.first_token_s``),
  and queued since on decode replica ``replica``, has the blocks of its prompt's KV and a slot
  reserved there while the step starting at ``t_s`` was planned (or the replica found nothing to
  run), and its KV starts moving; it arrives at ``t_s + duration_s``, and the request decodes on
  ``replica`` from the plan after, with no ``admission`` (its counters are where its first decode
  starts: the prompt computed, one token generated). Its prefill replica frees its blocks then.
- ``preemption(t_s, replica, request, swapped, kv_blocks, computed_tokens)``: ``request`` was sent back
  to WAITING while the step starting at ``t_s`` was planned. ``swapped``: its KV moved to the host
  (``scheduler.preemption: swap``, with room there); else it was dropped and will be computed again.
  ``kv_blocks`` and ``computed_tokens``: the device blocks it held and the tokens they held until then
  (its own counters already read as after the preemption).
- ``step(replica, start_s, duration_s, plan, done)``: one step, ``plan`` its membership
  (``plan.scheduled``: every (request, tokens), prefill chunks and one-token decodes; ``plan.slices``
  the chunks alone; a set, whose order is each engine's own). ``done`` is False only for the step the clock stop interrupted: it began, its
  tokens never came.
- ``run(replica, run, plan)``: only for an observer that declares ``takes_runs = True``: ``len(run)``
  (two or more) consecutive steps of one plan, told at once, each step's own start and duration in
  ``run`` (:class:`Run`: exact, as the reference engine times them, though they differ when the step
  time grows with the context read, ``device.kv_read_ms_per_1k_tokens``). Every member computes a
  decode token in each of them: a prefill never repeats.
- ``completion(t_s, requests)``: ``requests`` sampled their last token at the end of the step ending
  at ``t_s``, and left.

**Steps or runs.** The reference engine (``sim.fast_forward: false``) makes every step alone; the
accelerated one takes a run of identical steps in one go. An observer that does not take runs is told
of every step of such a run, one ``step`` call each, with the times and membership the reference
engine gives it: its view is the reference's, step for step (the expansion costs a call per step, and
only while such an observer is attached). One that takes runs is told of the run once (``run``; its
single steps still come as ``step``), and pays for no step it does not look at.

**Order.** Each event is told once, at or after its instant, in simulation order; at one instant,
for one replica:

1. the clock stop, if it falls then: nothing at or after it is told, but for the step it interrupts
   (``done`` False), told last of the run;
2. arrivals, and rejections, in request order;
3. the step that ends then (``step``, or the run it ends), then ``completion`` of the requests it
   finished (one call);
4. with a client (``workload.max_concurrency``, closed loops), the arrivals those completions sent;
5. the plan of the next step: the transfers it started, in the order the scheduler held them, then
   its preemptions and admissions, in the order the scheduler made them (a preempted request
   re-admitted by the same plan is told preempted, then admitted); its step begins at that instant.

So for one replica the sequence of admissions, preemptions, steps and completions an observer that
takes no runs is told is the same under both engines. The two differ only in when steps are told: the
reference tells a step when it ends, the accelerated engine the steps of a run when the run ends, or
when an arrival cuts it (at the end of the step in progress), so an arrival during a run is told
before steps that ended earlier, and in a cluster a step may be told after another replica's later
events; the times it carries are its own. Events of different replicas at one instant come in a
fixed order, which may differ between the engines. Observers are told in the order they were passed,
after the recorder; a run goes to those that take runs before its steps go to the others.

The requests handed to an observer are the engine's live objects: read them, never change them. A
step's membership and tokens are in its plan; a request's own counters, read during ``step`` or
``run``, may or may not include that step (the reference engine tells a step after applying it, the
accelerated one a run before). An observer that follows a request's counters takes them where they
are defined, at its ``admission``, and adds its tokens from each step's plan, as
:class:`~simbatch.observe.perfetto.TraceObserver` does.

**What it costs.** With no observer attached but the recorder, the engine tells no step, builds no
:class:`Run` and calls nothing per request moved: the plan carries its admissions and preemptions
anyway (the scheduler's own record, a list only on the plans that move someone), and the loop tests
one flag per step. An observer of ``step`` alone costs a call per step of the reference's, whichever
engine runs; one that takes runs, a call per run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

from simbatch.model.clock import NS_PER_S

if TYPE_CHECKING:
    from simbatch.model.cost import StepRun
    from simbatch.model.request import Request
    from simbatch.model.step import StepPlan


class Run(Sequence):
    """Consecutive repeats of one plan on one replica, described once: ``run[i]`` is the
    ``(start_s, duration_s)`` of its ``i``-th step (from 0), exact on the clock's grid; iterating gives
    them in order, back to back.

    What is the same in every step is the plan told with the run: its membership and each member's
    tokens (one decode token each: a prefill never repeats, nor does a step whose feature declares it
    may not, ``Feature.repeatable``), so its batch size and its decode tokens; and nobody is admitted, preempted or finished between its steps (a
    request finishes at the end of the run's last step, told by ``completion`` after the run). What
    varies is told by the run itself or follows from the plan: each step's start and duration (the
    duration grows with the context read, ``device.kv_read_ms_per_1k_tokens``, and the nanosecond grid
    spreads the rounding), and each member's counters, one more computed and one more generated token
    after each step (so the KV blocks it holds grow as it crosses a block boundary). Expanding a run
    into its steps, ``for start_s, duration_s in run: step(replica, start_s, duration_s, plan, True)``,
    gives exactly what the reference engine tells, step for step: that is what :meth:`Observer.run`
    does unless overridden.

    Built on the cost model's :class:`~simbatch.model.cost.StepRun` (repeats ``first ..`` of it, from
    ``start_ns``): a step's times cost a few integer operations whatever the run's length, and a run
    nobody expands costs nothing per step.
    """

    __slots__ = ("_start_ns", "_durations", "_first", "_count")

    def __init__(self, start_ns: int, durations: StepRun, first: int, count: int):
        self._start_ns, self._durations, self._first, self._count = start_ns, durations, first, count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i: int) -> tuple[float, float]:
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError(f"step {i} of a run of {self._count}")
        d, first = self._durations, self._first
        return (self._start_ns + d.ns(first, i)) / NS_PER_S, d.ns(first + i, 1) / NS_PER_S

    def __iter__(self) -> Iterator[tuple[float, float]]:
        d, t = self._durations, self._start_ns
        for i in range(self._first, self._first + self._count):
            ns = d.ns(i, 1)
            yield t / NS_PER_S, ns / NS_PER_S
            t += ns

    @property
    def start_s(self) -> float:
        return self._start_ns / NS_PER_S

    @property
    def duration_s(self) -> float:
        """The whole run's."""
        return self._durations.ns(self._first, self._count) / NS_PER_S

    @property
    def end_s(self) -> float:
        return (self._start_ns + self._durations.ns(self._first, self._count)) / NS_PER_S


class Observer:
    """Subscribe to a run's events by overriding any of these methods (each does nothing here; the
    module says what each receives, and when)."""

    takes_runs: ClassVar[bool] = False
    """True: runs of identical steps come whole, to :meth:`run`; False: one :meth:`step` per step."""

    def arrival(self, t_s: float, request: Request) -> None:
        """``request`` reached ``request.replica`` at ``t_s`` and joined its waiting queue."""

    def rejection(self, t_s: float, request_id: int, reason: str) -> None:
        """Request ``request_id`` was turned away at ``t_s`` (``reason`` as in the requests frame)."""

    def admission(self, t_s: float, replica: int, request: Request) -> None:
        """``request`` left WAITING for RUNNING on ``replica`` for the step starting at ``t_s``."""

    def preemption(self, t_s: float, replica: int, request: Request, swapped: bool, kv_blocks: int,
                   computed_tokens: int) -> None:
        """``request`` went back to WAITING on ``replica`` at ``t_s``, its ``kv_blocks`` and the
        ``computed_tokens`` they held swapped to the host (``swapped``) or dropped."""

    def transfer(self, t_s: float, replica: int, request: Request, duration_s: float) -> None:
        """``request``'s KV started moving at ``t_s`` from its prefill replica to decode replica ``replica``,
        which holds a slot and its blocks; it arrives ``duration_s`` later."""

    def step(self, replica: int, start_s: float, duration_s: float, plan: StepPlan, done: bool) -> None:
        """One step of ``replica`` from ``start_s``, with ``plan``'s membership (``done`` False: the clock
        stop interrupted it)."""

    def run(self, replica: int, run: Run, plan: StepPlan) -> None:
        """``len(run)`` steps of ``replica``, each with ``plan``'s membership (``takes_runs`` only); here,
        each told to :meth:`step`."""
        for start_s, duration_s in run:
            self.step(replica, start_s, duration_s, plan, True)

    def completion(self, t_s: float, requests: list[Request]) -> None:
        """``requests`` sampled their last token at ``t_s`` and left."""

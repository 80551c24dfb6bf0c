"""A run as a Chrome trace (``trace.json``): open it in Perfetto UI (ui.perfetto.dev) or chrome://tracing.

The trace answers *why* a percentile is bad: which requests rode in which step, where a prefill
stalled the decodes, when the cache filled and preemptions began. Its layout, one process per
replica (``pid`` = replica + 1; one more, ``pid`` = replicas + 1, holds the requests the cluster turned
away before routing them):

- thread 0, ``steps``: one complete slice (``ph: "X"``) per row of the iterations frame, that is per
  run of identical consecutive steps (the frame's runs, whichever engine made them): ``args.count``
  says how many steps it holds, ``args.step_ms`` how long each one took (their mean, when the step
  time grows with the context read). The other args are per step: ``batch_size``, ``prefill_tokens``,
  ``decode_seqs``, ``num_preempted``, and ``kv_blocks_used`` (the mean over the run's steps: exact for
  a single step; a run of decodes grows its blocks as it goes); ``admitted_ids`` and
  ``preempted_ids`` list the requests admitted and preempted while the slice's steps were planned, in
  the scheduler's order (the engine's admission and preemption events); ``done`` is false for a step
  the clock stop cut short.
- counters (``ph: "C"``): ``requests`` (``running``, ``waiting``, after planning each run) and
  ``kv_blocks_used``, set at each run's start and back to 0 when the replica falls idle.
- threads 1, 2, ...: ``requests k``, lanes of requests. Each request's life is a row of slices named by
  its phase, with ``args.request_id``: ``queued`` (arrival to first admission), ``prefill`` (from an
  admission: computing its prompt, or recomputing prompt and output after a preemption dropped its
  KV, until it samples a token), ``decode`` (from that token, or from an admission that swapped its
  KV back in whole, to the last token) and ``preempted`` (from a preemption, back in WAITING, to its
  next admission; ``args.swapped`` whether its KV went to the host, ``args.kv_blocks`` and
  ``args.computed_tokens`` what it held). Every change of phase but a prefill's first token is one of
  the engine's events (:mod:`simbatch.observe.observers`), at its time. A request takes the first
  lane free at its arrival, so lanes never overlap and there are as many as the replica ever held
  requests at once.
- ``rejections``: an instant event (``ph: "i"``) per request turned away, with its reason.

Times are microseconds (``ts``, ``dur``), taken from the simulator's nanosecond clock, so slices
that touch in the model touch exactly in the file.

**Bounded size.** The trace covers the first ``max_requests`` requests (``--trace-max-requests``,
default 10,000): every request, step and counter from t = 0 until the arrival of request number
``max_requests``, after which steps are left out, and later requests get no lane (the requests in the
window keep their whole lives). A run of that size writes tens of MB at most; a million-request run
writes no more. ``TraceObserver.notice`` says, in one line, when the window cut the run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from simbatch.observe.observers import Observer, Run

if TYPE_CHECKING:
    import pandas as pd

    from simbatch.config import Scenario
    from simbatch.model.request import Request
    from simbatch.model.step import StepPlan


class Result(Protocol):
    """What the trace reads of a finished run: a :class:`simbatch.simulation.Result` (the simulation
    sits above the observers, so it is named here by shape, not imported)."""

    scenario: Scenario
    requests: pd.DataFrame
    iterations: pd.DataFrame
    summary: dict


DEFAULT_MAX_REQUESTS = 10_000
PHASES = ("queued", "prefill", "decode", "preempted")
QUEUED, PREFILL, DECODE, PREEMPTED = PHASES
NS_PER_S = 1_000_000_000


def to_ns(t_s: float) -> int:
    """A simulated time on the clock's nanosecond grid (times in the run are on it, or round to it)."""
    return round(t_s * NS_PER_S)


def us(ns: int) -> float:
    """Nanoseconds as the trace's microseconds (three decimals at most: exact in JSON)."""
    return ns / 1000


class _Life:
    """What the observer knows of one request in the system: its phase, since when, and the phases it has
    been through; while it prefills, the tokens it has computed and must compute before it samples."""

    __slots__ = ("prompt", "computed", "generated", "phase", "since_ns", "args", "phases")

    def __init__(self, prompt: int, t_ns: int):
        self.prompt = prompt
        self.computed = self.generated = 0
        self.phase, self.since_ns, self.args = QUEUED, t_ns, None
        self.phases: list[tuple[str, int, int, dict | None]] = []  # (phase, start ns, end ns, its args)

    def enter(self, phase: str, t_ns: int, args: dict | None = None) -> None:
        if phase != self.phase:
            self.close(t_ns)
            self.phase, self.since_ns, self.args = phase, t_ns, args

    def close(self, t_ns: int) -> None:
        self.phases.append((self.phase, self.since_ns, t_ns, self.args))


class TraceObserver(Observer):
    """Collect, as the run goes, what the frames do not keep: each request's phases, and who was admitted and
    preempted when.

    The phases follow the engine's events (:mod:`simbatch.observe.observers`): an arrival queues a
    request, an admission starts its prefill (or its decode, when a swap kept everything but its last
    token), a preemption sends it to ``preempted`` until it is admitted again, a completion ends it. A
    prefill turns to decode at the end of the step in which it computed its last known token, which the
    observer counts from the steps' prefill chunks alone, starting from the request's counters at its
    admission: decodes change no phase, so a run of steps (decodes only) is taken whole, and a step with
    nobody prefilling costs nothing.

    Pass it to ``simulate(scenario, observers=[...])``, then :func:`trace_events` (or
    :func:`write_trace`) with the result builds the trace from it and the frames.
    """

    takes_runs = True

    def __init__(self, scenario: Scenario, max_requests: int = DEFAULT_MAX_REQUESTS):
        if max_requests < 1:
            raise ValueError(f"max_requests {max_requests}: must be at least 1")
        self.max_requests = max_requests
        self.window_end_ns: int | None = None  # the arrival of request number max_requests, if any
        self.num_requests = 0  # requests that arrived (or were turned away)
        self._live: dict[int, _Life] = {}  # request id -> life, for requests in the system
        self._prefilling: dict[int, _Life] = {}  # those of them computing known tokens before their next sample
        self.lives: dict[int, tuple[int, list[tuple[str, int, int, dict | None]]]] = {}  # id -> (replica, phases)
        # (replica, ns, request id) of every admission and preemption in the window, in the order told.
        self.admitted: list[tuple[int, int, int]] = []
        self.preempted: list[tuple[int, int, int]] = []

    # ---------------------------------------------------------------- the observer's events
    def _seen(self, request_id: int, t_s: float) -> bool:
        """Count an arrival; whether it falls in the window (the first ``max_requests`` requests)."""
        self.num_requests += 1
        if request_id < self.max_requests:
            return True
        if self.window_end_ns is None:
            self.window_end_ns = to_ns(t_s)
        return False

    def _in_window(self, t_ns: int) -> bool:
        return self.window_end_ns is None or t_ns < self.window_end_ns

    def arrival(self, t_s: float, request: Request) -> None:
        # Requests arrive in id order, so once the window has closed no later arrival is in it, and
        # the observer stops following requests (its cost ends with the window's last request).
        if self._seen(request.request_id, t_s):
            self._live[request.request_id] = _Life(request.prompt_tokens, to_ns(t_s))

    def rejection(self, t_s: float, request_id: int, reason: str) -> None:
        self._seen(request_id, t_s)

    def admission(self, t_s: float, replica: int, request: Request) -> None:
        i = request.request_id
        life = self._live.get(i)
        if life is None:
            return  # arrived after the window closed
        t_ns = to_ns(t_s)
        # Counters as its step starts: a prefix-cache hit's tokens computed, a swap's kept, a drop's gone.
        life.computed, life.generated = request.num_computed_tokens, request.num_generated
        if life.generated and life.computed == life.prompt + life.generated - 1:
            life.enter(DECODE, t_ns)  # back from a swap with all but its last token: it decodes at once
        else:
            life.enter(PREFILL, t_ns)
            self._prefilling[i] = life
        if self._in_window(t_ns):
            self.admitted.append((replica, t_ns, i))

    def preemption(self, t_s: float, replica: int, request: Request, swapped: bool, kv_blocks: int,
                   computed_tokens: int) -> None:
        i = request.request_id
        life = self._live.get(i)
        if life is None:
            return
        t_ns = to_ns(t_s)
        self._prefilling.pop(i, None)
        life.enter(PREEMPTED, t_ns, {"swapped": swapped, "kv_blocks": kv_blocks, "computed_tokens": computed_tokens})
        if self._in_window(t_ns):
            self.preempted.append((replica, t_ns, i))

    def step(self, replica: int, start_s: float, duration_s: float, plan: StepPlan, done: bool) -> None:
        if done and self._prefilling:  # an interrupted step's tokens never came
            self._compute(plan, ((start_s, duration_s),))

    def run(self, replica: int, run: Run, plan: StepPlan) -> None:
        if self._prefilling:
            self._compute(plan, run)

    def _compute(self, plan: StepPlan, steps) -> None:
        """The prefilling requests among ``plan``'s slices compute their chunks in each of ``steps``
        ((start_s, duration_s) pairs); one that has computed every known token samples one at the end of
        that step, and decodes from then on."""
        prefilling = self._prefilling
        for req, tokens in plan.slices:
            life = prefilling.get(req.request_id)
            if life is None:
                continue  # a decode's token and its drafts, a batch's decode row, or out of the window
            for start_s, duration_s in steps:
                life.computed += tokens
                if life.computed >= life.prompt + life.generated:
                    life.generated += 1
                    life.enter(DECODE, to_ns(start_s) + to_ns(duration_s))
                    del prefilling[req.request_id]
                    break

    def completion(self, t_s: float, requests: list[Request]) -> None:
        t_ns = to_ns(t_s)
        for req in requests:
            life = self._live.pop(req.request_id, None)
            if life is not None:
                self._prefilling.pop(req.request_id, None)
                self._retire(req.request_id, req.replica, life, t_ns)

    def _retire(self, request_id: int, replica: int, life: _Life, t_ns: int) -> None:
        life.close(t_ns)
        self.lives[request_id] = (replica, life.phases)

    def end(self, end_s: float, replicas: dict[int, int]) -> None:
        """The run is over at ``end_s``: close the phases of requests still in the system.

        ``replicas``: request id -> replica (the requests frame's).
        """
        t_ns = to_ns(end_s)
        for request_id, life in self._live.items():
            self._retire(request_id, replicas[request_id], life, t_ns)
        self._live.clear()
        self._prefilling.clear()

    @property
    def notice(self) -> str | None:
        """One line when the window left requests out of the trace; None when it holds them all."""
        if self.window_end_ns is None:
            return None
        return (f"trace.json covers the first {self.max_requests:,} of {self.num_requests:,} requests "
                f"(t < {self.window_end_ns / NS_PER_S:,.3f} s); --trace-max-requests N widens it")


# -------------------------------------------------------------------- building the trace
def _meta(pid: int, tid: int | None, name: str) -> list[dict]:
    """Name a process (``tid`` None) or a thread, and sort it by its number (Perfetto sorts by name otherwise)."""
    if tid is None:
        return [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}},
                {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}}]
    return [{"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}},
            {"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}}]


def _lanes(lives: dict[int, tuple[int, list]]) -> dict[int, int]:
    """Request id -> lane within its replica: the lowest lane free at its arrival (interval partitioning)."""
    lane_of: dict[int, int] = {}
    free_at: dict[int, list[int]] = {}  # replica -> end of each lane's last request
    for request_id in sorted(lives):  # ids follow arrival order
        replica, phases = lives[request_id]
        start, end = phases[0][1], phases[-1][2]
        ends = free_at.setdefault(replica, [])
        lane = next((k for k, t in enumerate(ends) if t <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
        else:
            ends[lane] = end
        lane_of[request_id] = lane
    return lane_of


def _step_events(result: Result, observer: TraceObserver) -> Iterator[dict]:
    """The steps thread and the counters of each replica, from the iterations frame."""
    it = result.iterations
    start_ns = np.rint(it["start_s"].to_numpy() * NS_PER_S).astype(np.int64)
    end_ns = start_ns + it["num_steps"].to_numpy() * np.rint(it["duration_s"].to_numpy() * NS_PER_S).astype(np.int64)
    keep = start_ns < observer.window_end_ns if observer.window_end_ns is not None else np.ones(len(it), bool)
    replica = it["replica"].to_numpy()
    admitted_ids, preempted_ids = _by_row(observer.admitted, replica, start_ns), _by_row(observer.preempted, replica, start_ns)
    duration = result.summary["duration"]
    columns = ("num_steps", "duration_s", "batch_size", "prefill_tokens", "decode_tokens", "num_preempted",
               "kv_blocks_used", "num_running", "num_waiting", "itl_tokens", "end_s")
    rows = zip(*(it[c].tolist() for c in columns), strict=True)
    previous_end: dict[int, int] = {}
    for i, (n, step_s, batch, prefill, decode, preempted, kv, running, waiting, itl, end_s) in enumerate(rows):
        if not keep[i]:
            continue
        pid, t0, t1 = int(replica[i]) + 1, int(start_ns[i]), int(end_ns[i])
        last = previous_end.get(pid)
        if last is not None and last < t0:  # the replica idled in between
            yield {"ph": "C", "pid": pid, "name": "requests", "ts": us(last), "args": {"running": 0, "waiting": 0}}
            yield {"ph": "C", "pid": pid, "name": "kv_blocks_used", "ts": us(last), "args": {"blocks": 0}}
        previous_end[pid] = t1
        stopped = itl == 0 and end_s > duration  # the step the clock stop cut short
        yield {"ph": "X", "pid": pid, "tid": 0, "name": _step_name(prefill, decode),
               "ts": us(t0), "dur": us(t1 - t0),
               "args": {"count": n, "step_ms": step_s * 1e3, "batch_size": batch, "prefill_tokens": prefill,
                        "decode_seqs": decode, "kv_blocks_used": kv, "num_preempted": preempted,
                        "admitted_ids": admitted_ids.get(i, []), "preempted_ids": preempted_ids.get(i, []),
                        "done": not stopped}}
        yield {"ph": "C", "pid": pid, "name": "requests", "ts": us(t0), "args": {"running": running, "waiting": waiting}}
        yield {"ph": "C", "pid": pid, "name": "kv_blocks_used", "ts": us(t0), "args": {"blocks": kv}}
    for pid, last in previous_end.items():
        yield {"ph": "C", "pid": pid, "name": "requests", "ts": us(last), "args": {"running": 0, "waiting": 0}}
        yield {"ph": "C", "pid": pid, "name": "kv_blocks_used", "ts": us(last), "args": {"blocks": 0}}


def _by_row(moves: list[tuple[int, int, int]], replica: np.ndarray, start_ns: np.ndarray) -> dict[int, list[int]]:
    """The request ids of ``moves`` ((replica, ns, id), told at a plan's time: its step's start), by the
    row of the iterations frame that holds that step, in the order told."""
    rows_of: dict[int, np.ndarray] = {}
    out: dict[int, list[int]] = {}
    for r, t_ns, request_id in moves:
        rows = rows_of.get(r)
        if rows is None:
            rows = rows_of[r] = np.flatnonzero(replica == r)
        row = int(rows[np.searchsorted(start_ns[rows], t_ns, side="right") - 1])
        out.setdefault(row, []).append(request_id)
    return out


def _step_name(prefill_tokens: int, decode_seqs: int) -> str:
    return "decode" if not prefill_tokens else "prefill" if not decode_seqs else "prefill+decode"


REJECTIONS_TID = 1_000_000  # below every lane: a replica holds fewer requests at once than this


def trace_events(result: Result, observer: TraceObserver) -> list[dict]:
    """Every event of the trace (metadata first, then in time order)."""
    rq = result.requests
    observer.end(result.summary["duration"], dict(zip(rq["request_id"].tolist(), rq["replica"].tolist(), strict=True)))
    replicas = result.scenario.cluster.fleet_size
    meta = []
    for r in range(replicas):
        meta += _meta(r + 1, None, f"replica {r}") + _meta(r + 1, 0, "steps")
    events = list(_step_events(result, observer))
    lanes = _lanes(observer.lives)
    named: set[tuple[int, int]] = set()
    for request_id, (replica, phases) in observer.lives.items():
        pid, tid = replica + 1, lanes[request_id] + 1
        if (pid, tid) not in named:
            named.add((pid, tid))
            meta += _meta(pid, tid, f"requests {tid}")
        events += [{"ph": "X", "pid": pid, "tid": tid, "name": phase, "ts": us(t0), "dur": us(t1 - t0),
                    "args": {"request_id": request_id, **(args or {})}} for phase, t0, t1, args in phases]
    rejected = rq[rq["status"] == "rejected"]
    if observer.window_end_ns is not None:
        rejected = rejected[rejected["request_id"] < observer.max_requests]
    for request_id, replica, t_s, reason in zip(rejected["request_id"].tolist(), rejected["replica"].tolist(),
                                                 rejected["arrival_s"].tolist(), rejected["reason"].tolist(), strict=True):
        pid = replica + 1 if replica >= 0 else replicas + 1  # Perfetto keeps pid 0 for the kernel's idle task
        if (pid, REJECTIONS_TID) not in named:
            named.add((pid, REJECTIONS_TID))
            if replica < 0:
                meta += _meta(pid, None, "cluster (turned away before routing)")
            meta += _meta(pid, REJECTIONS_TID, "rejections")
        events.append({"ph": "i", "s": "t", "pid": pid, "tid": REJECTIONS_TID, "name": "rejected",
                       "ts": us(to_ns(t_s)), "args": {"request_id": request_id, "reason": reason}})
    events.sort(key=lambda e: e["ts"])  # stable: each track stays in order
    return meta + events


def write_trace(path: Path, result: Result, observer: TraceObserver) -> None:
    """``trace.json``: the events, and what the run was (``otherData``)."""
    other = {"scenario": result.scenario.name, "mode": result.scenario.batching.mode,
             "requests": observer.num_requests, "max_requests": observer.max_requests,
             "window_end_s": None if observer.window_end_ns is None else observer.window_end_ns / NS_PER_S,
             "time_unit": "us"}
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"traceEvents": trace_events(result, observer), "displayTimeUnit": "ms", "otherData": other},
                  f, separators=(",", ":"), allow_nan=False, default=_plain)


def _plain(value):
    """NumPy scalars as JSON numbers; a NaN never gets here (json refuses it: allow_nan=False)."""
    if isinstance(value, np.generic):
        value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"non-finite value {value} in the trace")
        return value
    raise TypeError(f"{type(value).__name__} is not JSON")

"""The recorder: the default observer of a run, which keeps what the frames and the summary need.

It subscribes to the run's events like any :class:`~simbatch.observe.observers.Observer` (arrivals,
rejections, completions), and the engine hands it two things only it keeps: each step's row
(:meth:`Recorder.record_steps`, the step's :class:`StepShape`) and the waiting-queue changes.

- **Time-weighted state.** The number in system N(t) and in queue Nq(t) are integrated from the
  simulator's own state changes (arrival, admission, preemption, completion), never rebuilt from the
  request rows. L = (1/T) integral of N(t) dt can then be checked against lambda W computed from the
  rows: Little's law as an independent test of the bookkeeping.
- **Iteration runs.** Consecutive steps of one replica with the same shape (same pools, batch and
  token counts) and no idle time between them are one row with a count and their total duration in
  whole nanoseconds. Stepping one iteration at a time and advancing over a run in one go therefore
  record the same rows. The row's ``duration_s`` is its steps' mean: they last alike unless the step
  time grows with the context read (``device.kv_read_ms_per_1k_tokens``).
- **Per-request outcomes**, in flat arrays indexed by request id, so a million requests cost no
  million objects once they are done.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from simbatch.model.clock import NS_PER_S
from simbatch.model.request import Outcome, Request
from simbatch.observe.observers import Observer

_UNFINISHED, _FINISHED, _REJECTED = (int(o) for o in Outcome)  # plain ints for the hot paths

# Columns of the iterations frame, in order. Shape columns decide whether two steps are one run.
class StepShape(NamedTuple):
    """What a step is, all but when, where and how long: consecutive steps of one replica with equal
    shapes are one run, one row of the iterations frame (whose columns these are, with replica,
    start_s, num_steps, duration_s and the KV blocks)."""

    num_running: int  # after planning: vllm:num_requests_running
    num_waiting: int  # after planning: vllm:num_requests_waiting
    batch_size: int  # requests computing in the step
    decode_tokens: int
    prefill_tokens: int
    padded_tokens: int  # computed for nothing: idle slots and pad tokens (static batching)
    itl_tokens: int  # tokens sampled exactly one step after their request's previous one
    num_preempted: int
    swap_blocks: int


SHAPE_COLUMNS = StepShape._fields
_INDEX = {name: i for i, name in enumerate(SHAPE_COLUMNS)}


def replaced(shape: StepShape, field: str, value: int) -> StepShape:
    """``shape._replace(field=value)``, several times faster (the engine does it per request)."""
    i = _INDEX[field]
    return tuple.__new__(StepShape, (*shape[:i], value, *shape[i + 1:]))
RUN_COLUMNS = ("replica", "start_s", "num_steps", "duration_s", *SHAPE_COLUMNS, "kv_blocks_sum")
FLOAT_COLUMNS = frozenset({"start_s", "duration_s"})
# Sums over a run's steps can pass 2**31; every other count fits in 32 bits (a step's tokens, a pool).
WIDE_COLUMNS = frozenset({"num_steps", "kv_blocks_sum"})
_RUN_DTYPES = tuple(np.float64 if name in FLOAT_COLUMNS else np.int64 if name in WIDE_COLUMNS else np.int32
                    for name in RUN_COLUMNS)
_PACK_VALUES = 65_536 * len(RUN_COLUMNS)  # closed runs kept as Python values for this many rows, then packed


class _OpenRun:
    """The run of steps of one shape a replica is in, still growing."""

    __slots__ = ("replica", "start_s", "num_steps", "shape", "kv_blocks_sum", "busy_ns")

    def __init__(self, replica: int, start_s: float, num_steps: int, shape: StepShape, kv_blocks_sum: int,
                 busy_ns: int):
        self.replica, self.start_s, self.num_steps = replica, start_s, num_steps
        self.shape, self.kv_blocks_sum, self.busy_ns = shape, kv_blocks_sum, busy_ns


class Recorder(Observer):
    """Time-weighted state, iteration runs and per-request outcomes of one run (see the module)."""

    # Slots: the engine tells the recorder of every plan and request, and an instance dict of 30 keys is
    # read about half again as slowly.
    __slots__ = ("request_latency_s", "response_latency_s", "t_last", "n_system", "n_waiting", "area_system",
                 "area_waiting", "_open", "_rows", "_packed", "stall_gaps_s", "replica", "status", "reason",
                 "first_scheduled_s", "first_token_s", "finish_s", "num_preemptions", "num_cached_tokens", "columns",
                 "_column_items", "waiting_s", "generated_tokens", "arrived", "disaggregated", "decode_replica",
                 "decode_queue_s", "kv_transfer_s", "sent_s", "client_wait_s")

    def __init__(self, num_requests: int, num_replicas: int, *, columns: tuple[tuple[str, str], ...] = (),
                 disaggregated: bool = False, request_latency_s: float = 0.0, response_latency_s: float = 0.0):
        # The frontend's latencies (config.Frontend): the engine's times are the server's; the frames
        # turn them into the client's.
        self.request_latency_s, self.response_latency_s = request_latency_s, response_latency_s
        # Time-weighted number in system / waiting.
        self.t_last = 0.0
        self.n_system = 0
        self.n_waiting = 0
        self.area_system = 0.0
        self.area_waiting = 0.0
        # Iteration runs: one open run per replica, closed runs as rows.
        self._open: list[_OpenRun | None] = [None] * num_replicas
        # Closed runs: recent ones as plain values, older ones packed a block of rows at a time into
        # one array per column, of its final type, so millions of rows cost neither millions of objects
        # nor slow appends, and the frame's columns are the blocks' concatenations.
        self._rows: list[int | float] = []  # flat: RUN_COLUMNS values, row after row
        self._packed: list[list[np.ndarray]] = []
        self.stall_gaps_s: list[float] = []
        # Per-request outcomes.
        n = num_requests
        self.replica = np.full(n, -1, dtype=np.int32)
        self.status = np.full(n, _UNFINISHED, dtype=np.int8)  # Outcome codes
        self.reason = np.zeros(n, dtype=object)
        self.reason[:] = ""
        self.first_scheduled_s = np.full(n, math.nan)
        self.first_token_s = np.full(n, math.nan)
        self.finish_s = np.full(n, math.nan)
        self.num_preemptions = np.zeros(n, dtype=np.int32)
        self.num_cached_tokens = np.zeros(n, dtype=np.int32)
        # The serving features' per-request counters (simbatch.features: Feature.columns), by name. Kept
        # only in runs whose features declare them, as the disaggregated columns below: at a million
        # requests every column is megabytes a plain run would carry for nothing.
        self.columns = {name: np.zeros(n, dtype=dtype) for name, dtype in columns}
        self._column_items = tuple(self.columns.items())
        self.waiting_s = np.zeros(n)
        self.generated_tokens = np.zeros(n, dtype=np.int64)
        self.arrived = np.zeros(n, dtype=bool)
        # Set only in a disaggregated cluster (simbatch.engine.disaggregated): the decode replica, the
        # wait for room there, and the KV transfer's duration.
        self.disaggregated = disaggregated
        m = n if disaggregated else 0
        self.decode_replica = np.full(m, -1, dtype=np.int32)
        self.decode_queue_s = np.full(m, math.nan)
        self.kv_transfer_s = np.full(m, math.nan)
        # Set only with a client (simbatch.engine.client): when each request was sent, and how long it was held back.
        self.sent_s = np.full(n, math.nan)
        self.client_wait_s = np.zeros(n)

    # ---------------------------------------------------------------- time-weighted state
    def _advance(self, now: float) -> None:
        dt = now - self.t_last
        if dt > 0:
            self.area_system += self.n_system * dt
            self.area_waiting += self.n_waiting * dt
            self.t_last = now

    def arrival(self, t_s: float, request: Request) -> None:
        self._advance(t_s)
        self.arrived[request.request_id] = True
        self.n_system += 1
        self.n_waiting += 1

    def sent(self, request_id: int, now: float, client_wait_s: float) -> None:
        self.sent_s[request_id] = now
        self.client_wait_s[request_id] = client_wait_s

    def rejection(self, t_s: float, request_id: int, reason: str) -> None:
        self._advance(t_s)  # N(t) is unchanged; the run has seen an event at ``t_s`` (its duration)
        self.arrived[request_id] = True
        self.status[request_id] = _REJECTED
        self.reason[request_id] = reason

    def waiting_change(self, now: float, delta: int) -> None:
        if delta:
            self._advance(now)
            self.n_waiting += delta

    def transfer(self, t_s: float, replica: int, request: Request, duration_s: float) -> None:
        self.waiting_change(t_s, -1)  # held on its decode replica: out of WAITING, not yet running
        i = request.request_id
        self.kv_transfer_s[i] = duration_s
        self.decode_queue_s[i] = t_s - request.first_token_s

    def completion(self, t_s: float, requests: list[Request]) -> None:
        self._advance(t_s)
        self.n_system -= len(requests)
        for req in requests:
            self.status[req.request_id] = _FINISHED
            self._store(req)

    def _store(self, req: Request) -> None:
        i = req.request_id
        self.replica[i] = req.replica
        self.first_scheduled_s[i] = req.first_scheduled_s
        self.first_token_s[i] = req.first_token_s
        self.finish_s[i] = req.finish_s
        self.num_preemptions[i] = req.num_preemptions
        self.num_cached_tokens[i] = req.num_cached_tokens
        for name, column in self._column_items:
            column[i] = getattr(req, name)
        self.waiting_s[i] = req.waiting_s
        self.generated_tokens[i] = req.num_generated

    def unfinished(self, req: Request, end_s: float) -> None:
        """A request still in the system when the clock stopped; its waiting time runs to the end."""
        if req.status.name == "WAITING":
            req.waiting_s += end_s - req.waiting_since_s
        self._store(req)

    def close(self, end_s: float) -> None:
        self._advance(end_s)
        for replica, run in enumerate(self._open):
            if run is not None:
                self._close_run(run)
                self._open[replica] = None

    # ---------------------------------------------------------------- iteration runs
    def record_steps(self, replica: int, start_s: float, count: int, shape: StepShape, kv_blocks_sum: int,
                     contiguous: bool, busy_ns: int) -> None:
        """Record ``count`` consecutive steps of one shape, ``busy_ns`` long in all; ``contiguous``: no
        idle time since the last."""
        run = self._open[replica]
        if run is not None:
            if contiguous and run.shape == shape:
                run.num_steps += count
                run.kv_blocks_sum += kv_blocks_sum
                run.busy_ns += busy_ns
                return
            self._close_run(run)  # its row is taken: the object starts the next run
            run.start_s, run.num_steps, run.shape, run.kv_blocks_sum, run.busy_ns = \
                start_s, count, shape, kv_blocks_sum, busy_ns
            return
        self._open[replica] = _OpenRun(replica, start_s, count, shape, kv_blocks_sum, busy_ns)

    def _close_run(self, run: _OpenRun) -> None:
        """Append ``run`` to the rows, value by value in ``RUN_COLUMNS`` order (a flat list: no tuple per
        row); ``duration_s`` is the mean of its steps' durations (exact when they are equal: ``busy_ns``
        is a multiple of the count)."""
        rows = self._rows
        rows += (run.replica, run.start_s, run.num_steps, run.busy_ns / run.num_steps / NS_PER_S, *run.shape,
                 run.kv_blocks_sum)
        if len(rows) >= _PACK_VALUES:
            self._pack()

    def _pack(self) -> None:
        # Through float64, where the integers are exact (below 2**53), then each column to its type.
        width = len(RUN_COLUMNS)
        block = np.fromiter(self._rows, np.float64, len(self._rows)).reshape(-1, width)
        self._packed.append([block[:, i].astype(dtype) for i, dtype in enumerate(_RUN_DTYPES)])
        self._rows = []

    def take_runs(self) -> dict[str, np.ndarray]:
        """Every closed run, column by column (call after ``close``), handing the rows over: the
        recorder keeps none, so at the end of a long run the rows and the frame never both stand whole.

        Counts are int32 (sums over a run's steps int64), times float64.
        """
        self._pack()
        blocks, self._packed = self._packed, []
        out = {}
        for i, name in enumerate(RUN_COLUMNS):
            out[name] = np.concatenate([block[i] for block in blocks])
            for block in blocks:  # each column's blocks dropped once joined: the frame grows as they go
                block[i] = None
        return out

"""From a scenario to the full list of requests, as columns, before the simulation starts.

The workload is drawn up front and independently of everything downstream, from its own seeded
streams (:mod:`simbatch.model.streams`): arrival times from one, class assignment from another, each
class's prompt and output lengths from streams of their own. So two runs that differ only in
batching mode, scheduler policy or device see request for request the same traffic (common random
numbers), and a difference in their metrics is the mode's doing, not the dice's.

The split goes further than mode changes: adding a class or editing one class's lengths leaves the
arrival times and the other classes' lengths untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simbatch.config import RequestClass, Scenario
from simbatch.config.problems import Problem, ScenarioError
from simbatch.model import streams
from simbatch.model.clock import MAX_ARRIVAL_S, snap_s
from simbatch.workload.adapters import adapter_ids
from simbatch.workload.arrivals import arrival_times
from simbatch.workload.lengths import paired, sample_lengths
from simbatch.workload.prefix import OWN_STREAM, apply_prefix, trace_prefix
from simbatch.workload.rate_curve import rate_function, thinned_arrivals_s
from simbatch.workload.shapes import PAIRED
from simbatch.workload.trace import BlockHashes, load_trace


@dataclass(frozen=True)
class WorkloadArrays:
    """Every request of a run, one row per index, in arrival order.

    The arrays are made read-only: one workload is shared by every run it is compared across, and a
    scheduler that wrote into it would corrupt the comparison silently.
    """

    arrival_s: np.ndarray  # float64, nondecreasing
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    tenant: np.ndarray  # int32 codes into tenant_names
    priority: np.ndarray  # int64, lower is served first under the priority policy
    tenant_names: tuple[str, ...]
    session: np.ndarray | None = None  # int64 session ids; None: each request its own, 0..n-1
    # What prompts share (simbatch.workload.prefix): None, nothing.
    prefix_stream: np.ndarray | None = None  # int64 conversation ids, or OWN_STREAM
    shared_prefix_tokens: np.ndarray | None = None  # int64 tokens of the shared system prompt, or 0
    hashes: BlockHashes | None = None  # a trace's content ids per block of each prompt (Mooncake's hash_ids)
    adapter: np.ndarray | None = None  # int32 LoRA adapter ids, -1 the base model (simbatch.workload.adapters)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if self.session is None:
            object.__setattr__(self, "session", np.arange(n, dtype=np.int64))
        # Without prefixes, one value seen n times: a broadcast view, no memory per request.
        if self.prefix_stream is None:
            object.__setattr__(self, "prefix_stream", np.broadcast_to(np.int64(OWN_STREAM), (n,)))
        if self.shared_prefix_tokens is None:
            object.__setattr__(self, "shared_prefix_tokens", np.broadcast_to(np.int64(0), (n,)))
        columns = (self.arrival_s, self.prompt_tokens, self.output_tokens, self.tenant, self.priority,
                   self.session, self.prefix_stream, self.shared_prefix_tokens,
                   *(() if self.adapter is None else (self.adapter,)))
        if len({len(c) for c in columns}) != 1 or self.hashes is not None and len(self.hashes) != n:
            raise ValueError(f"workload columns differ in length: {[len(c) for c in columns]}")
        for c in columns:
            c.flags.writeable = False

    def __len__(self) -> int:
        return len(self.arrival_s)


def _classes(scenario: Scenario) -> list[RequestClass]:
    """The scenario's request classes; one anonymous ``default`` class when it lists none."""
    return scenario.workload.classes or [RequestClass(name="default")]


def _lengths_by_class(scenario: Scenario, classes: list[RequestClass], class_idx: np.ndarray,
                      stream: int, field: str) -> np.ndarray:
    """Per-request lengths, each from its class's distribution (``field``: prompt or output tokens).

    Each class draws a length for every request, on its own sub-stream, and keeps those of its own
    requests. That costs a few wasted draws, and buys independence: request j, if it is in class i,
    gets draw j of stream (field, i) whatever the other classes are or how large their shares.
    """
    n = len(class_idx)
    out = np.empty(n, dtype=np.int64)
    for i, cls in enumerate(classes):
        mine = class_idx == i
        if not mine.any():
            continue
        dist = _length_dist(scenario, cls, field)
        where = f"workload.classes.{i}.{field}" if getattr(cls, field) is not None else f"workload.{field}"
        # Outputs resampled from the prompts' file take the prompts' rows: the prompts' stream draws them.
        # A paired dataset's rows (shapes.PAIRED) come from a stream of their own, for prompts and outputs alike.
        pairs = field == "output_tokens" and paired(_length_dist(scenario, cls, "prompt_tokens"), dist, scenario)
        rows = streams.DATASET_ROWS if getattr(dist, "dist", None) in PAIRED else \
            streams.PROMPT_TOKENS if pairs else stream
        rng = streams.rng(scenario.seed, rows, i)
        draws = sample_lengths(dist, n, rng, scenario, where=where)
        out[mine] = draws[mine]
    return out


def _length_dist(scenario: Scenario, cls: RequestClass, field: str):
    """A class's own ``field`` distribution, or the workload's."""
    own = getattr(cls, field)
    return own if own is not None else getattr(scenario.workload, field)


def generate(scenario: Scenario) -> WorkloadArrays:
    """Draw (or replay) every request of ``scenario``'s workload.

    With ``workload.trace`` the trace supplies arrival times and lengths, and classes only assign
    tenants and priorities; otherwise arrivals follow ``workload.arrival`` and lengths each
    class's distributions (a class's own ``prompt_tokens``/``output_tokens`` override the workload's).
    """
    wl, seed = scenario.workload, scenario.seed
    replay = None
    if wl.trace is not None:
        replay = load_trace(wl.trace, scenario, wl.num_requests, wl.duration_s)
        arrival_s, prompt_tokens, output_tokens = replay.arrival_s, replay.prompt_tokens, replay.output_tokens
    elif wl.closed_loop is not None:
        arrival_s = np.zeros(wl.num_requests)  # users send when ready (simbatch.engine.client); nothing is scheduled
    elif wl.arrival.rate_curve is not None:
        arrival_s = thinned_arrivals_s(rate_function(wl.arrival.rate_curve, scenario),
                                       streams.rng(seed, streams.ARRIVALS), wl.num_requests, wl.duration_s)
    else:
        arrival_s = arrival_times(wl.arrival, streams.rng(seed, streams.ARRIVALS), wl.num_requests,
                                  wl.duration_s)
        if len(arrival_s) and arrival_s[-1] > MAX_ARRIVAL_S:
            raise ScenarioError([Problem("workload.arrival.rate", "", f"rate {wl.arrival.rate:g} requests/s puts the "
                                         f"last arrival at {arrival_s[-1]:.3g} s, past the {MAX_ARRIVAL_S:.2g} s the "
                                         "simulation clock holds (int64 nanoseconds); raise the rate or send fewer "
                                         "requests")])

    classes = _classes(scenario)
    shares = np.array([c.share for c in classes], dtype=np.float64)
    class_idx = streams.rng(seed, streams.CLASSES).choice(len(classes), size=len(arrival_s),
                                                          p=shares / shares.sum())
    if wl.trace is None:
        prompt_tokens = _lengths_by_class(scenario, classes, class_idx, streams.PROMPT_TOKENS, "prompt_tokens")
        output_tokens = _lengths_by_class(scenario, classes, class_idx, streams.OUTPUT_TOKENS, "output_tokens")

    # Classes sharing a name are one tenant (e.g. one customer's batch and interactive traffic at two
    # priorities), so tenants are coded by name in order of first listing.
    tenant_names = tuple(dict.fromkeys(c.name for c in classes))
    tenant_of_class = np.array([tenant_names.index(c.name) for c in classes], dtype=np.int32)
    priority_of_class = np.array([c.priority for c in classes], dtype=np.int64)
    tenant, priority = tenant_of_class[class_idx], priority_of_class[class_idx]
    if replay is not None and replay.tenant is not None:  # a trace's own tenants, in order of first arrival
        codes = {name: i for i, name in enumerate(dict.fromkeys(replay.tenant.tolist()))}
        tenant_names = tuple(codes)
        tenant = np.fromiter((codes[t] for t in replay.tenant), dtype=np.int32, count=len(replay.tenant))
    if replay is not None and replay.priority is not None:
        priority = replay.priority
    # Sessions (who sends the request, for session-affinity routing) are uniform over
    # num_sessions, from their own stream; without num_sessions every request is a session.
    session = None if wl.num_sessions is None else \
        streams.rng(seed, streams.SESSIONS).integers(wl.num_sessions, size=len(arrival_s), dtype=np.int64)
    prefix_stream = shared_prefix_tokens = hashes = None
    if replay is not None:
        # What the trace says its prompts share: a conversation's turns, a re-sent prompt, or block ids.
        shared_by = replay.session if replay.session is not None else replay.prompt_id
        if replay.session is not None and session is None:
            # A row without a conversation is a session of its own, numbered after the conversations.
            own = replay.session < 0
            session = replay.session.copy()
            session[own] = session.max(initial=-1) + 1 + np.arange(int(own.sum()))
        hashes = replay.hashes
        if shared_by is not None or wl.prefix is not None:
            prefix_stream, shared_prefix_tokens = trace_prefix(
                wl.prefix, prompt_tokens, shared_by, streams.rng(seed, streams.SHARED_PREFIX))
    elif wl.prefix is not None:
        sessions = session if session is not None else np.arange(len(arrival_s), dtype=np.int64)
        prompt_tokens, prefix_stream, shared_prefix_tokens = apply_prefix(
            wl.prefix, prompt_tokens, output_tokens, sessions, streams.rng(seed, streams.SHARED_PREFIX))
    adapter = replay.adapter if replay is not None and replay.adapter is not None else None if wl.adapters is None \
        else adapter_ids(wl.adapters, len(arrival_s), streams.rng(seed, streams.ADAPTERS))
    return WorkloadArrays(
        arrival_s=snap_s(arrival_s),  # the clock's grid: what the engine sees is what the frames report
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        tenant=tenant,
        priority=priority,
        tenant_names=tenant_names,
        session=session,
        prefix_stream=prefix_stream,
        shared_prefix_tokens=shared_prefix_tokens,
        hashes=hashes,
        adapter=adapter,
    )

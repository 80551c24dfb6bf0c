"""The run-size guard: refuse, before anything is drawn, a run too large for the machine.

One mistyped exponent (``num_requests: 1000000000``, ``duration_s: 1e12``, ``replicas: 100000000``)
must cost the user one line, not the machine's memory. Every command that draws a workload first
estimates what the run will hold in memory,

    bytes = requests x BYTES_PER_REQUEST + replicas x BYTES_PER_REPLICA

and refuses above ``MAX_BYTES`` with the estimate and how to proceed: a smaller setting, or
``--force``. A sweep is also refused above ``MAX_RUNS`` runs (grid points x replications).

The two constants are measured, not guessed: the peak memory Python allocates during
``simulate`` (tracemalloc), per request and per replica, with a margin; ``tests/test_guard.py``
measures them again and fails if a change to the simulator outgrows them. Below the limit every
step of a run is a numpy call over at most a few million elements, well under a second, so Ctrl-C
is honoured promptly at any stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from simbatch.config import Scenario

BYTES_PER_REQUEST = 2_000
"""Peak memory of a simulated request: its workload row, engine state, recorder rows and frames."""
BYTES_PER_REPLICA = 10_000
"""Peak memory of an engine: its scenario copy, scheduler, KV pool, SimPy process and recorder."""
MAX_BYTES = 4e9
"""The largest run started without ``--force``: 4 GB, about two million requests."""
MAX_RUNS = 10_000
"""The most runs (grid points x replications) a sweep starts without ``--force``."""
_MAX_TRACE_SCAN_BYTES = 1 << 30  # counting a trace's lines beyond this is itself too slow: assume it is large


class TooLarge(ValueError):
    """A run or sweep above the guard's limits; the message gives the estimate and how to proceed."""


@dataclass(frozen=True)
class Size:
    """What a run will hold: expected requests, replicas, and the memory estimate from them."""

    requests: float
    replicas: int

    @property
    def bytes(self) -> float:
        return self.requests * BYTES_PER_REQUEST + self.replicas * BYTES_PER_REPLICA


def _trace_rows(scenario: Scenario) -> float:
    """Data rows in the trace file (lines minus the header), counted in its decompressed text without
    parsing (a compressed trace of 10 million rows can be 90 KB on disk); infinite past 1 GiB of text."""
    from simbatch.workload.csvfile import text_size  # the trace reader's: imported when there is a trace

    _, lines = text_size(scenario.resolve(scenario.workload.trace.path), _MAX_TRACE_SCAN_BYTES)
    return max(lines - 1, 0)


def expected_requests(scenario: Scenario) -> float:
    """How many requests the workload draws: the trace's rows, else num_requests, else rate x duration_s.

    With both num_requests and duration_s, num_requests arrival times are drawn before the duration
    cuts them, so num_requests is what the memory must hold.
    """
    wl = scenario.workload
    if wl.trace is not None:
        rows = _trace_rows(scenario)
        return rows if wl.num_requests is None else min(rows, wl.num_requests)
    if wl.num_requests is not None:
        return float(wl.num_requests)
    return wl.arrival.rate * wl.duration_s


def size(scenario: Scenario) -> Size:
    return Size(expected_requests(scenario), scenario.cluster.fleet_size)


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n < 1e15 else f"{n:.1e} bytes"


def _count(n: float) -> str:
    return f"{n:,.0f}" if n < 1e15 else f"{n:.1e}"


def check_run(scenario: Scenario, force: bool = False) -> Size:
    """The run's size; TooLarge when its memory estimate is above MAX_BYTES and ``force`` is off."""
    s = size(scenario)
    if s.bytes > MAX_BYTES and not force:
        raise TooLarge(
            f"run too large: about {_count(s.requests)} requests x {_count(s.replicas)} "
            f"replica{'s' * (s.replicas > 1)} needs about {_gb(s.bytes)} of memory (the limit is "
            f"{_gb(MAX_BYTES)}); lower workload.num_requests or duration_s (or cluster.replicas), "
            "or pass --force to run it anyway")
    return s


def check_sweep(points: int, replications: int, force: bool = False) -> None:
    """TooLarge when points x replications is above MAX_RUNS and ``force`` is off."""
    runs = points * replications
    if runs > MAX_RUNS and not force:
        raise TooLarge(f"sweep too large: {points:,} points x {replications} replications = {runs:,} runs "
                       f"(the limit is {MAX_RUNS:,}); use fewer values (a log range: log:1:1000:10) or "
                       "replications, or pass --force to run it anyway")

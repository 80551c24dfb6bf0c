"""Trace replay: real arrival times and token counts from a CSV file, one row per request.

The default column names are those of the public Azure LLM inference traces,

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,374,44

so those files replay as downloaded. Replaying a trace keeps what synthetic traffic smooths away:
bursts, diurnal drift, and the correlation between a request's prompt and output lengths.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from simbatch.config import Scenario, Trace
from simbatch.model.clock import MAX_ARRIVAL_S
from simbatch.workload import csvfile

SAMPLE_TRACE = Path(__file__).resolve().parent.parent / "data" / "sample_trace.csv"
"""A small synthetic trace in the Azure format, shipped with the package (see ``simbatch/data``)."""

_WHERE = "workload.trace"


class Replay(NamedTuple):
    """The columns a trace supplies, one row per request in arrival order."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    priority: np.ndarray | None  # int64, from ``priority_column``
    tenant: np.ndarray | None  # tenant names (str), from ``tenant_column``


def _timestamps_s(raw: pd.Series, path: Path) -> np.ndarray:
    """Each row's time, s: numbers as seconds, or ISO 8601 date-times as seconds from midnight UTC of
    the earliest row's day.

    The column's kind is decided by its majority, so one garbled row is reported as such instead of
    flipping the whole column to the other kind and failing on every row.
    """
    text = raw.str.strip()
    seconds = pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    if np.isfinite(seconds).sum() * 2 >= len(seconds):
        bad, expected = ~np.isfinite(seconds), "a time in seconds"
    else:
        # utc=True accepts stamps with differing UTC offsets and reads naive ones as UTC, so the gaps
        # between rows come out right either way.
        stamps = pd.to_datetime(text, errors="coerce", format="ISO8601", utc=True)
        seconds = (stamps - stamps.min().normalize()).dt.total_seconds().to_numpy(dtype=np.float64, na_value=np.nan)
        bad, expected = np.isnan(seconds), "a date-time like 2023-11-16 18:15:46.6805900"
    if bad.any():
        line, value, tail = csvfile.first_bad(raw, bad)
        raise csvfile.fail(path, _WHERE, f"column {raw.name!r} has {value!r}, expected {expected}{tail}; "
                                         "fix or delete that row", line)
    return seconds


def _check_horizon(stamps: pd.Series, offset_s: np.ndarray, trace: Trace, path: Path) -> None:
    """Refuse a row whose arrival (offset from the origin, times ``time_scale``) the clock cannot hold
    (:data:`~simbatch.model.clock.MAX_ARRIVAL_S`), saying which setting brought it there."""
    with np.errstate(over="ignore", invalid="ignore"):
        arrival_s = offset_s * trace.time_scale
        late = ~(arrival_s <= MAX_ARRIVAL_S)
    if not late.any():
        return
    line, value, tail = csvfile.first_bad(stamps, late)
    at = arrival_s[np.flatnonzero(late)[0]]
    origin = "" if trace.keep_time_origin else " after the first row's"
    scaled = "" if trace.time_scale == 1 else f" (times time_scale {trace.time_scale:g})"
    if (offset_s <= MAX_ARRIVAL_S).all():
        fix = "lower time_scale"
    elif trace.keep_time_origin and np.nanmax(offset_s) > 1e11:
        fix = "epoch milliseconds? set time_scale: 0.001 (or keep_time_origin: false)"
    else:
        fix = "fix or delete that row"
    when = f"{at:.3g} s" if np.isfinite(at) else "no finite time"
    raise csvfile.fail(path, _WHERE, f"column {stamps.name!r} has {value!r}{tail}: an arrival at {when}{origin}"
                                     f"{scaled}, past the {MAX_ARRIVAL_S:.2g} s the simulation clock holds (int64 "
                                     f"nanoseconds); {fix}", line)


def load_trace(trace: Trace, scenario: Scenario, num_requests: int | None,
               duration_s: float | None = None) -> Replay:
    """The requests replayed from ``trace.path``.

    Arrival times are offsets from the earliest row, times ``trace.time_scale``, so the first
    request arrives at t = 0; with ``trace.keep_time_origin`` they are the trace's own times (times
    ``time_scale``). Rows are sorted by time first (a stable sort, so rows sharing a
    timestamp keep their file order): logs merged from several servers are often slightly out of
    order, and that is no reason to refuse them. ``num_requests`` then keeps the first that many
    arrivals and ``duration_s`` those arriving before it (in scaled time). Every row is checked,
    kept or not, so a damaged file is found on its first use. A bad row raises
    :class:`~simbatch.config.loading.ScenarioError` naming its line.
    """
    path = scenario.resolve(trace.path)
    frame = csvfile.read_table(path, _WHERE)
    stamps = csvfile.column(frame, trace.timestamp_column, path, f"{_WHERE}.timestamp_column")
    prompts = csvfile.column(frame, trace.prompt_column, path, f"{_WHERE}.prompt_column")
    outputs = csvfile.column(frame, trace.output_column, path, f"{_WHERE}.output_column")
    fix = "fix or delete that row"
    prompt_tokens = csvfile.positive_ints(prompts, path, _WHERE, fix)
    output_tokens = csvfile.positive_ints(outputs, path, _WHERE, fix)
    time_s = _timestamps_s(stamps, path)
    priority = tenant = None
    if trace.priority_column is not None:
        raw = csvfile.column(frame, trace.priority_column, path, f"{_WHERE}.priority_column")
        priority = csvfile.whole_numbers(raw, path, _WHERE, fix, what="a whole-number priority")
    if trace.tenant_column is not None:
        raw = csvfile.column(frame, trace.tenant_column, path, f"{_WHERE}.tenant_column")
        tenant = raw.str.strip().to_numpy(dtype=object)
        if (tenant == "").any():
            line, _, tail = csvfile.first_bad(raw, tenant == "")
            raise csvfile.fail(path, _WHERE, f"column {raw.name!r} is empty, expected a tenant name{tail}; {fix}",
                               line)
    if trace.keep_time_origin and time_s.min() < 0:
        line, value, tail = csvfile.first_bad(stamps, time_s < 0)
        raise csvfile.fail(path, _WHERE, f"column {stamps.name!r} has {value!r}, a negative time, which "
                                         f"keep_time_origin cannot keep{tail}; set keep_time_origin to false", line)

    order = np.argsort(time_s, kind="stable")
    origin = 0.0 if trace.keep_time_origin else time_s[order[0]]
    _check_horizon(stamps, time_s - origin, trace, path)
    order = order[:num_requests]
    arrival_s = (time_s[order] - origin) * trace.time_scale
    keep = len(arrival_s) if duration_s is None else np.searchsorted(arrival_s, duration_s, side="left")
    rows = order[:keep]
    return Replay(arrival_s[:keep], prompt_tokens[rows], output_tokens[rows],
                  None if priority is None else priority[rows], None if tenant is None else tenant[rows])

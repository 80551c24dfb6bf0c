"""The Chrome Trace Event format, as far as simbatch's trace uses it, checked field by field.

Written from the format's specification (the "Trace Event Format" document that chrome://tracing and
Perfetto read): a JSON object with a ``traceEvents`` list; every event has a phase ``ph``, a process
``pid`` and a ``name``; then, per phase:

- ``X`` (complete slice): ``ts`` and ``dur`` in microseconds, ``dur`` >= 0, a thread ``tid``;
- ``C`` (counter): ``ts``, and ``args`` mapping series names to numbers;
- ``i`` (instant): ``ts``, a ``tid``, and a scope ``s`` of ``g``, ``p`` or ``t``;
- ``M`` (metadata): one of the names below, with its ``args``.

Beyond the schema, what a viewer relies on: on each track (a thread for slices and instants, a
process and name for counters) timestamps never go back, and complete slices of one thread never
overlap (Perfetto nests overlapping slices and would draw a step inside another).
"""

from __future__ import annotations

from collections import defaultdict
from numbers import Real

METADATA = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
            "thread_sort_index": "sort_index"}
REQUIRED = {"X": ("name", "pid", "tid", "ts", "dur"), "C": ("name", "pid", "ts", "args"),
            "i": ("name", "pid", "tid", "ts", "s"), "M": ("name", "pid", "args")}


def _number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _ns(us: float) -> int:
    """Microseconds with up to three decimals, as whole nanoseconds (compared exactly)."""
    return round(us * 1000)


def check_trace(doc: dict) -> None:
    """Raise AssertionError naming the first event that breaks the format."""
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list), "no traceEvents list"
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns"), "displayTimeUnit must be ms or ns"
    last_ts: dict[tuple, int] = {}
    slice_end: dict[tuple, int] = {}
    for i, e in enumerate(doc["traceEvents"]):
        ph = e.get("ph")
        assert ph in REQUIRED, f"event {i}: unknown phase {ph!r}"
        missing = [k for k in REQUIRED[ph] if k not in e]
        assert not missing, f"event {i} ({ph}): missing {missing}"
        assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int), f"event {i}: pid/tid not integers"
        assert isinstance(e["name"], str) and e["name"], f"event {i}: empty name"
        if ph == "M":
            key = METADATA.get(e["name"])
            assert key is not None and key in e["args"], f"event {i}: metadata {e['name']!r} without args.{key}"
            continue
        assert _number(e["ts"]) and e["ts"] >= 0, f"event {i}: ts {e['ts']!r} is not a time in us"
        ts = _ns(e["ts"])
        track = (e["pid"], "counter", e["name"]) if ph == "C" else (e["pid"], e["tid"])
        assert ts >= last_ts.get(track, 0), f"event {i}: ts goes back on track {track}"
        last_ts[track] = ts
        if ph == "X":
            assert _number(e["dur"]) and e["dur"] >= 0, f"event {i}: dur {e['dur']!r}"
            assert ts >= slice_end.get(track, 0), f"event {i}: slice overlaps the previous one on track {track}"
            slice_end[track] = ts + _ns(e["dur"])
        elif ph == "C":
            assert e["args"] and all(_number(v) for v in e["args"].values()), f"event {i}: counter args not numbers"
        else:
            assert e["s"] in ("g", "p", "t"), f"event {i}: instant scope {e['s']!r}"


def tracks(doc: dict) -> dict[tuple, list[dict]]:
    """Slices and instants by (pid, tid), in file order."""
    out = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] in ("X", "i"):
            out[e["pid"], e["tid"]].append(e)
    return out

"""trace.json: a valid Chrome trace whose steps, requests and preemptions are the frames', in either engine."""

from __future__ import annotations

import copy
import itertools
import json
from collections import Counter
from types import SimpleNamespace

import pytest
from builders import changed
from test_cli import invoke
from trace_schema import check_trace, tracks

from simbatch import Observer, simulate
from simbatch.config import Scenario
from simbatch.model.clock import NS_PER_S
from simbatch.model.cost import StepRun
from simbatch.observe.observers import Run
from simbatch.observe.perfetto import PHASES, TraceObserver, trace_events

# Two replicas, a small cache (preemptions), a short queue and a cluster cap (rejections of both
# kinds), and a clock stop that cuts requests and a step short.
BUSY = {
    "workload": {"num_requests": 120, "arrival": {"rate": 40.0},
                 "prompt_tokens": {"dist": "uniform", "low": 4, "high": 60},
                 "output_tokens": {"dist": "exponential", "mean": 30, "max": 200}},
    "kv_cache": {"block_size": 4, "num_blocks": 160, "swap_blocks": 64},
    "batching": {"max_num_seqs": 8, "max_num_batched_tokens": 64, "enable_chunked_prefill": True,
                 "long_prefill_token_threshold": 24},
    "scheduler": {"max_waiting": 20},
    "cluster": {"replicas": 2, "router": "least_outstanding", "max_in_flight": 34},
    "sim": {"max_time_s": 4.0},
}


def traced(data: dict, max_requests: int = 10_000):
    scenario = Scenario.model_validate(data)
    observer = TraceObserver(scenario, max_requests)
    result = simulate(scenario, observers=[observer])
    doc = {"traceEvents": trace_events(result, observer)}
    check_trace(json.loads(json.dumps(doc)))
    return result, observer, doc


def variant(fast_forward: bool, **changes) -> dict:
    return changed(BUSY, sim__fast_forward=fast_forward, **changes)


CASES = {
    "recompute": {},
    "swap": {"scheduler__preemption": "swap"},
    "static": {"batching__mode": "static", "batching__max_wait_ms": 50.0},
    "client": {"workload__max_concurrency": 12},  # sends at completions: the engines plan after them
    # Admitted with part of the prompt cached: the prefill computes the rest.
    "prefix": {"kv_cache__enable_prefix_caching": True, "workload__prefix": {"shared_tokens": 24}},
}


@pytest.mark.parametrize("fast_forward", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_the_trace_counts_what_the_frames_count(case, fast_forward):
    result, _, doc = traced(variant(fast_forward, **CASES[case]))
    rq, it, summary = result.requests, result.iterations, result.summary
    # Replica by replica, in time order, as the iterations frame is.
    steps = sorted((e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == 0), key=lambda e: e["pid"])
    assert sum(e["args"]["count"] for e in steps) == summary["num_steps"] == it["num_steps"].sum()
    preempted = Counter(i for e in steps for i in e["args"]["preempted_ids"])
    assert preempted == Counter({r: n for r, n in zip(rq["request_id"], rq["num_preemptions"], strict=True) if n})
    assert preempted.total() == summary["num_preemptions"] == (it["num_preempted"] * it["num_steps"]).sum()
    if case not in ("static", "client"):
        assert summary["num_preemptions"] > 0 and summary["rejected"] > 0 and summary["unfinished"] > 0
    # Microseconds, row by row: each run of steps is one slice of count x step.
    assert [e["ts"] for e in steps] == pytest.approx((it["start_s"] * 1e6).tolist(), abs=1e-6)
    assert [e["dur"] for e in steps] == pytest.approx((it["num_steps"] * it["duration_s"] * 1e6).tolist(), abs=1e-6)
    assert [(e["args"]["batch_size"], e["args"]["prefill_tokens"], e["args"]["decode_seqs"]) for e in steps] == \
        list(zip(it["batch_size"], it["prefill_tokens"], it["decode_tokens"], strict=True))
    rejected = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert sorted(e["args"]["request_id"] for e in rejected) == sorted(rq.loc[rq["status"] == "rejected", "request_id"])


@pytest.mark.parametrize("fast_forward", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_each_request_lives_its_phases_at_the_frames_times(case, fast_forward):
    result, _, doc = traced(variant(fast_forward, **CASES[case]))
    lives: dict[int, list[dict]] = {}
    for (_pid, tid), events in tracks(doc).items():
        if tid:
            for e in events:
                if e["ph"] == "X":
                    lives.setdefault(e["args"]["request_id"], []).append(e)
    admitted = result.requests[result.requests["status"] != "rejected"]
    assert sorted(lives) == sorted(admitted["request_id"])
    end_us = result.summary["duration"] * 1e6
    for row in admitted.itertuples():
        slices = lives[row.request_id]
        names = [e["name"] for e in slices]
        assert set(names) <= set(PHASES) and names[0] == "queued"
        assert all(a["ts"] + a["dur"] == pytest.approx(b["ts"], abs=1e-6) for a, b in itertools.pairwise(slices))
        assert slices[0]["ts"] == pytest.approx(row.arrival_s * 1e6, abs=1e-3)
        if row.first_scheduled_s == row.first_scheduled_s:
            assert slices[1]["ts"] == pytest.approx(row.first_scheduled_s * 1e6, abs=1e-6)
        if row.first_token_s == row.first_token_s:
            assert next(e["ts"] for e in slices if e["name"] == "decode") == pytest.approx(row.first_token_s * 1e6, abs=1e-6)
        else:
            assert "decode" not in names
        last = slices[-1]["ts"] + slices[-1]["dur"]
        assert last == pytest.approx(row.finish_s * 1e6 if row.status == "finished" else end_us, abs=1e-6)
        assert names.count("preempted") == row.num_preemptions


def test_the_window_caps_the_trace_and_says_so():
    full_result, full, _ = traced(variant(True))
    assert full.notice is None
    result, observer, doc = traced(variant(True), max_requests=40)
    rq = result.requests
    window_end_us = rq.loc[rq["request_id"] == 40, "arrival_s"].item() * 1e6
    assert observer.notice.startswith("trace.json covers the first 40 of 120 requests")
    ids = {e["args"]["request_id"] for e in doc["traceEvents"] if e["ph"] in ("X", "i") and e["tid"]}
    assert ids == set(range(40))
    steps = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == 0]
    assert steps and all(e["ts"] < window_end_us for e in steps)
    assert len(steps) == (result.iterations["start_s"] * 1e6 < window_end_us).sum() < len(result.iterations)


@pytest.mark.parametrize("broken, words", [
    (lambda ev: ev[0].pop("ts"), "missing ['ts']"),
    (lambda ev: ev[1].update(ts=ev[0]["ts"] + ev[0]["dur"] / 2), "overlaps"),
    (lambda ev: ev[1].update(ts=ev[0]["ts"] - 1, dur=0), "goes back"),
    (lambda ev: ev[2].update(args={"running": "3"}), "not numbers"),
    (lambda ev: ev[0].update(ph="B"), "unknown phase"),
])
def test_the_schema_check_catches_what_viewers_trip_on(broken, words):
    events = [{"ph": "X", "pid": 1, "tid": 0, "name": "decode", "ts": 10.0, "dur": 5.0},
              {"ph": "X", "pid": 1, "tid": 0, "name": "decode", "ts": 15.0, "dur": 5.0},
              {"ph": "C", "pid": 1, "name": "requests", "ts": 10.0, "args": {"running": 3}}]
    check_trace({"traceEvents": copy.deepcopy(events)})
    broken(events)
    with pytest.raises(AssertionError, match=words.replace("[", r"\[").replace("]", r"\]")):
        check_trace({"traceEvents": events})


def test_run_trace_writes_trace_json(tmp_path):
    from test_cli import SCENARIOS

    out = tmp_path / "r"
    result = invoke("run", SCENARIOS / "heavy_tail.yaml", "--set", "workload.num_requests=60", "--out", out,
                    "--no-plots", "--trace-max-requests", "50")
    assert result.exit_code == 0, result.output
    assert "trace.json covers the first 50 of 60 requests" in result.stdout
    doc = json.loads((out / "trace.json").read_text())
    check_trace(doc)
    assert doc["otherData"]["window_end_s"] > 0


def test_a_bad_trace_cap_is_one_line_and_writes_nothing(tmp_path):
    from test_cli import SCENARIOS

    out = tmp_path / "r"
    result = invoke("run", SCENARIOS / "heavy_tail.yaml", "--out", out, "--trace-max-requests", "0")
    assert result.exit_code == 2
    assert result.stderr == "--trace-max-requests 0: must be at least 1, e.g. --trace-max-requests 10000\n"
    assert not out.exists()


def test_once_the_windows_requests_have_left_the_observer_does_nothing():
    _, observer, _ = traced(variant(True, sim__max_time_s=None), max_requests=10)

    class Untouchable:
        @property
        def slices(self):
            raise AssertionError("the observer read a step after its window")

        scheduled = slices

    observer.step(0, 100.0, 0.01, Untouchable(), True)
    observer.run(0, Run(100 * NS_PER_S, StepRun(10_000_000, 0, 0), 0, 5), Untouchable())
    assert sorted(observer.lives) == list(range(10))


def test_a_prefill_finishing_inside_a_run_of_steps_turns_to_decode_at_its_steps_end():
    from simbatch.model.request import Request

    observer = TraceObserver(Scenario.model_validate(BUSY))
    req = Request(0, 0.0, prompt_tokens=4, output_tokens=10, replica=0)
    observer.arrival(0.0, req)
    observer.admission(1.0, 0, req)
    plan = SimpleNamespace(slices=[(req, 2)])
    observer.run(0, Run(NS_PER_S, StepRun(NS_PER_S // 2, 0, 0), 0, 3), plan)  # 2 + 2 tokens: done after step 2
    observer.completion(3.0, [req])
    ns = NS_PER_S
    assert [phase[:3] for phase in observer.lives[0][1]] == [("queued", 0, ns), ("prefill", ns, 2 * ns),
                                                            ("decode", 2 * ns, 3 * ns)]


class Moves(Observer):
    """The admission and preemption events, as the engine tells them."""

    def __init__(self):
        self.admitted, self.preempted = [], []

    def admission(self, t_s, replica, request):
        self.admitted.append((replica, round(t_s * NS_PER_S), request.request_id))

    def preemption(self, t_s, replica, request, swapped, kv_blocks, computed_tokens):
        self.preempted.append((replica, round(t_s * NS_PER_S), request.request_id, swapped, kv_blocks, computed_tokens))


@pytest.mark.parametrize("fast_forward", [False, True])
@pytest.mark.parametrize("case", ["recompute", "swap"])
def test_the_preempted_slices_and_ids_are_the_preemption_events(case, fast_forward):
    # With swap, a host of 24 blocks fills: some victims are swapped out, others dropped.
    changes = {} if case == "recompute" else {"scheduler__preemption": "swap", "kv_cache__swap_blocks": 24}
    scenario = Scenario.model_validate(variant(fast_forward, **changes))
    observer, moves = TraceObserver(scenario), Moves()
    result = simulate(scenario, observers=[observer, moves])
    doc = {"traceEvents": trace_events(result, observer)}
    check_trace(json.loads(json.dumps(doc)))
    assert {p[3] for p in moves.preempted} == ({False} if case == "recompute" else {True, False})
    slices = sorted((e["args"]["request_id"], round(e["ts"] * 1000), e["args"]["swapped"], e["args"]["kv_blocks"],
                     e["args"]["computed_tokens"]) for e in doc["traceEvents"]
                    if e["ph"] == "X" and e["tid"] and e["name"] == "preempted")
    assert slices == sorted((i, t, swapped, blocks, computed) for _, t, i, swapped, blocks, computed in moves.preempted)
    # Each step slice lists who was preempted and admitted while its steps were planned, in the order told.
    steps = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == 0]
    for key, told in (("preempted_ids", moves.preempted), ("admitted_ids", moves.admitted)):
        listed = [(e["pid"] - 1, i) for e in sorted(steps, key=lambda e: e["pid"]) for i in e["args"][key]]
        assert listed == [(r, i) for r, _, i, *_ in sorted(told, key=lambda m: m[0])]
        for e in steps:
            ids = e["args"][key]
            start, end = round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)
            assert ids == [i for r, t, i, *_ in told if r == e["pid"] - 1 and start <= t < end]
    # A request's prefill or decode begins at each of its admissions.
    begun = {(e["args"]["request_id"], round(e["ts"] * 1000)) for e in doc["traceEvents"]
             if e["ph"] == "X" and e["tid"] and e["name"] in ("prefill", "decode")}
    assert {(i, t) for _, t, i in moves.admitted} <= begun

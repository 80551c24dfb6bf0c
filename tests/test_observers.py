"""Observers see every event of a run, and what they see adds up to the frames, in either engine.

An observer that takes no runs is told the reference engine's steps, one at a time, whichever engine
runs; one that takes runs gets them whole, with each step's exact times; admissions and preemptions
come at their plan's time in the scheduler's order. Both engines tell each replica's story alike.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pandas as pd
import pytest
from builders import changed, fixed

from simbatch import Observer, simulate
from simbatch.config import Scenario


class Tally(Observer):
    """Everything an observer is told, summed."""

    def __init__(self):
        self.arrived, self.rejected, self.completed = [], Counter(), []
        self.step_counts = Counter()  # (replica, done) -> steps
        self.tokens = Counter()  # replica -> tokens computed in steps that were done
        self.members = Counter()  # replica -> sum over steps of the batch size
        self.admitted, self.preempted = Counter(), Counter()  # request id -> times
        self.times: list[float] = []

    def arrival(self, t_s, request):
        self.arrived.append((request.request_id, request.replica))
        self.times.append(t_s)

    def rejection(self, t_s, request_id, reason):
        self.rejected[reason] += 1
        self.times.append(t_s)

    def admission(self, t_s, replica, request):
        self.admitted[request.request_id] += 1
        self.times.append(t_s)

    def preemption(self, t_s, replica, request, swapped, kv_blocks, computed_tokens):
        self.preempted[request.request_id] += 1
        self.times.append(t_s)

    def step(self, replica, start_s, duration_s, plan, done):
        self.step_counts[replica, done] += 1
        self.members[replica] += len(plan.scheduled)
        if done:
            self.tokens[replica] += sum(n for _, n in plan.scheduled)

    def completion(self, t_s, requests):
        self.completed += [r.request_id for r in requests]
        self.times.append(t_s)
        assert all(r.done for r in requests)


class EventLog(Observer):
    """What each replica was told, in order, as comparable values: moves and steps with their
    memberships (``members``: request ids and tokens, as a set; without them, sizes only), completions."""

    def __init__(self, members: bool = True):
        self.members = members
        self.events: defaultdict[int, list[tuple]] = defaultdict(list)  # replica -> events
        self.completions: list[tuple] = []
        self._last: tuple = (None, ())  # (plan, its membership): a run of steps tells the same plan each step

    def admission(self, t_s, replica, request):
        self.events[replica].append(("admitted", t_s, request.request_id, request.num_computed_tokens))

    def preemption(self, t_s, replica, request, swapped, kv_blocks, computed_tokens):
        self.events[replica].append(("preempted", t_s, request.request_id, swapped, kv_blocks, computed_tokens))

    def transfer(self, t_s, replica, request, duration_s):
        self.events[replica].append(("transfer", t_s, request.request_id, request.replica, duration_s,
                                     request.num_computed_tokens, request.num_generated))

    def who(self, plan) -> tuple:
        # A step's membership is a set: the order of its decodes is each engine's own (the lockstep twin
        # keeps its group in its own order).
        if not self.members:
            return plan.batch_size, plan.decode_seqs, plan.prefill_tokens
        if self._last[0] is not plan:  # (held here, so no other plan can take its id)
            self._last = plan, tuple(sorted((r.request_id, n) for r, n in plan.scheduled))
        return self._last[1]

    def step(self, replica, start_s, duration_s, plan, done):
        self.events[replica].append(("step", start_s, duration_s, done, self.who(plan)))

    def completion(self, t_s, requests):
        self.completions.append((t_s, tuple(sorted(r.request_id for r in requests))))


class RunLog(EventLog):
    """An :class:`EventLog` that takes runs, and logs each of their steps from the run's own times."""

    takes_runs = True

    def __init__(self, members: bool = True):
        super().__init__(members)
        self.runs = 0

    def run(self, replica, run, plan):
        self.runs += 1
        who, events = self.who(plan), self.events[replica]  # one plan for every step of the run
        events.extend(("step", start_s, duration_s, True, who) for start_s, duration_s in run)


def logged(data: dict, fast_forward: bool, members: bool = True) -> tuple:
    """The result, an EventLog and a RunLog of ``data`` run on one engine."""
    log, runs = EventLog(members), RunLog(members)
    result = simulate(Scenario.model_validate({**data, "sim": {**data.get("sim", {}), "fast_forward": fast_forward}}),
                      observers=[log, runs])
    return result, log, runs


def assert_told_alike(data: dict, members: bool = True) -> tuple:
    """Both engines tell every replica the same story, to the observers that take runs and to the
    others; returns the accelerated engine's logs."""
    reference, ref_log, ref_runs = logged(data, False, members)
    fast, log, runs = logged(data, True, members)
    assert ref_runs.runs == 0  # the reference engine makes every step alone
    assert dict(ref_log.events) == dict(log.events) == dict(runs.events) == dict(ref_runs.events)
    assert sorted(ref_log.completions) == sorted(log.completions) == sorted(runs.completions)
    return fast, log, runs


SCENARIO = {
    "workload": {"num_requests": 120, "arrival": {"rate": 40.0}, "prompt_tokens": {"dist": "uniform", "low": 4, "high": 60},
                 "output_tokens": {"dist": "exponential", "mean": 30, "max": 200}},
    "kv_cache": {"block_size": 4, "num_blocks": 160},
    "batching": {"max_num_seqs": 8, "max_num_batched_tokens": 64},
    "scheduler": {"max_waiting": 20},
    "cluster": {"replicas": 2, "router": "least_outstanding"},
    "sim": {"max_time_s": 4.0},
}


def variant(**changes) -> dict:
    return changed(SCENARIO, **changes)


# Each stresses one way of moving requests or of cutting runs of steps.
VARIANTS = {
    "recompute": {},
    "swap": {"kv_cache__swap_blocks": 16, "scheduler__preemption": "swap"},  # the host fills: some dropped
    # A waiting request of better priority evicts a running one in the middle of admission.
    "priority": {"workload__classes": [{"name": "interactive", "priority": 0, "share": 1},
                                       {"name": "batch", "priority": 3, "share": 3}],
                 "scheduler__policy": "priority", "scheduler__max_waiting": None},
    "context": {"device__kv_read_ms_per_1k_tokens": 0.7},  # a run's steps lengthen one by one
    "static": {"batching__mode": "static", "batching__max_wait_ms": 50.0},
    "dynamic": {"batching__mode": "dynamic", "batching__max_queue_delay_ms": 20.0},
    "async": {"scheduler__async_scheduling": True},
    "client": {"workload__max_concurrency": 12},
    "lone": {"cluster__replicas": 1, "sim__max_time_s": 2.5},  # runs ahead of SimPy's clock, stopped mid-run
    "disaggregated": {"cluster": {"router": "round_robin", "disaggregated": {
        "prefill": {"count": 1}, "decode": {"count": 2, "kv_cache": {"block_size": 4, "num_blocks": 60}},
        "kv_transfer": {"bandwidth_gb_s": 1.0, "latency_ms": 2.0}, "kv_bytes_per_token": 100_000}}},
}


@pytest.mark.parametrize("fast_forward", [False, True])
def test_an_observer_sees_what_the_frames_hold(fast_forward):
    tally = Tally()
    result = simulate(Scenario.model_validate({**SCENARIO, "sim": {**SCENARIO["sim"], "fast_forward": fast_forward}}),
                      observers=[tally])
    rq, it = result.requests, result.iterations
    assert sorted(tally.arrived) == sorted(zip(rq.loc[rq["status"] != "rejected", "request_id"],
                                               rq.loc[rq["status"] != "rejected", "replica"], strict=True))
    assert tally.rejected == Counter(rq.loc[rq["status"] == "rejected", "reason"])
    assert sorted(tally.completed) == sorted(rq.loc[rq["status"] == "finished", "request_id"])
    assert tally.times == sorted(tally.times)  # told in simulation order
    assert tally.preempted == Counter({i: n for i, n in zip(rq["request_id"], rq["num_preemptions"], strict=True) if n})
    assert tally.preempted.total() == (it["num_preempted"] * it["num_steps"]).sum() > 0
    # Admitted once, and again after each preemption that was followed by a readmission.
    ran = rq[rq["first_scheduled_s"].notna()]
    assert set(tally.admitted) == set(ran["request_id"])
    assert all(tally.preempted[i] <= tally.admitted[i] <= tally.preempted[i] + 1 for i in tally.admitted)
    for r, rows in it.groupby("replica"):
        stopped = rows["itl_tokens"].eq(0) & (rows["end_s"] > result.summary["duration"])
        assert tally.step_counts[r, True] + tally.step_counts[r, False] == rows["num_steps"].sum()
        assert tally.step_counts[r, False] == rows.loc[stopped, "num_steps"].sum() <= 1
        assert tally.members[r] == (rows["batch_size"] * rows["num_steps"]).sum()
        done = rows[~stopped]
        assert tally.tokens[r] == ((done["decode_tokens"] + done["prefill_tokens"]) * done["num_steps"]).sum()


@pytest.mark.parametrize("case", VARIANTS)
def test_both_engines_tell_each_replica_the_same_events(case):
    fast, log, runs = assert_told_alike(variant(**VARIANTS[case]))
    it = fast.iterations
    if case not in ("static", "dynamic", "client", "disaggregated"):
        assert runs.runs > 0 and it["num_preempted"].sum() > 0  # the case holds runs and preemptions
    for replica, events in log.events.items():
        steps = [e for e in events if e[0] == "step"]
        rows = it[it["replica"] == replica]
        assert len(steps) == rows["num_steps"].sum()
        # Steps are told in order, back to back or after idling; the plan's moves at its step's start.
        for (_, s0, d0, *_), (_, s1, *_) in zip(steps, steps[1:], strict=False):
            assert s1 >= s0 + d0 - 1e-12
        # (A transfer may be started by a plan with nothing to run: the replica idles after it.)
        for before, after in zip(events, events[1:], strict=False):
            if before[0] != "step" and after[0] == "step":
                assert after[1] == before[1] or before[0] == "transfer" and after[1] > before[1]


def test_a_decode_replica_is_told_of_each_transfer_before_it_steps_the_request():
    # On a decode replica a request is neither admitted nor arrived: its KV comes from a prefill replica,
    # and the transfer is what tells the replica's observers it holds the request.
    fast, log, _ = assert_told_alike(variant(**VARIANTS["disaggregated"]))
    rq = fast.requests.set_index("request_id")
    transfers = {}
    for replica in (1, 2):  # the decode pool
        told = set()
        for e in log.events[replica]:
            if e[0] == "transfer":
                _, t_s, i, source, duration_s, computed, generated = e
                assert i not in transfers and source == 0  # once, from the prefill replica
                assert (computed, generated) == (rq.loc[i, "prompt_tokens"], 1)  # the prompt's KV, one token
                transfers[i] = (replica, t_s, duration_s)
                told.add(i)
            elif e[0] == "step":
                members = {i for i, _ in e[4]}
                assert members <= told | {a[2] for a in log.events[replica] if a[0] == "admitted"}
                for i in members & transfers.keys():
                    assert e[1] >= transfers[i][1] + transfers[i][2] - 1e-12  # it decodes once its KV is in
    assert len(transfers) > 0 and not any(e[0] == "transfer" for e in log.events[0])
    # What the recorder keeps of them, as every observer is told them.
    for i, (replica, t_s, duration_s) in transfers.items():
        assert rq.loc[i, "decode_replica"] == replica
        assert rq.loc[i, "kv_transfer_s"] == duration_s
        assert rq.loc[i, "decode_queue_s"] == t_s - rq.loc[i, "first_token_s"]
    assert set(transfers) == set(rq.index[rq["kv_transfer_s"].notna()])


def test_a_preempted_request_is_told_what_it_held():
    fast, log, _ = assert_told_alike(variant(**VARIANTS["swap"]))
    rq = fast.requests.set_index("request_id")
    preempted = [e for events in log.events.values() for e in events if e[0] == "preempted"]
    assert {swapped for *_, swapped, _, _ in preempted} == {True, False}
    for _, _, i, _, kv_blocks, computed in preempted:
        assert 0 < computed <= rq.loc[i, "prompt_tokens"] + rq.loc[i, "output_tokens"]
        assert kv_blocks == -(-computed // 4) or kv_blocks == -(-(computed + 1) // 4)  # 4-token blocks
    # Admitted again, it resumes where it was after a swap, and computes everything again after a drop.
    resumed = Counter()
    for events in log.events.values():
        held = {}
        for e in events:
            if e[0] == "preempted":
                held[e[2]] = e
            elif e[0] == "admitted" and e[2] in held:
                _, _, _, swapped, _, computed = held.pop(e[2])
                assert e[3] == (computed if swapped else 0)
                resumed[swapped] += 1
    assert resumed[True] and resumed[False]


def test_admissions_and_preemptions_come_in_the_schedulers_order():
    # Under the priority policy a better newcomer evicts in the middle of admission: a plan admits,
    # preempts, admits again, and the observers are told so, in that order.
    _, log, _ = assert_told_alike(variant(**VARIANTS["priority"]))
    interleaved = 0
    for events in log.events.values():
        plan: list[tuple] = []
        for e in [*events, ("step",)]:
            if e[0] != "step":
                plan.append(e)
                continue
            kinds = [m[0] for m in plan]
            interleaved += "admitted" in kinds[:kinds.index("preempted")] if "preempted" in kinds else 0
            plan = []
    assert interleaved > 0


def test_an_observer_that_takes_runs_gets_them_whole():
    class Runs(Observer):
        takes_runs = True

        def __init__(self):
            self.steps, self.runs = 0, []

        def step(self, replica, start_s, duration_s, plan, done):
            self.steps += 1

        def run(self, replica, run, plan):
            self.runs.append(len(run))

    data = variant(**VARIANTS["context"])
    counted = Runs()
    fast = simulate(Scenario.model_validate(data), observers=[counted])
    assert counted.runs and min(counted.runs) >= 2
    assert counted.steps + sum(counted.runs) == fast.iterations["num_steps"].sum()
    assert counted.steps < fast.iterations["num_steps"].sum() / 2  # most steps came in runs


def test_a_run_gives_each_of_its_steps_exact_times():
    from simbatch.model.clock import NS_PER_S
    from simbatch.model.cost import StepRun
    from simbatch.observe.observers import Run

    # Repeats 3 .. 8 of a plan whose steps lengthen: 1 ms, plus 0.3 ns more each repeat, rounded down.
    durations = StepRun(1_000_000, 2_000_000, 600_000)  # _DEN = 2e6 units per ns
    run = Run(5 * NS_PER_S, durations, 3, 6)
    ends = [5 * NS_PER_S + durations.ns(3, m) for m in range(7)]
    expected = [(ends[i] / NS_PER_S, (ends[i + 1] - ends[i]) / NS_PER_S) for i in range(6)]
    assert list(run) == [run[i] for i in range(6)] == expected and run[-1] == expected[-1]
    assert [round(d * NS_PER_S) for _, d in run] == [1_000_001 + (3 + i) * 3 // 10 for i in range(6)]
    assert (len(run), run.start_s, run.end_s) == (6, 5.0, ends[-1] / NS_PER_S)
    assert run.duration_s == (ends[-1] - ends[0]) / NS_PER_S
    with pytest.raises(IndexError):
        run[6]


def test_an_observer_that_declares_runs_but_keeps_steps_still_sees_every_step():
    class Declared(Tally):
        takes_runs = True  # and the default run(): its steps, one at a time

    data = variant()
    declared, plain = Declared(), Tally()
    simulate(Scenario.model_validate(data), observers=[declared, plain])
    assert declared.step_counts == plain.step_counts and declared.tokens == plain.tokens


def test_observers_change_nothing():
    scenario = Scenario.model_validate({**SCENARIO, "workload": {**SCENARIO["workload"], "output_tokens": fixed(20)}})
    watched, plain = simulate(scenario, observers=[Tally(), RunLog()]), simulate(scenario)
    pd.testing.assert_frame_equal(watched.requests, plain.requests, check_exact=True)
    pd.testing.assert_frame_equal(watched.iterations, plain.iterations, check_exact=True)
    assert pd.Series(watched.summary).equals(pd.Series(plain.summary))

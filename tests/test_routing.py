"""Cache-aware routing: llm-d's weighted scorers by hand, SGLang's guards, conversations that stay put,
and what each router leaves cached.

The hand-built replicas answer ``prefix_hit_tokens`` from a table, so every score below is worked out
in its comment; the runs check the routers against each other on the same requests.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from simbatch.config import Scenario
from simbatch.config.cluster import PrefixAffinity as Spec
from simbatch.engine.router import PrefixAffinity, Probe, Session, make_router
from simbatch.simulation import simulate
from simbatch.workload import WorkloadArrays, generate
from simbatch.workload.prefix import OWN_STREAM, expected_cached_tokens_by_replica


def workload(n: int = 4, prompt: int = 100, streams=None) -> WorkloadArrays:
    z = np.zeros(n, dtype=np.int64)
    return WorkloadArrays(np.arange(n, dtype=float), np.full(n, prompt), np.full(n, 10), z.astype(np.int32), z,
                          ("default",), prefix_stream=None if streams is None else np.array(streams, dtype=np.int64))


def fleet(*states: tuple[int, int, int]) -> list[SimpleNamespace]:
    """(running, waiting, cached tokens of the request) per replica."""
    return [SimpleNamespace(index=i, num_running=r, num_waiting=w, kv_blocks_used=0, kv_blocks_total=100,
                            prefix_hit_tokens=lambda probe, h=h: h) for i, (r, w, h) in enumerate(states)]


def test_the_blend_of_cache_and_queue_by_hand():
    # prompt 100; weights 3 and 2; waits 0, 1, 4 -> queue scores 1, 3/4, 0
    # scores: 0 + 2 = 2;  3 x 0.5 + 1.5 = 3;  3 x 1 + 0 = 3: a tie, to the lower index
    router = PrefixAffinity(Spec(), workload())
    assert router.route(0, fleet((0, 0, 0), (0, 1, 50), (0, 4, 100))) == 1
    # the queue weighed more: 0 + 5 = 5 beats 3 x 1 + 0
    assert PrefixAffinity(Spec(queue_weight=5), workload()).route(0, fleet((0, 0, 0), (0, 4, 100))) == 0
    # queues all equal score 1 each: the cache decides
    assert router.route(0, fleet((3, 2, 10), (3, 2, 60), (3, 2, 30))) == 1


def test_sglangs_guards():
    wl = workload()
    # a hit of 0.2 under a 0.3 threshold counts 0: 2 x 1 (no queue) beats 3 x 0 + ... alike: index 0
    assert PrefixAffinity(Spec(cache_threshold=0.3), wl).route(0, fleet((0, 0, 0), (0, 0, 20))) == 0
    assert PrefixAffinity(Spec(cache_threshold=0.1), wl).route(0, fleet((0, 0, 0), (0, 0, 20))) == 1
    # outstanding 70, 1, 5: 70 - 1 > 64 and 70 > 1.5 x 1: the least outstanding, whatever is cached
    guarded = PrefixAffinity(Spec(balance_abs_threshold=64), wl)
    assert guarded.route(0, fleet((60, 10, 100), (1, 0, 0), (5, 0, 0))) == 1
    # 60 - 1 is within 64: the blend (the cache) decides
    assert guarded.route(0, fleet((50, 10, 100), (1, 0, 0), (5, 0, 0))) == 0


def test_a_probe_is_the_request_as_its_cache_sees_it():
    wl = workload(3, prompt=64, streams=[5, OWN_STREAM, 5])
    assert Probe.of(wl, 2) == Probe(2, 64, 5, 0, None, 0)


def test_a_conversation_stays_on_its_replica_and_moves_when_it_is_gone():
    router = Session(np.array([7, OWN_STREAM, 7, OWN_STREAM, 7]))
    reps = fleet((0, 0, 0), (1, 0, 0), (2, 0, 0))
    assert router.route(0, reps) == 0             # conversation 7 placed by least outstanding
    reps[0].num_running = 9
    assert router.route(1, reps) == 1             # outside any conversation: least outstanding
    assert router.route(2, reps) == 0             # conversation 7 stays, however loaded
    assert router.route(3, reps) == 1
    assert router.route(4, reps[1:]) == 1         # its replica drained: placed anew


def test_make_router_builds_the_cache_aware_ones():
    sc = Scenario.model_validate({"workload": {"num_requests": 4}, "cluster": {"replicas": 2, "router": "prefix_affinity",
                                                                              "prefix_affinity": {"queue_weight": 1}}})
    assert isinstance(make_router(sc, np.arange(4), workload=workload()), PrefixAffinity)
    assert isinstance(make_router(sc, np.arange(4), "session", workload=workload()), Session)


def chat(router: str, replicas: int, **extra) -> dict:
    return {"seed": 3,
            "workload": {"num_requests": 600, "arrival": {"process": "constant", "rate": 1.0}, "num_sessions": 40,
                         "prompt_tokens": {"dist": "uniform", "low": 20, "high": 120},
                         "output_tokens": {"dist": "uniform", "low": 10, "high": 60},
                         "prefix": {"shared_tokens": 0, "multi_turn": True, "max_context_tokens": 4000}},
            "device": {"tau0_ms": 10, "beta_ms": 0.1, "prefill_ms_per_token": 0.05},
            "kv_cache": {"block_size": 16, "num_blocks": 20000, "enable_prefix_caching": True},
            "batching": {"max_num_seqs": 16, "max_num_batched_tokens": 1024},
            "cluster": {"replicas": replicas, "router": router, **extra}}


def hit_rate(spec: dict) -> float:
    return simulate(Scenario.model_validate(spec), check_invariants=True).summary["prefix_cache_hit_rate"]


def closed_form(spec: dict, replica: np.ndarray) -> float:
    """The hit rate of caches that never evict, each seeing the requests ``replica`` sends it."""
    wl = generate(Scenario.model_validate(spec))
    hits = expected_cached_tokens_by_replica(replica, wl.prompt_tokens, wl.output_tokens, wl.prefix_stream,
                                             wl.shared_prefix_tokens, 16)
    return hits.sum() / wl.prompt_tokens.sum()


def test_session_keeps_a_single_replicas_hit_rate_and_round_robin_falls_to_its_closed_form():
    """Turns never overlap here (a request finishes in well under the 1 s between arrivals)."""
    single = hit_rate(chat("round_robin", 1))
    assert single == pytest.approx(closed_form(chat("round_robin", 1), np.zeros(600)), rel=1e-12)
    assert hit_rate(chat("session", 4)) == single
    assert hit_rate(chat("prefix_affinity", 4)) == single  # an idle fleet: the cache decides every time
    rr = hit_rate(chat("round_robin", 4))
    assert rr == pytest.approx(closed_form(chat("round_robin", 4), np.arange(600) % 4), rel=1e-12)
    assert rr < 0.8 * single


@pytest.mark.parametrize("bad", [{"prefix_weight": 0, "queue_weight": 0}, {"cache_threshold": 1.5},
                                 {"balance_rel_threshold": 0.5}])
def test_bad_prefix_affinity_keys_are_refused(bad):
    with pytest.raises(ValueError):
        Scenario.model_validate({"workload": {"num_requests": 4},
                                 "cluster": {"router": "prefix_affinity", "prefix_affinity": bad}})


def test_prefix_affinity_keys_need_the_router_and_a_live_view():
    with pytest.raises(ValueError, match="set router: prefix_affinity"):
        Scenario.model_validate({"workload": {"num_requests": 4}, "cluster": {"prefix_affinity": {}}})
    with pytest.raises(ValueError, match="remove signal_delay_ms"):
        Scenario.model_validate({"workload": {"num_requests": 4},
                                 "cluster": {"router": "prefix_affinity", "signal_delay_ms": 5}})


def test_a_comparison_of_routers_draws_their_gain(tmp_path):
    from simbatch.app.plots import save_compare_plots

    runs = {f"router={r}": simulate(Scenario.model_validate({**chat(r, 2), "workload": {
        **chat(r, 2)["workload"], "num_requests": 60}})) for r in ("round_robin", "session")}
    names = {p.name for p in save_compare_plots(tmp_path, runs)}
    assert "routing_gain.png" in names and (tmp_path / "routing_gain.png").read_bytes()[:4] == b"\x89PNG"
    same = {"a": runs["router=session"], "b": runs["router=session"]}
    (tmp_path / "same").mkdir()
    assert "routing_gain.png" not in {p.name for p in save_compare_plots(tmp_path / "same", same)}


def test_num_kept_is_what_an_allocation_would_leave_of_a_run_of_cached_blocks():
    """What the prefix_affinity router treats as evicted inside an accelerated run of steps: the run's
    blocks up to the first one an allocation of n blocks would take."""
    import copy

    import numpy as np

    from simbatch.memory.prefix_cache import CachingBlockPool

    pool = CachingBlockPool(10)
    held = pool.allocate(8)
    pool.free(held[:5])            # queued tail-first: 4, 3, 2, 1, 0
    pool.touch([2])                # a lookup took block 2 back off the queue
    pool.free(held[5:6])           # block 5 queued behind 0
    runs = [np.array(r, np.int64) for r in ([0, 1, 2], [2, 6], [3, 4], [5], [1, 2, 0], [])]
    assert [pool.num_kept(r, 2) for r in runs] == [len(r) for r in runs]  # two never-used blocks come first
    for n in range(1, pool.num_free + 1):
        taken = set(copy.deepcopy(pool).allocate(n))
        for run in runs:
            expect = next((i for i, b in enumerate(run.tolist()) if b in taken), len(run))
            assert pool.num_kept(run, n) == expect, (n, run)
    assert pool.num_kept(np.array([2, 6, 1]), 5) == 2   # takes 8, 9, then 4, 3, 1: block 1 is gone


def test_num_kept_agrees_with_an_allocation_on_a_long_queue_with_stale_entries():
    """Many frees and touches leave stale entries before the live ones the allocation reaches."""
    import copy

    import numpy as np

    from simbatch.memory.prefix_cache import CachingBlockPool

    rng = np.random.default_rng(7)
    pool = CachingBlockPool(400)
    held = pool.allocate(400)
    for _ in range(300):
        pool.free(held[:20])
        pool.touch(held[:20])
        held = held[20:] + held[:20]
    pool.free(held[:350])
    pool.touch(held[100:300:3])
    for _ in range(30):
        n = int(rng.integers(1, pool.num_free + 1))
        run = np.array(rng.choice(400, size=12, replace=False), np.int64)
        taken = set(copy.deepcopy(pool).allocate(n))
        expect = next((i for i, b in enumerate(run.tolist()) if b in taken), len(run))
        assert pool.num_kept(run, n) == expect, (n, run)

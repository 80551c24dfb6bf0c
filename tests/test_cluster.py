"""Replicas behind a router: the routing policies, cluster admission, heterogeneous fleets, sessions,
the router's delayed view, per-replica metrics and their plots.

Routers are first tested on hand-built replica states (plain objects with the five attributes a
router may read), then end to end through ``simulate`` with the invariants checked at every step.
Step costs come from ``conftest.BASE``: 10 ms + 1 ms per decoding sequence + 0.1 ms per prefill token.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from builders import make_scenario

from simbatch.analysis.capacity import fleet_stability, stability
from simbatch.analysis.fleet import imbalance, per_replica
from simbatch.app.plots import series
from simbatch.app.plots.cluster import load_imbalance, replica_load
from simbatch.config import replica_scenarios
from simbatch.engine import Engine
from simbatch.engine.router import (
    LeastKV,
    LeastOutstanding,
    Load,
    PowerOfTwo,
    Random,
    RoundRobin,
    SessionAffinity,
    make_router,
)
from simbatch.inputs.loading import ScenarioError, load_scenario
from simbatch.model import streams
from simbatch.model.cost import decode_throughput
from simbatch.simulation import simulate
from simbatch.workload import generate

REPO = Path(__file__).resolve().parent.parent
ROUTERS = ("round_robin", "random", "least_outstanding", "least_kv", "power_of_two", "session_affinity")


def fixed(value: int) -> dict:
    return {"dist": "fixed", "value": value}


def replicas(*loads: tuple[int, int], kv: list[tuple[int, int]] | None = None) -> list[SimpleNamespace]:
    """Hand-built replica states: (running, waiting) each, and optionally (kv used, kv total)."""
    kv = kv or [(0, 100)] * len(loads)
    return [SimpleNamespace(index=i, num_running=r, num_waiting=w, kv_blocks_used=u, kv_blocks_total=t)
            for i, ((r, w), (u, t)) in enumerate(zip(loads, kv, strict=True))]


def spaced(n: int, gap_s: float, prompt: int, output: int, **overrides):
    """``n`` requests arriving every ``gap_s`` seconds, the first at ``gap_s``."""
    return make_scenario(workload__num_requests=n, workload__arrival__process="constant",
                         workload__arrival__rate=1 / gap_s, workload__prompt_tokens=fixed(prompt),
                         workload__output_tokens=fixed(output), **overrides)


# --------------------------------------------------------------------------- routers on hand-built states
def test_round_robin_takes_replicas_in_turn_whatever_their_load():
    router, view = RoundRobin(), replicas((9, 9), (0, 0), (5, 0))
    assert [router.route(i, view) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_random_draws_uniformly_from_the_routing_stream():
    view = replicas(*[(0, 0)] * 4)
    router = Random(streams.rng(3, streams.ROUTING))
    chosen = np.array([router.route(i, view) for i in range(40_000)])
    # The same draws as the stream itself gives: the router owns no other randomness.
    assert chosen[:50].tolist() == streams.rng(3, streams.ROUTING).integers(4, size=50).tolist()
    counts = np.bincount(chosen, minlength=4)
    assert np.all(np.abs(counts - 10_000) < 5 * math.sqrt(40_000 * 0.25 * 0.75))


def test_least_outstanding_counts_running_plus_waiting_and_ties_go_to_the_lower_index():
    router = LeastOutstanding()
    # Replica 0 has the shortest queue but holds the most work: 6 running + 0 waiting > 1 + 3.
    assert router.route(0, replicas((6, 0), (1, 3), (2, 3))) == 1
    assert router.route(0, replicas((2, 2), (1, 3), (4, 0))) == 0
    assert router.route(0, replicas((3, 2), (1, 3), (4, 0))) == 1


def test_least_kv_compares_usage_fractions_not_block_counts():
    router = LeastKV()
    # 50 of 100 blocks is fuller than 60 of 200; the waiting requests (no blocks) do not count.
    assert router.route(0, replicas((0, 0), (0, 9), kv=[(50, 100), (60, 200)])) == 1
    assert router.route(0, replicas((0, 0), (0, 0), kv=[(30, 100), (60, 200)])) == 0
    assert router.route(0, replicas((0, 0), (0, 0), (0, 0), kv=[(70, 100), (20, 100), (20, 100)])) == 1


def test_power_of_two_picks_the_less_loaded_of_two_distinct_random_replicas():
    router = PowerOfTwo(streams.rng(0, streams.ROUTING))
    # With two replicas the pair is always both of them: the less loaded, then the lower index.
    assert {router.route(i, replicas((5, 0), (0, 2))) for i in range(200)} == {1}
    assert {router.route(i, replicas((1, 1), (2, 0))) for i in range(200)} == {0}
    assert router.route(0, replicas((7, 7))) == 0
    # Loads 0 < 1 < 2 < 3: replica k wins when it is in the pair with a busier one, which happens
    # for (3 - k) of the 6 equally likely pairs.
    view = replicas((0, 0), (1, 0), (0, 2), (3, 0))
    n = 60_000
    share = np.bincount([router.route(i, view) for i in range(n)], minlength=4) / n
    expected = np.array([3, 2, 1, 0]) / 6
    assert np.all(np.abs(share - expected) <= 5 * np.sqrt(expected * (1 - expected) / n) + 1e-12)


def test_session_affinity_places_a_new_session_by_load_then_sticks_to_it():
    router = SessionAffinity(np.array([7, 8, 7, 9, 8, 7]))
    assert router.route(0, replicas((3, 0), (0, 0), (1, 0))) == 1  # session 7: least outstanding
    assert router.route(1, replicas((3, 0), (1, 0), (1, 0))) == 1  # session 8: tie 1 vs 2 -> 1
    assert router.route(2, replicas((0, 0), (9, 9), (0, 0))) == 1  # session 7 again: sticky, though busiest
    assert router.route(3, replicas((4, 0), (9, 9), (0, 0))) == 2  # session 9: new
    assert router.route(4, replicas((0, 0), (9, 9), (0, 0))) == 1
    assert router.route(5, replicas((0, 0), (9, 9), (0, 0))) == 1


def test_a_snapshot_reads_what_a_router_reads():
    live = replicas((2, 5), kv=[(17, 64)])[0]
    assert Load.of(live) == Load(index=0, num_running=2, num_waiting=5, kv_blocks_used=17, kv_blocks_total=64)


def test_make_router_builds_every_configured_policy():
    kinds = {name: type(make_router(make_scenario(cluster__router=name), np.arange(3))) for name in ROUTERS}
    assert kinds == {"round_robin": RoundRobin, "random": Random, "least_outstanding": LeastOutstanding,
                     "least_kv": LeastKV, "power_of_two": PowerOfTwo, "session_affinity": SessionAffinity}


# --------------------------------------------------------------------------- configuration
def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_replica_count_comes_from_the_specs_and_must_agree_when_both_are_set(tmp_path):
    sc = make_scenario(cluster__replica_specs=[{"count": 2}, {"count": 3, "device": {"tau0_ms": 40.0}}])
    assert sc.cluster.replicas == 5
    path = write(tmp_path, "workload: {num_requests: 1}\ncluster:\n  replicas: 4\n"
                           "  replica_specs: [{count: 2}, {count: 3}]\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (problem,) = info.value.problems
    assert problem.line == 3 and problem.path == "cluster"
    assert "replicas (4) disagrees with replica_specs, whose counts sum to 5; remove replicas or set it to 5" \
        in str(problem)


@pytest.mark.parametrize(("overrides", "fragments"), [
    (["cluster.router=random", "cluster.signal_delay_ms=50"],
     ("cluster: signal_delay_ms (50.0) has no effect on router random", "least_outstanding")),
    (["cluster.router=fastest"], ("cluster.router:", "'fastest'")),
    (["cluster.max_in_flight=0"], ("cluster.max_in_flight:", "greater than 0")),
    (["cluster.replica_specs=[{count: 1, device: {tau0_ms: -1}}]"], ("cluster.replica_specs.0.device.tau0_ms",)),
    (["workload.num_sessions=0"], ("workload.num_sessions:", "greater than 0")),
])
def test_bad_cluster_settings_name_the_field_and_the_fix(tmp_path, overrides, fragments):
    path = write(tmp_path, "workload: {num_requests: 1}\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, overrides)
    (problem,) = info.value.problems
    for fragment in fragments:
        assert fragment in str(problem), str(problem)


# --------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("router", ROUTERS)
def test_every_request_is_routed_once_and_ends_once(router):
    """Conservation across the cluster, with every way to be turned away in play."""
    classes = [{"name": "ok", "share": 9.0}, {"name": "huge", "share": 1.0, "prompt_tokens": fixed(400)}]
    sc = make_scenario(workload__num_requests=300, workload__arrival__rate=150.0, workload__classes=classes,
                       workload__num_sessions=20,
                       workload__prompt_tokens={"dist": "uniform", "low": 2, "high": 40},
                       workload__output_tokens={"dist": "exponential", "mean": 15.0, "max": 60},
                       kv_cache__num_blocks=48, scheduler__max_waiting=1,
                       cluster__replicas=3, cluster__router=router, cluster__max_in_flight=12)
    result = simulate(sc, check_invariants=True)
    rq, s = result.requests, result.summary
    assert rq["request_id"].tolist() == list(range(300)), "each request appears exactly once"
    status, reason = rq["status"].astype(str), rq["reason"]
    assert set(reason[status == "rejected"]) == {"never_fits", "queue_full", "cluster_full"}
    assert (reason[status != "rejected"] == "").all()
    assert (status == "finished").sum() + (status == "rejected").sum() == 300  # drained: none unfinished
    assert (s["completed"], s["rejected"], s["unfinished"]) == ((status == "finished").sum(),
                                                                (status == "rejected").sum(), 0)
    # Routed requests carry their replica; only the cluster cap turns a request away unrouted.
    routed = reason != "cluster_full"
    assert rq.loc[routed, "replica"].between(0, 2).all() and (rq.loc[~routed, "replica"] == -1).all()
    assert set(result.iterations["replica"]) == {0, 1, 2}
    table = per_replica(rq, result.iterations, s["duration"], 3)
    assert table["completed"].sum() == s["completed"]
    assert table["L"].sum() == pytest.approx(s["L"], rel=1e-9)
    assert s["littles_law_rel_error"] < 1e-9


def test_cluster_full_caps_requests_in_flight_over_all_replicas():
    sc = make_scenario(workload__num_requests=20, workload__arrival__rate=math.inf,
                       workload__prompt_tokens=fixed(4), workload__output_tokens=fixed(5),
                       cluster__replicas=3, cluster__max_in_flight=7)
    rq = simulate(sc, check_invariants=True).requests
    # All twenty arrive at t=0: seven are admitted (round robin: 3, 2, 2), thirteen shed unrouted.
    assert rq["status"].tolist() == ["finished"] * 7 + ["rejected"] * 13
    assert (rq["reason"].iloc[7:] == "cluster_full").all() and (rq["replica"].iloc[7:] == -1).all()
    assert rq["replica"].iloc[:7].tolist() == [0, 1, 2, 0, 1, 2, 0]
    # Spaced arrivals never exceed the cap: the system drains between them.
    spaced_out = simulate(spaced(20, 1.0, prompt=4, output=5, cluster__replicas=3, cluster__max_in_flight=1))
    assert (spaced_out.requests["status"] == "finished").all()


def test_a_session_always_lands_on_the_same_replica():
    sc = make_scenario(workload__num_requests=200, workload__arrival__rate=100.0, workload__num_sessions=7,
                       workload__output_tokens={"dist": "uniform", "low": 1, "high": 30},
                       cluster__replicas=3, cluster__router="session_affinity")
    rq = simulate(sc, check_invariants=True).requests
    homes = rq.groupby("session")["replica"].nunique()
    assert len(homes) == 7 and (homes == 1).all()
    assert rq["replica"].nunique() == 3  # the seven sessions are spread, not piled on one replica


def test_sessions_are_uniform_ids_from_their_own_stream():
    base = {"workload__num_requests": 30_000, "workload__arrival__rate": 10.0}
    none, some = generate(make_scenario(**base)), generate(make_scenario(**base, workload__num_sessions=5))
    assert none.session.tolist() == list(range(30_000)), "without num_sessions each request is its own session"
    counts = np.bincount(some.session, minlength=5)
    assert len(counts) == 5 and np.all(np.abs(counts - 6_000) < 5 * math.sqrt(30_000 * 0.2 * 0.8))
    assert some.session.dtype == np.int64 and not some.session.flags.writeable
    for column in ("arrival_s", "prompt_tokens", "output_tokens", "tenant"):
        assert np.array_equal(getattr(none, column), getattr(some, column)), "sessions moved another stream"
    small = make_scenario(workload__num_requests=20, workload__num_sessions=4)
    assert simulate(small).requests["session"].tolist() == generate(small).session.tolist()


def test_a_heterogeneous_fleet_builds_each_replica_from_its_spec():
    slow = {"tau0_ms": 40.0, "beta_ms": 2.0, "prefill_ms_per_token": 0.1}
    specs = [{"count": 2}, {"count": 1, "device": slow, "kv_cache": {"block_size": 4, "num_blocks": 100},
                            "batching": {"max_num_seqs": 2, "max_num_batched_tokens": 16}}]
    sc = make_scenario(workload__num_requests=60, workload__arrival__rate=50.0,
                       workload__prompt_tokens=fixed(8), workload__output_tokens=fixed(6),
                       cluster__replica_specs=specs)
    engine = Engine(sc, generate(sc))
    assert [r.device.tau0_ms for r in engine.replicas] == [10.0, 10.0, 40.0]
    assert [r.kv_blocks_total for r in engine.replicas] == [64, 64, 100]
    assert [r.scheduler.scenario.batching.max_num_seqs for r in engine.replicas] == [4, 4, 2]
    assert [s.device for s in replica_scenarios(sc)][:2] == [sc.device] * 2  # omitted sections inherit
    result = simulate(sc, check_invariants=True)
    it = result.iterations
    expected_ms = np.where(it["replica"] == 2, 40 + 2.0 * it["decode_tokens"], 10 + 1.0 * it["decode_tokens"]) \
        + 0.1 * it["prefill_tokens"]
    assert np.allclose(it["duration_s"], expected_ms / 1e3, rtol=0, atol=1e-12)
    assert it.loc[it["replica"] == 2, "batch_size"].max() <= 2
    # KV usage is a share of each replica's own pool.
    busy = it["duration_s"] * it["num_steps"]
    share = it["kv_blocks_used"] / np.where(it["replica"] == 2, 100, 64)
    assert result.summary["mean_kv_usage"] == pytest.approx(float((share * busy).sum() / busy.sum()))
    # Capacities add: two fast replicas of 4 slots and one slow of 2.
    st = result.stability
    fast, slow_dev = sc.device, replica_scenarios(sc)[2].device
    assert st.replicas == 3
    assert st.capacity_tokens_per_s == pytest.approx(2 * decode_throughput(fast, 4) + decode_throughput(slow_dev, 2))
    assert st.capacity_requests_per_s == pytest.approx(
        2 * stability(fast, 4, 1.0, 6.0, 8.0).capacity_requests_per_s
        + stability(slow_dev, 2, 1.0, 6.0, 8.0).capacity_requests_per_s)
    assert st.offered_load == pytest.approx(st.arrival_rate / st.capacity_requests_per_s)


def test_an_alike_fleet_is_exactly_the_replicated_stability_check():
    sc = make_scenario()
    assert fleet_stability([(sc.device, 4)] * 6, 20.0, 500.0, 32.0) == stability(sc.device, 4, 20.0, 500.0, 32.0,
                                                                                   replicas=6)


@pytest.mark.parametrize(("delay_ms", "expected"), [(0.0, [0, 1, 0, 1]), (150.0, [0, 0, 1, 1]),
                                                    (1000.0, [0, 0, 0, 0])])
def test_signal_delay_shows_the_router_an_old_state(delay_ms, expected):
    """Four long requests at 0.1, 0.2, 0.3 and 0.4 s onto two replicas, by least outstanding.

    Live, they alternate. With 150 ms of delay, the first two see the empty cluster as it was at
    -0.05 s and 0.05 s, and both go to replica 0; the third sees 0.15 s (replica 0 holds one) and
    the fourth 0.25 s (replica 0 holds two): both go to replica 1. With a second of delay every
    request sees the empty cluster of before t = 0: all pile onto replica 0 (the herd effect).
    """
    sc = spaced(4, 0.1, prompt=4, output=200, cluster__replicas=2, cluster__router="least_outstanding",
                cluster__signal_delay_ms=delay_ms)
    assert simulate(sc, check_invariants=True).requests["replica"].tolist() == expected


@pytest.mark.parametrize("router", ["least_kv", "least_outstanding", "power_of_two"])
def test_fast_forward_routes_exactly_like_stepping(router):
    # Routers read KV usage and pools in the middle of fast-forwarded runs of steps, live and delayed.
    sc = make_scenario(workload__num_requests=150, workload__arrival__rate=60.0,
                       workload__output_tokens={"dist": "exponential", "mean": 30.0, "max": 120},
                       cluster__replicas=3, cluster__router=router, cluster__signal_delay_ms=7.0)
    fast = simulate(sc)
    slow = simulate(sc.model_copy(update={"sim": sc.sim.model_copy(update={"fast_forward": False})}))
    pd.testing.assert_frame_equal(fast.requests, slow.requests)


# --------------------------------------------------------------------------- per-replica metrics and plots
def test_per_replica_table_and_summary_keys_add_up_to_the_cluster():
    sc = make_scenario(workload__num_requests=200, workload__arrival__rate=60.0,
                       workload__output_tokens={"dist": "uniform", "low": 1, "high": 40},
                       cluster__replicas=3, cluster__router="random")
    result = simulate(sc)
    s, it = result.summary, result.iterations
    table = per_replica(result.requests, it, s["duration"], 3)
    assert table.columns.tolist() == ["replica", "admitted", "completed", "output_throughput", "busy_fraction",
                                      "mean_batch_size", "L", "W_s"]
    assert table["output_throughput"].sum() == pytest.approx(s["output_throughput"])
    assert table["busy_fraction"].mean() == pytest.approx(s["busy_fraction"])
    assert (table["admitted"] / s["duration"] * table["W_s"]).tolist() == pytest.approx(table["L"].tolist())
    for r in range(3):
        steps = it[it["replica"] == r]
        assert table["mean_batch_size"][r] == pytest.approx(np.average(steps["batch_size"], weights=steps["num_steps"]))
        assert s[f"replica_{r}_L"] == table["L"][r] and s[f"replica_{r}_busy_fraction"] == table["busy_fraction"][r]
        assert s[f"replica_{r}_output_throughput"] == table["output_throughput"][r]
    assert s["load_imbalance"] == pytest.approx(table["L"].max() / table["L"].mean())
    single = simulate(make_scenario(workload__num_requests=20)).summary
    assert single["load_imbalance"] == 1.0 and not any(k.startswith("replica_") for k in single)


def test_imbalance_is_max_over_mean_and_undefined_without_load():
    assert imbalance(np.array([1.0, 1.0, 1.0])) == 1.0
    assert imbalance(np.array([3.0, 0.0, 0.0])) == 3.0
    assert math.isnan(imbalance(np.zeros(4)))
    per_window = imbalance(np.array([[2.0, 0.0], [0.0, 0.0]]))
    assert per_window[0] == 2.0 and math.isnan(per_window[1])


def _band(fill) -> tuple[np.ndarray, np.ndarray]:
    """The per-bin lower and upper values of a band drawn by ``step_band`` (matplotlib's fill_between
    polygon: its start, the lower edge forwards, its end, the upper edge backwards, its start again)."""
    vertices = fill.get_paths()[0].vertices[:, 1]
    n = (len(vertices) - 3) // 2
    return vertices[1:n + 1:2], vertices[n + 2:2 * n + 2][::-1][::2]


def test_cluster_plots_draw_every_replica_and_the_imbalance():
    sc = make_scenario(workload__num_requests=120, workload__arrival__rate=80.0,
                       workload__output_tokens={"dist": "uniform", "low": 1, "high": 60},
                       batching__max_num_seqs=2, cluster__replicas=3, cluster__router="random")
    result = simulate(sc)
    fig = replica_load(result, 3, slots=2)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title(loc="left") for ax in panels] == ["replica 0", "replica 1", "replica 2"]
    # Running + waiting drawn per replica averages, over the run, to that replica's L.
    table = per_replica(result.requests, result.iterations, result.summary["duration"], 3)
    end = series.end_time_s(result.iterations, result.requests)
    for r, ax in enumerate(panels):
        (_, running), (below, in_system) = (_band(c) for c in ax.collections[:2])
        assert np.mean(in_system) == pytest.approx(table["L"][r] * result.summary["duration"] / end, rel=1e-6)
        assert np.all(below == running)  # waiting is stacked on running
    fig = load_imbalance(result, 3)
    top, bottom = fig.axes
    ratio = bottom.lines[0].get_ydata()[::2]  # a step line: each bin's value at both its edges
    assert np.nanmin(ratio) >= 1.0 and np.nanmax(ratio) <= 3.0
    assert bottom.lines[1].get_ydata()[0] == pytest.approx(result.summary["load_imbalance"], rel=1e-9)  # dashed


# --------------------------------------------------------------------------- the "must show"
def test_oversubscribed_fleet_is_stable_with_six_replicas_and_its_queues_stay_bounded():
    """The chapter's 10,000 tok/s against ~1,951 per replica: six replicas are stable, one is not.

    Cluster-wide waiting requests are measured in 2-second bins over the arrival period after a
    warm-up. On six replicas the waiting queue stays below one batch and has no trend; on one
    replica the same measurement grows linearly at lambda - capacity / E[out], as theory says.
    """
    path = REPO / "scenarios" / "oversubscribed_fleet.yaml"
    rate, out_tokens = 20.0, 500

    def waiting_slope_and_peak(replicas: int) -> tuple[float, float, object]:
        result = simulate(load_scenario(path, [f"cluster.replicas={replicas}", "workload.duration_s=80"]))
        edges = np.arange(20.0, float(result.requests["arrival_s"].max()), 2.0)
        waiting = series.in_system(result.requests, edges) - \
            series.step_mean(result.iterations, result.iterations["num_running"], edges)
        mid = (edges[:-1] + edges[1:]) / 2
        return float(np.polyfit(mid, waiting, 1)[0]), float(waiting.max()), result.stability

    slope, peak, st = waiting_slope_and_peak(6)
    assert st.stable and st.replicas == 6 and st.offered_load == pytest.approx(10_000 / 11_707.3, rel=1e-4)
    assert peak < 64 and abs(slope) < 0.1, (peak, slope)
    slope, peak, st = waiting_slope_and_peak(1)
    assert not st.stable
    growth = rate - st.capacity_tokens_per_s / out_tokens  # requests/s the queue gains
    assert slope == pytest.approx(growth, rel=0.1) and peak > 500

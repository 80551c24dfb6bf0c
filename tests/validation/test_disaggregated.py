"""11: Disaggregated prefill and decode: first-token and per-token times in closed form, capacity = min(prefill, decode)

A request prefilled alone takes one step of tau(P) = tau0 + gamma P + epsilon P^2 / 2 (its first
token, DistServe's TTFT); its KV moves in P x bytes per token / bandwidth + latency; then it decodes
O - 1 steps, step k reading P + k - 1 tokens of context: TPOT = (transfer + sum_k tau(1, P + k - 1))
/ (O - 1). When B requests reach the decode replica together, step k decodes the B_k of them with
more than k tokens still to come: tau(B_k, sum of their contexts). Both are checked request by
request, to the nanosecond of the cost model's own step times (``LinearCost.plan_ns``).

Capacity. A saturated prefill replica runs steps of T = min(budget, max_num_seqs P) tokens:
mu_p = T / (P tau(T)) requests/s (fixed P, epsilon = delta = 0). A decode slot is held O steps by a
request (O - 1 decoding and the step its KV arrives in), so B slots of steps tau0 (beta = 0) carry
mu_d = B / (O tau0). The cluster carries min(mu_p, mu_d): just above it, the number waiting in the
binding pool grows as (lambda - min) t and the other pool's stays bounded; just below, both stay
bounded. Slopes are least-squares fits of each pool's num_waiting over the steps after a warm-up (one
replica a pool). The capacities ``simbatch.analysis.capacity`` gives are checked equal to mu_p and mu_d.

Placement: of N replicas, the split with the most simulated throughput (every request at t = 0, so
each split runs saturated) is the closed form's, the p maximising min(p mu_p, (N - p) mu_d).
"""

from __future__ import annotations

from functools import partial

import pytest
from replicate import ols_slope

from simbatch.analysis.capacity import expected_stability
from simbatch.config import Device
from simbatch.model.clock import to_ns
from simbatch.model.cost import LinearCost
from simbatch.model.step import StepPlan
from simbatch.workload import generate

DEVICE = {"tau0_ms": 10.0, "beta_ms": 0.5, "prefill_ms_per_token": 0.05, "kv_read_ms_per_1k_tokens": 2.0,
          "prefill_attention_ms_per_1m_pairs": 20.0}
LINK = {"bandwidth_gb_s": 25.0, "latency_ms": 2.0}
KV_BYTES = 131072


def _pools(prefill: int, decode: int, **decode_sections) -> dict:
    return {"prefill": {"count": prefill}, "decode": {"count": decode, **decode_sections},
            "kv_transfer": LINK, "kv_bytes_per_token": KV_BYTES}


def _step_ns(cost: LinearCost, decode_seqs: int = 0, prefill_tokens: int = 0, kv_tokens: int = 0) -> int:
    return cost.plan_ns(StepPlan(decode_seqs=decode_seqs, prefill_tokens=prefill_tokens, kv_tokens=kv_tokens,
                                 attention_pairs_x2=prefill_tokens * prefill_tokens))


def _transfer_ns(prompt: int) -> int:
    return max(1, to_ns(prompt * KV_BYTES / (LINK["bandwidth_gb_s"] * 1e9) + LINK["latency_ms"] / 1e3))


def _isolated_mismatches(result) -> int:
    """Requests whose TTFT, transfer or finish differs from the closed form of a request alone."""
    cost = LinearCost.of(Device(**DEVICE))
    wrong = 0
    for r in result.requests.itertuples():
        p, o = int(r.prompt_tokens), int(r.output_tokens)
        ttft = _step_ns(cost, prefill_tokens=p)
        decode = sum(_step_ns(cost, decode_seqs=1, kv_tokens=p + k - 1) for k in range(1, o))
        wrong += (to_ns(r.ttft_s) != ttft or to_ns(r.kv_transfer_s) != _transfer_ns(p) or r.decode_queue_s != 0
                  or to_ns(r.finish_s) != to_ns(r.arrival_s) + ttft + _transfer_ns(p) + decode)
    return wrong


@pytest.mark.validation
def test_a_lone_request_in_closed_form(sim, check, mode):
    """Arrivals 3 s apart, each alone: prompts uniform 50..1500, outputs uniform 2..200, one replica a pool."""
    seeds = range(mode.pick(2, 10))
    specs = [{"seed": s, "workload": {"num_requests": mode.pick(30, 200), "arrival": {"process": "constant", "rate": 1 / 3},
                                      "prompt_tokens": {"dist": "uniform", "low": 50, "high": 1500},
                                      "output_tokens": {"dist": "uniform", "low": 2, "high": 200}},
              "device": DEVICE, "cluster": {"disaggregated": _pools(1, 1)}} for s in seeds]
    check.exact("requests whose TTFT, KV transfer or E2E differ from tau(P), P b / bw + lat, sum_k tau(1, P + k - 1)",
                0, sum(sim.map(_isolated_mismatches, specs)), seeds=seeds)


def _batch_mismatches(result) -> int:
    """Requests whose finish differs from the lockstep decode of the whole batch: step k decodes those
    with more than k tokens to come, each reading P + k - 1 tokens."""
    cost = LinearCost.of(Device(**DEVICE))
    rq = result.requests
    p = int(rq["prompt_tokens"].iloc[0])
    outputs = rq["output_tokens"].to_numpy()
    start = _step_ns(cost, prefill_tokens=p) + _transfer_ns(p)
    ends, t = {}, start
    for k in range(1, int(outputs.max())):
        active = int((outputs - 1 >= k).sum())
        t += _step_ns(cost, decode_seqs=active, kv_tokens=active * (p + k - 1))
        ends[k] = t
    return sum(to_ns(f) != ends[o - 1] for f, o in zip(rq["finish_s"], outputs, strict=True))


@pytest.mark.validation
def test_tpot_is_the_step_time_at_the_decode_batch(sim, check, mode):
    """Eight requests at t = 0, one per prefill replica (round robin), 600-token prompts, outputs uniform
    2..300: their first tokens, transfers and deliveries coincide, and they decode together on one
    decode replica as the batch thins out."""
    seeds = range(mode.pick(3, 20))
    specs = [{"seed": s, "workload": {"num_requests": 8, "arrival": {"rate": "inf"},
                                      "prompt_tokens": {"dist": "fixed", "value": 600},
                                      "output_tokens": {"dist": "uniform", "low": 2, "high": 300}},
              "device": DEVICE, "cluster": {"router": "round_robin", "disaggregated": _pools(8, 1)}} for s in seeds]
    check.exact("requests whose E2E differs from tau(P) + transfer + sum_k tau(B_k, B_k (P + k - 1))",
                0, sum(sim.map(_batch_mismatches, specs)), seeds=seeds)


# Capacity: tau0 10 ms; prefill: gamma 0.02 ms/token, budget 1024, P = 512 (two prompts a step);
# decode: beta 0, 4 slots (or 64), O = 21, a transfer of a nanosecond.
CAP_DEVICE = {"tau0_ms": 10.0, "beta_ms": 0.0, "prefill_ms_per_token": 0.02}
PROMPT, OUTPUT, BUDGET, SLOTS = 512, 21, 1024, 4
MU_P = BUDGET / PROMPT / (CAP_DEVICE["tau0_ms"] + CAP_DEVICE["prefill_ms_per_token"] * BUDGET) * 1e3


def _capacity_spec(seed: int, rate: float, prefill: int, decode: int, slots: int, duration_s: float) -> dict:
    return {"seed": seed,
            "workload": {"duration_s": duration_s, "arrival": {"rate": rate},
                         "prompt_tokens": {"dist": "fixed", "value": PROMPT},
                         "output_tokens": {"dist": "fixed", "value": OUTPUT}},
            "sim": {"max_time_s": duration_s},  # cut at the arrivals' end: no draining in the fits
            "device": CAP_DEVICE, "kv_cache": {"num_blocks": 200_000},
            "batching": {"max_num_seqs": 64, "max_num_batched_tokens": BUDGET},
            "cluster": {"disaggregated": {
                "prefill": {"count": prefill}, "kv_bytes_per_token": 1,
                "decode": {"count": decode, "batching": {"max_num_seqs": slots, "max_num_batched_tokens": BUDGET}},
                "kv_transfer": {"bandwidth_gb_s": 1000.0, "latency_ms": 0.0}}}}


def _slopes(result, warmup_s: float) -> tuple[float, float]:
    """Least-squares slopes of the prefill and the decode pool's num_waiting after the warm-up."""
    out = []
    for pool in ("prefill", "decode"):
        it = result.iterations[(result.iterations["pool"] == pool) & (result.iterations["start_s"] >= warmup_s)]
        mid_s = it["start_s"] + (it["num_steps"] - 1) * it["duration_s"] / 2
        out.append(ols_slope(mid_s.to_numpy(), it["num_waiting"].to_numpy(), it["num_steps"].to_numpy())
                   if len(it) > 1 else 0.0)
    return out[0], out[1]


@pytest.mark.validation
@pytest.mark.parametrize(("binding", "slots"), [("prefill", 64), ("decode", SLOTS)])
def test_capacity_is_the_smaller_pool(sim, check, mode, binding, slots):
    """One replica a pool. Prefill-bound: 64 decode slots (mu_d = 305 req/s against mu_p = 65.6);
    decode-bound: 4 (mu_d = 19.0). At 1.2 x min(mu_p, mu_d) the binding pool's queue grows at
    0.2 x min and the other's does not; at 0.8 x min neither grows. Warm-up 5 s, runs of 15 s (60 full)."""
    mu_d = slots / (OUTPUT * CAP_DEVICE["tau0_ms"] / 1e3)
    capacity = min(MU_P, mu_d)
    assert (mu_d > MU_P) == (binding == "prefill")
    seeds = range(mode.pick(3, 12))
    warmup, duration = 5.0, mode.pick(15.0, 60.0)
    spec = _capacity_spec(0, 1.2 * capacity, 1, 1, slots, duration)
    from simbatch.inputs.loading import scenario_from_dict

    scenario = scenario_from_dict(spec)
    st = expected_stability(scenario, generate(scenario))
    check.exact("simbatch.analysis.capacity's prefill capacity, T / (P tau(T))", MU_P, st.prefill_capacity_requests_per_s)
    check.exact("simbatch.analysis.capacity's decode capacity, B / (O tau0)", mu_d, st.decode_capacity_requests_per_s)
    check.exact("the verdict's binding pool is the smaller (1 = yes)", 1, int(st.pool == binding and not st.stable))
    for factor in (1.2, 0.8):
        specs = [_capacity_spec(s, factor * capacity, 1, 1, slots, duration) for s in seeds]
        slopes = sim.map(partial(_slopes, warmup_s=warmup), specs)
        grows = factor > 1
        for i, pool in enumerate(("prefill", "decode")):
            theory = (factor - 1) * capacity if grows and pool == binding else 0.0
            check.ci(f"{binding}-bound at {factor} x capacity: slope of the {pool} pool's num_waiting (1/s)",
                     theory, [s[i] for s in slopes], seeds)


def _best_split(result_rows) -> int:
    return int(result_rows.sort_values("request_throughput", ascending=False).iloc[0]["prefill_replicas"])


@pytest.mark.validation
def test_placement_finds_the_closed_form_split(check, mode):
    """Six replicas, decode 4 slots each: p mu_p against (6 - p) mu_d is 65.6 p against 19.0 (6 - p),
    best at p = 2 (min 76.2 req/s). Every request arrives at t = 0 (200 quick, 2,000 full), so each
    split runs saturated; the simulated best is the split with the most requests per second."""
    from simbatch.app.sweep.placement import closed_form_best, placement_search
    from simbatch.inputs.loading import scenario_from_dict

    seeds = range(mode.pick(2, 5))
    found = []
    for seed in seeds:
        spec = _capacity_spec(seed, float("inf"), 1, 1, SLOTS, 1.0)
        spec["workload"] = {**spec["workload"], "duration_s": None, "num_requests": mode.pick(200, 2000)}
        spec["sim"] = {}
        frame = placement_search(scenario_from_dict(spec), 6)
        assert closed_form_best(frame) == 2
        found.append(_best_split(frame))
    check.exact("splits whose simulated best differs from argmax_p min(p mu_p, (N - p) mu_d) = 2",
                0, sum(p != 2 for p in found), seeds=seeds)

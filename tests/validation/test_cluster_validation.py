"""Cluster: random routing splits Poisson traffic into independent Poisson streams; load-aware routers cut the tail

Thinning (Kingman, *Poisson Processes*, 1993, sec. 2.4; Kleinrock vol. 1, sec. 2.3): a Poisson
stream of rate lambda whose arrivals are each sent to one of N replicas uniformly at random,
independently of everything else, splits into N *independent* Poisson streams of rate lambda/N.
Lengths are drawn independently of the routing, and a random router reads no state, so each
replica of such a cluster is a single engine fed Poisson(lambda/N) traffic: its per-replica metrics
have exactly the law of a one-replica run at rate lambda/N over the same horizon. No warm-up
deletion is needed: both sides start empty and stop arrivals at the same horizon T, so they share
their finite-horizon bias.

The comparison pairs replica i of cluster run r with an independent one-replica run (its own
seed), and requires the interval of the paired differences to contain 0. Replicas of one cluster
run are independent of each other (above), so the N x R differences are i.i.d. Metrics: mean TTFT
and mean time in system W of the requests that arrived before T, and L over [0, T] (the area under
the replica's number in system up to T, divided by T).

Routers under heavy-tailed outputs: with lognormal output lengths (sigma 1.2) on four replicas of
eight slots at about 80% load, a blind router (random, round robin) leaves short requests queued
behind a replica's long ones while another replica has free slots; joining the replica with the
fewest outstanding requests (join-the-shortest-queue; Winston 1977) or the better of two random
ones (Mitzenmacher, *The Power of Two Choices in Randomized Load Balancing*, 2001) avoids most of
that. The check is paired: every router sees the same requests (common random numbers, seed r),
and the log of the ratio of p99 TTFTs (blind / aware) must have its whole interval above 0. The
log makes a paired difference of a scale quantity (p99 moves by a factor from seed to seed, and
the gain with it), and exp of its mean is the geometric-mean speed-up.
"""

from __future__ import annotations

import numpy as np
import pytest
from replicate import Estimate

from simbatch.analysis.fleet import per_replica

N = 4
DEVICE = {"tau0_ms": 20.0, "beta_ms": 0.2, "prefill_ms_per_token": 0.1}
PROMPT = {"dist": "fixed", "value": 64}


def metrics(result, horizon_s: float, replicas: int) -> np.ndarray:
    """Per replica: mean TTFT (s), W (s) and L over [0, T]; one row per replica."""
    rq = result.requests
    table = per_replica(rq, result.iterations, horizon_s, replicas)
    grouped = rq.groupby("replica")
    return np.column_stack([grouped["ttft_s"].mean().reindex(range(replicas)).to_numpy(),
                            grouped["e2e_s"].mean().reindex(range(replicas)).to_numpy(),
                            table["L"].to_numpy()])


@pytest.mark.validation
def test_random_routing_makes_each_replica_a_single_engine_at_lambda_over_n(sim, check, mode):
    """N = 4 replicas of 4 slots, lambda = 24 requests/s in all (6 per replica, utilization ~0.65),
    prompts of 64 tokens, outputs ceil(Exp(20)); the reference is one replica at lambda/N = 6.
    Every request finishes (the runs drain), so TTFT and W are over all of them."""
    horizon_s = mode.pick(80.0, 400.0)
    seeds = range(mode.pick(6, 30))
    common = {"device": DEVICE, "batching": {"max_num_seqs": 4}}
    workload = {"duration_s": horizon_s, "prompt_tokens": PROMPT,
                "output_tokens": {"dist": "exponential", "mean": 20.0}}
    cluster, single = [], []
    for seed in seeds:
        result = sim({**common, "seed": seed, "workload": {**workload, "arrival": {"rate": 24.0}},
                      "cluster": {"replicas": N, "router": "random"}})
        assert (result.requests["status"] == "finished").all()
        cluster.append(metrics(result, horizon_s, N))
        for i in range(N):
            # Seeds far from the cluster runs': the reference runs share no stream with them.
            one = sim({**common, "seed": 100_000 + N * seed + i,
                       "workload": {**workload, "arrival": {"rate": 24.0 / N}}})
            single.append(metrics(one, horizon_s, 1)[0])
    cluster, single = np.concatenate(cluster), np.array(single)
    labels = range(len(single))
    for k, quantity in enumerate(("mean TTFT per replica (s)", "W per replica (s)", "L per replica")):
        check.paired(quantity, single[:, k], cluster[:, k], labels)


@pytest.mark.validation
def test_load_aware_routers_beat_blind_ones_on_p99_ttft(sim, mode):
    """Four replicas of 8 slots, lambda = 12 requests/s, outputs lognormal (mean 100, sigma 1.2,
    capped at 4,000): utilization ~0.8. p99 TTFT of least_outstanding and power_of_two against
    random and round_robin, paired by seed; each log ratio's interval must lie above 0."""
    seeds = range(mode.pick(8, 25))
    num_requests = mode.pick(800, 4000)
    p99 = {router: [] for router in ("random", "round_robin", "least_outstanding", "power_of_two")}
    for seed in seeds:
        for router, values in p99.items():
            result = sim({"seed": seed,
                          "workload": {"num_requests": num_requests, "arrival": {"rate": 12.0},
                                       "output_tokens": {"dist": "lognormal", "mean": 100.0, "sigma": 1.2,
                                                         "max": 4000}},
                          "batching": {"max_num_seqs": 8},
                          "cluster": {"replicas": N, "router": router}})
            values.append(result.summary["p99_ttft_ms"])
    for aware in ("least_outstanding", "power_of_two"):
        for blind in ("random", "round_robin"):
            gain = Estimate.of(np.log(np.array(p99[blind]) / np.array(p99[aware])))
            assert gain.mean - gain.half_width > 0, (
                f"{aware} should beat {blind} on p99 TTFT: log ratio {gain.mean:.2f} +- {gain.half_width:.2f} "
                f"(x{np.exp(gain.mean):.1f}) over {gain.replications} paired seeds")

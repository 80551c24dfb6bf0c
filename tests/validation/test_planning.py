"""12: Planning: `simbatch plan` sizes a fleet as the processor-sharing law does, and picks the cheaper GPU

Decode-only traffic (one-token prompts, outputs ceil(Exp(50)) tokens, Poisson arrivals at lambda =
12.5 requests/s) served by continuous batching below its slot limit is a processor-sharing queue with
a rate that depends on the number inside: with n requests in a replica, each step of tau0 + beta n
gives each of them a token, so requests complete at rate n / (E[out] (tau0 + beta n)). Its occupancy
is the birth-death chain of :func:`simbatch.analysis.theory.batching_occupancy_pmf`, insensitive to the
output-length law below the slot limit (Kelly, *Reversibility and Stochastic Networks*, 1979, ch. 3),
and its mean latency W(lambda) = E[N] / lambda (Little) grows with lambda. A random router splits
Poisson traffic into independent Poisson streams of lambda / N (section "Cluster"), so an SLO on the
mean end-to-end latency, W <= W_max, holds for N replicas exactly when lambda / N <= lambda_max, the
largest rate per replica with W(lambda_max) = W_max (found by bisection on the chain). The fewest
replicas is then N = ceil(lambda / lambda_max), and the cheapest fleet of two devices with prices p
is the one of least N p.

Two calibrated devices (given by their costs, as `simbatch calibrate` prints them): "slow" (tau0 20 ms,
beta 2 ms, $2/GPU-hour) and "fast" (tau0 10 ms, beta 1 ms, $5/GPU-hour), 64 slots, W_max = 2.4 s. The
law gives lambda_max = 5.32 requests/s for slow (lambda / lambda_max = 2.35: 3 replicas, $6/hour; at
2 replicas W = 3.0 s) and 15.2 for fast (0.82: 1 replica, $5/hour, W = 1.5 s): the dearer GPU makes
the cheaper fleet. `simbatch plan` is given only the scenario, the two devices, the prices and
`--slo e2el_mean_ms=2400`; it screens both by the closed forms (the stability bound puts slow at 2
replicas at least), simulates each from there (3 replications in the quick mode, 10 in the full, on
the same seeds for both), and must find the law's replica count for each device and its cheaper
fleet. The decisions have margin: at the sizes found the law's W is 20 % and 37 % below W_max, at
one replica fewer 25 % above it (or unstable), far beyond the replications' noise; the runs start
empty, which biases W low by less than that (the chain's W and the simulated ones agree within 2 %
at these sizes).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from simbatch.analysis import theory
from simbatch.app.cli import app
from simbatch.config import Device, Exponential

RATE, SLOTS, W_MAX_S, MEAN_OUT = 12.5, 64, 2.4, 50
DEVICES = {"slow": ({"tau0_ms": 20.0, "beta_ms": 2.0}, 2.0), "fast": ({"tau0_ms": 10.0, "beta_ms": 1.0}, 5.0)}


def largest_rate(device: Device, mean_out: float) -> float:
    """lambda_max: the largest rate per replica whose chain latency is at most W_MAX_S (bisection)."""
    lo, hi = 0.0, SLOTS / (mean_out * (device.tau0_s + device.beta_s * SLOTS)) * (1 - 1e-9)
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if theory.batching_mean_latency_s(device, SLOTS, mid, mean_out) <= W_MAX_S else (lo, mid)
    return lo


@pytest.mark.validation
def test_plan_sizes_as_the_processor_sharing_law_and_picks_the_cheaper_fleet(check, mode, tmp_path: Path):
    """Replicas per device and the chosen fleet's cost: the law's (exact, since both are counts)."""
    mean_out = theory.length_moments(Exponential(dist="exponential", mean=MEAN_OUT))[0]
    law = {name: math.ceil(RATE / largest_rate(Device(**costs), mean_out)) for name, (costs, _) in DEVICES.items()}
    scenario = {"name": "plan_ps", "seed": 0,
                "workload": {"duration_s": mode.pick(200.0, 1000.0), "arrival": {"rate": RATE},
                             "prompt_tokens": {"dist": "fixed", "value": 1},
                             "output_tokens": {"dist": "exponential", "mean": MEAN_OUT}},
                "device": DEVICES["slow"][0], "kv_cache": {"num_blocks": 100_000},
                "batching": {"max_num_seqs": SLOTS, "max_num_batched_tokens": 2048}, "cluster": {"router": "random"}}
    space = {"devices": [{"name": name, "gpu": f"GPU-{name}", "device": costs} for name, (costs, _) in DEVICES.items()],
             "replicas": {"min": 1, "max": 8}}
    prices = {"gpus": {f"GPU-{name}": {"usd_per_gpu_hour": price} for name, (_, price) in DEVICES.items()}}
    files = {}
    for name, data in (("scenario", scenario), ("space", space), ("prices", prices)):
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(yaml.safe_dump(data))
    replications = mode.pick(3, 10)
    result = CliRunner().invoke(app, ["plan", str(files["scenario"]), "--space", str(files["space"]), "--prices",
                                      str(files["prices"]), "--slo", f"e2el_mean_ms={W_MAX_S * 1e3:g}", "--top", "2",
                                      "--no-headroom", "-r", str(replications), "-w", "1", "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    ranked = pd.read_csv(tmp_path / "out" / "plan.csv").set_index("configuration")
    seeds = range(replications)
    for name in DEVICES:
        check.exact(f"replicas of {name} (N = ceil(lambda / lambda_max))", law[name],
                    ranked.loc[f"{name} mns={SLOTS} mnbt=2048", "replicas"], seeds)
    costs = {name: law[name] * price for name, (_, price) in DEVICES.items()}
    cheapest = min(costs, key=costs.get)
    check.exact("cost of the chosen fleet ($/hour)", costs[cheapest], ranked["cost_per_hour"].iloc[0], seeds)
    check.exact("chosen device (1 = the law's cheapest fleet)", 1.0,
                float(ranked.index[0] == f"{cheapest} mns={SLOTS} mnbt=2048"), seeds)

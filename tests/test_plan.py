"""``simbatch plan``: the closed forms it screens with, the search space, prices, and the search end to end.

The end-to-end checks run small plans (a hundred requests, two replications) in this process: a
tiny space of calibrated devices whose sizes are known (the validation suite holds the closed-form
case, tests/validation/test_planning.py), and a preset space of three GPUs for the worked example's shape.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from simbatch.analysis.planning import (
    cost_per_million_tokens,
    gpu_watts,
    lone_request_bounds,
    min_replicas,
    pareto_front,
    prefill_alone_s,
)
from simbatch.app.cli import app
from simbatch.app.plan.launch import vllm_serve
from simbatch.app.plan.limits import ATTAINMENT, INCOMPLETE, Limit, binding, failures, with_derived
from simbatch.app.plan.question import Flags, search_space
from simbatch.app.plan.space import Layout, SearchSpace, SpaceError, configurations
from simbatch.app.sweep.capacity import CapacitySearch
from simbatch.app.sweep.runner import Executor
from simbatch.config import Batching, Device
from simbatch.inputs.loading import load_scenario, scenario_from_dict
from simbatch.inputs.prices import Prices
from simbatch.model.cost import LinearCost
from simbatch.simulation import simulate

TINY = """\
name: tiny
seed: 1
workload:
  num_requests: 120
  arrival: {rate: 6}
  prompt_tokens: {dist: uniform, low: 20, high: 200}
  output_tokens: {dist: uniform, low: 10, high: 60}
device: {tau0_ms: 20, beta_ms: 0.5, prefill_ms_per_token: 0.05}
kv_cache: {num_blocks: 4000}
batching: {max_num_seqs: 16, max_num_batched_tokens: 512}
"""
SPACE = """\
devices:
  - {name: small, gpu: GPU-S, device: {tau0_ms: 20, beta_ms: 0.5, prefill_ms_per_token: 0.05}}
  - {name: big, gpu: GPU-B, tensor_parallel_size: 2, model: org/model,
     device: {tau0_ms: 8, beta_ms: 0.2, prefill_ms_per_token: 0.02}}
replicas: {min: 1, max: 6}
"""
PRICES = """\
gpus:
  GPU-S: {usd_per_gpu_hour: 1.0, idle_watts: 50, max_watts: 300}
  GPU-B: {usd_per_gpu_hour: 1.2}
"""
PRESET = """\
name: preset
seed: 0
workload:
  num_requests: 120
  arrival: {rate: 5}
  prompt_tokens: {dist: sharegpt}
  output_tokens: {dist: sharegpt}
device: {preset: llama-3.1-8b/H100-SXM}
kv_cache: {num_blocks: auto}
batching: {max_num_seqs: 64, max_num_batched_tokens: 2048}
cluster: {router: least_outstanding}
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plan")
    out = {}
    for name, text in (("tiny.yaml", TINY), ("space.yaml", SPACE), ("prices.yaml", PRICES), ("preset.yaml", PRESET)):
        (root / name).write_text(text)
        out[name] = root / name
    return out


def plan(*args: str):
    return CliRunner().invoke(app, ["plan", *map(str, args)])


def tiny_plan(files, out: Path, *extra: str):
    result = plan(files["tiny.yaml"], "--space", files["space.yaml"], "--prices", files["prices.yaml"],
                  "--slo", "ttft_p99_ms=400", "--slo", "tpot_p99_ms=40", "-r", "2", "--top", "2",
                  "--tolerance", "0.1", "-o", out, *extra)
    assert result.exit_code == 0, result.output
    return result


# --------------------------------------------------------------------------- closed forms
def test_a_lone_prefill_is_its_chunks_summed_by_hand():
    device = Device(tau0_ms=10, beta_ms=0.5, prefill_ms_per_token=0.1, kv_read_ms_per_1k_tokens=2.0,
                    prefill_attention_ms_per_1m_pairs=3.0)
    cost = LinearCost.of(device)
    chunks, done, by_hand = [2048, 2048, 904], 0, 0.0  # 5000 tokens in chunks of 2048
    for c in chunks:
        by_hand += cost.step_ms(0, c, 0, done, c * (done + c / 2))
        done += c
    assert prefill_alone_s(cost, np.array([5000]), 2048)[0] * 1e3 == pytest.approx(by_hand, rel=1e-12)


def test_lone_request_bounds_hold_for_every_simulated_request():
    """The screening's bounds are below what each request of a busy run measures (a preset device,
    chunked prefill, a shared step: everything that adds to a lone request's time)."""
    scenario = scenario_from_dict({"seed": 2, "workload": {"num_requests": 300, "arrival": {"rate": 40},
                                                           "prompt_tokens": {"dist": "sharegpt"},
                                                           "output_tokens": {"dist": "sharegpt"}},
                                   "device": {"preset": "llama-3.1-8b/A100-80GB"}, "kv_cache": {"num_blocks": "auto"},
                                   "batching": {"max_num_seqs": 64, "max_num_batched_tokens": 512}})
    result = simulate(scenario)
    rq = result.requests
    bounds = lone_request_bounds(scenario.device, scenario.batching, rq["prompt_tokens"].to_numpy(),
                                 rq["output_tokens"].to_numpy())
    assert (rq["ttft_s"].to_numpy() >= bounds.ttft_s - 1e-9).all()
    tpot = rq["tpot_s"].to_numpy()
    has = ~np.isnan(tpot)
    assert (tpot[has] >= bounds.tpot_s[has] - 1e-9).all()
    assert (rq["e2e_s"].to_numpy() >= bounds.e2e_s - 1e-9).all()
    stats = bounds.stats_ms()
    assert stats["p99_ttft_ms"] <= result.summary["p99_ttft_ms"] and stats["mean_tpot_ms"] <= result.summary[
        "mean_tpot_ms"]


def test_prefix_caching_and_speculation_loosen_the_bounds():
    device = Device(tau0_ms=10, beta_ms=1, prefill_ms_per_token=0.1)
    b = Batching(max_num_seqs=8, max_num_batched_tokens=512)
    plain = lone_request_bounds(device, b, np.array([1000]), np.array([11]))
    cached = lone_request_bounds(device, b, np.array([1000]), np.array([11]), prefix_caching=True)
    assert cached.ttft_s[0] == pytest.approx(0.0101)  # one step of one token
    assert cached.ttft_s[0] < plain.ttft_s[0]
    spec = Device(tau0_ms=10, beta_ms=1, prefill_ms_per_token=0.1,
                  speculative={"num_speculative_tokens": 3, "acceptance_rate": 0.7, "draft_cost_ms": 1})
    assert lone_request_bounds(spec, b, np.array([1000]), np.array([11])).tpot_s[0] == pytest.approx(
        plain.tpot_s[0] / 4)
    assert math.isnan(lone_request_bounds(device, b, np.array([10]), np.array([1])).tpot_s[0])


def test_min_replicas_is_the_first_stable_fleet():
    assert min_replicas(10, 5) == 3  # two carry exactly 10: rho = 1 is not stable
    assert min_replicas(9, 5) == 2
    assert min_replicas(1, math.inf) == 1 and min_replicas(1, 0) == math.inf


def test_power_cost_and_pareto():
    assert gpu_watts(70, 700, 0.5) == 385 and gpu_watts(70, 700, 1.5) == 700
    assert cost_per_million_tokens(3.6, 1000) == pytest.approx(1.0)  # $3.6/h for 3.6 M tokens/h
    front = pareto_front(np.array([1, 2, 3, 2, 1]), np.array([5, 4, 1, 2, 5]))
    assert front.tolist() == [True, True, True, False, True]


# --------------------------------------------------------------------------- space, prices, limits
def test_the_space_spans_presets_once_each_and_where_ep_applies(files):
    base = load_scenario(files["preset.yaml"])
    space = SearchSpace(models=["llama-3.1-8b", "mixtral-8x7b"], gpus=["H100-SXM"], tensor_parallel_size=[1, 2],
                        expert_parallel=[False, True], max_num_seqs=[32, 64])
    names = sorted({c.device for c in configurations(space, base)})
    # Dense models and one GPU get no expert parallelism; the MoE over two GPUs does.
    assert names == ["llama-3.1-8b/H100-SXM", "llama-3.1-8b/H100-SXM/tp2", "mixtral-8x7b/H100-SXM",
                     "mixtral-8x7b/H100-SXM/tp2", "mixtral-8x7b/H100-SXM/tp2/ep2"]
    config = configurations(space, base)[0]
    assert config.values["device"] == {"preset": "llama-3.1-8b/H100-SXM"}
    assert config.values["kv_cache.num_blocks"] == "auto" and config.model_id == "meta-llama/Llama-3.1-8B"


def test_a_disaggregated_ratio_scales_by_units(files):
    base = load_scenario(files["preset.yaml"])
    space = SearchSpace(colocated=False, disaggregated={"splits": ["1:2"], "kv_transfer": {"bandwidth_gb_s": 50}})
    (config,) = configurations(space, base)
    assert config.layout == Layout(1, 2) and config.gpus(3) == 9
    at = config.at(3)
    assert at["cluster.replicas"] == 9 and at["cluster.disaggregated"]["decode"] == {"count": 6}
    sc = load_scenario(files["preset.yaml"], [f"{k}={json.dumps(v)}" for k, v in at.items()])
    assert sc.cluster.disaggregated.prefill.count == 3
    prefill, decode = vllm_serve(config, sc, 3)
    assert (prefill.role, prefill.replicas, decode.role, decode.replicas) == ("prefill", 3, "decode", 6)
    assert """--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'""" in decode.command


@pytest.mark.parametrize(("space", "says"), [
    (SearchSpace(gpus=["H1000"]), "unknown GPU 'H1000'"),
    (SearchSpace(colocated=False), "nothing to plan"),
    (SearchSpace(disaggregated={"splits": ["1:1"]}), "kv_transfer is missing"),
])
def test_a_space_that_names_nothing_known_says_so(files, space, says):
    with pytest.raises(SpaceError, match=says):
        configurations(space, load_scenario(files["preset.yaml"]))


def test_flags_lay_over_the_file_and_name_themselves_in_errors(files):
    space = search_space(files["space.yaml"], Flags(max_num_seqs="8,16", max_replicas=3))
    assert space.max_num_seqs == [8, 16] and space.replicas.max == 3 and len(space.devices) == 2
    with pytest.raises(ValueError, match="--max-num-seqs 8,x: expected whole numbers"):
        search_space(None, Flags(max_num_seqs="8,x"))
    with pytest.raises(ValueError, match="--max-replicas: .*greater than 0"):
        search_space(None, Flags(max_replicas=0))


def test_the_shipped_prices_have_a_date_and_source_for_every_figure():
    prices = Prices.load(None)
    assert prices.has("h100-sxm") and prices.price("H100-SXM") > 0
    for name, entry in prices.file.gpus.items():
        assert entry.date and entry.source and entry.provider, name
        assert entry.idle_watts is None or entry.power_source, name


def test_power_comes_from_the_card_first(files):
    prices = Prices.load(files["prices.yaml"])
    assert prices.power("GPU-S").max_watts == 300 and prices.power("GPU-B") is None

    class Card:
        name, idle_watts, max_watts = "GPU-S", 40.0, 250.0

    assert prices.power("GPU-S", Card()).idle_watts == 40.0


def test_limits_judge_the_means_and_name_what_binds():
    record = with_derived({"summary": {"request_throughput": 2.0, "request_goodput": 1.5, "rejected": 1,
                                       "unfinished": 0, "p99_ttft_ms": 600.0}, "stability": {}})
    assert record["summary"][ATTAINMENT] == 0.75 and record["summary"][INCOMPLETE] == 1
    limits = [Limit("p99_ttft_ms", 500), Limit(ATTAINMENT, 0.99, at_most=False), Limit(INCOMPLETE, 0)]
    combined = {"replications": 2, "p99_ttft_ms_mean": 600.0, "p99_ttft_ms_ci95": 40.0, f"{ATTAINMENT}_mean": 0.98,
                f"{INCOMPLETE}_mean": 0.0, "num_requests_mean": 100}
    assert failures(limits, combined) == ["p99_ttft_ms 600 ± 40 > 500", f"{ATTAINMENT} 0.98 < 0.99"]
    assert binding(limits, combined) == "p99_ttft_ms"


# --------------------------------------------------------------------------- the search, end to end
def test_a_tiny_plan_ranks_sizes_and_launches(files, tmp_path):
    result = tiny_plan(files, tmp_path / "p")
    ranked = pd.read_csv(tmp_path / "p" / "plan.csv")
    assert list(ranked["configuration"]) == ["small mns=16 mnbt=512", "big mns=16 mnbt=512"]
    assert ranked["cost_per_hour"].tolist() == [ranked["replicas"][0] * 1.0, ranked["replicas"][1] * 2.4]
    assert (ranked["headroom_rate"] > 6).all() and (ranked["headroom_rate"] < ranked["capacity_requests_per_s"]).all()
    assert not math.isnan(ranked["kwh_per_hour"][0]) and math.isnan(ranked["kwh_per_hour"][1])  # GPU-B: no watts
    probes = pd.read_csv(tmp_path / "p" / "probes.csv")
    small = probes[(probes.configuration == ranked.configuration[0]) & (probes.phase == "size")]
    # The winner's size is the smallest that met: every smaller one simulated missed.
    assert small[small.met].units.min() == ranked.replicas[0] and not small[small.units < ranked.replicas[0]].met.any()
    record = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert record["launch"][0]["replicas"] == ranked.replicas[0]
    assert "--tensor-parallel-size 1 --max-num-seqs 16 --max-num-batched-tokens 512" in record["launch"][0]["command"]
    assert "vllm serve MODEL" in result.output and "wrote" in result.output
    assert (tmp_path / "p" / "pareto.png").stat().st_size > 10_000
    assert "data:image/png;base64," in (tmp_path / "p" / "report.html").read_text()


def test_a_rerun_resumes_and_another_executor_writes_the_same_bytes(files, tmp_path):
    first = tiny_plan(files, tmp_path / "a", "-w", "1")
    runs = int(re.search(r"Runs: (\d+) \(0 resumed", first.output).group(1))
    again = tiny_plan(files, tmp_path / "a", "-w", "1")
    assert f"Runs: {runs} ({runs} resumed" in again.output
    tiny_plan(files, tmp_path / "b", "-w", "2")
    for name in ("plan.csv", "candidates.csv", "probes.csv", "plan.json", "report.html", "pareto.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_the_same_plan_through_a_dask_cluster(files, tmp_path, dask_cluster):
    tiny_plan(files, tmp_path / "local", "-w", "1", "--no-headroom")
    result = tiny_plan(files, tmp_path / "dask", "--dask", dask_cluster.scheduler_address, "--no-headroom")
    assert "Dask cluster" in result.output
    for name in ("plan.csv", "candidates.csv", "probes.csv", "plan.json", "report.html", "pareto.png"):
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "dask" / name).read_bytes(), name


def test_the_headroom_is_what_capacity_search_finds_by_hand(files, tmp_path):
    """Plan's answer for its winner agrees with ``capacity-search`` run on the winning configuration:
    the same rate within the search's tolerance of the analytic capacity."""
    out = tmp_path / "plan"
    result = plan(files["preset.yaml"], "--gpu", "A100-80GB,H100-SXM,L40S", "--slo", "ttft_p99_ms=500",
                  "--slo", "tpot_p99_ms=50", "-r", "2", "--top", "1", "--tolerance", "0.1", "-w", "1", "-o", out)
    assert result.exit_code == 0, result.output
    best = pd.read_csv(out / "plan.csv").iloc[0]
    record = json.loads((out / "plan.json").read_text())
    assert best.configuration.startswith("llama-3.1-8b/")
    preset = best.configuration.split()[0]
    sets = [f"device.preset={preset}", "kv_cache.num_blocks=auto", f"cluster.replicas={best.replicas}",
            f"batching.max_num_seqs={best.max_num_seqs}",
            f"batching.max_num_batched_tokens={best.max_num_batched_tokens}"]
    by_hand = CapacitySearch.plan(files["preset.yaml"], [], sets, ["ttft_p99_ms=500", "tpot_p99_ms=50"], 2, 0.1,
                                  tmp_path / "cs")
    frame = by_hand.run(Executor(1))
    assert frame["capacity_requests_per_s"][0] == pytest.approx(best.capacity_requests_per_s, rel=1e-9)
    assert abs(frame["max_rate"][0] - best.headroom_rate) <= 0.1 * best.capacity_requests_per_s
    assert f"--max-num-seqs {best.max_num_seqs}" in record["launch"][0]["command"]


def test_a_calibrated_device_launches_with_its_block_count(files):
    base = load_scenario(files["tiny.yaml"])
    space = search_space(files["space.yaml"], Flags())
    config = configurations(space, base)[1]
    (launch,) = vllm_serve(config, load_scenario(files["tiny.yaml"], [
        f"{k}={json.dumps(v)}" for k, v in config.at(2).items()]), 2)
    assert launch.replicas == 2 and launch.command.startswith("vllm serve org/model --tensor-parallel-size 2")
    assert "--num-gpu-blocks-override 4000" in launch.command and not launch.notes


@pytest.mark.parametrize(("extra", "says"), [
    (("--slo", "ttft_p99_ms=500", "--gpu", ""), "--gpu '': give a comma-separated list"),
    (("--slo", "tpot_p99_ms=1"), "no configuration can meet the SLOs"),
    (("--slo", "ttft_p99_ms=500", "--prices", "PRICES"), "no price for GPU 'H100-SXM'"),
    (("--slo", "ttft_p99_ms=500", "--objective", "cheap"), "--objective cheap: choose one of"),
    ((), "--slo or --goodput: give at least one"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(files, tmp_path, extra, says):
    prices = tmp_path / "prices.yaml"
    prices.write_text("gpus:\n  L4: {usd_per_gpu_hour: 0.9}\n")
    out = tmp_path / "out"
    result = plan(files["preset.yaml"], *[str(prices) if e == "PRICES" else e for e in extra], "-o", out)
    assert result.exit_code == 2, result.output
    assert says in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()

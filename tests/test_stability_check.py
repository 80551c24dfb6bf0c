"""The stability check that knows about memory and shedding, and the warnings for settings that do nothing."""

from __future__ import annotations

import numpy as np
import pytest
from test_cli import SCENARIOS, invoke, table_value

from simbatch.analysis.capacity import expected_stability, mean_blocks_held, memory_batch
from simbatch.app import results
from simbatch.inputs.loading import load_scenario
from simbatch.simulation import simulate
from simbatch.workload import generate


def _check(name: str, overrides: list[str] | None = None):
    scenario = load_scenario(SCENARIOS / f"{name}.yaml", overrides)
    return expected_stability(scenario, generate(scenario))


def test_mean_blocks_held_is_the_length_weighted_mean_of_every_step():
    rng = np.random.default_rng(7)
    prompt, output = rng.integers(1, 300, 200), rng.integers(1, 400, 200)
    for block_size in (1, 7, 16):
        # Brute force: request i holds P, P+1, ..., P+O-1 tokens over its O steps.
        steps = [-(-np.arange(p, p + o) // block_size) for p, o in zip(prompt, output, strict=True)]
        expected = sum(s.sum() for s in steps) / output.sum()
        assert mean_blocks_held(prompt, output, block_size) == pytest.approx(expected, rel=1e-12)
    assert memory_batch(1024, 64.0) == 16 and memory_batch(1024, 0.0) == np.inf


def test_memory_pressure_is_limited_by_memory_as_the_simulation_shows():
    st = _check("memory_pressure")
    assert st.limited_by == "memory" and st.slots == 64 and st.batch_size == st.memory_batch
    assert 16 < st.memory_batch < 20
    assert not st.stable and "(KV memory limits the batch)" in st.verdict
    # While requests wait, memory is what holds the batch back: the running count, averaged over
    # time, is the predicted memory batch (within the blocks lost to rounding and preemption).
    iterations = simulate(load_scenario(SCENARIOS / "memory_pressure.yaml")).iterations
    busy = iterations[iterations["num_waiting"] > 0]
    running = np.average(busy["num_running"], weights=busy["num_steps"] * busy["duration_s"])
    assert running == pytest.approx(st.memory_batch, rel=0.06)


def test_slots_bind_when_memory_is_ample():
    st = _check("stable")
    assert st.limited_by == "slots" and st.batch_size == 64 and st.verdict == "stable (offered load 77%)"


def test_the_chapter_example_needs_six_replicas():
    st = _check("oversubscribed")
    assert st.replicas_needed == 6 and "6 replicas would carry it" in st.verdict
    assert _check("oversubscribed", ["cluster.replicas=6"]).stable
    assert not _check("oversubscribed", ["cluster.replicas=5"]).stable
    result = invoke("capacity", SCENARIOS / "oversubscribed.yaml")
    assert table_value(result.stdout, "Replicas the traffic needs (ρ < 1):") == 6


@pytest.mark.parametrize("cap", ["scheduler.max_waiting=64", "cluster.max_in_flight=128"])
def test_admission_control_turns_growth_into_shedding(cap):
    st = _check("oversubscribed", [cap, "workload.duration_s=600"])
    assert st.admission_control and st.shed_fraction == pytest.approx(1 - 1 / 5.125)
    assert st.verdict.startswith("overloaded 5.1×: shedding about 80% of requests (429s); 6 replicas")
    # Over a long horizon the simulated server rejects about that share.
    summary = simulate(load_scenario(SCENARIOS / "oversubscribed.yaml", [cap, "workload.duration_s=600"])).summary
    assert summary["rejected"] / summary["num_requests"] == pytest.approx(st.shed_fraction, abs=0.03)


def test_printed_names(tmp_path):
    out = invoke("run", SCENARIOS / "stable.yaml", "--set", "workload.duration_s=5", "--no-plots",  # the text only
                 "--out", tmp_path / "o").stdout
    assert "Offered load ρ (demand / capacity):" in out and "Busy fraction (%):" in out
    assert "tilization" not in out


@pytest.mark.parametrize(("overrides", "warning"), [
    (["kv_cache.num_blocks=4"], "every request would be rejected (never_fits)"),
    (["batching.enable_chunked_prefill=false", "workload.prompt_tokens.value=4000"],
     "every request would be rejected (prompt_exceeds_budget)"),
    (["workload.arrival.burstiness=0.5"], "burstiness has no effect with process poisson"),
    (["scheduler.aging_s=2"], "aging_s has no effect under policy fcfs"),
    (["scheduler.policy=fair", "scheduler.tenant_weights={gold: 2}"], "tenant_weights names 'gold'"),
    (["scheduler.tenant_weights={default: 2}"], "tenant_weights has no effect under policy fcfs"),
    (["scheduler.sjf_key=output"], "sjf_key has no effect"),
    (["batching.max_wait_ms=5"], "max_wait_ms has no effect in continuous mode"),
    (["batching.max_queue_delay_ms=5"], "max_queue_delay_ms has no effect in continuous mode"),
    (["batching.mode=static", "batching.long_prefill_token_threshold=64"], "long_prefill_token_threshold"),
    (["kv_cache.swap_blocks=100"], "swap_blocks has no effect with preemption: recompute"),
])
def test_settings_that_do_nothing_are_warned_about(overrides, warning, tmp_path, monkeypatch):
    monkeypatch.setattr(results, "write_run", lambda folder, result, **_: folder)  # no files needed
    args = [a for o in ["workload.duration_s=5", *overrides] for a in ("--set", o)]
    result = invoke("run", SCENARIOS / "stable.yaml", *args, "--out", tmp_path / "out", "-q")
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ") and warning in lines[0], lines


def test_validate_warns_about_what_no_mode_uses_but_not_another_mode_s_knobs():
    # heavy_tail.yaml sets static and dynamic knobs for `compare`: no warning for those.
    for path in sorted(SCENARIOS.glob("*.yaml")):
        assert invoke("validate", path).stderr == "", path.name
    result = invoke("validate", SCENARIOS / "stable.yaml", "--set", "batching.max_wait_ms=5",
                    "--set", "scheduler.aging_s=2")
    assert result.stderr == "warning: scheduler.aging_s has no effect under policy fcfs; it ages priorities " \
                            "(policy: priority)\n"

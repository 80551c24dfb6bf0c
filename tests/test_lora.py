"""Multi-LoRA: vLLM's max_loras rule, LRU adapter slots on the GPU and the host, and what loads cost."""

from __future__ import annotations

import numpy as np
import pytest
from builders import req

from simbatch.features.lora import MultiLora, lru_hit_rate
from simbatch.inputs.loading import ScenarioError, scenario_from_dict
from simbatch.observe.observers import Observer
from simbatch.simulation import simulate

BASE = {"seed": 2, "workload": {"num_requests": 300, "arrival": {"rate": 6.0},
                                "prompt_tokens": {"dist": "uniform", "low": 50, "high": 500},
                                "output_tokens": {"dist": "uniform", "low": 10, "high": 150}},
        "device": {"tau0_ms": 5.0, "beta_ms": 0.1, "prefill_ms_per_token": 0.05}}


def _spec(count: int | None, **lora) -> dict:
    spec = {**BASE, "workload": dict(BASE["workload"])}
    if count is not None:
        spec["lora"] = {"host_link_gb_s": 25.0, "adapter_bytes": 8.4e7, **lora}
        spec["workload"]["adapters"] = {"count": count}
    return spec


def test_an_adapter_of_llama_3_1_8b_weighs_its_matrices():
    """Rank 16 on the seven linear modules: 16 x (8192 + 5120 + 5120 + 8192 + 3 x 18432) x 32 layers x 2 bytes."""
    scenario = scenario_from_dict({"workload": {"num_requests": 1}, "device": {"preset": "llama-3.1-8b/H100-SXM"},
                                   "lora": {"host_link_gb_s": 25.0}})
    assert scenario.lora.adapter_bytes == 16 * 81_920 * 32 * 2 == 83_886_080
    assert scenario.resolution["lora.adapter_bytes"].source == "preset"


def test_links_and_kv_bytes_come_from_the_preset_gpu_card():
    """Without a link or KV size of their own, the host tier and LoRA take the preset GPU's host link and
    the model's KV bytes for the cache's dtype, and say so; without a preset they are refused by name."""
    preset = {"workload": {"num_requests": 1}, "device": {"preset": "llama-3.1-8b/H100-SXM"},
              "kv_cache": {"enable_prefix_caching": True, "host_blocks": 100, "dtype": "fp8"}, "lora": {}}
    scenario = scenario_from_dict(preset)
    card_link = scenario.resolution["kv_cache.host_link_gb_s"]
    assert card_link.source == "preset" and card_link.value > 0
    assert scenario.kv_cache.host_link_gb_s == scenario.lora.host_link_gb_s == card_link.value
    assert scenario.kv_cache.kv_bytes_per_token == 131_072 // 2  # 32 layers x 8 KV heads x 128 x K and V, fp8
    bare = {"workload": {"num_requests": 1}, "kv_cache": {"enable_prefix_caching": True, "host_blocks": 100,
                                                          "kv_bytes_per_token": 131072}}
    with pytest.raises(ScenarioError, match="kv_cache.host_link_gb_s"):
        scenario_from_dict(bare)
    with pytest.raises(ScenarioError, match="lora.host_link_gb_s"):
        scenario_from_dict({"workload": {"num_requests": 1}, "lora": {"adapter_bytes": 8.4e7}})


def test_lru_hit_rate_closed_forms():
    assert lru_hit_rate(np.full(10, 0.1), 4) == pytest.approx(0.4)
    assert lru_hit_rate(np.full(3, 1 / 3), 5) == 1.0
    # Che's approximation against an LRU cache fed independent Zipf references.
    p = 1 / np.arange(1, 31)
    p /= p.sum()
    refs = np.random.default_rng(0).choice(30, size=40_000, p=p)
    cache: dict[int, None] = {}
    hits = 0
    for k in refs.tolist():
        if k in cache:
            hits += 1
            del cache[k]
        elif len(cache) >= 5:
            del cache[next(iter(cache))]
        cache[k] = None
    assert hits / len(refs) == pytest.approx(lru_hit_rate(p, 5), abs=0.01)


def test_a_step_takes_at_most_max_loras_adapters_and_loads_into_the_least_recent_free_slot():
    feature = MultiLora(scenario_from_dict({**_spec(5, max_loras=2, max_cpu_loras=3)}))
    a, b, c, a2 = (req(i, 10, 1) for i in range(4))
    a.lora_id, b.lora_id, c.lora_id, a2.lora_id = 0, 1, 2, 0
    base = req(9, 10, 1)
    for r in (a, b):
        assert feature.admits(r)
        feature.admitted(r)
    assert not feature.admits(c) and feature.admits(a2) and feature.admits(base)  # the base model needs no slot
    feature.left(a)  # adapter 0 is no running request's: its slot may go
    assert feature.admits(c)
    feature.admitted(c)
    assert list(feature.gpu) == [1, 2] and list(feature.cpu) == [0, 1, 2]
    link_ms, storage_ms = 8.4e7 / 25e9 * 1e3, 8.4e7 / 2e9 * 1e3
    assert c.lora_load_ms == pytest.approx(link_ms + storage_ms) and (c.lora_loads, c.lora_storage_loads) == (1, 1)
    feature.left(b)
    feature.admitted(a2)  # back from host memory: the link alone
    assert a2.lora_load_ms == pytest.approx(link_ms) and a2.lora_storage_loads == 0
    assert list(feature.gpu) == [2, 0]


def test_one_adapter_that_costs_nothing_to_load_is_the_base_model():
    without = simulate(scenario_from_dict(_spec(None)), check_invariants=True)
    one = simulate(scenario_from_dict(_spec(1, adapter_bytes=1e-3)), check_invariants=True)
    assert without.requests.equals(one.requests[list(without.requests.columns)])
    assert without.iterations.equals(one.iterations)
    assert one.summary["lora_loads"] == 1


class _Adapters(Observer):
    """The most distinct adapters any step ran."""

    def __init__(self):
        self.most = 0

    def step(self, replica, start_s, duration_s, plan, done):
        reqs = [*plan.decodes, *(r for r, _ in plan.slices)]
        self.most = max(self.most, len({r.lora_id for r in reqs if r.lora_id >= 0}))


@pytest.mark.parametrize("fast_forward", [False, True])
def test_no_step_holds_more_than_max_loras_adapters(fast_forward):
    seen = _Adapters()
    spec = {**_spec(12, max_loras=3, max_cpu_loras=6), "sim": {"fast_forward": fast_forward}}
    result = simulate(scenario_from_dict(spec), check_invariants=True, observers=[seen])
    assert seen.most == 3
    s = result.summary
    assert s["lora_loads"] > 3 and s["lora_storage_loads"] <= s["lora_loads"]
    assert result.requests["lora_load_ms"].max() > 0


@pytest.mark.parametrize(("spec", "words"), [
    ({"workload": {"num_requests": 1, "adapters": {"count": 3}}}, "no lora section"),
    ({"workload": {"num_requests": 1}, "lora": {"host_link_gb_s": 25, "max_loras": 4, "max_cpu_loras": 2,
                                                "adapter_bytes": 1e6}}, "max_cpu_loras"),
    ({"workload": {"num_requests": 1}, "lora": {"host_link_gb_s": 25}}, "adapter_bytes"),
    ({"workload": {"num_requests": 1}, "batching": {"mode": "static"},
      "lora": {"host_link_gb_s": 25, "adapter_bytes": 1e6}}, "batching.mode static"),
])
def test_lora_that_cannot_work_is_refused(spec, words):
    with pytest.raises(ScenarioError, match=words):
        scenario_from_dict(spec)


TRACE = "t,in,out,adapter\n3,40,4,chat\n1,40,4,\n2,40,4,sql\n4,40,4, sql \n5,40,4,chat\n"
TRACE_SPEC = {"trace": {"path": "trace.csv", "timestamp_column": "t", "prompt_column": "in", "output_column": "out",
                        "adapter_column": "adapter"}}
LORA = {"max_loras": 1, "max_cpu_loras": 2, "host_link_gb_s": 25.0, "adapter_bytes": 8.4e7}


def test_a_trace_names_each_request_s_adapter(tmp_path):
    """Adapters by name, numbered in order of first arrival, the base model where the cell is empty; one GPU
    slot, so each change of adapter loads (sql, chat, sql, chat: four loads, two read from storage)."""
    (tmp_path / "trace.csv").write_text(TRACE)
    result = simulate(scenario_from_dict({"workload": TRACE_SPEC, "lora": LORA,
                                          "device": {"tau0_ms": 1.0, "beta_ms": 0.0}}, base_dir=tmp_path),
                      check_invariants=True)
    rq = result.requests.sort_values("request_id")
    assert rq["lora_id"].tolist() == [-1, 0, 1, 0, 1]
    assert rq["lora_loads"].tolist() == [0, 1, 1, 1, 1] and rq["lora_storage_loads"].tolist() == [0, 1, 1, 0, 0]


@pytest.mark.parametrize(("extra", "words"), [
    ({"adapters": {"count": 3}}, "adapters would be ignored"),
    ({}, "adapter_column names LoRA adapters, but the server has no lora section"),
])
def test_a_trace_s_adapters_need_lora_and_no_second_source(tmp_path, extra, words):
    (tmp_path / "trace.csv").write_text(TRACE)
    spec = {"workload": {**TRACE_SPEC, **extra}, **({"lora": LORA} if extra else {})}
    with pytest.raises(ScenarioError, match=words):
        scenario_from_dict(spec, base_dir=tmp_path)


def test_a_missing_adapter_column_is_named(tmp_path):
    (tmp_path / "trace.csv").write_text(TRACE.replace("adapter", "lora"))
    scenario = scenario_from_dict({"workload": TRACE_SPEC, "lora": LORA}, base_dir=tmp_path)
    with pytest.raises(ScenarioError, match="adapter_column"):
        simulate(scenario)

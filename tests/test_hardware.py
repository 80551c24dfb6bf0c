"""Presets, KV blocks from memory, calibration and the fit report (simbatch/hardware).

The measured data are the copies shipped in simbatch/data/measured (of ../shared/data beside the
repository), read by the tests as by the scripts; where the originals are present, the copies must equal them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from pydantic import ValidationError
from test_cli import invoke, write_scenario
from test_docs import _script

from simbatch.config import Device, Scenario, replica_scenarios
from simbatch.hardware import measured
from simbatch.hardware.calibrate import PARAMS, calibrate
from simbatch.hardware.cards import GpuCard, ModelCard, shipped
from simbatch.hardware.fit_report import errors_by_dataset
from simbatch.hardware.memory import (
    GIB,
    NON_TORCH_BYTES,
    SAMPLER_LOGITS_COPIES,
    activation_reserve_bytes,
    logged_kv_caches,
)
from simbatch.hardware.preset import fitted, parse
from simbatch.hardware.report import preset_block
from simbatch.inputs.resolve import deployment, resolve, resolve_device
from simbatch.model.cost import LinearCost
from simbatch.simulation import simulate

ROOT = Path(__file__).resolve().parents[1]


def scenario(**sections) -> Scenario:
    return resolve(Scenario.model_validate({"workload": {"num_requests": 10}, **sections}))


# --------------------------------------------------------------------------- cards and presets
def test_the_cards_cover_the_issue():
    gpus, models = shipped()
    assert {"A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "L40S", "L4", "A10G", "MI300X", "RTX-4090",
            "RTX-PRO-6000", "B200", "GB200", "H20", "MI325X"} <= set(gpus)
    assert {"llama-3.1-8b", "llama-3.1-70b", "llama-2-7b", "llama-2-13b", "llama-2-70b", "mistral-7b",
            "mixtral-8x7b", "qwen2.5-7b", "qwen2.5-32b", "qwen2.5-72b"} <= set(models)
    assert all(card.source for card in [*gpus.values(), *models.values()])
    assert models["mixtral-8x7b"].active_b < models["mixtral-8x7b"].params / 1e9
    assert {"qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b", "llama-3.2-1b",
            "llama-3.2-3b", "llama-3.3-70b", "mistral-small-24b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b",
            "gpt-oss-120b", "deepseek-v3"} <= set(models)
    assert not any(card.params_b or card.active_params_b for card in models.values())  # counted, never typed


# Parameters as each model card publishes them, billions: (total, active or None, tolerance). Active
# counts the output head but not the input embedding where the publisher says so (gpt-oss, DeepSeek).
PUBLISHED = {"llama-3.1-8b": (8.03, None, 0.002), "llama-3.1-70b": (70.6, None, 0.002), "llama-3.2-1b": (1.24, None, 0.005),
             "llama-3.2-3b": (3.21, None, 0.005), "llama-2-7b": (6.74, None, 0.002), "llama-2-13b": (13.0, None, 0.005),
             "llama-2-70b": (69.0, None, 0.002), "codellama-34b": (33.7, None, 0.005), "mistral-7b": (7.24, None, 0.002),
             "mistral-small-24b": (23.572, None, 0.001), "qwen2.5-7b": (7.61, None, 0.002),
             "qwen2.5-72b": (72.7, None, 0.002), "qwen-72b": (72.3, None, 0.002), "qwen3-0.6b": (0.6, None, 0.01),
             "qwen3-1.7b": (1.7, None, 0.02), "qwen3-4b": (4.0, None, 0.01), "qwen3-8b": (8.2, None, 0.005),
             "qwen3-14b": (14.8, None, 0.005), "qwen3-32b": (32.8, None, 0.005), "gpt-j-6b": (6.05, None, 0.002),
             "mixtral-8x7b": (46.7, 12.9, 0.003), "qwen3-30b-a3b": (30.5, 3.3, 0.02),
             "qwen3-235b-a22b": (235.0, 22.0, 0.01), "gpt-oss-20b": (20.91, 3.61, 0.003),
             "gpt-oss-120b": (116.83, 5.13, 0.003), "deepseek-v3": (671.0, 36.6, 0.002)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameters_counted_from_the_shapes_are_the_published_ones(name):
    card = shipped()[1][name]
    total, active, tol = PUBLISHED[name]
    assert card.params / 1e9 == pytest.approx(total, rel=tol)
    if active is not None:
        counted = card.active_params - (card.vocab_size * card.hidden_size if name.startswith(("gpt-oss", "deepseek"))
                                        else 0)
        assert counted / 1e9 == pytest.approx(active, rel=max(tol, 0.005))


def test_a_card_from_a_hugging_face_config_is_the_shipped_card():
    """The shapes read from each config.json are the shipped card's (tests/data/hf_configs has the files)."""
    folder = ROOT / "tests" / "data" / "hf_configs"
    pairs = {"Qwen3-0.6B": "qwen3-0.6b", "Qwen3-8B": "qwen3-8b", "Qwen3-32B": "qwen3-32b",
             "Qwen3-30B-A3B": "qwen3-30b-a3b", "Mixtral-8x7B-v0.1": "mixtral-8x7b", "DeepSeek-V3": "deepseek-v3",
             "Llama-3.2-1B-Instruct": "llama-3.2-1b", "gpt-oss-20b": "gpt-oss-20b"}
    models = shipped()[1]
    for file, name in pairs.items():
        card = ModelCard.model_validate({"hf_config": str(folder / f"{file}.json")})
        assert card.name == file
        assert card.model_dump(exclude={"name", "source"}) == models[name].model_dump(exclude={"name", "source"}), file
    # In a scenario, the path is the scenario file's (relative to its folder); the preset names the card.
    sc_dir = ROOT / "tests" / "data"
    dev = Device.model_validate({"preset": "Qwen3-30B-A3B/H100", "model_card": {"hf_config": "hf_configs/Qwen3-30B-A3B.json"}},
                                context={"base_dir": sc_dir})
    d = deployment(dev)
    assert d.model.num_experts == 128 and d.gpu.name == "H100-SXM"


def test_hf_config_errors_are_one_line(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "partial.json").write_text('{"hidden_size": 4096}')
    for file, says in [("missing.json", "file not found"), ("bad.json", "not a readable JSON"),
                       ("list.json", "a JSON object"), ("partial.json", "none of num_hidden_layers")]:
        with pytest.raises(ValidationError, match=says):
            ModelCard.model_validate({"hf_config": str(tmp_path / file)})
        result = invoke("presets", "--hf-config", tmp_path / file)
        assert result.exit_code == 2 and says in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_presets_prints_the_card_of_a_config():
    path = ROOT / "tests" / "data" / "hf_configs" / "DeepSeek-V3.json"
    result = invoke("presets", "--hf-config", path)
    assert result.exit_code == 0, result.stderr
    card = yaml.safe_load(result.stdout)["model_card"]
    assert card["kv_lora_rank"] == 512 and card["num_experts"] == 256 and "params_b" not in card
    assert "671.026B" in result.stdout and "add /fp8" in result.stdout
    shown = invoke("presets", "--hf-config", path, "DeepSeek-V3/H200/tp8/fp8")
    assert shown.exit_code == 0, shown.stderr and "tau0_ms" in shown.stdout


def test_every_gpu_card_has_its_power_host_link_and_cuda_memory():
    for card in shipped()[0].values():
        assert card.visible_memory_gib is not None and card.host_link_gb_s is not None, card.name
        assert 0 < card.idle_watts < card.max_watts, card.name
        assert card.memory_gib - 4 < card.cuda_memory_gib <= card.memory_gib, card.name  # ECC GDDR loses most


def test_aliases_name_one_card_each_and_resolve():
    gpus = shipped()[0]
    names = [n.lower() for card in gpus.values() for n in (card.name, *card.aliases)]
    assert len(names) == len(set(names))
    assert parse("llama-3.1-8b/H100").gpu.name == "H100-SXM"
    assert parse("llama-3.1-8b/nvidia geforce rtx 4090").gpu.name == "RTX-4090"
    assert parse("llama-3.1-8b/A100").gpu.name == "A100-80GB"
    # GeForce: the fp32-accumulate rate vLLM's GEMMs run at, half the fp16-accumulate one.
    assert gpus["RTX-4090"].bf16_tflops == pytest.approx(165.2)


def test_a_preset_is_the_physics_over_the_fitted_efficiencies():
    eff, _ = fitted()
    card = shipped()[1]["llama-3.1-8b"]
    head = card.vocab_size * card.hidden_size  # the output head, and as large the input embedding
    ms = parse("llama-3.1-8b/H100-SXM").device_ms(eff)
    # The weights a step streams: all but the input embedding, of which it gathers a few rows.
    weights = (card.params - head) * 2 / (3350e9 * eff.weights_bandwidth) * 1e3
    assert ms["weights_ms"] == pytest.approx(weights)
    assert ms["tau0_ms"] == pytest.approx(eff.step_overhead_ms + 32 * eff.layer_overhead_us / 1e3)
    assert ms["beta_ms"] == pytest.approx(2 * (card.params - head) / (989e12 * eff.decode_flops) * 1e3)
    # A prompt token skips the output head too: only a prompt's last token is sampled.
    assert ms["prefill_ms_per_token"] == pytest.approx(2 * (card.params - 2 * head) / (989e12 * eff.linear_flops) * 1e3)
    assert ms["kv_read_ms_per_1k_tokens"] == pytest.approx(1e3 * 2 * 32 * 8 * 128 * 2 / (3350e9 * eff.kv_bandwidth) * 1e3)
    assert ms["prefill_attention_ms_per_1m_pairs"] == pytest.approx(
        1e6 * 4 * 32 * 32 * 128 / (989e12 * eff.attention_flops) * 1e3)
    # fp8 halves the weights but the output head, which stays bf16; tp2 halves them again and adds the
    # all-reduces; an fp8 KV cache halves the KV read.
    fp8 = parse("llama-3.1-8b/H100-SXM/fp8").device_ms(eff)
    assert fp8["weights_ms"] == pytest.approx(((card.params - 2 * head) * 1 + head * 2) / (3350e9 * eff.weights_bandwidth) * 1e3)
    tp2 = parse("llama-3.1-8b/h100-sxm/tp2").device_ms(eff)
    assert tp2["weights_ms"] == pytest.approx(weights / 2)
    assert tp2["tau0_ms"] == pytest.approx(ms["tau0_ms"] + 2 * 32 * eff.allreduce_us / 1e3)
    assert tp2["kv_read_ms_per_1k_tokens"] == pytest.approx(ms["kv_read_ms_per_1k_tokens"] / 2)
    kv8 = parse("llama-3.1-8b/H100-SXM", kv_dtype="fp8").device_ms(eff)
    assert kv8["kv_read_ms_per_1k_tokens"] == pytest.approx(ms["kv_read_ms_per_1k_tokens"] / 2)
    # GDDR streams at its own share of the peak.
    gddr = parse("llama-3.1-8b/L40S").device_ms(eff)
    assert gddr["weights_ms"] == pytest.approx((card.params - head) * 2 / (864e9 * eff.gddr_weights_bandwidth) * 1e3)


def test_a_card_measured_with_vllms_kernels_replaces_the_fitted_fractions():
    """The RTX 4090's and the RTX PRO 6000's cards carry the fractions of their peaks vLLM 0.19's kernels
    reach on them (a profile of one decoder layer's modules on each, shipped), in place of what the
    datacenter cards' fit says: they are what each profile gives, and they replace the fitted ones for
    that card only (the matrix multiplies' for bf16 weights only, the KV reads' for a bf16 cache only:
    the profiles are of bf16)."""
    eff, _ = fitted()
    gpus = shipped()[0]
    # What each profile gives: the weights' stream, a prompt token's multiplies, decode attention's KV reads.
    expected = {"RTX-4090": {"gddr_weights_bandwidth": (0.88, 0.93), "linear_flops": (0.9, 0.95),
                             "kv_bandwidth": (0.88, 0.93)},
                "RTX-PRO-6000": {"gddr_weights_bandwidth": (0.78, 0.83), "linear_flops": (0.7, 0.75),
                                 "kv_bandwidth": (0.78, 0.83)}}
    assert set(measured.LAYER_PROFILES) == set(expected)
    for gpu, bounds in expected.items():
        given = gpus[gpu].measured_efficiency.given()
        profiled = measured.layer_profile_fractions(gpu)
        assert set(given) == set(profiled) == set(bounds), gpu
        for name, value in profiled.items():
            assert given[name] == pytest.approx(value, abs=5e-5), (gpu, name)
            assert bounds[name][0] < value < bounds[name][1], (gpu, name, value)
        # Both cards' KV reads come in below the fit's (H100 kernels, HBM): GDDR streams a cache slower.
        assert given["kv_bandwidth"] < eff.kv_bandwidth
        preset = f"llama-3.1-8b/{gpu}"
        u, ms = parse(preset).unit_seconds(), parse(preset).device_ms(eff)
        assert ms["weights_ms"] == pytest.approx(1e3 * u["W"] / given["gddr_weights_bandwidth"])
        assert ms["prefill_ms_per_token"] == pytest.approx(1e3 * u["LIN"] / given["linear_flops"])
        assert ms["kv_read_ms_per_1k_tokens"] == pytest.approx(1e6 * u["KV"] / given["kv_bandwidth"])
        assert ms["beta_ms"] == pytest.approx(1e3 * u["DEC"] / eff.decode_flops)  # not measured: the fit's
        fp8_u, fp8 = parse(f"{preset}/fp8").unit_seconds(), parse(f"{preset}/fp8").device_ms(eff)
        assert fp8["prefill_ms_per_token"] == pytest.approx(1e3 * fp8_u["LIN"] / eff.linear_flops)
        assert fp8["weights_ms"] == pytest.approx(1e3 * fp8_u["W"] / given["gddr_weights_bandwidth"])
        kv8 = parse(preset, kv_dtype="fp8")
        assert kv8.device_ms(eff)["kv_read_ms_per_1k_tokens"] == pytest.approx(1e6 * kv8.unit_seconds()["KV"]
                                                                               / eff.kv_bandwidth)
    # Every other shipped card has none, and a card's fraction is bounded.
    assert sorted(g.name for g in gpus.values() if g.measured_efficiency.given()) == sorted(expected)
    card = gpus["RTX-4090"]
    with pytest.raises(ValidationError, match="linear_flops"):
        GpuCard(**{**card.model_dump(), "measured_efficiency": {"linear_flops": 2.0}})
    with pytest.raises(ValidationError, match="decode_flops"):
        GpuCard(**{**card.model_dump(), "measured_efficiency": {"decode_flops": 0.5}})


def test_the_rtx_pro_6000s_interconnect_is_a_measured_all_reduce_over_pcie():
    """No NVLink: the card's all-reduce bandwidth is NCCL's measured ring bus bandwidth over PCIe Gen5
    (about 46.5 GB/s), not the link's 128 GB/s both ways; with the law's fixed latency per all-reduce
    that gives the measured times at the sizes inference sends (1 MiB: 81 us, 4 MiB: 182 us on 8 GPUs,
    voipmonitor/rtx6kpro) 13 % and 15 % high."""
    eff, _ = fitted()
    card = shipped()[0]["RTX-PRO-6000"]
    assert card.interconnect_gb_s == 46.5 and "voipmonitor/rtx6kpro" in card.source
    for size_mb, measured_us in ((1, 81.08), (4, 182.49)):
        ring_bytes = 2 * 7 / 8 * size_mb * 2**20  # what an 8-GPU ring moves through each GPU's link
        law_us = eff.allreduce_us + 1e6 * ring_bytes / (card.interconnect_gb_s * 1e9)
        assert measured_us < law_us < 1.16 * measured_us, size_mb
    # A Qwen3-32B TP2 token's all-reduce traffic now costs its measured bandwidth.
    u = parse("qwen3-32b/RTX-PRO-6000/tp2").unit_seconds()
    assert u["COMM"] == pytest.approx(2 * 64 * 5120 * 2 / 46.5e9)


def test_the_rtx_pro_6000s_moe_block_costs_what_its_profile_measured():
    """Qwen3-30B-A3B's MoE block (router and fused experts) timed by vLLM 0.19 on an RTX PRO 6000 (the
    shipped profile, 128 experts on one GPU): at decode batches (8-64 tokens) of 64 or 128 distinct
    experts, the preset's expert reads (the weights' measured stream) come within 4 % of it; from 256
    tokens on the block's multiplies add to the reads. There is no fixed cost per layer to add: with 8
    experts and up to 16 tokens the block takes what their stream takes (within 10 %), and beyond the 8
    experts' weights at the card's whole 1792 GB/s it leaves at most 16 µs a layer (docs/hardware.md)."""
    eff, _ = fitted()
    d = parse("qwen3-30b-a3b/RTX-PRO-6000")
    per_expert_us = 1e3 * d.device_ms(eff)["moe"]["expert_read_ms"] / d.model.moe_layers
    assert per_expert_us == pytest.approx(1e6 * 3 * 2048 * 768 * 2 / (1792e9 * 0.8078), rel=1e-3)
    moe = pd.read_csv(measured.DATA / "llmservingsim_rtxpro6000_qwen3_30b_a3b_moe.csv")
    decode = moe[moe.tokens.between(8, 64) & (moe.activated_experts >= 64)]
    ratio = decode.time_us / (decode.activated_experts * per_expert_us)
    assert len(decode) == 7 and ratio.between(0.97, 1.04).all()
    big = moe[(moe.tokens >= 256) & (moe.activated_experts == 64)]
    assert (big.time_us > 1.1 * 64 * per_expert_us).all()
    few = moe[(moe.tokens <= 16) & (moe.activated_experts == 8)]
    assert len(few) == 5 and (few.time_us / (8 * per_expert_us)).between(0.96, 1.10).all()
    assert (few.time_us - 8 * 1e6 * 3 * 2048 * 768 * 2 / 1792e9).max() < 16


def test_a_moe_reads_the_experts_its_tokens_choose():
    """Mixtral: 8 experts, 2 per token. A step of T tokens reads 8 (1 - (3/4)^T) of them per layer:
    two at batch 1, all eight under load; the attention and the output head whatever the tokens."""
    eff, _ = fitted()
    mix = shipped()[1]["mixtral-8x7b"]
    dev = resolve_device(Device(preset="mixtral-8x7b/H100-SXM"))
    expert_bytes = 3 * 4096 * 14336 * 2 * 32  # one expert's gate, up and down projections, every layer, bf16
    assert dev.moe.num_experts == 8 and dev.moe.experts_per_token == 2 and dev.moe.local_experts == 8
    assert dev.moe.expert_read_ms == pytest.approx(expert_bytes / (3350e9 * eff.weights_bandwidth) * 1e3, rel=1e-5)
    dense = mix.params - mix.expert_weights - mix.vocab_size * mix.hidden_size
    assert dev.weights_ms == pytest.approx(dense * 2 / (3350e9 * eff.weights_bandwidth) * 1e3, rel=1e-5)
    cost = LinearCost.of(dev)
    assert cost.experts_ms(1) == pytest.approx(2 * dev.moe.expert_read_ms)
    assert cost.experts_ms(4) == pytest.approx(8 * (1 - 0.75**4) * dev.moe.expert_read_ms)
    assert cost.experts_ms(200) == pytest.approx(8 * dev.moe.expert_read_ms)
    # Expert parallelism over four GPUs at tp2 (two data-parallel ranks): each GPU holds two whole experts
    # and serves both ranks' tokens.
    ep = resolve_device(Device(preset="mixtral-8x7b/H100-SXM/tp2/ep4"))
    assert ep.moe.local_experts == 2 and ep.moe.data_parallel_size == 2
    assert ep.moe.expert_read_ms == pytest.approx(dev.moe.expert_read_ms, rel=1e-5)
    assert LinearCost.of(ep).experts_ms(1) == pytest.approx(2 * (1 - 0.75**2) * ep.moe.expert_read_ms)
    with pytest.raises(ValidationError, match="no experts to spread"):
        resolve_device(Device(preset="llama-3.1-8b/H100-SXM/ep2"))
    with pytest.raises(ValidationError, match="multiple of tp2"):
        resolve_device(Device(preset="mixtral-8x7b/H100-SXM/tp2/ep3"))


def test_mla_caches_its_latent_whole_on_every_gpu():
    d = parse("deepseek-v3/H200/tp8/fp8")
    assert d.kv_bytes_per_token == 61 * 576 * 2  # kv_lora_rank 512 + rotary key 64, bf16, not split by TP
    assert parse("deepseek-v3/H200/tp8/fp8", kv_dtype="fp8").kv_bytes_per_token == 61 * 576


def test_every_model_on_every_gpu_derives_finite_costs():
    gpus, models = shipped()
    for m in models:
        for g in gpus:
            sc = scenario(device={"preset": f"{m}/{g}"})
            costs, dev = sc.resolution.sources("device"), sc.device
            assert set(costs.values()) == {"preset"} and "weights_ms" in costs
            values = [getattr(dev, k) for k in costs if k != "moe"]
            if dev.moe is not None:
                values.append(dev.moe.expert_read_ms)
            assert all(0 < v < math.inf for v in values), f"{m}/{g}"


def test_presets_shows_one_preset_derived():
    result = invoke("presets", "llama-3.1-70b/H100-SXM/tp4")
    assert result.exit_code == 0
    assert "kv_read_ms_per_1k_tokens" in result.stdout and "kv_cache.num_blocks: auto" in result.stdout
    assert "no room for the KV cache" in invoke("presets", "llama-3.1-70b/L4").stdout
    bad = invoke("presets", "llama-9/H100-SXM")
    assert bad.exit_code == 2 and "unknown model 'llama-9'" in bad.stderr


@pytest.mark.parametrize(("preset", "says"), [
    ("llama-3.1-8b", "<model>/<gpu>"), ("gpt-5/H100-SXM", "unknown model 'gpt-5'"),
    ("llama-3.1-8b/TPU-v5e", "unknown GPU 'TPU-v5e'"), ("llama-3.1-8b/A100-80GB/fp8", "no fp8"),
    ("llama-3.1-8b/H100-SXM/tp3", "do not split over tp3"), ("llama-3.1-8b/H100-SXM/int4", "'int4' is neither"),
    ("llama-3.1-8b/H100-SXM/fp8/fp8", "given twice")])
def test_bad_presets_say_what_to_write(preset, says):
    with pytest.raises(ValidationError, match=says):
        resolve_device(Device(preset=preset))


def test_explicit_keys_override_the_preset_and_sources_say_so():
    sc = scenario(device={"preset": "llama-3.1-8b/H100-SXM", "beta_ms": 0.5})
    dev = sc.device
    derived = parse("llama-3.1-8b/H100-SXM").device_ms(fitted()[0])
    assert dev.beta_ms == 0.5 and dev.tau0_ms == pytest.approx(derived["tau0_ms"], rel=1e-6)
    assert sc.resolution.sources("device") == {
        "tau0_ms": "preset", "beta_ms": "explicit", "prefill_ms_per_token": "preset",
        "kv_read_ms_per_1k_tokens": "preset", "prefill_attention_ms_per_1m_pairs": "preset", "weights_ms": "preset"}
    assert scenario().resolution.sources("device")["tau0_ms"] == "default" and scenario().device.weights_ms is None
    # A fixed cost of one's own: the costs add, and the preset's weight stream is left out.
    own = scenario(device={"preset": "llama-3.1-8b/H100-SXM", "tau0_ms": 9.0})
    assert own.device.weights_ms is None and own.resolution.sources("device")["kv_read_ms_per_1k_tokens"] == "preset"
    # A dumped device (a result folder's resolved config) validates back to the same costs.
    again = Device.model_validate(dev.model_dump())
    assert again.model_dump() == dev.model_dump()


def test_inline_cards_extend_the_shipped_ones():
    gpu = {"name": "my-gpu", "memory_gib": 64, "memory_bandwidth_gb_s": 1000, "bf16_tflops": 200,
           "interconnect_gb_s": 100}
    model = {"name": "tiny", "params_b": 1, "layers": 16, "hidden_size": 2048, "intermediate_size": 8192,
             "q_heads": 16, "kv_heads": 4, "head_dim": 128, "vocab_size": 32000}
    dev = resolve_device(Device(preset="tiny/my-gpu", gpu_card=gpu, model_card=model))
    eff = fitted()[0]
    assert dev.tau0_ms == pytest.approx(eff.step_overhead_ms + 16 * eff.layer_overhead_us / 1e3, rel=5e-6)  # six digits
    streamed = (1e9 - 32000 * 2048) * 2  # params_b as given, less the input embedding
    assert dev.weights_ms == pytest.approx(streamed / (1e12 * eff.weights_bandwidth) * 1e3, rel=5e-6)
    with pytest.raises(ValidationError, match="extra"):
        Device(preset="tiny/my-gpu", gpu_card={**gpu, "colour": "green"}, model_card=model)
    with pytest.raises(ValidationError, match="used by a preset only"):
        Device(gpu_card=gpu)


# --------------------------------------------------------------------------- KV blocks from memory
def test_auto_blocks_follow_vllms_arithmetic():
    sc = scenario(device={"preset": "llama-3.1-8b/H100-SXM"}, kv_cache={"num_blocks": "auto", "block_size": 16},
                  batching={"max_num_seqs": 256, "max_num_batched_tokens": 8192})
    d = parse("llama-3.1-8b/H100-SXM")
    # Weights, and the rotary table of 131,072 positions x 128 in bf16 ("Model loading took 14.99 GiB").
    weights = d.model.params * 2 + 131072 * 128 * 2
    assert weights / GIB == pytest.approx(14.99, abs=0.005)
    # The profiled sampler (fp32 logits of 256 requests, sorted) is the peak, beside the hidden states.
    act = SAMPLER_LOGITS_COPIES * 256 * 128256 * 4 + 8192 * 4096 * 2 + NON_TORCH_BYTES[1]
    assert activation_reserve_bytes(d, 8192, 256) == pytest.approx(act)
    free = 79.18 * GIB * 0.9 - weights - act
    assert sc.kv_cache.num_blocks == int(free // (2 * 32 * 8 * 128 * 2 * 16))
    given = scenario(device={"preset": "llama-3.1-8b/H100-SXM"},
                     kv_cache={"num_blocks": "auto", "activation_reserve_gib": 2.0, "gpu_memory_utilization": 0.8})
    assert given.kv_cache.num_blocks == int((79.18 * 0.8 - 2.0) * GIB - weights) // (131072 * 16)
    # An fp8 cache holds twice the tokens in the same bytes.
    fp8 = scenario(device={"preset": "llama-3.1-8b/H100-SXM"}, kv_cache={"num_blocks": "auto", "dtype": "fp8"},
                   batching={"max_num_seqs": 256, "max_num_batched_tokens": 8192})
    assert fp8.kv_cache.num_blocks == int(free // (2 * 32 * 8 * 128 * 16))
    assert fp8.device.kv_read_ms_per_1k_tokens == pytest.approx(sc.device.kv_read_ms_per_1k_tokens / 2, rel=1e-5)
    # vLLM's logged token count, given directly, needs no preset.
    assert scenario(kv_cache={"gpu_kv_cache_tokens": 100_000}).kv_cache.num_blocks == 6250
    # The resolved scenario (what a result folder records) validates back unchanged.
    assert Scenario.model_validate(sc.model_dump(mode="json")).kv_cache.num_blocks == sc.kv_cache.num_blocks


def test_auto_blocks_match_the_caches_vllm_logged():
    """num_blocks: auto against vLLM's start-up logs (simbatch/data/measured/kv_logs.csv): within 5 % of
    the H200 (348,304 tokens, fp8 cache) and RTX 4090 (41,408) servers, neither of which the sampler's
    constant was fitted on, and of llm-d's H100 logs, which it was. vLLM 0.10 profiled a lighter sampler:
    its caches are larger, and auto stays on the safe side of them."""
    logs = logged_kv_caches().set_index("case")
    assert logs.loc["h200-llama70b-fp8", "error"] == pytest.approx(0, abs=0.05)
    assert logs.loc["rtx4090-llama8b", "error"] == pytest.approx(0, abs=0.05)
    current = logs[~logs.vllm.str.startswith("0.10")]
    assert len(current) >= 7 and (current.error.abs() < 0.05).all(), current.error
    older = logs[logs.vllm.str.startswith("0.10")]
    assert ((older.error < 0) & (older.error > -0.25)).all(), older.error


def test_a_replica_group_with_its_own_gpu_gets_its_own_blocks():
    sc = scenario(device={"preset": "llama-3.1-8b/H100-SXM"}, kv_cache={"num_blocks": "auto"},
                  cluster={"replica_specs": [{"count": 1}, {"count": 1, "device": {"preset": "llama-3.1-8b/H200"}}]})
    h100, h200 = (s.kv_cache.num_blocks for s in replica_scenarios(sc))
    assert h200 > 1.9 * h100 > 0  # 141 GiB against 80: twice the room left once the 15 GiB of weights are in
    shown = preset_block(sc)
    assert "Device costs of cluster.replica_specs.1 (preset llama-3.1-8b/H200)" in shown
    assert f"{h200:,}" in shown and f"{h100:,}" in shown


@pytest.mark.parametrize(("sections", "says"), [
    ({"kv_cache": {"num_blocks": "auto"}}, "kv_cache.num_blocks is auto.*set device.preset"),
    ({"device": {"preset": "llama-3.1-70b/L4"}, "kv_cache": {"num_blocks": "auto"}}, "no room for the KV cache"),
    ({"kv_cache": {"gpu_kv_cache_tokens": 100_000, "num_blocks": 5}}, "gives 6250 blocks.*remove num_blocks")])
def test_auto_blocks_errors_name_the_field_and_the_fix(tmp_path, sections, says):
    with pytest.raises(ValidationError, match=says):
        scenario(**sections)
    path = write_scenario(tmp_path / "s.yaml", {"workload": {"num_requests": 10}, **sections})
    result = invoke("run", path, "--out", tmp_path / "out")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- CLI
def test_run_prints_the_derived_costs_and_their_sources(tmp_path):
    result = invoke("run", ROOT / "scenarios" / "stable.yaml", "--set", "device.preset=llama-3.1-8b/H100-SXM",
                    "--set", "kv_cache.num_blocks=auto", "--set", "workload.duration_s=5", "--no-plots",
                    "--out", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    lines = {ln.split()[0]: ln.split()[-1] for ln in result.stdout.splitlines() if ln.startswith("  ")}
    # stable.yaml gives tau0, beta and gamma itself: they win over the preset.
    assert lines["tau0_ms"] == "explicit" and lines["kv_read_ms_per_1k_tokens"] == "preset"
    assert "kv_cache.num_blocks" in result.stdout and "GiB weights" in result.stdout


def test_presets_lists_the_cards_and_the_fit():
    result = invoke("presets")
    assert result.exit_code == 0
    assert "MI300X" in result.stdout and "qwen2.5-72b" in result.stdout and "fit error" in result.stdout


# --------------------------------------------------------------------------- calibration
def _steps(rng, n, theta, noise=0.0):
    B = rng.integers(1, 256, n)
    P = rng.choice([0, 0, 512, 2048], n)
    K = B * rng.integers(100, 4000, n)
    A = P * rng.integers(0, 4000, n)
    y = np.column_stack([np.ones(n), B, P, K / 1e3, A / 1e6]) @ theta
    return pd.DataFrame({"batch_size": B, "prefill_tokens": P, "context_tokens": K, "prefill_attention_pairs": A,
                         "step_ms": y * (1 + noise * rng.standard_normal(n))})


def test_per_step_calibration_recovers_the_costs(tmp_path):
    theta = np.array([8.0, 0.05, 0.03, 0.04, 0.7])
    rng = np.random.default_rng(1)
    _steps(rng, 200, theta).to_csv(tmp_path / "exact.csv", index=False)
    fit = calibrate([tmp_path / "exact.csv"])
    assert np.allclose([fit.params[p] for p in PARAMS], theta, rtol=1e-8)
    _steps(rng, 2000, theta, noise=0.01).to_csv(tmp_path / "noisy.csv", index=False)
    noisy = calibrate([tmp_path / "noisy.csv"])
    assert np.allclose([noisy.params[p] for p in PARAMS], theta, rtol=0.05)
    # The CLI prints the fit and writes a device section that validates.
    result = invoke("calibrate", tmp_path / "exact.csv", "--out", tmp_path / "device.yaml")
    assert result.exit_code == 0, result.stderr and "relative error" in result.stdout
    device = Device.model_validate(yaml.safe_load((tmp_path / "device.yaml").read_text())["device"])
    assert device.tau0_ms == pytest.approx(8.0)


def test_per_step_calibration_recovers_the_gemm_tile_switch(tmp_path):
    """Steps of 17 to 64 tokens cost gemm_tier_ms more: told the switch, the fit finds it exactly, and its
    device section names the window."""
    rng = np.random.default_rng(3)
    B = rng.integers(1, 40, 300)
    P = rng.choice([0, 0, 0, 8, 300], 300)
    y = 19.0 + 0.1 * B + 0.12 * P + 6.5 * ((B + P > 16) & (B + P <= 64))
    pd.DataFrame({"batch_size": B, "prefill_tokens": P, "context_tokens": 0, "step_ms": y}).to_csv(
        tmp_path / "steps.csv", index=False)
    fit = calibrate([tmp_path / "steps.csv"], tier_tokens=(16, 64))
    assert fit.params["gemm_tier_ms"] == pytest.approx(6.5, rel=1e-8)
    assert fit.params["tau0_ms"] == pytest.approx(19.0, rel=1e-8)
    device = Device.model_validate(yaml.safe_load(fit.yaml_snippet())["device"])
    assert device.gemm_tier_tokens == (16, 64) and device.gemm_tier_ms == pytest.approx(6.5)
    assert "gemm_tier_ms" not in calibrate([tmp_path / "steps.csv"]).params  # not told: no such cost
    result = invoke("calibrate", tmp_path / "steps.csv", "--gemm-tier-tokens", "16,64",
                    "--fit", "tau0_ms,beta_ms,prefill_ms_per_token,gemm_tier_ms")
    assert result.exit_code == 0, result.stderr
    assert "gemm_tier_ms" in result.stdout and "gemm_tier_tokens: [16, 64]" in result.stdout
    bad = invoke("calibrate", tmp_path / "steps.csv", "--gemm-tier-tokens", "64,16")
    assert bad.exit_code == 2 and "--gemm-tier-tokens 64,16" in bad.stderr


def test_the_tile_switch_share_is_a_poisson_window():
    """A decoding request sees itself and Poisson(others) decodes, and with probability q a prompt's new
    tokens: the share of its steps inside (low, high], by hand for small cases."""
    from scipy.stats import poisson

    from simbatch.hardware.calibrate import own_step_share, tier_share

    assert tier_share(3.0, np.array([8.0]), 0.0, None) == 0.0
    # no prompt: 1 + X in (2, 5] <=> X in {2, 3, 4}
    assert tier_share(3.0, np.array([8.0]), 0.0, (2, 5)) == pytest.approx(sum(poisson.pmf(k, 3.0) for k in (2, 3, 4)))
    # always a prompt of 2 new tokens: 3 + X in (2, 5] <=> X in {0, 1, 2}
    assert tier_share(3.0, np.array([2.0]), 1.0, (2, 5)) == pytest.approx(poisson.cdf(2, 3.0))
    # the prompt's own step: X + 4 in (2, 5] <=> X in {0, 1}
    assert own_step_share(3.0, np.array([4.0]), (2, 5)) == pytest.approx(poisson.cdf(1, 3.0))


def test_a_bench_file_shows_the_tile_switch_in_its_itl_percentiles(tmp_path):
    """The steps above the switch are the slowest gaps: a percentile deep inside them, less the median,
    is one of them; a run whose switch is too rare to reach its percentiles gives no such point."""
    from simbatch.hardware.calibrate import _long_step
    from simbatch.workload import bench_result

    base = {"completed": 300, "num_prompts": 300, "request_rate": 3.0, "total_input_tokens": 62238,
            "total_output_tokens": 59212, "request_throughput": 2.75, "mean_ttft_ms": 64.7, "mean_tpot_ms": 22.76,
            "mean_itl_ms": 22.70, "median_itl_ms": 21.15, "p95_itl_ms": 27.89, "p99_itl_ms": 28.14}
    path = tmp_path / "rate-3.json"
    path.write_text(json.dumps(base), encoding="utf-8")
    result = bench_result.read(path)
    rows = _long_step(result, 0.2, "h200")
    assert rows.measured[0] == pytest.approx(27.89 - 21.15) and "p95" in rows.labels[0]  # 5 % tail < 10 %
    assert "p99" in _long_step(result, 0.05, "h200").labels[0]
    assert _long_step(result, 0.01, "h200") is None


def test_costs_the_data_cannot_separate_are_held(tmp_path):
    frame = _steps(np.random.default_rng(2), 100, np.zeros(5))
    frame["prefill_tokens"] = 0  # decode-only steps: nothing to tell the prefill costs by
    frame["step_ms"] = 8.0 + 0.05 * frame.batch_size
    frame.drop(columns="prefill_attention_pairs").to_csv(tmp_path / "decode.csv", index=False)
    fit = calibrate([tmp_path / "decode.csv"])
    assert set(fit.held) == {"prefill_ms_per_token", "prefill_attention_ms_per_1m_pairs"}
    assert fit.params["tau0_ms"] == pytest.approx(8.0) and fit.params["beta_ms"] == pytest.approx(0.05)
    result = invoke("calibrate", tmp_path / "decode.csv", "--fit", "tau0_ms,prefill_ms_per_token")
    assert result.exit_code == 2 and "cannot determine prefill_ms_per_token" in result.stderr


def test_bench_results_calibrate_within_tolerance(tmp_path):
    """simbatch's own summaries (vLLM's keys) at four rates, fitted in closed form: tau0 within 5 %,
    beta within 20 %, gamma within 10 % of the costs they were simulated with."""
    truth = {"tau0_ms": 8.0, "beta_ms": 0.08, "prefill_ms_per_token": 0.03}
    files = []
    for rate in (2, 5, 10, 20):
        sc = scenario(seed=1, device=truth, batching={"max_num_seqs": 256, "max_num_batched_tokens": 8192},
                      workload={"num_requests": 600, "arrival": {"rate": rate},
                                "prompt_tokens": {"dist": "uniform", "low": 200, "high": 1800},
                                "output_tokens": {"dist": "uniform", "low": 50, "high": 250}})
        files.append(tmp_path / f"rate{rate}.json")
        files[-1].write_text(json.dumps({**simulate(sc).summary, "request_rate": rate}, default=float))
    fit = calibrate(files)
    assert fit.params["tau0_ms"] == pytest.approx(8.0, rel=0.05)
    assert fit.params["beta_ms"] == pytest.approx(0.08, rel=0.2)
    assert fit.params["prefill_ms_per_token"] == pytest.approx(0.03, rel=0.1)
    assert fit.params["kv_read_ms_per_1k_tokens"] == 0 and "kv_read_ms_per_1k_tokens" in fit.held


def test_one_bench_file_cannot_separate_three_costs(tmp_path):
    """Two equations for three costs: the fit holds one, and says so as a warning (exit 1), never as a
    confident answer; what data would separate them is in the warning."""
    sc = scenario(device={"tau0_ms": 8.0, "beta_ms": 0.08, "prefill_ms_per_token": 0.03},
                  workload={"num_requests": 200, "arrival": {"rate": 5}, "prompt_tokens": {"dist": "fixed", "value": 500},
                            "output_tokens": {"dist": "fixed", "value": 100}})
    (tmp_path / "one.json").write_text(json.dumps(simulate(sc).summary, default=float))
    fit = calibrate([tmp_path / "one.json"])
    assert len(fit.fitted) == 2 and "cannot be told apart" in " ".join(fit.held.values())
    assert "2 points for 3 unknowns" in fit.warnings[0] and "a rate sweep" in fit.warnings[0]
    # With a preset, the costs not fitted are held at its values, and the snippet says which preset.
    result = invoke("calibrate", tmp_path / "one.json", "--preset", "llama-3.1-8b/H100-SXM",
                    "--out", tmp_path / "device.yaml")
    assert result.exit_code == 1 and "warning: 2 points for 3 unknowns" in result.stderr, result.stderr
    text = (tmp_path / "device.yaml").read_text()
    assert text.startswith("# simbatch calibrate: 1 warning(s)")
    written = yaml.safe_load(text)["device"]
    assert written["preset"] == "llama-3.1-8b/H100-SXM"  # kept, for kv_cache.num_blocks: auto
    assert written["kv_read_ms_per_1k_tokens"] == pytest.approx(
        resolve_device(Device(preset="llama-3.1-8b/H100-SXM")).kv_read_ms_per_1k_tokens, rel=1e-5)
    assert "held at --preset" in result.stdout


@pytest.mark.parametrize(("content", "says"), [
    ("batch_size,step_ms\n1,2\n", "missing column"), ("batch_size,prefill_tokens,context_tokens,step_ms\n1,0,5,-2\n",
                                                      "row 2"), ('{"completed": 3}', "calibrate needs request_throughput")])
def test_bad_calibration_input_is_one_line(tmp_path, content, says):
    path = tmp_path / ("x.json" if content.startswith("{") else "x.csv")
    path.write_text(content)
    result = invoke("calibrate", path)
    assert result.exit_code == 2 and says in result.stderr and len(result.stderr.strip().splitlines()) == 1


FIXTURES = ROOT / "tests" / "fixtures" / "vllm_results"
CHUNKED = FIXTURES / "lambda_llama-3.1-8b-fp8_h100_v0.5.4-or-0.6.0_chunked.json"
NERDALERT = [FIXTURES / f"nerdalert_llama-3.1-8b_h100_v0.8.3_rate{r}.json" for r in (1, 10, 20)]


def test_chunked_streaming_takes_the_step_from_tpot():
    """~10 tokens per streamed chunk: the mean ITL (50.3 ms) is a chunk's time; the step fitted is
    within 15 % of the run's TPOT (6.02 ms). One file at rate inf gives one equation for three costs:
    a warning, never a confident answer."""
    fit = calibrate([CHUNKED])
    step = fit.points.fitted_ms[0]
    assert step == pytest.approx(6.0185, rel=0.15) and fit.params["tau0_ms"] == pytest.approx(6.0185, rel=0.15)
    assert any("chunked streaming" in n and "the step is taken from TPOT" in n for n in fit.notes)
    assert any("1 point for 3 unknowns" in w for w in fit.warnings)
    result = invoke("calibrate", CHUNKED)
    assert result.exit_code == 1 and "warning: 1 point for 3 unknowns" in result.stderr


def test_the_two_point_file_is_refused_with_the_reason():
    """One run at one rate: its mean step and mean TTFT, two equations, three costs. The fit is flagged
    (exit 1) and the warning says which cost it cannot have and what runs would give it."""
    result = invoke("calibrate", NERDALERT[0])
    assert result.exit_code == 1, result.stderr
    assert "warning: 2 points for 3 unknowns" in result.stderr and "a rate sweep up to near saturation" in result.stderr
    assert result.stdout.count("nerdalert_llama-3.1-8b_h100_v0.8.3_rate1.json (rate 1)") == 2  # the file and rate


def test_a_real_sweep_calibrates_and_checks_by_replay():
    """Llama-3.1-8B on an H100 (vLLM 0.8.3) at 1, 10 and 20 req/s: every point within 10 %, no warning;
    --check replays each file with the fitted device and prints measured beside simulated."""
    fit = calibrate(NERDALERT)
    assert not fit.warnings and fit.points.relative_error.abs().max() < 0.10
    assert fit.params["tau0_ms"] > 0 and fit.params["beta_ms"] > 0 and fit.params["prefill_ms_per_token"] > 0
    result = invoke("calibrate", *NERDALERT[:2], "--preset", "llama-3.1-8b/H100-SXM", "--check", "--set",
                    "batching.max_num_seqs=256", "--set", "batching.max_num_batched_tokens=8192")
    assert result.exit_code in (0, 1), result.stderr
    assert result.stdout.count("replay of ") == 2 and result.stdout.count("measured     simulated    error") == 2
    ttft = [line for line in result.stdout.splitlines() if line.startswith("Mean TPOT (ms)")]
    assert len(ttft) == 2 and all(line.rstrip().endswith("%") for line in ttft)


def test_a_prefix_cached_sweep_is_recovered_on_the_tokens_prefilled(tmp_path):
    """A server with prefix caching on, every prompt behind one 1,000-token system prompt (about 83 % of
    prompt tokens found cached): fitted on the tokens actually prefilled (the hit rate the file states,
    or --prefix-hit-rate), the costs come back within 10 %; taking every token as prefilled, the prefill
    cost comes out several times too low."""
    truth = {"tau0_ms": 8.0, "beta_ms": 0.08, "prefill_ms_per_token": 0.06}
    files = []
    for rate in (2, 5, 10, 20):
        sc = scenario(seed=3, device=truth, batching={"max_num_seqs": 256, "max_num_batched_tokens": 8192},
                      kv_cache={"num_blocks": 200_000, "enable_prefix_caching": True},
                      workload={"num_requests": 600, "arrival": {"rate": rate},
                                "prompt_tokens": {"dist": "uniform", "low": 100, "high": 300},
                                "output_tokens": {"dist": "uniform", "low": 50, "high": 250},
                                "prefix": {"shared_tokens": 1000}})
        summary = simulate(sc).summary
        files.append(tmp_path / f"rate{rate}.json")
        files[-1].write_text(json.dumps({**summary, "request_rate": rate}, default=float))
        assert summary["prefix_cache_hit_rate"] > 0.8
    fit = calibrate(files)
    for key, value in truth.items():
        assert fit.params[key] == pytest.approx(value, rel=0.10), key
    # The same files without the hit rate: stated on the command line instead, the same fit.
    bare = []
    for f in files:
        record = {k: v for k, v in json.loads(f.read_text()).items() if not k.startswith("prefix_cache")}
        bare.append(f.with_name("bare-" + f.name))
        bare[-1].write_text(json.dumps(record))
    rates = {f: json.loads(f.read_text())["prefix_cache_hit_rate"] for f in files}
    stated = calibrate(bare, hit_rates={b: rates[f] for b, f in zip(bare, files, strict=True)})
    assert stated.params["prefill_ms_per_token"] == pytest.approx(fit.params["prefill_ms_per_token"], rel=1e-6)
    blind = calibrate(bare)
    assert blind.params["prefill_ms_per_token"] < 0.4 * truth["prefill_ms_per_token"]


def test_files_that_sent_the_same_prompts_need_a_hit_rate():
    """Two runs of the same 1,000 ShareGPT prompts (identical input_lens) on one server: with prefix caching
    on, the second found them cached. Refused unless the hit rate is given (0 here: that server ran
    with prefix caching off, per its repository)."""
    pair = [FIXTURES / f"dstack_llama-3.1-405b-fp8_8xh100-tp8_v0.6.3_rate{r}.json" for r in (16, 32)]
    result = invoke("calibrate", *pair)
    assert result.exit_code == 2 and "sent the same 1000 prompts" in result.stderr and \
        "--prefix-hit-rate" in result.stderr and result.stderr.count("\n") == 1
    result = invoke("calibrate", *pair, "--prefix-hit-rate", "0")
    # Both rates are past saturation (TTFT 2.4 s and 15 s): the fit says it cannot be trusted.
    assert result.exit_code == 1 and "came out 0, its bound" in result.stderr


def test_a_negative_implied_prefill_and_mixed_models_are_warnings(tmp_path):
    record = {"duration": 100.0, "completed": 100, "total_input_tokens": 10_000, "total_output_tokens": 10_000,
              "request_throughput": 1.0, "mean_ttft_ms": 12.0, "mean_tpot_ms": 10.0, "mean_itl_ms": 10.0,
              "request_rate": 1.0, "model_id": "a", "endpoint_type": "openai", "date": "20260101-000000"}
    (tmp_path / "a.json").write_text(json.dumps(record))
    (tmp_path / "b.json").write_text(json.dumps({**record, "model_id": "b", "request_rate": 2.0,
                                                 "request_throughput": 2.0}))
    fit = calibrate([tmp_path / "a.json", tmp_path / "b.json"])
    assert any("different models (a, b)" in w for w in fit.warnings)
    assert any("a negative prefill" in w and "async scheduling" in w for w in fit.warnings)
    assert any("async scheduling (the file is dated 2026-01, after" in n for n in fit.notes)


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_calibrate_accepts_every_fixture_or_refuses_in_one_line(path):
    result = invoke("calibrate", path)
    assert result.exit_code in (0, 1, 2), result.stderr
    if result.exit_code == 2:
        assert result.stderr.count("\n") == 1, result.stderr
    else:
        assert "device:" in result.stdout and "Traceback" not in result.stderr


def test_calibration_on_the_shared_measurements(tmp_path):
    """TensorRT-LLM's decode steps of Llama-2-7B on an H100, written as a per-step CSV: the fitted
    costs describe them within a few percent (docs/hardware_fit.md, "fit")."""
    rows = measured.trtllm()
    dec = rows[(rows.group == "llama-2-7b/H100-SXM") & (rows.kind == "decode step")]
    steps = pd.DataFrame({"batch_size": dec.x, "prefill_tokens": 0, "context_tokens": dec.x * dec.context,
                          "step_ms": dec.measured_ms})
    steps.to_csv(tmp_path / "steps.csv", index=False)
    fit = calibrate([tmp_path / "steps.csv"])
    err = fit.points.relative_error.abs()
    assert err.median() < 0.05 and fit.params["kv_read_ms_per_1k_tokens"] > 0


# --------------------------------------------------------------------------- the fit report
def test_the_fit_report_is_up_to_date():
    page = _script("gen_hardware_fit").render()
    committed = (ROOT / "docs" / "hardware_fit.md").read_text(encoding="utf-8")
    assert committed == page, "docs/hardware_fit.md is stale: run .venv/bin/python scripts/gen_hardware_fit.py"


def test_the_stored_efficiencies_are_the_fit_of_the_shared_data():
    """scripts/fit_hardware.py, rerun, finds the shipped constants (to the rounding of a BLAS)."""
    fit, _ = _script("fit_hardware").fit(measured.load_all())
    stored = fitted()[0]
    for name in stored.names():
        assert getattr(fit, name) == pytest.approx(getattr(stored, name), rel=1e-2), name


def test_the_stored_fit_errors_are_the_efficiencies_errors():
    eff, record = fitted()
    errors = errors_by_dataset(measured.load_all(), eff)
    for (dataset, kind), err in errors.items():
        stored = record["fit_error"][f"{dataset} / {kind}"]
        assert stored["rows"] == err["rows"] and math.isclose(stored["median"], err["median"], abs_tol=5e-4)
    # The context term is what the plain model lacks: on decode kernels and steps it is far better.
    decode = errors[("blis_h100_attention_decode_kernels", "attention kernel")]
    assert decode["fit_median"] < 0.1 < decode["plain_median"]


def test_bring_your_own_server_quotes_real_output():
    """docs/bring_your_own_server.md shows calibrate's fit of the H100 sweep and its refusal of one file as
    the command prints them today (the fit is closed form: cheap to rerun)."""
    page = (ROOT / "docs" / "bring_your_own_server.md").read_text(encoding="utf-8")
    files = [FIXTURES / f"nerdalert_llama-3.1-8b_h100_v0.8.3_rate{r}.json" for r in (1, 10, 20, 30)]
    result = invoke("calibrate", *files)
    assert result.exit_code == 0, result.stderr
    table = [line for line in result.stdout.splitlines() if line.startswith(("nerdalert", "tau0_ms", "beta_ms",
                                                                             "prefill_ms", "relative error"))]
    assert len(table) == 9 and all(line in page for line in table), "docs/bring_your_own_server.md is stale"
    one = invoke("calibrate", files[0])
    assert one.stderr.strip() in page


def test_the_shipped_measurements_are_the_shared_ones():
    """simbatch/data/measured holds copies of ../shared/data/{hardware,serving}; where the originals are
    beside the checkout, the copies equal them byte for byte (and every shipped file is named in the README)."""
    shipped_files = sorted(p for p in measured.DATA.parent.rglob("*") if p.suffix in (".csv", ".json", ".jsonl"))
    readme = (measured.DATA.parent / "README.md").read_text(encoding="utf-8")
    assert shipped_files and all(any(name in readme for name in (f"`{p.name}`", f"{p.name}:", f"{p.parent.name}/{p.name}"))
                                 for p in shipped_files)
    for p in shipped_files:
        original = measured.SHARED / p.parent.name / p.name
        if original.is_file():
            assert p.read_bytes() == original.read_bytes(), p.name


def test_the_shipped_law_is_the_best_held_out():
    """scripts/fit_hardware.py records each law's held-out error; the shipped one (cost.py's) is the least."""
    _, record = fitted()
    laws = record["laws"]
    assert set(laws) == set(_script("fit_hardware").LAWS)
    assert record["law"] == _script("fit_hardware").SHIPPED_LAW == min(laws, key=lambda law: laws[law]["mean"])


def test_hardware_md_shows_what_presets_prints():
    printed = invoke("presets", "llama-3.1-8b/H100").stdout
    page = (ROOT / "docs" / "hardware.md").read_text(encoding="utf-8")
    assert printed in page, "docs/hardware.md's `simbatch presets llama-3.1-8b/H100` block is stale: paste the output"


def test_vllm_defaults_with_a_preset_and_explicit_keys_winning():
    """Beside a preset, the keys a scenario leaves out are vllm serve's for that GPU, with their source."""
    big = scenario(device={"preset": "llama-3.1-70b/H200/fp8"})
    assert (big.batching.max_num_batched_tokens, big.batching.max_num_seqs) == (8192, 1024)
    assert big.kv_cache.enable_prefix_caching and big.scheduler.async_scheduling
    assert big.frontend.request_latency_ms == 3.0 and big.resolution["batching.max_num_seqs"].source == "vllm"
    # An A100 has the small defaults whatever its memory; a 24 GiB card too.
    for preset in ("llama-3.1-8b/A100-80GB", "llama-3.1-8b/RTX-4090"):
        small = scenario(device={"preset": preset})
        assert (small.batching.max_num_batched_tokens, small.batching.max_num_seqs) == (2048, 256)
    # Explicit keys win; a scenario without a preset keeps simbatch's own defaults.
    mine = scenario(device={"preset": "llama-3.1-8b/H100"}, batching={"max_num_seqs": 64},
                    kv_cache={"enable_prefix_caching": False})
    assert mine.batching.max_num_seqs == 64 and mine.batching.max_num_batched_tokens == 8192
    assert not mine.kv_cache.enable_prefix_caching and "batching.max_num_seqs" not in mine.resolution
    plain = scenario()
    assert plain.batching.max_num_seqs == 64 and not plain.scheduler.async_scheduling
    # vLLM runs a draft model synchronously; request-level batching is not vLLM's engine.
    drafted = scenario(device={"preset": "llama-3.1-8b/H100", "speculative": {
        "num_speculative_tokens": 2, "acceptance_rate": 0.5, "draft_cost_ms": 1.0}})
    assert not drafted.scheduler.async_scheduling
    static = scenario(device={"preset": "llama-3.1-8b/H100"}, batching={"mode": "static"})
    assert static.batching.max_num_seqs == 64 and not static.kv_cache.enable_prefix_caching
    # Resolution stays a fixpoint.
    assert resolve(big) == big


def test_a_preset_turns_on_async_scheduling_and_the_api_servers_latency():
    """With a preset, scheduler.async_scheduling and the frontend's two latencies are vLLM's (recorded as
    such, hardware/defaults.py), explicit keys win, and the run pays them: a request alone on an idle
    server sees its first token request + prefill step + response later."""
    from simbatch.hardware.defaults import FRONTEND_MS
    from simbatch.simulation import simulate

    preset = scenario(device={"preset": "llama-3.1-8b/H100"})
    assert preset.scheduler.async_scheduling
    assert (preset.frontend.request_latency_ms, preset.frontend.response_latency_ms) == \
        (FRONTEND_MS["request_latency_ms"], FRONTEND_MS["response_latency_ms"]) == (3.0, 1.0)
    for key in ("scheduler.async_scheduling", "frontend.request_latency_ms", "frontend.response_latency_ms"):
        assert preset.resolution[key].source == "vllm", key
    mine = scenario(device={"preset": "llama-3.1-8b/H100"}, scheduler={"async_scheduling": False},
                    frontend={"request_latency_ms": 0.5, "response_latency_ms": 0.0})
    assert not mine.scheduler.async_scheduling
    assert (mine.frontend.request_latency_ms, mine.frontend.response_latency_ms) == (0.5, 0.0)
    assert "frontend.request_latency_ms" not in mine.resolution
    # Without a preset, simbatch's own engine: no time outside the steps, one step at a time.
    plain = scenario()
    assert (plain.frontend.request_latency_ms, plain.frontend.response_latency_ms) == (0.0, 0.0)
    alone = {"num_requests": 1, "prompt_tokens": {"dist": "fixed", "value": 100},
             "output_tokens": {"dist": "fixed", "value": 4}}
    ttft = {}
    for name, frontend in (("vllm", {}), ("none", {"request_latency_ms": 0.0, "response_latency_ms": 0.0})):
        sc = resolve(Scenario.model_validate({"workload": alone, "device": {"preset": "llama-3.1-8b/H100"},
                                              "frontend": frontend}))
        ttft[name] = float(simulate(sc).requests["ttft_s"].iloc[0])
    assert ttft["vllm"] - ttft["none"] == pytest.approx(4e-3, abs=1e-9)

"""What ``simbatch run`` prints about presets: every derived cost, vLLM's defaults, and where each came from."""

from __future__ import annotations

from simbatch.config import Device, KVCache, Resolution, Scenario


def cost_line(key: str, value, source: str, indent: str = "  ") -> str:
    """One resolved value and its source; a MoE's routed experts on one line."""
    if key == "moe":
        shown = (f"{value.num_experts} experts, {value.experts_per_token} per token, {value.local_experts} read here "
                 f"at {value.expert_read_ms:.6g} ms each, data-parallel x{value.data_parallel_size}")
        return f"{indent}{'moe':<34} {shown}  {source}"
    shown = f"{str(value).lower():>10}" if isinstance(value, bool) else f"{value:>10,}" if isinstance(value, int) \
        else f"{value:>10.6g}"
    return f"{indent}{key:<34} {shown}  {source}"


def _block(title: str, record: Resolution, device: Device, device_key: str, cache: KVCache,
           cache_key: str) -> list[str]:
    blocks = record.get(f"{cache_key}.num_blocks")
    derived = blocks is not None and blocks.decided
    if device.preset is None and not derived:
        return []
    lines = [f"{title} ({'preset ' + device.preset if device.preset else 'no preset'}):"]
    lines += [cost_line(key, getattr(device, key), source) for key, source in record.sources(device_key).items()]
    if derived:
        tokens = cache.num_blocks * cache.block_size
        lines.append(f"  {'kv_cache.num_blocks':<34} {cache.num_blocks:>10,}  ({tokens:,} tokens) from {blocks.note}")
    return lines


def preset_block(scenario: Scenario) -> str | None:
    """The device's costs with their source (preset / explicit / default) and the KV blocks' derivation,
    for the scenario and each replica group with its own device or cache; None when nothing was derived.

    ``scenario`` is resolved (:func:`simbatch.inputs.resolve.resolve`, as the loader does): its
    record says where each value came from.
    """
    record = scenario.resolution
    if record is None:
        raise ValueError("preset_block reads a resolved scenario's record: resolve it first "
                         "(simbatch.inputs.resolve.resolve)")
    lines = _block("Device costs", record, scenario.device, "device", scenario.kv_cache, "kv_cache")
    vllm = {key: p for key, p in record.items() if p.source == "vllm"}
    if vllm:
        lines.append("vLLM's defaults (keys the scenario leaves out, as vllm serve sets them):")
        lines += [cost_line(key, p.value, f"vllm: {p.note}") for key, p in vllm.items()]
    for i, spec in enumerate(scenario.cluster.replica_specs or []):
        if spec.device is not None or spec.kv_cache is not None:
            where = f"cluster.replica_specs.{i}"
            lines += _block(f"Device costs of {where}", record, spec.device or scenario.device,
                            f"{where}.device" if spec.device is not None else "device",
                            spec.kv_cache or scenario.kv_cache,
                            f"{where}.kv_cache" if spec.kv_cache is not None else "kv_cache")
    return "\n".join(lines) or None

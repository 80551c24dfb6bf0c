"""What ``simbatch run`` prints about presets: every derived cost and where it came from."""

from __future__ import annotations

from simbatch.config import Device, KVCache, Scenario


def _block(title: str, device: Device, cache: KVCache) -> list[str]:
    if device.preset is None and not cache._derivation:
        return []
    lines = [f"{title} ({'preset ' + device.preset if device.preset else 'no preset'}):"]
    lines += [f"  {key:<34} {getattr(device, key):>10.6g}  {source}" for key, source in device.sources().items()]
    if cache._derivation:
        tokens = cache.num_blocks * cache.block_size
        lines.append(f"  {'kv_cache.num_blocks':<34} {cache.num_blocks:>10,}  ({tokens:,} tokens) from "
                     f"{cache._derivation}")
    return lines


def preset_block(scenario: Scenario) -> str | None:
    """The device's costs with their source (preset / explicit / default) and the KV blocks' derivation,
    for the scenario and each replica group with its own device or cache; None when nothing was derived."""
    lines = _block("Device costs", scenario.device, scenario.kv_cache)
    for i, spec in enumerate(scenario.cluster.replica_specs or []):
        if spec.device is not None or spec.kv_cache is not None:
            lines += _block(f"Device costs of cluster.replica_specs.{i}", spec.device or scenario.device,
                            spec.kv_cache or scenario.kv_cache)
    return "\n".join(lines) or None

"""What ``simbatch run`` prints about a preset: every derived cost and where it came from."""

from __future__ import annotations

from simbatch.config import Scenario


def preset_block(scenario: Scenario) -> str | None:
    """The device's costs with their source (preset / explicit / default) and the KV blocks' derivation,
    or None when the scenario uses neither a preset nor derived blocks."""
    device, cache = scenario.device, scenario.kv_cache
    derivation = cache._derivation
    if device.preset is None and not derivation:
        return None
    lines = [f"Device costs ({'preset ' + device.preset if device.preset else 'no preset'}):"]
    lines += [f"  {key:<34} {getattr(device, key):>10.6g}  {source}" for key, source in device.sources().items()]
    if derivation:
        tokens = cache.num_blocks * cache.block_size
        lines.append(f"  {'kv_cache.num_blocks':<34} {cache.num_blocks:>10,}  ({tokens:,} tokens) from {derivation}")
    return "\n".join(lines)

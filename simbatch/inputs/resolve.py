"""Resolution: from the scenario a file gives to the scenario the engine runs, and where each value came from.

A validated :class:`~simbatch.config.Scenario` is data: what the file says. Some of what the engine
needs follows from it without being written in it, and :func:`resolve` fills that in:

0. **vLLM's defaults**: beside a ``device.preset`` the engine is vLLM V1 as ``vllm serve`` runs it on
   that GPU, so the keys a file leaves out take vLLM's values (:mod:`simbatch.hardware.defaults`):
   ``max_num_seqs`` and ``max_num_batched_tokens`` by the GPU's memory, prefix caching on, async
   scheduling on, the API server's latency in front;
1. **device costs** (every device: the scenario's and each replica group's own): the keys a file
   leaves out beside ``device.preset`` take the preset's values, from the model and GPU cards and
   the fitted efficiencies (:mod:`simbatch.hardware.preset`), for the KV cache's dtype
   (``kv_cache.dtype``: ``auto`` is what the model's checkpoint asks for, else bf16);
2. **KV blocks**: ``kv_cache.num_blocks: auto`` becomes the blocks left in the GPU's memory once the
   weights and activations are in (:mod:`simbatch.hardware.memory`, as vLLM sizes its cache), and
   ``gpu_kv_cache_tokens`` the blocks that many tokens fill; for the scenario's cache and each group's;
3. **KV transfer**: a disaggregated cluster's ``kv_bytes_per_token``, from the prefill pool's preset
   when the file gives none.

Each step reads what the steps before it decided (the KV blocks of a group read its resolved device),
so a new kind of resolution is one more step in :data:`STEPS`, at its place. Every value a step
decides goes into the scenario's record (:attr:`Scenario.resolution
<simbatch.config.scenario.Scenario.resolution>`) as a :class:`~simbatch.config.provenance.Provenance`
(value, source, one line of how), under the key's dotted name; ``simbatch run`` prints it.

Resolution is a function: it never changes its input (it copies what it changes; the rest is shared),
and resolving a resolved scenario gives it back unchanged, record included. It stays a fixpoint
because a decided value is never marked as given (``model_fields_set`` stays the file's), so it is
decided again, alike; a value that replaced what it came from (``auto`` became a number) keeps the
record's word for how it was made. A failure is a :class:`pydantic.ValidationError` located as
validation locates it, so the loader reports it at its ``file:line`` like any other.

:func:`simbatch.inputs.loading.load_scenario` and :func:`simbatch.simulation.simulate` resolve for
you; :func:`resolve` is for a scenario validated by hand whose derived values you want to read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from simbatch.config.batching import Batching
from simbatch.config.cluster import ReplicaSpec
from simbatch.config.device import DEVICE_COSTS, Device, MoE
from simbatch.config.kv_cache import KVCache
from simbatch.config.provenance import Provenance, Resolution
from simbatch.config.scenario import Scenario, sized_caches
from simbatch.hardware.memory import kv_budget, weights_problem
from simbatch.hardware.preset import Deployment, fitted, parse

M = TypeVar("M", bound=BaseModel)
Record = dict[str, Provenance]


class _Failed(Exception):
    """Resolution of one key failed: where (a dotted key, "" for the whole scenario), why, and the input."""

    def __init__(self, where: str, message: str, value: Any):
        super().__init__(message)
        self.where, self.message, self.value = where, message, value


def _invalid(failures: list[_Failed], title: str = "Scenario") -> ValidationError:
    """The failures as pydantic reports a validator's: type value_error, at the key's location."""
    return ValidationError.from_exception_data(title, [
        {"type": "value_error", "loc": tuple(int(p) if p.isdigit() else p for p in f.where.split(".") if p),
         "input": f.value, "ctx": {"error": ValueError(f.message)}} for f in failures])


def _decided(model: M, **values: Any) -> M:
    """A copy of ``model`` holding ``values``, which resolution decided: they are not marked as given,
    so resolving the copy again decides them again (validated already: they are not validated again)."""
    out = model.model_copy(update=values)
    object.__setattr__(out, "__pydantic_fields_set__", set(model.model_fields_set))
    return out


# --------------------------------------------------------------------------- vLLM's defaults
def _unset(section: BaseModel, values: dict[str, tuple[object, str]], prefix: str, where: str,
           record: Record) -> BaseModel:
    """``section`` with the ``values`` of its own keys (``prefix.key``) that the file leaves out, each recorded
    under ``where.key`` as vLLM's."""
    taken = {key.removeprefix(prefix + "."): (value, why) for key, (value, why) in values.items()
             if key.startswith(prefix + ".") and key.removeprefix(prefix + ".") not in section.model_fields_set}
    for key, (value, why) in taken.items():
        record[f"{where}.{key}"] = Provenance(value, "vllm", why)
    changed = {k: v for k, (v, _) in taken.items() if getattr(section, k) != v}
    return _decided(section, **changed) if changed else section


def _vllm(device: Device, batching: Batching) -> dict[str, tuple[object, str]]:
    """What vLLM sets for the device's model and GPU, or nothing without a preset."""
    from simbatch.hardware.defaults import defaults

    d = deployment(device) if device.preset is not None else None
    if d is None:
        return {}
    out = defaults(d.gpu, d.model, batching.enable_chunked_prefill)
    if batching.mode != "continuous":  # vLLM's defaults are its continuous engine's
        return {k: v for k, v in out.items() if not k.startswith(("batching.", "kv_cache."))}
    tokens, why = out["batching.max_num_batched_tokens"]
    if "max_num_seqs" in batching.model_fields_set and "max_num_batched_tokens" not in batching.model_fields_set \
            and tokens < batching.max_num_seqs:  # vLLM refuses a budget below the slots: the slots' count
        out["batching.max_num_batched_tokens"] = (batching.max_num_seqs, f"{why}, raised to max_num_seqs")
    return out


def _vllm_defaults(scenario: Scenario, record: Record) -> Scenario:
    """Step 0: beside a preset, the batching, caching, scheduling and frontend keys a file leaves out take
    vLLM V1's values for that GPU (:mod:`simbatch.hardware.defaults`); a group with its own device and
    batching, its GPU's. Async scheduling only where every replica batches continuously and none runs a
    draft model (vLLM turns it off then); prefix caching not for a disaggregated cluster's caches."""
    try:
        values = _vllm(scenario.device, scenario.batching)
    except ValueError as exc:
        raise _invalid([_Failed("device", str(exc), scenario.device.model_dump(exclude_unset=True))]) from None
    groups = scenario.cluster.named_groups()
    devices = [scenario.device] + [spec.device for _, spec in groups if spec.device is not None]
    batchings = [scenario.batching] + [spec.batching for _, spec in groups if spec.batching is not None]
    if not all(b.mode == "continuous" for b in batchings) or any(d.speculative is not None for d in devices):
        values.pop("scheduler.async_scheduling", None)
    disaggregated = scenario.cluster.disaggregated is not None
    if disaggregated or not all(b.mode == "continuous" for b in batchings):
        values.pop("kv_cache.enable_prefix_caching", None)
    if not values:
        return scenario
    updates = {name: _unset(getattr(scenario, name), values, name, name, record)
               for name in ("batching", "kv_cache", "scheduler", "frontend")}
    specs = {}
    for where, spec in groups:
        if spec.device is None or spec.batching is None or spec.device.preset is None:
            continue
        own = _vllm(spec.device, spec.batching)
        if disaggregated:
            own.pop("kv_cache.enable_prefix_caching", None)
        batching = _unset(spec.batching, own, "batching", f"{where}.batching", record)
        cache = spec.kv_cache if spec.kv_cache is None else _unset(spec.kv_cache, own, "kv_cache",
                                                                    f"{where}.kv_cache", record)
        if batching is not spec.batching or cache is not spec.kv_cache:
            specs[where] = _decided(spec, batching=batching, kv_cache=cache)
    out = _with_groups(scenario, specs)
    changed = {k: v for k, v in updates.items() if v is not getattr(scenario, k)}
    return _decided(out, **changed) if changed else out


# --------------------------------------------------------------------------- the device's costs
def deployment(device: Device, cache: KVCache | None = None) -> Deployment | None:
    """The :class:`~simbatch.hardware.preset.Deployment` ``device.preset`` names (with the device's own
    cards), for ``cache``'s dtype (bf16 without one), or None without a preset; ValueError, saying what
    to write, for a name that names none."""
    if device.preset is None:
        return None
    d = parse(device.preset, {device.gpu_card.name: device.gpu_card} if device.gpu_card else None,
              {device.model_card.name: device.model_card} if device.model_card else None)
    dtype = "bf16" if cache is None else cache.dtype_bytes(d.model.kv_cache_dtype)
    return d if dtype == d.kv_dtype else replace(d, kv_dtype=dtype)


ROUTED = ("weights_ms", "moe")
"""Device keys a preset sets beside the five costs: the decode roofline's weight stream, a MoE's experts."""


def _device(device: Device, where: str, cache: KVCache | None = None) -> tuple[Device, Record]:
    """The device with its preset's costs where it gives none, for ``cache``'s dtype, and each cost's
    provenance. A ``tau0_ms`` of the file's own is a whole fixed cost: the costs then add, and the preset's
    weight stream is left out."""
    try:
        d = deployment(device, cache)
    except ValueError as exc:
        raise _Failed(where, str(exc), device.model_dump(exclude_unset=True)) from None
    given = device.model_fields_set
    derived = {} if d is None else d.device_ms(fitted()[0])
    if "tau0_ms" in given:
        derived.pop("weights_ms", None)
    # Six significant digits, as printed; every value is finite and >= 0, as validation would demand.
    taken = {k: MoE(**{n: float(f"{v:.6g}") if isinstance(v, float) else v for n, v in value.items()})
             if k == "moe" else float(f"{value:.6g}") for k, value in derived.items() if k not in given}
    how = "" if d is None else d.name + (", fp8 KV cache" if d.kv_dtype == "fp8" else "")
    keys = DEVICE_COSTS + tuple(k for k in ROUTED if k in taken or k in given)
    record = {f"{where}.{k}": Provenance(taken[k], "preset", how) if k in taken else
              Provenance(getattr(device, k), "explicit" if k in given else "default") for k in keys}
    return (_decided(device, **taken) if taken else device), record


def resolve_device(device: Device, cache: KVCache | None = None) -> Device:
    """A device section alone, resolved: its preset's costs filled in where it gives none (itself
    without a preset), for ``cache``'s dtype. ValidationError for a preset that names no model and GPU."""
    try:
        return _device(device, "device", cache)[0]
    except _Failed as failed:
        raise _invalid([failed], "Device") from None


def _with_groups(scenario: Scenario, specs: dict[str, ReplicaSpec]) -> Scenario:
    """``scenario`` with the replica groups named in ``specs`` (by their dotted key) replaced."""
    if not specs:
        return scenario
    cluster = scenario.cluster
    if cluster.disaggregated is not None:
        pools = cluster.disaggregated
        cluster = _decided(cluster, disaggregated=_decided(pools, **{
            name: specs.get(f"cluster.disaggregated.{name}", getattr(pools, name)) for name in ("prefill", "decode")}))
    else:
        cluster = _decided(cluster, replica_specs=[specs.get(where, spec) for where, spec in cluster.named_groups()])
    return _decided(scenario, cluster=cluster)


def _device_costs(scenario: Scenario, record: Record) -> Scenario:
    """Step 1: every device's costs, the scenario's and each group's own, for the cache each runs with;
    every bad preset reported at once."""
    devices = [("device", None, scenario.device)] + [(f"{where}.device", spec, spec.device) for where, spec in
                                                     scenario.cluster.named_groups() if spec.device is not None]
    failures, resolved = [], {}
    for where, spec, device in devices:
        cache = scenario.kv_cache if spec is None or spec.kv_cache is None else spec.kv_cache
        try:
            resolved[where], costs = _device(device, where, cache)
        except _Failed as failed:
            failures.append(failed)
            continue
        record |= costs
    if failures:
        raise _invalid(failures)
    groups = {where.removesuffix(".device"): _decided(spec, device=resolved[where])
              for where, spec, device in devices if spec is not None and resolved[where] is not device}
    out = _with_groups(scenario, groups)
    return out if resolved["device"] is scenario.device else _decided(out, device=resolved["device"])


# --------------------------------------------------------------------------- KV blocks
def _blocks(cache: KVCache, device: Device, batching: Batching, where: str) -> tuple[KVCache, Provenance]:
    """The cache with ``num_blocks`` a number, and how it was had."""
    try:
        cache.check_blocks(device.preset is not None, where)
        if (blocks := cache.blocks_from_tokens) is not None:
            how = Provenance(blocks, "derived", f"gpu_kv_cache_tokens {cache.gpu_kv_cache_tokens:,} / block_size "
                                                f"{cache.block_size}")
        elif cache.num_blocks == "auto":
            d = deployment(device, cache)
            budget = kv_budget(d, cache.block_size, cache.gpu_memory_utilization, batching.max_num_batched_tokens,
                               batching.max_num_seqs, cache.activation_reserve_gib)
            how = Provenance(budget.blocks, "preset", f"{d.name}: {budget.describe()}")
        else:
            # A number of blocks given does not make a deployment fit that cannot load its weights (with the
            # default number, simbatch.app.advice warns: the preset's costs alone are still worth reading).
            if device.preset is not None and "num_blocks" in cache.model_fields_set and \
                    (problem := weights_problem(deployment(device), cache.gpu_memory_utilization)):
                raise ValueError(f"{where.removesuffix('kv_cache')}device.preset {problem}")
            return cache, Provenance(cache.num_blocks, "explicit" if "num_blocks" in cache.model_fields_set
                                     else "default")
    except ValueError as exc:
        raise _Failed("", str(exc), cache.model_dump(exclude_unset=True)) from None
    return (cache if cache.num_blocks == how.value else _decided(cache, num_blocks=how.value)), how


def _kv_blocks(scenario: Scenario, record: Record) -> Scenario:
    """Step 2: the blocks of the scenario's cache and of every group's (a group on its own GPU gets its own)."""
    cache, groups = scenario.kv_cache, {}
    for where, spec, given, device, batching in sized_caches(scenario):
        try:
            sized, record[f"{where}.num_blocks"] = _blocks(given, device, batching, where)
        except _Failed as failed:
            raise _invalid([failed]) from None
        if spec is None:
            cache = sized
        elif sized is not spec.kv_cache:
            groups[where.removesuffix(".kv_cache")] = _decided(spec, kv_cache=sized)
    out = _with_groups(scenario, groups)
    return out if cache is scenario.kv_cache else _decided(out, kv_cache=cache)


# --------------------------------------------------------------------------- KV transfer
def _kv_transfer(scenario: Scenario, record: Record) -> Scenario:
    """Step 3: a disaggregated cluster's KV bytes per token, from the prefill pool's preset when not given."""
    pools = scenario.cluster.disaggregated
    if pools is None:
        return scenario
    key = "cluster.disaggregated.kv_bytes_per_token"
    if pools.kv_bytes_per_token is not None and "kv_bytes_per_token" in pools.model_fields_set:
        record[key] = Provenance(pools.kv_bytes_per_token, "explicit")
        return scenario
    device = pools.prefill.device or scenario.device
    try:
        pools.check_kv_bytes(device.preset is not None)
    except ValueError as exc:
        raise _invalid([_Failed("", str(exc), pools.model_dump(exclude_unset=True))]) from None
    d = deployment(device, pools.prefill.kv_cache or scenario.kv_cache)
    record[key] = Provenance(d.kv_bytes_per_token, "preset", f"{d.name}: keys and values of every layer, "
                                                             "one GPU's share")
    return _decided(scenario, cluster=_decided(scenario.cluster, disaggregated=_decided(
        pools, kv_bytes_per_token=d.kv_bytes_per_token)))


# --------------------------------------------------------------------------- host tier and adapters
def _host_link(d: Deployment, where: str, value: Any) -> Provenance:
    """The GPU card's host link, as the preset's, or a failure saying what to give."""
    if d.gpu.host_link_gb_s is None:
        raise _Failed(where, f"{d.gpu.name}'s card gives no host link; give host_link_gb_s (e.g. 50 for PCIe "
                             "Gen5 x16)", value)
    return Provenance(d.gpu.host_link_gb_s, "preset", f"{d.gpu.name}'s host link")


def _tiers_and_adapters(scenario: Scenario, record: Record) -> Scenario:
    """Step 4: what the host KV tier and LoRA adapters move, and over what: a token's KV bytes (for the
    cache's dtype) and the link from the preset's GPU card where a cache with ``host_blocks`` gives none;
    an adapter's bytes from the preset's model card (:func:`simbatch.features.lora.lora_bytes`) and the
    same link where ``lora`` gives none."""
    cache, groups, failures = scenario.kv_cache, {}, []
    for where, spec, given, device, _ in sized_caches(scenario):
        if not given.host_blocks:
            continue
        taken = {}
        for key in ("kv_bytes_per_token", "host_link_gb_s"):
            if key in given.model_fields_set or device.preset is None:
                record[f"{where}.{key}"] = Provenance(getattr(given, key), "explicit")
                continue
            d = deployment(device, given)
            try:
                how = _host_link(d, f"{where}.{key}", given.model_dump(exclude_unset=True)) \
                    if key == "host_link_gb_s" else Provenance(d.kv_bytes_per_token, "preset", f"{d.name}: keys and "
                                                               "values of every layer, one GPU's share")
            except _Failed as failed:
                failures.append(failed)
                continue
            record[f"{where}.{key}"] = how
            if getattr(given, key) != how.value:
                taken[key] = how.value
        sized = _decided(given, **taken) if taken else given
        if spec is None:
            cache = sized
        elif sized is not given:
            groups[where.removesuffix(".kv_cache")] = _decided(spec, kv_cache=sized)
    lora = scenario.lora
    if lora is not None:
        own = lora.model_fields_set if scenario.device.preset is not None else {"adapter_bytes", "host_link_gb_s"}
        for key in own & {"adapter_bytes", "host_link_gb_s"}:
            record[f"lora.{key}"] = Provenance(getattr(lora, key), "explicit")
        taken = {}
        if {"adapter_bytes", "host_link_gb_s"} - own:
            from simbatch.features.lora import lora_bytes

            d = deployment(scenario.device, scenario.kv_cache)
            if "adapter_bytes" not in own:
                taken["adapter_bytes"] = lora_bytes(d.model, lora.rank, lora.target_modules, d.tp)
                record["lora.adapter_bytes"] = Provenance(taken["adapter_bytes"], "preset", f"{d.name}: rank "
                                                          f"{lora.rank} on {', '.join(lora.target_modules)}, bf16")
            if "host_link_gb_s" not in own:
                try:
                    record["lora.host_link_gb_s"] = _host_link(d, "lora.host_link_gb_s",
                                                               lora.model_dump(exclude_unset=True))
                    taken["host_link_gb_s"] = record["lora.host_link_gb_s"].value
                except _Failed as failed:
                    failures.append(failed)
        changed = {k: v for k, v in taken.items() if getattr(lora, k) != v}
        lora = _decided(lora, **changed) if changed else lora
    if failures:
        raise _invalid(failures)
    out = _with_groups(scenario, groups)
    changed = {k: v for k, v in (("kv_cache", cache), ("lora", lora)) if v is not getattr(scenario, k)}
    return _decided(out, **changed) if changed else out


STEPS: tuple[Callable[[Scenario, Record], Scenario], ...] = (_vllm_defaults, _device_costs, _kv_blocks, _kv_transfer,
                                                              _tiers_and_adapters)
"""The steps of resolution, in order: each returns the scenario with what it decided, and records how."""


def resolve(scenario: Scenario) -> Scenario:
    """The scenario the engine runs: every value the file leaves to be derived, derived, with its record.

    Pure and idempotent: ``scenario`` is not changed, and ``resolve(resolve(s)) == resolve(s)``.
    ValidationError, as validation raises it, when a value cannot be derived (an unknown preset,
    no room for the KV cache).
    """
    record: Record = {}
    out = scenario
    for step in STEPS:
        out = step(out, record)
    prior = dict(scenario.resolution or {})
    # A value that replaced what it was made from (auto became a number) reads as given now; the
    # record still knows how it was made.
    record = {key: prior[key] if p.source == "explicit" and key in prior and prior[key].decided and
              prior[key].value == p.value else p for key, p in record.items()}
    out = out.model_copy() if out is scenario else out
    out._resolution = Resolution(record)
    return out

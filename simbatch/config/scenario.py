"""The scenario: every section together, the checks that span sections, and what each replica runs.

A scenario file maps onto :class:`Scenario` 1:1, section by section (one module each, in this
package); ``docs/scenarios.md`` is generated from the models. Validation checks the data as given,
and writes nothing: a validated scenario holds what the file says, ``num_blocks: auto`` and a
preset's unfilled costs included. :func:`simbatch.inputs.resolve.resolve` turns it into the scenario
the engine runs, recording where each decided value came from (:attr:`Scenario.resolution`); the
loader and :func:`simbatch.simulation.simulate` resolve for you.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, Field, PrivateAttr, ValidationError, model_validator

from simbatch.config.base import NonNegInt, _Model
from simbatch.config.batching import Batching
from simbatch.config.cluster import Cluster, ReplicaSpec
from simbatch.config.device import Device
from simbatch.config.frontend import Frontend
from simbatch.config.kv_cache import KVCache
from simbatch.config.lengths import Empirical
from simbatch.config.lora import Lora
from simbatch.config.metrics import Metrics
from simbatch.config.provenance import Resolution
from simbatch.config.scheduler import Scheduler
from simbatch.config.sim import Sim
from simbatch.config.slo import SLO
from simbatch.config.workload import TraceCurve, Workload
from simbatch.registry import FEATURES, MODES


class Scenario(_Model):
    """A complete, self-contained simulation: traffic, device, memory, batching, policy."""

    name: str = Field(default="scenario", description="Used to name result folders.")
    description: str = Field(default="", description="Free text.")
    seed: NonNegInt = Field(default=0, description="Root seed of every random stream.")
    workload: Workload = Field(default_factory=Workload)
    device: Device = Field(default_factory=Device)
    kv_cache: KVCache = Field(default_factory=KVCache)
    batching: Batching = Field(default_factory=Batching)
    scheduler: Scheduler = Field(default_factory=Scheduler)
    cluster: Cluster = Field(default_factory=Cluster)
    frontend: Frontend = Field(default_factory=Frontend)
    slo: SLO = Field(default_factory=SLO)
    metrics: Metrics = Field(default_factory=Metrics)
    sim: Sim = Field(default_factory=Sim)
    features: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Serving features of your own (simbatch.features), each by its registered name, with its "
        "options (listed under Serving features). The shipped ones have settings of their own: device.speculative.",
    )
    lora: Lora | None = Field(default=None, description="Multi-LoRA serving (vLLM's --enable-lora); off when omitted.")

    # Where relative paths (traces, empirical lengths) are resolved; set by the loader, not the YAML.
    _base_dir: Path | None = PrivateAttr(default=None)
    # What resolution decided, and where from; None until the scenario is resolved. Set by resolve, not the YAML.
    _resolution: Resolution | None = PrivateAttr(default=None)

    @property
    def resolution(self) -> Resolution | None:
        """The record of :func:`~simbatch.inputs.resolve.resolve` (dotted key -> where the value came from),
        or None for a scenario not resolved yet."""
        return self._resolution

    @model_validator(mode="after")
    def _kv_blocks(self) -> Scenario:
        # num_blocks: auto becomes a number in resolution, where the GPU's memory is known; here, only
        # whether it can, for the scenario's cache and for each replica group's.
        for where, _, cache, device, _ in sized_caches(self):
            cache.check_blocks(device.preset is not None, where)
        return self

    @model_validator(mode="after")
    def _features(self) -> Scenario:
        """Each named feature is registered, turned on here (not by a setting of its own), and given the
        options its ``Options`` model accepts (checked here, read by the feature when it is built)."""
        for name, options in self.features.items():
            if name not in FEATURES:
                raise ValueError(f"features.{name}: no serving feature is called {name!r} (registered: "
                                 f"{FEATURES.expected() if len(FEATURES) else 'none'}); import the module that "
                                 "registers it before loading the scenario")
            feature = FEATURES[name]
            if feature.switch != "features":
                raise ValueError(f"features.{name}: {name} is turned on by {feature.switch}; set that instead")
            model = feature.Options
            if model is None:
                if options:
                    raise ValueError(f"features.{name} takes no options: remove {', '.join(options)}")
                continue
            try:
                model.model_validate(options)
            except ValidationError as e:
                err = e.errors()[0]
                where = ".".join(str(p) for p in err["loc"])
                raise ValueError(f"features.{name}.{where}: {err['msg']}") from None
        return self

    @model_validator(mode="after")
    def _iteration_level_only(self) -> Scenario:
        """Prefix caching, speculative decoding and async scheduling work per token: they need a mode
        that plans step by step (``iteration_level``, continuous batching's family)."""
        specs = self.cluster.groups()
        pairs = [(self.kv_cache, self.batching)] if specs is None else \
            [(s.kv_cache or self.kv_cache, s.batching or self.batching) for s in specs]
        if any(kv.enable_prefix_caching and not MODES[b.mode].iteration_level for kv, b in pairs):
            raise ValueError("kv_cache.enable_prefix_caching with a request-level batching mode: a static or "
                             "dynamic batch reserves its memory whole, for padded prompts; use batching.mode: "
                             "continuous, or set enable_prefix_caching to false")
        devices = [(self.device, self.batching)] if specs is None else \
            [(s.device or self.device, s.batching or self.batching) for s in specs]
        if any(d.speculative is not None and not MODES[b.mode].iteration_level for d, b in devices):
            raise ValueError("device.speculative with a request-level batching mode: a static or dynamic batch "
                             "emits one token per step for every slot; use batching.mode: continuous, or remove "
                             "device.speculative")
        if self.features and any(not MODES[b.mode].iteration_level for _, b in pairs):
            raise ValueError(f"features ({', '.join(self.features)}) with a request-level batching mode: serving "
                             "features act on the steps an iteration-level scheduler plans; use batching.mode: "
                             "continuous, or remove them")
        if self.scheduler.async_scheduling and any(not MODES[b.mode].iteration_level for _, b in pairs):
            raise ValueError("scheduler.async_scheduling with a request-level batching mode: it is how vLLM's "
                             "engine overlaps planning a step with running the last one; use batching.mode: "
                             "continuous, or set async_scheduling to false")
        return self

    @model_validator(mode="after")
    def _tiers_and_adapters(self) -> Scenario:
        """The host KV tier needs KV bytes per token, multi-LoRA an adapter size, from a preset or given; and
        LoRA needs continuous batching on one pool of replicas."""
        for where, _, cache, device, _ in sized_caches(self):
            if cache.host_blocks and cache.kv_bytes_per_token is None and device.preset is None:
                raise ValueError(f"{where}.host_blocks ({cache.host_blocks}) moves KV over the host link, and nothing "
                                 "says how many bytes a token caches; give kv_cache.kv_bytes_per_token (e.g. 131072 "
                                 "for llama-3.1-8b in bf16) or set device.preset")
            if cache.host_blocks and cache.host_link_gb_s is None and device.preset is None:
                raise ValueError(f"{where}.host_blocks ({cache.host_blocks}) needs the link its blocks load over, and "
                                 "no device.preset names a GPU to take it from; give kv_cache.host_link_gb_s (e.g. 50 "
                                 "for PCIe Gen5 x16)")
        trace = self.workload.trace
        named = "workload.adapters" if self.workload.adapters is not None else \
            "workload.trace.adapter_column" if trace is not None and trace.adapter_column is not None else None
        if named is not None and self.lora is None:
            raise ValueError(f"{named} names LoRA adapters, but the server has no lora section; add lora "
                             f"(e.g. lora: {{max_loras: 4, host_link_gb_s: 25}}), or remove {named}")
        if self.lora is None:
            return self
        if self.lora.host_link_gb_s is None and self.device.preset is None:
            raise ValueError("lora.host_link_gb_s is missing and no device.preset names a GPU to take it from; give "
                             "lora.host_link_gb_s (e.g. 25 for PCIe Gen4 x16)")
        if self.lora.adapter_bytes is None and self.device.preset is None:
            raise ValueError("lora.adapter_bytes is missing and device.preset has no model card to size adapters "
                             "from; give lora.adapter_bytes (e.g. 83886080: rank 16 on every module of "
                             "llama-3.1-8b in bf16) or set device.preset")
        if self.cluster.groups() is not None or self.cluster.disaggregated is not None:
            raise ValueError("lora with cluster.replica_specs or cluster.disaggregated is not modelled; serve the "
                             "adapters from identical replicas (cluster.replicas)")
        if self.batching.mode != "continuous":
            raise ValueError(f"lora with batching.mode {self.batching.mode}: the max_loras rule is vLLM V1's "
                             "scheduler's; use batching.mode: continuous, or remove lora")
        return self

    @model_validator(mode="after")
    def _client_and_delay(self) -> Scenario:
        wl = self.workload
        if self.cluster.signal_delay_ms > 0 and (wl.max_concurrency is not None or wl.closed_loop is not None):
            which = "max_concurrency" if wl.max_concurrency is not None else "closed_loop"
            raise ValueError(f"cluster.signal_delay_ms ({self.cluster.signal_delay_ms:g}) with workload.{which}: "
                             "delayed snapshots need arrival times known in advance, and a client sends when "
                             "requests complete; set signal_delay_ms to 0 or remove the client")
        cap = wl.max_concurrency if wl.max_concurrency is not None else \
            (wl.closed_loop.concurrency if wl.closed_loop is not None else None)
        if cap is not None:
            # A request-level batcher with its timer off (static without max_wait_ms) starts a batch only
            # when it is full (or arrivals end). If every request the client lets out can sit in such a
            # batcher short of a full batch, the client waits for a response that never comes: a deadlock,
            # in the model as in a real deployment. Pigeonhole: more than sum(max_num_seqs - 1) in flight
            # always fills one.
            batchings = [self.batching] if self.cluster.groups() is None else \
                [s.batching or self.batching for s in self.cluster.groups() for _ in range(s.count)]
            if self.cluster.groups() is None:
                batchings *= self.cluster.fleet_size
            waiting = [b for b in batchings if MODES[b.mode].waits_for_full_batch(b)]
            stuck = sum(b.max_num_seqs - 1 for b in waiting)
            if stuck and cap <= stuck:
                which = "max_concurrency" if wl.max_concurrency is not None else "closed_loop.concurrency"
                timer = MODES[waiting[0].mode].batch_timer
                without, fix = (f" without {timer}", f"set batching.{timer}, or ") if timer else ("", "set ")
                raise ValueError(f"workload.{which} ({cap}) can deadlock {waiting[0].mode} batching{without}: up "
                                 f"to {stuck} requests can wait for batches that never fill while the client waits "
                                 f"for them; {fix}{which} to at least {stuck + 1}")
        return self

    @model_validator(mode="after")
    def _disaggregated(self) -> Scenario:
        pools = self.cluster.disaggregated
        if pools is None:
            return self
        for name, spec in (("prefill", pools.prefill), ("decode", pools.decode)):
            where = f"cluster.disaggregated.{name}"
            mode = (spec.batching or self.batching).mode
            if not MODES[mode].iteration_level:
                raise ValueError(f"{where} runs batching.mode {mode}: disaggregated pools hand requests over "
                                 "between steps, which needs iteration-level scheduling; use batching.mode: continuous")
        if (pools.decode.kv_cache or self.kv_cache).enable_prefix_caching:
            raise ValueError("cluster.disaggregated.decode has kv_cache.enable_prefix_caching: a decode replica "
                             "receives its prompts' KV whole, it never looks a prefix up; enable it on the prefill "
                             "pool only (disaggregated.prefill.kv_cache, or the scenario's kv_cache with a "
                             "decode.kv_cache of its own)")
        wl = self.workload
        if wl.max_concurrency is not None or wl.closed_loop is not None:
            raise ValueError("workload.max_concurrency / closed_loop with cluster.disaggregated is not modelled; "
                             "use an open-loop workload (arrival rate or trace)")
        if self.cluster.signal_delay_ms > 0:
            raise ValueError(f"cluster.signal_delay_ms ({self.cluster.signal_delay_ms:g}) with "
                             "cluster.disaggregated is not modelled; set it to 0")
        pools.check_kv_bytes((pools.prefill.device or self.device).preset is not None)
        return self

    def resolve(self, path: Path) -> Path:
        """A data path as the scenario means it: relative to the scenario file's folder."""
        if path.is_absolute() or self._base_dir is None:
            return path
        return self._base_dir / path

    def data_files(self) -> dict[str, Path]:
        """Every data file the scenario reads, by the dotted key naming it: ``{"workload.trace.path": ...}``.

        Paths are as written in the scenario (see :meth:`resolve` for where they point).
        """
        wl = self.workload
        files = {} if wl.trace is None else {"workload.trace.path": wl.trace.path}
        curve = wl.arrival.rate_curve if wl.arrival is not None else None
        if isinstance(curve, TraceCurve):
            files["workload.arrival.rate_curve.trace.path"] = curve.trace.path
        dists = [("workload.prompt_tokens", wl.prompt_tokens), ("workload.output_tokens", wl.output_tokens)]
        for i, cls in enumerate(wl.classes or []):
            dists += [(f"workload.classes.{i}.prompt_tokens", cls.prompt_tokens),
                      (f"workload.classes.{i}.output_tokens", cls.output_tokens)]
        files |= {f"{key}.path": dist.path for key, dist in dists if isinstance(dist, Empirical)}
        return files


def sized_caches(scenario: Scenario) -> list[tuple[str, ReplicaSpec | None, KVCache, Device, Batching]]:
    """Every KV cache a replica runs with, whose ``num_blocks`` resolution decides: (dotted key, the
    replica group holding it or None for the scenario's, the cache, the device and batching it runs with).

    The scenario's own cache always; a group's own cache; and a group with its own device or batching
    but the scenario's cache when that cache is sized (``auto`` or ``gpu_kv_cache_tokens``): such a group
    gets a cache of its own, sized for its GPU.
    """
    given = scenario.kv_cache
    out: list[tuple[str, ReplicaSpec | None, KVCache, Device, Batching]] = [
        ("kv_cache", None, given, scenario.device, scenario.batching)]
    sized = given.num_blocks == "auto" or given.gpu_kv_cache_tokens is not None
    for where, spec in scenario.cluster.named_groups():
        cache = spec.kv_cache if spec.kv_cache is not None else \
            given if sized and (spec.device is not None or spec.batching is not None) else None
        if cache is not None:
            out.append((f"{where}.kv_cache", spec, cache, spec.device or scenario.device,
                        spec.batching or scenario.batching))
    return out


def _models_in(annotation) -> list[type[BaseModel]]:
    """The models a field's annotation can hold (through Optional, lists, dicts and unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def suggestion(loc: tuple, root: type[BaseModel] | None = None) -> str | None:
    """For an unknown key at pydantic location ``loc``, the closest known key there, if one is close.

    The location is followed through the models from ``root`` (the scenario by default); list indexes
    and union tags are stepped over.
    """
    models: list[type[BaseModel]] = [root or Scenario]
    for part in loc[:-1]:
        fields = {name: f for m in models for name, f in m.model_fields.items()}
        if isinstance(part, str) and part in fields:
            models = _models_in(fields[part].annotation)
    known = {name for m in models for name in m.model_fields}
    close = difflib.get_close_matches(str(loc[-1]), sorted(known), n=1, cutoff=0.75)
    return close[0] if close else None


def replica_scenarios(scenario: Scenario) -> list[Scenario]:
    """The scenario each replica runs, in index order.

    Alike replicas all run ``scenario``; in a heterogeneous fleet each ``replica_specs`` group runs
    it with the sections its spec gives swapped in.
    """
    specs = scenario.cluster.groups()
    if specs is None:
        return [scenario] * scenario.cluster.fleet_size
    out: list[Scenario] = []
    for spec in specs:
        sections = {k: getattr(spec, k) for k in ("device", "kv_cache", "batching") if getattr(spec, k) is not None}
        out += [scenario.model_copy(update=sections)] * spec.count
    return out

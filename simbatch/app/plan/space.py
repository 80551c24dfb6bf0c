"""The search space of ``simbatch plan``: a small YAML file (or flags), and the configurations it spans.

A configuration is everything about a fleet but its size: the model and the GPU (a preset, or a
device you calibrated), tensor parallelism, expert parallelism where it applies, the weights'
precision, ``max_num_seqs``, ``max_num_batched_tokens``, ``gpu_memory_utilization``, and whether
prefill and decode share a replica (colocated) or run in pools of a fixed ratio (disaggregated,
``prefill:decode``). The planner then finds the fewest replicas of each that meet the SLOs, between
``replicas.min`` and ``replicas.max`` (for a ratio, units of it: ``1:2`` at 3 units is 3 prefill and
6 decode replicas). Every list defaults to the scenario's own value::

    models: [llama-3.1-8b]                    # model cards (simbatch presets); default: the scenario's preset
    gpus: [L40S, A100-80GB, H100-SXM]         # GPU cards; default: the scenario's preset
    tensor_parallel_size: [1, 2]              # GPUs per replica (vLLM's --tensor-parallel-size)
    expert_parallel: [false, true]            # MoE models with tensor_parallel_size > 1 only
    quantization: [none, fp8]                 # fp8 weights (the /fp8 preset; vLLM's --quantization fp8)
    max_num_seqs: [128, 256]
    max_num_batched_tokens: [2048, 8192]
    gpu_memory_utilization: [0.9]
    devices:                                  # calibrated devices, besides (or instead of) the presets
      - {name: my-h100, gpu: H100-SXM, device: {tau0_ms: 7.6, beta_ms: 0.05}, kv_cache: {gpu_kv_cache_tokens: 348304}}
    replicas: {min: 1, max: 64}
    colocated: true                           # default: true, unless the scenario is disaggregated
    disaggregated:                            # pools of these prefill:decode ratios too
      splits: ["1:1", "1:2"]
      kv_transfer: {bandwidth_gb_s: 50, latency_ms: 0.5}   # default: the scenario's

A preset configuration replaces the scenario's device section with its preset (keeping the
scenario's speculative decoding and inline cards) and sizes the KV cache as vLLM does
(``kv_cache.num_blocks: auto``): a scenario's explicit costs and block count describe its own GPU, not
the others. A calibrated device replaces the device section with its own and applies its
``kv_cache`` keys.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simbatch.config import KVTransfer, Scenario

MAX_CONFIGS = 5_000
"""The most configurations a search space may span without ``--force``: screening is cheap, not free."""

PosInt = Annotated[int, Field(gt=0, strict=True)]
_SPLIT = re.compile(r"^\s*([1-9][0-9]*)\s*:\s*([1-9][0-9]*)\s*$")
_HF_ID = re.compile(r"huggingface\.co/([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)")


class SpaceError(ValueError):
    """A search space that cannot be used; the message is one line naming the field and the fix."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class CalibratedDevice(_Model):
    """A device whose costs you measured (``simbatch calibrate`` prints them), and the GPU it runs on."""

    name: str = Field(min_length=1, description="How the tables name it.")
    gpu: str = Field(min_length=1, description="The GPU type: its price (and power) in the prices file.")
    tensor_parallel_size: PosInt = Field(default=1, description="GPUs per replica.")
    model: str = Field(default="", description="The model vLLM serves (for the `vllm serve` line), e.g. "
                       "meta-llama/Llama-3.1-8B-Instruct.")
    device: dict[str, Any] = Field(description="The scenario's device section for it (tau0_ms, beta_ms, ...).")
    kv_cache: dict[str, Any] = Field(default_factory=dict, description="kv_cache keys for it, e.g. "
                                     "gpu_kv_cache_tokens: the count vLLM logs at start-up.")


class Replicas(_Model):
    """The fleet sizes searched, in replicas (or units of a prefill:decode ratio)."""

    min: PosInt = 1
    max: PosInt = 64

    @model_validator(mode="after")
    def _ordered(self) -> Replicas:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class DisaggregatedSpace(_Model):
    """Disaggregated prefill and decode pools, at each of these ratios."""

    splits: list[str] = Field(min_length=1, description='prefill:decode ratios, e.g. ["1:1", "1:2"].')
    kv_transfer: KVTransfer | None = Field(default=None, description="The link between the pools; "
                                           "the scenario's cluster.disaggregated.kv_transfer when omitted.")

    @field_validator("splits")
    @classmethod
    def _ratios(cls, splits: list[str]) -> list[str]:
        for text in splits:
            if not _SPLIT.match(str(text)):
                raise ValueError(f"split {text!r} is not PREFILL:DECODE replicas, e.g. '1:2'")
        return splits


class SearchSpace(_Model):
    """What ``simbatch plan`` may choose from (module docstring); every list defaults to the scenario's."""

    models: list[str] | None = Field(default=None, min_length=1)
    gpus: list[str] | None = Field(default=None, min_length=1)
    tensor_parallel_size: list[PosInt] | None = Field(default=None, min_length=1)
    expert_parallel: list[bool] = Field(default_factory=lambda: [False], min_length=1)
    quantization: list[Literal["none", "fp8"]] | None = Field(default=None, min_length=1)
    max_num_seqs: list[PosInt] | None = Field(default=None, min_length=1)
    max_num_batched_tokens: list[PosInt] | None = Field(default=None, min_length=1)
    gpu_memory_utilization: list[Annotated[float, Field(gt=0, le=1)]] | None = Field(default=None, min_length=1)
    devices: list[CalibratedDevice] | None = Field(default=None, min_length=1)
    replicas: Replicas = Field(default_factory=Replicas)
    colocated: bool | None = None
    disaggregated: DisaggregatedSpace | None = None


@dataclass(frozen=True)
class Layout:
    """Colocated replicas (``prefill == 0``), or pools of ``prefill:decode`` replicas per unit."""

    prefill: int = 0
    decode: int = 0

    @property
    def replicas_per_unit(self) -> int:
        return 1 if self.prefill == 0 else self.prefill + self.decode

    @property
    def label(self) -> str:
        return "" if self.prefill == 0 else f"{self.prefill}:{self.decode}"


@dataclass(frozen=True)
class Config:
    """One configuration: a fleet of alike replicas (or pool units) short of its size."""

    device: str  # preset (llama-3.1-8b/H100-SXM/tp2) or calibrated device name
    gpu: str  # the GPU type, for its price and power
    tensor_parallel_size: int
    model_id: str  # what vLLM serves (empty when unknown)
    expert_parallel: bool
    quantization: str
    max_num_seqs: int
    max_num_batched_tokens: int
    layout: Layout
    values: dict[str, Any] = field(compare=False)  # scenario overrides, the fleet's size aside
    pools: dict[str, Any] | None = field(default=None, compare=False)  # cluster.disaggregated but the counts

    @property
    def label(self) -> str:
        split = f" {self.layout.label}" if self.layout.label else ""
        return f"{self.device} mns={self.max_num_seqs} mnbt={self.max_num_batched_tokens}{split}"

    def gpus(self, units: int) -> int:
        """GPUs of a fleet of ``units`` replicas (or pool units)."""
        return units * self.layout.replicas_per_unit * self.tensor_parallel_size

    def replicas(self, units: int) -> int:
        return units * self.layout.replicas_per_unit

    def at(self, units: int) -> dict[str, Any]:
        """The scenario overrides of this configuration at ``units`` replicas (or pool units)."""
        if self.layout.prefill == 0:
            return {**self.values, "cluster.replicas": units}
        pools = {"prefill": {"count": units * self.layout.prefill}, "decode": {"count": units * self.layout.decode},
                 **self.pools}
        return {**self.values, "cluster.disaggregated": pools, "cluster.replicas": self.replicas(units)}


def model_id(card) -> str:
    """The Hugging Face repository a model card's source names (what ``vllm serve`` takes), or ''."""
    found = _HF_ID.search(card.source or "")
    return found.group(1) if found else ""


def _device_section(scenario: Scenario, preset: str) -> dict[str, Any]:
    """The scenario's device section with ``preset`` in place of its costs: its speculative decoding
    and its inline cards kept (they are not the GPU's)."""
    keep = scenario.device.model_dump(include={"speculative", "gpu_card", "model_card"}, exclude_none=True)
    return {"preset": preset, **keep}


def _presets(space: SearchSpace, scenario: Scenario) -> list[tuple[str, Any, bool]]:
    """(preset name, its Deployment or the ValueError parsing it, expert parallel) of every combination."""
    from simbatch.hardware.preset import parse
    from simbatch.inputs.resolve import deployment

    if space.models is None and space.gpus is None and space.devices is not None:
        return []  # calibrated devices only
    own = deployment(scenario.device)
    if own is None and space.models is None and space.gpus is None:
        raise SpaceError("the scenario's device has no preset, so its GPU (and its price) is unknown; give models "
                         "and gpus to choose from (--model, --gpu), or your calibrated device with its GPU (devices: "
                         "in a search space)")
    if own is None and (space.models is None or space.gpus is None):
        missing = "models" if space.models is None else "gpus"
        raise SpaceError(f"search space: {missing} is not given and the scenario's device has no preset to take it "
                         f"from; list {missing} (or pass --{missing[:-1]}), give calibrated devices, or set "
                         "device.preset in the scenario")
    device = scenario.device
    cards = ({device.gpu_card.name: device.gpu_card} if device.gpu_card else None,
             {device.model_card.name: device.model_card} if device.model_card else None)
    models = space.models or [own.model.name]
    gpus = space.gpus or [own.gpu.name]
    moe = {}
    for name, kind in [*((m, "models") for m in models), *((g, "gpus") for g in gpus)]:
        try:
            found = parse(f"{name}/{gpus[0]}" if kind == "models" else f"{models[0]}/{name}", *cards)
        except ValueError as exc:
            raise SpaceError(f"search space: {kind}: {exc}") from None
        if kind == "models":
            moe[name] = found.model.is_moe
    tps = space.tensor_parallel_size or [own.tp if own else 1]
    quants = space.quantization or ["fp8" if own is not None and own.fp8 else "none"]
    out: dict[str, tuple[Any, bool]] = {}
    for m, g, tp, q, ep in itertools.product(models, gpus, tps, quants, space.expert_parallel):
        ep = ep and tp > 1 and moe[m]  # expert parallelism: a mixture of experts over several GPUs
        name = f"{m}/{g}" + (f"/tp{tp}" if tp > 1 else "") + ("/fp8" if q == "fp8" else "") + (f"/ep{tp}" if ep else "")
        if name not in out:
            try:
                out[name] = (parse(name, *cards), ep)
            except ValueError as exc:
                out[name] = (exc, ep)
    return [(name, *value) for name, value in out.items()]


def _layouts(space: SearchSpace, scenario: Scenario) -> list[tuple[Layout, dict[str, Any] | None]]:
    """Colocated and each disaggregated ratio asked for, with the rest of their ``cluster.disaggregated``
    (the KV link, the scenario's decode router)."""
    pools = scenario.cluster.disaggregated
    colocated = space.colocated if space.colocated is not None else pools is None
    layouts: dict[Layout, dict[str, Any] | None] = {Layout(): None} if colocated else {}
    router = {"decode_router": pools.decode_router} if pools is not None else {}
    if space.disaggregated is not None:
        link = space.disaggregated.kv_transfer or (pools.kv_transfer if pools is not None else None)
        if link is None:
            raise SpaceError("search space: disaggregated.kv_transfer is missing and the scenario has no "
                             "cluster.disaggregated to take it from; give kv_transfer: {bandwidth_gb_s: 50}")
        for text in space.disaggregated.splits:
            p, d = (int(x) for x in _SPLIT.match(text).groups())
            layouts.setdefault(Layout(p, d), {"kv_transfer": link.model_dump(), **router})
    elif pools is not None:
        layouts.setdefault(Layout(pools.prefill.count, pools.decode.count),
                           {"kv_transfer": pools.kv_transfer.model_dump(), **router})
    if not layouts:
        raise SpaceError("search space: colocated is false and no disaggregated splits are given: nothing to "
                         "plan; set colocated: true or give disaggregated.splits")
    return list(layouts.items())


def configurations(space: SearchSpace, scenario: Scenario, force: bool = False) -> list[Config]:
    """Every configuration of ``space`` for ``scenario`` (the scenario with ``--set`` applied), in order.

    Raises SpaceError for a space that names nothing known or spans nothing; a combination the
    scenario rejects (heads that do not split over tp, fp8 on a GPU without it) is a configuration
    still, rejected by the screening with its reason.
    """
    if scenario.cluster.replica_specs is not None:
        raise SpaceError("the scenario has cluster.replica_specs: plan sizes fleets of alike replicas; "
                         "remove replica_specs")
    batching = scenario.batching
    seqs = space.max_num_seqs or [batching.max_num_seqs]
    tokens = space.max_num_batched_tokens or [batching.max_num_batched_tokens]
    gmus = space.gpu_memory_utilization or [None]
    devices: list[tuple[str, str, int, str, bool, str, dict[str, Any]]] = []
    pools = scenario.cluster.disaggregated
    given_bytes = {"kv_bytes_per_token": pools.kv_bytes_per_token} if pools and pools.kv_bytes_per_token else {}
    for name, deployment, ep in _presets(space, scenario):
        gpu, tp, model, quant = name.split("/")[1], 1, "", "none"
        if not isinstance(deployment, Exception):
            gpu, tp, model, quant = deployment.gpu.name, deployment.tp, model_id(deployment.model), \
                "fp8" if deployment.fp8 else "none"
        else:
            tp = int(m.group(1)) if (m := re.search(r"/tp([0-9]+)", name)) else 1
            quant = "fp8" if "/fp8" in name else "none"
        values = {"device": _device_section(scenario, name), "kv_cache.num_blocks": "auto",
                  "kv_cache.gpu_kv_cache_tokens": None}
        devices.append((name, gpu, tp, model, ep, quant, values))
    for entry in space.devices or []:
        values = {"device": entry.device, **{f"kv_cache.{k}": v for k, v in entry.kv_cache.items()}}
        devices.append((entry.name, entry.gpu, entry.tensor_parallel_size, entry.model, False, "none", values))
    layouts = _layouts(space, scenario)
    count = len(devices) * len(seqs) * len(tokens) * len(gmus) * len(layouts)
    if count > MAX_CONFIGS and not force:
        raise SpaceError(f"search space: {count:,} configurations, more than {MAX_CONFIGS:,}; narrow the lists, "
                         "or pass --force")
    undo_pools = {"cluster.disaggregated": None} if scenario.cluster.disaggregated is not None else {}
    out = []
    for (name, gpu, tp, model, ep, quant, values), s, t, g, (layout, rest) in itertools.product(
            devices, seqs, tokens, gmus, layouts):
        extra = {"batching.max_num_seqs": s, "batching.max_num_batched_tokens": t}
        if g is not None:
            extra["kv_cache.gpu_memory_utilization"] = g
        if rest is not None and "preset" not in values["device"]:
            rest = {**rest, **given_bytes}  # a preset derives the KV bytes per token; a calibrated device cannot
        out.append(Config(name, gpu, tp, model, ep, quant, s, t, layout,
                          {**values, **extra, **(undo_pools if layout.prefill == 0 else {})}, rest))
    if not out:
        raise SpaceError("search space: it spans no configuration; give at least one model and GPU, or a device")
    return out

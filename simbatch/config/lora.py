"""``lora``: many LoRA adapters served from one base model (vLLM's ``--enable-lora``).

The server's side: how many adapters a step may use and the GPU holds (``max_loras``), how many host
memory keeps (``max_cpu_loras``), and what an adapter weighs (its rank and target modules, from the
model card of ``device.preset``, or ``adapter_bytes``) and the links it loads over. Which adapter a
request names is the workload's (``workload.adapters``, or a trace's ``adapter_column``). The
mechanics are :mod:`simbatch.features.lora`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from simbatch.config.base import MAX_LINK_GB_S, MIN_LINK_GB_S, PosFloat, PosInt, _Model

MAX_LORAS = 100_000
"""Adapters on one GPU or in host memory at most (vLLM serves hundreds; a thousand times more is no real server)."""

MAX_ADAPTER_BYTES = 1e12
"""One adapter at most 1 TB (a rank-256 adapter on every module of a 405B model is under 10 GB)."""

LoraModule = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ALL_MODULES: tuple[LoraModule, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class Lora(_Model):
    """Multi-LoRA serving: adapter slots on the GPU and in host memory, and what a load costs."""

    max_loras: PosInt = Field(default=1, le=MAX_LORAS, description="Adapters on the GPU at once, hence the most "
                              "distinct adapters one step may use (vLLM's --max-loras, default 1).")
    max_cpu_loras: PosInt | None = Field(
        default=None, le=MAX_LORAS, description="Adapters kept in host memory, those on the GPU included (vLLM's "
        "--max-cpu-loras); max_loras when omitted, as vLLM. One not there is read from storage first.")
    rank: PosInt = Field(default=16, le=4096, description="Every adapter's rank r (vLLM's --max-lora-rank bounds it; "
                         "default 16).")
    target_modules: list[LoraModule] = Field(
        default_factory=lambda: list(ALL_MODULES), min_length=1,
        description="The layers' matrices an adapter modifies (PEFT's target_modules); default all seven linear ones.")
    adapter_bytes: PosFloat | None = Field(
        default=None, le=MAX_ADAPTER_BYTES, description="One adapter's weights on one GPU, bytes; from the model card "
        "of device.preset when omitted: rank x sum over target modules of (d_in + d_out) x layers x 2 bytes (bf16), "
        "over the tensor-parallel degree (required without a preset).")
    host_link_gb_s: float | None = Field(
        default=None, ge=MIN_LINK_GB_S, le=MAX_LINK_GB_S, description="GPU-host link an adapter loads over, GB/s "
        "(PCIe Gen4 x16 about 25 in practice, Gen5 x16 about 50); the host link of device.preset's GPU when "
        "omitted (required without one).")
    storage_gb_s: float = Field(
        default=2.0, ge=MIN_LINK_GB_S, le=MAX_LINK_GB_S, description="Read rate of an adapter not in host memory, "
        "GB/s (a local NVMe reading safetensors: about 2; measure yours).")

    @model_validator(mode="after")
    def _cpu_holds_gpu(self) -> Lora:
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) is less than max_loras ({self.max_loras}): host "
                             "memory holds the GPU's adapters too (vLLM refuses it as well); set max_cpu_loras to "
                             f"at least {self.max_loras}")
        return self

    @property
    def cpu_slots(self) -> int:
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras


class Adapters(_Model):
    """Which LoRA adapter each request names: ``count`` adapters, by popularity rank."""

    count: PosInt = Field(le=MAX_LORAS, description="Adapters the requests name, 0 .. count - 1.")
    popularity: Literal["zipf", "uniform"] = Field(
        default="zipf", description="zipf: adapter k (from 0) is named with probability proportional to "
        "1 / (k + 1)^zipf_exponent; uniform: all alike.")
    zipf_exponent: float = Field(default=1.0, ge=0, le=10, description="Zipf's exponent s (0: uniform).")
    base_share: float = Field(default=0.0, ge=0, lt=1, description="Share of requests for the base model, no "
                              "adapter.")

"""``device.gpu_card`` and ``device.model_card``: the public numbers a preset is derived from, as a schema.

A card is what a spec sheet or a model's ``config.json`` says: memory, bandwidth and peak FLOP/s of a
GPU; layers, heads and sizes of a model. The cards simbatch ships are data
(``simbatch/data/hardware_cards.yaml``, loaded by :mod:`simbatch.hardware.cards`); a scenario can
bring its own inline, validated by the same models. The schema lives here, with the rest of the
scenario's, so that reading a scenario needs nothing of the hardware model; what a card *means* for
a step's cost is :mod:`simbatch.hardware.preset`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Bounds far past any real card, so that a typo (an exponent too many) is refused, not computed with:
MAX_MEMORY_GIB = 10_000.0  # 10 TiB on one GPU (the largest today: 288 GB)
MAX_GB_S = 1e6  # 1 PB/s of memory or link bandwidth (HBM3e: 8 TB/s)
MAX_TFLOPS = 1e6  # an exaflop/s dense on one GPU (B200: 4.5 PFLOP/s fp8)
MAX_PARAMS_B = 1e5  # a hundred trillion parameters
MAX_COUNT, MAX_WIDTH = 10_000, 10_000_000  # layers, heads, head_dim; hidden and MLP widths


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class GpuCard(_Card):
    """One accelerator, per GPU; FLOP/s are dense (no sparsity)."""

    name: str = Field(description="The name a preset uses, e.g. H100-SXM.")
    memory_gib: float = Field(gt=0, le=MAX_MEMORY_GIB,
                              description="Device memory, GiB (2^30 bytes; a card sold as 80GB has 80 GiB).")
    memory_bandwidth_gb_s: float = Field(gt=0, le=MAX_GB_S, description="Peak memory bandwidth, GB/s.")
    bf16_tflops: float = Field(gt=0, le=MAX_TFLOPS, description="Dense bf16 tensor peak, 1e12 FLOP/s.")
    fp8_tflops: float | None = Field(default=None, gt=0, le=MAX_TFLOPS, description="Dense fp8 tensor peak, "
                                     "1e12 FLOP/s; null when the GPU has no fp8.")
    interconnect_gb_s: float = Field(gt=0, le=MAX_GB_S,
                                     description="GPU-to-GPU bandwidth for tensor-parallel all-reduce, GB/s.")
    source: str = Field(default="", description="Where the numbers come from.")


class ModelCard(_Card):
    """One decoder-only transformer, as its config.json describes it."""

    name: str = Field(description="The name a preset uses, e.g. llama-3.1-8b.")
    params_b: float = Field(gt=0, le=MAX_PARAMS_B, description="Parameters, billions (all experts of a MoE).")
    active_params_b: float | None = Field(default=None, gt=0, le=MAX_PARAMS_B, description="Parameters one token "
                                          "runs through, billions (MoE); params_b when omitted.")
    layers: int = Field(gt=0, le=MAX_COUNT, description="Transformer layers.")
    hidden_size: int = Field(gt=0, le=MAX_WIDTH, description="Hidden size.")
    intermediate_size: int = Field(gt=0, le=MAX_WIDTH, description="MLP intermediate size (one expert's, for a MoE).")
    q_heads: int = Field(gt=0, le=MAX_COUNT, description="Attention (query) heads.")
    kv_heads: int = Field(gt=0, le=MAX_COUNT,
                          description="Key/value heads (fewer than q_heads under grouped-query attention).")
    head_dim: int = Field(gt=0, le=MAX_COUNT, description="Dimension of one head.")
    vocab_size: int = Field(gt=0, le=MAX_WIDTH * 100, description="Vocabulary size.")
    source: str = Field(default="", description="Where the numbers come from.")

    @model_validator(mode="after")
    def _consistent(self) -> ModelCard:
        if self.q_heads % self.kv_heads:
            raise ValueError(f"q_heads ({self.q_heads}) is not a multiple of kv_heads ({self.kv_heads})")
        if self.active_params_b is not None and self.active_params_b > self.params_b:
            raise ValueError(f"active_params_b ({self.active_params_b}) exceeds params_b ({self.params_b})")
        return self

    @property
    def active_b(self) -> float:
        return self.params_b if self.active_params_b is None else self.active_params_b

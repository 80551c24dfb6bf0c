"""``device.gpu_card`` and ``device.model_card``: the public numbers a preset is derived from, as a schema.

A card is what a spec sheet or a model's ``config.json`` says: memory, bandwidth and peak FLOP/s of a
GPU; layers, heads and sizes of a model. The cards simbatch ships are data
(``simbatch/data/hardware_cards.yaml``, loaded by :mod:`simbatch.hardware.cards`); a scenario can
bring its own inline, validated by the same models. The schema lives here, with the rest of the
scenario's, so that reading a scenario needs nothing of the hardware model; what a card *means* for
a step's cost is :mod:`simbatch.hardware.preset`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

# Bounds far past any real card, so that a typo (an exponent too many) is refused, not computed with:
MAX_MEMORY_GIB = 10_000.0  # 10 TiB on one GPU (the largest today: 288 GB)
MAX_GB_S = 1e6  # 1 PB/s of memory or link bandwidth (HBM3e: 8 TB/s)
MAX_TFLOPS = 1e6  # an exaflop/s dense on one GPU (B200: 4.5 PFLOP/s fp8)
MAX_PARAMS_B = 1e5  # a hundred trillion parameters
MAX_COUNT, MAX_WIDTH = 10_000, 10_000_000  # layers, heads, head_dim; hidden and MLP widths
MAX_WATTS = 1e5  # a hundred kilowatts on one board (a GB200: 1,200 W)


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class MeasuredEfficiency(_Card):
    """Fractions of a GPU's peaks measured on it with vLLM's own kernels (:attr:`GpuCard.measured_efficiency`).
    A kernel may beat a spec sheet's figure (boost clocks above the rated one), hence the bound past 1."""

    linear_flops: float | None = Field(default=None, gt=0, le=1.25,
        description="Prefill matrix multiplies (and the per-token norms and activations), of bf16_tflops; "
        "bf16 weights only (an /fp8 preset keeps the fitted fraction of fp8_tflops).")
    weights_bandwidth: float | None = Field(default=None, gt=0, le=1.25,
        description="The weights' stream at decode, of memory_bandwidth_gb_s (an HBM card).")
    gddr_weights_bandwidth: float | None = Field(default=None, gt=0, le=1.25,
        description="The weights' stream at decode, of memory_bandwidth_gb_s (a GDDR card).")
    kv_bandwidth: float | None = Field(default=None, gt=0, le=1.25,
        description="Decode attention's reads of the KV cache, of memory_bandwidth_gb_s; a bf16 cache only "
        "(an fp8 cache keeps the fitted fraction).")

    def given(self) -> dict[str, float]:
        """The fractions the card gives, by efficiency name."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class GpuCard(_Card):
    """One accelerator, per GPU; FLOP/s are dense (no sparsity)."""

    name: str = Field(description="The name a preset uses, e.g. H100-SXM.")
    memory_gib: float = Field(gt=0, le=MAX_MEMORY_GIB,
        description="Device memory as sold, GiB (2^30 bytes; a card sold as 80GB has "
                              "80 GiB).")
    visible_memory_gib: float | None = Field(
        default=None, gt=0, le=MAX_MEMORY_GIB,
        description="The total memory CUDA reports (torch.cuda.mem_get_info), GiB: what vLLM's "
        "gpu_memory_utilization multiplies; memory_gib less 0.5 GiB when omitted.")
    memory_bandwidth_gb_s: float = Field(gt=0, le=MAX_GB_S, description="Peak memory bandwidth, GB/s.")
    memory_kind: Literal["hbm", "gddr"] = Field(default="hbm",
        description="hbm (stacked, on the package) or gddr "
                                                "(GDDR6/6X/7 chips on the board): the weights stream at a different "
                                                "share of the peak (simbatch/data/hardware_efficiency.yaml).")
    bf16_tflops: float = Field(gt=0, le=MAX_TFLOPS, description="Dense bf16 tensor peak, 1e12 FLOP/s.")
    fp8_tflops: float | None = Field(default=None, gt=0, le=MAX_TFLOPS,
        description="Dense fp8 tensor peak, 1e12 FLOP/s; "
                                     "null when the GPU has no fp8.")
    interconnect_gb_s: float = Field(gt=0, le=MAX_GB_S,
        description="GPU-to-GPU bandwidth for tensor-parallel all-reduce, GB/s.")
    host_link_gb_s: float | None = Field(default=None, gt=0, le=MAX_GB_S,
        description="GPU-host link, both directions, GB/s "
                                         "(PCIe Gen4 x16 64, Gen5 x16 128, NVLink-C2C 900).")
    max_watts: float | None = Field(default=None, gt=0, le=MAX_WATTS,
        description="Board power limit (TDP/TGP), W.")
    idle_watts: float | None = Field(default=None, gt=0, le=MAX_WATTS,
        description="Power at 0 % utilisation, W.")
    aliases: tuple[str, ...] = Field(default=(), description="Other names a preset may use for this GPU.")
    measured_efficiency: MeasuredEfficiency = Field(default_factory=MeasuredEfficiency,
        description="Fractions of this GPU's peaks measured on it with vLLM's own kernels, in place of "
        "the ones fitted to other GPUs (simbatch/data/hardware_efficiency.yaml): linear_flops (prefill "
        "matrix multiplies, of bf16_tflops), weights_bandwidth or gddr_weights_bandwidth (the weights' "
        "stream, of memory_bandwidth_gb_s), kv_bandwidth (decode attention's KV reads, of "
        "memory_bandwidth_gb_s); the source must say where they were measured.")
    source: str = Field(default="", description="Where the numbers come from.")

    @model_validator(mode="after")
    def _consistent_gpu(self) -> GpuCard:
        if self.visible_memory_gib is not None and self.visible_memory_gib > self.memory_gib:
            raise ValueError(f"visible_memory_gib ({self.visible_memory_gib}) exceeds memory_gib ({self.memory_gib})")
        if self.idle_watts is not None and self.max_watts is not None and self.idle_watts > self.max_watts:
            raise ValueError(f"idle_watts ({self.idle_watts}) exceeds max_watts ({self.max_watts})")
        return self

    @property
    def cuda_memory_gib(self) -> float:
        """The memory vLLM sizes its cache from: the visible total, or the card's less 0.5 GiB."""
        return self.visible_memory_gib if self.visible_memory_gib is not None else self.memory_gib - 0.5


class ModelCard(_Card):
    """One decoder-only transformer, as its config.json describes it; its parameters are counted from
    the shapes (:attr:`params`), dense, grouped-query, mixture-of-experts and latent (MLA) attention alike.

    ``{hf_config: path/to/config.json}`` reads the shapes from a Hugging Face config (:mod:`.hf_config`).
    """

    name: str = Field(description="The name a preset uses, e.g. llama-3.1-8b.")
    layers: int = Field(gt=0, le=MAX_COUNT, description="Transformer layers.")
    hidden_size: int = Field(gt=0, le=MAX_WIDTH, description="Hidden size.")
    intermediate_size: int = Field(gt=0, le=MAX_WIDTH,
        description="MLP intermediate size (of a dense layer; of one expert when "
                                   "moe_intermediate_size is omitted).")
    q_heads: int = Field(gt=0, le=MAX_COUNT, description="Attention (query) heads.")
    kv_heads: int = Field(gt=0, le=MAX_COUNT,
        description="Key/value heads (fewer than q_heads under grouped-query attention).")
    head_dim: int = Field(gt=0, le=MAX_COUNT,
        description="Dimension of one head (query and key; under MLA the no-position and "
                          "rotary parts together).")
    vocab_size: int = Field(gt=0, le=MAX_WIDTH * 100, description="Vocabulary size.")
    tie_word_embeddings: bool = Field(default=False,
        description="The output head shares the embedding matrix.")
    gated_mlp: bool = Field(default=True,
        description="The MLP has gate, up and down projections (SwiGLU); false: "
                            "up and down only (GPT-J).")
    num_experts: int | None = Field(default=None, gt=1, le=MAX_COUNT * 10,
        description="MoE: routed experts per layer.")
    experts_per_token: int | None = Field(default=None, gt=0, le=MAX_COUNT,
        description="MoE: experts each token is routed to.")
    moe_intermediate_size: int | None = Field(default=None, gt=0, le=MAX_WIDTH,
        description="MoE: one expert's intermediate "
                                              "size; intermediate_size when omitted.")
    shared_experts: int = Field(default=0, ge=0, le=MAX_COUNT,
        description="MoE: experts every token runs through (of "
                                "moe_intermediate_size each).")
    dense_layers: int = Field(default=0, ge=0, le=MAX_COUNT,
        description="MoE: the first layers with a dense MLP "
                              "(intermediate_size) instead of experts.")
    expert_bits: float | None = Field(default=None, gt=0, le=16, description="MoE: bits per expert weight as "
                                      "the checkpoint stores them (4.25 for MXFP4); the preset's precision when "
                                      "omitted.")
    kv_lora_rank: int | None = Field(default=None, gt=0, le=MAX_WIDTH,
        description="MLA: the compressed key/value latent "
                                     "cached per token and layer (DeepSeek-V3: 512).")
    q_lora_rank: int | None = Field(default=None, gt=0, le=MAX_WIDTH,
        description="MLA: the query's low-rank width.")
    qk_rope_head_dim: int | None = Field(default=None, gt=0, le=MAX_COUNT,
        description="MLA: the rotary part of a head, cached "
                                         "beside the latent (DeepSeek-V3: 64).")
    v_head_dim: int | None = Field(default=None, gt=0, le=MAX_COUNT,
        description="Dimension of a value head; head_dim when "
                                   "omitted.")
    max_position_embeddings: int | None = Field(
        default=None, gt=0, le=MAX_WIDTH * 100,
        description="The context the model was built for: vLLM's max_model_len when not set, "
        "and the length of its rotary cos/sin table.")
    sliding_window: int | None = Field(default=None, gt=0, le=MAX_WIDTH * 100,
        description="Tokens a sliding-window layer attends "
                                       "to.")
    sliding_layers: int = Field(default=0, ge=0, le=MAX_COUNT,
        description="How many layers use the sliding window.")
    kv_cache_dtype: Literal["fp8"] | None = Field(
        default=None, description="The KV cache dtype the checkpoint asks for (a ModelOpt kv_cache_quant_algo): what "
        "vLLM's --kv-cache-dtype auto means for it; the model's own dtype (bf16) when omitted.")
    params_b: float | None = Field(default=None, gt=0, le=MAX_PARAMS_B,
        description="Parameters, billions: counted from the shapes "
                                   "when omitted (give it only for an architecture they do not describe).")
    active_params_b: float | None = Field(default=None, gt=0, le=MAX_PARAMS_B,
        description="Parameters one token runs through, "
                                          "billions: counted from the shapes when omitted.")
    source: str = Field(default="", description="Where the numbers come from.")

    @model_validator(mode="before")
    @classmethod
    def _from_hf_config(cls, data, info: ValidationInfo):
        if isinstance(data, dict) and "hf_config" in data:
            from simbatch.config.hf_config import card_fields

            base = (info.context or {}).get("base_dir")
            return card_fields(data, base)
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ModelCard:
        if self.q_heads % self.kv_heads:
            raise ValueError(f"q_heads ({self.q_heads}) is not a multiple of kv_heads ({self.kv_heads})")
        if (self.num_experts is None) != (self.experts_per_token is None):
            raise ValueError("num_experts and experts_per_token go together: give both for a MoE, neither for a "
                             "dense model")
        if self.num_experts is not None and self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token ({self.experts_per_token}) exceeds num_experts ({self.num_experts})")
        moe_only = [k for k in ("moe_intermediate_size", "expert_bits") if getattr(self, k) is not None]
        moe_only += [k for k in ("shared_experts", "dense_layers") if getattr(self, k)]
        if self.num_experts is None and moe_only:
            raise ValueError(f"{', '.join(moe_only)} describe experts; give num_experts and experts_per_token")
        if self.dense_layers >= self.layers and self.num_experts is not None:
            raise ValueError(f"dense_layers ({self.dense_layers}) leaves none of the {self.layers} layers to experts")
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ValueError("kv_lora_rank and qk_rope_head_dim go together (MLA): give both, or neither")
        if self.kv_lora_rank is not None and self.qk_rope_head_dim >= self.head_dim:
            raise ValueError(f"qk_rope_head_dim ({self.qk_rope_head_dim}) must be a part of head_dim ({self.head_dim})")
        if self.sliding_layers > self.layers or (self.sliding_layers > 0) != (self.sliding_window is not None):
            raise ValueError("sliding_window and sliding_layers go together, sliding_layers at most layers")
        if self.params_b is not None and self.active_params_b is not None and self.active_params_b > self.params_b:
            raise ValueError(f"active_params_b ({self.active_params_b}) exceeds params_b ({self.params_b})")
        return self

    # ------------------------------------------------------------------ shapes
    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def expert_intermediate(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def v_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def full_attention_layers(self) -> int:
        return self.layers - self.sliding_layers

    @property
    def kv_elements_per_token_layer(self) -> int:
        """What one token caches in one layer, elements (all heads): keys and values, or MLA's latent and
        rotary key."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads * self.head_dim

    # ------------------------------------------------------------------ parameters, counted
    def attention_params(self) -> int:
        """One layer's attention projections (biases and norms left out: under 0.1 % of any card)."""
        h, q = self.hidden_size, self.q_heads
        if not self.is_mla:
            return h * q * self.head_dim + 2 * h * self.kv_heads * self.head_dim + q * self.v_dim * h
        nope = self.head_dim - self.qk_rope_head_dim
        q_proj = h * q * self.head_dim if self.q_lora_rank is None else \
            h * self.q_lora_rank + self.q_lora_rank * q * self.head_dim
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * q * (nope + self.v_dim)
        return q_proj + kv + q * self.v_dim * h

    def mlp_params(self, intermediate: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * intermediate

    def expert_params(self) -> int:
        """One routed expert of one layer."""
        return self.mlp_params(self.expert_intermediate)

    def embedding_params(self) -> int:
        """The embedding matrix and the output head (once when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def _counted(self, experts: int) -> int:
        dense = self.dense_layers if self.is_moe else self.layers
        layer_norms = 2 * self.hidden_size
        total = self.layers * (self.attention_params() + layer_norms) + dense * self.mlp_params(self.intermediate_size)
        if self.is_moe:
            router = self.hidden_size * self.num_experts
            total += self.moe_layers * (router + (experts + self.shared_experts) * self.expert_params())
        return total + self.embedding_params() + self.hidden_size

    @property
    def params(self) -> float:
        """Parameters (all experts of a MoE): ``params_b`` when given, else counted from the shapes."""
        return self.params_b * 1e9 if self.params_b is not None else float(self._counted(self.num_experts or 0))

    @property
    def active_params(self) -> float:
        """Parameters one token runs through (its experts of a MoE, embeddings included)."""
        if self.active_params_b is not None:
            return self.active_params_b * 1e9
        if not self.is_moe:
            return self.params
        counted = self._counted(self.experts_per_token)
        return counted if self.params_b is None else counted * self.params / self._counted(self.num_experts)

    @property
    def expert_weights(self) -> float:
        """Parameters in the routed experts (all layers)."""
        return float(self.moe_layers * self.num_experts * self.expert_params()) if self.is_moe else 0.0

    @property
    def params_billions(self) -> float:
        return self.params / 1e9

    @property
    def active_b(self) -> float:
        return self.active_params / 1e9

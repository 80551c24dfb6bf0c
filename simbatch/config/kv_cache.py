"""``kv_cache``: the paged KV cache, in blocks of ``block_size`` tokens.

``num_blocks`` is a number, or ``auto``: sized from the GPU's memory as vLLM sizes it at start-up
(needs ``device.preset``), or from the token count vLLM logs (``gpu_kv_cache_tokens``). Turning
``auto`` into a number needs the device and the batching the cache runs with, so it is resolution's
work (:mod:`simbatch.inputs.resolve`), for the scenario and for every replica group; what can be
checked from the section alone (a count smaller than a block, a count that disagrees with
``num_blocks``, ``auto`` with nothing to size it from) is checked here, by :meth:`KVCache.check_blocks`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from simbatch.config.base import (
    MAX_KV_BYTES_PER_TOKEN,
    MAX_LINK_GB_S,
    MIN_LINK_GB_S,
    CostMs,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
    _Model,
)

MAX_NUM_BLOCKS = 100_000_000
"""KV blocks on one device: a hundred times more than the largest GPU holds at block_size 1."""

MAX_HOST_BLOCKS = 10_000_000
"""Blocks in the host tier: 10^7 (160 GiB of llama-3.1-8b's KV at 16-token blocks; each held block costs
the simulator about a hundred bytes, so the bound keeps a run under a gigabyte for them)."""

MAX_KV_CACHE_TOKENS = 1_000_000_000
"""KV tokens on one device (vLLM's "GPU KV cache size"): a hundred times the largest GPU's."""


class KVCache(_Model):
    """Paged KV cache: fixed-size blocks, allocated as sequences grow."""

    block_size: PosInt = Field(default=16, description="Tokens per block.")
    dtype: Literal["auto", "bf16", "bfloat16", "fp16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        default="auto", description="The cache's element type, vLLM's --kv-cache-dtype: auto is the model's (bf16), "
        "or fp8 where its checkpoint quantises the cache (ModelOpt kv_cache_quant_algo); fp8 halves the bytes a "
        "token caches, so the preset's KV read and the blocks num_blocks: auto gives.")
    num_blocks: PosInt | Literal["auto"] = Field(
        default=8192, description="Blocks on the device; auto: from the GPU's memory as vLLM sizes it (needs "
        "device.preset), or from gpu_kv_cache_tokens.")
    gpu_kv_cache_tokens: PosInt | None = Field(
        default=None, le=MAX_KV_CACHE_TOKENS, description="The token count vLLM logs at start-up (\"GPU KV cache size: N tokens\"): "
        "num_blocks = N // block_size.")
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1, description="num_blocks auto: the fraction of GPU memory vLLM may use "
        "(its --gpu-memory-utilization).")
    activation_reserve_gib: NonNegFloat | None = Field(
        default=None, description="num_blocks auto: memory kept for activations and outside PyTorch, GiB per "
        "GPU; estimated from the model when omitted (docs/hardware.md).")
    swap_blocks: NonNegInt = Field(default=0, description="Blocks in the host swap pool (swap preemption).")
    swap_ms_per_block: CostMs = Field(default=0.0, description="Transfer time per block, each way, ms.")
    enable_prefix_caching: bool = Field(
        default=False, description="Keep computed blocks, keyed by their content, for later requests with the "
        "same prefix (vLLM's automatic prefix caching; continuous batching only)."
    )

    host_blocks: NonNegInt = Field(
        default=0, le=MAX_HOST_BLOCKS, description="Blocks of the host KV tier: what the prefix cache evicts is kept "
        "in host memory and loaded back on a later hit (vLLM's --kv-offloading-size, in blocks: GiB x 2^30 / "
        "(block_size x KV bytes per token); LMCache's CPU backend); 0: none. Needs enable_prefix_caching.")
    host_link_gb_s: float | None = Field(
        default=None, ge=MIN_LINK_GB_S, le=MAX_LINK_GB_S, description="GPU-host link the host tier loads over, "
        "GB/s (PCIe Gen4 x16 about 25 in practice, Gen5 x16 about 50, NVLink-C2C about 400). Required with "
        "host_blocks.")
    host_load_overlap: bool = Field(
        default=True, description="Loads from the host tier overlap the step's compute (layer by layer, as LMCache "
        "and vLLM's offloading connector pipeline them): the step lasts the longer of the two; false: the load "
        "comes first and adds its whole time.")
    kv_bytes_per_token: PosFloat | None = Field(
        default=None, le=MAX_KV_BYTES_PER_TOKEN, description="KV bytes one token caches on one GPU, for the host "
        "tier's transfers; from device.preset when omitted (required without one).")

    @model_validator(mode="after")
    def _host_tier(self) -> KVCache:
        if self.host_blocks and not self.enable_prefix_caching:
            raise ValueError(f"host_blocks ({self.host_blocks}) keeps what the prefix cache evicts, but "
                             "enable_prefix_caching is false; set enable_prefix_caching: true, or host_blocks: 0")
        return self

    @field_validator("num_blocks", mode="before")
    @classmethod
    def _blocks_or_auto(cls, value):
        # One message for both halves of the union (pydantic would list a failure for each).
        if value == "auto" or isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_NUM_BLOCKS:
            return value
        raise ValueError(f"num_blocks must be a whole number of blocks greater than 0 and at most "
                         f"{MAX_NUM_BLOCKS:,} (a hundred times what the largest GPU holds), or auto")

    def dtype_bytes(self, model_kv_dtype: str | None = None) -> str:
        """``dtype`` as bf16 or fp8 (two bytes or one per element); ``auto`` is ``model_kv_dtype`` (what the
        model's checkpoint asks for) or bf16."""
        if self.dtype == "auto":
            return model_kv_dtype or "bf16"
        return "fp8" if self.dtype.startswith("fp8") else "bf16"

    @property
    def blocks_from_tokens(self) -> int | None:
        """The blocks ``gpu_kv_cache_tokens`` gives (whole blocks: vLLM logs blocks x block_size), or None."""
        return None if self.gpu_kv_cache_tokens is None else self.gpu_kv_cache_tokens // self.block_size

    def check_blocks(self, has_preset: bool, where: str) -> None:
        """ValueError when ``num_blocks`` cannot become a number: ``where`` names the section, and
        ``has_preset`` says whether the device it runs on has a preset to size ``auto`` from."""
        blocks = self.blocks_from_tokens
        if blocks is not None:
            if blocks < 1:
                raise ValueError(f"{where}.gpu_kv_cache_tokens ({self.gpu_kv_cache_tokens}) is less than one block "
                                 f"of {self.block_size} tokens; give the token count vLLM logs")
            if "num_blocks" in self.model_fields_set and self.num_blocks not in ("auto", blocks):
                raise ValueError(f"{where}.gpu_kv_cache_tokens ({self.gpu_kv_cache_tokens}) gives {blocks} blocks "
                                 f"of {self.block_size} tokens, but num_blocks is {self.num_blocks}; remove "
                                 "num_blocks (or set it to auto)")
        elif self.num_blocks == "auto" and not has_preset:
            raise ValueError(f"{where}.num_blocks is auto, which derives the blocks from the model and the GPU; "
                             "set device.preset (e.g. llama-3.1-8b/H100-SXM), or give "
                             f"{where}.gpu_kv_cache_tokens or a number of blocks")

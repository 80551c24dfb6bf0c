"""``kv_cache.num_blocks: auto``: the KV blocks a GPU has once the weights and activations are in.

vLLM sizes its cache at start-up (``determine_num_available_blocks``, "Available KV cache memory"):
it loads the weights, runs one forward pass of ``max_num_batched_tokens`` dummy tokens to measure
the peak activation memory, and gives the KV cache the rest of ``gpu_memory_utilization`` of the
GPU's memory:

    blocks = (memory * gpu_memory_utilization - weights per GPU - activation reserve)
             / (KV bytes per token per GPU * block_size)

and logs the result as "GPU KV cache size: N tokens" (N = blocks * block_size). The activation
reserve here is an estimate of that profile run (:func:`activation_reserve_bytes`); when you have
vLLM's log, give its token count instead (``kv_cache.gpu_kv_cache_tokens``), or the measured reserve
(``kv_cache.activation_reserve_gib``).
"""

from __future__ import annotations

from dataclasses import dataclass

from simbatch.hardware.preset import BF16_BYTES, Deployment

GIB = 2**30
NON_TORCH_BYTES = 1 * GIB
"""Memory outside PyTorch's allocator (CUDA context, NCCL buffers, CUDA graphs), roughly 1 GiB per GPU."""
LOGITS_BYTES = 4  # vLLM computes the sampled tokens' logits in fp32


def activation_reserve_bytes(d: Deployment, max_num_batched_tokens: int, max_num_seqs: int) -> float:
    """An estimate of vLLM's profile run: the MLP's gate and up projections of every batched token
    (the largest live activation), a few hidden-size buffers per token, the sampled sequences' fp32
    logits, and the memory PyTorch does not see."""
    per_token = (2 * d.model.intermediate_size / d.tp + 4 * d.model.hidden_size) * BF16_BYTES
    return max_num_batched_tokens * per_token + max_num_seqs * d.model.vocab_size * LOGITS_BYTES + NON_TORCH_BYTES


@dataclass(frozen=True)
class KVBudget:
    """How one GPU's memory is split, bytes, and the blocks that gives."""

    usable: float
    weights: float
    activations: float
    bytes_per_block: float

    @property
    def blocks(self) -> int:
        return int((self.usable - self.weights - self.activations) // self.bytes_per_block)

    def describe(self) -> str:
        g = lambda b: f"{b / GIB:.1f} GiB"  # noqa: E731
        return (f"{g(self.usable)} usable - {g(self.weights)} weights - {g(self.activations)} activations = "
                f"{g(self.usable - self.weights - self.activations)} for KV, {self.bytes_per_block / 1024:g} KiB per block")


def weights_problem(d: Deployment, gpu_memory_utilization: float) -> str | None:
    """Why the deployment cannot even load, its weights past the memory vLLM may use; None when they fit."""
    usable = d.gpu.memory_gib * GIB * gpu_memory_utilization
    if d.weights_bytes_per_gpu <= usable:
        return None
    tp = next((n for n in (2, 4, 8, 16) if d.model.q_heads % (d.tp * n) == 0 and
               d.weights_bytes_per_gpu / n <= usable), None)
    fix = f"split them with /tp{d.tp * tp}" if tp else "use a larger GPU"
    return (f"{d.name}: its weights, {d.weights_bytes_per_gpu / GIB:.1f} GiB per GPU, exceed the "
            f"{usable / GIB:.1f} GiB of the {d.gpu.name} that vLLM may use (gpu_memory_utilization "
            f"{gpu_memory_utilization:g}); {fix}" + ("" if d.fp8 or d.gpu.fp8_tflops is None else ", or /fp8"))


def kv_budget(d: Deployment, block_size: int, gpu_memory_utilization: float, max_num_batched_tokens: int,
              max_num_seqs: int, activation_reserve_gib: float | None = None) -> KVBudget:
    """The split of one GPU's memory for deployment ``d``; ValueError when nothing is left for the KV cache."""
    act = activation_reserve_bytes(d, max_num_batched_tokens, max_num_seqs) if activation_reserve_gib is None \
        else activation_reserve_gib * GIB
    budget = KVBudget(d.gpu.memory_gib * GIB * gpu_memory_utilization, d.weights_bytes_per_gpu, act,
                      d.kv_bytes_per_token * block_size)
    if budget.blocks < 1:
        raise ValueError(f"kv_cache.num_blocks: auto finds no room for the KV cache of {d.name}: "
                         f"{budget.describe()}; use more GPUs (/tpN in device.preset), /fp8, or a larger "
                         "kv_cache.gpu_memory_utilization")
    return budget

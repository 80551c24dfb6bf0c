"""``kv_cache.num_blocks: auto``: the KV blocks vLLM's memory profiling leaves a GPU.

vLLM V1 sizes its cache at start-up (``Worker.determine_available_memory``): it loads the weights,
runs one profiling forward pass of ``max_num_batched_tokens`` dummy tokens spread over
``min(max_num_batched_tokens, max_num_seqs)`` requests and then a dummy sampler pass over those
requests' logits, and gives the cache what is left of ``gpu_memory_utilization`` of the memory CUDA
reports:

    available = visible memory x gpu_memory_utilization - weights - peak activation - non-torch memory
    blocks    = available // (KV bytes per token on one GPU x block_size)

logged as "Available KV cache memory" and "GPU KV cache size: N tokens" (N = blocks x block_size).
The parts, as modelled here:

- **weights**: the model's parameters in their precision (fp8 keeps the embedding and output head in
  bf16; MXFP4 experts at 4.25 bits, their width padded as vLLM's kernels lay them out), and the rotary
  embedding's cos/sin table ("Model loading took X GiB");
- **peak activation**: the larger of the forward pass's widest live tensors (the MLP's gate and up
  projections and activation, or a MoE's routed copies, plus a few hidden-state buffers) and the
  sampler's: fp32 logits of every profiled request, sorted for top-k and top-p with their int64
  indices, softmax and cumulative sums, about ``SAMPLER_LOGITS_COPIES`` fp32 copies of the logits,
  beside the forward's hidden states. The sampler dominates wherever ``max_num_seqs`` is large
  (vLLM's 1024 on a >= 70 GiB GPU);
- **non-torch memory**: CUDA context growth, cuBLAS workspaces and, under tensor parallelism,
  NCCL and custom all-reduce buffers (as vLLM's logs report it);
- **CUDA graphs** are captured after the cache is allocated and are not subtracted (vLLM 0.14 and
  0.19 by default): they come out of the ``1 - gpu_memory_utilization`` headroom.

The constants are fitted to vLLM's own profiling logs (docs/hardware.md lists them with the error of
this model on each); give the measured reserve (``kv_cache.activation_reserve_gib``) or, better, the
logged token count (``kv_cache.gpu_kv_cache_tokens``) when you have them.
"""

from __future__ import annotations

from dataclasses import dataclass

from simbatch.hardware.preset import BF16_BYTES, Deployment

GIB = 2**30
LOGITS_BYTES = 4  # the sampler works on fp32 logits
SAMPLER_LOGITS_COPIES = 9.6
"""Peak of the profiled sampler pass, in fp32 copies of the logits (top-k/top-p sort, indices, softmax,
scatter): 9.57-9.64 over the five models of llm-d's H100 profiling logs (max_num_seqs 1024), where the
sampler is the peak (docs/hardware.md)."""
NON_TORCH_BYTES = {1: 0.13 * GIB, 2: 0.55 * GIB}
"""Memory outside PyTorch's allocator after profiling, per GPU: 0.12-0.14 GiB in H100 logs at TP1,
0.55 GiB at TP2 (NCCL and custom all-reduce buffers); more GPUs are taken as TP2."""
MXFP4_PAD = 256  # vLLM's MXFP4 MoE kernels pad an expert's intermediate width to a multiple of this


def weights_bytes(d: Deployment) -> float:
    """What "Model loading took" reports for one GPU, bytes: the weights and the rotary cos/sin table."""
    m = d.model
    weights = d.weights_bytes_per_gpu
    if m.is_moe and m.expert_bits and m.expert_intermediate % MXFP4_PAD:
        padded = -(-m.expert_intermediate // MXFP4_PAD) * MXFP4_PAD
        weights += (padded / m.expert_intermediate - 1) * m.moe_layers * d.local_experts * d.local_expert_bytes
    rotary = m.qk_rope_head_dim or m.head_dim
    return weights + (m.max_position_embeddings or 0) * rotary * BF16_BYTES


def forward_peak_bytes(d: Deployment, tokens: int) -> float:
    """The profiling forward pass's widest live tensors for ``tokens`` tokens, one GPU."""
    m = d.model
    if m.is_moe:
        width = m.experts_per_token * 3 * m.expert_intermediate / (d.tp if d.ep == 1 else 1) * d.dp
    else:
        width = 3 * m.intermediate_size / d.tp  # gate and up projections, and their product
    return tokens * (width + 4 * m.hidden_size) * BF16_BYTES


def sampler_peak_bytes(d: Deployment, tokens: int, requests: int) -> float:
    """The profiled sampler pass: fp32 logits of ``requests`` rows sorted and normalised, beside the
    forward's hidden states of ``tokens`` tokens."""
    return SAMPLER_LOGITS_COPIES * requests * d.model.vocab_size * LOGITS_BYTES + \
        tokens * d.model.hidden_size * BF16_BYTES


def activation_reserve_bytes(d: Deployment, max_num_batched_tokens: int, max_num_seqs: int) -> float:
    """The peak activation of vLLM's profiling pass plus the memory PyTorch does not see, one GPU."""
    requests = min(max_num_batched_tokens, max_num_seqs)
    peak = max(forward_peak_bytes(d, max_num_batched_tokens),
               sampler_peak_bytes(d, max_num_batched_tokens, requests))
    return peak + NON_TORCH_BYTES[min(d.tp, 2)]


@dataclass(frozen=True)
class KVBudget:
    """How one GPU's memory is split, bytes, and the blocks that gives."""

    usable: float
    weights: float
    activations: float
    bytes_per_block: float

    @property
    def available(self) -> float:
        return self.usable - self.weights - self.activations

    @property
    def blocks(self) -> int:
        return int(self.available // self.bytes_per_block)

    def describe(self) -> str:
        g = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
        return (f"{g(self.usable)} usable - {g(self.weights)} weights - {g(self.activations)} activations = "
                f"{g(self.available)} for KV, {self.bytes_per_block / 1024:g} KiB per block")


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
    budget = KVBudget(d.gpu.cuda_memory_gib * GIB * gpu_memory_utilization, weights_bytes(d), act,
                      d.kv_bytes_per_token * block_size)
    if budget.blocks < 1:
        raise ValueError(f"kv_cache.num_blocks: auto finds no room for the KV cache of {d.name}: "
                         f"{budget.describe()}; use more GPUs (/tpN in device.preset), /fp8, or a larger "
                         "kv_cache.gpu_memory_utilization")
    return budget


def logged_kv_caches():
    """vLLM's own start-up logs (``simbatch/data/measured/kv_logs.csv``, with their sources) beside what
    ``num_blocks: auto`` gives for each: a frame of the log's row, ``predicted_tokens`` /
    ``predicted_kv_gib``, and ``error`` (relative, of the tokens where the log gives them, else of the GiB)."""
    from importlib import resources

    import pandas as pd

    from simbatch.hardware.preset import parse

    with resources.files("simbatch").joinpath("data/measured/kv_logs.csv").open(encoding="utf-8") as f:
        logs = pd.read_csv(f)
    tokens, gib = [], []
    for row in logs.itertuples():
        model, _, precision = row.model.partition("/")
        tp = f"/tp{row.tp}" if row.tp > 1 else ""
        d = parse(f"{model}/{row.gpu}{tp}" + (f"/{precision}" if precision else ""), kv_dtype=row.kv_dtype)
        budget = kv_budget(d, 16, row.gpu_memory_utilization, row.max_num_batched_tokens, row.max_num_seqs)
        tokens.append(budget.blocks * 16)
        gib.append(budget.available / GIB)
    logs["predicted_tokens"], logs["predicted_kv_gib"] = tokens, gib
    logs["error"] = (logs.predicted_tokens / logs.logged_tokens).where(logs.logged_tokens.notna(),
                                                                      logs.predicted_kv_gib / logs.logged_kv_gib) - 1
    return logs

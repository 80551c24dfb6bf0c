"""vLLM V1's defaults for a server on a given GPU: what ``vllm serve`` runs with when a flag is not given.

From vLLM's source (0.14.1 and 0.19.0 alike, ``engine/arg_utils.py``):

- ``max_num_batched_tokens`` and ``max_num_seqs`` by the usage context and the GPU's memory
  (``get_batch_defaults``): for the OpenAI-compatible server (``vllm serve``), 8192 and 1024 on a GPU
  of at least 70 GiB whose name does not say A100, else 2048 and 256; then clamped so that the budget
  is at most ``max_num_seqs x max_model_len`` (and at least ``max_model_len`` without chunked
  prefill) and ``max_num_seqs`` at most the budget;
- prefix caching on, chunked prefill on;
- async scheduling on (from vLLM 0.12 or 0.13; off for speculative decoding with a draft model);
- the API server in front: its tokenizer batches prompts for up to 2 ms
  (``AsyncMicrobatchTokenizer``), and HTTP, the hand-off to the engine core process and the streamed
  event back cost about 1 ms each way (an estimate: vLLM's source gives no figure).

:func:`defaults` says, for one model on one GPU, the value of each of these scenario keys and why;
resolution (:mod:`simbatch.inputs.resolve`) applies them where a scenario with a preset leaves a key out.
"""

from __future__ import annotations

from simbatch.config.cards import GpuCard, ModelCard

LARGE_GPU_GIB = 70
"""vLLM's threshold for its larger batch defaults, GiB of device memory."""
BATCH_DEFAULTS = {True: (8192, 1024), False: (2048, 256)}
"""(max_num_batched_tokens, max_num_seqs) of ``vllm serve`` on a large GPU (True) or another."""
FRONTEND_MS = {"request_latency_ms": 3.0, "response_latency_ms": 1.0}
"""The API server's latency each way: the tokenizer's 2 ms batching window and about 1 ms of HTTP and
hand-off on the way in, about 1 ms of detokenisation and streaming on the way out (estimates)."""


def large_gpu(gpu: GpuCard) -> bool:
    """Whether vLLM gives this GPU its larger batch defaults: at least 70 GiB, and not an A100."""
    names = (gpu.name, *gpu.aliases)
    return gpu.cuda_memory_gib >= LARGE_GPU_GIB and not any("a100" in n.lower() for n in names)


def batch_defaults(gpu: GpuCard, model: ModelCard, chunked_prefill: bool = True) -> tuple[int, int, str]:
    """``(max_num_batched_tokens, max_num_seqs, why)`` of ``vllm serve`` for ``model`` on ``gpu``."""
    large = large_gpu(gpu)
    tokens, seqs = BATCH_DEFAULTS[large]
    if not large and gpu.cuda_memory_gib >= LARGE_GPU_GIB:
        why = f"vllm serve's default on an A100, whatever its memory: {gpu.name}"
    else:
        why = (f"vllm serve's default on a GPU of {'at least' if large else 'under'} {LARGE_GPU_GIB} GiB: "
               f"{gpu.name}, {gpu.cuda_memory_gib:g} GiB")
    context = model.max_position_embeddings
    if context is not None:
        tokens = min(tokens, seqs * context)
        if not chunked_prefill:
            tokens = max(tokens, context)
    return tokens, min(seqs, tokens), why


def defaults(gpu: GpuCard, model: ModelCard, chunked_prefill: bool = True) -> dict[str, tuple[object, str]]:
    """Each scenario key vLLM sets for ``model`` on ``gpu``, by its dotted name in a section: value and why."""
    tokens, seqs, why = batch_defaults(gpu, model, chunked_prefill)
    return {"batching.max_num_batched_tokens": (tokens, why), "batching.max_num_seqs": (seqs, why),
            "kv_cache.enable_prefix_caching": (True, "vLLM V1 caches prefixes by default"),
            "scheduler.async_scheduling": (True, "vLLM V1 schedules one step ahead by default (0.12 on)"),
            "frontend.request_latency_ms": (FRONTEND_MS["request_latency_ms"], "vLLM's API server: the tokenizer's "
                                            "2 ms batching window, about 1 ms of HTTP and hand-off (estimate)"),
            "frontend.response_latency_ms": (FRONTEND_MS["response_latency_ms"], "vLLM's API server: detokenising "
                                             "and streaming a token, about 1 ms (estimate)")}

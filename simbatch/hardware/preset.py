"""``device.preset: <model>/<gpu>[/tpN][/epN][/fp8]``: the step-time parameters from a model and a GPU card.

A step's time is ``tau0 + beta*B + gamma*P + delta*K + epsilon*A`` (see docs/concepts.md), plus, for a
mixture of experts, the experts the step's tokens touch. Each term is a physical cost divided by
what the GPU does per second, times an efficiency:

- ``tau0``: the weights one GPU streams every step whatever its tokens (attention, dense MLPs, shared
  experts, routers, the output head; not the input embedding, of which a step gathers only its
  tokens' rows) over the bandwidth, at ``weights_bandwidth``; plus a fixed overhead per step and per
  layer (kernel launches, scheduling); plus, under tensor parallelism, the latency of two all-reduces
  per layer (and two collectives per MoE layer under expert parallelism);
- ``beta`` (per decoding sequence) and ``gamma`` (per prefill token): a token's matrix multiplies, 2
  FLOPs per active parameter, at ``decode_flops`` and ``linear_flops`` of the dense peak (a prompt
  token skips the output head: only a prompt's last token is sampled), plus its share of the
  all-reduce and all-to-all traffic over the interconnect; a decode in a sliding-window layer reads
  at most the window's KV, a constant per sequence;
- ``delta`` (per KV token read): what a token caches in every full-attention layer, in the cache's
  dtype (``kv_cache.dtype``), over the bandwidth, at ``kv_bandwidth``; a GPU holds
  ``max(1, kv_heads / tp)`` of the KV heads, or MLA's whole latent;
- ``epsilon`` (per query-key pair of a prefill): 2 (qk + v head dims) FLOPs per query head and
  full-attention layer at ``attention_flops`` of the bf16 peak;
- a MoE's routed experts (``device.moe``): with E experts, k per token and T tokens in a step, the
  step reads ``E (1 - (1 - k/E)^T)`` distinct experts per layer (the expected number no token missed),
  not a fixed "active" share: one at batch 1, every one under load. Under expert parallelism
  (``/epN``: vLLM's ``--enable-expert-parallel`` over N = tp x dp GPUs, dp = N / tp data-parallel
  attention ranks, each an engine of its own) a GPU holds E / N experts and sees the tokens of all
  dp ranks.

The efficiencies are fitted once, to every measured dataset in ``simbatch/data/measured/hardware``, by
``scripts/fit_hardware.py``, which stores them with their fit error in
``simbatch/data/hardware_efficiency.yaml``; the same script compares step-time laws (the five costs
added, or a roofline ``max(compute, memory)``) held out, and ``docs/hardware_fit.md`` reports both.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields, replace
from importlib import resources

import yaml

from simbatch.hardware.cards import GpuCard, ModelCard, shipped

BF16_BYTES, FP8_BYTES = 2, 1
KV_DTYPE_BYTES = {"bf16": 2, "fp8": 1}
"""Bytes per cached element of each ``kv_cache.dtype`` (after ``auto`` is resolved)."""


@dataclass(frozen=True)
class Efficiency:
    """The fitted constants: fractions of a GPU's peak, and fixed overheads."""

    weights_bandwidth: float  # of peak memory bandwidth, streaming the weights (HBM)
    kv_bandwidth: float  # of peak memory bandwidth, reading the KV cache in decode attention
    linear_flops: float  # of the dense peak, prefill matrix multiplies
    decode_flops: float  # of the dense peak, one more decoding sequence's matrix multiplies
    attention_flops: float  # of the bf16 dense peak, prefill attention
    step_overhead_ms: float  # per step, whatever the model
    layer_overhead_us: float  # per layer and step (launches of the attention and norm kernels)
    allreduce_us: float  # latency of one tensor-parallel all-reduce (or expert-parallel collective)
    gddr_weights_bandwidth: float  # of peak memory bandwidth, streaming the weights from GDDR
    # The all-reduce latency of an engine that launches NCCL all-reduces eagerly (no CUDA graphs, no custom
    # all-reduce kernel): Splitwise's 2023 measurements need it; presets model vLLM's kernels (allreduce_us).
    eager_allreduce_us: float

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def seconds(self, W=0.0, STEP=0.0, LAYERS=0.0, ALLREDUCES=0.0, DEC=0.0, LIN=0.0, COMM=0.0, KV=0.0, ATTN=0.0,
                GW=0.0, EAGER_ALLREDUCES=0.0):
        """A time, s, from the work at 100 % (scalars or arrays alike): ``W`` (``GW`` on GDDR) weight-streaming seconds,
        ``STEP``/``LAYERS``/``ALLREDUCES`` (``EAGER_ALLREDUCES``) counts of fixed overheads, ``DEC``/``LIN`` matrix-multiply
        seconds of decoding sequences / prefill tokens, ``COMM`` all-reduce transfer seconds, ``KV``
        KV-reading seconds, ``ATTN`` prefill-attention seconds. The one place the efficiencies apply."""
        return (W / self.weights_bandwidth + GW / self.gddr_weights_bandwidth + STEP * self.step_overhead_ms / 1e3 + LAYERS * self.layer_overhead_us / 1e6
                + ALLREDUCES * self.allreduce_us / 1e6 + EAGER_ALLREDUCES * self.eager_allreduce_us / 1e6 + DEC / self.decode_flops + LIN / self.linear_flops + COMM
                + KV / self.kv_bandwidth + ATTN / self.attention_flops)

    def step_seconds(self, W=0.0, GW=0.0, STEP=0.0, LAYERS=0.0, ALLREDUCES=0.0, EAGER_ALLREDUCES=0.0, DEC=0.0,
                     LIN=0.0, COMM=0.0, KV=0.0, ATTN=0.0):
        """A whole step's time, s, under the decode roofline (simbatch/model/cost.py): the overheads, then
        the larger of the memory traffic (weights, KV) and the decode matmuls, then the prompt's compute."""
        import numpy as np  # arrays of measured rows come here; the command line imports this module without it

        memory = self.seconds(W=W, GW=GW, KV=KV)
        decode = self.seconds(DEC=DEC)
        return self.seconds(STEP=STEP, LAYERS=LAYERS, ALLREDUCES=ALLREDUCES, EAGER_ALLREDUCES=EAGER_ALLREDUCES,
                            COMM=COMM, LIN=LIN, ATTN=ATTN) + np.maximum(memory, decode)


@functools.cache
def fitted() -> tuple[Efficiency, dict]:
    """The shipped efficiencies and the record of their fit (error per dataset, data used)."""
    text = resources.files("simbatch").joinpath("data/hardware_efficiency.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    return Efficiency(**data["efficiency"]), data


@dataclass(frozen=True)
class Deployment:
    """A model on a GPU type: tensor-parallel degree, expert-parallel size (1: none), weight precision,
    and the KV cache's dtype."""

    model: ModelCard
    gpu: GpuCard
    tp: int = 1
    fp8: bool = False
    ep: int = 1
    kv_dtype: str = "bf16"

    @property
    def name(self) -> str:
        return f"{self.model.name}/{self.gpu.name}" + (f"/tp{self.tp}" if self.tp > 1 else "") + \
            (f"/ep{self.ep}" if self.ep > 1 else "") + ("/fp8" if self.fp8 else "")

    @property
    def dp(self) -> int:
        """Data-parallel attention ranks: the expert-parallel GPUs over the tensor-parallel ones."""
        return self.ep // self.tp if self.ep > 1 else 1

    @property
    def flops(self) -> float:
        """Dense peak of the weights' precision, FLOP/s."""
        return (self.gpu.fp8_tflops if self.fp8 else self.gpu.bf16_tflops) * 1e12

    @property
    def _bytes(self) -> int:
        return FP8_BYTES if self.fp8 else BF16_BYTES

    @property
    def expert_bytes(self) -> float:
        """Bytes of one routed expert in one layer, whole (the checkpoint's expert precision)."""
        m = self.model
        return m.expert_params() * (m.expert_bits / 8 if m.expert_bits else self._bytes)

    @property
    def local_experts(self) -> int:
        """Routed experts per layer one GPU holds: a 1/tp slice of every one without expert parallelism,
        E / ep whole ones with it."""
        return self.model.num_experts if self.ep == 1 else self.model.num_experts // self.ep

    @property
    def local_expert_bytes(self) -> float:
        """What one GPU holds of one of its experts in one layer, bytes (a slice, or the whole expert)."""
        return self.expert_bytes / self.tp if self.ep == 1 else self.expert_bytes

    def dense_weight_bytes(self, streamed: bool) -> float:
        """The weights one GPU holds outside the routed experts, bytes; ``streamed``: what a step reads of
        them (the input embedding left out). The embedding and the output head stay bf16 under fp8."""
        m = self.model
        head = m.vocab_size * m.hidden_size
        embedding = 0.0 if m.tie_word_embeddings else head
        rest = m.params - m.expert_weights - head - embedding
        held = rest * self._bytes + (head + (0.0 if streamed else embedding)) * BF16_BYTES
        return held / self.tp

    @property
    def weights_bytes_per_gpu(self) -> float:
        """The weights one GPU holds (all its experts), bytes."""
        experts = self.model.moe_layers * self.local_experts * self.local_expert_bytes if self.model.is_moe else 0.0
        return self.dense_weight_bytes(streamed=False) + experts

    @property
    def kv_bytes_per_token(self) -> float:
        """One token's cache in every layer, on one GPU, bytes (vLLM sizes sliding-window layers like the
        others): keys and values of ``max(1, kv_heads / tp)`` heads, or MLA's latent, whole on every GPU."""
        return self.model.layers * self._kv_bytes_per_layer

    @property
    def _kv_bytes_per_layer(self) -> float:
        m = self.model
        split = 1 if m.is_mla else max(1.0, m.kv_heads / self.tp) / m.kv_heads
        return m.kv_elements_per_token_layer * split * KV_DTYPE_BYTES[self.kv_dtype]

    @property
    def allreduce_bytes_per_token(self) -> float:
        """What one token's collectives move through one GPU's link: two all-reduces per layer under
        tensor parallelism (ring: 2 (tp-1)/tp of the hidden state each); under expert parallelism a MoE
        layer's all-reduce is an all-gather and a reduce-scatter over all ep GPUs instead, of the
        tokens of every data-parallel rank."""
        m, h = self.model, self.model.hidden_size * BF16_BYTES
        per_layer = 2 * (self.tp - 1) / self.tp * h
        total = 2 * m.layers * per_layer
        if self.ep > 1:
            total += m.moe_layers * (2 * (self.ep - 1) / self.ep * h * self.dp - per_layer)
        return total

    def _collectives(self) -> int:
        m = self.model
        count = 2 * m.layers if self.tp > 1 else 0
        if self.ep > 1 and self.dp > 1:  # the MoE layers' all-reduce becomes two collectives
            count += m.moe_layers * (2 if self.tp == 1 else 1)
        return count

    def unit_seconds(self) -> dict[str, float]:
        """The work at 100 % efficiency, on one GPU: per step, ``W`` (the weights streamed whatever the
        tokens / bandwidth, s), ``LAYERS`` and ``ALLREDUCES`` (how many); ``DEC`` / ``LIN`` (a decoding
        sequence's / a prompt token's matrix multiplies / peak, s), ``COMM`` (a token's collective bytes
        / interconnect, s), ``SEQ_KV`` (a decode's sliding-window reads, s) and ``TOK_ATTN`` (a prompt
        token's sliding-window attention, s); ``KV`` (one KV token read, s); ``ATTN`` (one prefill
        query-key pair, s, at the bf16 peak); ``EXPERT`` (one local expert streamed in every MoE layer, s)."""
        m, bandwidth = self.model, self.gpu.memory_bandwidth_gb_s * 1e9
        head = m.vocab_size * m.hidden_size
        embedding = 0.0 if m.tie_word_embeddings else head
        # A token runs through its active parameters but gathers its embedding row; a prompt token also
        # skips the output head (only the last is sampled).
        decode_params = m.active_params - embedding
        pair_flops = 2 * (m.head_dim + m.v_dim) * m.q_heads / self.tp
        window = m.sliding_window or 0
        return {"W": self.dense_weight_bytes(streamed=True) / bandwidth, "LAYERS": m.layers,
                "ALLREDUCES": self._collectives(),
                "DEC": 2 * decode_params / self.tp / self.flops, "LIN": 2 * (decode_params - head) / self.tp / self.flops,
                "COMM": self.allreduce_bytes_per_token / (self.gpu.interconnect_gb_s * 1e9),
                "KV": m.full_attention_layers * self._kv_bytes_per_layer / bandwidth,
                "SEQ_KV": m.sliding_layers * window * self._kv_bytes_per_layer / bandwidth,
                "ATTN": m.full_attention_layers * pair_flops / (self.gpu.bf16_tflops * 1e12),
                "TOK_ATTN": m.sliding_layers * window * pair_flops / (self.gpu.bf16_tflops * 1e12),
                "EXPERT": m.moe_layers * self.local_expert_bytes / bandwidth if m.is_moe else 0.0}

    def device_ms(self, eff: Efficiency) -> dict[str, float]:
        """The ``device`` keys this deployment gets: tau0_ms (the overheads), weights_ms (the weights'
        stream, under the decode roofline), beta_ms, prefill_ms_per_token, ..., and for a MoE ``moe`` (a dict
        of :class:`~simbatch.config.MoE`'s keys). ``eff`` gives way to what the GPU's card measured on it
        (``measured_efficiency``: the fractions vLLM's kernels reach on that GPU), a bf16 measurement of the
        matrix multiplies to bf16 weights only, and of the KV reads to a bf16 cache only."""
        measured = self.gpu.measured_efficiency.given()
        if self.fp8:
            measured.pop("linear_flops", None)
        if self.kv_dtype != "bf16":
            measured.pop("kv_bandwidth", None)
        eff = replace(eff, **measured)
        u = self.unit_seconds()
        weights = "GW" if self.gpu.memory_kind == "gddr" else "W"
        out = {"tau0_ms": 1e3 * eff.seconds(STEP=1, LAYERS=u["LAYERS"], ALLREDUCES=u["ALLREDUCES"]),
               "weights_ms": 1e3 * eff.seconds(**{weights: u["W"]}),
               "beta_ms": 1e3 * eff.seconds(DEC=u["DEC"], COMM=u["COMM"], KV=u["SEQ_KV"]),
               "prefill_ms_per_token": 1e3 * eff.seconds(LIN=u["LIN"], COMM=u["COMM"], ATTN=u["TOK_ATTN"]),
               "kv_read_ms_per_1k_tokens": 1e6 * eff.seconds(KV=u["KV"]),
               "prefill_attention_ms_per_1m_pairs": 1e9 * eff.seconds(ATTN=u["ATTN"])}
        if self.model.is_moe:
            out["moe"] = {"num_experts": self.model.num_experts, "experts_per_token": self.model.experts_per_token,
                          "local_experts": self.local_experts,
                          "expert_read_ms": 1e3 * eff.seconds(**{weights: u["EXPERT"]}),
                          "data_parallel_size": self.dp}
        return out


_PART = re.compile(r"(tp|ep)([1-9][0-9]*)")


def parse(preset: str, gpu_cards: dict[str, GpuCard] | None = None,
          model_cards: dict[str, ModelCard] | None = None, kv_dtype: str = "bf16") -> Deployment:
    """``"llama-3.1-8b/H100-SXM/tp2/fp8"`` -> a :class:`Deployment`, or ValueError saying what to write.

    Names match the cards (and the GPUs' aliases) case-insensitively; ``gpu_cards``/``model_cards`` add
    to the shipped ones. ``kv_dtype`` is the cache's, ``bf16`` or ``fp8``.
    """
    gpus, models = shipped()
    gpus, models = {**gpus, **(gpu_cards or {})}, {**models, **(model_cards or {})}
    parts = preset.strip().split("/")
    if len(parts) < 2:
        raise ValueError(f"preset {preset!r} is not <model>/<gpu>[/tpN][/epN][/fp8], e.g. llama-3.1-8b/H100-SXM/tp2; "
                         "`simbatch presets` lists the names")
    model = _lookup(parts[0], models, "model")
    gpu = _lookup(parts[1], gpus, "GPU")
    sizes, fp8 = {}, False
    for part in parts[2:]:
        if (m := _PART.fullmatch(part.lower())) and m.group(1) not in sizes:
            sizes[m.group(1)] = int(m.group(2))
        elif part.lower() == "fp8" and not fp8:
            fp8 = True
        else:
            raise ValueError(f"preset {preset!r}: {part!r} is neither tpN (tensor-parallel GPUs, e.g. tp2), epN "
                             "(experts over N GPUs) nor fp8, or is given twice")
    tp, ep = sizes.get("tp", 1), sizes.get("ep", 1)
    if fp8 and gpu.fp8_tflops is None:
        raise ValueError(f"preset {preset!r}: {gpu.name} has no fp8 tensor cores; remove /fp8")
    if tp > 1 and model.q_heads % tp:
        raise ValueError(f"preset {preset!r}: {model.name}'s {model.q_heads} attention heads do not split over "
                         f"tp{tp}; use a divisor of {model.q_heads}")
    if ep > 1:
        if not model.is_moe:
            raise ValueError(f"preset {preset!r}: {model.name} has no experts to spread; remove /ep{ep}")
        if ep % tp or model.num_experts % ep:
            raise ValueError(f"preset {preset!r}: /ep{ep} must be a multiple of tp{tp} (ep = tp x data-parallel "
                             f"ranks) and divide {model.name}'s {model.num_experts} experts")
    if kv_dtype not in KV_DTYPE_BYTES:
        raise ValueError(f"kv_cache.dtype {kv_dtype!r}: bf16 or fp8")
    return Deployment(model, gpu, tp, fp8, ep, kv_dtype)


def _lookup(name: str, cards: dict, what: str):
    """A card by its name or one of its aliases, case-insensitively; a name wins over an alias."""
    by_lower = {alias.lower(): v for v in cards.values() for alias in getattr(v, "aliases", ())}
    by_lower |= {k.lower(): v for k, v in cards.items()}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(cards))} "
                     f"(or add a card: device.{'model' if what == 'model' else 'gpu'}_card)")

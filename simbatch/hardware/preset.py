"""``device.preset: <model>/<gpu>[/tpN][/fp8]``: the step-time parameters from a model and a GPU card.

A step's time is ``tau0 + beta*B + gamma*P + delta*K + epsilon*A`` (see docs/concepts.md). Each term
is a physical cost divided by what the GPU does per second, times an efficiency:

- ``tau0``: the weights one GPU holds stream from memory once per step (bytes / bandwidth /
  ``weights_bandwidth``; for a MoE only the active experts' weights, which underestimates large
  batches, whose tokens between them read every expert), plus a fixed overhead per step and per layer (kernel launches, scheduling),
  plus, under tensor parallelism, the latency of two all-reduces per layer;
- ``beta`` (per decoding sequence) and ``gamma`` (per prefill token): a token's matrix multiplies,
  2 FLOPs per active parameter, at ``decode_flops`` and ``linear_flops`` of the dense peak, plus its
  share of the all-reduce traffic (2 per layer of ``hidden_size`` values) over the interconnect;
- ``delta`` (per KV token read): the token's keys and values in every layer (bf16) / bandwidth /
  ``kv_bandwidth``; a GPU holds ``max(1, kv_heads / tp)`` of the KV heads;
- ``epsilon`` (per query-key pair of a prefill): 4 FLOPs per head dimension and query head per layer
  (QK^T and PV) at ``attention_flops`` of the bf16 peak.

The efficiencies are fitted once, to every measured dataset in ``simbatch/data/measured/hardware``, by
``scripts/fit_hardware.py``, which stores them with their fit error in
``simbatch/data/hardware_efficiency.yaml``. The fit is against TensorRT-LLM and kernel measurements:
a vLLM deployment has more CPU overhead per step than they show (docs/hardware.md).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields
from importlib import resources

import yaml

from simbatch.hardware.cards import GpuCard, ModelCard, shipped

BF16_BYTES, FP8_BYTES = 2, 1
KV_BYTES = BF16_BYTES  # the KV cache stays bf16 in every preset (vLLM's default kv_cache_dtype "auto")


@dataclass(frozen=True)
class Efficiency:
    """The fitted constants: fractions of a GPU's peak, and fixed overheads."""

    weights_bandwidth: float  # of peak memory bandwidth, streaming the weights
    kv_bandwidth: float  # of peak memory bandwidth, reading the KV cache in decode attention
    linear_flops: float  # of the dense peak, prefill matrix multiplies
    decode_flops: float  # of the dense peak, one more decoding sequence's matrix multiplies
    attention_flops: float  # of the bf16 dense peak, prefill attention
    step_overhead_ms: float  # per step, whatever the model
    layer_overhead_us: float  # per layer and step (launches of the attention and norm kernels)
    allreduce_us: float  # latency of one tensor-parallel all-reduce

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def seconds(self, W=0.0, STEP=0.0, LAYERS=0.0, ALLREDUCES=0.0, DEC=0.0, LIN=0.0, COMM=0.0, KV=0.0, ATTN=0.0):
        """A time, s, from the work at 100 % (scalars or arrays alike): ``W`` weight-streaming seconds,
        ``STEP``/``LAYERS``/``ALLREDUCES`` counts of fixed overheads, ``DEC``/``LIN`` matrix-multiply
        seconds of decoding sequences / prefill tokens, ``COMM`` all-reduce transfer seconds, ``KV``
        KV-reading seconds, ``ATTN`` prefill-attention seconds. The one place the efficiencies apply."""
        return (W / self.weights_bandwidth + STEP * self.step_overhead_ms / 1e3 + LAYERS * self.layer_overhead_us / 1e6
                + ALLREDUCES * self.allreduce_us / 1e6 + DEC / self.decode_flops + LIN / self.linear_flops + COMM
                + KV / self.kv_bandwidth + ATTN / self.attention_flops)


@functools.cache
def fitted() -> tuple[Efficiency, dict]:
    """The shipped efficiencies and the record of their fit (error per dataset, data used)."""
    text = resources.files("simbatch").joinpath("data/hardware_efficiency.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    return Efficiency(**data["efficiency"]), data


@dataclass(frozen=True)
class Deployment:
    """A model on a GPU type, with a tensor-parallel degree and a weight precision."""

    model: ModelCard
    gpu: GpuCard
    tp: int = 1
    fp8: bool = False

    @property
    def name(self) -> str:
        return f"{self.model.name}/{self.gpu.name}" + (f"/tp{self.tp}" if self.tp > 1 else "") + \
            ("/fp8" if self.fp8 else "")

    @property
    def flops(self) -> float:
        """Dense peak of the weights' precision, FLOP/s."""
        return (self.gpu.fp8_tflops if self.fp8 else self.gpu.bf16_tflops) * 1e12

    @property
    def weights_bytes_per_gpu(self) -> float:
        """The weights one GPU holds (every expert of a MoE), bytes."""
        return self.model.params * (FP8_BYTES if self.fp8 else BF16_BYTES) / self.tp

    @property
    def streamed_bytes_per_gpu(self) -> float:
        """The weights one GPU reads per step, bytes: a MoE's active ones (those of the experts chosen)."""
        return self.model.active_params * (FP8_BYTES if self.fp8 else BF16_BYTES) / self.tp

    @property
    def kv_bytes_per_token(self) -> float:
        """One token's keys and values in every layer, on one GPU, bytes."""
        heads = max(1.0, self.model.kv_heads / self.tp)
        return 2 * self.model.layers * heads * self.model.head_dim * KV_BYTES

    @property
    def allreduce_bytes_per_token(self) -> float:
        """What one token's two all-reduces per layer move through one GPU's link (ring: 2 (tp-1)/tp)."""
        if self.tp == 1:
            return 0.0
        return 2 * self.model.layers * self.model.hidden_size * BF16_BYTES * 2 * (self.tp - 1) / self.tp

    def unit_seconds(self) -> dict[str, float]:
        """The work at 100 % efficiency, on one GPU: per step, ``W`` (the streamed weights / bandwidth, s),
        ``LAYERS`` and ``ALLREDUCES`` (how many); ``TOKEN`` (one token's matrix multiplies / peak, s) and
        ``COMM`` (its all-reduce bytes / interconnect, s); ``KV`` (one KV token read, s); ``ATTN`` (one
        prefill query-key pair, s, at the bf16 peak)."""
        m, bandwidth = self.model, self.gpu.memory_bandwidth_gb_s * 1e9
        return {"W": self.streamed_bytes_per_gpu / bandwidth, "LAYERS": m.layers,
                "ALLREDUCES": 2 * m.layers if self.tp > 1 else 0, "TOKEN": 2 * m.active_params / self.tp / self.flops,
                "COMM": self.allreduce_bytes_per_token / (self.gpu.interconnect_gb_s * 1e9),
                "KV": self.kv_bytes_per_token / bandwidth,
                "ATTN": 4 * m.layers * m.q_heads / self.tp * m.head_dim / (self.gpu.bf16_tflops * 1e12)}

    def device_ms(self, eff: Efficiency) -> dict[str, float]:
        """The ``device`` keys this deployment gets: tau0_ms, beta_ms, prefill_ms_per_token, ..."""
        u = self.unit_seconds()
        return {"tau0_ms": 1e3 * eff.seconds(W=u["W"], STEP=1, LAYERS=u["LAYERS"], ALLREDUCES=u["ALLREDUCES"]),
                "beta_ms": 1e3 * eff.seconds(DEC=u["TOKEN"], COMM=u["COMM"]),
                "prefill_ms_per_token": 1e3 * eff.seconds(LIN=u["TOKEN"], COMM=u["COMM"]),
                "kv_read_ms_per_1k_tokens": 1e6 * eff.seconds(KV=u["KV"]),
                "prefill_attention_ms_per_1m_pairs": 1e9 * eff.seconds(ATTN=u["ATTN"])}


_TP = re.compile(r"tp([1-9][0-9]*)")


def parse(preset: str, gpu_cards: dict[str, GpuCard] | None = None,
          model_cards: dict[str, ModelCard] | None = None) -> Deployment:
    """``"llama-3.1-8b/H100-SXM/tp2/fp8"`` -> a :class:`Deployment`, or ValueError saying what to write.

    Names match the cards case-insensitively; ``gpu_cards``/``model_cards`` add to the shipped ones.
    """
    gpus, models = shipped()
    gpus, models = {**gpus, **(gpu_cards or {})}, {**models, **(model_cards or {})}
    parts = preset.strip().split("/")
    if len(parts) < 2:
        raise ValueError(f"preset {preset!r} is not <model>/<gpu>[/tpN][/fp8], e.g. llama-3.1-8b/H100-SXM/tp2; "
                         "`simbatch presets` lists the names")
    model = _lookup(parts[0], models, "model")
    gpu = _lookup(parts[1], gpus, "GPU")
    tp, fp8 = 1, False
    for part in parts[2:]:
        if (m := _TP.fullmatch(part.lower())) and tp == 1:
            tp = int(m.group(1))
        elif part.lower() == "fp8" and not fp8:
            fp8 = True
        else:
            raise ValueError(f"preset {preset!r}: {part!r} is neither tpN (tensor-parallel GPUs, e.g. tp2) nor fp8, "
                             "or is given twice")
    if fp8 and gpu.fp8_tflops is None:
        raise ValueError(f"preset {preset!r}: {gpu.name} has no fp8 tensor cores; remove /fp8")
    if tp > 1 and model.q_heads % tp:
        raise ValueError(f"preset {preset!r}: {model.name}'s {model.q_heads} attention heads do not split over "
                         f"tp{tp}; use a divisor of {model.q_heads}")
    return Deployment(model, gpu, tp, fp8)


def _lookup(name: str, cards: dict, what: str):
    """A card by its name or one of its aliases, case-insensitively; a name wins over an alias."""
    by_lower = {alias.lower(): v for v in cards.values() for alias in getattr(v, "aliases", ())}
    by_lower |= {k.lower(): v for k, v in cards.items()}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(cards))} "
                     f"(or add a card: device.{'model' if what == 'model' else 'gpu'}_card)")

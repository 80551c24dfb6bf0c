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

The efficiencies are fitted once, to every measured dataset in ``../shared/data/hardware``, by
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
        return self.model.params_b * 1e9 * (FP8_BYTES if self.fp8 else BF16_BYTES) / self.tp

    @property
    def streamed_bytes_per_gpu(self) -> float:
        """The weights one GPU reads per step, bytes: a MoE's active ones (those of the experts chosen)."""
        return self.model.active_b * 1e9 * (FP8_BYTES if self.fp8 else BF16_BYTES) / self.tp

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

    def device_ms(self, eff: Efficiency) -> dict[str, float]:
        """The ``device`` keys this deployment gets: tau0_ms, beta_ms, prefill_ms_per_token, ..."""
        bandwidth = self.gpu.memory_bandwidth_gb_s * 1e9
        token_flops = 2 * self.model.active_b * 1e9 / self.tp
        comm_s = self.allreduce_bytes_per_token / (self.gpu.interconnect_gb_s * 1e9)
        allreduce_ms = 0.0 if self.tp == 1 else 2 * self.model.layers * eff.allreduce_us / 1e3
        pair_flops = 4 * self.model.layers * self.model.q_heads / self.tp * self.model.head_dim
        return {
            "tau0_ms": 1e3 * self.streamed_bytes_per_gpu / (bandwidth * eff.weights_bandwidth)
            + eff.step_overhead_ms + self.model.layers * eff.layer_overhead_us / 1e3 + allreduce_ms,
            "beta_ms": 1e3 * (token_flops / (self.flops * eff.decode_flops) + comm_s),
            "prefill_ms_per_token": 1e3 * (token_flops / (self.flops * eff.linear_flops) + comm_s),
            "kv_read_ms_per_1k_tokens": 1e6 * self.kv_bytes_per_token / (bandwidth * eff.kv_bandwidth),
            "prefill_attention_ms_per_1m_pairs":
                1e9 * pair_flops / (self.gpu.bf16_tflops * 1e12 * eff.attention_flops),
        }


PRESET_KEYS = ("tau0_ms", "beta_ms", "prefill_ms_per_token", "kv_read_ms_per_1k_tokens",
               "prefill_attention_ms_per_1m_pairs")
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
    by_lower = {k.lower(): v for k, v in cards.items()}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(cards))} "
                     f"(or add a card: device.{'model' if what == 'model' else 'gpu'}_card)")

"""Multi-LoRA: many adapters on one base model, a few on the GPU at once, loaded when a request needs one.

As vLLM serves them (``--enable-lora``). Each request names an adapter (``workload.adapters``; -1 the base
model). The GPU has ``max_loras`` adapter slots and host memory ``max_cpu_loras`` (the GPU's included);
both are LRU caches of adapters.

The batching rule (vLLM V1's ``Scheduler.schedule``): a step uses at most ``max_loras`` distinct adapters.
A waiting request whose adapter is not among those of the step while ``max_loras`` are already there is
skipped, not waited for: later requests may be admitted past it, whatever the policy. vLLM counts the
adapters of the running requests scheduled in the step; here those of the whole running set (the same
but in a step where a running request stalls, short of memory), so that every running request's
adapter stays on the GPU and a step never needs one it does not hold.

Loads. A request admitted with an adapter the GPU does not hold loads it into the slot of the least
recently used adapter no running request uses (there is one: the rule above). The load moves the
adapter's weights over the host link, and first from storage if host memory does not hold it either.
vLLM activates a step's adapters before its forward pass, so the load adds its whole time to the step
that admits the request: ``lora_load_ms`` is what a request's own adapter load added to its first step
(and so to its TTFT, and to the TTFT of every request in that step).

An adapter's size (:func:`adapter_bytes`): matrices A (d_in x r) and B (r x d_out) for each target
module of each layer, so ``r x sum over modules of (d_in + d_out) x layers x 2`` bytes in bf16, each GPU
holding 1/tp of it. Llama 3.1 8B at rank 16 on all seven linear modules: 16 x 81,920 x 32 x 2 = 83.9 MB,
3.4 ms over a 25 GB/s PCIe Gen4 link.

Closed forms. Under independent references with popularity p_k, an LRU cache of C adapters hits
with probability ``sum_k p_k (1 - exp(-p_k T))``, T the root of ``sum_k (1 - exp(-p_k T)) = C`` (Che's
approximation, :func:`lru_hit_rate`); uniform over N, exactly C / N. With requests served one at a time
a load happens at each miss (tests/validation/test_lora.py).

Loads happen only at admissions, and a step that admits never repeats, so the lockstep twin's runs are
left alone (``repeatable``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from simbatch.config import Scenario
from simbatch.config.cards import ModelCard
from simbatch.features import Feature, register
from simbatch.features import host_tier as _registered_before  # noqa: F401  (registration order is fixed)

if TYPE_CHECKING:
    import pandas as pd

    from simbatch.model.request import Request
    from simbatch.model.step import StepPlan

BF16_BYTES = 2


def module_dims(model: ModelCard) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each linear module LoRA may target, from the model card."""
    h, q, kv, m = model.hidden_size, model.q_heads * model.head_dim, model.kv_heads * model.head_dim, \
        model.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, m), "up_proj": (h, m), "down_proj": (m, h)}


def lora_bytes(model: ModelCard, rank: int, modules: list[str], tp: int = 1) -> float:
    """One adapter's weights on one GPU, bytes: rank x sum over modules of (d_in + d_out) x layers x 2 (bf16) / tp."""
    dims = module_dims(model)
    return rank * sum(sum(dims[name]) for name in modules) * model.layers * BF16_BYTES / tp


def lru_hit_rate(p: np.ndarray, slots: int) -> float:
    """Hit probability of an LRU cache of ``slots`` items under independent references with popularity
    ``p`` (summing to 1): exactly slots / N for uniform p, else Che's approximation."""
    p = np.asarray(p, dtype=np.float64)
    n = len(p)
    if slots >= n:
        return 1.0
    if np.allclose(p, p[0]):
        return slots / n
    from scipy.optimize import brentq  # only a closed form needs it: a run never imports scipy

    t = brentq(lambda t: np.sum(-np.expm1(-p * t)) - slots, 0.0, 1e3 * n / p.min())
    return float(np.sum(p * -np.expm1(-p * t)))


class _LRU(dict):
    """Keys in recency order: the first is the least recently used."""

    def use(self, key: int) -> None:
        del self[key]
        self[key] = None


@register
class MultiLora(Feature):
    """``lora``: adapter slots on the GPU and the host, the max_loras rule, and loads (module docstring)."""

    name = "lora"
    description = "Many LoRA adapters on one base model: max_loras per step, LRU slots, loads over the host link."
    switch = "lora"
    columns = (("lora_id", "int32"), ("lora_loads", "int32"), ("lora_storage_loads", "int32"),
               ("lora_load_ms", "float64"))

    def __init__(self, scenario: Scenario):
        super().__init__(scenario)
        cfg = scenario.lora
        self.max_loras, self.cpu_slots = cfg.max_loras, cfg.cpu_slots
        size = cfg.adapter_bytes  # given, or the preset's model card's (resolution)
        self.link_ms = size / (cfg.host_link_gb_s * 1e9) * 1e3
        self.storage_ms = size / (cfg.storage_gb_s * 1e9) * 1e3
        self.active: dict[int, int] = {}  # adapter -> running requests naming it
        self.gpu, self.cpu = _LRU(), _LRU()
        self._pending_ms = 0.0  # loads of the step being planned
        self._plan: StepPlan | None = None
        self._ms = 0.0

    @staticmethod
    def enabled(scenario: Scenario) -> bool:
        return scenario.lora is not None

    def admits(self, req: Request) -> bool:
        """vLLM's rule: at most ``max_loras`` distinct adapters in a step."""
        a = req.lora_id
        return a < 0 or a in self.active or len(self.active) < self.max_loras

    def admitted(self, req: Request) -> None:
        a = req.lora_id
        if a < 0:
            return
        self.active[a] = self.active.get(a, 0) + 1
        gpu, cpu = self.gpu, self.cpu
        if a in gpu:
            gpu.use(a)
            cpu.use(a)
            return
        ms = self.link_ms
        if len(gpu) >= self.max_loras:  # a slot from the least recent adapter no running request uses
            del gpu[next(k for k in gpu if k not in self.active)]
        gpu[a] = None
        if a in cpu:
            cpu.use(a)
        else:
            ms += self.storage_ms
            req.lora_storage_loads += 1
            if len(cpu) >= self.cpu_slots:  # host memory holds the GPU's adapters too
                del cpu[next(k for k in cpu if k not in gpu)]
            cpu[a] = None
        req.lora_loads += 1
        req.lora_load_ms += ms
        self._pending_ms += ms

    def left(self, req: Request) -> None:
        a = req.lora_id
        if a >= 0:
            n = self.active[a] - 1
            if n:
                self.active[a] = n
            else:
                del self.active[a]

    def step_ms(self, plan: StepPlan) -> float:
        """The adapters the step's admissions loaded, before its forward pass (the same answer if asked again)."""
        if plan is not self._plan:
            self._plan, self._ms, self._pending_ms = plan, self._pending_ms, 0.0
        return self._ms

    @staticmethod
    def summary(requests: pd.DataFrame) -> dict[str, float]:
        """Adapter loads (GPU loads, and those of them read from storage first), the share of admitted
        adapter requests whose admission loaded one, and the mean time a load added to a request's TTFT."""
        admitted = requests["first_scheduled_s"].notna() & (requests["lora_id"] >= 0)
        loads = int(requests["lora_loads"].sum())
        named = int(admitted.sum())
        loaded = requests["lora_loads"].to_numpy() > 0
        return {"lora_loads": loads, "lora_storage_loads": int(requests["lora_storage_loads"].sum()),
                "lora_load_rate": loads / named if named else math.nan,
                "lora_load_ms_mean": float(requests["lora_load_ms"].to_numpy()[loaded].mean()) if loaded.any()
                else 0.0}

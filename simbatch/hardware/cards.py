"""Model and GPU cards: the public numbers a preset is derived from.

The shipped cards are ``simbatch/data/hardware_cards.yaml`` (each with its source), loaded here; a
scenario can bring its own inline (``device.gpu_card``, ``device.model_card``), validated by the same
models, whose schema is the scenario's (:mod:`simbatch.config.cards`).
"""

from __future__ import annotations

import functools
from importlib import resources

import yaml

from simbatch.config.cards import GpuCard, ModelCard

__all__ = ["GpuCard", "ModelCard", "shipped"]


@functools.cache
def shipped() -> tuple[dict[str, GpuCard], dict[str, ModelCard]]:
    """The cards shipped with simbatch: (GPUs by name, models by name)."""
    text = resources.files("simbatch").joinpath("data/hardware_cards.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    gpus = {name: GpuCard(name=name, **card) for name, card in data["gpus"].items()}
    models = {name: ModelCard(name=name, **card) for name, card in data["models"].items()}
    return gpus, models

"""Serving features: the registry of :class:`simbatch.features.Feature` classes.

Unlike the other registries this one holds no declarations of its own: a feature is a class with
hooks (:mod:`simbatch.features`, where each shipped one registers itself), and its declarations are
class attributes (``name``, ``description``, ``repeatable``, ``columns``, ``switch``, ``options``).
The registry sits here, below the schema, so that the scenario's ``features`` section can validate a
feature of your own by name and options (``Feature.options``, a pydantic model) without importing
the engine: the module that defines the feature registers it on import, before a scenario names it.
The shipped features have settings of their own, with vLLM's names (``device.speculative``), which
their ``switch`` names.
"""

from __future__ import annotations

from simbatch.registry.base import Registry

FEATURES: Registry = Registry("serving feature", "features")

"""simbatch: a discrete-event simulator of LLM inference batching and scheduling.

The names below are imported on first use (PEP 562), so ``import simbatch`` itself costs nothing:
the command line then imports its machinery where an interruption can still be reported cleanly.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_HOME = {"Scenario": "simbatch.config", "ScenarioError": "simbatch.config.problems", "load_scenario": "simbatch.inputs.loading",
         "Result": "simbatch.simulation", "simulate": "simbatch.simulation", "Observer": "simbatch.observe.observers",
         "resolve": "simbatch.inputs.resolve"}

__all__ = ["Observer", "Result", "Scenario", "ScenarioError", "load_scenario", "resolve", "simulate", "__version__"]


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'simbatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value

"""simbatch: a discrete-event simulator of LLM inference batching and scheduling."""

from simbatch.config import Scenario
from simbatch.loading import ScenarioError, load_scenario

__version__ = "0.1.0"

__all__ = ["Scenario", "ScenarioError", "load_scenario", "__version__"]

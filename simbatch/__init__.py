"""simbatch: a discrete-event simulator of LLM inference batching and scheduling."""

from simbatch.config import Scenario
from simbatch.loading import ScenarioError, load_scenario
from simbatch.simulation import Result, simulate

__version__ = "0.1.0"

__all__ = ["Result", "Scenario", "ScenarioError", "load_scenario", "simulate", "__version__"]

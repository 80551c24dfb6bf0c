"""A result folder's ``scenario.yaml``: the scenario as it ran, as a file that reproduces the run."""

from __future__ import annotations

import json

import yaml

from simbatch import __version__
from simbatch.config import Scenario


def effective_scenario(scenario: Scenario) -> dict:
    """The scenario as run, as plain data: every default spelled out, data paths absolute.

    Loaded from anywhere, it is the same scenario: nothing depends on the folder it was read from,
    nor on defaults that a later simbatch might change.
    """
    data = scenario.model_dump(mode="python")
    if scenario.workload.trace is not None:
        # A trace gives arrivals and lengths; spelling out their unused defaults would make the file
        # invalid (the loader refuses settings a trace ignores).
        for key in ("arrival", "prompt_tokens", "output_tokens"):
            data["workload"].pop(key)
    arrival = scenario.workload.arrival
    if arrival is not None and arrival.rate_curve is not None:
        data["workload"]["arrival"].pop("rate")  # the curve gives the rate (the loader refuses both)
    for key, path in scenario.data_files().items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[last] = str(scenario.resolve(path).resolve())
    return json.loads(json.dumps(data, default=str), parse_constant=float)


def scenario_yaml(scenario: Scenario) -> str:
    """``scenario.yaml`` of a result folder: the effective scenario, with a header saying what it is."""
    header = (f"# The effective scenario of this run (simbatch {__version__}): --set overrides applied, defaults\n"
              "# spelled out, data paths absolute. `simbatch run` on this file reproduces summary.json.\n")
    return header + yaml.safe_dump(effective_scenario(scenario), sort_keys=False, allow_unicode=True)

"""Fit the lognormal length shapes of ``simbatch/workload/shapes.py`` to the public Azure LLM inference traces.

The traces (Azure/AzurePublicDataset, AzureLLMInferenceTrace_{conv,code}.csv, 2023, CC-BY 4.0) are
not shipped with simbatch; download them and run, from the repository root,

    .venv/bin/python scripts/fit_length_shapes.py DIR_WITH_THE_TWO_CSV_FILES

It prints, per trace and column, the parameters of :class:`simbatch.config.LogNormal`: ``mean`` (the
mean length implied by the fit, exp(mu + sigma^2 / 2)), ``sigma`` (the standard deviation of
log-length, the maximum-likelihood estimate) and ``max`` (the longest length observed), with the
trace's own mean and median for comparison. Paste them into ``simbatch/workload/shapes.py``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

TRACES = {"azure-conv": "AzureLLMInferenceTrace_conv.csv", "azure-code": "AzureLLMInferenceTrace_code.csv"}
COLUMNS = {"prompt": "ContextTokens", "output": "GeneratedTokens"}


def fit(lengths: np.ndarray) -> dict[str, float]:
    """Maximum-likelihood lognormal: mu, sigma of log-length; reported as (mean, sigma, max)."""
    logs = np.log(lengths.astype(float))
    mu, sigma = float(logs.mean()), float(logs.std())
    return {"mean": round(math.exp(mu + sigma**2 / 2), 1), "sigma": round(sigma, 3), "max": int(lengths.max()),
            "observed_mean": round(float(lengths.mean()), 1), "observed_median": float(np.median(lengths))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="Folder holding the two Azure trace CSV files.")
    folder = parser.parse_args(argv).folder
    for shape, name in TRACES.items():
        frame = pd.read_csv(folder / name)
        for part, column in COLUMNS.items():
            lengths = frame[column].to_numpy()
            print(f"{shape} {part}: {fit(lengths[lengths >= 1])}  ({len(lengths):,} rows)")


if __name__ == "__main__":
    main()

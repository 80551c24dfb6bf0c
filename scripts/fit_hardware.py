"""Fit the preset efficiencies (simbatch/hardware/preset.py) once, to the measured data beside the repository.

Reads every dataset of ``simbatch/data/measured/hardware`` (see simbatch/hardware/measured.py), finds the
:class:`~simbatch.hardware.preset.Efficiency` constants minimising the squared log-error of the
predicted times, each dataset and kind of measurement weighted alike (so 2,000 TensorRT-LLM rows
do not drown 30 kernel rows), and writes them with their fit error to
``simbatch/data/hardware_efficiency.yaml``. Run from the repository root:

    .venv/bin/python scripts/fit_hardware.py

then regenerate the report, ``.venv/bin/python scripts/gen_hardware_fit.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from simbatch.hardware import measured
from simbatch.hardware.fit_report import errors_by_dataset
from simbatch.hardware.preset import Efficiency

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "simbatch" / "data" / "hardware_efficiency.yaml"
START = Efficiency(weights_bandwidth=0.8, kv_bandwidth=0.8, linear_flops=0.6, decode_flops=0.6,
                   attention_flops=0.6, step_overhead_ms=1.0, layer_overhead_us=5.0, allreduce_us=10.0)
BOUNDS = {"weights_bandwidth": (0.05, 1.0), "kv_bandwidth": (0.05, 1.0), "linear_flops": (0.05, 1.0),
          "decode_flops": (0.05, 10.0), "attention_flops": (0.05, 1.0), "step_overhead_ms": (1e-3, 100.0),
          "layer_overhead_us": (1e-2, 1e3), "allreduce_us": (1.0, 1e3)}


def fit(rows) -> Efficiency:
    """Least squares on log(predicted / measured), parameters on a log scale (all positive)."""
    names = Efficiency.names()
    weight = 1 / np.sqrt(rows.groupby(["dataset", "kind"]).measured_ms.transform("size").to_numpy())
    log_measured = np.log(rows.measured_ms.to_numpy())

    def residuals(z):
        eff = Efficiency(**dict(zip(names, np.exp(z), strict=True)))
        return weight * (np.log(measured.predict_ms(rows, eff)) - log_measured)

    lo, hi = (np.log([BOUNDS[n][i] for n in names]) for i in (0, 1))
    z0 = np.clip(np.log([getattr(START, n) for n in names]), lo, hi)
    z = least_squares(residuals, z0, bounds=(lo, hi), x_scale=1.0).x
    return Efficiency(**{n: float(f"{v:.4g}") for n, v in zip(names, np.exp(z), strict=True)})


def render(eff: Efficiency, rows) -> str:
    lines = ["# Preset efficiencies: fitted by scripts/fit_hardware.py to simbatch/data/measured/hardware; do not edit.",
             "# Meaning of each: simbatch/hardware/preset.py (Efficiency). fit_error: relative error",
             "# |predicted - measured| / measured of the presets over each dataset and kind of measurement.",
             "efficiency:"]
    lines += [f"  {n}: {getattr(eff, n)}" for n in Efficiency.names()]
    lines.append("fit_error:")
    for (dataset, kind), err in errors_by_dataset(rows, eff).items():
        lines.append(f"  {dataset} / {kind}: {{rows: {err['rows']}, median: {err['median']:.3f}, "
                     f"p90: {err['p90']:.3f}}}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=measured.DATA, help="The measured data folder.")
    args = parser.parse_args(argv)
    rows = measured.load_all(args.data)
    eff = fit(rows)
    OUT.write_text(render(eff, rows), encoding="utf-8")
    print(OUT.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()

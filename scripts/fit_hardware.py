"""Fit the preset efficiencies (simbatch/hardware/preset.py) once, to the measured data shipped with simbatch.

Reads every dataset of ``simbatch/data/measured/hardware`` (see simbatch/hardware/measured.py), finds the
:class:`~simbatch.hardware.preset.Efficiency` constants minimising the squared log-error of the
predicted times, each dataset and kind of measurement weighted alike (so 2,000 TensorRT-LLM rows
do not drown 30 kernel rows), and writes them with their fit error to
``simbatch/data/hardware_efficiency.yaml``.

It also compares step-time laws held out: each law is fitted on four fifths of the configurations
(model, GPU, parallelism, precision) and predicts the fifth it did not see, five times over. The law
with the smallest held-out error (the mean over datasets of their median relative error) is the one
simbatch/model/cost.py must implement, and its constants are the ones shipped; the script fails,
saying so, when the data prefer another. Run from the repository root:

    .venv/bin/python scripts/fit_hardware.py

then regenerate the report, ``.venv/bin/python scripts/gen_hardware_fit.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from simbatch.hardware import measured
from simbatch.hardware.fit_report import errors_by_dataset
from simbatch.hardware.preset import Efficiency

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "simbatch" / "data" / "hardware_efficiency.yaml"
START = Efficiency(weights_bandwidth=0.8, kv_bandwidth=0.8, linear_flops=0.6, decode_flops=0.6,
                   attention_flops=0.6, step_overhead_ms=1.0, layer_overhead_us=5.0, allreduce_us=10.0,
                   gddr_weights_bandwidth=0.8, eager_allreduce_us=50.0)
BOUNDS = {"weights_bandwidth": (0.05, 1.0), "kv_bandwidth": (0.05, 1.0), "linear_flops": (0.05, 1.0),
          "decode_flops": (0.05, 10.0), "attention_flops": (0.05, 1.0), "step_overhead_ms": (1e-3, 100.0),
          "layer_overhead_us": (1e-2, 1e3), "allreduce_us": (1.0, 1e3), "gddr_weights_bandwidth": (0.05, 1.0),
          "eager_allreduce_us": (1.0, 1e3)}
SHIPPED_LAW = "decode roofline"
"""The law simbatch/model/cost.py implements (``device.weights_ms``), the one :meth:`Efficiency.step_seconds` is."""


def _parts(rows, eff: Efficiency) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each row's overheads, memory traffic, decode matmuls and prompt compute, s."""
    t = {name: rows[name].to_numpy() for name in measured.TERMS}
    over = eff.seconds(STEP=t["STEP"], LAYERS=t["LAYERS"], ALLREDUCES=t["ALLREDUCES"],
                       EAGER_ALLREDUCES=t["EAGER_ALLREDUCES"], COMM=t["COMM"])
    return (over, eff.seconds(W=t["W"], GW=t["GW"], KV=t["KV"]), eff.seconds(DEC=t["DEC"]),
            eff.seconds(LIN=t["LIN"], ATTN=t["ATTN"]))


def _added(rows, eff, _):
    over, memory, decode, prompt = _parts(rows, eff)
    return over + memory + decode + prompt


def _roofline(rows, eff, _):
    over, memory, decode, prompt = _parts(rows, eff)
    return over + np.maximum(memory, decode + prompt)


def _blend(rows, eff, overlap):
    over, memory, decode, prompt = _parts(rows, eff)
    compute = decode + prompt
    return over + np.maximum(memory, compute) + overlap * np.minimum(memory, compute)


def _decode_roofline(rows, eff, _):
    return eff.step_seconds(**{name: rows[name].to_numpy() for name in measured.TERMS})


LAWS = {"costs added": _added, "roofline": _roofline, "blend": _blend, SHIPPED_LAW: _decode_roofline}
"""Step-time laws, s: every cost adds; ``max(memory, compute)`` for the whole step; that plus a fitted
share of the smaller (``blend``); and the decode roofline (the decode matmuls hide under the memory
traffic, a prompt's compute adds)."""


def fit(rows, law: str = SHIPPED_LAW) -> tuple[Efficiency, float]:
    """Least squares on log(predicted / measured), parameters on a log scale (all positive); the
    efficiencies, and the blend's overlap share (0 for the other laws)."""
    names = Efficiency.names()
    weight = 1 / np.sqrt(rows.groupby(["dataset", "kind"]).measured_ms.transform("size").to_numpy())
    log_measured = np.log(rows.measured_ms.to_numpy())
    blend = law == "blend"

    def unpack(z):
        values = np.exp(z)
        return Efficiency(**dict(zip(names, values[:len(names)], strict=True))), values[-1] if blend else 0.0

    def residuals(z):
        eff, overlap = unpack(z)
        return weight * (np.log(1e3 * LAWS[law](rows, eff, overlap)) - log_measured)

    lo, hi = (np.log([BOUNDS[n][i] for n in names] + ([(1e-3, 1.0)[i]] if blend else [])) for i in (0, 1))
    z0 = np.clip(np.log([getattr(START, n) for n in names] + ([0.3] if blend else [])), lo, hi)
    eff, overlap = unpack(least_squares(residuals, z0, bounds=(lo, hi), x_scale=1.0).x)
    return Efficiency(**{n: float(f"{getattr(eff, n):.4g}") for n in names}), float(overlap)


def held_out(rows, law: str, folds: int = 5, seed: int = 0) -> dict[str, float]:
    """Median relative error per (dataset / kind) of ``law`` on configurations its fit did not see."""
    keys = rows.dataset + "|" + rows.group
    configurations = keys.unique()
    fold_of = dict(zip(configurations, np.random.default_rng(seed).integers(0, folds, len(configurations)),
                       strict=True))
    fold = keys.map(fold_of).to_numpy()
    predicted = np.full(len(rows), np.nan)
    for k in range(folds):
        eff, overlap = fit(rows[fold != k], law)
        predicted[fold == k] = 1e3 * LAWS[law](rows[fold == k], eff, overlap)
    err = np.abs(predicted - rows.measured_ms.to_numpy()) / rows.measured_ms.to_numpy()
    return {f"{dataset} / {kind}": float(np.median(err[idx]))
            for (dataset, kind), idx in rows.groupby(["dataset", "kind"], sort=True).indices.items()}


def render(eff: Efficiency, rows, laws: dict[str, dict[str, float]]) -> str:
    lines = ["# Preset efficiencies: fitted by scripts/fit_hardware.py to simbatch/data/measured/hardware; do not edit.",
             "# Meaning of each: simbatch/hardware/preset.py (Efficiency). fit_error: relative error",
             "# |predicted - measured| / measured of the presets over each dataset and kind of measurement.",
             "# laws: median relative error of each step-time law on configurations its fit did not see",
             f"# (5-fold, by configuration); `{SHIPPED_LAW}` is simbatch/model/cost.py's.",
             f"law: {SHIPPED_LAW}",
             "efficiency:"]
    lines += [f"  {n}: {getattr(eff, n)}" for n in Efficiency.names()]
    lines.append("fit_error:")
    for (dataset, kind), err in errors_by_dataset(rows, eff).items():
        lines.append(f"  {dataset} / {kind}: {{rows: {err['rows']}, median: {err['median']:.3f}, "
                     f"p90: {err['p90']:.3f}}}")
    lines.append("laws:")
    for law, errors in laws.items():
        lines.append(f"  {law}:")
        lines += [f"    {key}: {value:.3f}" for key, value in errors.items()]
        lines.append(f"    mean: {np.mean(list(errors.values())):.4f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=measured.DATA, help="The measured data folder.")
    args = parser.parse_args(argv)
    rows = measured.load_all(args.data)
    laws = {law: held_out(rows, law) for law in LAWS}
    best = min(laws, key=lambda law: np.mean(list(laws[law].values())))
    eff, _ = fit(rows)
    OUT.write_text(render(eff, rows, laws), encoding="utf-8")
    print(OUT.read_text(encoding="utf-8"))
    if best != SHIPPED_LAW:
        sys.exit(f"the data prefer the law {best!r} held out; simbatch/model/cost.py implements {SHIPPED_LAW!r}")


if __name__ == "__main__":
    main()

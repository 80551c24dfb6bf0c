"""How well the presets predict the measured data, beside the plain model ``tau0 + beta*B``.

``scripts/gen_hardware_fit.py`` writes the result to docs/hardware_fit.md; ``scripts/fit_hardware.py``
stores the same errors beside the efficiencies it fits.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simbatch.hardware import measured
from simbatch.hardware.preset import Efficiency


def relative_errors(predicted: np.ndarray, rows: pd.DataFrame) -> np.ndarray:
    """|predicted - measured| / measured, row by row."""
    return np.abs(predicted - rows.measured_ms.to_numpy()) / rows.measured_ms.to_numpy()


def errors_by_dataset(rows: pd.DataFrame, eff: Efficiency) -> dict[tuple[str, str], dict]:
    """Per (dataset, kind): row count, and the median and p90 relative error of the presets (``median``,
    ``p90``), of the five-cost model fitted per configuration (``fit_``), and of the plain model (``plain_``)."""
    models = {"": measured.predict_ms(rows, eff), "fit_": measured.fitted_ms(rows),
              "plain_": measured.plain_ms(rows)}
    errors = {name: relative_errors(pred, rows) for name, pred in models.items()}
    out = {}
    for key, idx in rows.groupby(["dataset", "kind"], sort=True).indices.items():
        out[key] = {"rows": len(idx)}
        for name, err in errors.items():
            e = err[idx][np.isfinite(err[idx])]
            out[key] |= {f"{name}median": float(np.median(e)), f"{name}p90": float(np.quantile(e, 0.9))}
    return out
